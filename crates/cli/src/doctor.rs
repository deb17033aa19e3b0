//! `guild doctor`: what this machine and the store look like to the host, each check with a
//! verdict and, when it is not ok, what to do about it.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use guild_host::package_manager::{PackageManager, StoreLayout};
use guild_host::platform::{cpu_isa, cuda_devices, HostPlatform};
use serde_json::{json, Value};

use super::failure::{Exit, Failure};
use super::output::Report;
use super::render::{open_report_lines, taint_lines};

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Ok,
    Warn,
    Fail,
}

impl Verdict {
    fn word(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Warn => "warn",
            Verdict::Fail => "fail",
        }
    }
}

/// One check: its name, verdict, what was found, and a hint when it is not ok.
#[derive(Debug)]
struct Check {
    name: &'static str,
    verdict: Verdict,
    detail: String,
    hint: Option<String>,
}

impl Check {
    fn new(name: &'static str, verdict: Verdict, detail: impl Into<String>) -> Self {
        Check {
            name,
            verdict,
            detail: detail.into(),
            hint: None,
        }
    }

    fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

/// `deep` asks for the full check of every installed package (`--deep`), with its options.
pub fn run(store: &Path, deep: Option<guild_host::VerifyOptions>) -> anyhow::Result<Report> {
    let mut checks = vec![platform()];
    let store_found = store_checks(store, deep, &mut checks);
    checks.push(cuda_check());
    checks.push(sdk_check());

    let mut report = Report::new("doctor");
    if let Some(found) = &store_found.full {
        let mut deep = Report::new("doctor");
        super::store::full_check_report(found, &mut deep);
        report.field("deep", serde_json::Value::Object(deep.into_json()));
    }
    report_checks(&mut report, &checks);
    report_failed(&mut report, &checks, store_found.unusable);
    Ok(report)
}

/// What the store's checks found beyond their rows.
struct StoreFound {
    /// The store is missing or cannot be opened (exit 5 rather than 1).
    unusable: bool,
    /// The full check's findings, with `--deep`.
    full: Option<guild_host::FullCheck>,
}

/// The store's checks, pushed onto `checks`: the store itself, then (when it opens) the trust
/// store, the crash quarantine and, with `deep`, the full check.
fn store_checks(
    store: &Path,
    deep: Option<guild_host::VerifyOptions>,
    checks: &mut Vec<Check>,
) -> StoreFound {
    let mut full = None;
    let unusable = match existing_store(store) {
        Err(missing) => {
            checks.push(missing);
            true
        }
        // A reader: the doctor diagnoses while runners serve and changes nothing.
        Ok(()) => match PackageManager::open_dir_reader(store) {
            Ok((pm, mut opened)) => {
                // Opening reads no installed tree: the doctor reads every one.
                match pm.read_installed() {
                    Ok(left_out) => opened.disabled.extend(left_out),
                    Err(e) => checks.push(unopened_store(store, e)),
                }
                checks.push(store_check(store, &pm, &opened));
                checks.push(trust_check(&pm));
                checks.push(quarantine_check(store));
                if let Some(options) = deep {
                    let (check, found) = deep_check(&pm, options);
                    checks.push(check);
                    full = found;
                }
                false
            }
            Err(e) => {
                checks.push(unopened_store(store, e));
                true
            }
        },
    };
    StoreFound { unusable, full }
}

/// The store check when the store exists but does not open.
fn unopened_store(store: &Path, e: guild_host::HostError) -> Check {
    // The hint the failing command would print (the trust file's recovery command, say) is
    // the useful one; the generic one is for failures without their own.
    let e = anyhow::Error::new(e);
    let hint = Failure::from_error(&e).hint.unwrap_or_else(|| {
        "`guild recover` says more; another process may hold the store's lock".into()
    });
    Check::new(
        "store",
        Verdict::Fail,
        format!("{} cannot be opened: {e}", store.display()),
    )
    .hint(hint)
}

/// Every check as a JSON object (`checks`) and as a line, with its hint below it.
fn report_checks(report: &mut Report, checks: &[Check]) {
    report.field(
        "checks",
        Value::Array(
            checks
                .iter()
                .map(|c| {
                    json!({
                        "name": c.name,
                        "verdict": c.verdict.word(),
                        "detail": c.detail,
                        "hint": c.hint,
                    })
                })
                .collect(),
        ),
    );
    for c in checks {
        report.line(format!(
            "{:<5} {:<9} {}",
            c.verdict.word(),
            c.name,
            c.detail
        ));
        if let Some(hint) = &c.hint {
            report.line(format!("{:<15} hint: {hint}", ""));
        }
    }
}

/// The failed checks' names (`failed`); any failure sets the exit code and a warning.
fn report_failed(report: &mut Report, checks: &[Check], store_unusable: bool) {
    let failed: Vec<&str> = checks
        .iter()
        .filter(|c| c.verdict == Verdict::Fail)
        .map(|c| c.name)
        .collect();
    report.field("failed", json!(failed));
    if !failed.is_empty() {
        // The checks are the useful part of a failure: they are printed as on success, and
        // the exit code says that something failed.
        report.exit = Some(if store_unusable {
            Exit::Store
        } else {
            Exit::Failure
        });
        report
            .warnings
            .push(format!("failed checks: {}", failed.join(", ")));
    }
}

fn platform() -> Check {
    match HostPlatform::current() {
        Some(p) => Check::new(
            "platform",
            Verdict::Ok,
            format!(
                "{} {}, Kernel ABI {}, CPU features: {}",
                p.os.as_str(),
                p.arch.as_str(),
                p.kernel_abi,
                cpu_isa()
            ),
        ),
        None => Check::new(
            "platform",
            Verdict::Fail,
            format!(
                "{} {} has no manifest spelling: no package can be installed here",
                std::env::consts::OS,
                std::env::consts::ARCH
            ),
        ),
    }
}

/// `doctor` examines a store and never makes one: opening creates a store where there is none,
/// so a mistyped `--store` would otherwise be answered with a new, empty and healthy store. A
/// path without a registry file is a failed check instead, and nothing is written there.
fn existing_store(store: &Path) -> Result<(), Check> {
    let registry = StoreLayout::new(store).registry;
    let detail = match fs::metadata(store) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            format!("{} does not exist", store.display())
        }
        Err(e) => format!("{} cannot be examined: {e}", store.display()),
        Ok(found) if !found.is_dir() => format!("{} is not a directory", store.display()),
        Ok(_) => match fs::symlink_metadata(&registry) {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => format!(
                "{} holds no store (there is no {})",
                store.display(),
                registry.display()
            ),
            Err(e) => format!("{} cannot be examined: {e}", registry.display()),
        },
    };
    Err(Check::new("store", Verdict::Fail, detail).hint(
        "check --store and GUILD_STORE for a typo; doctor creates nothing, any other command \
         creates the store on first use",
    ))
}

/// The crash quarantine: a build whose init killed the process that loaded it.
fn quarantine_check(store: &Path) -> Check {
    match super::quarantine::entries(store) {
        Ok(entries) if entries.is_empty() => {
            Check::new("quarantine", Verdict::Ok, "no build is in crash quarantine")
        }
        Ok(entries) => Check::new(
            "quarantine",
            Verdict::Warn,
            entries
                .iter()
                .map(|e| e.describe())
                .collect::<Vec<_>>()
                .join("; "),
        )
        .hint(format!(
            "install a fixed version, or `guild quarantine clear {}` to try the same build again",
            entries[0].package().unwrap_or("ID")
        )),
        Err(e) => Check::new(
            "quarantine",
            Verdict::Fail,
            format!("the crash quarantine cannot be read: {e}"),
        ),
    }
}

fn store_check(
    store: &Path,
    pm: &PackageManager,
    opened: &guild_host::package_manager::OpenReport,
) -> Check {
    let packages = match pm.list() {
        Ok(list) => list,
        Err(e) => {
            return Check::new(
                "store",
                Verdict::Fail,
                format!("{}: cannot list: {e}", store.display()),
            )
        }
    };
    let enabled = packages.iter().filter(|p| p.enabled.is_some()).count();
    let detail = format!(
        "{}: {} package(s), {enabled} enabled, {} signature check(s) repeated on opening",
        store.display(),
        packages.len(),
        opened.reauthenticated
    );
    let notes = open_report_lines(opened);
    let conflicts = match pm.impl_id_conflicts() {
        Ok(c) => c,
        Err(e) => {
            return Check::new(
                "store",
                Verdict::Fail,
                format!("{}: cannot check impl ids: {e}", store.display()),
            )
        }
    };
    if !conflicts.is_empty() {
        let mut all = notes;
        all.extend(super::store::conflict_lines(&conflicts));
        return Check::new(
            "store",
            Verdict::Warn,
            format!("{detail}; {}", all.join("; ")),
        )
        .hint(
            "an implementation id belongs to one package: remove the package that should not \
             provide it (`guild remove ID`, and `guild remove ID --version V` for a rollback \
             target that provides it too); see docs/operators.md",
        );
    }
    let tainted = taint_lines(&packages);
    if !tainted.is_empty() {
        // A taint outlives the command that found it: it is news until it is repaired.
        let mut lines = tainted;
        lines.extend(notes);
        Check::new(
            "store",
            Verdict::Warn,
            format!("{detail}; {}", lines.join("; ")),
        )
        .hint(
            "a tainted version failed re-verification (a file changed, or its signature no \
             longer authenticates it): reinstall the genuine package to repair it, or remove it",
        )
    } else if notes.is_empty() {
        Check::new("store", Verdict::Ok, detail)
    } else {
        Check::new(
            "store",
            Verdict::Warn,
            format!("{detail}; {}", notes.join("; ")),
        )
        .hint("`guild status` shows each package; disabled ones can be reinstalled or re-enabled")
    }
}

/// `--deep`: the full check, reported only (the doctor is a reader; what fails is left out of
/// nothing but its own view, and a changed file is still refused right before it loads).
fn deep_check(
    pm: &PackageManager,
    options: guild_host::VerifyOptions,
) -> (Check, Option<guild_host::FullCheck>) {
    match pm.verify_all(options) {
        Ok(found) if found.failures.is_empty() => (
            Check::new(
                "verify",
                Verdict::Ok,
                format!(
                    "{} installed version(s): every signature and file checked on {} thread(s)",
                    found.checked, found.jobs
                ),
            ),
            Some(found),
        ),
        Ok(found) => {
            let lines: Vec<String> = found
                .failures
                .iter()
                .map(super::store::failure_line)
                .collect();
            let check = Check::new(
                "verify",
                Verdict::Fail,
                format!(
                    "{} of {} installed version(s) failed: {}",
                    found.failures.len(),
                    found.checked,
                    lines.join("; ")
                ),
            )
            .hint(
                "`guild verify --all` disables and taints what failed; reinstall the \
                 genuine package to repair it, or remove it",
            );
            (check, Some(found))
        }
        Err(e) => (
            Check::new(
                "verify",
                Verdict::Fail,
                format!("the full check failed: {e}"),
            ),
            None,
        ),
    }
}

fn trust_check(pm: &PackageManager) -> Check {
    let trust = match pm.trust() {
        Ok(t) => t,
        Err(e) => {
            return Check::new("trust", Verdict::Fail, format!("unreadable: {e}")).hint(
                "the trust file is STORE/trust: put back this store's latest copy, or \
                     rebuild it with `guild trust reset` (recorded revocations are kept)",
            )
        }
    };
    let publishers = trust.publishers().count();
    let keys: usize = trust.publishers().map(|(_, keys)| keys.count()).sum();
    let detail = format!(
        "{publishers} publisher(s), {keys} key(s), {} revoked key(s), {} revoked payload(s)",
        trust.revoked_keys().count(),
        trust.revoked_digests().count()
    );
    if keys == 0 {
        Check::new("trust", Verdict::Warn, detail).hint(
            "nothing can be installed until a publisher's key is trusted: \
             `guild trust add PUBLISHER KEY.pub`",
        )
    } else {
        Check::new("trust", Verdict::Ok, detail)
    }
}

fn cuda_check() -> Check {
    match cuda_devices() {
        Ok(devices) if devices.is_empty() => Check::new(
            "cuda",
            Verdict::Warn,
            "the CUDA driver is loaded but reports no device",
        )
        .hint("CPU operations work; CUDA ones are rejected with \"no cuda device\""),
        Ok(devices) => Check::new(
            "cuda",
            Verdict::Ok,
            devices
                .iter()
                .map(|d| format!("device {}: {} (sm {})", d.ordinal, d.name, d.sm))
                .collect::<Vec<_>>()
                .join("; "),
        ),
        Err(e) => Check::new("cuda", Verdict::Warn, e.to_string())
            .hint("CPU operations work; CUDA ones are rejected with \"no cuda device\""),
    }
}

/// Where an installed SDK can be found: `GuildKernelSDK_DIR`, then each `CMAKE_PREFIX_PATH`
/// entry, then the usual prefixes, then this checkout's `target/guild-sdk`.
fn sdk_check() -> Check {
    let config = "GuildKernelSDKConfig.cmake";
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(dir) = std::env::var_os("GuildKernelSDK_DIR") {
        candidates.push(PathBuf::from(dir));
    }
    let prefixes = std::env::var_os("CMAKE_PREFIX_PATH")
        .map(|v| std::env::split_paths(&v).collect::<Vec<_>>())
        .unwrap_or_default();
    for prefix in prefixes
        .into_iter()
        .chain(["/usr/local", "/usr", "/opt/guild-sdk"].map(PathBuf::from))
        .chain(
            std::env::current_dir()
                .ok()
                .map(|d| d.join("target/guild-sdk")),
        )
    {
        candidates.push(prefix.join("lib/cmake/GuildKernelSDK"));
        candidates.push(prefix.join("share/cmake/GuildKernelSDK"));
    }
    match candidates.iter().find(|dir| dir.join(config).is_file()) {
        Some(dir) => Check::new(
            "sdk",
            Verdict::Ok,
            format!("GuildKernelSDK found at {}", dir.display()),
        ),
        None => Check::new(
            "sdk",
            Verdict::Warn,
            "no installed GuildKernelSDK found (looked in GuildKernelSDK_DIR, CMAKE_PREFIX_PATH, \
             /usr/local, /usr, /opt/guild-sdk and ./target/guild-sdk)",
        )
        .hint(
            "only publishers need it: `cargo xtask sdk` installs it into target/guild-sdk; \
             point CMAKE_PREFIX_PATH at the prefix",
        ),
    }
}
