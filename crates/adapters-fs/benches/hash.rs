//! Extract-and-verify throughput of a large artifact against `openssl dgst -sha256` on the same
//! file, in the same run.
//!
//! A 256 MiB artifact (`GUILD_BENCH_MIB` overrides the size) is generated into a temporary
//! directory, packed with `write_gkpk`, and then timed in rounds (`GUILD_BENCH_RUNS`, default
//! 7), each round timing every row once, with the page cache warm so that the disk does not
//! decide the result:
//! - `openssl dgst -sha256` on the artifact file (OpenSSL's SHA-256 uses the CPU's SHA
//!   instructions), the baseline, and `sha256sum` for context (coreutils may be built without
//!   them);
//! - hashing alone, through `scan_artifacts` (read and hash, nothing written);
//! - extracting the archive: open, read, hash, write to a fresh staging directory, compare with
//!   the manifest. Without fsync, so that this measures the verification path rather than the
//!   disk; one run with fsync is reported separately.
//!
//! Each row's throughput is compared with openssl's in the same round; the table gives the
//! median of those ratios over the rounds and their spread (lowest to highest). The goal (G28):
//! extraction at no less than 0.95 of openssl's throughput. sha2 0.10 picks its SHA-NI code
//! path at run time on x86_64; the table says whether this CPU has it.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use guild_adapters_fs::archive::{scan_artifacts, write_gkpk, GkpkSource};
use guild_domain::manifest::{Artifact, Metadata};
use guild_ports::source::{Durability, ExtractOptions, PackageSource};

/// Rounds, unless `GUILD_BENCH_RUNS` says otherwise.
const RUNS: usize = 7;
/// The goal: extraction's throughput over openssl's.
const GOAL: f64 = 0.95;

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

    let runs: usize = std::env::var("GUILD_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if benchmarking { RUNS } else { 1 })
        .max(1);
    let hex = artifacts[0].sha256.to_hex();
    let command = |program: &str, args: &[&str]| {
        let out = Command::new(program)
            .args(args)
            .arg(&artifact)
            .output()
            .unwrap_or_else(|e| panic!("run {program}: {e}"));
        assert!(out.status.success(), "{program} failed");
        assert!(String::from_utf8_lossy(&out.stdout).starts_with(&hex));
    };
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
    let openssl = has_openssl();
    if !openssl {
        println!("hash: openssl is not installed; sha256sum is the baseline instead");
    }
    // Per round: the baseline's time, then each row's.
    let mut rounds: Vec<(Duration, [Duration; 4])> = Vec::new();
    for _ in 0..runs {
        let sha256sum = timed(|| command("sha256sum", &[]));
        let base = if openssl {
            timed(|| command("openssl", &["dgst", "-sha256", "-r"]))
        } else {
            sha256sum
        };
        let hash_only = timed(|| {
            let found = scan_artifacts(&src).expect("scan");
            assert_eq!(found, artifacts);
        });
        let extract_fast = timed(|| extract(Durability::NoFsync));
        rounds.push((base, [base, sha256sum, hash_only, extract_fast]));
    }
    let extract_synced = timed(|| extract(Durability::Fsync));

    let mb = bytes as f64 / 1e6;
    let base_name = if openssl {
        "openssl dgst -sha256"
    } else {
        "sha256sum"
    };
    println!();
    println!("hashing a {mib} MiB artifact ({runs} rounds; page cache warm)");
    println!("SHA-NI on this CPU: {}", sha_ni());
    println!("ratio: throughput over {base_name}'s in the same round, median (lowest-highest)");
    println!(
        "{:<36} {:>9} {:>8} {:>6} {:>13}",
        "", "median s", "MB/s", "ratio", "spread"
    );
    let names = [
        base_name,
        "sha256sum (context)",
        "hash only (scan_artifacts)",
        "extract and verify, no fsync",
    ];
    let mut extract_ratio = 0.0;
    for (i, name) in names.iter().enumerate() {
        let seconds = median(rounds.iter().map(|r| r.1[i].as_secs_f64()).collect());
        let ratios: Vec<f64> = rounds
            .iter()
            .map(|(base, row)| base.as_secs_f64() / row[i].as_secs_f64())
            .collect();
        let (low, high) = spread(&ratios);
        let ratio = median(ratios);
        extract_ratio = ratio;
        println!(
            "{name:<36} {seconds:>9.3} {:>8.0} {ratio:>6.2} {low:>6.2}-{high:<6.2}",
            mb / seconds
        );
    }
    println!(
        "{:<36} {:>9.3} {:>8.0}",
        "extract and verify, fsync (1 run)",
        extract_synced.as_secs_f64(),
        mb / extract_synced.as_secs_f64()
    );
    println!(
        "extract-and-verify reaches {extract_ratio:.2} of {base_name}'s throughput \
         (goal: {GOAL:.2}): {}",
        if extract_ratio >= GOAL {
            "met"
        } else {
            "NOT met"
        }
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

fn timed(f: impl FnOnce()) -> Duration {
    let start = Instant::now();
    f();
    start.elapsed()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn spread(xs: &[f64]) -> (f64, f64) {
    let low = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let high = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (low, high)
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
