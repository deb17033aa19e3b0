//! Signature costs: verifying one signature over a 4 KiB canonical payload (through the port,
//! as package authentication does, and with a key parsed once), signing it, and key ids.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use guild_adapters_crypto::{P256Verifier, PublicKey, SigningKey};
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

fn signatures(c: &mut Criterion) {
    let key = SigningKey::generate().expect("generator");
    let payload = canonical_payload(4096);
    let signature = key.sign(&payload).expect("sign");
    let spki = key.public_key().spki_der().to_vec();
    let verifier: &dyn SignatureVerifier = &P256Verifier;
    verifier.verify(&spki, &payload, &signature).expect("valid");
    eprintln!("payload: {} bytes", payload.len());

    let mut g = c.benchmark_group("p256");
    g.throughput(Throughput::Bytes(payload.len() as u64));
    g.bench_function("verify_port_4k", |b| {
        b.iter(|| verifier.verify(black_box(&spki), black_box(&payload), black_box(&signature)))
    });
    let public = key.public_key().clone();
    g.bench_function("verify_parsed_key_4k", |b| {
        b.iter(|| public.verify(black_box(&payload), black_box(&signature)))
    });
    g.bench_function("sign_4k", |b| b.iter(|| key.sign(black_box(&payload))));
    g.throughput(Throughput::Elements(1));
    g.bench_function("key_id_of_spki_der", |b| {
        b.iter(|| key_id(black_box(&spki)))
    });
    g.bench_function("parse_spki_der_with_key_id", |b| {
        b.iter(|| PublicKey::from_spki_der(black_box(&spki)).map(|k| k.key_id()))
    });
    g.finish();
}

criterion_group!(benches, signatures);
criterion_main!(benches);
