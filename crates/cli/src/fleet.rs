//! `guild fleet root new / policy new / sign / verify / push / pull`: authoring a fleet's
//! signed documents (see `guild_domain::fleet`).
//!
//! Nothing here touches a store. A root and a policy are written unsigned; each key holder adds
//! a signature in turn (`sign`), so that no machine ever holds the threshold of keys; `verify`
//! applies the domain's threshold rules with the crypto adapter's verifier; `push` and `pull`
//! move a document through a registry, an untrusted transport, checking only its size, digest
//! and syntax.

mod requirements;

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;

use guild_domain::distribution::SyncStep;
use guild_domain::fleet::{
    check_succession, is_expired, verify_policy, verify_root_self, verify_root_successor,
    AcceptError, DesiredPackage, DocumentKind, DroppedRevocations, ExpiryRule, ExpiryStatus,
    FleetDocument, FleetPolicy, FleetPublisher, FleetRoot, PolicyError, RootError, Signed,
    SignedPolicy, SignedRoot, SuccessionError, ThresholdError, MAX_DOCUMENT_BYTES, POLICY_MARKER,
    POLICY_MEDIA_TYPE, ROOT_MARKER, ROOT_MEDIA_TYPE,
};
use guild_domain::ids::Sha256Digest;
use guild_domain::trust::{SignatureCheck, TrustedKey};
use guild_host::distribution::{DocumentRegistry, OciReference, OciRegistry};
use guild_host::durable_file;
use guild_host::fleet::{FleetError, Judged};
use guild_host::lock_sync::{SyncChange, SyncStaging};
use guild_host::package_manager::Joined;
use guild_host::packaging::{key_files as files, sign_document, P256Verifier};
use guild_host::ports::source::Progress;

use super::args::{
    EntryKeys, FleetCommand, FleetPolicyCommand, FleetPolicyNew, FleetRootCommand, FleetRootNew,
};
use super::distribute::{fetch_locked, is_reference, read_lock, registry_failure, sync_failure};
use super::failure::{CliError, Exit, Failure};
use super::output::{Output, Report};
use super::publisher::Check;
use super::store;

pub fn run(command: &FleetCommand) -> anyhow::Result<Report> {
    match command {
        FleetCommand::Root(FleetRootCommand::New(new)) => root_new(new),
        FleetCommand::Policy(FleetPolicyCommand::New(new)) => policy_new(new),
        FleetCommand::Sign {
            file,
            key,
            root,
            previous,
        } => sign(file, key, root.as_deref(), previous.as_deref()),
        FleetCommand::Verify {
            file,
            root,
            previous,
        } => verify(file, root.as_deref(), previous.as_deref()),
        FleetCommand::Push { file, reference } => push(file, reference),
        FleetCommand::Pull { reference, out } => pull(reference, out),
        FleetCommand::Join { .. } | FleetCommand::Sync { .. } => Err(CliError::new(
            Exit::Failure,
            "a fleet command that changes a store was run without one",
        )
        .into()),
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
pub(crate) fn read_file(path: &Path) -> anyhow::Result<Vec<u8>> {
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

/// `guild fleet policy new`: the publishers, scopes and revocations from the options, the
/// desired set from a lock or a requirements file.
fn policy_new(new: &FleetPolicyNew) -> anyhow::Result<Report> {
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
    let (mut revoked_keys, mut revoked_digests) = (BTreeMap::new(), BTreeMap::new());
    if let Some(previous) = &new.previous {
        let before: SignedPolicy =
            parse_as(&read_file(previous)?, &previous.display().to_string())?;
        let before = before.body();
        if before.fleet != new.fleet || before.version >= new.version {
            return Err(CliError::new(
                Exit::Refused,
                format!(
                    "--previous {} is fleet {} version {}: this policy (fleet {} version {}) \
                     must be the same fleet's, at a higher version",
                    previous.display(),
                    before.fleet,
                    before.version,
                    new.fleet,
                    new.version
                ),
            )
            .into());
        }
        revoked_keys.extend(before.revoked_keys.clone());
        revoked_digests.extend(before.revoked_digests.clone());
    }
    for (key, reason) in &new.revoke_keys {
        let reason = reason
            .clone()
            .unwrap_or_else(|| "revoked by the fleet".to_owned());
        revoked_keys.insert(*key, reason);
    }
    for (digest, reason) in &new.revoke_packages {
        let reason = reason
            .clone()
            .unwrap_or_else(|| "revoked by the fleet".to_owned());
        revoked_digests.insert(*digest, reason);
    }
    let mut policy = FleetPolicy {
        fleet: new.fleet.clone(),
        version: new.version,
        expires: new.expires,
        root_version: new.root_version,
        publishers,
        revoked_keys,
        revoked_digests,
        packages: Vec::new(),
    };
    let mut report = Report::new("fleet policy new");
    let source = match (&new.from_lock, &new.requirements) {
        (Some(lock), None) => {
            policy.packages = packages_from_lock(lock, &policy, new.entry_keys, &mut report)?;
            lock
        }
        (None, Some(file)) => {
            let resolved = requirements::resolve(file, &policy, new.entry_keys)?;
            resolved_fields(&mut report, &resolved);
            policy.packages = resolved.into_iter().map(|r| r.package).collect();
            file
        }
        // clap's group "desired" takes exactly one.
        _ => {
            return Err(CliError::new(
                Exit::Usage,
                "give exactly one of --from-lock and --requirements",
            )
            .into())
        }
    };
    if let Some(problem) = policy.problem() {
        return Err(CliError::new(
            Exit::Refused,
            format!(
                "the policy from {} would contradict itself: {problem}",
                source.display()
            ),
        )
        .with_hint("give each package's publisher with --publisher ID=KEY.pem, its signing key included, and scopes that cover it")
        .into());
    }
    let signed = SignedPolicy::new(&policy)
        .map_err(|e| CliError::new(Exit::Usage, format!("cannot make the fleet policy: {e}")))?;
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
        source.display(),
        new.out.display()
    ));
    Ok(report)
}

/// The desired set of the lock at `path`: each entry allows the lock's key, or with
/// `--entry-keys publisher` every unrevoked key `policy` lists for its publisher (a warning
/// says where the lock's key is not among them).
fn packages_from_lock(
    path: &Path,
    policy: &FleetPolicy,
    entry_keys: Option<EntryKeys>,
    report: &mut Report,
) -> anyhow::Result<Vec<DesiredPackage>> {
    let lock = read_lock(path)?;
    let mut packages = Vec::with_capacity(lock.packages().len());
    for p in lock.packages() {
        let Some(source) = p.source.clone() else {
            return Err(CliError::new(
                Exit::Rejected,
                format!(
                    "{}: {} {} has no registry source, which a policy's desired package needs",
                    path.display(),
                    p.id,
                    p.version
                ),
            )
            .with_hint("install it from oci://… (or push it and install it from there), then `guild lock` again")
            .into());
        };
        let key_ids = match entry_keys.unwrap_or(EntryKeys::Lock) {
            EntryKeys::Lock => vec![p.key_id],
            EntryKeys::Publisher => {
                let keys = requirements::publisher_keys(policy, &p.publisher);
                // A revoked lock key is the rotation's old key: the new ones are meant.
                let revoked = policy.revoked_keys.contains_key(&p.key_id);
                if !keys.is_empty() && !keys.contains(&p.key_id) && !revoked {
                    report.warnings.push(format!(
                        "{} {}: the lock's key {} is not among the keys allowed for publisher \
                         {} ({}); the stores accept it only if it also carries a signature by \
                         one of them",
                        p.id,
                        p.version,
                        short(&p.key_id),
                        p.publisher,
                        keys_list(&keys)
                    ));
                }
                keys
            }
        };
        packages.push(DesiredPackage {
            id: p.id.clone(),
            version: p.version.clone(),
            kind: p.kind,
            payload_sha256: p.payload_sha256,
            publisher: p.publisher.clone(),
            key_ids,
            source,
        });
    }
    Ok(packages)
}

/// What each requirement resolved to, for the report.
fn resolved_fields(report: &mut Report, resolved: &[requirements::Resolved]) {
    report.field(
        "resolved",
        resolved
            .iter()
            .map(|r| {
                let p = &r.package;
                serde_json::json!({
                    "requirement": r.requirement,
                    "package_id": p.id.as_str(),
                    "version": p.version.to_string(),
                    "tag": r.tag,
                    "manifest_digest": format!("sha256:{}", p.source.manifest_digest.to_hex()),
                    "payload_sha256": p.payload_sha256.to_hex(),
                    "key_ids": p.key_ids.iter().map(|k| k.to_hex()).collect::<Vec<_>>(),
                })
            })
            .collect::<Vec<_>>(),
    );
    for r in resolved {
        let p = &r.package;
        report.line(format!(
            "{} resolved to {} (tag {}, manifest sha256:{}); its entry allows key(s) {}",
            r.requirement,
            p.version,
            r.tag,
            p.source.manifest_digest.to_hex(),
            keys_list(&p.key_ids)
        ));
    }
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

/// With `--previous LAST.json`: refuses the policy `doc` (read from `file`) unless it may
/// follow the policy in LAST.json (the same fleet, a higher version, every revocation kept),
/// naming each revocation it drops. Answers the previous policy's version.
fn check_previous(
    doc: &Document,
    file: &Path,
    previous: Option<&Path>,
) -> anyhow::Result<Option<u64>> {
    let Some(path) = previous else {
        return Ok(None);
    };
    let Document::Policy(next) = doc else {
        return Err(CliError::new(
            Exit::Usage,
            format!(
                "{} is a fleet root: --previous compares a policy with the last one",
                file.display()
            ),
        )
        .into());
    };
    let before: SignedPolicy = parse_as(&read_file(path)?, &path.display().to_string())?;
    check_succession(before.body(), next.body()).map_err(|e| {
        let mut cli = CliError::new(
            Exit::Refused,
            format!(
                "{}: {e} (the previous policy is {})",
                file.display(),
                path.display()
            ),
        );
        if let SuccessionError::DropsRevocations { dropped, .. } = &e {
            let keys = dropped
                .keys
                .iter()
                .map(|(k, r)| (format!("revoked key {k}"), format!("dropped ({r})")));
            let digests = dropped
                .digests
                .iter()
                .map(|(d, r)| (format!("revoked payload {d}"), format!("dropped ({r})")));
            cli = cli
                .with_candidates(keys.chain(digests).collect())
                .with_hint(
                "a revocation never goes away: write the policy again with `guild fleet policy \
                 new ... --previous LAST.json`, which carries every revocation forward",
            );
        }
        anyhow::Error::from(cli)
    })?;
    Ok(Some(before.version()))
}

/// `guild fleet sign FILE --key KEY [--root ROOT] [--previous LAST.json]`.
fn sign(
    file: &Path,
    key: &Path,
    root: Option<&Path>,
    previous: Option<&Path>,
) -> anyhow::Result<Report> {
    let doc = read_document(file)?;
    let root = root.map(read_root).transpose()?;
    // Before anything is signed or written: a refusal leaves the file as it was.
    let previous_version = check_previous(&doc, file, previous)?;
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
        .field("key_id", key.key_id().to_hex())
        .field("previous_version", previous_version);
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

/// `guild fleet verify FILE [--root ROOT] [--previous LAST.json]`.
fn verify(file: &Path, root: Option<&Path>, previous: Option<&Path>) -> anyhow::Result<Report> {
    let doc = read_document(file)?;
    let previous_version = check_previous(&doc, file, previous)?;
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
    report
        .field("file", file.display().to_string())
        .field("previous_version", previous_version);
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
    if let (Some(v), Some(path)) = (previous_version, previous) {
        report.line(format!(
            "it follows policy version {v} of {}, keeping every revocation",
            path.display()
        ));
    }
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

/// `guild fleet join` and `guild fleet sync`: the commands that change a store.
pub fn run_on_store(
    store: &Path,
    command: &FleetCommand,
    out: &Output,
    progress: Option<Arc<dyn Progress>>,
) -> anyhow::Result<Report> {
    match command {
        FleetCommand::Join {
            root,
            digest,
            allow_expired,
        } => join(store, root, digest.as_ref(), rule(*allow_expired)),
        FleetCommand::Sync {
            policy,
            roots,
            allow_expired,
            follow,
            interval,
            rounds,
        } => {
            let sync = SyncArgs {
                policy: Ref::of(policy)?,
                roots: roots
                    .iter()
                    .map(|r| Ref::of(r))
                    .collect::<anyhow::Result<_>>()?,
                rule: rule(*allow_expired),
            };
            if *follow {
                follow_policy(store, &sync, out, progress, *interval, *rounds)
            } else {
                sync_policy(store, &sync, progress.as_ref(), &mut Fetcher::once())
            }
        }
        _ => run(command),
    }
}

fn rule(allow_expired: bool) -> ExpiryRule {
    if allow_expired {
        ExpiryRule::Override
    } else {
        ExpiryRule::Enforce
    }
}

/// Where a fleet document (and, for a mirror, the packages) comes from.
#[derive(Debug, Clone)]
enum Ref {
    File(PathBuf),
    Mirror(PathBuf),
    Oci(OciReference),
}

impl Ref {
    fn of(arg: &Path) -> anyhow::Result<Ref> {
        if is_reference(arg) {
            let reference = OciReference::parse(&arg.to_string_lossy())
                .map_err(|e| CliError::new(Exit::Usage, format!("{}: {e}", arg.display())))?;
            return Ok(Ref::Oci(reference));
        }
        if arg.is_dir() {
            return Ok(Ref::Mirror(arg.to_path_buf()));
        }
        Ok(Ref::File(arg.to_path_buf()))
    }

    fn mirror(&self) -> Option<&Path> {
        match self {
            Ref::Mirror(dir) => Some(dir),
            _ => None,
        }
    }
}

impl std::fmt::Display for Ref {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ref::File(p) | Ref::Mirror(p) => write!(f, "{}", p.display()),
            Ref::Oci(r) => write!(f, "{r}"),
        }
    }
}

/// Where a sync's documents come from: the registry adapter, and the documents last pulled
/// from a registry by reference. Under `--follow` the adapter keeps its session (client,
/// connections, authorization) between polls, and a document is pulled again only when its
/// tag names another manifest: a poll that finds the policy unchanged costs one manifest
/// request per reference.
struct Fetcher {
    registry: OciRegistry,
    pulled: HashMap<String, Pulled>,
}

/// A document last pulled from a registry, by the digest of the manifest it came under.
struct Pulled {
    manifest: Sha256Digest,
    bytes: Vec<u8>,
}

impl Fetcher {
    /// For one sync (or join): every registry call authenticates afresh.
    fn once() -> Fetcher {
        Fetcher {
            registry: OciRegistry::from_environment(),
            pulled: HashMap::new(),
        }
    }

    /// For `--follow`: sessions kept between polls.
    fn following() -> Fetcher {
        Fetcher {
            registry: OciRegistry::from_environment().keeping_sessions(),
            pulled: HashMap::new(),
        }
    }

    /// The document of `T`'s kind at `reference`: a file, `name` in a mirror directory, or the
    /// artifact at an `oci://` reference (its media type must be the kind's). A reference
    /// pulled before is resolved first, and its document read from here while the tag still
    /// names the same manifest.
    fn document<T: FleetDocument>(
        &mut self,
        reference: &Ref,
        name: &str,
    ) -> anyhow::Result<Signed<T>> {
        let r = match reference {
            Ref::File(path) => return parse_as(&read_file(path)?, &path.display().to_string()),
            Ref::Mirror(dir) => {
                let path = dir.join(name);
                return parse_as(&read_file(&path)?, &path.display().to_string());
            }
            Ref::Oci(r) => r,
        };
        let accepted = [T::KIND.media_type()];
        let failed = |e| {
            registry_failure(e).context(format!(
                "cannot fetch the {} from {r}; the store keeps its last state",
                T::KIND
            ))
        };
        let key = r.to_string();
        if let Some(held) = self.pulled.get(&key) {
            let manifest = self
                .registry
                .resolve_document(r, &accepted)
                .map_err(failed)?;
            if manifest == held.manifest {
                return parse_as(&held.bytes, &key);
            }
        }
        let pulled = self.registry.pull_document(r, &accepted).map_err(failed)?;
        let document = parse_as(&pulled.bytes, &key)?;
        self.pulled.insert(
            key,
            Pulled {
                manifest: pulled.manifest_digest,
                bytes: pulled.bytes,
            },
        );
        Ok(document)
    }

    /// Every root `reference` gives: one for a file or a reference, each `root*.json` of a
    /// mirror.
    fn roots(&mut self, reference: &Ref) -> anyhow::Result<Vec<SignedRoot>> {
        let Ref::Mirror(dir) = reference else {
            return Ok(vec![self.document(reference, "root.json")?]);
        };
        let entries = std::fs::read_dir(dir)
            .with_context(|| format!("cannot read the mirror directory {}", dir.display()))?;
        let mut names = Vec::new();
        for entry in entries {
            let name = entry
                .with_context(|| format!("cannot read the mirror directory {}", dir.display()))?
                .file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with("root") && name.ends_with(".json") {
                names.push(name.to_owned());
            }
        }
        names.sort();
        names.iter().map(|n| self.document(reference, n)).collect()
    }
}

/// The failure of a fleet step as the command line reports it.
fn fleet_failure(e: FleetError) -> anyhow::Error {
    let exit = Exit::from(e.category());
    let hint = match &e {
        FleetError::Accept(AcceptError::Expired { .. })
        | FleetError::Root(RootError::Expired { .. }) => Some(
            "publish a newer policy (or root); in an air gap an operator may apply it anyway \
             with --allow-expired, which is logged",
        ),
        FleetError::Accept(AcceptError::Rollback { .. }) => {
            Some("a store never goes back to an older policy; publish a newer version")
        }
        FleetError::NotJoined => Some("join with `guild fleet join ROOT` first"),
        _ => None,
    };
    match e {
        FleetError::Sync(sync) => return sync_failure(sync),
        // The store's own errors keep their exit codes and hints.
        FleetError::Store(source) => return anyhow::Error::from(*source),
        _ => {}
    }
    let mut cli = CliError::new(exit, e.to_string());
    if let Some(h) = hint {
        cli = cli.with_hint(h);
    }
    cli.into()
}

fn overridden_warning(what: &str, version: u64, expiry: ExpiryStatus) -> Option<String> {
    match expiry {
        ExpiryStatus::Overridden { expires, now } => Some(format!(
            "OVERRIDE: the fleet {what} version {version} expired at {expires} (now {now}); \
             applied anyway because --allow-expired was given"
        )),
        ExpiryStatus::Current => None,
    }
}

/// `guild fleet join ROOT [--digest SHA256] [--allow-expired]`.
fn join(
    store_dir: &Path,
    root: &Path,
    digest: Option<&Sha256Digest>,
    rule: ExpiryRule,
) -> anyhow::Result<Report> {
    let reference = Ref::of(root)?;
    let root: SignedRoot = Fetcher::once().document(&reference, "root.json")?;
    let (pm, mut report) = store::open(store_dir, "fleet join")?;
    let joined = guild_host::fleet::join(&pm, &root, digest, now(), rule).map_err(fleet_failure)?;
    let r = joined.root.root();
    report
        .field("fleet", r.fleet.to_string())
        .field("root_version", r.version)
        .field("root_digest", joined.root.digest().to_hex())
        .field("threshold", r.threshold)
        .field("keys", r.keys.len());
    match joined.joined {
        Joined::Now { generation } => {
            report.field("joined", true).field("generation", generation);
            report.line(format!(
                "joined fleet {} under root version {} ({}): {} of {} keys sign its policies; \
                 the fleet's policy now owns this store's trust",
                r.fleet,
                r.version,
                joined.root.digest().to_hex(),
                r.threshold,
                r.keys.len()
            ));
            if digest.is_none() {
                report.warnings.push(format!(
                    "the root was not checked against a digest handed over out of band: compare \
                     {} with the fleet's, or join with --digest",
                    joined.root.digest().to_hex()
                ));
            }
        }
        Joined::Already => {
            report.field("joined", false);
            report.line(format!(
                "this store already follows fleet {} under root version {}; nothing changed",
                r.fleet, r.version
            ));
        }
    }
    report
        .warnings
        .extend(overridden_warning("root", r.version, joined.expiry));
    Ok(report)
}

/// What one sync fetches, and under which expiry rule.
struct SyncArgs {
    policy: Ref,
    roots: Vec<Ref>,
    rule: ExpiryRule,
}

/// `guild fleet sync --policy REF [--root REF]... [--allow-expired]`: one round.
fn sync_policy(
    store_dir: &Path,
    args: &SyncArgs,
    progress: Option<&Arc<dyn Progress>>,
    fetcher: &mut Fetcher,
) -> anyhow::Result<Report> {
    let policy: SignedPolicy = fetcher.document(&args.policy, "policy.json")?;
    let mut roots = Vec::new();
    for r in &args.roots {
        roots.extend(fetcher.roots(r)?);
    }
    if args.roots.is_empty() && args.policy.mirror().is_some() {
        // A mirror carries the roots a policy was signed under, beside it.
        roots.extend(fetcher.roots(&args.policy)?);
    }
    let timeout = store::check_timeout()?;
    let now = now();
    let staging = SyncStaging::create(store_dir).map_err(sync_failure)?;
    let (judged, staged, dropped) = {
        // The committed state, read without the store's lock.
        let (reader, _) = store::open_committed(store_dir, "fleet sync")?;
        reader.set_progress(progress.cloned());
        let judged = guild_host::fleet::judge(&reader, &roots, &policy, now, args.rule)
            .map_err(fleet_failure)?;
        let steps = guild_host::fleet::plan(&reader, &judged).map_err(fleet_failure)?;
        let dropped =
            guild_host::fleet::dropped_revocations(&reader, &judged).map_err(fleet_failure)?;
        let in_step = judged.record_unchanged()
            && steps.is_empty()
            && guild_host::fleet::trust_follows(&reader, &judged).map_err(fleet_failure)?;
        if in_step {
            let mut report = Report::new("fleet sync");
            sync_fields(&mut report, &judged, "unchanged", &[]);
            dropped_fields(&mut report, &judged, &dropped);
            report.line(format!(
                "unchanged: the store follows fleet policy version {} ({})",
                judged.policy().policy().version,
                judged.policy().signed().digest().to_hex()
            ));
            return Ok(report);
        }
        let mut staged = Vec::new();
        for step in &steps {
            let (SyncStep::Install(locked) | SyncStep::Reactivate(locked)) = step else {
                continue;
            };
            let file = fetch_locked(
                locked,
                args.policy.mirror(),
                &staging,
                progress.map(|p| &**p as &dyn Progress),
            )?;
            staged.push(
                guild_host::fleet::stage(&reader, &judged, locked, file).map_err(fleet_failure)?,
            );
        }
        (judged, staged, dropped)
    };
    let (pm, mut report) = store::open(store_dir, "fleet sync")?;
    let trust = judged.policy().trust_store().to_json().into_bytes();
    let mut check = store::library_check_under(trust, timeout)?;
    let changes =
        guild_host::fleet::apply(&pm, &judged, &staged, &mut check).map_err(fleet_failure)?;
    drop(staging);
    let done: Vec<(String, String, String)> = changes
        .iter()
        .map(|c| match c {
            SyncChange::Disabled { id, version } => {
                ("disable".to_owned(), id.to_string(), version.to_string())
            }
            SyncChange::Installed { id, version } => {
                ("install".to_owned(), id.to_string(), version.to_string())
            }
        })
        .collect();
    sync_fields(&mut report, &judged, "applied", &done);
    dropped_fields(&mut report, &judged, &dropped);
    let p = judged.policy().policy();
    if judged.root_rotated() {
        report.line(format!(
            "took fleet root version {} ({})",
            judged.root().version(),
            judged.root().digest().to_hex()
        ));
    }
    for (action, id, version) in &done {
        let action = if action == "disable" {
            "disabled"
        } else {
            "installed"
        };
        report.line(format!("{action} {id} {version}"));
    }
    report.line(format!(
        "applied: the store follows fleet {} policy version {} ({}), {} desired package(s)",
        p.fleet,
        p.version,
        judged.policy().signed().digest().to_hex(),
        p.packages.len()
    ));
    report.warnings.extend(overridden_warning(
        "root",
        judged.root().version(),
        judged.root_expiry(),
    ));
    report.warnings.extend(overridden_warning(
        "policy",
        p.version,
        judged.acceptance().expiry,
    ));
    Ok(report)
}

fn sync_fields(
    report: &mut Report,
    judged: &Judged,
    outcome: &str,
    done: &[(String, String, String)],
) {
    let p = judged.policy().policy();
    report
        .field("outcome", outcome)
        .field("fleet", p.fleet.to_string())
        .field("policy_version", p.version)
        .field("policy_digest", judged.policy().signed().digest().to_hex())
        .field("policy_expires", p.expires)
        .field("root_version", judged.root().version())
        .field(
            "expiry_overridden",
            judged.acceptance().expiry.is_overridden() || judged.root_expiry().is_overridden(),
        )
        .field(
            "changes",
            done.iter()
                .map(|(a, id, v)| serde_json::json!({"action": a, "package_id": id, "version": v}))
                .collect::<Vec<_>>(),
        );
}

/// The `dropped_revocations` field of a sync's report, and a loud warning when the policy
/// leaves out revocations the store holds (which the store keeps).
fn dropped_fields(report: &mut Report, judged: &Judged, dropped: &DroppedRevocations) {
    report.field(
        "dropped_revocations",
        serde_json::json!({
            "keys": dropped.keys.iter()
                .map(|(k, r)| serde_json::json!({"key_id": k.to_hex(), "reason": r}))
                .collect::<Vec<_>>(),
            "packages": dropped.digests.iter()
                .map(|(d, r)| serde_json::json!({"sha256": d.to_hex(), "reason": r}))
                .collect::<Vec<_>>(),
        }),
    );
    if !dropped.is_empty() {
        report.warnings.push(format!(
            "REVOCATION DROPPED: fleet policy version {} does not list {}, which this store \
             revoked; the store keeps every revocation it holds, so these stay revoked, but the \
             policy's signers must publish one that carries them (`guild fleet policy new \
             --previous`, checked by `guild fleet sign --previous`)",
            judged.policy().policy().version,
            dropped
        ));
    }
}

/// The longest wait between polls while fetches fail.
const MAX_BACKOFF_SECS: u64 = 60;

/// A factor in [0.8, 1.2) from the clock and the process id: polls of many machines spread out
/// instead of arriving together.
fn jitter(round: u64) -> f64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let seed = format!("{nanos}:{}:{round}", std::process::id());
    let d = Sha256Digest::of(seed.as_bytes());
    let x = u16::from_str_radix(&d.to_hex()[..4], 16).unwrap_or(0);
    0.8 + 0.4 * f64::from(x) / 65536.0
}

/// `guild fleet sync --follow`: one sync per poll, each outcome printed as it happens; a
/// failure to fetch backs off exponentially (1 s doubling, at most 60 s) until one succeeds.
/// A refusal (an expired or older policy) is an answer, not an outage: the next poll comes at
/// the interval. SIGTERM or SIGINT asks it to stop: a sync under way finishes, none starts
/// after it, the wait between polls ends at once, and it answers with the signal (exit 0);
/// the store's lock is held only during a sync's commit, so nothing is left locked. A second
/// signal ends the process at once; the store is still wholly before or after a sync.
fn follow_policy(
    store_dir: &Path,
    args: &SyncArgs,
    out: &Output,
    progress: Option<Arc<dyn Progress>>,
    interval: u64,
    rounds: Option<u64>,
) -> anyhow::Result<Report> {
    let stop = guild_host::termination::stop_requests().map_err(|e| {
        CliError::new(
            Exit::Failure,
            format!("cannot install the handlers that stop --follow on SIGTERM and SIGINT: {e}"),
        )
    })?;
    let mut failing = 0u32;
    let mut round = 0u64;
    let mut fetcher = Fetcher::following();
    loop {
        if let Some(signal) = stop.signal() {
            return Ok(stopped(signal, round));
        }
        let outcome = sync_policy(store_dir, args, progress.as_ref(), &mut fetcher);
        round += 1;
        let wait = match outcome {
            Ok(report) => {
                // A round's report that cannot be written does not stop the following: the
                // store kept in step is what it is for.
                let _ = out.success(report);
                failing = 0;
                interval
            }
            Err(e) => {
                let failure = Failure::from_error(&e);
                out.failure(&failure);
                if failure.exit == Exit::Failure {
                    failing = failing.saturating_add(1);
                    (1u64 << failing.min(6)).min(MAX_BACKOFF_SECS)
                } else {
                    failing = 0;
                    interval
                }
            }
        };
        if rounds.is_some_and(|n| round >= n) {
            return Ok(Report::new("fleet sync").silent());
        }
        let secs = wait as f64 * jitter(round);
        if let Some(signal) = stop.wait(Duration::from_secs_f64(secs)) {
            return Ok(stopped(signal, round));
        }
    }
}

/// The answer of a follower stopped by `signal` after `rounds` polls.
fn stopped(signal: i32, rounds: u64) -> Report {
    let name = match signal {
        15 => "SIGTERM".to_owned(),
        2 => "SIGINT".to_owned(),
        n => format!("signal {n}"),
    };
    let mut report = Report::new("fleet sync");
    report
        .field("outcome", "stopped")
        .field("signal", name.as_str())
        .field("polls", rounds);
    report.line(format!(
        "stopped on {name} after {rounds} poll(s); no sync was under way, and the store is \
         wholly at the last policy it applied"
    ));
    report
}
