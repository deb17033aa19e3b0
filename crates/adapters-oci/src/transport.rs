//! The adapter's HTTP: every request of a pull, of a push and of the token exchange.
//!
//! A registry is untrusted, so nothing it sends is read without a bound chosen first: a
//! manifest at [`Limits::manifest_bytes`], a token response at [`Limits::token_bytes`], an error
//! body at [`ERROR_BODY_BYTES`]; the answers to uploads, which say nothing the push needs beyond
//! their status and headers, not at all. Every exchange (a request with its redirects, its body
//! sent and its answer read) has an overall deadline and a minimum rate ([`Watch`]), and every
//! URL followed (redirect targets, token realms, upload sessions) obeys the same plain-HTTP rule
//! as the reference's registry.

use std::future::Future;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use guild_domain::distribution::{OciReference, OciTarget};
use guild_ports::distribution::{DistributionError, DistributionErrorKind as Kind, Part};
use reqwest::header::{
    HeaderMap, HeaderName, HeaderValue, ACCEPT, CONTENT_LENGTH, CONTENT_TYPE, LINK, LOCATION,
    WWW_AUTHENTICATE,
};
use reqwest::{Method, Response, Url};
use serde_json::Value;
use tokio::time::Instant;

use crate::auth::RegistryAuth;
use crate::settings::{Limits, OciSettings};

/// How much of an error answer's body is read (for its message); the rest is never read.
pub const ERROR_BODY_BYTES: usize = 64 * 1024;
/// The header in which a registry names the digest of what it stored.
const DOCKER_CONTENT_DIGEST: &str = "docker-content-digest";
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
    /// Bytes sent (an upload's body, counted as it is read), and how many of them the stall
    /// rule has seen: they count as progress as much as bytes received.
    sent: Option<(Arc<AtomicU64>, u64)>,
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
            sent: None,
        }
    }

    /// The same watch, with the bytes `sent` counts (an upload's body) counted as progress.
    pub fn counting_sent(mut self, sent: Arc<AtomicU64>) -> Watch {
        let seen = sent.load(Ordering::Relaxed);
        self.sent = Some((sent, seen));
        self
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
        if let Some((sent, seen)) = &mut self.sent {
            let now = sent.load(Ordering::Relaxed);
            self.window_bytes += now.saturating_sub(*seen);
            *seen = now;
        }
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

/// What a request sends.
pub enum Payload {
    /// Nothing.
    Empty,
    /// These bytes, which a 307 or 308 redirect sends again.
    Bytes(bytes::Bytes),
    /// A body read as it is sent (an upload from a file), once: a redirect is not followed.
    Stream(Option<reqwest::Body>),
}

/// The HTTP client for one reference's registry. Cloning it is cheap and shares its connection
/// pool.
#[derive(Clone)]
pub struct Http {
    client: reqwest::Client,
    /// The client of streamed uploads: without the per-read timeout, which reqwest counts from
    /// the start of the request to its answer's head, so that it would end an upload that
    /// takes longer however steadily it goes. The watch's stall rule and deadline, which count
    /// the bytes sent, bound it instead.
    upload_client: reqwest::Client,
    settings: Arc<OciSettings>,
    reference: OciReference,
    /// `SCHEME://HOST[:PORT]/` of the registry.
    base: Url,
    repository: String,
}

impl Http {
    /// A client for `reference`'s registry, reached at `base` (the scheme already chosen),
    /// for `repository` (as the distribution client spells it).
    pub fn new(
        settings: &OciSettings,
        reference: &OciReference,
        base: Url,
        repository: String,
        certificates: Vec<reqwest::Certificate>,
    ) -> Result<Http, DistributionError> {
        let build = |read_timeout: Option<Duration>| {
            let mut builder = reqwest::Client::builder()
                // Redirects are followed here, each target checked.
                .redirect(reqwest::redirect::Policy::none())
                .connect_timeout(settings.limits.connect_timeout)
                .tls_certs_merge(certificates.iter().cloned())
                .user_agent(concat!("guild/", env!("CARGO_PKG_VERSION")));
            if let Some(t) = read_timeout {
                builder = builder.read_timeout(t);
            }
            builder.build().map_err(|e| {
                DistributionError::new(
                    Kind::Insecure {
                        reason: "the TLS client cannot be set up".into(),
                    },
                    reference,
                )
                .with_source(e)
            })
        };
        let client = build(Some(settings.limits.read_timeout))?;
        let upload_client = build(None)?;
        Ok(Http {
            client,
            upload_client,
            settings: Arc::new(settings.clone()),
            reference: reference.clone(),
            base,
            repository,
        })
    }

    fn fail(&self, kind: Kind) -> DistributionError {
        DistributionError::new(kind, &self.reference)
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
        url: Url,
        accept: Option<&str>,
        auth: (&Auth, &Url),
        watch: &mut Watch,
    ) -> Result<Response, DistributionError> {
        let headers: Vec<(HeaderName, &str)> = accept.map(|a| (ACCEPT, a)).into_iter().collect();
        self.send(Method::GET, url, &headers, Payload::Empty, auth, watch)
            .await
    }

    /// Refuses `url` unless the plain-HTTP rule allows it.
    fn check_allowed(&self, url: &Url) -> Result<(), DistributionError> {
        if plain_http_allowed(url, &self.settings.insecure) {
            return Ok(());
        }
        Err(self.fail(Kind::Insecure {
            reason: format!(
                "refusing {url}: plain HTTP is used only for loopback hosts and those listed in {}",
                crate::settings::INSECURE_VARIABLE
            ),
        }))
    }

    /// Sends `method` to `url` with `headers` and `payload`, following redirects (each target
    /// under the plain-HTTP rule; `auth` only to `auth_origin`'s origin), all within `watch`.
    /// Any status is returned. A GET or HEAD follows every redirect; another method only a 307
    /// or 308 (which keep the method and the body), and only with a payload it can send again.
    async fn send(
        &self,
        method: Method,
        mut url: Url,
        headers: &[(HeaderName, &str)],
        mut payload: Payload,
        (auth, auth_origin): (&Auth, &Url),
        watch: &mut Watch,
    ) -> Result<Response, DistributionError> {
        let client = match payload {
            Payload::Stream(..) => &self.upload_client,
            _ => &self.client,
        };
        let any_redirect = method == Method::GET || method == Method::HEAD;
        for _ in 0..=MAX_REDIRECTS {
            self.check_allowed(&url)?;
            watch.url = url.to_string();
            let mut request = client.request(method.clone(), url.clone());
            for (name, value) in headers {
                request = request.header(name, *value);
            }
            if url.origin() == auth_origin.origin() {
                request = auth.apply(request);
            }
            let resendable = match &mut payload {
                Payload::Empty => true,
                Payload::Bytes(b) => {
                    request = request.body(b.clone());
                    true
                }
                Payload::Stream(body) => {
                    if let Some(body) = body.take() {
                        request = request.body(body);
                    }
                    false
                }
            };
            let response = watch
                .wait(request.send())
                .await
                .map_err(|k| self.fail(k))?
                .map_err(|e| self.transport(e))?;
            let redirect = match response.status().as_u16() {
                301..=303 => any_redirect,
                307 | 308 => resendable,
                _ => false,
            };
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
        if e.is_connect() {
            // No connection was made (refused, a name that does not resolve, a connect
            // timeout): the caller may try again, which it may not after a failed exchange.
            let reason = if e.is_timeout() {
                "connecting timed out"
            } else {
                "cannot connect"
            };
            return self
                .fail(Kind::Unreachable {
                    reason: reason.into(),
                })
                .with_source(e);
        }
        let reason = if e.is_timeout() {
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
        let url = self.url(&format!(
            "v2/{}/manifests/{}",
            self.repository,
            target_name(target)
        ))?;
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

    /// The first page of the repository's tag list: `v2/NAME/tags/list?n=PAGE_SIZE`.
    pub fn tags_url(&self) -> Result<Url, DistributionError> {
        let mut url = self.url(&format!("v2/{}/tags/list", self.repository))?;
        url.query_pairs_mut()
            .append_pair("n", &self.limits().tags_page_size.to_string());
        Ok(url)
    }

    /// One page of the tag list at `url`, read whole within [`Limits::tags_page_bytes`], and
    /// the next page's URL, from the answer's `Link: <URL>; rel="next"` resolved against the
    /// URL that answered. A next page that is not this repository's tag list on the registry's
    /// own origin is refused: the registry names where its pages are, not where this client
    /// goes (and where its credentials go).
    pub async fn tags_page(
        &self,
        url: Url,
        auth: &Auth,
    ) -> Result<(Vec<u8>, Option<Url>), DistributionError> {
        let mut watch = Watch::start("tag list", self.limits());
        let response = self
            .get(
                url,
                Some("application/json"),
                (auth, &self.base),
                &mut watch,
            )
            .await?;
        if !response.status().is_success() {
            return Err(self.status_error(response, &mut watch).await);
        }
        let next = match next_link(response.headers()) {
            None => None,
            Some(link) => Some(self.next_page(response.url(), &link)?),
        };
        let body = self
            .read_capped(response, self.limits().tags_page_bytes, &mut watch)
            .await?;
        Ok((body, next))
    }

    /// The next page `link` names, resolved against `answered`, if it is this repository's tag
    /// list on the registry's origin.
    fn next_page(&self, answered: &Url, link: &str) -> Result<Url, DistributionError> {
        let refused = |why: String| {
            self.fail(Kind::Malformed {
                part: Part::Tags,
                reason: format!("the next page's Link {:?} {why}", clip(link)),
            })
        };
        let next = answered
            .join(link)
            .map_err(|e| refused(format!("is not a URL: {e}")))?;
        let path = format!("/v2/{}/tags/list", self.repository);
        if next.origin() != self.base.origin() || next.path() != path {
            return Err(refused(format!(
                "leaves the tag list at {}{}",
                self.base.as_str().trim_end_matches('/'),
                path
            )));
        }
        Ok(next)
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

    /// Whether the registry has the blob `digest` (`sha256:HEX`): a HEAD answered with success
    /// (it has) or 404 (it has not); any other answer is its error.
    pub async fn has_blob(&self, digest: &str, auth: &Auth) -> Result<bool, DistributionError> {
        let url = self.url(&format!("v2/{}/blobs/{digest}", self.repository))?;
        let mut watch = Watch::start("blob check", self.limits());
        let response = self
            .send(
                Method::HEAD,
                url,
                &[],
                Payload::Empty,
                (auth, &self.base),
                &mut watch,
            )
            .await?;
        match response.status().as_u16() {
            404 => Ok(false),
            s if (200..300).contains(&s) => Ok(true),
            _ => Err(self.status_error(response, &mut watch).await),
        }
    }

    /// Opens an upload session and returns the URL its blob goes to: the answer's Location,
    /// resolved against the request's URL and held to the plain-HTTP rule before anything is
    /// sent there.
    pub async fn start_upload(&self, auth: &Auth) -> Result<Url, DistributionError> {
        let url = self.url(&format!("v2/{}/blobs/uploads/", self.repository))?;
        let mut watch = Watch::start("upload session", self.limits());
        let response = self
            .send(
                Method::POST,
                url,
                &[(CONTENT_LENGTH, "0")],
                Payload::Bytes(bytes::Bytes::new()),
                (auth, &self.base),
                &mut watch,
            )
            .await?;
        if !response.status().is_success() {
            return Err(self.status_error(response, &mut watch).await);
        }
        let status = response.status().as_u16();
        let location = response
            .headers()
            .get(LOCATION)
            .and_then(|l| l.to_str().ok())
            .ok_or_else(|| {
                self.fail(Kind::Registry {
                    status,
                    message: format!("the upload session at {} has no Location", watch.url()),
                })
            })?;
        let session = response.url().join(location).map_err(|e| {
            self.fail(Kind::Registry {
                status,
                message: format!(
                    "the upload session's Location {:?} is not a URL: {e}",
                    clip(location)
                ),
            })
        })?;
        // The answer's body says nothing a push needs: it is not read.
        drop(response);
        self.check_allowed(&session)?;
        Ok(session)
    }

    /// Completes the upload session `session` with the whole blob `digest` (`sha256:HEX`) in
    /// one PUT of `size` bytes of `payload`, and checks the registry's answer (see
    /// [`Http::stored`]). The exchange runs under a watch named `what`, which counts the bytes
    /// `sent` counts (as a streamed payload is read) besides those received.
    #[allow(clippy::too_many_arguments)]
    pub async fn put_blob(
        &self,
        mut session: Url,
        digest: &str,
        size: u64,
        payload: Payload,
        (what, sent): (&'static str, Option<Arc<AtomicU64>>),
        part: Part,
        auth: &Auth,
    ) -> Result<(), DistributionError> {
        session.query_pairs_mut().append_pair("digest", digest);
        let mut watch = Watch::start(what, self.limits());
        if let Some(sent) = sent {
            watch = watch.counting_sent(sent);
        }
        let length = size.to_string();
        let headers = [
            (CONTENT_TYPE, "application/octet-stream"),
            (CONTENT_LENGTH, length.as_str()),
        ];
        let response = self
            .send(
                Method::PUT,
                session,
                &headers,
                payload,
                (auth, &self.base),
                &mut watch,
            )
            .await?;
        self.stored(response, digest, part, &mut watch).await
    }

    /// PUTs the manifest `body` (of digest `digest`, `sha256:HEX`) at `target`, with its media
    /// type, and checks the registry's answer (see [`Http::stored`]).
    pub async fn put_manifest(
        &self,
        target: &OciTarget,
        body: bytes::Bytes,
        (media_type, digest): (&str, &str),
        auth: &Auth,
    ) -> Result<(), DistributionError> {
        let url = self.url(&format!(
            "v2/{}/manifests/{}",
            self.repository,
            target_name(target)
        ))?;
        let mut watch = Watch::start("manifest upload", self.limits());
        let length = body.len().to_string();
        let headers = [
            (CONTENT_TYPE, media_type),
            (CONTENT_LENGTH, length.as_str()),
        ];
        let response = self
            .send(
                Method::PUT,
                url,
                &headers,
                Payload::Bytes(body),
                (auth, &self.base),
                &mut watch,
            )
            .await?;
        self.stored(response, digest, Part::Manifest, &mut watch)
            .await
    }

    /// The answer to an upload: a success status, and, where the registry names the digest it
    /// stored (`Docker-Content-Digest`, when it is a `sha256:` one), `digest`, the digest of
    /// what was sent. Its body says nothing more and is not read.
    async fn stored(
        &self,
        response: Response,
        digest: &str,
        part: Part,
        watch: &mut Watch,
    ) -> Result<(), DistributionError> {
        if !response.status().is_success() {
            return Err(self.status_error(response, watch).await);
        }
        let named = response
            .headers()
            .get(DOCKER_CONTENT_DIGEST)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|d| d.starts_with("sha256:"));
        if let Some(named) = named {
            if !named.eq_ignore_ascii_case(digest) {
                let part = part_name(part);
                return Err(self.fail(Kind::Registry {
                    status: response.status().as_u16(),
                    message: format!(
                        "it names the {part} it stored {}, but the {part} sent is {digest}",
                        clip(named)
                    ),
                }));
            }
        }
        Ok(())
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

/// The target of the `Link` whose `rel` is `next` (RFC 8288: `<URL>; rel="next"`, several
/// links comma-separated, in one header or several), as written.
fn next_link(headers: &HeaderMap) -> Option<String> {
    for value in headers.get_all(LINK) {
        let Ok(mut rest) = value.to_str() else {
            continue;
        };
        while let Some(start) = rest.find('<') {
            let after = &rest[start + 1..];
            let end = after.find('>')?;
            let target = &after[..end];
            let params = &after[end + 1..];
            let params_end = params.find('<').unwrap_or(params.len());
            let is_next = params[..params_end].split(';').any(|p| {
                p.split_once('=').is_some_and(|(k, v)| {
                    k.trim().eq_ignore_ascii_case("rel")
                        && v.trim()
                            .trim_matches('"')
                            .split_whitespace()
                            .any(|r| r.eq_ignore_ascii_case("next"))
                })
            });
            if is_next {
                return Some(target.to_owned());
            }
            rest = &params[params_end..];
        }
    }
    None
}

/// A tag, or a digest as `sha256:HEX`: how a manifest's URL names it.
fn target_name(target: &OciTarget) -> String {
    match target {
        OciTarget::Tag(t) => t.clone(),
        OciTarget::Digest(d) => format!("sha256:{}", d.to_hex()),
    }
}

/// At most 200 characters of a text the registry sent, for a message.
fn clip(text: &str) -> String {
    text.chars().take(200).collect()
}

/// A part's name as [`Part`]'s `Display` writes it, for the errors that carry a name.
fn part_name(part: Part) -> &'static str {
    match part {
        Part::Manifest => "manifest",
        Part::Config => "config",
        Part::Layer => "package layer",
        Part::Document => "document",
        Part::Tags => "tag list",
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
    fn the_next_page_is_the_link_whose_rel_is_next() {
        let headers = |values: &[&str]| {
            let mut h = HeaderMap::new();
            for v in values {
                h.append(LINK, HeaderValue::from_str(v).unwrap());
            }
            h
        };
        for (values, next) in [
            (
                vec![r#"</v2/a/tags/list?n=2&last=b>; rel="next""#],
                Some("/v2/a/tags/list?n=2&last=b"),
            ),
            (
                vec![r#"<https://x/prev>; rel="prev", </v2/a/tags/list?last=c>; rel=next"#],
                Some("/v2/a/tags/list?last=c"),
            ),
            (
                vec![
                    r#"<https://x/prev>; rel="prev""#,
                    r#"</n>; rel="last next""#,
                ],
                Some("/n"),
            ),
            (vec![r#"</v2/a/tags/list?last=c>; rel="prev""#], None),
            (vec!["garbage"], None),
            (vec![], None),
        ] {
            assert_eq!(next_link(&headers(&values)).as_deref(), next, "{values:?}");
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
