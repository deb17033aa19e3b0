//! `guild fleet policy new --requirements FILE`: a policy's desired set resolved from a small
//! declarative file (package id, version requirement, repository; see
//! `guild_domain::fleet::Requirements`).
//!
//! Each requirement is resolved in the registry, an untrusted transport, and then checked like
//! any package: its repository's tags are listed, the highest one that names a matching
//! version is picked (the domain's `resolve_tag`), and its package is pulled into a private
//! scratch directory, checked whole and authenticated against the keys the policy being
//! written trusts. Its entry pins what was pulled: the payload digest, the manifest digest and
//! the keys whose signatures verified (or, with `--entry-keys publisher`, every unrevoked key
//! of its publisher). Any refusal names the requirement and what was seen, and the policy is
//! not written.

use std::cmp::Ordering;
use std::path::Path;

use guild_domain::distribution::LockedSource;
use guild_domain::fleet::{resolve_tag, DesiredPackage, FleetPolicy, Requirement, Requirements};
use guild_domain::ids::{PublisherId, Sha256Digest};
use guild_domain::manifest::Metadata;
use guild_domain::trust::{authenticate, TrustStore};
use guild_host::distribution::{ArtifactRegistry, OciRegistry};
use guild_host::packaging::P256Verifier;

use super::read_file;
use crate::args::EntryKeys;
use crate::distribute::{open_whole, pull_to, retrying};
use crate::failure::{CliError, Exit};
use crate::publisher::{Check, ScratchDir};

/// One requirement, resolved: its desired entry, and the tag it resolved to.
pub(crate) struct Resolved {
    pub(crate) package: DesiredPackage,
    pub(crate) requirement: String,
    pub(crate) tag: String,
}

/// The keys `policy` lists for `publisher` that it does not revoke, in the order given.
pub(crate) fn publisher_keys(policy: &FleetPolicy, publisher: &PublisherId) -> Vec<Sha256Digest> {
    policy.publishers.get(publisher).map_or_else(Vec::new, |p| {
        p.keys
            .iter()
            .map(|k| k.key_id)
            .filter(|k| !policy.revoked_keys.contains_key(k))
            .collect()
    })
}

/// Reads the requirements file strictly: a malformed one is a usage error naming the file
/// and the entry.
fn read(path: &Path) -> anyhow::Result<Requirements> {
    Requirements::parse(&read_file(path)?).map_err(|e| {
        CliError::new(
            Exit::Usage,
            format!("the requirements file {} is malformed: {e}", path.display()),
        )
        .with_hint(
            "write {\"requirements\": [{\"id\": ID, \"version\": \"^1.2\", \"repository\": \
             \"oci://HOST/REPO\"}]}: no other members, each id once, repositories without a \
             tag or digest",
        )
        .into()
    })
}

/// Resolves every requirement of the file at `path` against its registry and checks its
/// package against `policy`'s publishers, scopes and revocations (its desired set is not
/// looked at). `entry_keys` is `--entry-keys`: `None` allows the keys whose signatures
/// verified.
pub(crate) fn resolve(
    path: &Path,
    policy: &FleetPolicy,
    entry_keys: Option<EntryKeys>,
) -> anyhow::Result<Vec<Resolved>> {
    if entry_keys == Some(EntryKeys::Lock) {
        return Err(CliError::new(
            Exit::Usage,
            "--entry-keys lock needs --from-lock: a requirements file names no key; leave it \
             out (the keys whose signatures verify) or give --entry-keys publisher",
        )
        .into());
    }
    let requirements = read(path)?;
    let trust = policy.trust_store();
    let registry = OciRegistry::from_environment();
    let scratch = ScratchDir::create_named("resolve")?;
    let mut resolved = Vec::with_capacity(requirements.entries().len());
    for (i, r) in requirements.entries().iter().enumerate() {
        let at = || format!("{}: requirement {r}", path.display());
        let refused = |exit: Exit, what: String| {
            anyhow::Error::from(CliError::new(exit, format!("{}: {what}", at())))
        };
        let tags = retrying(&format!("cannot list the tags of {}", r.repository), || {
            registry.list_tags(&r.repository)
        })
        .map_err(|e| e.context(at()))?;
        let chosen =
            resolve_tag(&r.version, &tags).map_err(|e| refused(Exit::NotFound, e.to_string()))?;
        let Some(reference) = r.repository.at_tag(&chosen.tag) else {
            // The adapter answers valid tags only.
            return Err(refused(
                Exit::Failure,
                format!("{:?} is no tag", chosen.tag),
            ));
        };
        let file = scratch.path().join(format!("{i}.package"));
        let pulled = pull_to(&reference, &file, None).map_err(|e| e.context(at()))?;
        let metadata = open_whole(&file).map_err(|e| e.context(at()))?;
        let m = metadata.manifest();
        // Build metadata cannot be in a tag: the tag names the version up to it.
        let same_version = m.version.cmp_precedence(&chosen.version) == Ordering::Equal;
        if m.package_id != r.id || !same_version {
            return Err(refused(
                Exit::Rejected,
                format!(
                    "tag {} holds package {} {}, not {} {}",
                    chosen.tag, m.package_id, m.version, r.id, chosen.version
                ),
            ));
        }
        let key_ids = package_keys(r, &chosen.tag, policy, &metadata, &trust, entry_keys)
            .map_err(|(exit, what)| refused(exit, what))?;
        resolved.push(Resolved {
            package: DesiredPackage {
                id: r.id.clone(),
                version: m.version.clone(),
                kind: m.kind,
                payload_sha256: metadata.payload_digest(),
                publisher: m.publisher_id.clone(),
                key_ids,
                source: LockedSource {
                    reference,
                    manifest_digest: pulled.manifest_digest,
                },
            },
            requirement: r.to_string(),
            tag: chosen.tag,
        });
    }
    Ok(resolved)
}

/// The keys the entry of `r`'s package (pulled from `tag`) allows: its publisher must be one
/// the policy trusts, covering the package id, and a key of it given must have signed it.
fn package_keys(
    r: &Requirement,
    tag: &str,
    policy: &FleetPolicy,
    metadata: &Metadata,
    trust: &TrustStore,
    entry_keys: Option<EntryKeys>,
) -> Result<Vec<Sha256Digest>, (Exit, String)> {
    let m = metadata.manifest();
    let publisher = &m.publisher_id;
    let Some(given) = policy.publishers.get(publisher) else {
        return Err((
            Exit::Rejected,
            format!(
                "{} {} (tag {tag}) is published by {publisher}, which is not given with \
                 --publisher",
                m.package_id, m.version
            ),
        ));
    };
    if !given.covers(&r.id) {
        return Err((
            Exit::Refused,
            format!(
                "publisher {publisher} is limited by --scope to {}, which does not cover {}",
                given
                    .scopes
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                r.id
            ),
        ));
    }
    let auth = authenticate(metadata, trust, &Check(P256Verifier::new())).map_err(|e| {
        (
            Exit::Rejected,
            format!(
                "{} {} (tag {tag}) is not signed by a key given for publisher {publisher}: {e}",
                m.package_id, m.version
            ),
        )
    })?;
    Ok(match entry_keys {
        Some(EntryKeys::Publisher) => publisher_keys(policy, publisher),
        _ => auth.signed_by,
    })
}
