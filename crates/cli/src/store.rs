//! The operator's store commands: `install`, `enable`, `disable`, `remove`, `rollback`, `list`,
//! `status`, `recover` and `verify --all`.
//!
//! Each command that changes the store opens it through `PackageManager::open_dir`, which takes
//! the store's lock, recovers interrupted transactions and re-checks the signatures of enabled
//! packages whose trust record is out of date before anything else. `list` and `status` read the
//! committed state (`PackageManager::open_dir_committed`): no lock, nothing written, no signature
//! checked and no file hashed, so they answer at once while runners serve and while another
//! command changes the store. What opening did is reported as warnings, so that an operator
//! learns of it from whichever command happened to run first. `verify --all` is the full check.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use guild_domain::claims::ImplIdConflict;
use guild_domain::ids::{PackageId, Sha256Digest};
use guild_domain::manifest::SignatureEntry;
use guild_domain::store_state::listing::ListedRow;
use guild_domain::store_state::StoreStateError;
use guild_domain::version::Version;
use guild_host::crash_quarantine::{CrashLedger, QuarantineEntry};
use guild_host::package_manager::{contested_reason, OpenReport, PackageSummary};
use guild_host::registration::{self, ChildCheck, ResultChannel};
use guild_host::{HostError, InstallOptions, PackageManager};
use guild_ports::source::Progress;
use serde_json::json;

use super::failure::{CliError, Exit};
use super::output::Report;
use super::render::{
    open_report_json, open_report_lines, package_json, repair_hint, short, taint_line, taint_lines,
};

/// Opens the store and starts a report whose warnings say what the opening did.
pub fn open(store: &Path, command: &str) -> anyhow::Result<(PackageManager, Report)> {
    let (pm, report) = open_with_report(store)?;
    let mut out = Report::new(command);
    out.warnings = open_report_lines(&report);
    Ok((pm, out))
}

fn open_with_report(store: &Path) -> Result<(PackageManager, OpenReport), HostError> {
    PackageManager::open_dir(store)
}

/// Ends a command's use of the package manager `pm` when the process is about to exit: what
/// must happen is done now, and the rest is left to the exit instead of being freed piece by
/// piece. Freeing the decoded registry of a store of 10,000 packages, record by record, was a
/// tenth of a `guild install`'s instructions; the process's exit returns the same memory at
/// once.
///
/// Only drops that do nothing but free memory are skipped. The package manager's own: its
/// progress watcher (which may end a line on stderr) is let go here first; the store's lock
/// is an open file with an `flock` on it, which the kernel releases when the process exits
/// (the store never relies on its lock being released before that: a process killed while
/// holding it releases it the same way); nothing else it owns writes, deletes or syncs on
/// drop (staging trees, pins, leases and write sessions are all gone by the end of a command,
/// each dropped by the call that made it). The lock is so held until the process exits, while
/// the command's report is printed: other writers wait that much longer. Call it only on the
/// way out, after everything that borrowed `pm` is dropped.
pub(crate) fn leave(pm: PackageManager) {
    pm.set_progress(None);
    std::mem::forget(pm);
}

/// [`open`] as a reader that checks what it reads as a runner would
/// ([`PackageManager::open_dir_reader`]).
pub fn open_reader(store: &Path, command: &str) -> anyhow::Result<(PackageManager, Report)> {
    let (pm, report) = PackageManager::open_dir_reader(store)?;
    let mut out = Report::new(command);
    out.warnings = open_report_lines(&report);
    Ok((pm, out))
}

/// [`open`] for the commands that only read the committed state
/// ([`PackageManager::open_dir_committed`]).
pub fn open_committed(store: &Path, command: &str) -> anyhow::Result<(PackageManager, Report)> {
    let (pm, report) = PackageManager::open_dir_committed(store)?;
    let mut out = Report::new(command);
    out.warnings = open_report_lines(&report);
    Ok((pm, out))
}

/// How long the registration check may take: `GUILD_LIBRARY_CHECK_TIMEOUT` seconds, else the
/// default. A value that is not a positive number is a usage error, never a silent default.
pub(crate) fn check_timeout() -> anyhow::Result<Duration> {
    let Some(raw) = std::env::var_os(registration::TIMEOUT_VARIABLE).filter(|v| !v.is_empty())
    else {
        return Ok(registration::DEFAULT_TIMEOUT);
    };
    let text = raw.to_string_lossy();
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s > 0.0 && *s <= 86_400.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| {
            CliError::new(
                Exit::Usage,
                format!(
                    "{} is {text:?}, not a number of seconds above zero",
                    registration::TIMEOUT_VARIABLE
                ),
            )
            .with_hint(format!(
                "unset it for the default of {} s, or set it to e.g. 60",
                registration::DEFAULT_TIMEOUT.as_secs()
            ))
            .into()
        })
}

/// The registration check for changes that make a version loadable: this very `guild` binary,
/// run as a child with the hidden check subcommand and the store's trust file on its stdin.
pub(crate) fn library_check(pm: &PackageManager, timeout: Duration) -> anyhow::Result<ChildCheck> {
    library_check_under(pm.trust()?.to_json().into_bytes(), timeout)
}

/// The registration check run under `trust` (a trust file's bytes): a fleet policy's, for the
/// packages that the policy brings in the same transaction as its trust.
pub(crate) fn library_check_under(trust: Vec<u8>, timeout: Duration) -> anyhow::Result<ChildCheck> {
    let program = std::env::current_exe()
        .context("cannot find the guild executable to run the registration check")?;
    // Every child `guild` starts is a check child, so it may end whatever they leave behind.
    Ok(ChildCheck::new(program, trust)
        .with_timeout(timeout)
        .containing_descendants())
}

/// The hidden child of the registration check: reads its nonce and the trust file from stdin,
/// checks the tree and writes the result line to its result channel. The exit status is 0
/// whenever a result was written; a crash or hang is the parent's finding.
pub fn check_library(
    dir: &Path,
    payload: &Sha256Digest,
    signatures: &[SignatureEntry],
    results_fd: i32,
) -> anyhow::Result<Report> {
    let (channel, trust) = ResultChannel::inherited(results_fd, registration::MAX_TRUST_BYTES)
        .with_context(|| format!("cannot take the result channel (descriptor {results_fd})"))?;
    let outcome = registration::check_tree(&PathBuf::from(dir), payload, &trust, signatures);
    let (mut out, nonce) = channel.into_parts();
    // One write, so that the line is whole whatever else the library left writing to the pipe.
    out.write_all(registration::result_line(&outcome, &nonce).as_bytes())
        .context("cannot write the result to the result channel")?;
    Ok(Report::new("check-library").silent())
}

/// One line per impl-id conflict a store recorded before installation checked them.
pub fn conflict_lines(conflicts: &[ImplIdConflict]) -> Vec<String> {
    conflicts
        .iter()
        .map(|c| {
            format!(
                "{}; `guild remove {}` or `guild remove {}` repairs it",
                contested_reason(c),
                c.claimant.id,
                c.owner.id
            )
        })
        .collect()
}

fn conflicts_json(conflicts: &[ImplIdConflict]) -> serde_json::Value {
    serde_json::Value::Array(
        conflicts
            .iter()
            .map(|c| {
                json!({
                    "owner": c.owner.to_string(),
                    "claimant": c.claimant.to_string(),
                    "impl_ids": c.impl_ids.iter().map(|i| i.as_str()).collect::<Vec<_>>(),
                    "reason": contested_reason(c),
                })
            })
            .collect(),
    )
}

pub fn install(
    store: &Path,
    package: &Path,
    enable: bool,
    allow_downgrade: bool,
    progress: Option<Arc<dyn Progress>>,
) -> anyhow::Result<Report> {
    let timeout = check_timeout()?;
    let (pm, mut report) = open(store, "install")?;
    pm.set_progress(progress);
    let mut check = library_check(&pm, timeout)?;
    let done = pm.install_with(
        package,
        InstallOptions {
            enable,
            allow_downgrade,
        },
        &mut check,
    )?;
    drop(check);
    report
        .field("package_id", done.id.as_str())
        .field("version", done.version.to_string())
        .field("kind", done.kind.as_str())
        .field("publisher", done.publisher.as_str())
        .field("key_id", done.key_id.to_hex())
        .field("signed_by", hex_list(&done.signed_by))
        .field("signatures_added", hex_list(&done.signatures_added))
        .field("payload_sha256", done.payload_digest.to_hex())
        .field("changed", done.changed)
        .field("reactivated", done.reactivated)
        .field("repaired", done.repaired)
        .field("enabled", done.enabled)
        .field(
            "superseded",
            done.superseded.as_ref().map(ToString::to_string),
        );
    let state = if done.enabled { "enabled" } else { "disabled" };
    if done.repaired {
        report.line(format!(
            "repaired {} {}: its installed files were replaced by this package's, each checked \
             against the signed manifest; {state}",
            done.id, done.version
        ));
        if let Some(old) = &done.superseded {
            report.line(format!(
                "superseded {} {old}; `guild rollback {}` returns to it",
                done.id, done.id
            ));
        }
    } else if done.reactivated {
        report.line(format!(
            "{} {} was already installed (its files are checked): it is current and {state} again",
            done.id, done.version
        ));
        if let Some(old) = &done.superseded {
            report.line(format!(
                "superseded {} {old}; `guild rollback {}` returns to it",
                done.id, done.id
            ));
        }
    } else if !done.signatures_added.is_empty() {
        // The same payload, re-signed: only its signatures were recorded.
    } else if done.changed {
        report.line(format!(
            "installed {} {} ({}) signed by {} key {}; {state}",
            done.id,
            done.version,
            done.kind,
            done.publisher,
            short(&done.key_id)
        ));
        if let Some(old) = &done.superseded {
            report.line(format!(
                "superseded {} {old}; `guild rollback {}` returns to it",
                done.id, done.id
            ));
        }
    } else {
        report.line(unchanged_line(&pm, &done.id, &done.version, state)?);
    }
    if !done.signatures_added.is_empty() {
        let keys: Vec<String> = done.signatures_added.iter().map(short).collect();
        report.line(format!(
            "recorded the signature{} of key{} {} on installed {} {} (payload unchanged); {state}",
            plural(keys.len()),
            plural(keys.len()),
            keys.join(", "),
            done.id,
            done.version
        ));
    }
    leave(pm);
    Ok(report)
}

/// Key ids as JSON strings.
fn hex_list(keys: &[Sha256Digest]) -> Vec<String> {
    keys.iter().map(Sha256Digest::to_hex).collect()
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// What an install that changed nothing says: where the version stands, and for a superseded
/// one, what would make it current again.
fn unchanged_line(
    pm: &PackageManager,
    id: &PackageId,
    version: &Version,
    state: &str,
) -> anyhow::Result<String> {
    use guild_domain::lifecycle::State;
    let packages = pm.list()?;
    let Some(package) = packages.iter().find(|p| &p.id == id) else {
        return Ok(format!(
            "{id} {version} is already installed with this exact content; nothing changed ({state})"
        ));
    };
    let this = package.versions.iter().find(|v| &v.version == version);
    let current = package
        .versions
        .iter()
        .find(|v| matches!(v.state, State::Enabled | State::Disabled))
        .map(|v| &v.version);
    Ok(match (this.map(|v| v.state), current) {
        (Some(State::Superseded), Some(current)) => {
            let how = if package.previous.as_ref() == Some(version) {
                format!("`guild rollback {id}` returns to it")
            } else {
                "install it again with --allow-downgrade to make it current".to_owned()
            };
            format!(
                "{id} {version} is already installed and superseded by {current}; nothing \
                 changed ({how})"
            )
        }
        _ => format!(
            "{id} {version} is already installed with this exact content; nothing changed ({state})"
        ),
    })
}

pub fn enable(store: &Path, id: &PackageId) -> anyhow::Result<Report> {
    let timeout = check_timeout()?;
    let (pm, mut report) = open(store, "enable")?;
    let version = pm.enable_with(id, &mut library_check(&pm, timeout)?)?;
    report
        .field("package_id", id.as_str())
        .field("version", version.to_string())
        .field("enabled", true)
        .line(format!("enabled {id} {version}"));
    Ok(report)
}

pub fn disable(store: &Path, id: &PackageId) -> anyhow::Result<Report> {
    let (pm, mut report) = open(store, "disable")?;
    let version = pm.disable(id)?;
    report
        .field("package_id", id.as_str())
        .field("version", version.to_string())
        .field("enabled", false)
        .line(format!("disabled {id} {version}"));
    Ok(report)
}

pub fn remove(store: &Path, id: &PackageId, version: Option<&Version>) -> anyhow::Result<Report> {
    let (pm, mut report) = open(store, "remove")?;
    let removed = pm.remove(id, version)?;
    report
        .field("package_id", id.as_str())
        .field("version", removed.to_string())
        .line(format!(
            "removed {id} {removed} (its record stays: this version can never return with other content)"
        ));
    Ok(report)
}

pub fn purge(store: &Path, id: &PackageId, version: Option<&Version>) -> anyhow::Result<Report> {
    let (pm, mut report) = open(store, "purge")?;
    let purged = pm.purge(id, version)?;
    let listed: Vec<String> = purged.iter().map(ToString::to_string).collect();
    report
        .field("package_id", id.as_str())
        .field("purged", listed.clone())
        .line(format!(
            "purged {id} {} (no record is left: {} may be installed again with other content)",
            listed.join(", "),
            if listed.len() == 1 {
                "this version"
            } else {
                "these versions"
            }
        ));
    Ok(report)
}

pub fn rollback(store: &Path, id: &PackageId) -> anyhow::Result<Report> {
    let timeout = check_timeout()?;
    let (pm, mut report) = open(store, "rollback")?;
    let rolled = pm.rollback_with(id, &mut library_check(&pm, timeout)?)?;
    report
        .field("package_id", id.as_str())
        .field("from", rolled.from.as_ref().map(ToString::to_string))
        .field("to", rolled.to.to_string())
        .line(match &rolled.from {
            Some(from) => format!("rolled {id} back from {from} to {}; enabled", rolled.to),
            None => format!("rolled {id} back to {}; enabled", rolled.to),
        });
    Ok(report)
}

pub fn list(store: &Path, json: bool) -> anyhow::Result<Report> {
    // The table alone is read from the listing, which a store of 10,000 packages answers from
    // its checkpoint's index; `--json` documents every version, so it reads the whole state.
    if !json {
        if let Some(report) = list_table(store)? {
            return Ok(report);
        }
    }
    let (pm, mut report) = open_committed(store, "list")?;
    super::quarantine::annotate(store, &mut report)?;
    let packages = pm.list()?;
    // The summaries are all the listing reads from here: the registry is freed before the
    // rows are formatted, so that a large store is not held twice at the peak. (Leaving it
    // unfreed, as `install` leaves its package manager, measured no faster at 10,000 packages
    // and held 3.5 MB more.)
    drop(pm);
    if packages.is_empty() {
        report.field("packages", Vec::<serde_json::Value>::new());
        report.line("no packages installed");
        return Ok(report);
    }
    let tainted = taint_lines(&packages);
    let rows: Vec<[String; 6]> = packages.iter().map(|p| row(store, p)).collect();
    table(&mut report, rows.iter(), |r, cell| {
        for c in *r {
            cell(c);
        }
    });
    // Tainted versions stay visible until they are repaired or removed, whichever command
    // first found them.
    report.lines.extend(tainted);
    // Built only for `--json`: a document of every package is most of what a listing of a
    // large store would otherwise cost.
    let store = store.to_path_buf();
    report.field_with("packages", move || {
        packages
            .iter()
            .map(|p| {
                let mut package = package_json(p);
                add_signing_keys(&store, p, &mut package);
                package
            })
            .collect::<Vec<_>>()
            .into()
    });
    Ok(report)
}

/// `list` without `--json`: the table and the taint lines from the store's listing
/// ([`PackageManager::open_dir_listing`]). `None` when a current version's signing keys are not
/// recorded (a version installed before the store recorded them): its metadata names them, and
/// the listing of the whole state reads it. The table is written straight to the output when
/// the report is printed ([`Report::text`]), not held as one block of text.
fn list_table(store: &Path) -> anyhow::Result<Option<Report>> {
    let (pm, opened) = PackageManager::open_dir_listing(store)?;
    let listing = pm.listing()?;
    drop(pm);
    // One pass for what the table needs before its first line: the keys' texts and the
    // columns' widths.
    let mut keys = KeyTexts::new();
    let mut widths = HEADER.map(width);
    let mut scratch = String::new();
    for r in listing.rows() {
        if let Some(c) = &r.current {
            let Some(list) = c.keys else {
                return Ok(None);
            };
            if !keys.iter().any(|(k, _)| *k == list_key(list)) {
                keys.push((list_key(list), key_text(list)));
            }
        }
        let mut column = 0;
        listing_cells(&r, &keys, &mut scratch, &mut |cell| {
            widths[column] = widths[column].max(width(cell));
            column += 1;
        });
    }
    let mut report = Report::new("list");
    report.warnings = open_report_lines(&opened);
    super::quarantine::annotate(store, &mut report)?;
    if listing.is_empty() {
        report.line("no packages installed");
        return Ok(Some(report));
    }
    report.text(move |out| {
        let mut scratch = String::new();
        write_table(out, &widths, listing.rows(), |r, cell| {
            listing_cells(r, &keys, &mut scratch, cell);
        })?;
        for row in listing.rows() {
            for (version, taint) in row.tainted {
                writeln!(out, "{}", taint_line(row.id, version, taint))?;
            }
        }
        // The process exits once the report is printed: the listing's rows are left to the
        // exit, not freed one by one (as `Output::last_success` leaves the report).
        std::mem::forget(listing);
        Ok(())
    });
    Ok(Some(report))
}

/// Hands the six cells of listing row `r` to `cell`, as [`row`] makes them from a package's
/// summary. `keys` holds the text of each list of signing keys the rows share
/// ([`KeyTexts`]); `scratch` is where a cell that is not in the row is written.
fn listing_cells(
    r: &ListedRow<'_>,
    keys: &KeyTexts,
    scratch: &mut String,
    cell: &mut dyn FnMut(&str),
) {
    let current = r.current.as_ref();
    cell(r.id);
    // Pushed piece by piece: `write!` costs more than the copies, for each of 10,000 rows.
    match (current, &r.previous) {
        (Some(c), None) => cell(&c.version),
        (current, previous) => {
            scratch.clear();
            scratch.push_str(current.map_or("-", |c| &c.version));
            if let Some(prev) = previous {
                scratch.push_str(" (previous ");
                scratch.push_str(prev);
                scratch.push(')');
            }
            cell(scratch);
        }
    }
    match current {
        Some(c) if c.tainted => {
            scratch.clear();
            scratch.push_str(c.state.as_str());
            scratch.push_str(" (tainted)");
            cell(scratch);
        }
        Some(c) => cell(c.state.as_str()),
        None => cell("none"),
    }
    cell(r.kind.as_str());
    cell(r.publisher);
    cell(
        current
            .and_then(|c| c.keys)
            .and_then(|list| keys.iter().find(|(k, _)| *k == list_key(list)))
            .map_or("-", |(_, text)| text.as_str()),
    );
}

/// The text of each list of signing keys, by the list's address: the rows of a listing share
/// their lists (nearly all rows one or two), so that each is written in hex once.
type KeyTexts = Vec<(usize, String)>;

fn list_key(list: &[Sha256Digest]) -> usize {
    list.as_ptr() as usize
}

/// A list of signing keys as the table shows it.
fn key_text(list: &[Sha256Digest]) -> String {
    list.iter()
        .map(|k| k.to_hex())
        .collect::<Vec<_>>()
        .join(",")
}

/// The table's header.
const HEADER: [&str; 6] = [
    "ID",
    "CURRENT",
    "STATE",
    "KIND",
    "PUBLISHER",
    "SIGNED BY KEY",
];

/// Adds the table of `rows` under its header to `report`: `cells` hands each of a row's six
/// cells, in order, to the function it is given. Each column is as wide as its widest cell
/// (counted in characters), two spaces between columns, no trailing spaces. The lines are
/// written into one block of text.
fn table<R>(
    report: &mut Report,
    rows: impl Iterator<Item = R> + Clone,
    mut cells: impl FnMut(&R, &mut dyn FnMut(&str)),
) {
    let mut widths = HEADER.map(width);
    for r in rows.clone() {
        let mut column = 0;
        cells(&r, &mut |cell| {
            widths[column] = widths[column].max(width(cell));
            column += 1;
        });
    }
    let mut text = Vec::new();
    // Writing into a vector cannot fail.
    let _ = write_table(&mut text, &widths, rows, cells);
    text.pop();
    report.line(String::from_utf8(text).unwrap_or_default());
}

/// Writes the table of `rows` to `out`, each line ending in a newline, with the columns'
/// `widths` ([`table`] says how it looks). The lines are gathered in a buffer of
/// [`TABLE_CHUNK`] bytes, written out each time it fills: a listing of 10,000 packages is
/// about a megabyte of text, which is never held whole.
fn write_table<R>(
    out: &mut dyn Write,
    widths: &[usize; 6],
    rows: impl Iterator<Item = R>,
    mut cells: impl FnMut(&R, &mut dyn FnMut(&str)),
) -> std::io::Result<()> {
    let mut text = String::with_capacity(TABLE_CHUNK + 4096);
    let mut line = Line::start(&mut text, widths);
    for cell in HEADER {
        line.cell(cell);
    }
    line.end();
    text.push('\n');
    for r in rows {
        let mut line = Line::start(&mut text, widths);
        cells(&r, &mut |cell| line.cell(cell));
        line.end();
        text.push('\n');
        if text.len() >= TABLE_CHUNK {
            out.write_all(text.as_bytes())?;
            text.clear();
        }
    }
    out.write_all(text.as_bytes())
}

/// How many bytes of a table [`write_table`] gathers before it writes them.
const TABLE_CHUNK: usize = 64 << 10;

/// A cell's width in characters.
fn width(cell: &str) -> usize {
    if cell.is_ascii() {
        cell.len()
    } else {
        cell.chars().count()
    }
}

/// One line of a table being appended to a text: each cell left-aligned in its column's width
/// (counted in characters), two spaces between columns, no trailing spaces.
struct Line<'t> {
    out: &'t mut String,
    widths: &'t [usize],
    start: usize,
    column: usize,
}

impl<'t> Line<'t> {
    fn start(out: &'t mut String, widths: &'t [usize]) -> Self {
        let start = out.len();
        Line {
            out,
            widths,
            start,
            column: 0,
        }
    }

    fn cell(&mut self, cell: &str) {
        if self.column > 0 {
            self.out.push_str("  ");
        }
        self.out.push_str(cell);
        let pad = self
            .widths
            .get(self.column)
            .map_or(0, |w| w.saturating_sub(width(cell)));
        const SPACES: &str = "                                                                ";
        let mut left = pad;
        while left > 0 {
            let n = left.min(SPACES.len());
            self.out.push_str(&SPACES[..n]);
            left -= n;
        }
        self.column += 1;
    }

    fn end(self) {
        let end = self.start + self.out[self.start..].trim_end().len();
        self.out.truncate(end);
    }
}

fn row(store: &Path, p: &PackageSummary) -> [String; 6] {
    let current = p.versions.iter().find(|v| v.state.is_current());
    let keys = current
        .and_then(|v| signing_keys(store, &p.id, v))
        .map_or_else(
            || "-".to_owned(),
            |k| {
                if k.is_empty() {
                    "none".to_owned()
                } else {
                    k.join(",")
                }
            },
        );
    let mut version = current.map_or_else(|| "-".to_owned(), |v| v.version.to_string());
    if let Some(prev) = &p.previous {
        version.push_str(&format!(" (previous {prev})"));
    }
    let state = match current {
        Some(v) if v.taint.is_some() => format!("{} (tainted)", v.state.as_str()),
        Some(v) => v.state.as_str().to_owned(),
        None => "none".to_owned(),
    };
    [
        p.id.to_string(),
        version,
        state,
        p.kind.to_string(),
        p.publisher.to_string(),
        keys,
    ]
}

pub fn status(store: &Path, id: Option<&PackageId>) -> anyhow::Result<Report> {
    // `status ID` reads one package's record: the other packages' are passed over, not
    // decoded, so that it answers at once on any store.
    let (pm, report) = match id {
        Some(id) => PackageManager::open_dir_package(store, id)?,
        None => PackageManager::open_dir_committed(store)?,
    };
    let mut out = Report::new("status");
    out.warnings = open_report_lines(&report);
    super::quarantine::annotate(store, &mut out)?;
    match id {
        Some(id) => {
            let out = package_status(store, &pm, id, out);
            // What it read is not freed at exit, as `install` leaves its package manager.
            leave(pm);
            out
        }
        None => {
            // Conflicts recorded before installation checked impl ids keep both sides unloaded;
            // they are shown until one side is removed. Finding them reads every version's
            // metadata, so `status ID`, which must answer at once on any store, leaves them to
            // this one.
            let conflicts = pm.impl_id_conflicts()?;
            out.warnings.extend(conflict_lines(&conflicts));
            out.field("conflicts", conflicts_json(&conflicts));
            store_status(store, &pm, &report, out)
        }
    }
}

/// `guild verify --all`: the full check of every installed version, reported one failure a line
/// with the package, version and file; the enabled ones that fail are disabled (tainted when
/// a file or signature changed) with what depends on them, in one transaction.
pub fn verify_all(store: &Path, options: guild_host::VerifyOptions) -> anyhow::Result<Report> {
    let (pm, mut report) = open(store, "verify")?;
    let checked = pm.verify_all(options)?;
    full_check_report(&checked, &mut report);
    Ok(report)
}

/// One failure of a full check: `ID VERSION (STATE) file FILE: reason`.
pub fn failure_line(f: &guild_host::VerifyFailure) -> String {
    format!(
        "{} {} ({}){}: {}",
        f.id,
        f.version,
        f.state.as_str(),
        f.file
            .as_ref()
            .map(|file| format!(" file {file}"))
            .unwrap_or_default(),
        super::render::one_line(&f.reason)
    )
}

/// Writes what a full check found into `report` (`verify --all`, `doctor --deep` use it), and
/// sets the exit code when anything failed.
pub fn full_check_report(checked: &guild_host::FullCheck, report: &mut Report) {
    report
        .field("checked", checked.checked)
        .field("jobs", checked.jobs)
        .field(
            "failures",
            checked
                .failures
                .iter()
                .map(|f| {
                    json!({
                        "package_id": f.id.as_str(),
                        "version": f.version.to_string(),
                        "state": f.state.as_str(),
                        "file": f.file,
                        "reason": f.reason,
                        "tampered": f.tampered,
                    })
                })
                .collect::<Vec<_>>(),
        )
        .field(
            "disabled",
            checked
                .disabled
                .iter()
                .map(|q| json!({"package_id": q.id.as_str(), "version": q.version.to_string(), "reason": q.reason}))
                .collect::<Vec<_>>(),
        )
        .field("recorded", checked.recorded);
    report.line(format!(
        "checked {} installed version(s) on {} thread(s): {} failed",
        checked.checked,
        checked.jobs,
        checked.failures.len()
    ));
    for f in &checked.failures {
        report.line(format!("FAILED {}", failure_line(f)));
    }
    for q in &checked.disabled {
        report.line(format!(
            "{} {} {}: {}",
            if checked.recorded {
                "disabled"
            } else {
                "not usable (not recorded: this command only reads)"
            },
            q.id,
            q.version,
            super::render::one_line(&q.reason)
        ));
    }
    if !checked.failures.is_empty() {
        report.exit = Some(Exit::Failure);
    }
}

fn package_status(
    store: &Path,
    pm: &PackageManager,
    id: &PackageId,
    mut out: Report,
) -> anyhow::Result<Report> {
    let Some(p) = pm.summary(id)? else {
        return Err(HostError::from(StoreStateError::UnknownPackage { id: id.clone() }).into());
    };
    let mut package = package_json(&p);
    add_signing_keys(store, &p, &mut package);
    // The installed tree of each version, for operators who need to look at the files.
    if let Some(versions) = package.get_mut("versions").and_then(|v| v.as_array_mut()) {
        for (v, summary) in versions.iter_mut().zip(&p.versions) {
            let dir = summary
                .state
                .is_installed()
                .then(|| store_tree(store, id, &summary.version));
            if let Some(obj) = v.as_object_mut() {
                obj.insert("path".into(), json!(dir));
            }
        }
    }
    out.field("package", package);
    out.line(format!("{} ({}, publisher {})", p.id, p.kind, p.publisher));
    for v in &p.versions {
        out.line(format!(
            "  {:<12} {:<10} payload sha256 {}",
            v.version.to_string(),
            v.state.as_str(),
            v.payload_digest
        ));
        if let Some(keys) = signing_keys(store, &p.id, v) {
            let signed = if keys.is_empty() {
                "signed by no key".to_owned()
            } else {
                format!("signed by key {}", keys.join(", "))
            };
            out.line(format!("  {:<12} {signed}", ""));
        }
        if let Some(q) = &v.taint {
            out.line(format!(
                "  {:<12} tainted: {}{}",
                "",
                q.reason,
                q.file
                    .as_ref()
                    .map(|f| format!(" (file {f})"))
                    .unwrap_or_default()
            ));
            out.line(format!(
                "  {:<12} {}",
                "",
                repair_hint(p.id.as_str(), &v.version)
            ));
        }
    }
    out.line(format!(
        "  previous version: {}",
        p.previous
            .as_ref()
            .map_or_else(|| "none".to_owned(), ToString::to_string)
    ));
    // Which live processes have which version loaded (their pins keep its files).
    let pins = pm.pins(Some(id))?;
    out.field(
        "pins",
        pins.iter()
            .flat_map(|pin| {
                pin.holders.iter().map(move |h| {
                    json!({
                        "version": pin.node.version.to_string(),
                        "pid": h.pid,
                        "command": h.command,
                    })
                })
            })
            .collect::<Vec<_>>(),
    );
    if pins.is_empty() {
        out.line("  in use by: no process");
    }
    for pin in &pins {
        let holders: Vec<String> = pin.holders.iter().map(ToString::to_string).collect();
        out.line(format!(
            "  in use by: {} (version {})",
            holders.join(", "),
            pin.node.version
        ));
    }
    Ok(out)
}

/// The key ids of the signatures on an installed version: those that verified when it was
/// installed, as the store recorded them, or for a version installed before the store recorded
/// them, every signature of the signed metadata in its tree (`.gkmetadata`); followed by
/// those the store recorded later (a copy re-signed during a key rotation); `None` when the
/// version is not installed or its metadata cannot be read or is not the recorded payload.
/// No signature is verified here (`verify --all` does that): this is what a lock records and
/// what `guild sync` holds the version to.
fn signing_keys(
    store: &Path,
    id: &PackageId,
    v: &guild_host::package_manager::VersionSummary,
) -> Option<Vec<String>> {
    if !v.state.is_installed() {
        return None;
    }
    if !v.signed_by.is_empty() {
        // Recorded when the version was installed: nothing to read per package, which keeps
        // `list` on a large store from opening every version's metadata.
        let mut keys: Vec<String> = v.signed_by.iter().map(|k| k.to_hex()).collect();
        for added in &v.signatures_added {
            let added = added.to_hex();
            if !keys.contains(&added) {
                keys.push(added);
            }
        }
        return Some(keys);
    }
    let dir = guild_host::package_manager::StoreLayout::new(store).package_dir(id, &v.version);
    let bytes = std::fs::read(dir.join(guild_domain::path::RESERVED_METADATA_NAME)).ok()?;
    let metadata = guild_domain::manifest::Metadata::parse(&bytes).ok()?;
    if metadata.payload_digest() != v.payload_digest {
        return None;
    }
    let mut keys: Vec<String> = metadata
        .signatures()
        .iter()
        .map(|s| s.key_id.to_hex())
        .collect();
    for added in &v.signatures_added {
        let added = added.to_hex();
        if !keys.contains(&added) {
            keys.push(added);
        }
    }
    Some(keys)
}

/// Adds `key_ids` (see [`signing_keys`]) to each version of a package's JSON.
fn add_signing_keys(store: &Path, p: &PackageSummary, package: &mut serde_json::Value) {
    if let Some(versions) = package.get_mut("versions").and_then(|v| v.as_array_mut()) {
        for (v, summary) in versions.iter_mut().zip(&p.versions) {
            if let Some(obj) = v.as_object_mut() {
                obj.insert("key_ids".into(), json!(signing_keys(store, &p.id, summary)));
            }
        }
    }
}

fn store_tree(store: &Path, id: &PackageId, version: &Version) -> String {
    guild_host::package_manager::StoreLayout::new(store)
        .package_dir(id, version)
        .display()
        .to_string()
}

fn store_status(
    store: &Path,
    pm: &PackageManager,
    open: &OpenReport,
    mut out: Report,
) -> anyhow::Result<Report> {
    let packages = pm.list()?;
    let trust = pm.trust()?;
    let generation = pm.generation()?;
    let installed: usize = packages
        .iter()
        .map(|p| p.versions.iter().filter(|v| v.state.is_installed()).count())
        .sum();
    let enabled = packages.iter().filter(|p| p.enabled.is_some()).count();
    let disabled = packages
        .iter()
        .filter(|p| {
            p.versions
                .iter()
                .any(|v| v.state == guild_domain::lifecycle::State::Disabled)
        })
        .count();
    let publishers = trust.publishers().count();
    let keys: usize = trust.publishers().map(|(_, k)| k.count()).sum();
    let revoked_keys = trust.revoked_keys().count();
    let revoked_packages = trust.revoked_digests().count();
    let tainted = taint_lines(&packages);
    out.field("store", store.display().to_string())
        .field("generation", generation)
        .field(
            "counts",
            json!({
                "packages": packages.len(),
                "installed_versions": installed,
                "enabled": enabled,
                "disabled": disabled,
                "trusted_publishers": publishers,
                "trusted_keys": keys,
                "revoked_keys": revoked_keys,
                "revoked_packages": revoked_packages,
                "tainted": tainted.len(),
            }),
        )
        .field("open", open_report_json(open));
    out.line(format!("store {} (generation {generation})", store.display()))
        .line(format!(
            "packages: {} ({enabled} enabled, {disabled} disabled), {installed} installed version{}",
            packages.len(),
            if installed == 1 { "" } else { "s" }
        ))
        .line(format!(
            "trust: {publishers} publisher(s), {keys} key(s); {revoked_keys} revoked key(s), {revoked_packages} revoked package(s)"
        ))
        .line(open_summary(open));
    if let Some(fleet) = pm.fleet()? {
        fleet_status(&mut out, &fleet);
    }
    if !tainted.is_empty() {
        out.line(format!("tainted: {} version(s)", tainted.len()));
        out.lines.extend(tainted);
    }
    Ok(out)
}

/// What `status` says of the fleet a store follows; an expired policy is a warning, since the
/// store keeps its last state until a newer policy arrives.
fn fleet_status(out: &mut Report, fleet: &guild_domain::fleet::FleetMembership) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let root = fleet.root.body();
    let policy = fleet.policy.as_ref();
    out.field(
        "fleet",
        json!({
            "fleet": root.fleet.to_string(),
            "root_version": root.version,
            "root_digest": fleet.root.digest().to_hex(),
            "policy": policy.map(|p| json!({
                "version": p.version,
                "sha256": p.digest.to_hex(),
                "expires": p.expires,
                "expired": p.is_expired(now),
            })),
        }),
    );
    match policy {
        None => out.line(format!(
            "fleet: {} (root version {}), no policy applied yet: `guild fleet sync --policy REF`",
            root.fleet, root.version
        )),
        Some(p) => out.line(format!(
            "fleet: {} (root version {}), policy version {} expiring at {}; the policy owns this \
             store's trust",
            root.fleet, root.version, p.version, p.expires
        )),
    };
    if let Some(p) = policy.filter(|p| p.is_expired(now)) {
        out.warnings.push(format!(
            "the fleet policy version {} expired at {} (now {now}): this store keeps its last \
             state until a newer policy is applied",
            p.version, p.expires
        ));
    }
}

/// One line on what opening the store did.
fn open_summary(open: &OpenReport) -> String {
    let recovery = if open.recovery.created {
        "store created"
    } else if open.recovery.is_clean() {
        "recovery: nothing to do"
    } else {
        "recovery: repaired an interrupted operation (see warnings)"
    };
    if open.committed_only {
        return format!(
            "{recovery}; read the committed state (no signature checked, no file hashed: \
             `guild verify --all` does both)"
        );
    }
    format!(
        "{recovery}; {} enabled package(s), {} signature check(s) repeated, disabled {}",
        open.verified,
        open.reauthenticated,
        open.disabled.len()
    )
}

pub fn recover(store: &Path) -> anyhow::Result<Report> {
    let (_pm, open) = PackageManager::open_dir_recovering(store)?;
    let mut out = Report::new("recover");
    out.field("store", store.display().to_string())
        .field("open", open_report_json(&open));
    out.line(format!("opened store {}", store.display()));
    let lines = open_report_lines(&open);
    if lines.is_empty() {
        out.line(if open.recovery.created {
            "the store was created; there was nothing to recover".to_owned()
        } else {
            "the store was consistent: nothing to recover".to_owned()
        });
    }
    // For `recover` what was repaired is the answer, not a side note.
    out.lines.extend(lines);
    out.line(format!(
        "{} enabled package(s) authenticated ({} signature check(s) repeated); {} disabled",
        open.verified,
        open.reauthenticated,
        open.disabled.len()
    ));
    Ok(out)
}

/// `guild quarantine clear ID`.
pub fn quarantine_clear(store: &Path, id: &PackageId) -> anyhow::Result<Report> {
    // Opening takes the store's lock and recovers it, like every command that changes it.
    let (pm, mut report) = open(store, "quarantine clear")?;
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

#[cfg(test)]
mod tests {
    use super::Line;

    /// A line is what padding every cell with `format!` and joining them made of it.
    #[test]
    fn table_lines_pad_each_cell_to_its_column_and_drop_trailing_spaces() {
        let widths = [4, 7, 3];
        for cells in [
            ["id", "1.0.0", "x"],
            ["long", "é-wide", ""],
            ["", "", ""],
            ["a", "", "zz"],
        ] {
            let cells = cells.map(str::to_owned);
            let padded: Vec<String> = cells
                .iter()
                .zip(widths)
                .map(|(c, w)| format!("{c:<w$}"))
                .collect();
            let expected = padded.join("  ").trim_end().to_owned();
            let mut text = "before\n".to_owned();
            let mut line = Line::start(&mut text, &widths);
            for cell in &cells {
                line.cell(cell);
            }
            line.end();
            assert_eq!(text, format!("before\n{expected}"), "{cells:?}");
        }
    }
}
