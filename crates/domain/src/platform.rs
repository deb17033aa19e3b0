//! The platform a host is built for, and whether a package's manifest fits it: its OS, its CPU
//! architecture and the Kernel ABI range it supports.

use crate::manifest::{Arch, Manifest, Os};
use crate::version::PackedVersion;

/// What a package must match to be installed here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostPlatform {
    /// The operating system a package's `os` must name.
    pub os: Os,
    /// The CPU architecture a package's `arch` must name.
    pub arch: Arch,
    /// The Kernel ABI this host implements; a package's `kernel_abi` range must contain it.
    pub kernel_abi: PackedVersion,
}

/// Why a package does not fit this host.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlatformMismatch {
    /// The manifest names another operating system.
    #[error("it is built for {found}, and this host runs {host}")]
    Os {
        /// This host's OS, as a manifest spells it.
        host: &'static str,
        /// The manifest's `os`.
        found: &'static str,
    },
    /// The manifest names another CPU architecture.
    #[error("it is built for {found}, and this host is {host}")]
    Arch {
        /// This host's architecture, as a manifest spells it.
        host: &'static str,
        /// The manifest's `arch`.
        found: &'static str,
    },
    /// The manifest's `kernel_abi` range does not contain the host's Kernel ABI.
    #[error("it supports Kernel ABI {range}, and this host implements {host}")]
    KernelAbi {
        /// The Kernel ABI this host implements.
        host: PackedVersion,
        /// The manifest's range, as text.
        range: String,
    },
}

impl HostPlatform {
    /// The platform this binary was built for, or `None` on one that has no manifest spelling.
    /// A fact of the build (its target), not of the machine: no detection happens.
    pub fn current() -> Option<Self> {
        let os = if cfg!(target_os = "linux") {
            Os::Linux
        } else if cfg!(target_os = "windows") {
            Os::Windows
        } else if cfg!(target_os = "macos") {
            Os::Macos
        } else {
            return None;
        };
        let arch = if cfg!(target_arch = "x86_64") {
            Arch::X86_64
        } else if cfg!(target_arch = "aarch64") {
            Arch::Aarch64
        } else {
            return None;
        };
        Some(HostPlatform {
            os,
            arch,
            kernel_abi: PackedVersion::KERNEL_ABI_V1,
        })
    }

    /// Checks a manifest's OS, architecture and Kernel ABI range against this host.
    pub fn check(&self, manifest: &Manifest) -> Result<(), PlatformMismatch> {
        if manifest.os != self.os {
            return Err(PlatformMismatch::Os {
                host: self.os.as_str(),
                found: manifest.os.as_str(),
            });
        }
        if manifest.arch != self.arch {
            return Err(PlatformMismatch::Arch {
                host: self.arch.as_str(),
                found: manifest.arch.as_str(),
            });
        }
        if !manifest.kernel_abi.contains(self.kernel_abi) {
            return Err(PlatformMismatch::KernelAbi {
                host: self.kernel_abi,
                range: manifest.kernel_abi.to_string(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_build_has_a_platform_that_its_own_spelling_matches() {
        let here = HostPlatform::current().expect("the test machines are linux or macos");
        assert_eq!(here.os == Os::Linux, cfg!(target_os = "linux"));
        assert_eq!(here.arch == Arch::X86_64, cfg!(target_arch = "x86_64"));
        assert_eq!(here.kernel_abi, PackedVersion::KERNEL_ABI_V1);
    }
}
