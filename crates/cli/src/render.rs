//! Turning library values into the CLI's JSON documents and short human phrases, in one place so
//! that every command spells a package, a digest or a report the same way.

use guild_domain::graph::NodeRef;
use guild_domain::ids::Sha256Digest;
use guild_domain::manifest::Metadata;
use guild_domain::store_state::Taint;
use guild_domain::version::Version;
use guild_host::package_manager::{LeftOut, OpenReport, PackageSummary, TrustOpened};
use guild_ports::store::{InterruptedCommit, RecoveryReport};
use serde_json::{json, Value};

/// A key id or digest shortened for people (the JSON always carries the full 64 digits).
pub fn short(digest: &Sha256Digest) -> String {
    let hex = digest.to_hex();
    format!("{}…", hex.get(..12).unwrap_or(&hex))
}

/// The signed payload as JSON, exactly the fields the publisher signed.
pub fn payload_json(metadata: &Metadata) -> Value {
    // The canonical payload is strict JSON by construction, so this parse does not fail; a
    // `null` stands in if it ever did rather than aborting the command.
    serde_json::from_slice(metadata.canonical_payload()).unwrap_or(Value::Null)
}

pub fn signatures_json(metadata: &Metadata) -> Value {
    metadata
        .signatures()
        .iter()
        .map(|s| json!({"key_id": s.key_id.to_hex(), "algorithm": s.algorithm.as_str()}))
        .collect()
}

pub fn package_json(p: &PackageSummary) -> Value {
    json!({
        "id": p.id.as_str(),
        "kind": p.kind.as_str(),
        "publisher": p.publisher.as_str(),
        "enabled": p.enabled.as_ref().map(ToString::to_string),
        "current": p.versions.iter().find(|v| v.state.is_current()).map(|v| v.version.to_string()),
        "previous": p.previous.as_ref().map(ToString::to_string),
        "versions": p.versions.iter().map(|v| json!({
            "version": v.version.to_string(),
            "state": v.state.as_str(),
            "payload_sha256": v.payload_digest.to_hex(),
            "taint": v.taint.as_ref().map(taint_json),
        })).collect::<Vec<_>>(),
        "leases": {"leases": p.leases.leases, "bindings": p.leases.bindings},
    })
}

fn taint_json(q: &Taint) -> Value {
    json!({"reason": q.reason, "file": q.file})
}

/// What repairs a tainted version.
pub fn repair_hint(id: &str, version: &Version) -> String {
    format!(
        "install a genuine copy of it to repair it (guild install PACKAGE), or remove it \
         (guild remove {id} --version {version})"
    )
}

/// Every tainted version of `packages`, one line each, with what to do about it.
pub fn taint_lines(packages: &[PackageSummary]) -> Vec<String> {
    let mut out = Vec::new();
    for p in packages {
        for v in &p.versions {
            if let Some(q) = &v.taint {
                out.push(taint_line(p.id.as_str(), &v.version, q));
            }
        }
    }
    out
}

/// The line that says version `id@version` is tainted, why, and how to repair it.
pub fn taint_line(id: &str, version: &Version, q: &Taint) -> String {
    format!(
        "{id}@{version} is tainted{}: {}; {}",
        q.file
            .as_ref()
            .map(|f| format!(" (file {f})"))
            .unwrap_or_default(),
        q.reason,
        repair_hint(id, version)
    )
}

fn interrupted_json(c: &InterruptedCommit) -> Value {
    json!({
        "from_generation": c.from_generation,
        "to_generation": c.to_generation,
        // `install` is what documents before several installs per change said: the one
        // version, or null when there was none or there were several (see `installs`).
        "install": match c.installs.as_slice() {
            [one] => Some(one.to_string()),
            _ => None,
        },
        "installs": c.installs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "delete": c.delete.iter().map(ToString::to_string).collect::<Vec<_>>(),
    })
}

fn left_out_json(q: &LeftOut) -> Value {
    json!({"id": q.id.as_str(), "version": q.version.to_string(), "reason": q.reason})
}

/// A reason that may span lines (a graph report), on one line.
pub fn one_line(reason: &str) -> String {
    reason.lines().map(str::trim).collect::<Vec<_>>().join(" ")
}

pub fn left_out_list(list: &[LeftOut]) -> Value {
    list.iter().map(left_out_json).collect()
}

pub fn recovery_json(r: &RecoveryReport) -> Value {
    let paths = |ps: &[std::path::PathBuf]| {
        ps.iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
    };
    json!({
        "clean": r.is_clean(),
        "generation": r.generation,
        "created": r.created,
        "rolled_forward": r.rolled_forward.iter().map(interrupted_json).collect::<Vec<_>>(),
        "rolled_back": r.rolled_back.iter().map(interrupted_json).collect::<Vec<_>>(),
        "removed_trees": paths(&r.removed_trees),
        "removed_staging": paths(&r.removed_staging),
        "removed_temp_files": paths(&r.removed_temp_files),
        "missing_trees": r.missing_trees.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "pinned_trees": paths(&r.pinned_trees),
        "unchecked_trees": r.unchecked_trees.iter().map(|u| json!({
            "path": u.path.display().to_string(),
            "reason": u.reason,
        })).collect::<Vec<_>>(),
        "unaccounted_trees": paths(&r.unaccounted_trees),
        "swept": r.swept,
    })
}

pub fn open_report_json(r: &OpenReport) -> Value {
    json!({
        "recovery": recovery_json(&r.recovery),
        "verified": r.verified,
        "reauthenticated": r.reauthenticated,
        "committed_only": r.committed_only,
        "disabled": left_out_list(&r.disabled),
        "removed": left_out_list(&r.removed),
        "trust_bound": matches!(r.trust, Some(TrustOpened::Bound { .. })),
        "read_only": r.read_only,
    })
}

/// What opening the store did, one line each, for people; empty when there was nothing to do.
/// Creating a new store is not news and is left out.
pub fn open_report_lines(r: &OpenReport) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(TrustOpened::Bound { generation }) = &r.trust {
        out.push(format!(
            "the trust file is now bound to this store (generation {generation}): from now on a \
             missing, older or foreign trust file stops the store"
        ));
    }
    out.extend(interrupted_change_lines(&r.recovery));
    out.extend(recovery_cleanup_lines(&r.recovery));
    out.extend(left_out_lines(r));
    out
}

/// `prefix` and the versions `nodes` names, or nothing when there are none.
fn installing(nodes: &[NodeRef], prefix: &str) -> String {
    if nodes.is_empty() {
        String::new()
    } else {
        format!("{prefix}{}", names(nodes))
    }
}

/// `a@1, b@2`.
fn names(nodes: &[NodeRef]) -> String {
    nodes
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The interrupted changes recovery finished or undid.
fn interrupted_change_lines(rec: &RecoveryReport) -> Vec<String> {
    let mut out = Vec::new();
    for c in &rec.rolled_forward {
        out.push(format!(
            "recovery finished an interrupted change (generation {} -> {}{})",
            c.from_generation,
            c.to_generation,
            installing(&c.installs, ", installing ")
        ));
    }
    for c in &rec.rolled_back {
        out.push(format!(
            "recovery undid an interrupted change (generation {} stays{})",
            c.from_generation,
            match c.installs.as_slice() {
                [] => String::new(),
                [one] => format!("; {one} was not installed"),
                several => format!("; {} were not installed", names(several)),
            }
        ));
    }
    out
}

/// What recovery removed (counted), the installed packages without files, and the trees it
/// kept and why.
fn recovery_cleanup_lines(rec: &RecoveryReport) -> Vec<String> {
    let mut out = Vec::new();
    let counted = [
        (rec.removed_staging.len(), "staging entr", "y", "ies"),
        (rec.removed_temp_files.len(), "temporary file", "", "s"),
        (
            rec.removed_trees.len(),
            "unreferenced package tree",
            "",
            "s",
        ),
    ];
    for (n, what, one, many) in counted {
        if n > 0 {
            out.push(format!(
                "recovery removed {n} {what}{}",
                if n == 1 { one } else { many }
            ));
        }
    }
    for m in &rec.missing_trees {
        out.push(format!("installed package {m} has no files in the store"));
    }
    for u in &rec.unchecked_trees {
        out.push(format!(
            "recovery kept {}: it cannot tell whether a process uses it ({})",
            u.path.display(),
            u.reason
        ));
    }
    for t in &rec.unaccounted_trees {
        out.push(format!(
            "recovery kept {}: no installed or removed version and no journal record names it \
             (was the registry log cut short, or an older one put back?); remove it by hand once \
             you know it is not needed",
            t.display()
        ));
    }
    out
}

/// The packages opening left out: those removed, and those that failed re-verification
/// (not usable for a reader, disabled otherwise).
fn left_out_lines(r: &OpenReport) -> Vec<String> {
    let mut out = Vec::new();
    for q in &r.removed {
        out.push(format!("{}@{}: {}", q.id, q.version, q.reason));
    }
    for q in r.disabled.iter().filter(|_| r.read_only) {
        out.push(format!(
            "{}@{} is not usable: {} (this command only reads; the next change to the store \
             records it)",
            q.id,
            q.version,
            one_line(&q.reason)
        ));
    }
    for q in r.disabled.iter().filter(|_| !r.read_only) {
        out.push(format!(
            "disabled {}@{} because it failed re-verification: {}",
            q.id,
            q.version,
            one_line(&q.reason)
        ));
    }
    out
}
