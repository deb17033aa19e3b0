//! The options and reports of the package manager's public operations.

use std::path::PathBuf;

use guild_domain::ids::{PackageId, PackageKind, PublisherId, Sha256Digest};
use guild_domain::lease::ActiveLeases;
use guild_domain::store_state::Taint;
use guild_domain::version::Version;
use guild_ports::store::RecoveryReport;

#[cfg(doc)]
use super::PackageManager;

/// How to install a package.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstallOptions {
    /// Whether the new version starts enabled (the default) or disabled.
    pub enable: bool,
    /// Whether a version older than the current one may be installed. Rollback is the normal
    /// way back to an older version; this is the explicit escape hatch.
    pub allow_downgrade: bool,
}

impl Default for InstallOptions {
    fn default() -> Self {
        InstallOptions {
            enable: true,
            allow_downgrade: false,
        }
    }
}

/// What an installation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// The package.
    pub id: PackageId,
    /// The version installed.
    pub version: Version,
    /// Kernel plugin or runtime module.
    pub kind: PackageKind,
    /// SHA-256 of the canonical unsigned payload: what `trust revoke-package` and dependency
    /// pins name.
    pub payload_digest: Sha256Digest,
    /// The publisher whose trusted key authenticated it.
    pub publisher: PublisherId,
    /// The id of the key whose signature verified (the first, in file order).
    pub key_id: Sha256Digest,
    /// Every trusted key whose signature verified, in file order (`key_id` first).
    pub signed_by: Vec<Sha256Digest>,
    /// The keys whose signatures this installation recorded on a version that was installed
    /// already with the same payload (a copy re-signed during a key rotation): from now on the
    /// store authenticates the version by them too. Empty otherwise.
    pub signatures_added: Vec<Sha256Digest>,
    /// False when this exact payload was already installed and nothing changed (not even a
    /// signature recorded).
    pub changed: bool,
    /// Whether this version is now the enabled one.
    pub enabled: bool,
    /// The version that was current before and is now the rollback target.
    pub superseded: Option<Version>,
    /// True when this version was already installed (superseded, after a rollback say) and was
    /// made current and enabled again instead of being extracted anew.
    pub reactivated: bool,
    /// True when this version was installed but tainted or damaged, and its files were
    /// replaced by the offered package's (verified as they were written); its taint is
    /// lifted.
    pub repaired: bool,
}

/// A package version that was disabled (it failed re-verification, or depends on one that did)
/// or left out of a load, with the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeftOut {
    /// The package.
    pub id: PackageId,
    /// The version that was disabled or not loaded.
    pub version: Version,
    /// Why it can no longer be trusted, or which failed dependency it needs.
    pub reason: String,
}

/// What opening the package manager found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenReport {
    /// What the store's recovery did before anything else.
    pub recovery: RecoveryReport,
    /// Enabled packages that failed re-verification (revoked key or digest, damaged tree), that
    /// depend on one, or whose dependencies are otherwise not met, and were therefore disabled.
    pub disabled: Vec<LeftOut>,
    /// How many enabled versions opening accepted as authenticated: under the trust file their
    /// record names ([`guild_domain::store_state::VersionRecord::trusted_under`]) or re-checked now.
    /// Opening hashes no file; the host re-hashes a version's files right before it loads it.
    pub verified: usize,
    /// How many of those had their signatures checked again, because the trust file changed
    /// since they were last authenticated (or the store predates that record).
    pub reauthenticated: usize,
    /// Opened to read the committed state only ([`PackageManager::open_dir_committed`]): no
    /// signature was checked and no `.gkmetadata` read at opening.
    pub committed_only: bool,
    /// Installed versions whose tree was missing or unreadable: each was marked removed (its
    /// dependents, if any, are among [`OpenReport::disabled`]).
    pub removed: Vec<LeftOut>,
    /// What opening did to the trust file, if anything: bound a store's unbound trust file, or
    /// rebuilt it as [`PackageManager::open_resetting_trust`] asked.
    pub trust: Option<TrustOpened>,
    /// Opened as a reader ([`PackageManager::open_dir_reader`]): nothing was recovered or
    /// written, and [`OpenReport::disabled`] lists what this process leaves out, not what the
    /// store records (the next writer records it).
    pub read_only: bool,
}

/// How [`PackageManager::verify_all`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VerifyOptions {
    /// Worker threads; `None` for one per core
    /// ([`std::thread::available_parallelism`]).
    pub jobs: Option<usize>,
}

/// One installed version that failed a full check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyFailure {
    /// The package.
    pub id: PackageId,
    /// The version.
    pub version: Version,
    /// Its state when it was checked (an enabled one is disabled by the check).
    pub state: guild_domain::lifecycle::State,
    /// The file concerned, relative to the installed tree (`.gkmetadata` for a signature).
    pub file: Option<String>,
    /// What was found.
    pub reason: String,
    /// Whether it is tamper evidence (a changed file or signature) rather than a trust decision
    /// (a revocation, a key no longer trusted).
    pub tampered: bool,
}

/// What [`PackageManager::verify_all`] found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FullCheck {
    /// Installed versions checked.
    pub checked: usize,
    /// Worker threads used.
    pub jobs: usize,
    /// Every version that failed, by id then version.
    pub failures: Vec<VerifyFailure>,
    /// Enabled versions disabled: those that failed and those that depend on them.
    pub disabled: Vec<LeftOut>,
    /// Whether [`FullCheck::disabled`] is recorded in the store (a writer) or only left out of
    /// this process's view (a reader: the load-time check still refuses a changed file).
    pub recorded: bool,
}

/// How to rebuild a trust file that the registry does not recognise (missing, an older copy,
/// another store's, changed by hand, unreadable): the `guild trust reset` command.
///
/// The new trust file keeps every revocation the registry recorded and every revocation of the
/// file found (when it can be read). It trusts no key unless `keep_keys` asks to keep the keys of
/// the file found, except revoked ones; the operator can then `trust add` what is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TrustReset {
    /// Keep the keys that the trust file found trusts (it must be readable).
    pub keep_keys: bool,
}

/// What opening did to the trust file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrustOpened {
    /// The store predates trust binding: its trust file was bound to it at `generation`.
    Bound {
        /// The trust file's generation now.
        generation: u64,
    },
    /// The trust file was rebuilt ([`TrustReset`]).
    Rebuilt {
        /// What was wrong with the file found, or `None` when it was the right one.
        found: Option<String>,
        /// The new trust file's generation.
        generation: u64,
        /// Keys trusted in the new file.
        keys: usize,
        /// Revoked keys in the new file.
        revoked_keys: usize,
        /// Revoked payloads in the new file.
        revoked_payloads: usize,
    },
}

/// An enabled package the loader should open, in dependency order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedPackage {
    /// The package.
    pub id: PackageId,
    /// Its enabled version.
    pub version: Version,
    /// Its installed tree.
    pub dir: PathBuf,
}

/// The enabled packages in load order, and those that cannot load with the reason.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LoadOrder {
    /// What can load, dependencies first.
    pub order: Vec<PlannedPackage>,
    /// Enabled packages whose dependencies are not met (or that sit on a cycle), with why.
    pub blocked: Vec<LeftOut>,
}

/// One installed version, as `list` and `status` show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionSummary {
    /// The version.
    pub version: Version,
    /// Enabled, disabled, superseded or removed.
    pub state: guild_domain::lifecycle::State,
    /// SHA-256 of its canonical unsigned payload.
    pub payload_digest: Sha256Digest,
    /// Why it is tainted, while it is.
    pub taint: Option<Taint>,
    /// The keys whose signatures the store recorded for it after it was installed (a copy
    /// re-signed during a key rotation was installed again), in the order recorded. The
    /// signatures its installed `.gkmetadata` carries are not here: `list` and `status` read
    /// the committed state only; [`PackageManager::metadata`](super::PackageManager::metadata)
    /// answers every signature.
    pub signatures_added: Vec<Sha256Digest>,
    /// The keys whose signatures verified when the version was installed, as the store recorded
    /// them; empty for versions installed before the store recorded them.
    pub signed_by: Vec<Sha256Digest>,
}

/// One package id with all its recorded versions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageSummary {
    /// The package.
    pub id: PackageId,
    /// Kernel plugin or runtime module (the same for every version).
    pub kind: PackageKind,
    /// Its publisher (the same for every version).
    pub publisher: PublisherId,
    /// Every recorded version, removed ones included, in ascending order.
    pub versions: Vec<VersionSummary>,
    /// The enabled version, if any.
    pub enabled: Option<Version>,
    /// The version `rollback` returns to, if any.
    pub previous: Option<Version>,
    /// Session leases on the package. Bindings into loaded code are counted by the kernel
    /// registry; `Host::active_package_leases` adds both.
    pub leases: ActiveLeases,
}

/// What [`PackageManager::refresh`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Refreshed {
    /// The committed generation before and after.
    pub from_generation: u64,
    /// The committed generation now in view.
    pub generation: u64,
    /// Whether the trust file changed (so every loaded version is authenticated again).
    pub trust_changed: bool,
    /// Enabled versions that this process does not load because they failed verification (or
    /// depend on one that did); a reader writes nothing, so they stay enabled in the store.
    pub unusable: Vec<LeftOut>,
}
