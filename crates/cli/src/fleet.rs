//! `guild fleet root new / policy new / sign / verify / push / pull`: authoring a fleet's
//! signed documents (see `guild_domain::fleet`).
//!
//! Nothing here touches a store. A root and a policy are written unsigned; each key holder adds
//! a signature in turn (`sign`), so that no machine ever holds the threshold of keys; `verify`
//! applies the domain's threshold rules with the crypto adapter's verifier; `push` and `pull`
//! move a document through a registry, an untrusted transport, checking only its size, digest
//! and syntax.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use guild_domain::fleet::{
    is_expired, verify_policy, verify_root_self, verify_root_successor, DesiredPackage,
    DocumentKind, FleetDocument, FleetPolicy, FleetPublisher, FleetRoot, PolicyError, RootError,
    Signed, SignedPolicy, SignedRoot, ThresholdError, MAX_DOCUMENT_BYTES, POLICY_MARKER,
    POLICY_MEDIA_TYPE, ROOT_MARKER, ROOT_MEDIA_TYPE,
};
use guild_domain::ids::Sha256Digest;
use guild_domain::trust::{SignatureCheck, TrustedKey};
use guild_host::distribution::{DocumentRegistry, OciReference, OciRegistry};
use guild_host::durable_file;
use guild_host::packaging::{key_files as files, sign_document, P256Verifier};

use super::args::{
    FleetCommand, FleetPolicyCommand, FleetPolicyNew, FleetRootCommand, FleetRootNew,
};
use super::distribute::{read_lock, registry_failure};
use super::failure::{CliError, Exit};
use super::output::Report;
use super::publisher::Check;

pub fn run(command: &FleetCommand) -> anyhow::Result<Report> {
    match command {
        FleetCommand::Root(FleetRootCommand::New(new)) => root_new(new),
        FleetCommand::Policy(FleetPolicyCommand::New(new)) => policy_new(new),
        FleetCommand::Sign { file, key, root } => sign(file, key, root.as_deref()),
        FleetCommand::Verify { file, root } => verify(file, root.as_deref()),
        FleetCommand::Push { file, reference } => push(file, reference),
        FleetCommand::Pull { reference, out } => pull(reference, out),
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The domain's signature check by the crypto adapter's verifier.
fn check() -> impl SignatureCheck {
    Check(P256Verifier::new())
}

/// A fleet document read from a file or a registry.
enum Document {
    Root(SignedRoot),
    Policy(SignedPolicy),
}

impl Document {
    fn kind(&self) -> DocumentKind {
        match self {
            Document::Root(_) => DocumentKind::Root,
            Document::Policy(_) => DocumentKind::Policy,
        }
    }

    /// Reads `bytes` (from `source`, a file or a reference) strictly, as the root or the
    /// policy its `signed` member's marker says it is.
    fn parse(bytes: &[u8], source: &str) -> anyhow::Result<Document> {
        let rejected = |what: String| CliError::new(Exit::Rejected, format!("{source}: {what}"));
        let value: serde_json::Value = serde_json::from_slice(bytes)
            .map_err(|e| rejected(format!("not a fleet document: not JSON ({e})")))?;
        let signed = value.get("signed");
        let has = |marker: &str| signed.and_then(|s| s.get(marker)).is_some();
        if has(ROOT_MARKER) {
            parse_as(bytes, source).map(Document::Root)
        } else if has(POLICY_MARKER) {
            parse_as(bytes, source).map(Document::Policy)
        } else {
            Err(rejected(format!(
                "not a fleet document: its \"signed\" member has neither {ROOT_MARKER} nor \
                 {POLICY_MARKER}"
            ))
            .into())
        }
    }
}

fn parse_as<T: FleetDocument>(bytes: &[u8], source: &str) -> anyhow::Result<Signed<T>> {
    Signed::<T>::parse(bytes).map_err(|e| {
        CliError::new(
            Exit::Rejected,
            format!("{source}: not a valid {}: {e}", T::KIND),
        )
        .into()
    })
}

/// The file's bytes, at most a document's limit.
fn read_file(path: &Path) -> anyhow::Result<Vec<u8>> {
    durable_file::read_regular(path, MAX_DOCUMENT_BYTES as u64).map_err(|e| {
        let exit = if e.is_not_found() {
            Exit::NotFound
        } else if matches!(e, durable_file::ReadError::TooLarge { .. }) {
            Exit::Rejected
        } else {
            Exit::Failure
        };
        CliError::new(exit, format!("cannot read {}: {e}", path.display())).into()
    })
}

fn read_document(path: &Path) -> anyhow::Result<Document> {
    Document::parse(&read_file(path)?, &path.display().to_string())
}

fn read_root(path: &Path) -> anyhow::Result<SignedRoot> {
    match read_document(path)? {
        Document::Root(root) => Ok(root),
        Document::Policy(_) => Err(CliError::new(
            Exit::Usage,
            format!("{} is a fleet policy, not a fleet root", path.display()),
        )
        .into()),
    }
}

/// Writes `text` to `out` atomically and durably, or to standard output for `-`. True when it
/// went to standard output (the report then prints nothing more).
fn write_out(out: &Path, text: &[u8]) -> anyhow::Result<bool> {
    if out == Path::new("-") {
        let mut stdout = std::io::stdout().lock();
        stdout
            .write_all(text)
            .and_then(|()| stdout.flush())
            .map_err(|e| {
                CliError::new(Exit::Failure, format!("cannot write standard output: {e}"))
            })?;
        return Ok(true);
    }
    durable_file::write(out, text).map_err(|e| {
        CliError::new(
            Exit::Failure,
            format!("cannot write {}: {e}", out.display()),
        )
    })?;
    Ok(false)
}

fn trusted_key(path: &Path) -> anyhow::Result<TrustedKey> {
    let key = files::read_public_key(path)?;
    Ok(TrustedKey {
        key_id: key.key_id(),
        spki_der: key.spki_der().to_vec(),
    })
}

fn short(d: &Sha256Digest) -> String {
    d.to_hex()[..16].to_owned()
}

fn keys_list(keys: &[Sha256Digest]) -> String {
    if keys.is_empty() {
        return "none".to_owned();
    }
    keys.iter().map(short).collect::<Vec<_>>().join(", ")
}

/// `guild fleet root new`.
fn root_new(new: &FleetRootNew) -> anyhow::Result<Report> {
    let keys = new
        .keys
        .iter()
        .map(|k| trusted_key(k))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let root = FleetRoot {
        fleet: new.fleet.clone(),
        version: new.version,
        expires: new.expires,
        threshold: usize::from(new.threshold),
        keys,
    };
    let signed = SignedRoot::new(&root)
        .map_err(|e| CliError::new(Exit::Usage, format!("cannot make the fleet root: {e}")))?;
    let mut report = Report::new("fleet root new");
    document_fields(&mut report, &Document::Root(signed.clone()));
    report.field("out", new.out.display().to_string());
    if write_out(&new.out, signed.to_json().as_bytes())? {
        return Ok(report.silent());
    }
    report.line(format!(
        "wrote fleet root {} version {} to {} (unsigned): {} of {} keys must sign; each \
         holder runs `guild fleet sign {} --key KEY`",
        root.fleet,
        root.version,
        new.out.display(),
        root.threshold,
        root.keys.len(),
        new.out.display()
    ));
    Ok(report)
}

/// `guild fleet policy new`.
fn policy_new(new: &FleetPolicyNew) -> anyhow::Result<Report> {
    let lock = read_lock(&new.from_lock)?;
    let mut publishers: BTreeMap<_, FleetPublisher> = BTreeMap::new();
    for (id, keys) in &new.publishers {
        let entry = publishers.entry(id.clone()).or_default();
        for k in keys {
            entry.keys.push(trusted_key(k)?);
        }
    }
    for (id, prefix) in &new.scopes {
        let Some(p) = publishers.get_mut(id) else {
            return Err(CliError::new(
                Exit::Usage,
                format!("--scope {id}={prefix}: {id} is not given with --publisher"),
            )
            .into());
        };
        p.scopes.push(prefix.clone());
    }
    let mut packages = Vec::with_capacity(lock.packages().len());
    for p in lock.packages() {
        let Some(source) = p.source.clone() else {
            return Err(CliError::new(
                Exit::Rejected,
                format!(
                    "{}: {} {} has no registry source, which a policy's desired package needs",
                    new.from_lock.display(),
                    p.id,
                    p.version
                ),
            )
            .with_hint("install it from oci://… (or push it and install it from there), then `guild lock` again")
            .into());
        };
        packages.push(DesiredPackage {
            id: p.id.clone(),
            version: p.version.clone(),
            kind: p.kind,
            payload_sha256: p.payload_sha256,
            publisher: p.publisher.clone(),
            key_ids: vec![p.key_id],
            source,
        });
    }
    let policy = FleetPolicy {
        fleet: new.fleet.clone(),
        version: new.version,
        expires: new.expires,
        root_version: new.root_version,
        publishers,
        revoked_keys: BTreeMap::new(),
        revoked_digests: BTreeMap::new(),
        packages,
    };
    if let Some(problem) = policy.problem() {
        return Err(CliError::new(
            Exit::Refused,
            format!(
                "the policy from {} would contradict itself: {problem}",
                new.from_lock.display()
            ),
        )
        .with_hint("give each package's publisher with --publisher ID=KEY.pem, its signing key included, and scopes that cover it")
        .into());
    }
    let signed = SignedPolicy::new(&policy)
        .map_err(|e| CliError::new(Exit::Usage, format!("cannot make the fleet policy: {e}")))?;
    let mut report = Report::new("fleet policy new");
    document_fields(&mut report, &Document::Policy(signed.clone()));
    report.field("out", new.out.display().to_string());
    if write_out(&new.out, signed.to_json().as_bytes())? {
        return Ok(report.silent());
    }
    report.line(format!(
        "wrote fleet policy {} version {} to {} (unsigned): {} publisher(s), {} desired \
         package(s) from {}; each root key holder runs `guild fleet sign {} --key KEY --root ROOT`",
        policy.fleet,
        policy.version,
        new.out.display(),
        policy.publishers.len(),
        policy.packages.len(),
        new.from_lock.display(),
        new.out.display()
    ));
    Ok(report)
}

/// The fields every report about one document has.
fn document_fields(report: &mut Report, doc: &Document) {
    let (kind, fleet, version, expires, digest, signatures) = match doc {
        Document::Root(d) => (
            "root",
            d.body().fleet.to_string(),
            d.version(),
            d.body().expires,
            d.digest(),
            d.signatures().len(),
        ),
        Document::Policy(d) => (
            "policy",
            d.body().fleet.to_string(),
            d.version(),
            d.body().expires,
            d.digest(),
            d.signatures().len(),
        ),
    };
    report
        .field("kind", kind)
        .field("fleet", fleet)
        .field("version", version)
        .field("expires", expires)
        .field("digest", digest.to_hex())
        .field("signatures", signatures);
}

/// Which signatures of `doc` are valid by which of `keys`, in file order, and why each other
/// one does not count.
fn count<T: FleetDocument>(
    doc: &Signed<T>,
    keys: &[TrustedKey],
) -> (Vec<Sha256Digest>, Vec<(Sha256Digest, String)>) {
    let check = check();
    let (mut valid, mut refused) = (Vec::new(), Vec::new());
    for sig in doc.signatures() {
        match keys.iter().find(|k| k.key_id == sig.key_id) {
            None => refused.push((sig.key_id, "not one of the root's keys".to_owned())),
            Some(k) => match check.verify(&k.spki_der, doc.signed_bytes(), &sig.signature) {
                Ok(()) if !valid.contains(&sig.key_id) => valid.push(sig.key_id),
                Ok(()) => {}
                Err(reason) => refused.push((sig.key_id, format!("does not verify: {reason}"))),
            },
        }
    }
    (valid, refused)
}

/// Adds the signature count against `root`'s keys and threshold to `report`; true when the
/// threshold is met.
fn tally<T: FleetDocument>(report: &mut Report, doc: &Signed<T>, root: &FleetRoot) -> bool {
    let (valid, refused) = count(doc, &root.keys);
    let met = valid.len() >= root.threshold;
    report
        .field(
            "valid_keys",
            valid.iter().map(|k| k.to_hex()).collect::<Vec<_>>(),
        )
        .field(
            "not_counted",
            refused
                .iter()
                .map(|(k, why)| serde_json::json!({"key_id": k.to_hex(), "why": why}))
                .collect::<Vec<_>>(),
        )
        .field("threshold", root.threshold)
        .field("root_version", root.version)
        .field("threshold_met", met);
    report.line(format!(
        "{} valid signature(s) by keys of root version {} ({}); {} needed: threshold {}",
        valid.len(),
        root.version,
        keys_list(&valid),
        root.threshold,
        if met { "met" } else { "not met" }
    ));
    for (k, why) in &refused {
        report.line(format!("  key {} not counted: {why}", short(k)));
    }
    met
}

/// `guild fleet sign FILE --key KEY [--root ROOT]`.
fn sign(file: &Path, key: &Path, root: Option<&Path>) -> anyhow::Result<Report> {
    let doc = read_document(file)?;
    let root = root.map(read_root).transpose()?;
    let key = files::read_private_key(key)?;
    let already = |e: guild_domain::fleet::AddSignatureError| {
        anyhow::Error::from(CliError::new(
            Exit::Refused,
            format!("{}: {e}", file.display()),
        ))
    };
    let signing_error = |e: guild_host::packaging::KeyError| {
        anyhow::Error::from(CliError::new(
            Exit::Failure,
            format!("cannot sign {}: {e}", file.display()),
        ))
    };
    let doc = match doc {
        Document::Root(d) => {
            let entry = sign_document(&d, &key).map_err(signing_error)?;
            Document::Root(d.with_signature(entry).map_err(already)?)
        }
        Document::Policy(d) => {
            let entry = sign_document(&d, &key).map_err(signing_error)?;
            Document::Policy(d.with_signature(entry).map_err(already)?)
        }
    };
    let text = match &doc {
        Document::Root(d) => d.to_json(),
        Document::Policy(d) => d.to_json(),
    };
    write_out(file, text.as_bytes())?;
    let mut report = Report::new("fleet sign");
    document_fields(&mut report, &doc);
    report
        .field("file", file.display().to_string())
        .field("key_id", key.key_id().to_hex());
    report.line(format!(
        "signed {} {} version {} with key {}",
        doc.kind(),
        file.display(),
        match &doc {
            Document::Root(d) => d.version(),
            Document::Policy(d) => d.version(),
        },
        short(&key.key_id())
    ));
    match (&doc, &root) {
        (Document::Root(d), _) => {
            tally(&mut report, d, d.body());
        }
        (Document::Policy(d), Some(r)) => {
            tally(&mut report, d, r.body());
        }
        (Document::Policy(_), None) => {
            report.line("no --root given: the signatures were not counted");
        }
    }
    Ok(report)
}

/// `guild fleet verify FILE [--root ROOT]`.
fn verify(file: &Path, root: Option<&Path>) -> anyhow::Result<Report> {
    let doc = read_document(file)?;
    let check = check();
    let rejected = |source: &Path, e: &dyn std::fmt::Display, short_of: Option<&ThresholdError>| {
        let mut message = format!("{}: {e}", source.display());
        if let Some(t) = short_of {
            let valid: Vec<_> = t.valid.iter().copied().collect();
            message.push_str(&format!("\n  signed validly by: {}", keys_list(&valid)));
        }
        anyhow::Error::from(CliError::new(Exit::Rejected, message))
    };
    let root_short = |e: &RootError| match e {
        RootError::Threshold(t) => Some(t.as_ref().clone()),
        _ => None,
    };
    let trusted = match root {
        Some(path) => {
            let r = read_root(path)?;
            Some(
                verify_root_self(&r, &check)
                    .map_err(|e| rejected(path, &e, root_short(&e).as_ref()))?,
            )
        }
        None => None,
    };
    let mut report = Report::new("fleet verify");
    document_fields(&mut report, &doc);
    report.field("file", file.display().to_string());
    let expires = match &doc {
        Document::Root(d) => {
            let verified = match &trusted {
                // A rotation: the next root, signed by the trusted root's keys and its own.
                Some(t) => verify_root_successor(t, d, &check),
                None => verify_root_self(d, &check),
            }
            .map_err(|e| rejected(file, &e, root_short(&e).as_ref()))?;
            tally(&mut report, d, verified.root());
            if let Some(t) = &trusted {
                report.line(format!(
                    "it is the next root after root version {} of {}",
                    t.version(),
                    root.map(|p| p.display().to_string()).unwrap_or_default()
                ));
            }
            d.body().expires
        }
        Document::Policy(d) => {
            let Some(t) = &trusted else {
                return Err(CliError::new(
                    Exit::Usage,
                    format!(
                        "{} is a fleet policy: give the root it is verified under with --root ROOT",
                        file.display()
                    ),
                )
                .into());
            };
            verify_policy(t, d, &check).map_err(|e| {
                let short_of = match &e {
                    PolicyError::Threshold(t) => Some(t.as_ref().clone()),
                    _ => None,
                };
                rejected(file, &e, short_of.as_ref())
            })?;
            tally(&mut report, d, t.root());
            d.body().expires
        }
    };
    report.line(format!(
        "{} {} version {} ({}) verifies",
        doc.kind(),
        file.display(),
        match &doc {
            Document::Root(d) => d.version(),
            Document::Policy(d) => d.version(),
        },
        match &doc {
            Document::Root(d) => d.digest().to_hex(),
            Document::Policy(d) => d.digest().to_hex(),
        }
    ));
    if is_expired(expires, now()) {
        report.warnings.push(format!(
            "{} expired at {expires} (UNIX seconds): a store refuses it unless told otherwise",
            file.display()
        ));
    }
    Ok(report)
}

/// `guild fleet push FILE REFERENCE`.
fn push(file: &Path, reference: &OciReference) -> anyhow::Result<Report> {
    let bytes = read_file(file)?;
    let doc = Document::parse(&bytes, &file.display().to_string())?;
    let pushed = OciRegistry::from_environment()
        .push_document(reference, doc.kind().media_type(), &bytes)
        .map_err(registry_failure)?;
    let mut report = Report::new("fleet push");
    document_fields(&mut report, &doc);
    report
        .field("reference", reference.to_string())
        .field(
            "manifest_digest",
            format!("sha256:{}", pushed.manifest_digest.to_hex()),
        )
        .field("media_type", doc.kind().media_type());
    report.line(format!(
        "pushed {} {} to {reference} (manifest sha256:{})",
        doc.kind(),
        file.display(),
        pushed.manifest_digest.to_hex()
    ));
    Ok(report)
}

/// `guild fleet pull REFERENCE --out FILE`.
fn pull(reference: &OciReference, out: &Path) -> anyhow::Result<Report> {
    let pulled = OciRegistry::from_environment()
        .pull_document(reference, &[ROOT_MEDIA_TYPE, POLICY_MEDIA_TYPE])
        .map_err(registry_failure)?;
    let source = reference.to_string();
    let doc = if pulled.media_type == ROOT_MEDIA_TYPE {
        Document::Root(parse_as(&pulled.bytes, &source)?)
    } else {
        Document::Policy(parse_as(&pulled.bytes, &source)?)
    };
    write_out(out, &pulled.bytes)?;
    let mut report = Report::new("fleet pull");
    document_fields(&mut report, &doc);
    report
        .field("reference", source)
        .field(
            "manifest_digest",
            format!("sha256:{}", pulled.manifest_digest.to_hex()),
        )
        .field("out", out.display().to_string());
    report.line(format!(
        "pulled {} to {} ({} bytes); its signatures are not yet verified (`guild fleet verify`)",
        doc.kind(),
        out.display(),
        pulled.bytes.len()
    ));
    Ok(report)
}
