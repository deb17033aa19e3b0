//! Extract-and-verify throughput of a large artifact against `sha256sum` on the same file, in the
//! same run.
//!
//! A 256 MiB artifact (`GUILD_BENCH_MIB` overrides the size) is generated into a temporary
//! directory, packed with `write_gkpk`, and then timed three ways, best of several runs each,
//! with the page cache warm so that the disk does not decide the result:
//! - `sha256sum` on the artifact file (and, for context, `openssl dgst -sha256` where present);
//! - hashing alone, through `scan_artifacts` (read and hash, nothing written);
//! - extracting the archive: open, read, hash, write to a fresh staging directory, compare with
//!   the manifest. Without fsync, so that this measures the verification path rather than the
//!   disk; one run with fsync is reported separately.
//!
//! The goal is extraction at no less than 0.9 of `sha256sum`'s throughput. sha2 0.10 picks its
//! SHA-NI code path at run time on x86_64; the table says whether this CPU has it.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use guild_adapters_fs::archive::{scan_artifacts, write_gkpk, GkpkSource};
use guild_domain::manifest::{Artifact, Metadata};
use guild_ports::source::{Durability, ExtractOptions, PackageSource};

const RUNS: usize = 5;

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this binary without it,
    // and then a small artifact is enough to prove the benchmark still works.
    let benchmarking = std::env::args().any(|a| a == "--bench");
    let mib: u64 = std::env::var("GUILD_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if benchmarking { 256 } else { 4 });
    let bytes = mib << 20;
    let temp = tempfile::tempdir().expect("create a temporary directory");
    let src = temp.path().join("src");
    fs::create_dir(&src).expect("create the source directory");
    let artifact = src.join("kernels.bin");
    generate(&artifact, bytes);

    let artifacts = scan_artifacts(&src).expect("scan the source directory");
    let json = metadata_json(&artifacts);
    let manifest = Metadata::parse(&json)
        .expect("the benchmark's metadata parses")
        .into_manifest();
    let archive = temp.path().join("bench.gkernel");
    let inputs: Vec<_> = artifacts
        .iter()
        .map(|a| (a.path.clone(), src.join(a.path.as_str())))
        .collect();
    write_gkpk(&archive, &json, &inputs).expect("write the archive");
    // Warm the page cache for both files.
    let _ = fs::read(&archive);
    let _ = fs::read(&artifact);

    let sha256sum = best(RUNS, || {
        let out = Command::new("sha256sum")
            .arg(&artifact)
            .output()
            .expect("run sha256sum");
        assert!(out.status.success(), "sha256sum failed");
        let printed = String::from_utf8_lossy(&out.stdout);
        assert!(printed.starts_with(&artifacts[0].sha256.to_hex()));
    });
    // OpenSSL's SHA-256 uses the CPU's SHA instructions; it is shown for context, since
    // coreutils' `sha256sum` may be built without them.
    let openssl = has_openssl().then(|| {
        best(RUNS, || {
            let out = Command::new("openssl")
                .args(["dgst", "-sha256", "-r"])
                .arg(&artifact)
                .output()
                .expect("run openssl");
            assert!(out.status.success(), "openssl failed");
            let printed = String::from_utf8_lossy(&out.stdout);
            assert!(printed.starts_with(&artifacts[0].sha256.to_hex()));
        })
    });
    let hash_only = best(RUNS, || {
        let found = scan_artifacts(&src).expect("scan");
        assert_eq!(found, artifacts);
    });
    let mut n = 0;
    let mut extract = |durability| {
        n += 1;
        let staging = temp.path().join(format!("staging-{n}"));
        let source = GkpkSource::new(ExtractOptions {
            durability,
            ..ExtractOptions::default()
        });
        let opened = source.open(&archive).expect("open the archive");
        let out = opened
            .extract_to(&manifest, &staging)
            .expect("extract the archive");
        assert_eq!(out.files, artifacts);
        fs::remove_dir_all(&staging).expect("remove the staging directory");
    };
    let extract_fast = best(RUNS, || extract(Durability::NoFsync));
    let extract_synced = best(1, || extract(Durability::Fsync));

    let mb = bytes as f64 / 1e6;
    let rate = |d: Duration| mb / d.as_secs_f64();
    let base = rate(sha256sum);
    println!();
    println!("hashing a {mib} MiB artifact (best of {RUNS}; page cache warm)");
    println!("SHA-NI on this CPU: {}", sha_ni());
    println!("{:<38} {:>9} {:>10} {:>8}", "", "seconds", "MB/s", "ratio");
    let rows = [
        Some(("sha256sum", sha256sum)),
        openssl.map(|d| ("openssl dgst -sha256 (context)", d)),
        Some(("hash only (scan_artifacts)", hash_only)),
        Some(("extract and verify, no fsync", extract_fast)),
        Some(("extract and verify, fsync (1 run)", extract_synced)),
    ];
    for (name, d) in rows.into_iter().flatten() {
        println!(
            "{name:<38} {:>9.3} {:>10.0} {:>8.2}",
            d.as_secs_f64(),
            rate(d),
            rate(d) / base
        );
    }
    let ratio = rate(extract_fast) / base;
    println!(
        "extract-and-verify reaches {ratio:.2} of sha256sum's throughput (goal: 0.90): {}",
        if ratio >= 0.9 { "met" } else { "NOT met" }
    );
}

/// Writes `bytes` of cheap pseudo-random data (so that no layer can shortcut zeros).
fn generate(path: &Path, bytes: u64) {
    let mut file = std::io::BufWriter::with_capacity(
        1 << 20,
        fs::File::create(path).expect("create the artifact"),
    );
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut block = vec![0u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        for chunk in block.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes());
        }
        let n = left.min(block.len() as u64) as usize;
        file.write_all(&block[..n]).expect("write the artifact");
        left -= n as u64;
    }
    file.flush().expect("flush the artifact");
}

fn best(runs: usize, mut f: impl FnMut()) -> Duration {
    (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .min()
        .unwrap_or_default()
}

fn metadata_json(artifacts: &[Artifact]) -> Vec<u8> {
    let list: Vec<String> = artifacts
        .iter()
        .map(|a| {
            format!(
                r#"{{"path":"{}","size":{},"sha256":"{}"}}"#,
                a.path, a.size, a.sha256
            )
        })
        .collect();
    format!(
        concat!(
            r#"{{"gkmetadata":1,"payload":{{"package_id":"org.example.bench","kind":"gkernel","#,
            r#""version":"1.0.0","publisher_id":"org.example","#,
            r#""kernel_abi":{{"min":"1.0.0","max":"1.0.0"}},"os":"linux","arch":"x86_64","#,
            r#""backends":["cpu"],"entry":"kernels.bin","artifacts":[{}],"provided_ops":[]}},"#,
            r#""signatures":[]}}"#
        ),
        list.join(",")
    )
    .into_bytes()
}

fn has_openssl() -> bool {
    Command::new("openssl")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn sha_ni() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("sha") {
            "yes (sha2 uses it)"
        } else {
            "no (sha2 falls back to portable code)"
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        "not applicable (not x86_64)"
    }
}
