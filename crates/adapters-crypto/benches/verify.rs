//! Signature costs: verifying one P-256 / SHA-256 signature over a 4 KiB canonical payload with
//! each backend (through the port, as package authentication does, and with the key parsed
//! once), against `openssl speed ecdsap256` run from here, plus signing and key ids.
//!
//! `cargo bench -p guild-adapters-crypto --bench verify` measures the two backends and the
//! `openssl` command line. (aws-lc-rs and libcrux-ecdsa were measured the same way when the
//! verifier was chosen; the figures are in `Backend`'s docs.) After criterion's own reports it prints one
//! table: microseconds per verification, each as a ratio to OpenSSL and to p256 through the port
//! (the verifier before ring), from rounds that take turns between the candidates so that a
//! change in the machine's load shows in all of them alike. `openssl speed -elapsed` (wall clock,
//! like the rounds) runs before and after the rounds, and its default (CPU time, what it prints
//! unasked) once more after; the "x openssl" column is against the mean of the two wall-clock
//! runs. On a loaded machine the wall clock counts the time spent waiting for a core too, in
//! every row alike. Run in test mode (`cargo test --benches`, no `--bench`
//! argument) every candidate is checked once and OpenSSL is not run.

use std::process::Command;
use std::time::{Duration, Instant};

use criterion::{black_box, Criterion, Throughput};
use guild_adapters_crypto::{Backend, P256Verifier, PublicKey, SigningKey};
use guild_domain::manifest::Metadata;
use guild_ports::signature::{key_id, SignatureVerifier};

/// Canonical payload bytes of a real manifest, padded with provided operations to at least
/// `min_len` bytes.
fn canonical_payload(min_len: usize) -> Vec<u8> {
    let mut ops = 0usize;
    loop {
        let names: Vec<String> = (0..ops)
            .map(|i| format!("\"example.sequence.op_{i:04}.cpu\""))
            .collect();
        let doc = format!(
            r#"{{"gkmetadata": 1, "signatures": [], "payload": {{
                "package_id": "example.sequence", "kind": "gkmodule", "version": "1.2.3",
                "publisher_id": "org.example", "kernel_abi": {{"min": "1.0.0", "max": "1.0.0"}},
                "module_abi": 1, "os": "linux", "arch": "x86_64", "backends": ["cpu"],
                "entry": "lib/libsequence.so",
                "artifacts": [{{"path": "lib/libsequence.so", "size": 4096, "sha256": "{}"}}],
                "provided_ops": [{}]}}}}"#,
            "ab".repeat(32),
            names.join(", ")
        );
        let meta = Metadata::parse(doc.as_bytes()).expect("bench manifest parses");
        let len = meta.canonical_payload().len();
        if len >= min_len {
            return meta.canonical_payload().to_vec();
        }
        ops += 1 + (min_len - len) / 40;
    }
}

/// One signed message and its key in every form a candidate reads.
struct Fixture {
    key: SigningKey,
    public: PublicKey,
    payload: Vec<u8>,
    signature: Vec<u8>,
    spki: Vec<u8>,
}

impl Fixture {
    fn new() -> Self {
        let key = SigningKey::generate().expect("generator");
        let payload = canonical_payload(4096);
        let signature = key.sign(&payload).expect("sign");
        let public = key.public_key().clone();
        let spki = public.spki_der().to_vec();
        Fixture {
            key,
            public,
            payload,
            signature,
            spki,
        }
    }

    /// The uncompressed point: the last 65 bytes of the canonical 91-byte SubjectPublicKeyInfo.
    fn point(&self) -> &[u8] {
        assert_eq!(
            self.spki.len(),
            91,
            "a canonical P-256 SubjectPublicKeyInfo"
        );
        let point = &self.spki[26..];
        assert_eq!(point[0], 0x04, "an uncompressed point");
        point
    }
}

/// A candidate's verification of (message, signature) with the fixture's key: true when it
/// verifies.
type Verify<'a> = Box<dyn Fn(&[u8], &[u8]) -> bool + 'a>;

/// The candidates, each under the name the table prints. The first is the baseline of the
/// "x p256" column: p256 through the port, the verifier before ring.
fn candidates(f: &Fixture) -> Vec<(&'static str, Verify<'_>)> {
    let port = |backend| {
        let verifier = P256Verifier::with_backend(backend);
        move |m: &[u8], s: &[u8]| verifier.verify(black_box(&f.spki), m, s).is_ok()
    };
    let parsed = |backend| move |m: &[u8], s: &[u8]| f.public.verify_using(backend, m, s).is_ok();
    let point = f.point();
    let out: Vec<(&'static str, Verify<'_>)> = vec![
        ("p256 through the port", Box::new(port(Backend::RustCrypto))),
        (
            "p256, key parsed once",
            Box::new(parsed(Backend::RustCrypto)),
        ),
        ("ring through the port", Box::new(port(Backend::Ring))),
        ("ring, key parsed once", Box::new(parsed(Backend::Ring))),
        (
            "ring alone (its own DER parse, no checks)",
            Box::new(move |m: &[u8], s: &[u8]| {
                ring::signature::UnparsedPublicKey::new(
                    &ring::signature::ECDSA_P256_SHA256_ASN1,
                    black_box(point),
                )
                .verify(m, s)
                .is_ok()
            }),
        ),
    ];
    out
}

/// OpenSSL's verifications per second from `openssl speed -seconds S [-elapsed] ecdsap256`, or
/// why there is no figure (no `openssl` to run). An `openssl` that fails, or whose output has no
/// figure, stops the benchmark: that is a broken measurement, not a missing tool.
///
/// By default `openssl speed` divides by the CPU time it was given, not by the time that passed;
/// `-elapsed` makes it use the wall clock, as the rounds here do, so that on a loaded machine
/// both figures include the same waiting.
fn openssl_speed(seconds: u32, elapsed: bool) -> Result<f64, String> {
    let seconds = seconds.to_string();
    let mut args = vec!["speed", "-seconds", &seconds];
    if elapsed {
        args.push("-elapsed");
    }
    args.push("ecdsap256");
    let out = Command::new("openssl")
        .args(&args)
        .output()
        .map_err(|e| format!("cannot run openssl: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "openssl {} failed ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(parse_openssl_speed(&text)
        .unwrap_or_else(|| panic!("no nistp256 verify/s figure in:\n{text}")))
}

/// The `verify/s` column of the `nistp256` line: the header names the columns, and the line's
/// last field is the last column.
fn parse_openssl_speed(text: &str) -> Option<f64> {
    let header = text.lines().find(|l| l.contains("verify/s"))?;
    if header.split_whitespace().last() != Some("verify/s") {
        return None;
    }
    let line = text.lines().find(|l| l.contains("(nistp256)"))?;
    line.split_whitespace().last()?.parse().ok()
}

fn criterion_benches(c: &mut Criterion, f: &Fixture, candidates: &[(&'static str, Verify<'_>)]) {
    let mut g = c.benchmark_group("verify_4k");
    g.throughput(Throughput::Elements(1));
    for (name, verify) in candidates {
        g.bench_function(*name, |b| {
            b.iter(|| verify(black_box(&f.payload), black_box(&f.signature)))
        });
    }
    g.finish();

    let mut g = c.benchmark_group("p256");
    g.throughput(Throughput::Bytes(f.payload.len() as u64));
    g.bench_function("sign_4k", |b| b.iter(|| f.key.sign(black_box(&f.payload))));
    g.throughput(Throughput::Elements(1));
    g.bench_function("key_id_of_spki_der", |b| {
        b.iter(|| key_id(black_box(&f.spki)))
    });
    g.bench_function("parse_spki_der_with_key_id", |b| {
        b.iter(|| PublicKey::from_spki_der(black_box(&f.spki)).map(|k| k.key_id()))
    });
    g.finish();
}

/// Microseconds per verification of each candidate, by the wall clock: the median over
/// `rounds` rounds, each of which times `batch` verifications of every candidate in turn.
fn interleaved(
    f: &Fixture,
    candidates: &[(&'static str, Verify<'_>)],
    rounds: usize,
    batch: u32,
) -> Vec<f64> {
    let mut times: Vec<Vec<Duration>> = vec![Vec::with_capacity(rounds); candidates.len()];
    for _ in 0..rounds {
        for ((_, verify), times) in candidates.iter().zip(&mut times) {
            let start = Instant::now();
            for _ in 0..batch {
                black_box(verify(black_box(&f.payload), black_box(&f.signature)));
            }
            times.push(start.elapsed());
        }
    }
    times
        .into_iter()
        .map(|mut t| {
            t.sort();
            t[t.len() / 2].as_secs_f64() * 1e6 / f64::from(batch)
        })
        .collect()
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let f = Fixture::new();
    let candidates = candidates(&f);
    // Every candidate must accept the signature and refuse it over another message, or its
    // figure would be the time of a failure.
    let mut other = f.payload.clone();
    other[100] ^= 1;
    for (name, verify) in &candidates {
        assert!(
            verify(&f.payload, &f.signature),
            "{name} refuses a good signature"
        );
        assert!(
            !verify(&other, &f.signature),
            "{name} accepts a tampered message"
        );
    }
    eprintln!("payload: {} bytes", f.payload.len());

    let mut c = Criterion::default().configure_from_args();
    criterion_benches(&mut c, &f, &candidates);
    c.final_summary();

    let (rounds, batch, seconds) = if full { (31, 100, 3) } else { (1, 1, 0) };
    let openssl = |elapsed| {
        if full {
            openssl_speed(seconds, elapsed)
        } else {
            Err("not run in test mode".to_owned())
        }
    };
    let load_before = load();
    let openssl_before = openssl(true);
    let micros = interleaved(&f, &candidates, rounds, batch);
    let openssl_after = openssl(true);
    let load_after = load();
    let openssl_cpu = openssl(false);

    let per_verify = |r: &Result<f64, String>| r.as_ref().ok().map(|per_s| 1e6 / per_s);
    let wall_runs: Vec<f64> = [&openssl_before, &openssl_after]
        .into_iter()
        .filter_map(per_verify)
        .collect();
    let openssl_wall =
        (!wall_runs.is_empty()).then(|| wall_runs.iter().sum::<f64>() / wall_runs.len() as f64);
    println!();
    println!(
        "verify one P-256/SHA-256 signature over {} bytes: median of {rounds} interleaved rounds \
         of {batch}, wall clock (load {load_before} before, {load_after} after)",
        f.payload.len()
    );
    println!(
        "{:<48} {:>10} {:>10} {:>8}",
        "candidate", "us/verify", "x openssl", "x p256"
    );
    let row = |name: &str, us: f64| {
        let vs_openssl = openssl_wall.map_or("-".into(), |o| format!("{:.2}", us / o));
        println!(
            "{name:<48} {us:>10.1} {vs_openssl:>10} {:>8.2}",
            us / micros[0]
        );
    };
    for ((name, _), us) in candidates.iter().zip(&micros) {
        row(name, *us);
    }
    for (when, result) in [
        ("-elapsed, before", &openssl_before),
        ("-elapsed, after", &openssl_after),
        ("its default, CPU time", &openssl_cpu),
    ] {
        let name = format!("openssl speed -seconds {seconds} ({when})");
        match result {
            Ok(per_s) => row(&name, 1e6 / per_s),
            Err(why) => println!("{name}: skipped: {why}"),
        }
    }
}
