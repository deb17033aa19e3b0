//! The adapter's own HTTP for everything a pull reads, and for the token exchange of a push.
//!
//! `oci-client` reads manifests, token responses and error bodies whole before anything can
//! look at their size, and a blob's only time limit is its per-read timeout. Here every body has
//! a bound before it is read (a manifest at [`Limits::manifest_bytes`], a token response at
//! [`Limits::token_bytes`], an error body at [`ERROR_BODY_BYTES`]), every download (each
//! request with its redirects and body) has an overall deadline and a minimum rate, and every
//! URL followed (redirect targets, token realms) obeys the same plain-HTTP rule as the
//! reference's registry.

use std::future::Future;
use std::net::IpAddr;
use std::time::Duration;

use guild_domain::distribution::{OciReference, OciTarget};
use guild_ports::distribution::{DistributionError, DistributionErrorKind as Kind, Part};
use oci_client::secrets::RegistryAuth;
use reqwest::header::{HeaderValue, ACCEPT, LOCATION, WWW_AUTHENTICATE};
use reqwest::{Response, Url};
use serde_json::Value;
use tokio::time::Instant;

use crate::settings::{Limits, OciSettings};

/// How much of an error answer's body is read (for its message); the rest is never read.
pub const ERROR_BODY_BYTES: usize = 64 * 1024;
/// Redirects followed for one request before it counts as a loop.
const MAX_REDIRECTS: usize = 10;

/// Whether `url` may be fetched: HTTPS always; plain HTTP only on a loopback host or one listed
/// in `insecure` (as `HOST` or `HOST:PORT`). Anything else (another scheme) never.
pub fn plain_http_allowed(url: &Url, insecure: &[String]) -> bool {
    match url.scheme() {
        "https" => true,
        "http" => {
            let host = url.host_str().unwrap_or("");
            let bare = host.trim_start_matches('[').trim_end_matches(']');
            let loopback = bare.eq_ignore_ascii_case("localhost")
                || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
            let with_port = url
                .port_or_known_default()
                .map(|p| format!("{host}:{p}"))
                .unwrap_or_default();
            loopback || insecure.iter().any(|h| *h == host || *h == with_port)
        }
        _ => false,
    }
}

/// Whether the registry's Basic credentials go with the token request to `realm`.
///
/// Docker's token protocol sends them to whatever realm the registry's challenge names, and a
/// registry may well keep its token service elsewhere (Docker Hub: `registry-1.docker.io`, realm
/// `auth.docker.io`). The credentials are the registry's own (looked up by its name), so a
/// registry that wanted them could simply ask with a Basic challenge; what a foreign realm adds
/// is a way for whoever forges the challenge to send them elsewhere. Over TLS only the registry
/// can write its challenge, so an HTTPS realm of an HTTPS registry gets them; a challenge
/// received over plain HTTP (a loopback or listed registry) can be forged on the way, so it
/// sends them only back to the registry's own origin. Any other realm gets an anonymous token
/// request.
pub fn credentials_for_realm(registry: &Url, realm: &Url) -> bool {
    registry.origin() == realm.origin()
        || (registry.scheme() == "https" && realm.scheme() == "https")
}

/// How requests to the registry are authorised, as found by [`Http::authenticate`].
#[derive(Clone)]
pub enum Auth {
    None,
    Basic(String, String),
    Bearer(String),
}

impl Auth {
    /// The same authorisation as the distribution client takes it.
    pub fn to_registry_auth(&self) -> RegistryAuth {
        match self {
            Auth::None => RegistryAuth::Anonymous,
            Auth::Basic(u, p) => RegistryAuth::Basic(u.clone(), p.clone()),
            Auth::Bearer(t) => RegistryAuth::Bearer(t.clone()),
        }
    }

    fn apply(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match self {
            Auth::None => request,
            Auth::Basic(u, p) => request.basic_auth(u, Some(p)),
            Auth::Bearer(t) => request.bearer_auth(t),
        }
    }
}

/// One download's clock: the overall deadline and the stall window.
pub struct Watch {
    what: &'static str,
    url: String,
    deadline: Instant,
    limit: Duration,
    /// `None`: stall detection off (no minimum, or no window).
    stall: Option<(u64, Duration)>,
    window_end: Instant,
    window_bytes: u64,
}

impl Watch {
    /// Starts the clock for a download of `what` (as errors name it).
    pub fn start(what: &'static str, limits: &Limits) -> Watch {
        let now = Instant::now();
        let far = |d: Duration| {
            now.checked_add(d)
                .unwrap_or_else(|| now + Duration::from_secs(1 << 30))
        };
        let stall = (limits.stall_bytes > 0 && !limits.stall_window.is_zero())
            .then_some((limits.stall_bytes, limits.stall_window));
        let deadline = far(limits.download_deadline);
        Watch {
            what,
            url: String::new(),
            deadline,
            limit: limits.download_deadline,
            stall,
            window_end: stall.map_or(deadline, |(_, w)| far(w)),
            window_bytes: 0,
        }
    }

    /// Waits for `fut`, failing when the deadline passes or a window ends with too few bytes.
    pub async fn wait<T>(&mut self, fut: impl Future<Output = T>) -> Result<T, Kind> {
        let mut fut = std::pin::pin!(fut);
        loop {
            let wake = self.deadline.min(self.window_end);
            match tokio::time::timeout_at(wake, &mut fut).await {
                Ok(v) => return Ok(v),
                Err(_) => {
                    let now = Instant::now();
                    if now >= self.deadline {
                        return Err(Kind::DeadlineExceeded {
                            what: self.what,
                            url: self.url.clone(),
                            limit: self.limit,
                        });
                    }
                    self.end_window(now)?;
                }
            }
        }
    }

    /// Counts `n` bytes received.
    pub fn received(&mut self, n: usize) -> Result<(), Kind> {
        self.window_bytes += n as u64;
        let now = Instant::now();
        if now >= self.window_end {
            self.end_window(now)?;
        }
        Ok(())
    }

    fn end_window(&mut self, now: Instant) -> Result<(), Kind> {
        let Some((min_bytes, window)) = self.stall else {
            return Ok(());
        };
        if self.window_bytes < min_bytes {
            return Err(Kind::Stalled {
                what: self.what,
                url: self.url.clone(),
                min_bytes,
                window,
            });
        }
        self.window_bytes = 0;
        self.window_end = now.checked_add(window).unwrap_or(self.deadline);
        Ok(())
    }

    /// The URL being fetched, as errors name it.
    pub fn url(&self) -> &str {
        &self.url
    }
}

/// The HTTP client for one reference's registry.
pub struct Http<'a> {
    client: reqwest::Client,
    settings: &'a OciSettings,
    reference: &'a OciReference,
    /// `SCHEME://HOST[:PORT]/` of the registry.
    base: Url,
    repository: String,
}

impl<'a> Http<'a> {
    /// A client for `reference`'s registry, reached at `base` (the scheme already chosen),
    /// for `repository` (as the distribution client spells it).
    pub fn new(
        settings: &'a OciSettings,
        reference: &'a OciReference,
        base: Url,
        repository: String,
        certificates: Vec<reqwest::Certificate>,
    ) -> Result<Http<'a>, DistributionError> {
        let client = reqwest::Client::builder()
            // Redirects are followed here, each target checked.
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(settings.limits.connect_timeout)
            .read_timeout(settings.limits.read_timeout)
            .tls_certs_merge(certificates)
            .user_agent(concat!("guild/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| {
                DistributionError::new(
                    Kind::Insecure {
                        reason: "the TLS client cannot be set up".into(),
                    },
                    reference,
                )
                .with_source(e)
            })?;
        Ok(Http {
            client,
            settings,
            reference,
            base,
            repository,
        })
    }

    fn fail(&self, kind: Kind) -> DistributionError {
        DistributionError::new(kind, self.reference)
    }

    fn limits(&self) -> &Limits {
        &self.settings.limits
    }

    fn url(&self, path: &str) -> Result<Url, DistributionError> {
        self.base.join(path).map_err(|e| {
            self.fail(Kind::Malformed {
                part: Part::Manifest,
                reason: format!("no URL can be made for {path}: {e}"),
            })
        })
    }

    /// GETs `url`, following redirects (each target under the plain-HTTP rule; `auth` only to
    /// `auth_origin`'s origin), all within `watch`. Any status is returned.
    async fn get(
        &self,
        mut url: Url,
        accept: Option<&str>,
        (auth, auth_origin): (&Auth, &Url),
        watch: &mut Watch,
    ) -> Result<Response, DistributionError> {
        for _ in 0..=MAX_REDIRECTS {
            if !plain_http_allowed(&url, &self.settings.insecure) {
                return Err(self.fail(Kind::Insecure {
                    reason: format!(
                        "refusing {url}: plain HTTP is used only for loopback hosts and those \
                         listed in {}",
                        crate::settings::INSECURE_VARIABLE
                    ),
                }));
            }
            watch.url = url.to_string();
            let mut request = self.client.get(url.clone());
            if let Some(a) = accept {
                request = request.header(ACCEPT, a);
            }
            if url.origin() == auth_origin.origin() {
                request = auth.apply(request);
            }
            let response = watch
                .wait(request.send())
                .await
                .map_err(|k| self.fail(k))?
                .map_err(|e| self.transport(e))?;
            let redirect = matches!(response.status().as_u16(), 301 | 302 | 303 | 307 | 308);
            let location = response
                .headers()
                .get(LOCATION)
                .and_then(|l| l.to_str().ok());
            match (redirect, location) {
                (true, Some(location)) => {
                    url = url.join(location).map_err(|e| {
                        self.fail(Kind::Transport {
                            reason: format!("the registry redirected to {location:?}: {e}"),
                        })
                    })?;
                }
                _ => return Ok(response),
            }
        }
        Err(self.fail(Kind::RedirectLoop))
    }

    fn transport(&self, e: reqwest::Error) -> DistributionError {
        let reason = if e.is_connect() {
            "cannot connect"
        } else if e.is_timeout() {
            "timed out"
        } else {
            "the HTTP exchange failed"
        };
        self.fail(Kind::Transport {
            reason: reason.into(),
        })
        .with_source(e)
    }

    /// The typed error for a status that is not success, reading at most
    /// [`ERROR_BODY_BYTES`] of its body for the message.
    async fn status_error(&self, mut response: Response, watch: &mut Watch) -> DistributionError {
        let status = response.status().as_u16();
        let mut body = Vec::new();
        // The body only decorates the error: a read that fails or runs out of time ends it.
        while body.len() < ERROR_BODY_BYTES {
            match watch.wait(response.chunk()).await {
                Ok(Ok(Some(chunk))) => {
                    let room = ERROR_BODY_BYTES - body.len();
                    body.extend_from_slice(&chunk[..chunk.len().min(room)]);
                    if watch.received(chunk.len()).is_err() {
                        break;
                    }
                }
                _ => break,
            }
        }
        let codes: Vec<String> = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| {
                v.get("errors")?.as_array().map(|errors| {
                    errors
                        .iter()
                        .filter_map(|e| e.get("code")?.as_str().map(str::to_owned))
                        .collect()
                })
            })
            .unwrap_or_default();
        let unauthorized = Kind::Unauthorized {
            registry: self.reference.registry().to_owned(),
            status,
        };
        let kind = match status {
            401 | 403 => unauthorized,
            404 => Kind::NotFound,
            _ if codes.iter().any(|c| c.ends_with("_UNKNOWN")) => Kind::NotFound,
            _ if codes.iter().any(|c| c == "UNAUTHORIZED" || c == "DENIED") => unauthorized,
            _ => Kind::Registry {
                status,
                message: String::from_utf8_lossy(&body).chars().take(200).collect(),
            },
        };
        self.fail(kind)
    }

    /// Reads a whole body of at most `limit` bytes, within `watch`.
    async fn read_capped(
        &self,
        mut response: Response,
        limit: u64,
        watch: &mut Watch,
    ) -> Result<Vec<u8>, DistributionError> {
        let too_large = |watch: &Watch| {
            self.fail(Kind::ResponseTooLarge {
                what: watch.what,
                url: watch.url().to_owned(),
                limit,
            })
        };
        if response.content_length().is_some_and(|l| l > limit) {
            return Err(too_large(watch));
        }
        let mut body = Vec::new();
        while let Some(chunk) = watch
            .wait(response.chunk())
            .await
            .map_err(|k| self.fail(k))?
            .map_err(|e| self.transport(e))?
        {
            if (body.len() + chunk.len()) as u64 > limit {
                return Err(too_large(watch));
            }
            body.extend_from_slice(&chunk);
            watch.received(chunk.len()).map_err(|k| self.fail(k))?;
        }
        Ok(body)
    }

    /// Finds how the registry wants requests for `scope` (`pull` or `pull,push`) authorised,
    /// exchanging `credentials` for a Bearer token when it asks for one.
    pub async fn authenticate(
        &self,
        credentials: &RegistryAuth,
        actions: &str,
    ) -> Result<Auth, DistributionError> {
        let basic = match credentials {
            // A `registrytoken` is used as the Bearer token itself.
            RegistryAuth::Bearer(t) => return Ok(Auth::Bearer(t.clone())),
            RegistryAuth::Basic(u, p) => Some((u.clone(), p.clone())),
            RegistryAuth::Anonymous => None,
        };
        let or_basic = || match &basic {
            Some((u, p)) => Auth::Basic(u.clone(), p.clone()),
            None => Auth::None,
        };
        let mut watch = Watch::start("registry's API root", self.limits());
        let root = self.url("v2/")?;
        let response = self
            .get(root, None, (&Auth::None, &self.base), &mut watch)
            .await?;
        let challenge = response
            .headers()
            .get_all(WWW_AUTHENTICATE)
            .iter()
            .find_map(bearer_challenge);
        // The root's body is not read.
        drop(response);
        let Some(challenge) = challenge else {
            return Ok(or_basic());
        };
        let mut realm = Url::parse(&challenge.realm).map_err(|e| {
            self.fail(Kind::Transport {
                reason: format!("the token realm {:?} is not a URL: {e}", challenge.realm),
            })
        })?;
        realm.query_pairs_mut().append_pair(
            "scope",
            &format!("repository:{}:{actions}", self.repository),
        );
        if let Some(service) = &challenge.service {
            realm.query_pairs_mut().append_pair("service", service);
        }
        let to_realm = if credentials_for_realm(&self.base, &realm) {
            or_basic()
        } else {
            Auth::None
        };
        let mut watch = Watch::start("token response", self.limits());
        // Credentials (if any) go to the realm's origin, never on to where it redirects.
        let response = self
            .get(realm.clone(), None, (&to_realm, &realm), &mut watch)
            .await?;
        if !response.status().is_success() {
            return Err(self.status_error(response, &mut watch).await);
        }
        let body = self
            .read_capped(response, self.limits().token_bytes, &mut watch)
            .await?;
        let token = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| {
                v.get("token")
                    .or_else(|| v.get("access_token"))?
                    .as_str()
                    .map(str::to_owned)
            })
            .ok_or_else(|| {
                self.fail(Kind::Transport {
                    reason: format!("the token response at {} has no token", watch.url()),
                })
            })?;
        Ok(Auth::Bearer(token))
    }

    /// The manifest `target` names, read whole within [`Limits::manifest_bytes`].
    pub async fn manifest(
        &self,
        target: &OciTarget,
        accept: &str,
        auth: &Auth,
    ) -> Result<Vec<u8>, DistributionError> {
        let name = match target {
            OciTarget::Tag(t) => t.clone(),
            OciTarget::Digest(d) => format!("sha256:{}", d.to_hex()),
        };
        let url = self.url(&format!("v2/{}/manifests/{name}", self.repository))?;
        let mut watch = Watch::start("manifest", self.limits());
        let response = self
            .get(url, Some(accept), (auth, &self.base), &mut watch)
            .await?;
        if !response.status().is_success() {
            return Err(self.status_error(response, &mut watch).await);
        }
        self.read_capped(response, self.limits().manifest_bytes, &mut watch)
            .await
    }

    /// Starts the download of the blob `digest` (`sha256:HEX`) for `part`: the response (a
    /// success status) and the watch its body is read under.
    pub async fn blob(
        &self,
        digest: &str,
        part: Part,
        auth: &Auth,
    ) -> Result<(Response, Watch), DistributionError> {
        let url = self.url(&format!("v2/{}/blobs/{digest}", self.repository))?;
        let mut watch = Watch::start(part_name(part), self.limits());
        let response = self.get(url, None, (auth, &self.base), &mut watch).await?;
        if !response.status().is_success() {
            return Err(self.status_error(response, &mut watch).await);
        }
        Ok((response, watch))
    }

    /// The next piece of a blob's body, within its watch.
    pub async fn next_chunk(
        &self,
        response: &mut Response,
        watch: &mut Watch,
    ) -> Result<Option<bytes::Bytes>, DistributionError> {
        let chunk = watch
            .wait(response.chunk())
            .await
            .map_err(|k| self.fail(k))?
            .map_err(|e| self.transport(e))?;
        if let Some(c) = &chunk {
            watch.received(c.len()).map_err(|k| self.fail(k))?;
        }
        Ok(chunk)
    }
}

/// A part's name as [`Part`]'s `Display` writes it, for the errors that carry a name.
fn part_name(part: Part) -> &'static str {
    match part {
        Part::Manifest => "manifest",
        Part::Config => "config",
        Part::Layer => "package layer",
    }
}

struct BearerChallenge {
    realm: String,
    service: Option<String>,
}

/// The realm and service of a `Bearer` challenge (`Bearer realm="…",service="…",…`).
fn bearer_challenge(header: &HeaderValue) -> Option<BearerChallenge> {
    let text = header.to_str().ok()?.trim();
    let (scheme, rest) = text.split_once(char::is_whitespace)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let params = challenge_params(rest);
    let get = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    Some(BearerChallenge {
        realm: get("realm")?,
        service: get("service"),
    })
}

/// `key=value` or `key="quoted \" value"` pairs, comma-separated.
fn challenge_params(mut rest: &str) -> Vec<(String, String)> {
    let mut params = Vec::new();
    loop {
        rest = rest.trim_start_matches(|c: char| c == ',' || c.is_whitespace());
        let Some((key, after)) = rest.split_once('=') else {
            return params;
        };
        let key = key.trim().to_owned();
        let after = after.trim_start();
        let mut value = String::new();
        if let Some(quoted) = after.strip_prefix('"') {
            let mut chars = quoted.char_indices();
            let mut end = quoted.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, n)) = chars.next() {
                            value.push(n);
                        }
                    }
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    c => value.push(c),
                }
            }
            rest = &quoted[end..];
        } else {
            let end = after.find(',').unwrap_or(after.len());
            value.push_str(after[..end].trim());
            rest = &after[end..];
        }
        params.push((key, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    #[test]
    fn every_followed_url_obeys_the_plain_http_rule() {
        let listed = vec!["lab.example:5000".to_owned(), "cache.example".to_owned()];
        for (u, allowed) in [
            ("https://anywhere.example/x", true),
            ("http://127.0.0.1:5000/x", true),
            ("http://127.1.2.3/x", true),
            ("http://localhost/x", true),
            ("http://[::1]:8080/x", true),
            ("http://lab.example:5000/x", true),
            ("http://lab.example:5001/x", false),
            ("http://cache.example/x", true),
            ("http://cache.example:8080/x", true),
            ("http://blobs.example/x", false),
            ("http://127.example.com/x", false),
            ("http://10.0.0.1/x", false),
            ("ftp://127.0.0.1/x", false),
            ("file:///etc/passwd", false),
        ] {
            assert_eq!(plain_http_allowed(&url(u), &listed), allowed, "{u}");
        }
        assert!(!plain_http_allowed(&url("http://lab.example:5000/x"), &[]));
    }

    #[test]
    fn basic_credentials_go_to_a_foreign_realm_only_over_tls_from_a_tls_registry() {
        for (registry, realm, sent) in [
            ("https://reg.example/", "https://reg.example/token", true),
            (
                "https://registry-1.docker.io/",
                "https://auth.docker.io/token",
                true,
            ),
            ("https://reg.example/", "http://reg.example/token", false),
            (
                "http://127.0.0.1:5000/",
                "http://127.0.0.1:5000/token",
                true,
            ),
            (
                "http://127.0.0.1:5000/",
                "http://127.0.0.1:5001/token",
                false,
            ),
            (
                "http://127.0.0.1:5000/",
                "https://auth.example/token",
                false,
            ),
            ("http://lab.example/", "http://evil.example/token", false),
            (
                "https://reg.example:443/",
                "https://reg.example/token",
                true,
            ),
        ] {
            assert_eq!(
                credentials_for_realm(&url(registry), &url(realm)),
                sent,
                "{registry} -> {realm}"
            );
        }
    }

    #[test]
    fn bearer_challenges_are_parsed() {
        let c = bearer_challenge(&HeaderValue::from_static(
            r#"Bearer realm="https://auth.example/token",service="reg \"x\"",scope="repository:a:pull""#,
        ))
        .unwrap();
        assert_eq!(c.realm, "https://auth.example/token");
        assert_eq!(c.service.as_deref(), Some("reg \"x\""));
        let c = bearer_challenge(&HeaderValue::from_static(
            "bearer realm=https://a.example/t",
        ))
        .unwrap();
        assert_eq!((c.realm.as_str(), c.service), ("https://a.example/t", None));
        assert!(bearer_challenge(&HeaderValue::from_static(r#"Basic realm="x""#)).is_none());
        assert!(bearer_challenge(&HeaderValue::from_static(r#"Bearer service="x""#)).is_none());
    }
}
