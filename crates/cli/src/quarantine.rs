//! The crash quarantine as the command line shows it (`list`, `status`, `doctor`) and lifts it
//! (`guild quarantine clear ID`, in `store`); see `guild_host::crash_quarantine`.

use std::path::Path;

use guild_host::crash_quarantine::{CrashLedger, CrashRecord};
use guild_host::HostError;

use super::output::Report;

pub fn ledger_error(store: &Path, source: std::io::Error) -> anyhow::Error {
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
