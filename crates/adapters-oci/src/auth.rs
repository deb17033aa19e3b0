//! Credentials in the docker/podman `config.json` convention: `{"auths": {"HOST[:PORT]":
//! {"auth": base64("user:password")}}}`, or `username`/`password` members, or a
//! `registrytoken` used as a bearer token. The first file that names the registry wins; none
//! means anonymous access. Credential helpers (`credHelpers`, `credsStore`) are not run.

use std::path::PathBuf;

use base64::Engine;
use serde_json::Value;

/// The credentials found for a registry.
#[derive(Clone, PartialEq, Eq)]
pub enum RegistryAuth {
    /// None found: requests go without, and a token is asked for anonymously.
    Anonymous,
    /// A user and password, sent as Basic authorisation or exchanged for a token.
    Basic(String, String),
    /// A token used as it is (a `registrytoken`).
    Bearer(String),
}

/// Never the secrets themselves.
impl std::fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegistryAuth::Anonymous => f.write_str("Anonymous"),
            RegistryAuth::Basic(user, _) => write!(f, "Basic({user:?}, ***)"),
            RegistryAuth::Bearer(_) => f.write_str("Bearer(***)"),
        }
    }
}

/// Credential files larger than this are not read.
const MAX_AUTH_FILE: u64 = 1 << 20;

/// The credentials for `registry` (`HOST[:PORT]`) from the first file that has them.
pub fn lookup(files: &[PathBuf], registry: &str) -> RegistryAuth {
    files
        .iter()
        .find_map(|f| from_file(f, registry))
        .unwrap_or(RegistryAuth::Anonymous)
}

fn from_file(path: &PathBuf, registry: &str) -> Option<RegistryAuth> {
    let meta = std::fs::metadata(path).ok()?;
    if meta.len() > MAX_AUTH_FILE {
        return None;
    }
    let value: Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    from_config(&value, registry)
}

/// The entry for `registry` in a parsed config, keys with or without a scheme.
pub fn from_config(config: &Value, registry: &str) -> Option<RegistryAuth> {
    let auths = config.get("auths")?.as_object()?;
    let entry = auths.iter().find_map(|(key, v)| {
        let bare = key
            .strip_prefix("https://")
            .or_else(|| key.strip_prefix("http://"))
            .unwrap_or(key);
        let bare = bare
            .strip_suffix("/v2/")
            .or(bare.strip_suffix('/'))
            .unwrap_or(bare);
        (bare == registry).then_some(v)
    })?;
    if let Some(token) = entry.get("registrytoken").and_then(Value::as_str) {
        return Some(RegistryAuth::Bearer(token.to_owned()));
    }
    if let (Some(u), Some(p)) = (
        entry.get("username").and_then(Value::as_str),
        entry.get("password").and_then(Value::as_str),
    ) {
        return Some(RegistryAuth::Basic(u.to_owned(), p.to_owned()));
    }
    let encoded = entry.get("auth").and_then(Value::as_str)?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some(RegistryAuth::Basic(user.to_owned(), password.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_not_shown() {
        let shown = format!(
            "{:?} {:?}",
            RegistryAuth::Basic("alice".into(), "s3cr3t".into()),
            RegistryAuth::Bearer("t0k3n".into())
        );
        assert!(
            !shown.contains("s3cr3t") && !shown.contains("t0k3n"),
            "{shown}"
        );
    }

    #[test]
    fn docker_and_podman_entries_are_read() {
        let config = serde_json::json!({"auths": {
            "https://reg.example:5000": {"auth": "YWxpY2U6czNjcjN0"},
            "plain.example": {"username": "bob", "password": "pw"},
            "tok.example": {"registrytoken": "abc"},
            "broken.example": {"auth": "!!!"},
        }});
        let basic = |u: &str, p: &str| Some(RegistryAuth::Basic(u.into(), p.into()));
        assert_eq!(
            from_config(&config, "reg.example:5000"),
            basic("alice", "s3cr3t")
        );
        assert_eq!(from_config(&config, "plain.example"), basic("bob", "pw"));
        assert_eq!(
            from_config(&config, "tok.example"),
            Some(RegistryAuth::Bearer("abc".into()))
        );
        assert!(from_config(&config, "broken.example").is_none());
        assert!(from_config(&config, "other.example").is_none());
    }
}
