//! The cost of the OCI path: `guild install oci://…` of a 256 MiB package from a local registry
//! (manifest, config, layer streamed to a file with its digest checked, then the ordinary
//! install) against its baseline in the same run, `curl` of the same layer blob followed by
//! `guild install FILE`. Both install into a fresh store that trusts the key, with the same
//! `guild` binary; the ratio is the overhead of the registry client.
//!
//! Needs `docker-registry` and `curl` (it says so and exits otherwise) and the C test plugins
//! (`cargo xtask plugins`). `GUILD_BENCH_MIB` changes the size, `GUILD_BENCH_RUNS` the number
//! of runs of each path (default 5; medians are reported, with the spread of the per-run
//! ratios). `GUILD_BENCH_BEFORE=PATH` names a second `guild` binary (say, one built at an
//! earlier commit) measured the same way in the same runs, interleaved, so that a change is
//! compared against its baseline on the same machine at the same time. The goal (G28): the OCI
//! path at most 1.1x its baseline. Run with `cargo bench -p guild-host --bench oci_pull`; the
//! `guild` binary is built with the bench profile.

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

/// The goal: the OCI path's time over its baseline's.
const GOAL: f64 = 1.1;

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
        .unwrap_or(5)
        .max(1);
    let mut bins = vec![("this tree", guild_binary())];
    if let Some(before) = std::env::var_os("GUILD_BENCH_BEFORE") {
        bins.push(("GUILD_BENCH_BEFORE", PathBuf::from(before)));
    }
    let bin = bins[0].1.clone();
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

    let fresh = |bin: &Path, name: &str| -> String {
        let store = work.join(name);
        let s = store.to_str().unwrap().to_owned();
        guild(
            bin,
            work,
            &[
                "--json",
                "--store",
                &s,
                "trust",
                "add",
                "org.example",
                "k.pub",
            ],
        );
        s
    };
    // Per binary: the OCI path's and the baseline's time in each run.
    let mut times: Vec<Vec<(Duration, Duration)>> = vec![Vec::new(); bins.len()];
    for i in 0..runs {
        for (b, (_, bin)) in bins.iter().enumerate() {
            let run_oci = || {
                let store = fresh(bin, &format!("oci-{i}-{b}"));
                let t = timed(|| {
                    guild(
                        bin,
                        work,
                        &["--json", "--store", &store, "install", &reference],
                    );
                });
                remove_tree(Path::new(&store));
                t
            };
            let run_base = || {
                let store = fresh(bin, &format!("curl-{i}-{b}"));
                let file = work.join(format!("curl-{i}-{b}.gkmodule"));
                let t = timed(|| {
                    let ok = Command::new("curl")
                        .args(["-sSf", "-o"])
                        .arg(&file)
                        .arg(&blob_url)
                        .status()
                        .is_ok_and(|s| s.success());
                    assert!(ok, "curl failed");
                    guild(
                        bin,
                        work,
                        &[
                            "--json",
                            "--store",
                            &store,
                            "install",
                            file.to_str().unwrap(),
                        ],
                    );
                });
                let _ = fs::remove_file(&file);
                remove_tree(Path::new(&store));
                t
            };
            // Alternate the order so that neither path always runs on a warmer page cache.
            let pair = if (i + b) % 2 == 0 {
                let o = run_oci();
                (o, run_base())
            } else {
                let c = run_base();
                (run_oci(), c)
            };
            times[b].push(pair);
        }
    }
    let _ = registry.kill();
    let _ = registry.wait();
    remove_tree(work);
    println!(
        "oci_pull: {:.1} MiB package, {runs} run(s) of each path per binary, medians \
         (ratio: per run, median and lowest-highest)",
        size as f64 / f64::from(1 << 20)
    );
    for ((name, bin), runs) in bins.iter().zip(&times) {
        let oci = median(runs.iter().map(|r| r.0).collect());
        let base = median(runs.iter().map(|r| r.1).collect());
        let mut ratios: Vec<f64> = runs
            .iter()
            .map(|(o, b)| o.as_secs_f64() / b.as_secs_f64())
            .collect();
        ratios.sort_by(f64::total_cmp);
        let ratio = ratios[ratios.len() / 2];
        println!(
            "  {name} ({}):\n    \
             guild install oci://...          {:>8.3} s\n    \
             curl blob + guild install FILE   {:>8.3} s\n    \
             overhead of the OCI path         {ratio:>8.3}x ({:.3}-{:.3}; goal: at most \
             {GOAL:.2}x: {})",
            bin.display(),
            oci.as_secs_f64(),
            base.as_secs_f64(),
            ratios[0],
            ratios[ratios.len() - 1],
            if ratio <= GOAL { "met" } else { "NOT met" }
        );
    }
}
