//! The cost of the OCI path: `guild install oci://…` of a 256 MiB package from a local registry
//! (manifest, config, layer streamed to a file with its digest checked, then the ordinary
//! install) against its baseline in the same run, `curl` of the same layer blob followed by
//! `guild install FILE`. Both install into a fresh store that trusts the key, with the same
//! `guild` binary; the ratio is the overhead of the registry client.
//!
//! Needs `docker-registry` and `curl` (it says so and exits otherwise) and the C test plugins
//! (`cargo xtask plugins`). `GUILD_BENCH_MIB` changes the size, `GUILD_BENCH_RUNS` the number
//! of runs of each path (medians are reported). Run with `cargo bench -p guild-host --bench
//! oci_pull`; the `guild` binary is built with the bench profile.

#[path = "common/mod.rs"]
mod common;

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use guild_test_support::plugins::plugin_library;

fn found(program: &str, arg: &str) -> bool {
    Command::new(program)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn guild_binary() -> PathBuf {
    let out = Command::new(env!("CARGO"))
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
        .args([
            "build",
            "--profile",
            "bench",
            "-p",
            "guild-cli",
            "--bin",
            "guild",
            "--message-format=json-render-diagnostics",
        ])
        .output()
        .expect("cargo runs");
    assert!(out.status.success(), "building guild failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|m| m["target"]["name"] == "guild" && m["executable"].is_string())
        .and_then(|m| m["executable"].as_str().map(PathBuf::from))
        .expect("cargo reports the guild executable")
}

fn guild(bin: &Path, cwd: &Path, args: &[&str]) -> serde_json::Value {
    let out = Command::new(bin)
        .args(args)
        .current_dir(cwd)
        .env("HOME", cwd)
        .env_remove("REGISTRY_AUTH_FILE")
        .env_remove("DOCKER_CONFIG")
        .output()
        .expect("guild runs");
    assert!(
        out.status.success(),
        "guild {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
}

/// Removes a store, whose installed trees are read-only.
fn remove_tree(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    fn writable(path: &Path) {
        if let Ok(meta) = fs::symlink_metadata(path) {
            if meta.is_dir() {
                let _ = fs::set_permissions(path, fs::Permissions::from_mode(0o755));
                for e in fs::read_dir(path).into_iter().flatten().flatten() {
                    writable(&e.path());
                }
            }
        }
    }
    writable(path);
    let _ = fs::remove_dir_all(path);
}

fn timed(run: impl FnOnce()) -> Duration {
    let start = Instant::now();
    run();
    start.elapsed()
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn main() {
    // `cargo bench` passes `--bench`; a filter that does not name this benchmark skips it.
    if std::env::args()
        .skip(1)
        .any(|a| !a.starts_with('-') && !"oci_pull".contains(&a))
    {
        return;
    }
    for (program, arg) in [("docker-registry", "--version"), ("curl", "--version")] {
        if !found(program, arg) {
            println!("oci_pull: skipped because {program} is not installed");
            return;
        }
    }
    let mib: usize = std::env::var("GUILD_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let runs: usize = std::env::var("GUILD_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    let bin = guild_binary();
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();

    // The registry, on a free loopback port with its storage in the scratch directory.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = work.join("registry.yml");
    fs::write(
        &config,
        format!(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\n\
             storage:\n  filesystem:\n    rootdirectory: {}\n\
             http:\n  addr: 127.0.0.1:{port}\n",
            work.join("storage").display()
        ),
    )
    .unwrap();
    let mut registry = Command::new("docker-registry")
        .arg("serve")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let answered = TcpStream::connect(("127.0.0.1", port)).is_ok_and(|mut s| {
            let _ = s.write_all(b"GET /v2/ HTTP/1.0\r\n\r\n");
            let mut b = [0u8; 8];
            s.read_exact(&mut b).is_ok()
        });
        if answered {
            break;
        }
        assert!(Instant::now() < deadline, "the registry did not start");
        std::thread::sleep(Duration::from_millis(50));
    }

    // A package of about `mib` MiB: the manifest_echo plugin and one large data file.
    let src = work.join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("libplugin.so"), plugin_library("manifest_echo")).unwrap();
    let mut data = vec![0u8; mib << 20];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for chunk in data.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    fs::write(src.join("data.bin"), &data).unwrap();
    drop(data);
    fs::write(
        work.join("t.json"),
        format!(
            r#"{{"package_id": "bench.big", "kind": "gkmodule", "version": "1.0.0",
                "publisher_id": "org.example", "kernel_abi": {{"min": "1.0.0", "max": "1.0.0"}},
                "module_abi": 1, "os": "{}", "arch": "{}", "backends": ["cpu"],
                "entry": "libplugin.so", "provided_ops": ["bench.big.op.cpu"]}}"#,
            std::env::consts::OS,
            std::env::consts::ARCH
        ),
    )
    .unwrap();
    let ws = |args: &[&str]| guild(&bin, work, args);
    ws(&["--json", "keygen", "--out", "k"]);
    ws(&[
        "--json",
        "pack",
        "src",
        "--manifest",
        "t.json",
        "--out",
        "big.gkmodule",
        "--key",
        "k.key",
    ]);
    let size = fs::metadata(work.join("big.gkmodule")).unwrap().len();
    let reference = format!("oci://127.0.0.1:{port}/bench/big:1.0.0");
    let pushed = ws(&["--json", "push", "big.gkmodule", &reference]);
    let layer = pushed["layer_sha256"].as_str().unwrap().to_owned();
    let blob_url = format!("http://127.0.0.1:{port}/v2/bench/big/blobs/sha256:{layer}");

    let fresh = |name: &str| -> String {
        let store = work.join(name);
        let s = store.to_str().unwrap().to_owned();
        ws(&[
            "--json",
            "--store",
            &s,
            "trust",
            "add",
            "org.example",
            "k.pub",
        ]);
        s
    };
    let mut oci = Vec::new();
    let mut baseline = Vec::new();
    for i in 0..runs {
        // Alternate the order so that neither path always runs on a warmer page cache.
        let mut run_oci = || {
            let store = fresh(&format!("oci-{i}"));
            oci.push(timed(|| {
                ws(&["--json", "--store", &store, "install", &reference]);
            }));
            remove_tree(Path::new(&store));
        };
        let mut run_base = || {
            let store = fresh(&format!("curl-{i}"));
            let file = work.join(format!("curl-{i}.gkmodule"));
            baseline.push(timed(|| {
                let ok = Command::new("curl")
                    .args(["-sSf", "-o"])
                    .arg(&file)
                    .arg(&blob_url)
                    .status()
                    .is_ok_and(|s| s.success());
                assert!(ok, "curl failed");
                ws(&[
                    "--json",
                    "--store",
                    &store,
                    "install",
                    file.to_str().unwrap(),
                ]);
            }));
            let _ = fs::remove_file(&file);
            remove_tree(Path::new(&store));
        };
        if i % 2 == 0 {
            run_oci();
            run_base();
        } else {
            run_base();
            run_oci();
        }
    }
    let _ = registry.kill();
    let _ = registry.wait();
    remove_tree(work);
    let (o, b) = (median(oci), median(baseline));
    println!(
        "oci_pull: {:.1} MiB package, {runs} run(s) each, medians:\n  \
         guild install oci://...          {:>8.3} s\n  \
         curl blob + guild install FILE   {:>8.3} s\n  \
         overhead of the OCI path         {:>8.3}x",
        size as f64 / f64::from(1 << 20),
        o.as_secs_f64(),
        b.as_secs_f64(),
        o.as_secs_f64() / b.as_secs_f64()
    );
}
