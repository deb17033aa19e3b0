//! What a host lets its runner see of its package manager.

use std::sync::Arc;

use guild_domain::claims::ImplIdConflict;
use guild_domain::ids::PackageId;
use guild_domain::lease::ActiveLeases;
use guild_domain::manifest::Metadata;
use guild_domain::trust::TrustStore;
use guild_domain::version::Version;
use guild_ports::source::Progress;

use super::{LoadOrder, PackageLease, PackageManager, PackageSummary};
use crate::error::HostError;
use guild_domain::platform::HostPlatform;

/// What a `Host` lets its runner see of its package manager
/// (`Host::packages`): the installed packages, their metadata, the trust
/// store and session leases, without the lifecycle changes. Those go through the `Host`
/// (`Host::install`, `Host::disable`, ...) so
/// that the kernel registry takes part in each transaction; a [`PackageManager`] opened on its
/// own (as the `guild` command line does) makes them directly.
#[derive(Debug, Clone, Copy)]
pub struct PackageView<'pm> {
    packages: &'pm PackageManager,
}

impl<'pm> PackageView<'pm> {
    /// The read-only view of `packages`.
    pub fn new(packages: &'pm PackageManager) -> Self {
        PackageView { packages }
    }

    /// Every recorded package with its versions ([`PackageManager::list`]).
    pub fn list(&self) -> Result<Vec<PackageSummary>, HostError> {
        self.packages.list()
    }

    /// Package `id` with its versions ([`PackageManager::summary`]).
    pub fn summary(&self, id: &PackageId) -> Result<Option<PackageSummary>, HostError> {
        self.packages.summary(id)
    }

    /// The signed metadata of an installed version, or what is wrong with its tree
    /// ([`PackageManager::installed_metadata`]).
    pub fn installed_metadata(
        &self,
        id: &PackageId,
        version: &Version,
    ) -> Result<Arc<Metadata>, HostError> {
        self.packages.installed_metadata(id, version)
    }

    /// The signed metadata of an installed version ([`PackageManager::metadata`]).
    pub fn metadata(&self, id: &PackageId, version: &Version) -> Option<Arc<Metadata>> {
        self.packages.metadata(id, version)
    }

    /// The generation of the committed registry ([`PackageManager::generation`]).
    pub fn generation(&self) -> Result<u64, HostError> {
        self.packages.generation()
    }

    /// The enabled packages in dependency order, with those that cannot load and why
    /// ([`PackageManager::load_plan`]).
    pub fn load_plan(&self) -> Result<LoadOrder, HostError> {
        self.packages.load_plan()
    }

    /// The impl ids two recorded packages both hold ([`PackageManager::impl_id_conflicts`]).
    pub fn impl_id_conflicts(&self) -> Result<Vec<ImplIdConflict>, HostError> {
        self.packages.impl_id_conflicts()
    }

    /// The platform packages are checked against.
    pub fn platform(&self) -> &'pm HostPlatform {
        self.packages.platform()
    }

    /// The current trust store ([`PackageManager::trust`]). Change it with
    /// `Host::update_trust`.
    pub fn trust(&self) -> Result<TrustStore, HostError> {
        self.packages.trust()
    }

    /// Takes an explicit session lease on the enabled version of `id`
    /// ([`PackageManager::lease`]): the package stays in place until the lease is dropped.
    pub fn lease(&self, id: &PackageId) -> Result<PackageLease, HostError> {
        self.packages.lease(id)
    }

    /// How many session leases keep `id` in use ([`PackageManager::active_package_leases`]);
    /// `Host::active_package_leases` adds the bindings.
    pub fn active_package_leases(&self, id: &PackageId) -> ActiveLeases {
        self.packages.active_package_leases(id)
    }

    /// Reports the artifact bytes each installation reads to `progress`
    /// ([`PackageManager::set_progress`]).
    pub fn set_progress(&self, progress: Option<Arc<dyn Progress>>) {
        self.packages.set_progress(progress);
    }
}
