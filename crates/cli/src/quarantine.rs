//! The crash quarantine as the command line shows it (`list`, `status`, `doctor`) and lifts it
//! (`guild quarantine clear ID`); see `guild_host::crash_quarantine`.

use std::path::Path;

use guild_domain::ids::PackageId;
use guild_host::crash_quarantine::{CrashLedger, CrashRecord};
use guild_host::HostError;

use super::failure::{CliError, Exit};
use super::output::Report;
use super::store;

fn ledger_error(store: &Path, source: std::io::Error) -> anyhow::Error {
    HostError::CrashRecord {
        path: store.to_path_buf(),
        source,
    }
    .into()
}

/// The builds in crash quarantine, after turning the records of processes that died while
/// loading into entries (the caller holds the store open).
pub fn entries(store: &Path) -> anyhow::Result<Vec<CrashRecord>> {
    let ledger = CrashLedger::new(store);
    ledger.sweep().map_err(|e| ledger_error(store, e))?;
    ledger.quarantined().map_err(|e| ledger_error(store, e))
}

/// Adds the crash quarantine to `report`: a `crash_quarantine` field, and one warning per entry.
pub fn annotate(store: &Path, report: &mut Report) -> anyhow::Result<()> {
    let entries = entries(store)?;
    report.field(
        "crash_quarantine",
        entries.iter().map(CrashRecord::to_json).collect::<Vec<_>>(),
    );
    for e in &entries {
        report.warnings.push(format!(
            "{}; install a new version, or `guild quarantine clear {}` to try this one again",
            e.describe(),
            e.package
        ));
    }
    Ok(())
}

/// `guild quarantine clear ID`.
pub fn clear(store: &Path, id: &PackageId) -> anyhow::Result<Report> {
    // Opening takes the store's lock and recovers it, like every command that changes it.
    let (_pm, mut report) = store::open(store, "quarantine clear")?;
    let ledger = CrashLedger::new(store);
    ledger.sweep().map_err(|e| ledger_error(store, e))?;
    let removed = ledger
        .clear(id.as_str(), None)
        .map_err(|e| ledger_error(store, e))?;
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
        removed.iter().map(CrashRecord::to_json).collect::<Vec<_>>(),
    );
    for r in &removed {
        report.line(format!(
            "cleared the crash quarantine of {}@{} (payload {}): the next host loads it again",
            r.package,
            r.version,
            r.digest.to_hex()
        ));
    }
    Ok(report)
}
