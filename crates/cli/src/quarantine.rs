//! The crash quarantine as the command line shows it (`list`, `status`, `doctor`) and lifts it
//! (`guild quarantine clear ID`); see `guild_host::crash_quarantine`.

use std::path::Path;

use guild_domain::ids::PackageId;
use guild_host::crash_quarantine::{CrashLedger, QuarantineEntry};
use guild_host::HostError;

use super::failure::{CliError, Exit};
use super::output::Report;
use super::store;

/// The builds in crash quarantine, after turning the records of processes that died while
/// loading into entries (the caller holds the store open).
pub fn entries(store: &Path) -> anyhow::Result<Vec<QuarantineEntry>> {
    let ledger = CrashLedger::new(store);
    ledger.sweep().map_err(HostError::from)?;
    Ok(ledger.quarantined().map_err(HostError::from)?)
}

/// Adds the crash quarantine to `report`: a `crash_quarantine` field, and one warning per entry.
pub fn annotate(store: &Path, report: &mut Report) -> anyhow::Result<()> {
    let entries = entries(store)?;
    report.field(
        "crash_quarantine",
        entries
            .iter()
            .map(QuarantineEntry::to_json)
            .collect::<Vec<_>>(),
    );
    for e in &entries {
        report.warnings.push(match e.package() {
            Some(id) => format!(
                "{}; install a new version, or `guild quarantine clear {id}` to try this one \
                 again",
                e.describe()
            ),
            None => format!(
                "{}; `guild quarantine clear ID` (the package of that payload) removes it",
                e.describe()
            ),
        });
    }
    Ok(())
}

/// `guild quarantine clear ID`.
pub fn clear(store: &Path, id: &PackageId) -> anyhow::Result<Report> {
    // Opening takes the store's lock and recovers it, like every command that changes it.
    let (pm, mut report) = store::open(store, "quarantine clear")?;
    // An entry that cannot be read names no package: the payloads of the package's versions
    // say which are its.
    let digests: Vec<_> = pm
        .list()?
        .into_iter()
        .filter(|p| &p.id == id)
        .flat_map(|p| p.versions.into_iter().map(|v| v.payload_digest))
        .collect();
    let ledger = CrashLedger::new(store);
    ledger.sweep().map_err(HostError::from)?;
    let removed = ledger
        .clear(id.as_str(), &digests, None)
        .map_err(HostError::from)?;
    if removed.is_empty() {
        return Err(CliError::new(
            Exit::NotFound,
            format!("{id} has no build in crash quarantine"),
        )
        .with_hint("`guild list` shows the quarantine")
        .into());
    }
    report.field(
        "cleared",
        removed
            .iter()
            .map(QuarantineEntry::to_json)
            .collect::<Vec<_>>(),
    );
    for entry in &removed {
        report.line(match entry {
            QuarantineEntry::Crashed(r) => format!(
                "cleared the crash quarantine of {}@{} (payload {}): the next host loads it again",
                r.package,
                r.version,
                r.digest.to_hex()
            ),
            QuarantineEntry::Unreadable { path, digest, .. } => format!(
                "removed the unreadable crash quarantine entry {} of {id} (payload {}): the next \
                 host loads it again",
                path.display(),
                digest.to_hex()
            ),
        });
    }
    Ok(report)
}
