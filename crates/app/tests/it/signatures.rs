//! The signature suite, at the package manager's door: every payload field and every byte of an
//! artifact tampered, and every way a signature or its key can be wrong. Each case is installed
//! through `PackageManager::install` and must be refused with its exact error, before the store
//! is touched: the registry generation, the whole store directory and the count of staging and
//! commit requests are the same afterwards. A package that never reaches staging has had no
//! library written, let alone opened.
//!
//! The payload cases are generated: every leaf of two rich base payloads (a `gkmodule` and a
//! `gkernel`, between them using every payload field) is changed to another valid value, and every
//! list and optional field is grown, shrunk and dropped. The `.gkmetadata` is re-serialised with
//! the original signatures; the untampered payload re-serialised the same way installs at the end,
//! so a refusal can only come from the change.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use guild_adapters_crypto::{P256Verifier, SigningKey};
use guild_domain::ids::{PackageKind, Sha256Digest};
use guild_domain::json::{JsonErrorKind, JsonPath, Value};
use guild_domain::lifecycle::State;
use guild_domain::manifest::{
    Arch, Backend, FieldError, FieldErrorKind, ManifestErrors, Metadata, Os,
};
use guild_domain::trust::{AuthError, SignatureOutcome};
use guild_domain::version::Version;
use guild_host::package_manager::LeftOut;
use guild_host::{HostError, InstallOptions};
use guild_ports::signature::{SignatureErrorKind, SignatureVerifier};
use guild_ports::source::SourceErrorKind;
use guild_test_support::{
    disk, id, key, open_host, publisher, trust, Built, Host, ModDep, Scratch, Spec, Workshop,
    PUBLISHER,
};

/// The publisher trusted with a second key, for "key of another publisher".
const OTHER: &str = "org.other";

/// The small artifact whose every byte is flipped.
const TABLE: &str = "share/table.bin";

/// Every payload field the format defines; the generated cases must touch each one.
const PAYLOAD_FIELDS: &[&str] = &[
    "package_id",
    "kind",
    "version",
    "publisher_id",
    "kernel_abi",
    "module_abi",
    "os",
    "arch",
    "backends",
    "entry",
    "artifacts",
    "provided_ops",
    "provided_runners",
    "dependencies",
    "module_dependencies",
    "check_params",
];

/// What a refused install may have done to the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reach {
    /// Nothing at all: refused before a staging directory was even asked for.
    Nothing,
    /// A staging directory was asked for and filled, then thrown away; nothing was committed.
    StagingOnly,
}

/// The trusted store and the packages every case is a variation of.
struct Suite {
    shop: Workshop,
    _store_dir: Scratch,
    host: Host,
    /// Trusted for [`PUBLISHER`]; signs the base packages.
    key: SigningKey,
    /// Trusted for [`OTHER`].
    other: SigningKey,
    cases: usize,
}

impl Suite {
    fn new() -> Self {
        let shop = Workshop::new();
        let store_dir = Scratch::new();
        let host = open_host(&store_dir.path().join("store"), None).unwrap();
        let (key, other) = (key(), key());
        trust(&host.pm, PUBLISHER, &key);
        trust(&host.pm, OTHER, &other);
        Suite {
            shop,
            _store_dir: store_dir,
            host,
            key,
            other,
            cases: 0,
        }
    }

    fn install(&self, archive: &Path) -> Result<guild_host::Installed, HostError> {
        self.host.pm.install(archive, InstallOptions::default())
    }

    /// Installs `archive`, which must be refused, and checks that the store is as it was.
    fn refuse(&mut self, label: &str, archive: &Path, reach: Reach) -> HostError {
        let root = &self.host.root;
        let before = disk(root);
        let generation = self.host.generation();
        let mut calls = self.host.spy.calls();
        let err = match self.install(archive) {
            Ok(installed) => panic!("{label}: installed {installed:?}"),
            Err(e) => e,
        };
        assert_eq!(
            self.host.generation(),
            generation,
            "{label}: the registry moved"
        );
        assert_eq!(disk(root), before, "{label}: the store directory changed");
        if reach == Reach::StagingOnly {
            calls.staging += 1;
        }
        assert_eq!(self.host.spy.calls(), calls, "{label}: store calls ({err})");
        self.cases += 1;
        err
    }

    /// The case must be refused as unauthenticated with exactly `expected`.
    fn expect_auth(&mut self, label: &str, archive: &Path, expected: AuthError) {
        match self.refuse(label, archive, Reach::Nothing) {
            HostError::Unauthenticated {
                location, source, ..
            } => {
                assert_eq!(location, archive, "{label}");
                assert_eq!(source, expected, "{label}");
            }
            other => panic!("{label}: expected {expected}, got {other}"),
        }
    }

    /// The case must be refused by the manifest reader with exactly `expected`.
    fn expect_manifest(&mut self, label: &str, archive: &Path, expected: Vec<FieldError>) {
        match self.refuse(label, archive, Reach::Nothing) {
            HostError::Manifest { location, errors } => {
                assert_eq!(location, archive, "{label}");
                assert_eq!(
                    errors,
                    ManifestErrors {
                        errors: expected,
                        omitted: 0
                    },
                    "{label}"
                );
            }
            other => panic!("{label}: expected a manifest error, got {other}"),
        }
    }

    /// The outcome of a payload signed by the suite's key that no longer matches its signature.
    fn bad_signature(&self, publisher_id: &str) -> AuthError {
        AuthError::NoValidSignature {
            publisher: publisher(publisher_id),
            attempts: vec![(
                self.key.key_id(),
                SignatureOutcome::Invalid {
                    reason: "signature does not verify".into(),
                },
            )],
        }
    }
}

/// The dependencies both bases need, installed; and the two bases, built but not installed.
fn bases(suite: &Suite) -> (Built, Built) {
    let base = suite
        .shop
        .build(&Spec::kernel("example.base", "1.5.0"), &suite.key);
    let core = suite
        .shop
        .build(&Spec::module("example.core", "1.2.0"), &suite.key);
    for dep in [&base, &core] {
        suite.install(&dep.archive).unwrap();
    }
    // Between them the two bases use every payload field, each list with two entries or more
    // where the rules allow, and every optional field of a dependency record.
    let module = Spec::module("example.scan", "1.2.0")
        .file(
            TABLE,
            &(0u8..48)
                .map(|b| b.wrapping_mul(37) ^ 0x5a)
                .collect::<Vec<_>>(),
        )
        .backend("cuda")
        .op("example.scan.op.cuda")
        .runner("example.runner.scan")
        .depends_on("example.base", "1.0.0", Some("2.0.0"))
        .module_dep(
            ModDep::on("example.core", "1.0.0")
                .max("1.9.0")
                .publisher(PUBLISHER)
                .sha256(core.digest()),
        )
        .check_params("example.scan.prefix_sum", "u32:8,f32:2.0");
    // A kernel may carry any abi_tag, so its tag can be changed and still parse.
    let kernel = Spec::kernel("example.gemm", "2.0.0")
        .file("share/tune.json", b"{\"tile\": 64}")
        .backend("hip")
        .runner("example.runner.gemm")
        .depends_on("example.base", "1.0.0", None)
        .module_dep(
            ModDep::on("example.core", "1.1.0")
                .max("1.5.0")
                .publisher(PUBLISHER)
                .sha256(core.digest()),
        )
        .check_params("example.gemm.matmul", "f64:1.5");
    (
        suite.shop.build(&module, &suite.key),
        suite.shop.build(&kernel, &suite.key),
    )
}

/// One step of a path into a JSON value.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Seg {
    Key(String),
    Index(usize),
}

fn show(path: &[Seg]) -> String {
    let mut s = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) if s.is_empty() => s.push_str(k),
            Seg::Key(k) => s.push_str(&format!(".{k}")),
            Seg::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

fn leaves(v: &Value, at: &mut Vec<Seg>, out: &mut Vec<Vec<Seg>>) {
    match v {
        Value::Object(members) => {
            for (k, x) in members {
                at.push(Seg::Key(k.clone()));
                leaves(x, at, out);
                at.pop();
            }
        }
        Value::Array(items) => {
            for (i, x) in items.iter().enumerate() {
                at.push(Seg::Index(i));
                leaves(x, at, out);
                at.pop();
            }
        }
        _ => out.push(at.clone()),
    }
}

fn at_mut<'v>(v: &'v mut Value, path: &[Seg]) -> &'v mut Value {
    let Some((first, rest)) = path.split_first() else {
        return v;
    };
    let next = match (v, first) {
        (Value::Object(members), Seg::Key(k)) => members
            .iter_mut()
            .find(|(name, _)| name == k)
            .map(|(_, x)| x)
            .unwrap(),
        (Value::Array(items), Seg::Index(i)) => &mut items[*i],
        (v, seg) => panic!("{seg:?} does not lead into {}", v.type_name()),
    };
    at_mut(next, rest)
}

fn members_mut(v: &mut Value) -> &mut Vec<(String, Value)> {
    match v {
        Value::Object(m) => m,
        other => panic!("expected an object, found {}", other.type_name()),
    }
}

fn items_mut<'v>(payload: &'v mut Value, field: &str) -> &'v mut Vec<Value> {
    match at_mut(payload, &[Seg::Key(field.into())]) {
        Value::Array(items) => items,
        other => panic!("{field} is a {}", other.type_name()),
    }
}

fn text(v: &Value) -> String {
    v.as_str().unwrap().to_owned()
}

fn bump_patch(s: &str) -> String {
    let mut version = Version::parse(s).unwrap();
    version.patch += 1;
    version.to_string()
}

/// Another spelling from `spellings` than any of `taken`.
fn other_spelling(spellings: &[&str], taken: &[String]) -> String {
    spellings
        .iter()
        .find(|s| !taken.iter().any(|t| t == *s))
        .unwrap()
        .to_string()
}

/// `payload` with the leaf at `path` changed to another valid value (and, where the rules tie
/// two fields together, the other one changed to match).
fn tamper_leaf(payload: &Value, path: &[Seg]) -> Value {
    let mut p = payload.clone();
    let field = match &path[0] {
        Seg::Key(k) => k.clone(),
        Seg::Index(_) => unreachable!("the payload is an object"),
    };
    let name = path
        .iter()
        .rev()
        .find_map(|s| match s {
            Seg::Key(k) => Some(k.clone()),
            Seg::Index(_) => None,
        })
        .unwrap();
    let old = at_mut(&mut p, path).clone();
    let new: Value = match name.as_str() {
        // A record that still parses: only the signature can object.
        _ if field == "check_params" => format!("{},u8:1", text(&old)).into(),
        "package_id" | "module_id" | "provided_ops" | "provided_runners" => {
            format!("{}x", text(&old)).into()
        }
        "version" | "min_version" | "max_version" => bump_patch(&text(&old)).into(),
        // Widening the Kernel ABI range keeps the host's own version inside it.
        "min" => "0.9.0".into(),
        "max" => "1.1.0".into(),
        "publisher_id" => OTHER.into(),
        "module_abi" => 2u64.into(),
        "os" => other_spelling(Os::SPELLINGS, &[text(&old)]).into(),
        "arch" => other_spelling(Arch::SPELLINGS, &[text(&old)]).into(),
        "backends" => {
            let taken: Vec<String> = items_mut(&mut p, "backends").iter().map(text).collect();
            other_spelling(Backend::SPELLINGS, &taken).into()
        }
        "entry" => {
            let paths: Vec<Value> = items_mut(&mut p, "artifacts")
                .iter()
                .map(|a| a.get("path").unwrap().clone())
                .collect();
            paths.into_iter().find(|x| *x != old).unwrap()
        }
        "path" => {
            let renamed = text(&old).replacen('.', "-2.", 1);
            // Renaming the entry library renames the entry with it, or the manifest is invalid.
            let entry = at_mut(&mut p, &[Seg::Key("entry".into())]);
            if *entry == old {
                *entry = renamed.as_str().into();
            }
            renamed.into()
        }
        "size" => (old.as_integer().unwrap().as_u64().unwrap() + 1).into(),
        "sha256" => {
            let mut hex = text(&old);
            let last = if hex.ends_with('0') { "1" } else { "0" };
            hex.replace_range(63.., last);
            hex.into()
        }
        "abi_tag" => "build.provenance.v2".into(),
        "kind" => {
            // Module and kernel differ in whether module_abi may appear.
            let m = members_mut(&mut p);
            if text(&old) == "gkmodule" {
                m.retain(|(k, _)| k != "module_abi");
                "gkernel".into()
            } else {
                let at = m.iter().position(|(k, _)| k == "kernel_abi").unwrap() + 1;
                m.insert(at, ("module_abi".into(), 1u64.into()));
                "gkmodule".into()
            }
        }
        other => panic!("no tampering rule for {field}: {other}"),
    };
    assert_ne!(new, old, "{}: the change changes nothing", show(path));
    *at_mut(&mut p, path) = new;
    p
}

/// `payload` with `field`'s list grown by one valid element.
fn grow(payload: &Value, field: &str) -> Value {
    let mut p = payload.clone();
    let items = items_mut(&mut p, field);
    let mut extra = items.last().unwrap().clone();
    let (key, suffix) = match field {
        "backends" => {
            let taken: Vec<String> = items.iter().map(text).collect();
            items.push(other_spelling(Backend::SPELLINGS, &taken).into());
            return p;
        }
        "artifacts" => ("path", "extra/added.bin"),
        "dependencies" => ("package_id", "example.added"),
        "module_dependencies" => ("module_id", "example.added"),
        _ => {
            items.push(format!("{}.added", text(&extra)).into());
            return p;
        }
    };
    *at_mut(&mut extra, &[Seg::Key(key.into())]) = suffix.into();
    items.push(extra);
    p
}

/// `payload` with the last element of `field`'s list removed (the entry library stays listed:
/// every base lists it first).
fn shrink(payload: &Value, field: &str) -> Value {
    let mut p = payload.clone();
    items_mut(&mut p, field).pop();
    p
}

/// `payload` without the optional `field`.
fn drop_field(payload: &Value, field: &str) -> Value {
    let mut p = payload.clone();
    members_mut(&mut p).retain(|(k, _)| k != field);
    p
}

/// The `.gkmetadata` text of `built` with `payload` in place of its own and its signatures kept.
fn document(built: &Built, payload: Value) -> Vec<u8> {
    let mut doc = built.metadata.to_value();
    *at_mut(&mut doc, &[Seg::Key("payload".into())]) = payload;
    doc.to_pretty_string().into_bytes()
}

/// `built`'s document with its signature list replaced.
fn with_signatures(built: &Built, signatures: Vec<Value>) -> Vec<u8> {
    let mut doc = built.metadata.to_value();
    *at_mut(&mut doc, &[Seg::Key("signatures".into())]) = Value::Array(signatures);
    doc.to_pretty_string().into_bytes()
}

/// `built`'s single signature entry with its `signature` hex replaced.
fn signature_hex(built: &Built, hex: String) -> Vec<Value> {
    let mut doc = built.metadata.to_value();
    let entry = at_mut(&mut doc, &[Seg::Key("signatures".into()), Seg::Index(0)]);
    *at_mut(entry, &[Seg::Key("signature".into())]) = hex.into();
    vec![entry.clone()]
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The order n of the P-256 group, big-endian.
const P256_N: [u8; 32] = [
    0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xbc, 0xe6, 0xfa, 0xad, 0xa7, 0x17, 0x9e, 0x84, 0xf3, 0xb9, 0xca, 0xc2, 0xfc, 0x63, 0x25, 0x51,
];

/// Splits a short-form DER `SEQUENCE { INTEGER r, INTEGER s }` (every P-256 signature is one).
fn der_parts(sig: &[u8]) -> (Vec<u8>, Vec<u8>) {
    assert_eq!(sig[0], 0x30);
    assert_eq!(usize::from(sig[1]), sig.len() - 2);
    let int = |at: usize| -> (Vec<u8>, usize) {
        assert_eq!(sig[at], 0x02);
        let len = usize::from(sig[at + 1]);
        (sig[at + 2..at + 2 + len].to_vec(), at + 2 + len)
    };
    let (r, next) = int(2);
    let (s, end) = int(next);
    assert_eq!(end, sig.len());
    (r, s)
}

fn der_integer(v: &[u8]) -> Vec<u8> {
    let first = v.iter().position(|&b| b != 0).unwrap_or(v.len() - 1);
    let mut content = v[first..].to_vec();
    if content[0] & 0x80 != 0 {
        content.insert(0, 0);
    }
    let mut out = vec![0x02, content.len() as u8];
    out.extend(content);
    out
}

/// The high-S twin of a low-S signature: the same r with n - s. It verifies mathematically; a
/// strict verifier refuses it so that a signature has one encoding.
fn high_s_twin(sig: &[u8]) -> Vec<u8> {
    let (r, s) = der_parts(sig);
    let mut s32 = [0u8; 32];
    let digits = s.strip_prefix(&[0]).unwrap_or(&s);
    s32[32 - digits.len()..].copy_from_slice(digits);
    let mut twin = [0u8; 32];
    let mut borrow = 0i16;
    for i in (0..32).rev() {
        let mut d = i16::from(P256_N[i]) - i16::from(s32[i]) - borrow;
        borrow = i16::from(d < 0);
        if d < 0 {
            d += 256;
        }
        twin[i] = d as u8;
    }
    let mut body = der_integer(&r);
    body.extend(der_integer(&twin));
    let mut out = vec![0x30, body.len() as u8];
    out.extend(body);
    out
}

/// Runs every generated payload case of `built`; answers the payload fields touched.
fn payload_cases(suite: &mut Suite, built: &Built) -> BTreeSet<String> {
    let payload = built.metadata.payload().clone();
    let kind = built.metadata.manifest().kind;
    let mut touched = BTreeSet::new();
    let mut cases: Vec<(String, Value)> = Vec::new();
    let mut paths = Vec::new();
    leaves(&payload, &mut Vec::new(), &mut paths);
    for path in &paths {
        cases.push((
            format!("change {}", show(path)),
            tamper_leaf(&payload, path),
        ));
    }
    for field in [
        "backends",
        "artifacts",
        "provided_ops",
        "provided_runners",
        "dependencies",
        "module_dependencies",
    ] {
        cases.push((format!("add to {field}"), grow(&payload, field)));
        cases.push((format!("remove from {field}"), shrink(&payload, field)));
    }
    for field in [
        "provided_runners",
        "dependencies",
        "module_dependencies",
        "check_params",
    ] {
        cases.push((format!("drop {field}"), drop_field(&payload, field)));
    }
    let name = format!("{}@{}", built.id(), built.version());
    for (what, tampered) in cases {
        let label = format!("{name}: {what}");
        assert_ne!(tampered, payload, "{label}: nothing changed");
        let bytes = document(built, tampered.clone());
        let archive = suite.shop.with_metadata(built, &bytes);
        let field = what.rsplit(' ').next().unwrap_or_default();
        let field = field
            .split(['.', '['])
            .next()
            .unwrap_or_default()
            .to_owned();
        touched.insert(field.clone());

        // A gkmodule's module dependencies must use the runtime tag, so changing it there is a
        // manifest error; everywhere else the tampered manifest is valid and only the signature
        // can object.
        if kind == PackageKind::Module && what.ends_with(".abi_tag") {
            let path = JsonPath::root()
                .key("payload")
                .key("module_dependencies")
                .index(0)
                .key("abi_tag");
            let kind = FieldErrorKind::NonRuntimeModuleDependency {
                found: "build.provenance.v2".into(),
            };
            suite.expect_manifest(&label, &archive, vec![FieldError { path, kind }]);
            continue;
        }
        let metadata = Metadata::parse(&bytes)
            .unwrap_or_else(|e| panic!("{label}: the generator made an invalid manifest: {e}"));
        assert_ne!(metadata.payload_digest(), built.digest(), "{label}");
        let expected = if what == "change publisher_id" {
            // The key is trusted, but for the publisher the package used to name.
            AuthError::NoValidSignature {
                publisher: publisher(OTHER),
                attempts: vec![(
                    suite.key.key_id(),
                    SignatureOutcome::KeyOfAnotherPublisher {
                        owner: publisher(PUBLISHER),
                    },
                )],
            }
        } else {
            suite.bad_signature(PUBLISHER)
        };
        suite.expect_auth(&label, &archive, expected);
    }
    // Every leaf, list and optional field was changed at least once.
    touched
}

#[test]
fn signature_suite_refuses_every_tampering_before_the_store() {
    let mut suite = Suite::new();
    let (module, kernel) = bases(&suite);

    // 1. Every payload field.
    let mut touched = payload_cases(&mut suite, &module);
    touched.extend(payload_cases(&mut suite, &kernel));
    let expected: BTreeSet<String> = PAYLOAD_FIELDS.iter().map(|s| s.to_string()).collect();
    assert_eq!(touched, expected, "payload fields covered");
    let payload_count = suite.cases;

    // 2. Every byte of a small artifact, flipped inside the archive. The manifest still verifies,
    // so the artifact digest check during extraction must catch it, and nothing is committed.
    let archive = fs::read(&module.archive).unwrap();
    let table = fs::read(module.src.join(TABLE)).unwrap();
    let at: Vec<usize> = archive
        .windows(table.len())
        .enumerate()
        .filter(|(_, w)| *w == table.as_slice())
        .map(|(i, _)| i)
        .collect();
    assert_eq!(
        at.len(),
        1,
        "the artifact's bytes appear once in the archive"
    );
    let declared = module
        .metadata
        .manifest()
        .artifacts
        .iter()
        .find(|a| a.path.as_str() == TABLE)
        .unwrap()
        .sha256;
    for i in 0..table.len() {
        let label = format!("artifact {TABLE} byte {i} flipped");
        let mut bytes = archive.clone();
        bytes[at[0] + i] ^= 0xff;
        let mut flipped = table.clone();
        flipped[i] ^= 0xff;
        let path = suite.shop.fresh("flipped.gkmodule");
        fs::write(&path, &bytes).unwrap();
        match suite.refuse(&label, &path, Reach::StagingOnly) {
            HostError::Source(e) => {
                assert_eq!(e.location, path, "{label}");
                assert_eq!(e.member.as_deref(), Some(TABLE), "{label}");
                assert_eq!(
                    e.kind,
                    SourceErrorKind::DigestMismatch {
                        expected: Box::new(declared),
                        actual: Box::new(Sha256Digest::of(&flipped)),
                    },
                    "{label}"
                );
            }
            other => panic!("{label}: expected a digest mismatch, got {other}"),
        }
    }
    let byte_count = table.len();

    // 3. Keys and trust.
    let module_spec = || {
        Spec::module("example.scan", "1.2.0")
            .library(b"a different build, so that the payload digest differs")
    };
    let stranger = key();
    let wrong = suite.shop.build(&module_spec(), &stranger);
    suite.expect_auth(
        "signed by an untrusted key",
        &wrong.archive,
        AuthError::NoValidSignature {
            publisher: publisher(PUBLISHER),
            attempts: vec![(stranger.key_id(), SignatureOutcome::UnknownKey)],
        },
    );
    let unknown = suite
        .shop
        .build(&module_spec().publisher("org.unknown"), &suite.key);
    suite.expect_auth(
        "names a publisher the store does not trust",
        &unknown.archive,
        AuthError::PublisherNotTrusted {
            publisher: publisher("org.unknown"),
        },
    );
    let foreign = suite.shop.build(&module_spec(), &suite.other);
    suite.expect_auth(
        "signed by the key of another publisher",
        &foreign.archive,
        AuthError::NoValidSignature {
            publisher: publisher(PUBLISHER),
            attempts: vec![(
                suite.other.key_id(),
                SignatureOutcome::KeyOfAnotherPublisher {
                    owner: publisher(OTHER),
                },
            )],
        },
    );
    let retired = key();
    trust(&suite.host.pm, PUBLISHER, &retired);
    suite
        .host
        .pm
        .update_trust(|t| Ok(t.revoke_key(retired.key_id(), "laptop stolen")))
        .unwrap();
    let by_retired = suite.shop.build(&module_spec(), &retired);
    suite.expect_auth(
        "signed by a revoked key",
        &by_retired.archive,
        AuthError::NoValidSignature {
            publisher: publisher(PUBLISHER),
            attempts: vec![(
                retired.key_id(),
                SignatureOutcome::KeyRevoked {
                    reason: "laptop stolen".into(),
                },
            )],
        },
    );
    let recalled = suite.shop.build(
        &Spec::module("example.scan", "1.2.0").library(b"a build with a known flaw"),
        &suite.key,
    );
    suite
        .host
        .pm
        .update_trust(|t| Ok(t.revoke_digest(recalled.digest(), "miscompiled")))
        .unwrap();
    suite.expect_auth(
        "its payload digest is revoked",
        &recalled.archive,
        AuthError::DigestRevoked {
            digest: recalled.digest(),
            reason: "miscompiled".into(),
        },
    );

    // 4. The signature bytes themselves.
    let valid = module.metadata.signatures()[0].signature.clone();
    let spki = suite.key.public_key().spki_der().to_vec();
    let verifier = P256Verifier::new();
    let payload = module.metadata.canonical_payload();
    let port_reason = |sig: &[u8], kind: SignatureErrorKind| -> String {
        let e = verifier.verify(&spki, payload, sig).unwrap_err();
        assert_eq!(e.kind(), kind);
        e.to_string()
    };
    let twin = high_s_twin(&valid);
    assert_ne!(twin, valid);
    let mut truncated = valid.clone();
    truncated.pop();
    let garbage = vec![0xa5; valid.len()];
    for (label, sig, kind) in [
        (
            "the high-S twin of a valid signature",
            twin,
            SignatureErrorKind::HighS,
        ),
        (
            "a signature truncated by one byte",
            truncated,
            SignatureErrorKind::MalformedSignature,
        ),
        (
            "a garbage signature",
            garbage,
            SignatureErrorKind::MalformedSignature,
        ),
    ] {
        let reason = port_reason(&sig, kind);
        let bytes = with_signatures(&module, signature_hex(&module, hex(&sig)));
        let archive = suite.shop.with_metadata(&module, &bytes);
        suite.expect_auth(
            label,
            &archive,
            AuthError::NoValidSignature {
                publisher: publisher(PUBLISHER),
                attempts: vec![(suite.key.key_id(), SignatureOutcome::Invalid { reason })],
            },
        );
    }
    let sig_path = JsonPath::root().key("signatures").index(0).key("signature");
    let valid_hex = hex(&valid);
    for (label, text) in [
        (
            "signature hex truncated by one digit",
            valid_hex[..valid_hex.len() - 1].to_owned(),
        ),
        (
            "signature hex that is not hex",
            "not-a-signature".to_owned(),
        ),
        ("an empty signature hex", String::new()),
        ("signature hex in upper case", valid_hex.to_uppercase()),
    ] {
        let bytes = with_signatures(&module, signature_hex(&module, text));
        let archive = suite.shop.with_metadata(&module, &bytes);
        suite.expect_manifest(
            label,
            &archive,
            vec![FieldError {
                path: sig_path.clone(),
                kind: FieldErrorKind::InvalidHex,
            }],
        );
    }
    let bytes = with_signatures(&module, Vec::new());
    let archive = suite.shop.with_metadata(&module, &bytes);
    suite.expect_auth("an empty signature list", &archive, AuthError::NoSignatures);
    let unsigned = suite.shop.build_with(&module_spec(), None);
    suite.expect_auth(
        "packed without signing",
        &unsigned.archive,
        AuthError::NoSignatures,
    );

    // 5. Duplicate JSON keys: the signed value would depend on which copy a reader keeps.
    let text = String::from_utf8(document(&module, module.metadata.payload().clone())).unwrap();
    for (label, find, insert, key_name) in [
        (
            "a duplicate version key in the payload",
            "\"version\": ",
            "\"version\": \"9.9.9\",\n    ",
            "version",
        ),
        (
            "a duplicate publisher_id key in the payload",
            "\"publisher_id\": ",
            "\"publisher_id\": \"org.other\",\n    ",
            "publisher_id",
        ),
        (
            "a duplicate key in a dependency record",
            "\"min_version\": ",
            "\"min_version\": \"0.0.1\",\n    ",
            "min_version",
        ),
        (
            "a duplicate signatures key in the envelope",
            "\"signatures\": ",
            "\"signatures\": [],\n  ",
            "signatures",
        ),
    ] {
        let at = text.find(find).unwrap();
        let mut doubled = text.clone();
        doubled.insert_str(at, insert);
        let archive = suite.shop.with_metadata(&module, doubled.as_bytes());
        match suite.refuse(label, &archive, Reach::Nothing) {
            HostError::Manifest { errors, .. } => match errors.errors.as_slice() {
                [FieldError {
                    kind:
                        FieldErrorKind::Json {
                            kind: JsonErrorKind::DuplicateKey { key },
                            ..
                        },
                    ..
                }] => assert_eq!(key, key_name, "{label}"),
                other => panic!("{label}: {other:?}"),
            },
            other => panic!("{label}: expected a duplicate-key error, got {other}"),
        }
    }
    let total = suite.cases;
    println!(
        "signature suite: {total} refusals ({payload_count} payload changes, {byte_count} artifact \
         bytes, {} key, trust and signature cases), none reached the store",
        total - payload_count - byte_count
    );
    assert!(payload_count >= 80, "{payload_count}");

    // 6. The untampered payload, re-serialised exactly as the cases were, still authenticates and
    // installs: the refusals above came from the changes alone.
    let control = suite.shop.with_metadata(
        &module,
        &document(&module, module.metadata.payload().clone()),
    );
    let installed = suite.install(&control).unwrap();
    assert!(installed.changed && installed.enabled);
    assert_eq!(installed.payload_digest, module.digest());
    assert_eq!(installed.key_id, suite.key.key_id());
    let installed = suite.install(&kernel.archive).unwrap();
    assert!(installed.changed && installed.enabled);
    assert_eq!(suite.host.spy.calls().commits, 4);
}

#[test]
fn signature_key_revoked_after_install_disables_the_package_and_its_dependents_at_open() {
    let shop = Workshop::new();
    let dir = Scratch::new();
    let root = dir.path().join("store");
    let (main, side) = (key(), key());
    let core = shop.build(&Spec::module("example.core", "1.0.0"), &side);
    let app = shop.build(
        &Spec::module("example.app", "1.0.0").module_dep(ModDep::on("example.core", "1.0.0")),
        &main,
    );
    let chain = shop.build(
        &Spec::kernel("example.chain", "1.0.0").depends_on("example.app", "1.0.0", None),
        &main,
    );
    let lone = shop.build(&Spec::module("example.lone", "1.0.0"), &main);
    {
        let host = open_host(&root, None).unwrap();
        trust(&host.pm, PUBLISHER, &main);
        trust(&host.pm, PUBLISHER, &side);
        for built in [&core, &app, &chain, &lone] {
            host.pm
                .install(&built.archive, InstallOptions::default())
                .unwrap();
        }
        host.pm
            .update_trust(|t| Ok(t.revoke_key(side.key_id(), "compromised")))
            .unwrap();
        // The revocation takes effect at the next open, not while this handle runs.
        assert!(host.pm.list().unwrap().iter().all(|p| p.enabled.is_some()));
    }

    let host = open_host(&root, None).unwrap();
    assert_eq!(host.report.verified, 4);
    let reasons: Vec<(String, String)> = host
        .report
        .disabled
        .iter()
        .map(
            |LeftOut {
                 id,
                 version,
                 reason,
             }| (format!("{id}@{version}"), reason.clone()),
        )
        .collect();
    let revoked = AuthError::NoValidSignature {
        publisher: publisher(PUBLISHER),
        attempts: vec![(
            side.key_id(),
            SignatureOutcome::KeyRevoked {
                reason: "compromised".into(),
            },
        )],
    };
    assert_eq!(reasons.len(), 3, "{reasons:#?}");
    assert_eq!(
        reasons[0],
        (
            "example.core@1.0.0".to_owned(),
            format!("no longer authenticated: {revoked}")
        )
    );
    assert_eq!(reasons[1].0, "example.app@1.0.0");
    assert!(
        reasons[1].1.contains("example.core") && reasons[1].1.contains("no version"),
        "{}",
        reasons[1].1
    );
    assert_eq!(reasons[2].0, "example.chain@1.0.0");
    assert!(reasons[2].1.contains("example.app"), "{}", reasons[2].1);

    let states: Vec<(String, Option<State>)> = host
        .pm
        .list()
        .unwrap()
        .iter()
        .map(|p| (p.id.to_string(), p.versions.last().map(|v| v.state)))
        .collect();
    assert_eq!(
        states,
        [
            ("example.app".to_owned(), Some(State::Disabled)),
            ("example.chain".to_owned(), Some(State::Disabled)),
            ("example.core".to_owned(), Some(State::Disabled)),
            ("example.lone".to_owned(), Some(State::Enabled)),
        ]
    );
    // The taint is durable: the next open has nothing left to disable.
    drop(host);
    let host = open_host(&root, None).unwrap();
    assert_eq!(host.report.disabled, Vec::new());
    assert_eq!(host.report.verified, 1);
    assert_eq!(
        host.pm.load_plan().unwrap().order.len(),
        1,
        "only example.lone loads"
    );
    assert_eq!(
        host.pm
            .metadata(&id("example.core"), &core.version())
            .map(|m| m.payload_digest()),
        Some(core.digest())
    );
}

#[test]
fn signature_revoked_versions_cannot_come_back_through_enable_or_rollback() {
    let shop = Workshop::new();
    let dir = Scratch::new();
    let (main, side) = (key(), key());
    let old = shop.build(&Spec::module("example.core", "1.0.0"), &side);
    let new = shop.build(&Spec::module("example.core", "2.0.0"), &main);
    let parked = shop.build(&Spec::module("example.parked", "1.0.0"), &side);
    let recalled = shop.build(&Spec::module("example.recalled", "1.0.0"), &main);
    let host = open_host(&dir.path().join("store"), None).unwrap();
    trust(&host.pm, PUBLISHER, &main);
    trust(&host.pm, PUBLISHER, &side);
    for built in [&old, &new, &parked, &recalled] {
        host.pm
            .install(&built.archive, InstallOptions::default())
            .unwrap();
    }
    for package in ["example.parked", "example.recalled"] {
        host.pm.disable(&id(package)).unwrap();
    }
    host.pm
        .update_trust(|t| {
            t.revoke_key(side.key_id(), "compromised");
            t.revoke_digest(recalled.digest(), "miscompiled");
            Ok(())
        })
        .unwrap();
    let generation = host.generation();
    let revoked_key = AuthError::NoValidSignature {
        publisher: publisher(PUBLISHER),
        attempts: vec![(
            side.key_id(),
            SignatureOutcome::KeyRevoked {
                reason: "compromised".into(),
            },
        )],
    };
    let refusals = [
        (
            host.pm.rollback(&id("example.core")).map(|_| ()),
            &old,
            revoked_key.clone(),
        ),
        (
            host.pm.enable(&id("example.parked")).map(|_| ()),
            &parked,
            revoked_key,
        ),
        (
            host.pm.enable(&id("example.recalled")).map(|_| ()),
            &recalled,
            AuthError::DigestRevoked {
                digest: recalled.digest(),
                reason: "miscompiled".into(),
            },
        ),
    ];
    for (outcome, built, expected) in refusals {
        let name = format!("{}@{}", built.id(), built.version());
        match outcome {
            Err(HostError::Unauthenticated {
                location,
                package,
                source,
            }) => {
                assert_eq!(package, name);
                assert_eq!(
                    location,
                    host.store
                        .layout()
                        .package_dir(&built.id(), &built.version())
                );
                assert_eq!(source, expected, "{name}");
            }
            other => panic!("{name}: expected a trust refusal, got {other:?}"),
        }
    }
    assert_eq!(host.generation(), generation, "nothing was committed");
    let plan: Vec<String> = host
        .pm
        .load_plan()
        .unwrap()
        .order
        .iter()
        .map(|p| format!("{}@{}", p.id, p.version))
        .collect();
    assert_eq!(plan, ["example.core@2.0.0"]);
}

/// A key rotation as a runner that follows the store sees it: it reads the version while only
/// the old key signed it; the operator installs the copy re-signed with the new key (which
/// records the signature without touching the tree) and revokes the old key; the runner's
/// refresh keeps the version usable, and so does the next open. A version only the old key
/// signed becomes unusable to the runner and is disabled at the next open.
#[test]
fn signature_rotation_keeps_a_re_signed_version_usable_to_readers_and_writers() {
    use guild_host::package_manager::PackageManager;
    let shop = Workshop::new();
    let dir = Scratch::new();
    let root = dir.path().join("store");
    let (old, new) = (key(), key());
    let scan = shop.build(&Spec::module("example.scan", "1.0.0"), &old);
    let lone = shop.build(&Spec::module("example.lone", "1.0.0"), &old);
    let writer = open_host(&root, None).unwrap();
    trust(&writer.pm, PUBLISHER, &old);
    for built in [&scan, &lone] {
        writer
            .pm
            .install(&built.archive, InstallOptions::default())
            .unwrap();
    }
    let (reader, _) = PackageManager::open_dir_reader(&root).unwrap();
    assert_eq!(reader.load_plan().unwrap().order.len(), 2);

    let resigned = dir.path().join("scan-resigned.gkmodule");
    let signed = guild_host::packaging::sign(&scan.archive, &new, &resigned).unwrap();
    assert_eq!(signed.metadata.payload_digest(), scan.digest());
    trust(&writer.pm, PUBLISHER, &new);
    let generation = writer.pm.generation().unwrap();
    let done = writer
        .pm
        .install(&resigned, InstallOptions::default())
        .unwrap();
    assert!(
        done.changed && !done.repaired && !done.reactivated,
        "{done:?}"
    );
    assert_eq!(done.signatures_added, vec![new.key_id()]);
    assert_eq!(done.signed_by, vec![old.key_id(), new.key_id()]);
    // One commit, and the installed tree's .gkmetadata keeps its bytes.
    assert_eq!(writer.pm.generation().unwrap(), generation + 1);
    let tree = writer.pm.planned(&id("example.scan"), &scan.version()).dir;
    let on_disk = fs::read(tree.join(".gkmetadata")).unwrap();
    assert_eq!(
        guild_domain::manifest::Metadata::parse(&on_disk)
            .unwrap()
            .signatures()
            .len(),
        1
    );
    // The summary `list` and `status` are built from names the recorded key.
    let summary = writer.pm.summary(&id("example.scan")).unwrap().unwrap();
    assert_eq!(summary.versions[0].signatures_added, vec![new.key_id()]);
    // Installing it once more changes nothing.
    let again = writer
        .pm
        .install(&resigned, InstallOptions::default())
        .unwrap();
    assert!(
        !again.changed && again.signatures_added.is_empty(),
        "{again:?}"
    );

    let left = writer
        .pm
        .update_trust(|t| Ok(t.revoke_key(old.key_id(), "rotated")))
        .unwrap();
    assert!(left);
    let refreshed = reader.refresh().unwrap();
    assert!(refreshed.trust_changed);
    let unusable: Vec<String> = refreshed
        .unusable
        .iter()
        .map(|l| format!("{}@{}", l.id, l.version))
        .collect();
    assert_eq!(unusable, ["example.lone@1.0.0"]);
    let order: Vec<String> = reader
        .load_plan()
        .unwrap()
        .order
        .iter()
        .map(|p| p.id.to_string())
        .collect();
    assert_eq!(order, ["example.scan"]);
    let signatures = reader
        .metadata(&id("example.scan"), &scan.version())
        .unwrap()
        .signatures()
        .iter()
        .map(|s| s.key_id)
        .collect::<Vec<_>>();
    assert_eq!(signatures, [old.key_id(), new.key_id()]);

    drop(reader);
    drop(writer);
    let host = open_host(&root, None).unwrap();
    let disabled: Vec<String> = host
        .report
        .disabled
        .iter()
        .map(|l| format!("{}@{}", l.id, l.version))
        .collect();
    assert_eq!(disabled, ["example.lone@1.0.0"]);
    let order: Vec<String> = host
        .pm
        .load_plan()
        .unwrap()
        .order
        .iter()
        .map(|p| p.id.to_string())
        .collect();
    assert_eq!(order, ["example.scan"]);
}

/// The registration check child gets the signatures the store recorded beside a tree's as
/// `KEY_ID:SIGNATURE` arguments: they read back exactly, and anything else is refused with the
/// reason, never a panic.
#[test]
fn signature_arguments_of_the_check_child_round_trip_and_refuse_bad_input() {
    use guild_host::registration::{parse_signature_arg, signature_arg};
    let k = key();
    let built = Workshop::new().build(&Spec::module("example.scan", "1.0.0"), &k);
    let sig = &built.metadata.signatures()[0];
    assert_eq!(sig.key_id, k.key_id());
    assert_eq!(&parse_signature_arg(&signature_arg(sig)).unwrap(), sig);
    let key_hex = sig.key_id.to_hex();
    for bad in [
        String::new(),
        "no-colon".to_owned(),
        format!("{key_hex}:"),
        format!("{key_hex}:abc"),
        format!("{key_hex}:ABCD"),
        format!("{key_hex}:zz"),
        "00:abcd".to_owned(),
        format!("{key_hex}:é"),
    ] {
        assert!(parse_signature_arg(&bad).is_err(), "{bad:?}");
    }
}
