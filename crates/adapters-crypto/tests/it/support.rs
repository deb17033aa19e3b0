//! Shared helpers: an independent model of what a strict verifier must say about any byte
//! string offered as a signature, a realistic message, and running the `openssl` command line.
//!
//! The model is written from the DER and ECDSA rules, not from the crate under test, so that a
//! tampering test compares the verifier against an expectation worked out separately for every
//! mutated signature instead of accepting "some error".

use std::path::Path;
use std::process::{Command, Output, Stdio};

use guild_adapters_crypto::{Backend, P256Verifier, PublicKey};
use guild_domain::manifest::Metadata;
use guild_ports::signature::{SignatureError, SignatureErrorKind, SignatureVerifier};

/// The order n of the P-256 group, big-endian.
pub const N: [u8; 32] = hex32("ffffffff00000000ffffffffffffffffbce6faada7179e84f3b9cac2fc632551");

/// floor(n / 2): the largest low-S value.
pub const HALF_N: [u8; 32] =
    hex32("7fffffff800000007fffffffffffffffde737d56d38bcf4279dce5617e3192a8");

const fn hex32(s: &str) -> [u8; 32] {
    const fn digit(c: u8) -> u8 {
        match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => panic!("not a hex digit"),
        }
    }
    let s = s.as_bytes();
    assert!(s.len() == 64);
    let mut out = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        out[i] = (digit(s[2 * i]) << 4) | digit(s[2 * i + 1]);
        i += 1;
    }
    out
}

/// Lowercase hex of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `a - b` for big-endian 256-bit numbers with `a >= b`.
pub fn sub(a: &[u8; 32], b: &[u8; 32]) -> [u8; 32] {
    let mut out = [0u8; 32];
    let mut borrow = 0i16;
    for i in (0..32).rev() {
        let mut d = i16::from(a[i]) - i16::from(b[i]) - borrow;
        borrow = 0;
        if d < 0 {
            d += 256;
            borrow = 1;
        }
        out[i] = d as u8;
    }
    assert_eq!(borrow, 0, "sub: a < b");
    out
}

/// The minimal DER INTEGER for a non-negative 256-bit number.
pub fn der_integer(v: &[u8; 32]) -> Vec<u8> {
    let first = v.iter().position(|&b| b != 0).unwrap_or(31);
    let mut content = v[first..].to_vec();
    if content[0] & 0x80 != 0 {
        content.insert(0, 0);
    }
    let mut out = vec![0x02, content.len() as u8];
    out.extend(content);
    out
}

/// A DER ECDSA signature `SEQUENCE { r INTEGER, s INTEGER }`.
pub fn der_signature(r: &[u8; 32], s: &[u8; 32]) -> Vec<u8> {
    let mut body = der_integer(r);
    body.extend(der_integer(s));
    let mut out = vec![0x30, body.len() as u8];
    out.extend(body);
    out
}

/// Reads one strict DER INTEGER in 1..n from the front of `b`; returns it and the rest.
fn strict_integer(b: &[u8]) -> Option<([u8; 32], &[u8])> {
    let (&tag, rest) = b.split_first()?;
    let (&len, rest) = rest.split_first()?;
    // Short-form lengths only: every length here is below 128, and DER forbids the long form
    // for those.
    if tag != 0x02 || len == 0 || len >= 0x80 || rest.len() < usize::from(len) {
        return None;
    }
    let (content, rest) = rest.split_at(usize::from(len));
    if content[0] & 0x80 != 0 {
        return None; // negative
    }
    if content[0] == 0 && content.len() > 1 && content[1] & 0x80 == 0 {
        return None; // padded: not minimal
    }
    let digits = if content[0] == 0 {
        &content[1..]
    } else {
        content
    };
    if digits.len() > 32 {
        return None;
    }
    let mut v = [0u8; 32];
    v[32 - digits.len()..].copy_from_slice(digits);
    if v == [0u8; 32] || v >= N {
        return None;
    }
    Some((v, rest))
}

/// Parses a strict DER ECDSA signature with both numbers in 1..n.
pub fn parse_strict(sig: &[u8]) -> Option<([u8; 32], [u8; 32])> {
    let (&tag, rest) = sig.split_first()?;
    let (&len, body) = rest.split_first()?;
    if tag != 0x30 || len >= 0x80 || body.len() != usize::from(len) {
        return None;
    }
    let (r, rest) = strict_integer(body)?;
    let (s, rest) = strict_integer(rest)?;
    rest.is_empty().then_some((r, s))
}

/// What a verifier says about a candidate signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    Valid,
    Malformed,
    HighS,
    Invalid,
}

/// What a strict low-S verifier must say about `candidate` as a signature over a message whose
/// only known valid signature is `valid` (low-S). Another valid signature can only be found by
/// solving the discrete logarithm, so any other well-formed low-S value is `Invalid`.
pub fn model(candidate: &[u8], valid: &[u8]) -> Verdict {
    let Some((r, s)) = parse_strict(candidate) else {
        return Verdict::Malformed;
    };
    if s > HALF_N {
        Verdict::HighS
    } else if Some((r, s)) == parse_strict(valid) {
        Verdict::Valid
    } else {
        Verdict::Invalid
    }
}

/// The verdict a verification result expresses; any key-related kind fails the test, since
/// these helpers are only used with good keys.
pub fn verdict(result: Result<(), SignatureError>) -> Verdict {
    match result {
        Ok(()) => Verdict::Valid,
        Err(e) => match e.kind() {
            SignatureErrorKind::MalformedSignature => Verdict::Malformed,
            SignatureErrorKind::HighS => Verdict::HighS,
            SignatureErrorKind::Invalid => Verdict::Invalid,
            other => panic!("unexpected kind {other:?} for a signature problem: {e}"),
        },
    }
}

/// What a verification said, in a form two results can be compared by: the kind and the whole
/// message of a refusal.
fn outcome(result: &Result<(), SignatureError>) -> Result<(), (SignatureErrorKind, String)> {
    match result {
        Ok(()) => Ok(()),
        Err(e) => Err((e.kind(), e.to_string())),
    }
}

/// Verifies through the port with every [`Backend`], and with the key parsed once where it
/// parses, and requires all of them to say the same: all accept, or all refuse with the same
/// kind and message. Returns the port's result with the default backend.
///
/// Every test of what the verifier accepts and refuses goes through this, so each one checks
/// ring against p256 as well as against its own expectation.
pub fn verify_all(spki: &[u8], message: &[u8], signature: &[u8]) -> Result<(), SignatureError> {
    let default = P256Verifier::new().verify(spki, message, signature);
    assert_eq!(P256Verifier::new().backend(), Backend::default());
    let expected = outcome(&default);
    let parsed = PublicKey::from_spki_der(spki).ok();
    for backend in Backend::ALL {
        let port = P256Verifier::with_backend(backend).verify(spki, message, signature);
        assert_eq!(
            outcome(&port),
            expected,
            "{} through the port",
            backend.name()
        );
        if let Some(key) = &parsed {
            let once = key.verify_using(backend, message, signature);
            assert_eq!(
                outcome(&once),
                expected,
                "{} with a parsed key",
                backend.name()
            );
        }
    }
    default
}

/// Canonical payload bytes of a real `.gkmetadata` manifest, grown with extra provided
/// operations until they are at least `min_len` bytes long.
pub fn canonical_payload(min_len: usize) -> Vec<u8> {
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
        let meta = match Metadata::parse(doc.as_bytes()) {
            Ok(m) => m,
            Err(e) => panic!("test manifest does not parse: {e:?}"),
        };
        if meta.canonical_payload().len() >= min_len {
            return meta.canonical_payload().to_vec();
        }
        ops += 1 + (min_len - meta.canonical_payload().len()) / 40;
    }
}

/// A small deterministic generator for garbage inputs (xorshift64*), so failures reproduce.
pub struct Garbage(u64);

impl Garbage {
    pub fn new(seed: u64) -> Self {
        Garbage(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next_u64() as u8).collect()
    }

    /// Two random numbers shaped like a low-S signature's r and s: below 2^255 (so in 1..n
    /// except with negligible probability), s odd so that it is never zero.
    pub fn r_and_s(&mut self) -> ([u8; 32], [u8; 32]) {
        let mut r = [0u8; 32];
        let mut s = [0u8; 32];
        r.copy_from_slice(&self.bytes(32));
        s.copy_from_slice(&self.bytes(32));
        r[0] &= 0x7f;
        s[0] &= 0x7f;
        s[31] |= 1;
        (r, s)
    }
}

/// Runs `openssl` with `args` in `dir`. The interoperability tests need the command line: CI
/// installs it, and a missing binary is a failure with a message that says so, never a skip.
pub fn openssl(dir: &Path, args: &[&str]) -> Output {
    match Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
    {
        Ok(out) => out,
        Err(e) => panic!(
            "the `openssl` command line is required by these tests (install OpenSSL 1.1.1 or \
             3.x so that `openssl` is on PATH): cannot run it: {e}"
        ),
    }
}

/// Runs `openssl` and requires success; returns its standard output.
pub fn openssl_ok(dir: &Path, args: &[&str]) -> Vec<u8> {
    let out = openssl(dir, args);
    assert!(
        out.status.success(),
        "openssl {} failed ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Runs a shell pipeline in `dir` and requires success; returns its standard output.
pub fn shell_ok(dir: &Path, script: &str) -> String {
    let out = match Command::new("sh")
        .args(["-c", script])
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
    {
        Ok(out) => out,
        Err(e) => panic!("cannot run sh: {e}"),
    };
    assert!(
        out.status.success(),
        "`{script}` failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Reads a file a tool wrote.
pub fn read(dir: &Path, name: &str) -> Vec<u8> {
    match std::fs::read(dir.join(name)) {
        Ok(b) => b,
        Err(e) => panic!("cannot read {name}: {e}"),
    }
}

/// Reads a text file a tool wrote.
pub fn read_text(dir: &Path, name: &str) -> String {
    String::from_utf8(read(dir, name)).expect("tool output is UTF-8")
}

/// A fresh temporary directory for one test.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("a temporary directory")
}

/// Makes a key with `openssl genpkey` for `algorithm` and options, and returns its private
/// PEM and its public DER.
pub fn foreign_key(d: &Path, name: &str, genpkey: &[&str]) -> (String, Vec<u8>) {
    let pem = format!("{name}.pem");
    let der = format!("{name}.der");
    let mut args = vec!["genpkey"];
    args.extend_from_slice(genpkey);
    args.extend_from_slice(&["-out", &pem]);
    openssl_ok(d, &args);
    openssl_ok(
        d,
        &[
            "pkey", "-in", &pem, "-pubout", "-outform", "DER", "-out", &der,
        ],
    );
    (read_text(d, &pem), read(d, &der))
}

/// Makes a P-256 private key in PKCS#8 PEM with `openssl genpkey`, written to `dir/name`.
pub fn openssl_p256_key(dir: &Path, name: &str) {
    openssl_ok(
        dir,
        &[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
            name,
        ],
    );
}
