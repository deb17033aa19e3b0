//! Where the adapter's settings come from: the environment, with defaults that suit packages.

use std::path::PathBuf;
use std::time::Duration;

/// Hosts (`HOST` or `HOST:PORT`, comma-separated) reached over plain HTTP. Loopback hosts
/// always are; no other host is unless listed here.
pub const INSECURE_VARIABLE: &str = "GUILD_INSECURE_REGISTRIES";
/// A PEM file of extra root certificates, trusted besides the system's.
pub const CA_FILE_VARIABLE: &str = "GUILD_REGISTRY_CA_FILE";

/// Caps on what a registry may make the adapter read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A manifest larger than this is refused (a package's is well under a kilobyte).
    pub manifest_bytes: u64,
    /// A config blob larger than this is refused.
    pub config_bytes: u64,
    /// A package layer larger than this is refused before it is fetched.
    pub layer_bytes: u64,
    /// How long connecting may take.
    pub connect_timeout: Duration,
    /// How long a read may wait for bytes.
    pub read_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            manifest_bytes: 256 * 1024,
            config_bytes: 64 * 1024,
            layer_bytes: 16 << 30,
            connect_timeout: Duration::from_secs(30),
            read_timeout: Duration::from_secs(120),
        }
    }
}

/// The adapter's settings.
#[derive(Debug, Clone, Default)]
pub struct OciSettings {
    /// Registries reached over plain HTTP besides loopback ones.
    pub insecure: Vec<String>,
    /// Extra root certificates (PEM).
    pub ca_file: Option<PathBuf>,
    /// Credential files in the docker/podman `config.json` format, searched in order.
    pub auth_files: Vec<PathBuf>,
    pub limits: Limits,
}

impl OciSettings {
    /// Reads [`INSECURE_VARIABLE`], [`CA_FILE_VARIABLE`] and the credential files that docker
    /// and podman use: `$REGISTRY_AUTH_FILE`, `$XDG_RUNTIME_DIR/containers/auth.json`,
    /// `$DOCKER_CONFIG/config.json` (else `~/.docker/config.json`).
    pub fn from_environment() -> Self {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        let insecure = var(INSECURE_VARIABLE)
            .map(|v| {
                v.to_string_lossy()
                    .split(',')
                    .map(|h| h.trim().to_owned())
                    .filter(|h| !h.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let mut auth_files = Vec::new();
        if let Some(f) = var("REGISTRY_AUTH_FILE") {
            auth_files.push(PathBuf::from(f));
        }
        if let Some(d) = var("XDG_RUNTIME_DIR") {
            auth_files.push(PathBuf::from(d).join("containers/auth.json"));
        }
        match var("DOCKER_CONFIG") {
            Some(d) => auth_files.push(PathBuf::from(d).join("config.json")),
            None => {
                if let Some(home) = var("HOME") {
                    auth_files.push(PathBuf::from(home).join(".docker/config.json"));
                }
            }
        }
        OciSettings {
            insecure,
            ca_file: var(CA_FILE_VARIABLE).map(PathBuf::from),
            auth_files,
            limits: Limits::default(),
        }
    }
}
