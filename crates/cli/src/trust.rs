//! `guild trust add / revoke-key / revoke-package / list / reset`: the store's trust store.
//!
//! A revocation is applied to installed packages at once: after writing it, the command
//! re-verifies every enabled package and disables those that no longer authenticate (and their
//! dependents), instead of waiting for the next time the store is opened.

use std::path::Path;

use guild_domain::ids::Sha256Digest;
use guild_host::package_manager::TrustOpened;
use guild_host::packaging::key_files as files;
use guild_host::{HostError, PackageManager, TrustReset};
use serde_json::json;

use super::args::{TrustAdd, TrustCommand};
use super::output::Report;
use super::render::{left_out_list, one_line, open_report_json, open_report_lines, short};
use super::store::open;

pub fn run(store: &Path, command: &TrustCommand) -> anyhow::Result<Report> {
    match command {
        TrustCommand::Add(add) => self::add(store, add),
        TrustCommand::RevokeKey { key_id, reason } => revoke(store, Target::Key(*key_id), reason),
        TrustCommand::RevokePackage { sha256, reason } => {
            revoke(store, Target::Package(*sha256), reason)
        }
        TrustCommand::List => list(store),
        TrustCommand::Reset { keep_keys } => reset(store, *keep_keys),
    }
}

/// Rebuilds the trust file (see [`TrustReset`]), then opens the store as every command does.
fn reset(store: &Path, keep_keys: bool) -> anyhow::Result<Report> {
    let (_pm, opened): (PackageManager, _) =
        PackageManager::open_dir_resetting_trust(store, TrustReset { keep_keys })?;
    let mut report = Report::new("trust reset");
    report.field("open", open_report_json(&opened));
    if let Some(TrustOpened::Rebuilt {
        found,
        generation,
        keys,
        revoked_keys,
        revoked_payloads,
    }) = &opened.trust
    {
        report
            .field("found", found.as_deref())
            .field("generation", *generation)
            .field("trusted_keys", *keys)
            .field("revoked_keys", *revoked_keys)
            .field("revoked_packages", *revoked_payloads);
        report.line(match found {
            Some(problem) => format!("the trust file found was refused: {problem}"),
            None => "the trust file found was this store's current one".to_owned(),
        });
        report.line(format!(
            "rebuilt the trust file (generation {generation}): {keys} trusted key(s), \
             {revoked_keys} revoked key(s) and {revoked_payloads} revoked package(s) kept"
        ));
        if *keys == 0 {
            report.line(
                "no key is trusted: add each publisher's key again with `guild trust add`; \
                 revoked keys stay refused",
            );
        }
    }
    // What re-verification did under the new trust file is part of the answer.
    report.lines.extend(open_report_lines(&opened));
    Ok(report)
}

fn add(store: &Path, add: &TrustAdd) -> anyhow::Result<Report> {
    let key = files::read_public_key(&add.key)?;
    let (pm, mut report) = open(store, "trust add")?;
    let key_id = key.key_id();
    let already = pm.trust()?.owner_of(&key_id) == Some(&add.publisher);
    pm.update_trust(|t| {
        t.add_key(add.publisher.clone(), key.spki_der().to_vec())
            .map_err(HostError::from)
    })?;
    report
        .field("publisher", add.publisher.as_str())
        .field("key_id", key_id.to_hex())
        .field("added", !already)
        .line(if already {
            format!(
                "key {key_id} was already trusted for {}; nothing changed",
                add.publisher
            )
        } else {
            format!("trusted key {key_id} for publisher {}", add.publisher)
        });
    Ok(report)
}

#[derive(Debug, Clone, Copy)]
enum Target {
    Key(Sha256Digest),
    Package(Sha256Digest),
}

fn revoke(store: &Path, target: Target, reason: &str) -> anyhow::Result<Report> {
    let (command, what, digest) = match target {
        Target::Key(d) => ("trust revoke-key", "key", d),
        Target::Package(d) => ("trust revoke-package", "package payload", d),
    };
    let (pm, mut report) = open(store, command)?;
    let (newly, known) = pm.update_trust(|t| {
        Ok(match target {
            Target::Key(k) => (t.revoke_key(k, reason), t.owner_of(&k).is_some()),
            Target::Package(d) => (t.revoke_digest(d, reason), true),
        })
    })?;
    // A payload nobody installed may still be revoked ahead of time; say so, in case the digest
    // was mistyped.
    let known = known
        && match target {
            Target::Key(_) => true,
            Target::Package(d) => pm
                .list()?
                .iter()
                .any(|p| p.versions.iter().any(|v| v.payload_digest == d)),
        };
    let disabled = pm.reverify()?;
    report
        .field(
            match target {
                Target::Key(_) => "key_id",
                Target::Package(_) => "sha256",
            },
            digest.to_hex(),
        )
        .field("reason", reason)
        .field("newly_revoked", newly)
        .field("disabled", left_out_list(&disabled));
    report.line(if newly {
        format!("revoked {what} {digest} ({reason})")
    } else {
        format!("{what} {digest} was already revoked; nothing changed")
    });
    if !known {
        report.warnings.push(match target {
            Target::Key(_) => format!(
                "key {} is not trusted for any publisher; the revocation is recorded anyway",
                short(&digest)
            ),
            Target::Package(_) => format!(
                "no recorded package has payload {}; the revocation is recorded anyway",
                short(&digest)
            ),
        });
    }
    for q in &disabled {
        report.line(format!(
            "disabled {}@{}: {}",
            q.id,
            q.version,
            one_line(&q.reason)
        ));
    }
    Ok(report)
}

fn list(store: &Path) -> anyhow::Result<Report> {
    let (pm, mut report) = super::store::open_committed(store, "trust list")?;
    let trust = pm.trust()?;
    let mut publishers = Vec::new();
    for (publisher, keys) in trust.publishers() {
        let keys: Vec<_> = keys.collect();
        report.line(format!("publisher {publisher}"));
        let mut listed = Vec::new();
        for k in keys {
            let revoked = trust.is_key_revoked(&k.key_id);
            report.line(format!(
                "  key {}{}",
                k.key_id,
                if revoked { " (revoked)" } else { "" }
            ));
            listed.push(json!({"key_id": k.key_id.to_hex(), "revoked": revoked}));
        }
        publishers.push(json!({"publisher": publisher.as_str(), "keys": listed}));
    }
    if publishers.is_empty() {
        report.line("no trusted publishers: every package is refused until `guild trust add`");
    }
    let revoked_keys: Vec<_> = trust
        .revoked_keys()
        .map(|(k, r)| json!({"key_id": k.to_hex(), "reason": r}))
        .collect();
    let revoked_packages: Vec<_> = trust
        .revoked_digests()
        .map(|(d, r)| json!({"sha256": d.to_hex(), "reason": r}))
        .collect();
    for (k, r) in trust.revoked_keys() {
        report.line(format!("revoked key {k} ({r})"));
    }
    for (d, r) in trust.revoked_digests() {
        report.line(format!("revoked package payload {d} ({r})"));
    }
    report
        .field("publishers", publishers)
        .field("revoked_keys", revoked_keys)
        .field("revoked_packages", revoked_packages);
    Ok(report)
}
