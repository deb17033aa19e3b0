//! Where the adapter's settings come from: the environment, with defaults that suit packages.

use std::path::PathBuf;
use std::time::Duration;

/// Hosts (`HOST` or `HOST:PORT`, comma-separated) reached over plain HTTP. Loopback hosts
/// always are; no other host is unless listed here.
pub const INSECURE_VARIABLE: &str = "GUILD_INSECURE_REGISTRIES";
/// A PEM file of extra root certificates, trusted besides the system's.
pub const CA_FILE_VARIABLE: &str = "GUILD_REGISTRY_CA_FILE";

/// Seconds one exchange (a manifest, a token, a blob; an upload with its answer) may take in
/// all.
pub const DEADLINE_VARIABLE: &str = "GUILD_REGISTRY_DEADLINE_SECONDS";
/// The stall rule, `BYTES/SECONDS`: a download is refused when fewer than BYTES arrive in any
/// SECONDS before it ends, an upload when fewer than BYTES are sent or arrive (`0/…` turns it
/// off).
pub const STALL_VARIABLE: &str = "GUILD_REGISTRY_STALL";

/// Caps on what a registry may make the adapter read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A manifest larger than this is refused (a package's is well under a kilobyte).
    pub manifest_bytes: u64,
    /// A config blob larger than this is refused.
    pub config_bytes: u64,
    /// A package layer larger than this is refused before it is fetched.
    pub layer_bytes: u64,
    /// A document's layer (a fleet root or policy) larger than this is refused before it is
    /// fetched.
    pub document_bytes: u64,
    /// One page of a repository's tag list larger than this is refused.
    pub tags_page_bytes: u64,
    /// How many tags a tag list request asks for per page (`?n=`); the registry may answer
    /// fewer, and then names the next page in a `Link` header.
    pub tags_page_size: u32,
    /// A tag list that runs past this many pages is refused.
    pub tags_pages: u32,
    /// How long connecting may take.
    pub connect_timeout: Duration,
    /// How long a request may wait for its answer, and a read of it for bytes. A layer's
    /// upload is not held to it (reqwest counts it from the request's start, the upload
    /// included); the deadline and the stall rule, counting the bytes sent, bound it instead.
    pub read_timeout: Duration,
    /// A token response larger than this is refused.
    pub token_bytes: u64,
    /// How long one download (a manifest, a token, a blob) or upload (with its answer) may take
    /// in all.
    pub download_deadline: Duration,
    /// A download is stalled, and refused, when fewer than `stall_bytes` arrive in any
    /// `stall_window` before it ends.
    pub stall_bytes: u64,
    pub stall_window: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            manifest_bytes: 256 * 1024,
            config_bytes: 64 * 1024,
            layer_bytes: 16 << 30,
            document_bytes: guild_domain::fleet::MAX_DOCUMENT_BYTES as u64,
            tags_page_bytes: 1 << 20,
            tags_page_size: 1000,
            tags_pages: 100,
            connect_timeout: Duration::from_secs(30),
            read_timeout: Duration::from_secs(120),
            token_bytes: 1 << 20,
            download_deadline: Duration::from_secs(60 * 60),
            stall_bytes: 16 * 1024,
            stall_window: Duration::from_secs(60),
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
    /// A setting from the environment that could not be used: its variable, its value and
    /// why. Every push and pull fails with it rather than run with a limit nobody chose.
    pub invalid: Option<(&'static str, String, &'static str)>,
}

impl OciSettings {
    /// Reads [`INSECURE_VARIABLE`], [`CA_FILE_VARIABLE`] and the credential files that docker
    /// and podman use: `$REGISTRY_AUTH_FILE`, `$XDG_RUNTIME_DIR/containers/auth.json`,
    /// `$DOCKER_CONFIG/config.json` (else `~/.docker/config.json`).
    ///
    /// [`DEADLINE_VARIABLE`] and [`STALL_VARIABLE`] replace the default download deadline and
    /// stall rule.
    pub fn from_environment() -> Self {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        let (limits, invalid) =
            limits_from(|name| var(name).map(|v| v.to_string_lossy().into_owned()));
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
            limits,
            invalid,
        }
    }
}

/// The limits with what the variables `lookup` finds applied; the first unusable one is
/// returned beside them.
#[allow(clippy::type_complexity)]
fn limits_from(
    lookup: impl Fn(&str) -> Option<String>,
) -> (Limits, Option<(&'static str, String, &'static str)>) {
    let mut limits = Limits::default();
    let mut invalid = None;
    if let Some(v) = lookup(DEADLINE_VARIABLE) {
        match v.trim().parse::<u64>() {
            Ok(s) if s > 0 => limits.download_deadline = Duration::from_secs(s),
            _ => {
                invalid = Some((
                    DEADLINE_VARIABLE,
                    v,
                    "not a whole number of seconds above 0",
                ))
            }
        }
    }
    if let Some(v) = lookup(STALL_VARIABLE) {
        let parsed = v.split_once('/').and_then(|(b, s)| {
            Some((b.trim().parse::<u64>().ok()?, s.trim().parse::<u64>().ok()?))
        });
        match parsed {
            Some((bytes, secs)) if secs > 0 => {
                limits.stall_bytes = bytes;
                limits.stall_window = Duration::from_secs(secs);
            }
            _ => {
                invalid = invalid.or(Some((
                    STALL_VARIABLE,
                    v,
                    "not BYTES/SECONDS (whole numbers, SECONDS above 0)",
                )))
            }
        }
    }
    (limits, invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_and_stall_rule_come_from_the_environment() {
        let env = |pairs: Vec<(&'static str, &'static str)>| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let (limits, invalid) = limits_from(env(vec![]));
        assert_eq!((limits, invalid), (Limits::default(), None));
        let (limits, invalid) = limits_from(env(vec![
            (DEADLINE_VARIABLE, "90"),
            (STALL_VARIABLE, "1024/5"),
        ]));
        assert_eq!(invalid, None);
        assert_eq!(limits.download_deadline, Duration::from_secs(90));
        assert_eq!(
            (limits.stall_bytes, limits.stall_window),
            (1024, Duration::from_secs(5))
        );
        for (variable, value) in [
            (DEADLINE_VARIABLE, "0"),
            (DEADLINE_VARIABLE, "ten"),
            (STALL_VARIABLE, "1024"),
            (STALL_VARIABLE, "1024/0"),
            (STALL_VARIABLE, "x/5"),
        ] {
            let (limits, invalid) = limits_from(env(vec![(variable, value)]));
            assert_eq!(limits, Limits::default(), "{value}");
            assert_eq!(
                invalid.map(|(n, v, _)| (n, v)),
                Some((variable, value.to_owned()))
            );
        }
    }
}
