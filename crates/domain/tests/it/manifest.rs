//! Manifests: strict reading of `.gkmetadata`, the typed errors with their JSON paths, the
//! canonical payload bytes, and writing for the packer.

use guild_domain::canonical::{canonical_digest, canonicalize};
use guild_domain::dependency::{Dependency, ModuleDependency, MODULE_ABI_TAG_V1};
use guild_domain::ids::{
    DigestParseError, IdError, ImplId, OpName, PackageId, PackageKind, PublisherId, RunnerId,
    Sha256Digest,
};
use guild_domain::json::{self, Integer, JsonErrorKind, Value};
use guild_domain::manifest::{
    Arch, Artifact, Backend, FieldErrorKind, Manifest, ManifestErrors, Metadata, Os,
    SignatureAlgorithm, SignatureEntry, MAX_METADATA_BYTES, MAX_REPORTED_PROBLEMS,
};
use guild_domain::params::ParamSpec;
use guild_domain::path::{ArtifactPath, PathRule};
use guild_domain::version::{AbiRange, PackedVersion, Version, VersionError, VersionRange};
use proptest::prelude::*;
use serde_json::json;

const AA: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const BB: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const CC: &str = "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc";
const KEY: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// A valid `.gkmetadata` document for a gkernel that uses none of the opt-in fields.
fn kernel_doc() -> serde_json::Value {
    json!({
        "gkmetadata": 1,
        "payload": {
            "package_id": "example.scan",
            "kind": "gkernel",
            "version": "1.2.3",
            "publisher_id": "org.example",
            "kernel_abi": {"min": "1.0.0", "max": "1.0.0"},
            "os": "linux",
            "arch": "x86_64",
            "backends": ["cpu"],
            "entry": "lib/libscan.so",
            "artifacts": [{"path": "lib/libscan.so", "size": 4096, "sha256": AA}],
            "provided_ops": ["example.scan.inclusive.cpu"]
        },
        "signatures": [{"key_id": KEY, "algorithm": "ecdsa-p256-sha256", "signature": "3045022100ff"}]
    })
}

/// A valid `.gkmetadata` document for a gkmodule that uses every opt-in field.
fn module_doc() -> serde_json::Value {
    json!({
        "gkmetadata": 1,
        "payload": {
            "package_id": "example.prefix",
            "kind": "gkmodule",
            "version": "2.0.0",
            "publisher_id": "org.example",
            "kernel_abi": {"min": "1.0.0", "max": "1.2.0"},
            "module_abi": 1,
            "os": "linux",
            "arch": "aarch64",
            "backends": ["cuda", "cpu"],
            "entry": "libprefix.so",
            "artifacts": [{"path": "libprefix.so", "size": 10, "sha256": BB}],
            "provided_ops": [],
            "provided_runners": ["example.runner"],
            "dependencies": [{"package_id": "example.base", "min_version": "1.0.0"}],
            "module_dependencies": [{
                "module_id": "example.scan",
                "min_version": "1.0.0",
                "max_version": "1.9.99",
                "abi_tag": "guild.module.v1",
                "publisher_id": "org.example",
                "sha256": CC
            }]
        },
        "signatures": []
    })
}

fn bytes(doc: &serde_json::Value) -> Vec<u8> {
    serde_json::to_vec_pretty(doc).unwrap()
}

fn errors(input: &[u8]) -> Vec<(String, FieldErrorKind)> {
    let e: ManifestErrors = Metadata::parse(input).unwrap_err();
    e.errors
        .into_iter()
        .map(|e| (e.path.to_string(), e.kind))
        .collect()
}

/// Applies `edit` to a valid document and asserts the exact list of problems reported.
fn check(
    base: fn() -> serde_json::Value,
    edit: impl FnOnce(&mut serde_json::Value),
    expected: &[(&str, FieldErrorKind)],
) {
    let mut doc = base();
    edit(&mut doc);
    let found = errors(&bytes(&doc));
    let expected: Vec<(String, FieldErrorKind)> = expected
        .iter()
        .map(|(p, k)| (p.to_string(), k.clone()))
        .collect();
    assert_eq!(found, expected, "document: {doc}");
}

/// Replaces the value at `pointer`, or adds it when its parent is an object without it.
fn set(doc: &mut serde_json::Value, pointer: &str, value: serde_json::Value) {
    if let Some(slot) = doc.pointer_mut(pointer) {
        *slot = value;
        return;
    }
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let parent = doc.pointer_mut(parent).and_then(|p| p.as_object_mut());
    parent
        .unwrap_or_else(|| panic!("no parent object for {pointer}"))
        .insert(key.into(), value);
}

fn remove(doc: &mut serde_json::Value, pointer: &str, key: &str) {
    doc.pointer_mut(pointer)
        .unwrap()
        .as_object_mut()
        .unwrap()
        .remove(key)
        .unwrap();
}

fn wrong(expected: &'static str, found: &'static str) -> FieldErrorKind {
    FieldErrorKind::WrongType { expected, found }
}

fn json_error(input: &[u8]) -> (String, JsonErrorKind) {
    match errors(input).as_slice() {
        [(path, FieldErrorKind::Json { kind, .. })] => (path.clone(), kind.clone()),
        other => panic!("expected one JSON error, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Valid documents and the golden canonical bytes.

const KERNEL_CANONICAL: &str = concat!(
    r#"{"arch":"x86_64","#,
    r#""artifacts":[{"path":"lib/libscan.so","sha256":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","size":4096}],"#,
    r#""backends":["cpu"],"#,
    r#""entry":"lib/libscan.so","#,
    r#""kernel_abi":{"max":"1.0.0","min":"1.0.0"},"#,
    r#""kind":"gkernel","#,
    r#""os":"linux","#,
    r#""package_id":"example.scan","#,
    r#""provided_ops":["example.scan.inclusive.cpu"],"#,
    r#""publisher_id":"org.example","#,
    r#""version":"1.2.3"}"#
);

const MODULE_CANONICAL: &str = concat!(
    r#"{"arch":"aarch64","#,
    r#""artifacts":[{"path":"libprefix.so","sha256":"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb","size":10}],"#,
    r#""backends":["cuda","cpu"],"#,
    r#""dependencies":[{"min_version":"1.0.0","package_id":"example.base"}],"#,
    r#""entry":"libprefix.so","#,
    r#""kernel_abi":{"max":"1.2.0","min":"1.0.0"},"#,
    r#""kind":"gkmodule","#,
    r#""module_abi":1,"#,
    r#""module_dependencies":[{"abi_tag":"guild.module.v1","max_version":"1.9.99","min_version":"1.0.0","#,
    r#""module_id":"example.scan","publisher_id":"org.example","#,
    r#""sha256":"cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"}],"#,
    r#""os":"linux","#,
    r#""package_id":"example.prefix","#,
    r#""provided_ops":[],"#,
    r#""provided_runners":["example.runner"],"#,
    r#""publisher_id":"org.example","#,
    r#""version":"2.0.0"}"#
);

fn kernel_manifest() -> Manifest {
    Manifest {
        package_id: PackageId::new("example.scan").unwrap(),
        kind: PackageKind::Kernel,
        version: Version::new(1, 2, 3),
        publisher_id: PublisherId::new("org.example").unwrap(),
        kernel_abi: AbiRange::new(PackedVersion::KERNEL_ABI_V1, PackedVersion::KERNEL_ABI_V1)
            .unwrap(),
        module_abi: None,
        os: Os::Linux,
        arch: Arch::X86_64,
        backends: vec![Backend::Cpu],
        entry: ArtifactPath::new("lib/libscan.so").unwrap(),
        artifacts: vec![Artifact {
            path: ArtifactPath::new("lib/libscan.so").unwrap(),
            size: 4096,
            sha256: Sha256Digest::parse_hex(AA).unwrap(),
        }],
        provided_ops: vec![ImplId::new("example.scan.inclusive.cpu").unwrap()],
        provided_runners: vec![],
        dependencies: vec![],
        module_dependencies: vec![],
        check_params: Default::default(),
    }
}

#[test]
fn kernel_manifest_reads_into_typed_fields() {
    let meta = Metadata::parse(&bytes(&kernel_doc())).unwrap();
    assert_eq!(meta.manifest(), &kernel_manifest());
    assert_eq!(
        meta.signatures(),
        &[SignatureEntry {
            key_id: Sha256Digest::parse_hex(KEY).unwrap(),
            algorithm: SignatureAlgorithm::EcdsaP256Sha256,
            signature: vec![0x30, 0x45, 0x02, 0x21, 0x00, 0xff],
        }]
    );
    assert_eq!(meta.manifest().backend_mask(), 1);
    assert_eq!(meta.manifest().entry_artifact().unwrap().size, 4096);
}

#[test]
fn golden_canonical_bytes_of_a_kernel_without_opt_in_fields() {
    // The packer's bytes for a manifest built in code.
    assert_eq!(
        String::from_utf8(kernel_manifest().canonical_payload()).unwrap(),
        KERNEL_CANONICAL
    );
    // The bytes of the payload as received, whatever its layout.
    let meta = Metadata::parse(&bytes(&kernel_doc())).unwrap();
    assert_eq!(meta.canonical_payload(), KERNEL_CANONICAL.as_bytes());
    assert_eq!(
        meta.payload_digest(),
        Sha256Digest::of(KERNEL_CANONICAL.as_bytes())
    );
    assert_eq!(kernel_manifest().payload_digest(), meta.payload_digest());
    // Reading the canonical bytes back and writing them again changes nothing.
    let again = Manifest::parse_payload(KERNEL_CANONICAL.as_bytes()).unwrap();
    assert_eq!(again, kernel_manifest());
    assert_eq!(again.canonical_payload(), KERNEL_CANONICAL.as_bytes());
    assert_eq!(
        canonicalize(&json::parse(KERNEL_CANONICAL.as_bytes()).unwrap()),
        KERNEL_CANONICAL.as_bytes()
    );
}

#[test]
fn golden_canonical_bytes_of_a_module_with_every_opt_in_field() {
    let meta = Metadata::parse(&bytes(&module_doc())).unwrap();
    assert_eq!(
        String::from_utf8(meta.canonical_payload().to_vec()).unwrap(),
        MODULE_CANONICAL
    );
    let m = meta.manifest();
    assert_eq!(m.canonical_payload(), MODULE_CANONICAL.as_bytes());
    assert_eq!(m.module_abi, Some(1));
    assert_eq!(m.backend_mask(), 0b11);
    assert_eq!(
        m.provided_runners,
        vec![RunnerId::new("example.runner").unwrap()]
    );
    assert_eq!(
        m.dependencies,
        vec![Dependency {
            package_id: PackageId::new("example.base").unwrap(),
            range: VersionRange::new(Version::new(1, 0, 0), None).unwrap(),
        }]
    );
    assert_eq!(
        m.module_dependencies,
        vec![ModuleDependency {
            module_id: PackageId::new("example.scan").unwrap(),
            range: VersionRange::new(Version::new(1, 0, 0), Some(Version::new(1, 9, 99))).unwrap(),
            abi_tag: MODULE_ABI_TAG_V1.into(),
            publisher_id: Some(PublisherId::new("org.example").unwrap()),
            sha256: Some(Sha256Digest::parse_hex(CC).unwrap()),
        }]
    );
    assert_eq!(
        Manifest::parse_payload(MODULE_CANONICAL.as_bytes()).unwrap(),
        *m
    );
}

#[test]
fn adding_opt_in_fields_to_the_model_leaves_old_payload_bytes_alone() {
    // A payload signed before the opt-in fields existed keeps its bytes and digest: they are
    // computed from the payload as received, and the writer omits the empty opt-in fields.
    let meta = Metadata::parse(&bytes(&kernel_doc())).unwrap();
    let rewritten = Metadata::new(meta.manifest().clone(), meta.signatures().to_vec()).unwrap();
    assert_eq!(rewritten.canonical_payload(), meta.canonical_payload());
    assert_eq!(rewritten.payload_digest(), meta.payload_digest());
}

/// `check_params` is an opt-in, signed field: read into typed records, written back as it was
/// received (so the packer's bytes are the signed bytes), and left out when there is none.
#[test]
fn check_params_are_read_typed_and_written_back_as_signed() {
    let mut doc = kernel_doc();
    set(
        &mut doc,
        "/payload/check_params",
        json!({"example.vector.axpy": "u32:8, f32:2.0"}),
    );
    let meta = Metadata::parse(&bytes(&doc)).unwrap();
    let op = OpName::new("example.vector.axpy").unwrap();
    let spec = &meta.manifest().check_params[&op];
    assert_eq!(spec.as_str(), "u32:8, f32:2.0");
    let mut want = 8u32.to_ne_bytes().to_vec();
    want.extend(2.0f32.to_ne_bytes());
    assert_eq!(spec.record().0, want);
    let signed = String::from_utf8(meta.canonical_payload().to_vec()).unwrap();
    assert!(
        signed.contains(r#""check_params":{"example.vector.axpy":"u32:8, f32:2.0"}"#),
        "{signed}"
    );
    assert_eq!(
        meta.manifest().canonical_payload(),
        meta.canonical_payload(),
        "the packer writes the bytes that were signed"
    );
    let mut m = kernel_manifest();
    m.check_params
        .insert(op, ParamSpec::parse("u32:8, f32:2.0").unwrap());
    assert_eq!(meta.manifest(), &m);
    // Without it the bytes are those of a manifest from before the field existed.
    m.check_params.clear();
    assert_eq!(m.canonical_payload(), KERNEL_CANONICAL.as_bytes());
}

/// A record that is not in the notation, an operation name that breaks the grammar, and a value
/// that is not a string are each refused with the path of the field.
#[test]
fn bad_check_params_are_refused_naming_the_field() {
    let mut doc = kernel_doc();
    set(
        &mut doc,
        "/payload/check_params",
        json!({"example.vector.axpy": "float:2", "Bad Op": "u8:1", "example.other": 7}),
    );
    let e = Metadata::parse(&bytes(&doc)).unwrap_err();
    let shown: Vec<String> = e.errors.iter().map(ToString::to_string).collect();
    assert_eq!(e.errors.len(), 3, "{shown:?}");
    assert!(
        shown.iter().any(|s| s.contains("check_params")
            && s.contains("example.vector.axpy")
            && s.contains("not a parameter record")
            && s.contains("\"float\" is not a field type")),
        "{shown:?}"
    );
    assert!(
        e.errors
            .iter()
            .any(|f| matches!(f.kind, FieldErrorKind::InvalidId(_))
                && f.to_string().contains("Bad Op")),
        "{shown:?}"
    );
    assert!(
        e.errors
            .iter()
            .any(|f| matches!(f.kind, FieldErrorKind::WrongType { .. })
                && f.to_string().contains("example.other")),
        "{shown:?}"
    );
    set(&mut doc, "/payload/check_params", json!(["u8:1"]));
    let e = Metadata::parse(&bytes(&doc)).unwrap_err();
    assert!(
        matches!(
            e.errors[0].kind,
            FieldErrorKind::WrongType {
                expected: "object",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn explicit_empty_opt_in_lists_are_accepted_and_kept_in_the_signed_bytes() {
    let mut doc = kernel_doc();
    set(&mut doc, "/payload/provided_runners", json!([]));
    set(&mut doc, "/payload/module_dependencies", json!([]));
    let meta = Metadata::parse(&bytes(&doc)).unwrap();
    assert_eq!(meta.manifest(), &kernel_manifest());
    let signed = String::from_utf8(meta.canonical_payload().to_vec()).unwrap();
    assert!(signed.contains(r#""module_dependencies":[],"#), "{signed}");
    assert!(signed.contains(r#""provided_runners":[],"#), "{signed}");
    assert_ne!(
        meta.canonical_payload(),
        meta.manifest().canonical_payload().as_slice()
    );
}

#[test]
fn a_gkernel_may_keep_build_time_module_provenance() {
    let mut doc = kernel_doc();
    set(
        &mut doc,
        "/payload/module_dependencies",
        json!([{"module_id": "example.tools", "min_version": "0.1.0", "abi_tag": "guild.build.v1"}]),
    );
    let meta = Metadata::parse(&bytes(&doc)).unwrap();
    let dep = &meta.manifest().module_dependencies[0];
    assert_eq!(dep.abi_tag, "guild.build.v1");
    assert!(!dep.is_runtime_edge());
}

#[test]
fn empty_signature_list_parses() {
    let mut doc = kernel_doc();
    set(&mut doc, "/signatures", json!([]));
    assert!(Metadata::parse(&bytes(&doc))
        .unwrap()
        .signatures()
        .is_empty());
}

#[test]
fn written_metadata_reads_back_identically() {
    let sig = SignatureEntry {
        key_id: Sha256Digest::parse_hex(KEY).unwrap(),
        algorithm: SignatureAlgorithm::EcdsaP256Sha256,
        signature: vec![0x30, 0x06, 0xab],
    };
    let unsigned = Metadata::new(kernel_manifest(), vec![]).unwrap();
    let signed = unsigned.clone().with_signatures(vec![sig.clone()]).unwrap();
    assert_eq!(signed.canonical_payload(), unsigned.canonical_payload());
    let text = signed.to_pretty_json();
    assert!(text.starts_with(
        "{\n  \"gkmetadata\": 1,\n  \"payload\": {\n    \"package_id\": \"example.scan\",\n"
    ));
    assert!(text.contains("\"signature\": \"3006ab\""));
    let back = Metadata::parse(text.as_bytes()).unwrap();
    assert_eq!(back, signed);
    // A parsed document is written with its payload as received, so re-signing is never needed.
    let mut doc = kernel_doc();
    set(&mut doc, "/payload/provided_runners", json!([]));
    let parsed = Metadata::parse(&bytes(&doc)).unwrap();
    let reread = Metadata::parse(parsed.to_pretty_json().as_bytes()).unwrap();
    assert_eq!(reread.canonical_payload(), parsed.canonical_payload());
}

#[test]
fn metadata_new_checks_the_manifest_and_signatures() {
    let mut m = kernel_manifest();
    m.entry = ArtifactPath::new("lib/other.so").unwrap();
    m.module_abi = Some(1);
    m.backends = vec![Backend::Cpu, Backend::Cpu];
    m.artifacts.push(m.artifacts[0].clone());
    m.provided_ops.push(m.provided_ops[0].clone());
    m.provided_runners = vec![RunnerId::new("r").unwrap(), RunnerId::new("r").unwrap()];
    let sig = SignatureEntry {
        key_id: Sha256Digest::parse_hex(KEY).unwrap(),
        algorithm: SignatureAlgorithm::EcdsaP256Sha256,
        signature: vec![1],
    };
    let empty = SignatureEntry {
        signature: vec![],
        ..sig.clone()
    };
    let e = Metadata::new(m, vec![sig, empty]).unwrap_err();
    let found: Vec<(String, FieldErrorKind)> = e
        .errors
        .into_iter()
        .map(|e| (e.path.to_string(), e.kind))
        .collect();
    let dup0 = FieldErrorKind::Duplicate { first_index: 0 };
    assert_eq!(
        found,
        vec![
            (
                "$.payload.module_abi".into(),
                FieldErrorKind::ModuleAbiForbidden
            ),
            ("$.payload.backends[1]".into(), dup0.clone()),
            ("$.payload.artifacts[1].path".into(), dup0.clone()),
            (
                "$.payload.entry".into(),
                FieldErrorKind::EntryNotAnArtifact {
                    entry: "lib/other.so".into()
                }
            ),
            ("$.payload.provided_ops[1]".into(), dup0.clone()),
            ("$.payload.provided_runners[1]".into(), dup0.clone()),
            ("$.signatures[1].key_id".into(), dup0),
            (
                "$.signatures[1].signature".into(),
                FieldErrorKind::InvalidHex
            ),
        ]
    );
    let mut module = Metadata::parse(&bytes(&module_doc()))
        .unwrap()
        .into_manifest();
    module.module_abi = None;
    module.module_dependencies[0].abi_tag = "guild.build.v1".into();
    let found: Vec<(String, FieldErrorKind)> = module
        .check()
        .unwrap_err()
        .errors
        .into_iter()
        .map(|e| (e.path.to_string(), e.kind))
        .collect();
    assert_eq!(
        found,
        vec![
            (
                "$.payload.module_abi".into(),
                FieldErrorKind::ModuleAbiRequired
            ),
            (
                "$.payload.module_dependencies[0].abi_tag".into(),
                FieldErrorKind::NonRuntimeModuleDependency {
                    found: "guild.build.v1".into()
                }
            ),
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// JSON-level refusals.

#[test]
fn too_large_input_is_refused_before_parsing() {
    let mut input = bytes(&kernel_doc());
    input.resize(MAX_METADATA_BYTES + 1, b' ');
    assert_eq!(
        errors(&input),
        vec![(
            "$".into(),
            FieldErrorKind::TooLarge {
                size: MAX_METADATA_BYTES + 1,
                limit: MAX_METADATA_BYTES
            }
        )]
    );
    // Exactly at the limit is fine (trailing whitespace is insignificant).
    input.truncate(MAX_METADATA_BYTES);
    assert!(Metadata::parse(&input).is_ok());
}

#[test]
fn duplicate_keys_are_refused_at_every_depth() {
    let text = String::from_utf8(serde_json::to_vec(&kernel_doc()).unwrap()).unwrap();
    let dup = |from: &str, to: &str| {
        assert!(text.contains(from), "{from}");
        json_error(text.replacen(from, to, 1).as_bytes())
    };
    let key = |k: &str| JsonErrorKind::DuplicateKey { key: k.into() };
    assert_eq!(
        dup(r#""gkmetadata":1"#, r#""gkmetadata":1,"gkmetadata":1"#),
        ("$.gkmetadata".into(), key("gkmetadata"))
    );
    assert_eq!(
        dup(r#""os":"linux""#, r#""os":"linux","os":"linux""#),
        ("$.payload.os".into(), key("os"))
    );
    assert_eq!(
        dup(r#""min":"1.0.0""#, r#""min":"1.0.0","min":"0.9.0""#),
        ("$.payload.kernel_abi.min".into(), key("min"))
    );
    assert_eq!(
        dup(r#""size":4096"#, r#""size":4096,"size":1"#),
        ("$.payload.artifacts[0].size".into(), key("size"))
    );
    assert_eq!(
        dup(
            r#""algorithm":"ecdsa-p256-sha256""#,
            r#""algorithm":"ecdsa-p256-sha256","algorithm":"x""#
        ),
        ("$.signatures[0].algorithm".into(), key("algorithm"))
    );
}

#[test]
fn null_is_refused_wherever_it_appears() {
    for (pointer, path) in [
        ("/payload/version", "$.payload.version"),
        ("/payload/artifacts/0/size", "$.payload.artifacts[0].size"),
        ("/signatures", "$.signatures"),
    ] {
        let mut doc = kernel_doc();
        set(&mut doc, pointer, serde_json::Value::Null);
        assert_eq!(json_error(&bytes(&doc)), (path.into(), JsonErrorKind::Null));
    }
    // An optional field written as null is still refused, not taken as absent.
    let mut doc = kernel_doc();
    set(
        &mut doc,
        "/payload/provided_runners",
        serde_json::Value::Null,
    );
    assert_eq!(
        json_error(&bytes(&doc)),
        ("$.payload.provided_runners".into(), JsonErrorKind::Null)
    );
}

#[test]
fn non_integer_numbers_are_refused() {
    let text = String::from_utf8(serde_json::to_vec(&kernel_doc()).unwrap()).unwrap();
    let with = |to: &str| json_error(text.replacen(r#""size":4096"#, to, 1).as_bytes());
    let at = "$.payload.artifacts[0].size".to_string();
    assert_eq!(
        with(r#""size":4096.0"#),
        (at.clone(), JsonErrorKind::Fraction)
    );
    assert_eq!(with(r#""size":4e3"#), (at.clone(), JsonErrorKind::Exponent));
    assert_eq!(
        with(r#""size":-0"#),
        (at.clone(), JsonErrorKind::NegativeZero)
    );
    assert_eq!(
        with(r#""size":18446744073709551616"#),
        (at, JsonErrorKind::IntegerOutOfRange)
    );
}

#[test]
fn malformed_json_reports_path_and_offset() {
    let e = Metadata::parse(b"{\"gkmetadata\": 1, \"payload\": {\"kind\": \"gk").unwrap_err();
    assert_eq!(e.errors.len(), 1);
    assert_eq!(e.errors[0].path.to_string(), "$.payload.kind");
    assert_eq!(
        e.errors[0].kind,
        FieldErrorKind::Json {
            kind: JsonErrorKind::UnexpectedEnd,
            offset: 41
        }
    );
    assert_eq!(
        json_error(b"\xef\xbb\xbf{}"),
        ("$".into(), JsonErrorKind::ByteOrderMark)
    );
    assert_eq!(
        json_error(b"{} {}"),
        ("$".into(), JsonErrorKind::TrailingData)
    );
}

// ---------------------------------------------------------------------------------------------
// One test per field error kind, each asserting the exact kind and path.

#[test]
fn missing_required_fields() {
    check(
        kernel_doc,
        |d| remove(d, "/payload", "os"),
        &[("$.payload.os", FieldErrorKind::Missing)],
    );
    check(
        kernel_doc,
        |d| remove(d, "", "signatures"),
        &[("$.signatures", FieldErrorKind::Missing)],
    );
    check(
        kernel_doc,
        |d| remove(d, "/payload/artifacts/0", "sha256"),
        &[("$.payload.artifacts[0].sha256", FieldErrorKind::Missing)],
    );
    check(
        module_doc,
        |d| remove(d, "/payload/module_dependencies/0", "abi_tag"),
        &[(
            "$.payload.module_dependencies[0].abi_tag",
            FieldErrorKind::Missing,
        )],
    );
    check(
        kernel_doc,
        |d| remove(d, "/payload/kernel_abi", "max"),
        &[("$.payload.kernel_abi.max", FieldErrorKind::Missing)],
    );
}

#[test]
fn unknown_fields_are_refused_at_every_level() {
    let unknown = FieldErrorKind::UnknownField;
    check(
        kernel_doc,
        |d| set(d, "/comment", json!("x")),
        &[("$.comment", unknown.clone())],
    );
    check(
        kernel_doc,
        |d| set(d, "/payload/license", json!("MIT")),
        &[("$.payload.license", unknown.clone())],
    );
    check(
        kernel_doc,
        |d| set(d, "/payload/artifacts/0/mode", json!(493)),
        &[("$.payload.artifacts[0].mode", unknown.clone())],
    );
    check(
        kernel_doc,
        |d| set(d, "/payload/kernel_abi/patch", json!("1.0.1")),
        &[("$.payload.kernel_abi.patch", unknown.clone())],
    );
    check(
        module_doc,
        |d| set(d, "/payload/dependencies/0/optional", json!(true)),
        &[("$.payload.dependencies[0].optional", unknown.clone())],
    );
    check(
        module_doc,
        |d| set(d, "/payload/module_dependencies/0/weak", json!(true)),
        &[("$.payload.module_dependencies[0].weak", unknown.clone())],
    );
    check(
        kernel_doc,
        |d| set(d, "/signatures/0/comment", json!("hi")),
        &[("$.signatures[0].comment", unknown.clone())],
    );
    check(
        kernel_doc,
        |d| set(d, "/payload/a b", json!(1)),
        &[(r#"$.payload["a b"]"#, unknown)],
    );
}

#[test]
fn wrong_types() {
    check(
        kernel_doc,
        |d| set(d, "/payload/version", json!(1)),
        &[("$.payload.version", wrong("string", "integer"))],
    );
    check(
        kernel_doc,
        |d| set(d, "/payload/backends", json!("cpu")),
        &[("$.payload.backends", wrong("array", "string"))],
    );
    check(
        kernel_doc,
        |d| set(d, "/payload", json!([])),
        &[("$.payload", wrong("object", "array"))],
    );
    check(
        kernel_doc,
        |d| set(d, "/payload/artifacts/0/size", json!("4096")),
        &[("$.payload.artifacts[0].size", wrong("integer", "string"))],
    );
    check(
        kernel_doc,
        |d| set(d, "/gkmetadata", json!(true)),
        &[("$.gkmetadata", wrong("integer", "boolean"))],
    );
    check(
        kernel_doc,
        |d| set(d, "/signatures/0", json!("sig")),
        &[("$.signatures[0]", wrong("object", "string"))],
    );
    assert_eq!(
        errors(b"[]"),
        vec![("$".to_string(), wrong("object", "array"))]
    );
}

#[test]
fn unsupported_format_version() {
    check(
        kernel_doc,
        |d| set(d, "/gkmetadata", json!(2)),
        &[(
            "$.gkmetadata",
            FieldErrorKind::UnsupportedFormatVersion {
                found: Integer::from(2u64),
            },
        )],
    );
}

#[test]
fn invalid_ids() {
    check(
        kernel_doc,
        |d| set(d, "/payload/package_id", json!("Example")),
        &[(
            "$.payload.package_id",
            FieldErrorKind::InvalidId(IdError::BadStart {
                what: "package id",
                value: "Example".into(),
            }),
        )],
    );
    check(
        kernel_doc,
        |d| set(d, "/payload/provided_ops/0", json!("a..b")),
        &[(
            "$.payload.provided_ops[0]",
            FieldErrorKind::InvalidId(IdError::EmptySegment {
                what: "implementation id",
                value: "a..b".into(),
            }),
        )],
    );
    check(
        module_doc,
        |d| set(d, "/payload/module_dependencies/0/publisher_id", json!("")),
        &[(
            "$.payload.module_dependencies[0].publisher_id",
            FieldErrorKind::InvalidId(IdError::Empty {
                what: "publisher id",
            }),
        )],
    );
}

#[test]
fn unknown_enumeration_values() {
    let unknown = |found: &str, expected: &'static [&'static str]| FieldErrorKind::UnknownValue {
        found: found.into(),
        expected,
    };
    check(
        kernel_doc,
        |d| set(d, "/payload/kind", json!("gkplugin")),
        &[(
            "$.payload.kind",
            unknown("gkplugin", &["gkernel", "gkmodule"]),
        )],
    );
    check(
        kernel_doc,
        |d| set(d, "/payload/os", json!("Linux")),
        &[("$.payload.os", unknown("Linux", Os::SPELLINGS))],
    );
    check(
        kernel_doc,
        |d| set(d, "/payload/arch", json!("x86")),
        &[("$.payload.arch", unknown("x86", Arch::SPELLINGS))],
    );
    check(
        kernel_doc,
        |d| set(d, "/payload/backends", json!(["cpu", "metal"])),
        &[(
            "$.payload.backends[1]",
            unknown("metal", Backend::SPELLINGS),
        )],
    );
    check(
        kernel_doc,
        |d| set(d, "/signatures/0/algorithm", json!("ed25519")),
        &[(
            "$.signatures[0].algorithm",
            unknown("ed25519", &["ecdsa-p256-sha256"]),
        )],
    );
}

#[test]
fn invalid_semantic_versions() {
    let reason = semver::Version::parse("1.2").unwrap_err().to_string();
    check(
        kernel_doc,
        |d| set(d, "/payload/version", json!("1.2")),
        &[(
            "$.payload.version",
            FieldErrorKind::InvalidVersion {
                text: "1.2".into(),
                reason,
            },
        )],
    );
    let reason = semver::Version::parse("v1.0.0").unwrap_err().to_string();
    check(
        module_doc,
        |d| set(d, "/payload/dependencies/0/min_version", json!("v1.0.0")),
        &[(
            "$.payload.dependencies[0].min_version",
            FieldErrorKind::InvalidVersion {
                text: "v1.0.0".into(),
                reason,
            },
        )],
    );
}

#[test]
fn invalid_kernel_abi_versions() {
    check(
        kernel_doc,
        |d| set(d, "/payload/kernel_abi/min", json!("1.0")),
        &[(
            "$.payload.kernel_abi.min",
            FieldErrorKind::InvalidAbiVersion(VersionError::Malformed { text: "1.0".into() }),
        )],
    );
    check(
        kernel_doc,
        |d| set(d, "/payload/kernel_abi/max", json!("256.0.0")),
        &[(
            "$.payload.kernel_abi.max",
            FieldErrorKind::InvalidAbiVersion(VersionError::ComponentTooLarge {
                part: "major",
                value: 256,
                bits: 8,
                max: 255,
            }),
        )],
    );
}

#[test]
fn empty_ranges() {
    check(
        kernel_doc,
        |d| {
            set(
                d,
                "/payload/kernel_abi",
                json!({"min": "1.2.0", "max": "1.0.0"}),
            )
        },
        &[(
            "$.payload.kernel_abi",
            FieldErrorKind::EmptyRange {
                min: "1.2.0".into(),
                max: "1.0.0".into(),
            },
        )],
    );
    check(
        module_doc,
        |d| set(d, "/payload/dependencies/0/max_version", json!("0.9.0")),
        &[(
            "$.payload.dependencies[0].max_version",
            FieldErrorKind::EmptyRange {
                min: "1.0.0".into(),
                max: "0.9.0".into(),
            },
        )],
    );
    check(
        module_doc,
        |d| {
            set(
                d,
                "/payload/module_dependencies/0/min_version",
                json!("2.0.0"),
            )
        },
        &[(
            "$.payload.module_dependencies[0].max_version",
            FieldErrorKind::EmptyRange {
                min: "2.0.0".into(),
                max: "1.9.99".into(),
            },
        )],
    );
}

#[test]
fn integers_out_of_range() {
    check(
        kernel_doc,
        |d| set(d, "/payload/artifacts/0/size", json!(-1)),
        &[(
            "$.payload.artifacts[0].size",
            FieldErrorKind::IntegerOutOfRange {
                found: Integer::from(-1i64),
                min: 0,
                max: u64::MAX,
            },
        )],
    );
    check(
        module_doc,
        |d| set(d, "/payload/module_abi", json!(4_294_967_296u64)),
        &[(
            "$.payload.module_abi",
            FieldErrorKind::IntegerOutOfRange {
                found: Integer::from(4_294_967_296u64),
                min: 0,
                max: u32::MAX.into(),
            },
        )],
    );
}

#[test]
fn invalid_artifact_paths() {
    check(
        kernel_doc,
        |d| {
            set(d, "/payload/artifacts/0/path", json!("../libscan.so"));
            set(d, "/payload/entry", json!("/lib/libscan.so"));
        },
        &[
            (
                "$.payload.entry",
                FieldErrorKind::InvalidPath(PathRule::Absolute),
            ),
            (
                "$.payload.artifacts[0].path",
                FieldErrorKind::InvalidPath(PathRule::DotDotComponent),
            ),
        ],
    );
    check(
        kernel_doc,
        |d| set(d, "/payload/artifacts/0/path", json!(".gkmetadata")),
        &[(
            "$.payload.artifacts[0].path",
            FieldErrorKind::InvalidPath(PathRule::Reserved),
        )],
    );
    // The name is reserved at any depth and in any letter case, as a file or a directory.
    for nested in ["lib/.gkmetadata", "lib/.GKMetadata", ".gkmetadata/lib.so"] {
        check(
            kernel_doc,
            |d| {
                set(d, "/payload/artifacts/0/path", json!(nested));
                set(d, "/payload/entry", json!(nested));
            },
            &[
                (
                    "$.payload.entry",
                    FieldErrorKind::InvalidPath(PathRule::Reserved),
                ),
                (
                    "$.payload.artifacts[0].path",
                    FieldErrorKind::InvalidPath(PathRule::Reserved),
                ),
            ],
        );
    }
}

#[test]
fn a_manifest_with_a_million_problems_reports_the_first_fifty_and_a_count() {
    // About 1 MiB of empty artifact objects: three missing fields each.
    let objects = (MAX_METADATA_BYTES - 1000) / 3;
    let mut doc = bytes(&kernel_doc());
    let text = String::from_utf8(doc.clone()).unwrap();
    let artifacts = format!("[{}]", vec!["{}"; objects].join(","));
    let start = text.find("\"artifacts\"").unwrap();
    let end = start + text[start..].find(']').unwrap() + 1;
    doc = format!(
        "{}\"artifacts\": {artifacts}{}",
        &text[..start],
        &text[end..]
    )
    .into_bytes();
    let doc: Vec<u8> = doc
        .into_iter()
        .filter(|b| !b.is_ascii_whitespace())
        .collect();
    assert!(doc.len() <= MAX_METADATA_BYTES, "{} bytes", doc.len());

    let e = Metadata::parse(&doc).unwrap_err();
    let total = 3 * objects;
    assert_eq!(e.errors.len(), MAX_REPORTED_PROBLEMS);
    assert_eq!(e.errors.len() + e.omitted, total);
    assert_eq!(e.errors[0].path.to_string(), "$.payload.artifacts[0].path");
    assert_eq!(e.errors[0].kind, FieldErrorKind::Missing);
    let shown = e.to_string();
    assert!(
        shown.starts_with(&format!("invalid manifest ({total} problems):\n")),
        "{}",
        &shown[..200]
    );
    assert!(
        shown.ends_with(&format!("\n  and {} more", total - MAX_REPORTED_PROBLEMS)),
        "{}",
        &shown[shown.len() - 200..]
    );
    assert_eq!(shown.lines().count(), 1 + MAX_REPORTED_PROBLEMS + 1);
}

#[test]
fn invalid_digests_and_hex() {
    let upper = AA.to_uppercase();
    check(
        kernel_doc,
        |d| set(d, "/payload/artifacts/0/sha256", json!(upper)),
        &[(
            "$.payload.artifacts[0].sha256",
            FieldErrorKind::InvalidDigest(DigestParseError {
                value: upper.clone(),
            }),
        )],
    );
    check(
        kernel_doc,
        |d| set(d, "/signatures/0/key_id", json!("abc")),
        &[(
            "$.signatures[0].key_id",
            FieldErrorKind::InvalidDigest(DigestParseError {
                value: "abc".into(),
            }),
        )],
    );
    for bad in ["", "abc", "ZZ", "0G", "AB"] {
        check(
            kernel_doc,
            |d| set(d, "/signatures/0/signature", json!(bad)),
            &[("$.signatures[0].signature", FieldErrorKind::InvalidHex)],
        );
    }
}

#[test]
fn empty_required_arrays_and_strings() {
    check(
        kernel_doc,
        |d| set(d, "/payload/backends", json!([])),
        &[("$.payload.backends", FieldErrorKind::EmptyArray)],
    );
    check(
        kernel_doc,
        |d| set(d, "/payload/artifacts", json!([])),
        &[
            ("$.payload.artifacts", FieldErrorKind::EmptyArray),
            (
                "$.payload.entry",
                FieldErrorKind::EntryNotAnArtifact {
                    entry: "lib/libscan.so".into(),
                },
            ),
        ],
    );
    check(
        module_doc,
        |d| set(d, "/payload/module_dependencies/0/abi_tag", json!("")),
        &[(
            "$.payload.module_dependencies[0].abi_tag",
            FieldErrorKind::EmptyString,
        )],
    );
}

#[test]
fn duplicates_in_lists() {
    let dup = |first_index| FieldErrorKind::Duplicate { first_index };
    check(
        kernel_doc,
        |d| {
            set(
                d,
                "/payload/backends",
                json!(["cpu", "cuda", "cpu", "cuda"]),
            )
        },
        &[
            ("$.payload.backends[2]", dup(0)),
            ("$.payload.backends[3]", dup(1)),
        ],
    );
    check(
        kernel_doc,
        |d| set(d, "/payload/provided_ops", json!(["a.x", "a.y", "a.x"])),
        &[("$.payload.provided_ops[2]", dup(0))],
    );
    check(
        module_doc,
        |d| set(d, "/payload/provided_runners", json!(["r", "r"])),
        &[("$.payload.provided_runners[1]", dup(0))],
    );
    check(
        kernel_doc,
        |d| {
            let a = d.pointer("/payload/artifacts/0").unwrap().clone();
            set(d, "/payload/artifacts", json!([a.clone(), a]));
        },
        &[("$.payload.artifacts[1].path", dup(0))],
    );
    check(
        kernel_doc,
        |d| {
            let s = d.pointer("/signatures/0").unwrap().clone();
            set(d, "/signatures", json!([s.clone(), s]));
        },
        &[("$.signatures[1].key_id", dup(0))],
    );
}

#[test]
fn artifact_paths_that_differ_only_in_case_collide() {
    check(
        kernel_doc,
        |d| {
            set(
                d,
                "/payload/artifacts",
                json!([
                    {"path": "lib/libscan.so", "size": 1, "sha256": AA},
                    {"path": "lib/data.bin", "size": 2, "sha256": BB},
                    {"path": "LIB/LibScan.so", "size": 3, "sha256": CC}
                ]),
            )
        },
        &[(
            "$.payload.artifacts[2].path",
            FieldErrorKind::PathCollision {
                first_index: 0,
                other: "lib/libscan.so".into(),
            },
        )],
    );
}

#[test]
fn entry_must_be_an_artifact() {
    check(
        kernel_doc,
        |d| set(d, "/payload/entry", json!("lib/LIBSCAN.so")),
        &[(
            "$.payload.entry",
            FieldErrorKind::EntryNotAnArtifact {
                entry: "lib/LIBSCAN.so".into(),
            },
        )],
    );
}

#[test]
fn module_abi_follows_the_kind() {
    check(
        module_doc,
        |d| remove(d, "/payload", "module_abi"),
        &[("$.payload.module_abi", FieldErrorKind::ModuleAbiRequired)],
    );
    check(
        kernel_doc,
        |d| set(d, "/payload/module_abi", json!(1)),
        &[("$.payload.module_abi", FieldErrorKind::ModuleAbiForbidden)],
    );
    // Present but malformed in a gkernel: both problems are real and both are reported.
    check(
        kernel_doc,
        |d| set(d, "/payload/module_abi", json!("1")),
        &[
            ("$.payload.module_abi", wrong("integer", "string")),
            ("$.payload.module_abi", FieldErrorKind::ModuleAbiForbidden),
        ],
    );
}

#[test]
fn gkmodule_dependencies_must_be_runtime_edges() {
    check(
        module_doc,
        |d| {
            set(
                d,
                "/payload/module_dependencies/0/abi_tag",
                json!("guild.build.v1"),
            )
        },
        &[(
            "$.payload.module_dependencies[0].abi_tag",
            FieldErrorKind::NonRuntimeModuleDependency {
                found: "guild.build.v1".into(),
            },
        )],
    );
}

#[test]
fn every_problem_is_reported_in_one_pass() {
    check(
        module_doc,
        |d| {
            set(d, "/gkmetadata", json!(3));
            set(d, "/payload/extra", json!(1));
            set(d, "/payload/version", json!("two"));
            remove(d, "/payload", "module_abi");
            set(d, "/payload/backends", json!(["cpu", "cpu"]));
            set(d, "/payload/artifacts/0/size", json!(-5));
            set(d, "/payload/module_dependencies/0/abi_tag", json!("other"));
            set(
                d,
                "/signatures",
                json!([{"key_id": KEY, "algorithm": "rsa", "signature": "0"}]),
            );
        },
        &[
            (
                "$.gkmetadata",
                FieldErrorKind::UnsupportedFormatVersion {
                    found: Integer::from(3u64),
                },
            ),
            ("$.payload.extra", FieldErrorKind::UnknownField),
            (
                "$.payload.version",
                FieldErrorKind::InvalidVersion {
                    text: "two".into(),
                    reason: semver::Version::parse("two").unwrap_err().to_string(),
                },
            ),
            ("$.payload.module_abi", FieldErrorKind::ModuleAbiRequired),
            (
                "$.payload.backends[1]",
                FieldErrorKind::Duplicate { first_index: 0 },
            ),
            (
                "$.payload.artifacts[0].size",
                FieldErrorKind::IntegerOutOfRange {
                    found: Integer::from(-5i64),
                    min: 0,
                    max: u64::MAX,
                },
            ),
            (
                "$.payload.module_dependencies[0].abi_tag",
                FieldErrorKind::NonRuntimeModuleDependency {
                    found: "other".into(),
                },
            ),
            (
                "$.signatures[0].algorithm",
                FieldErrorKind::UnknownValue {
                    found: "rsa".into(),
                    expected: SignatureAlgorithm::SPELLINGS,
                },
            ),
            ("$.signatures[0].signature", FieldErrorKind::InvalidHex),
        ],
    );
}

#[test]
fn errors_display_with_their_paths() {
    let mut doc = kernel_doc();
    set(&mut doc, "/payload/os", json!("beos"));
    remove(&mut doc, "/payload", "arch");
    let e = Metadata::parse(&bytes(&doc)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid manifest (2 problems):\n  $.payload.os: \"beos\" is not one of [\"linux\", \"windows\", \"macos\"]\n  $.payload.arch: required field is missing"
    );
}

#[test]
fn payload_errors_are_rooted_at_the_payload_when_read_alone() {
    let e = Manifest::parse_payload(br#"{"kind": "gkernel"}"#).unwrap_err();
    let paths: Vec<String> = e.errors.iter().map(|e| e.path.to_string()).collect();
    assert_eq!(
        paths,
        [
            "$.package_id",
            "$.version",
            "$.publisher_id",
            "$.kernel_abi",
            "$.os",
            "$.arch",
            "$.backends",
            "$.entry",
            "$.artifacts",
            "$.provided_ops"
        ]
    );
    assert!(e.errors.iter().all(|e| e.kind == FieldErrorKind::Missing));
}

// ---------------------------------------------------------------------------------------------
// Properties.

fn text() -> impl Strategy<Value = String> {
    let interesting = prop::sample::select(vec![
        '"', '\\', '/', '\n', '\t', '\u{0}', '\u{1f}', '\u{7f}', 'é', '\u{2028}', '😀',
    ]);
    prop::collection::vec(
        prop_oneof![4 => proptest::char::range('a', 'e'), 1 => any::<char>(), 1 => interesting],
        0..6,
    )
    .prop_map(String::from_iter)
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|i| Value::Integer(i.into())),
        any::<u64>().prop_map(|i| Value::Integer(i.into())),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(text(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A deterministic source of layout choices for the noisy writer.
struct Noise(u64);

impl Noise {
    fn next(&mut self) -> u64 {
        // xorshift64*; the seed is forced odd so that it never sticks at zero.
        self.0 |= 1;
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn ws(&mut self, out: &mut String) {
        out.push_str(["", "", " ", "\n", "\t ", "\r\n  "][(self.next() % 6) as usize]);
    }
}

/// Writes `v` as valid JSON that means the same thing, with shuffled keys, random whitespace and
/// random (but equivalent) escapes.
fn write_noisy(v: &Value, out: &mut String, n: &mut Noise) {
    match v {
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Integer(i) => out.push_str(&i.to_string()),
        Value::String(s) => write_noisy_string(s, out, n),
        Value::Array(items) => {
            out.push('[');
            n.ws(out);
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                    n.ws(out);
                }
                write_noisy(item, out, n);
                n.ws(out);
            }
            out.push(']');
        }
        Value::Object(members) => {
            let mut order: Vec<&(String, Value)> = members.iter().collect();
            for i in (1..order.len()).rev() {
                order.swap(i, (n.next() % (i as u64 + 1)) as usize);
            }
            out.push('{');
            n.ws(out);
            for (i, (k, v)) in order.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                    n.ws(out);
                }
                write_noisy_string(k, out, n);
                n.ws(out);
                out.push(':');
                n.ws(out);
                write_noisy(v, out, n);
                n.ws(out);
            }
            out.push('}');
        }
    }
}

fn write_noisy_string(s: &str, out: &mut String, n: &mut Noise) {
    let unicode = |out: &mut String, unit: u16, upper: bool| {
        if upper {
            out.push_str(&format!("\\u{unit:04X}"));
        } else {
            out.push_str(&format!("\\u{unit:04x}"));
        }
    };
    out.push('"');
    for c in s.chars() {
        let choice = n.next() % 3;
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '/' if choice == 0 => out.push_str("\\/"),
            '\n' if choice == 0 => out.push_str("\\n"),
            c if (c as u32) < 0x20 || choice == 1 => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    unicode(out, *unit, n.next().is_multiple_of(2));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `v` with every object's members sorted, as parsing canonical bytes returns it.
fn sorted(v: &Value) -> Value {
    match v {
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        Value::Object(members) => {
            let mut m: Vec<(String, Value)> = members
                .iter()
                .map(|(k, v)| (k.clone(), sorted(v)))
                .collect();
            m.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(m)
        }
        other => other.clone(),
    }
}

fn id_text() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9_-]{0,5}(\\.[a-z0-9_-]{1,5}){0,2}"
}

fn semver_version() -> impl Strategy<Value = Version> {
    (
        0u64..30,
        0u64..30,
        0u64..30,
        prop::option::of(0u64..5),
        prop::option::of("[a-z0-9]{1,4}"),
    )
        .prop_map(|(major, minor, patch, pre, build)| {
            let mut v = Version::new(major, minor, patch);
            if let Some(n) = pre {
                v.pre = semver::Prerelease::new(&format!("rc.{n}")).unwrap();
            }
            if let Some(b) = build {
                v.build = semver::BuildMetadata::new(&b).unwrap();
            }
            v
        })
}

fn version_range() -> impl Strategy<Value = VersionRange> {
    (semver_version(), prop::option::of(0u64..3)).prop_map(|(mut min, bump)| {
        // `VersionRange::new` orders with build metadata, so a bound with it could look empty.
        min.build = semver::BuildMetadata::EMPTY;
        let max = bump.map(|d| Version::new(min.major + d, min.minor, min.patch));
        VersionRange::new(min, max).unwrap()
    })
}

fn digest() -> impl Strategy<Value = Sha256Digest> {
    any::<[u8; 32]>().prop_map(Sha256Digest)
}

fn manifest() -> impl Strategy<Value = Manifest> {
    let identity = (
        id_text(),
        any::<bool>(),
        semver_version(),
        id_text(),
        (0u32..4, 0u32..4096, 0u32..4096, 0u32..0x3000),
        1u32..4,
        prop::sample::select(vec![Os::Linux, Os::Windows, Os::Macos]),
        prop::sample::select(vec![Arch::X86_64, Arch::Aarch64]),
        prop::sample::subsequence(vec![Backend::Cpu, Backend::Cuda, Backend::Hip], 1..=3)
            .prop_shuffle(),
    );
    let files = (
        prop::collection::btree_set(
            "[a-z0-9_][a-z0-9._+-]{0,7}(/[a-z0-9_][a-z0-9._+-]{0,7}){0,2}",
            1..6,
        ),
        any::<prop::sample::Index>(),
        prop::collection::vec((any::<u64>(), digest()), 6),
    );
    let provides = (
        prop::collection::btree_set(id_text(), 0..4).prop_shuffle_set(),
        prop::collection::btree_set(id_text(), 0..3).prop_shuffle_set(),
        prop::collection::vec((id_text(), version_range()), 0..3),
        prop::collection::vec(
            (
                id_text(),
                version_range(),
                prop::option::of("[a-z.]{1,12}"),
                prop::option::of(id_text()),
                prop::option::of(digest()),
            ),
            0..3,
        ),
    );
    (identity, files, provides).prop_map(|(identity, files, provides)| {
        let (package_id, is_module, version, publisher_id, abi, module_abi, os, arch, backends) =
            identity;
        let (paths, entry_index, contents) = files;
        let (ops, runners, deps, module_deps) = provides;
        let kind = if is_module {
            PackageKind::Module
        } else {
            PackageKind::Kernel
        };
        let min = PackedVersion::new(abi.0, abi.1, abi.2).unwrap();
        let max = PackedVersion::from_raw(min.raw().saturating_add(abi.3));
        let artifacts: Vec<Artifact> = paths
            .iter()
            .zip(contents)
            .map(|(p, (size, sha256))| Artifact {
                path: ArtifactPath::new(p.as_str()).unwrap(),
                size,
                sha256,
            })
            .collect();
        Manifest {
            package_id: PackageId::new(package_id).unwrap(),
            kind,
            version,
            publisher_id: PublisherId::new(publisher_id).unwrap(),
            kernel_abi: AbiRange::new(min, max).unwrap(),
            module_abi: is_module.then_some(module_abi),
            os,
            arch,
            backends,
            entry: artifacts[entry_index.index(artifacts.len())].path.clone(),
            artifacts,
            provided_ops: ops.into_iter().map(|s| ImplId::new(s).unwrap()).collect(),
            provided_runners: runners
                .into_iter()
                .map(|s| RunnerId::new(s).unwrap())
                .collect(),
            dependencies: deps
                .into_iter()
                .map(|(id, range)| Dependency {
                    package_id: PackageId::new(id).unwrap(),
                    range,
                })
                .collect(),
            module_dependencies: module_deps
                .into_iter()
                .map(|(id, range, tag, publisher, sha256)| ModuleDependency {
                    module_id: PackageId::new(id).unwrap(),
                    range,
                    abi_tag: match tag {
                        Some(t) if !is_module => t,
                        _ => MODULE_ABI_TAG_V1.into(),
                    },
                    publisher_id: publisher.map(|p| PublisherId::new(p).unwrap()),
                    sha256,
                })
                .collect(),
            check_params: Default::default(),
        }
    })
}

/// Shuffles a set's elements into a vector, for lists that must be unique but not sorted.
trait ShuffleSet<T> {
    fn prop_shuffle_set(self) -> BoxedStrategy<Vec<T>>;
}

impl<T, S> ShuffleSet<T> for S
where
    T: std::fmt::Debug + Clone + 'static,
    S: Strategy<Value = std::collections::BTreeSet<T>> + 'static,
{
    fn prop_shuffle_set(self) -> BoxedStrategy<Vec<T>> {
        self.prop_map(|s| s.into_iter().collect::<Vec<T>>())
            .prop_shuffle()
            .boxed()
    }
}

fn mutate(mut input: Vec<u8>, edits: &[(prop::sample::Index, u8, u8)]) -> Vec<u8> {
    for (at, op, byte) in edits {
        let len = input.len();
        match op % 4 {
            0 if len > 0 => input[at.index(len)] = *byte,
            1 => input.insert(at.index(len + 1), *byte),
            2 if len > 0 => {
                input.remove(at.index(len));
            }
            _ if len > 0 => input[at.index(len)] ^= 1 << (byte % 8),
            _ => {}
        }
    }
    input
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn canonicalisation_is_idempotent(v in value()) {
        let once = canonicalize(&v);
        let back = json::parse(&once).expect("canonical bytes parse");
        prop_assert_eq!(&back, &sorted(&v));
        prop_assert_eq!(canonicalize(&back), once);
    }

    #[test]
    fn canonical_bytes_ignore_key_order_whitespace_and_escapes(v in value(), seed in any::<u64>()) {
        let mut noisy = String::new();
        let mut noise = Noise(seed);
        noise.ws(&mut noisy);
        write_noisy(&v, &mut noisy, &mut noise);
        noise.ws(&mut noisy);
        let reread = json::parse(noisy.as_bytes()).expect("noisy text parses");
        prop_assert_eq!(canonicalize(&reread), canonicalize(&v));
        prop_assert_eq!(canonical_digest(&reread), canonical_digest(&v));
    }

    #[test]
    fn parser_never_panics_on_arbitrary_bytes(input in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = json::parse(&input);
        let _ = Metadata::parse(&input);
        let _ = Manifest::parse_payload(&input);
    }

    #[test]
    fn parser_never_panics_on_mutated_manifests(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), any::<u8>()), 1..8),
        module in any::<bool>(),
    ) {
        let doc = if module { module_doc() } else { kernel_doc() };
        let input = mutate(bytes(&doc), &edits);
        if let Ok(meta) = Metadata::parse(&input) {
            // Whatever survives must still be self-consistent.
            let recomputed = canonicalize(meta.payload());
            prop_assert_eq!(meta.canonical_payload(), recomputed.as_slice());
            let reread = Metadata::parse(meta.to_pretty_json().as_bytes()).expect("rewritten metadata parses");
            prop_assert_eq!(reread.canonical_payload(), meta.canonical_payload());
        }
    }

    #[test]
    fn manifest_survives_canonical_bytes(m in manifest()) {
        prop_assert_eq!(m.check(), Ok(()));
        let canonical = m.canonical_payload();
        let back = Manifest::parse_payload(&canonical).expect("canonical payload parses");
        prop_assert_eq!(&back, &m);
        prop_assert_eq!(back.canonical_payload(), canonical.clone());
        let meta = Metadata::new(m.clone(), vec![]).expect("valid manifest");
        prop_assert_eq!(meta.canonical_payload(), canonical.as_slice());
        let reread = Metadata::parse(meta.to_pretty_json().as_bytes()).expect("written metadata parses");
        prop_assert_eq!(reread.manifest(), &m);
        prop_assert_eq!(reread.payload_digest(), Sha256Digest::of(&canonical));
    }
}

#[test]
fn graph_node_from_metadata_carries_the_signed_digest_and_every_edge() {
    use guild_domain::graph::PackageNode;
    // An explicit empty opt-in list stays in the signed bytes, so the node's digest must be the
    // digest of the payload as received, not of the typed manifest written back out.
    let mut doc = module_doc();
    doc["payload"]["provided_runners"] = json!([]);
    let metadata = Metadata::parse(&bytes(&doc)).unwrap();
    let node = PackageNode::from_metadata(&metadata, true);
    assert_eq!(node.payload_digest, metadata.payload_digest());
    assert_ne!(node.payload_digest, metadata.manifest().payload_digest());
    assert_eq!(node.id.as_str(), "example.prefix");
    assert_eq!(node.version, Version::new(2, 0, 0));
    assert_eq!(node.kind, PackageKind::Module);
    assert_eq!(node.module_abi, Some(1));
    assert_eq!(node.publisher.as_str(), "org.example");
    assert!(node.enabled);
    assert_eq!(node.dependencies, metadata.manifest().dependencies);
    assert_eq!(
        node.module_dependencies,
        metadata.manifest().module_dependencies
    );
    assert!(node.module_dependencies[0].is_runtime_edge());
    assert!(!PackageNode::from_metadata(&metadata, false).enabled);
}
