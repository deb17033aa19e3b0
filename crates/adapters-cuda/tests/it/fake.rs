//! The adapter against the fake CUDA driver (`guild_adapters_cuda::testing::fake_driver`), in
//! child processes that find the fake through `LD_LIBRARY_PATH`: what the probe reports for each
//! way of having a driver without a usable device, the marks on the default stream, a failing
//! wait, and this binary's own `gpu::` tests, which must all pass against the fake and leave no
//! driver object alive.

use std::process::{Command, Output};

use guild_adapters_cuda::testing::fake_driver::{exit_report, FakeDriver, Variant, NOTHING_ALIVE};

const PROBE: &str = env!("CARGO_BIN_EXE_guild-cuda-probe");

fn fake(variant: Variant) -> (tempfile::TempDir, FakeDriver) {
    let dir = tempfile::tempdir().unwrap();
    let driver = FakeDriver::build(dir.path(), variant).unwrap_or_else(|e| panic!("{e}"));
    (dir, driver)
}

/// Runs `cmd` and returns (exit code, stdout, stderr).
fn run(mut cmd: Command) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().unwrap();
    (
        status.code().unwrap_or(-1),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

fn probe(driver: &FakeDriver, env: &[(&str, &str)], args: &[&str]) -> (i32, String, String) {
    let mut cmd = driver.command(PROBE);
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    run(cmd)
}

#[test]
fn the_probe_describes_the_fake_device() {
    let (_dir, driver) = fake(Variant::Complete);
    let (code, out, err) = probe(&driver, &[], &[]);
    assert_eq!(
        out,
        "CUDA driver 12.8 (12080)\n\
         device 0: Guild Fake GPU 0, compute capability 9.0 (sm 90), 1024 MiB\n",
        "{err}"
    );
    assert_eq!(code, 0);
    assert_eq!(exit_report(&err), Some(NOTHING_ALIVE), "{err}");

    let (code, out, _) = probe(
        &driver,
        &[("FAKE_CUDA_SM", "75"), ("FAKE_CUDA_DEVICES", "2")],
        &[],
    );
    assert_eq!(code, 0);
    assert!(
        out.ends_with(
            "device 0: Guild Fake GPU 0, compute capability 7.5 (sm 75), 1024 MiB\n\
             device 1: Guild Fake GPU 1, compute capability 7.5 (sm 75), 1024 MiB\n"
        ),
        "{out}"
    );
}

#[test]
fn every_way_of_having_no_usable_device_is_a_typed_reason() {
    let (_dir, driver) = fake(Variant::Complete);
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[("FAKE_CUDA_INIT", "100")],
            "no CUDA device: the CUDA driver does not initialise: CUDA_ERROR_NO_DEVICE (no \
             CUDA-capable device is detected)\n",
        ),
        (
            &[("FAKE_CUDA_DEVICES", "0")],
            "CUDA driver 12.8 (12080)\nno CUDA device: the CUDA driver reports no device\n",
        ),
    ];
    for (env, expected) in cases {
        let (code, out, err) = probe(&driver, env, &[]);
        assert_eq!(out, *expected, "{env:?}: {err}");
        assert_eq!(code, 2, "{env:?}");
        assert!(!err.contains("panicked"), "{err}");
    }

    let (_dir, old) = fake(Variant::WithoutGraphLaunch);
    let (code, out, err) = probe(&old, &[], &[]);
    assert_eq!(
        out,
        "no CUDA device: the CUDA driver has no cuGraphLaunch, which this host needs (the driver \
         is too old)\n"
    );
    assert_eq!(code, 2);
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_mark_on_the_default_stream_is_recorded_waited_for_and_destroyed() {
    let (_dir, driver) = fake(Variant::Complete);
    let (code, out, err) = probe(&driver, &[("FAKE_CUDA_TRACE", "1")], &["record", "0", "0"]);
    assert_eq!(out, "recorded on stream 0x0\nwaited\n", "{err}");
    assert_eq!(code, 0);
    // The calls the adapter makes, in order: retain device 0's primary context, make it current
    // for the record, check for a capture, create and record the event; then wait in the same
    // context, destroy the event and release the context.
    let calls: Vec<&str> = err
        .lines()
        .filter_map(|l| l.strip_prefix("fake-cuda: "))
        .filter(|l| !l.starts_with("alive at exit"))
        .collect();
    assert_eq!(
        calls,
        [
            "cuInit",
            "cuDevicePrimaryCtxRetain",
            "cuCtxPushCurrent_v2",
            "cuStreamIsCapturing",
            "cuEventCreate",
            "cuEventRecord",
            "cuCtxPopCurrent_v2",
            "cuCtxPushCurrent_v2",
            "cuEventSynchronize",
            "cuCtxPopCurrent_v2",
            "cuCtxPushCurrent_v2",
            "cuEventDestroy_v2",
            "cuCtxPopCurrent_v2",
            "cuDevicePrimaryCtxRelease_v2",
        ]
    );
    assert_eq!(exit_report(&err), Some(NOTHING_ALIVE), "{err}");
}

#[test]
fn a_failed_wait_and_an_unknown_device_are_device_errors() {
    let (_dir, driver) = fake(Variant::Complete);
    let (code, out, err) = probe(
        &driver,
        &[("FAKE_CUDA_EVENT_SYNC", "700")],
        &["record", "0", "0"],
    );
    assert_eq!(
        out,
        "recorded on stream 0x0\nwait failed: device 0: waiting for stream 0x0: \
         cuEventSynchronize failed: CUDA_ERROR_ILLEGAL_ADDRESS (fake driver error)\n",
        "{err}"
    );
    assert_eq!(code, 1);
    assert_eq!(exit_report(&err), Some(NOTHING_ALIVE), "{err}");

    let (code, out, _) = probe(&driver, &[], &["record", "1", "0"]);
    assert_eq!(
        out,
        "record failed: device 1: no CUDA device: there is no CUDA device 1: the driver reports 1\n"
    );
    assert_eq!(code, 1);
}

#[test]
fn the_gpu_tests_pass_against_the_fake_driver() {
    let (_dir, driver) = fake(Variant::Complete);
    let mut cmd = driver.command(std::env::current_exe().unwrap());
    cmd.args(["gpu::", "--test-threads=1"])
        .env("REQUIRE_GPU", "1");
    let (code, out, err) = run(cmd);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("test result: ok. 5 passed; 0 failed"), "{out}");
    assert!(!err.contains("skipped"), "{err}");
    assert_eq!(exit_report(&err), Some(NOTHING_ALIVE), "{err}");
}
