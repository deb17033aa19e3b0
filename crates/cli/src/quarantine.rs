//! The crash quarantine as the command line shows it (`list`, `status`, `doctor`) and lifts it
//! (`guild quarantine clear ID`, in `store`); see `guild_host::crash_quarantine`.

use std::path::Path;

use guild_host::crash_quarantine::{CrashLedger, QuarantineEntry};
use guild_host::HostError;

use super::output::Report;

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
