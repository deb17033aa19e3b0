//! The host's error type: each variant names what failed and where, and belongs to one
//! [`ErrorCategory`] that the CLI maps to a documented exit code.

use std::path::PathBuf;
use std::time::Duration;

use guild_domain::graph::{
    DisableRefusal, GraphBuildError, GraphProblem, RemoveRefusal, RollbackRefusal,
};
use guild_domain::lease::Leased;
use guild_domain::manifest::ManifestErrors;
use guild_domain::store_state::StoreStateError;
use guild_domain::trust::{AuthError, TrustChangeError, TrustFileError, TrustFileMismatch};
use guild_ports::source::SourceError;
use guild_ports::store::StoreError;

use guild_domain::platform::PlatformMismatch;

/// The broad class of a failure, which decides the CLI's exit code.
///
/// The `guild` command line prints these as `rejected` (exit code 3), `refused` (4),
/// `not_found` (6) and `store` (5); its own usage errors (2) and unexpected failures (1) have no
/// variant here because the library never reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCategory {
    /// The package itself is unacceptable: unreadable, hostile, malformed, unauthenticated or for
    /// another platform.
    PackageRejected,
    /// The request conflicts with the installed packages: dependencies, leases, immutable
    /// versions, downgrades, trust rules.
    Refused,
    /// The named package, version or key does not exist.
    NotFound,
    /// The store cannot be used: corrupt, locked, unreadable, or an IO failure.
    Store,
}

/// Anything the host refuses or fails to do.
///
/// Each variant names the step that failed and carries what a person needs to act on it; the
/// `Display` text is one line (or a short list) meant to be shown as it is. [`HostError::category`]
/// sorts the variants into the classes the `guild` command line turns into exit codes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// The package could not be read or extracted: missing file, malformed or hostile archive,
    /// or artifacts that do not match the manifest.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The package's `.gkmetadata` is not a valid v1 manifest.
    #[error("package {location}: {errors}")]
    Manifest {
        /// The archive or directory that was read.
        location: PathBuf,
        /// Every problem found, each with its JSON path.
        errors: ManifestErrors,
    },
    /// No signature authenticates the package under the store's trust store.
    #[error("package {package} ({location}) is not authenticated: {source}")]
    Unauthenticated {
        /// The archive, directory or installed tree that was checked.
        location: PathBuf,
        /// `id@version` as the manifest names it.
        package: String,
        /// Why authentication failed (untrusted publisher, revoked key or payload, bad
        /// signature).
        #[source]
        source: AuthError,
    },
    /// The package was built for another OS, architecture or Kernel ABI.
    #[error("package {package} cannot be installed on this host: {source}")]
    Platform {
        /// `id@version`.
        package: String,
        /// What does not match.
        #[source]
        source: PlatformMismatch,
    },
    /// The store's rules refuse the change: an immutable version offered with other
    /// content, a downgrade, a change of kind or publisher, an unknown package or version.
    #[error(transparent)]
    StoreState(#[from] StoreStateError),
    /// The change would leave an enabled package with an unmet dependency.
    #[error("{action} refused: it would break dependencies:{}", list(.problems))]
    Dependencies {
        /// What was attempted, such as `installing example.dependent@1.0.0`.
        action: String,
        /// Each dependency the change would break.
        problems: Vec<GraphProblem>,
    },
    /// The store's graph is satisfied, but the dependency's library is not loaded in this host
    /// (its load failed, or it was skipped), so the package that builds on it is not opened.
    #[error(
        "{package} was not loaded: its dependency {dependency} {}",
        match .loaded {
            Some(v) => format!("is loaded at {v}, outside the range {range} it asks for"),
            None => format!("({range}) is not loaded in this host; load or repair it first"),
        }
    )]
    DependencyNotLoaded {
        /// `id@version` of the package that was not loaded.
        package: String,
        /// The dependency that is missing from the kernel registry.
        dependency: guild_domain::ids::PackageId,
        /// The version range the package asks of it.
        range: String,
        /// The version that is loaded instead, if any.
        loaded: Option<guild_domain::version::Version>,
    },
    /// A plugin registered a kernel for a backend its signed manifest does not declare.
    #[error(
        "{package} registered {impl_id} for the {backend} backend, which its manifest does not \
         declare (backends: {declared})"
    )]
    UndeclaredBackend {
        /// `id@version`.
        package: String,
        /// The implementation that was registered.
        impl_id: guild_domain::ids::ImplId,
        /// The backend it registered for.
        backend: guild_domain::operation::Backend,
        /// The manifest's backends, comma-separated.
        declared: String,
    },
    /// Disabling would strand enabled dependents, or the package is not installed.
    #[error(transparent)]
    Disable(#[from] DisableRefusal),
    /// Removing would strand enabled dependents, or the version is not installed.
    #[error(transparent)]
    Remove(#[from] RemoveRefusal),
    /// The previous version would break a dependent's range or pin, or it is not installed.
    #[error(transparent)]
    Rollback(#[from] RollbackRefusal),
    /// A session lease or a live binding (an operation handle, a bound kernel or runner) holds
    /// the package, so a change that would unload or replace its code is refused. See
    /// `Host::disable_waiting`.
    #[error(transparent)]
    Leased(#[from] Leased),
    /// The lease ledger refused to take or release a lease.
    #[error(transparent)]
    Lease(#[from] guild_domain::lease::LeaseError),
    /// The trust store refused the change (a revoked key, a key of another publisher).
    #[error(transparent)]
    TrustChange(#[from] TrustChangeError),
    /// The store failed: locked by another process, unreadable or corrupt files, an IO error.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The store's trust file cannot be decoded (it fails closed: nothing is trusted instead).
    #[error("trust file of the store: {0}")]
    TrustFile(#[from] TrustFileError),
    /// The trust file is not the one the registry recorded: missing, an older copy, another
    /// store's, or changed outside guild. The store does not open (revocations would be
    /// forgotten); `guild trust reset` rebuilds it ([`crate::TrustReset`]).
    #[error("trust file {} is not this store's current trust file: {problem}", .path.display())]
    TrustBinding {
        /// The trust file.
        path: PathBuf,
        /// How it differs from what the registry recorded.
        #[source]
        problem: TrustFileMismatch,
    },
    /// An installed tree no longer matches what the registry recorded for it.
    #[error("installed package {package} at {} is damaged: {problem}", .path.display())]
    InstalledTree {
        /// `id@version`.
        package: String,
        /// The installed tree or the file in it that is damaged.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// The recorded packages break a rule every graph must keep (a version listed twice, two
    /// enabled versions of one package); the store's registry is damaged.
    #[error("the store's installed packages do not form a graph: {0}")]
    Graph(#[from] GraphBuildError),
    /// The host runs on an OS or architecture that manifests have no spelling for.
    #[error("this host runs on {os}/{arch}, which packages cannot name")]
    UnsupportedPlatform {
        /// `std::env::consts::OS`.
        os: &'static str,
        /// `std::env::consts::ARCH`.
        arch: &'static str,
    },
    /// A runner opened a path that is not a store, without asking for one to be created
    /// (guild-host's `HostBuilder::create_store`): nothing was created there.
    #[error("{} is not a guild store: {reason}", path.display())]
    NotAStore {
        /// The path the runner was given.
        path: PathBuf,
        /// What is there instead, in words.
        reason: String,
    },
    /// Packing or signing failed.
    #[error(transparent)]
    Publish(#[from] crate::packaging::PublishError),
    /// The plugin's library could not be loaded: it does not open, exports no entry point,
    /// supports another Kernel ABI, its `init` failed, or what it registered differs from its
    /// manifest.
    #[error(transparent)]
    Load(#[from] guild_ports::loader::LoadError),
    /// The kernel registry refused what the plugin registered (an implementation or runner id
    /// another package already provides), or the package is not loaded.
    #[error(transparent)]
    RegistryChange(#[from] guild_domain::kernel_registry::RegistryChangeError),
    /// The package provides impl ids that another recorded package already provides: an
    /// implementation id belongs to one package.
    #[error(transparent)]
    ImplIdConflict(#[from] Box<guild_domain::claims::ImplIdConflict>),
    /// What a plugin registered differs from its signed manifest: an id missing, an id it does
    /// not declare, or an id registered twice.
    #[error(
        "{package} registered {what} [{}] but its manifest declares [{}]",
        .registered.join(", "),
        .declared.join(", ")
    )]
    RegistrationMismatch {
        /// `id@version`.
        package: String,
        /// `impl ids` or `runner ids`.
        what: &'static str,
        /// What `init` registered, in registration order.
        registered: Vec<String>,
        /// What the manifest declares, sorted.
        declared: Vec<String>,
    },
    /// A plan of changes made as one ([`PackageManager::apply_plan`]) names a package a second
    /// time; each package changes once in a plan.
    ///
    /// [`PackageManager::apply_plan`]: crate::PackageManager::apply_plan
    #[error("the plan changes {id} more than once; a plan changes each package once")]
    RepeatedInPlan {
        /// The package.
        id: guild_domain::ids::PackageId,
    },
    /// A local trust change on a store that follows a fleet: the fleet's signed policy is its
    /// trust, and only a newer policy changes it.
    #[error(
        "this store follows fleet {fleet}, whose signed policy owns its trust; local trust \
         changes are refused (publish a new fleet policy instead)"
    )]
    FleetManaged {
        /// The fleet.
        fleet: guild_domain::ids::FleetId,
    },
    /// The store's record of its fleet changed between the policy's judgement and its commit
    /// (another process applied a policy meanwhile).
    #[error("the store's fleet record changed while the policy was applied; run the sync again")]
    FleetRecordChanged,
    /// A fetched package is not the one the fleet policy names: another payload, version, kind
    /// or publisher, or signed by a key its entry does not allow.
    #[error("package {}: {source}", location.display())]
    NotDesired {
        /// The file that was checked.
        location: PathBuf,
        /// How it differs from the policy's entry.
        source: Box<guild_domain::fleet::AuthorizeError>,
    },
    /// The registration check that ran the package's library in a child process refused it: the
    /// library failed the check, crashed, or hung past the timeout.
    #[error("{package} was refused: {failure}")]
    LibraryCheck {
        /// `id@version`.
        package: String,
        /// What happened in the child.
        #[source]
        failure: LibraryCheckFailure,
    },
    /// The build was not loaded: a process died while running its `init` (see
    /// [`crate::crash_quarantine`]); a new version, or `guild quarantine clear`, lifts it.
    #[error("{}", .record.describe())]
    CrashQuarantined {
        /// The load that crashed.
        record: crate::crash_quarantine::CrashRecord,
    },
    /// The build was not loaded: its crash quarantine entry cannot be read, and an entry that
    /// cannot be read keeps its digest refused; `guild quarantine clear` removes it.
    #[error(
        "the build is refused: its crash quarantine entry {} cannot be read ({problem}); \
         `guild quarantine clear ID` removes it",
        .path.display()
    )]
    CrashQuarantineUnreadable {
        /// The entry's file, named for the refused digest.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// The durable record of a load, or the quarantine it leaves, could not be written or read.
    #[error("crash quarantine: {what} {}: {source}", .path.display())]
    CrashRecord {
        /// What was being done.
        what: &'static str,
        /// The record, entry or directory involved.
        path: PathBuf,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
}

fn list(problems: &[GraphProblem]) -> String {
    problems.iter().map(|p| format!("\n  {p}")).collect()
}

impl HostError {
    /// Which class of failure this is.
    pub fn category(&self) -> ErrorCategory {
        use guild_ports::source::SourceErrorKind;
        match self {
            HostError::Source(e) if e.kind == SourceErrorKind::NotFound => ErrorCategory::NotFound,
            // A version a live process pins refuses the change; the store itself is fine.
            HostError::Store(e) if e.kind == guild_ports::store::StoreErrorKind::Pinned => {
                ErrorCategory::Refused
            }
            HostError::Source(_)
            | HostError::Manifest { .. }
            | HostError::Unauthenticated { .. }
            | HostError::Platform { .. }
            | HostError::NotDesired { .. } => ErrorCategory::PackageRejected,
            HostError::StoreState(
                StoreStateError::UnknownPackage { .. }
                | StoreStateError::NotInstalled { .. }
                | StoreStateError::NotRecorded { .. }
                | StoreStateError::NothingToPurge { .. }
                | StoreStateError::NoCurrentVersion { .. },
            )
            | HostError::Disable(DisableRefusal::NotInstalled { .. })
            | HostError::Remove(RemoveRefusal::NotInstalled { .. })
            | HostError::Rollback(RollbackRefusal::NotInstalled { .. }) => ErrorCategory::NotFound,
            HostError::StoreState(_)
            | HostError::Dependencies { .. }
            | HostError::DependencyNotLoaded { .. }
            | HostError::Disable(_)
            | HostError::Remove(_)
            | HostError::Rollback(_)
            | HostError::Leased(_)
            | HostError::Lease(_)
            | HostError::TrustChange(_)
            | HostError::ImplIdConflict(_)
            | HostError::RepeatedInPlan { .. }
            | HostError::FleetManaged { .. }
            | HostError::FleetRecordChanged => ErrorCategory::Refused,
            HostError::Store(_)
            | HostError::TrustFile(_)
            | HostError::TrustBinding { .. }
            | HostError::InstalledTree { .. }
            | HostError::Graph(_)
            | HostError::UnsupportedPlatform { .. } => ErrorCategory::Store,
            HostError::NotAStore { .. } => ErrorCategory::NotFound,
            HostError::Publish(_)
            | HostError::Load(_)
            | HostError::UndeclaredBackend { .. }
            | HostError::RegistrationMismatch { .. }
            | HostError::LibraryCheck { .. }
            | HostError::CrashQuarantined { .. }
            | HostError::CrashQuarantineUnreadable { .. } => ErrorCategory::PackageRejected,
            HostError::CrashRecord { .. } => ErrorCategory::Store,
            HostError::RegistryChange(
                guild_domain::kernel_registry::RegistryChangeError::NotLoaded { .. },
            ) => ErrorCategory::NotFound,
            HostError::RegistryChange(_) => ErrorCategory::Refused,
        }
    }
}

/// The environment variable through which the `guild` command line sets the timeout, in seconds
/// (a decimal number above zero).
pub const TIMEOUT_VARIABLE: &str = "GUILD_LIBRARY_CHECK_TIMEOUT";

/// Why the check of a package's library in a child process refused the package.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LibraryCheckFailure {
    /// The child loaded the library and refused what it registered (or could not load it).
    #[error("its library failed the registration check: {reason}")]
    Refused {
        /// The child's error, as it printed it.
        reason: String,
    },
    /// The child died of a signal while it loaded the library, ran `init` or shut it down.
    #[error(
        "loading its library killed the check process with signal {signal} ({name}); \
         guild itself is unharmed"
    )]
    Crashed {
        /// The signal number.
        signal: i32,
        /// Its name, such as `SIGSEGV`.
        name: &'static str,
    },
    /// The child did not finish within the timeout and was killed.
    #[error(
        "loading its library did not finish within {}; the check process was killed \
         (set {TIMEOUT_VARIABLE} to allow longer)",
        seconds(.timeout)
    )]
    TimedOut {
        /// How long the parent waited.
        timeout: Duration,
    },
    /// The child ended without printing a result.
    #[error("the check process exited with {status} without a result{}", tail(.stderr))]
    NoResult {
        /// The exit status, as the OS words it.
        status: String,
        /// The end of what the child wrote on stderr.
        stderr: String,
    },
    /// The child could not be started or talked to.
    #[error("cannot run the check process {}: {reason}", .program.display())]
    Spawn {
        /// The program that was run.
        program: PathBuf,
        /// What failed.
        reason: String,
    },
}

/// A timeout as people write it: whole seconds, or milliseconds.
pub fn seconds(d: &Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}

fn tail(stderr: &str) -> String {
    let text = stderr.trim();
    if text.is_empty() {
        return String::new();
    }
    let start = text.char_indices().rev().nth(400).map_or(0, |(i, _)| i);
    format!(": {}", &text[start..])
}

impl From<crate::crash_quarantine::LedgerError> for HostError {
    fn from(e: crate::crash_quarantine::LedgerError) -> Self {
        HostError::CrashRecord {
            what: e.what,
            path: e.path,
            source: e.source,
        }
    }
}

/// Why a load is refused: the crash quarantine entry of its digest.
impl From<crate::crash_quarantine::QuarantineEntry> for HostError {
    fn from(entry: crate::crash_quarantine::QuarantineEntry) -> Self {
        use crate::crash_quarantine::QuarantineEntry;
        match entry {
            QuarantineEntry::Crashed(record) => HostError::CrashQuarantined { record },
            QuarantineEntry::Unreadable { path, problem, .. } => {
                HostError::CrashQuarantineUnreadable { path, problem }
            }
        }
    }
}
