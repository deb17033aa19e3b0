//! `OciRegistry`: the artifact registry port over an OCI distribution registry.
//!
//! Every request, of a pull, of a push and of the token exchange, goes through the adapter's
//! own HTTP (the private `transport` module): no answer of the registry is read without a bound
//! chosen before it, each exchange has an overall deadline and a minimum rate, and every URL
//! followed (a redirect, a token realm, an upload session) is held to the plain-HTTP rule. A
//! push is the distribution spec's plainest flow: each blob the registry lacks goes up in one
//! PUT to a session the registry opens, then the manifest is PUT by tag or digest.
//!
//! A package is one artifact: a manifest with `artifactType` [`ARTIFACT_TYPE`], a small JSON
//! config ([`ArtifactConfig`]) and one layer, the archive itself. The registry is untrusted:
//! every manifest is checked for its media types and sizes before any blob is fetched, blobs are
//! counted and hashed as they stream to disk, and anything that disagrees is refused with a
//! typed `DistributionErrorKind`. Authentication of the package is the caller's business, as
//! for any file.
//!
//! A document (a fleet root or policy, `DocumentRegistry`) is an artifact of its own: a
//! manifest whose `artifactType` is the document's media type, the OCI empty config (`{}`), and
//! one layer of that media type holding the document. It goes up and comes back by the same
//! steps as a package, held in memory: the layer's media type and its size, within
//! [`Limits::document_bytes`], are checked in the manifest before the layer is fetched, and
//! the config is never fetched. Verifying the document is the caller's business.
//!
//! The HTTP client (reqwest) is async; the runtime is a current-thread tokio runtime made for
//! each call and dropped with it, so that nothing above this crate is async. An adapter made
//! with [`OciRegistry::keeping_sessions`] keeps one runtime, and per reference the client and
//! the authorization of its last successful pull, for the next call: a poll of an unchanged
//! tag is then its manifest request alone.

#![forbid(unsafe_code)]

mod auth;
mod settings;
mod transport;

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use guild_domain::distribution::{
    is_valid_tag, kind_of_layer, layer_media_type, ArtifactConfig, OciReference, OciRepository,
    ARTIFACT_TYPE, CONFIG_MEDIA_TYPE, OCI_INDEX_MEDIA_TYPE, OCI_MANIFEST_MEDIA_TYPE,
};
use guild_domain::ids::PackageKind;
use guild_domain::ids::Sha256Digest;
use guild_ports::distribution::{
    ArtifactRegistry, DistributionError, DistributionErrorKind as Kind, DocumentRegistry, Part,
    Pulled, PulledDocument, PushRequest, Pushed,
};
use guild_ports::source::Progress;
use serde_json::Value;
use sha2::{Digest, Sha256};

use auth::RegistryAuth;
pub use settings::{
    Limits, OciSettings, CA_FILE_VARIABLE, DEADLINE_VARIABLE, INSECURE_VARIABLE, STALL_VARIABLE,
};
pub use transport::ERROR_BODY_BYTES;
use transport::{plain_http_allowed, Auth, Http, Payload};

/// Bytes read from the archive per upload chunk and per progress step.
const CHUNK: usize = 1 << 20;

/// The OCI empty descriptor's media type: a document artifact's config, `{}`.
const EMPTY_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";
/// The empty config's content.
const EMPTY_CONFIG: &[u8] = b"{}";

/// The registry adapter. Cheap to make; each call builds its client and runtime, unless the
/// adapter keeps its sessions ([`OciRegistry::keeping_sessions`]).
#[derive(Debug, Clone, Default)]
pub struct OciRegistry {
    settings: OciSettings,
    /// The pull sessions kept between calls, when the adapter keeps them. Clones share them.
    kept: Option<Arc<Mutex<Kept>>>,
}

impl OciRegistry {
    /// An adapter with these settings.
    pub fn new(settings: OciSettings) -> Self {
        OciRegistry {
            settings,
            kept: None,
        }
    }

    /// The same adapter, keeping what a pull sets up (the runtime, the client with its open
    /// connections, and the authorization found for the repository) from one call to the
    /// next for the same reference: a caller that polls one reference (`guild fleet sync
    /// --follow`) then pays only for the requests that answer it, a manifest when nothing
    /// changed, instead of the registry's API check and the token exchange every time. A
    /// kept authorization that the registry answers with 401 (an expired token) is replaced by
    /// authenticating again, and the call is tried once more; a call that fails otherwise
    /// drops its session, so the next starts afresh. Pushes are never kept.
    pub fn keeping_sessions(mut self) -> Self {
        self.kept = Some(Arc::new(Mutex::new(Kept::default())));
        self
    }

    /// An adapter configured from the environment (see [`OciSettings::from_environment`]).
    pub fn from_environment() -> Self {
        OciRegistry::new(OciSettings::from_environment())
    }

    /// The settings' CA file, read; and the TLS provider installed (reqwest is built without
    /// one of its own; ring is the process default). Fails first on an unusable setting.
    fn ca_file(&self, reference: &OciReference) -> Result<Option<Vec<u8>>, DistributionError> {
        if let Some((variable, value, reason)) = &self.settings.invalid {
            return Err(DistributionError::new(
                Kind::BadSetting {
                    variable,
                    value: value.clone(),
                    reason,
                },
                reference,
            ));
        }
        let _ = rustls::crypto::ring::default_provider().install_default();
        let Some(ca) = &self.settings.ca_file else {
            return Ok(None);
        };
        std::fs::read(ca).map(Some).map_err(|e| {
            DistributionError::new(
                Kind::Io {
                    action: "read the CA file",
                    path: ca.display().to_string(),
                },
                reference,
            )
            .with_source(e)
        })
    }

    /// The bounded HTTP client for `reference`'s registry (see [`transport`]).
    fn http(&self, reference: &OciReference) -> Result<Http, DistributionError> {
        let mut certificates = Vec::new();
        if let Some(pem) = self.ca_file(reference)? {
            certificates = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                DistributionError::new(
                    Kind::Insecure {
                        reason: format!(
                            "the CA file {} is not PEM certificates",
                            self.settings
                                .ca_file
                                .as_deref()
                                .unwrap_or(Path::new(""))
                                .display()
                        ),
                    },
                    reference,
                )
                .with_source(e)
            })?;
        }
        let scheme = if self.plain_http(reference) {
            "http"
        } else {
            "https"
        };
        let (host, repository) = endpoint(reference);
        let base = format!("{scheme}://{host}/");
        let base = reqwest::Url::parse(&base).map_err(|e| {
            DistributionError::new(
                Kind::Malformed {
                    part: Part::Manifest,
                    reason: format!("the registry's URL {base:?} cannot be made: {e}"),
                },
                reference,
            )
        })?;
        Http::new(&self.settings, reference, base, repository, certificates)
    }

    /// Whether `reference`'s registry is reached over plain HTTP: only a loopback host or one
    /// listed in the settings' insecure hosts (as `HOST` or `HOST:PORT`).
    fn plain_http(&self, reference: &OciReference) -> bool {
        // The one rule for every URL followed, applied to the registry's own.
        reqwest::Url::parse(&format!("http://{}/", reference.registry()))
            .is_ok_and(|url| plain_http_allowed(&url, &self.settings.insecure))
    }

    fn auth(&self, reference: &OciReference) -> RegistryAuth {
        auth::lookup(&self.settings.auth_files, reference.registry())
    }
}

fn runtime(reference: &OciReference) -> Result<tokio::runtime::Runtime, DistributionError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            DistributionError::new(
                Kind::Transport {
                    reason: "cannot start the I/O runtime".into(),
                },
                reference,
            )
            .with_source(e)
        })
}

/// Where `reference`'s registry is asked, and the repository's name there. Docker Hub is
/// reached as `index.docker.io`, and a repository of one component there is one of its
/// official images, under `library/`, as docker names them. Any other registry is asked at
/// the reference's own host for the reference's own repository.
fn endpoint(reference: &OciReference) -> (&str, String) {
    let repository = reference.repository();
    match reference.registry() {
        "docker.io" | "index.docker.io" => (
            "index.docker.io",
            if repository.contains('/') {
                repository.to_owned()
            } else {
                format!("library/{repository}")
            },
        ),
        registry => (registry, repository.to_owned()),
    }
}

fn io_error(
    action: &'static str,
    path: &Path,
    reference: &OciReference,
    e: std::io::Error,
) -> DistributionError {
    DistributionError::new(
        Kind::Io {
            action,
            path: path.display().to_string(),
        },
        reference,
    )
    .with_source(e)
}

fn sha256_of(bytes: &[u8]) -> String {
    Sha256Digest::of(bytes).to_hex()
}

fn oci_digest(d: &Sha256Digest) -> String {
    format!("sha256:{}", d.to_hex())
}

/// A reference by digest names this manifest, or the manifest is refused.
fn check_pinned(
    reference: &OciReference,
    manifest_digest: &Sha256Digest,
) -> Result<(), DistributionError> {
    match reference.target() {
        guild_domain::distribution::OciTarget::Digest(d) if d != manifest_digest => {
            Err(DistributionError::new(
                Kind::DigestMismatch {
                    part: Part::Manifest,
                    expected: d.to_hex(),
                    actual: manifest_digest.to_hex(),
                },
                reference,
            ))
        }
        _ => Ok(()),
    }
}

/// The archive's digest and size, in one read.
fn hash_file(
    path: &Path,
    reference: &OciReference,
) -> Result<(Sha256Digest, u64), DistributionError> {
    let mut file = File::open(path).map_err(|e| io_error("open", path, reference, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut size = 0u64;
    loop {
        let n = file
            .read(&mut buf)
            .map_err(|e| io_error("read", path, reference, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok((Sha256Digest(hasher.finalize().into()), size))
}

impl ArtifactRegistry for OciRegistry {
    fn push(
        &self,
        reference: &OciReference,
        request: PushRequest<'_>,
        progress: Option<&dyn Progress>,
    ) -> Result<Pushed, DistributionError> {
        let artifact = Artifact::describe(&request, reference)?;
        self.upload(reference, &artifact, progress)
    }

    fn pull(
        &self,
        reference: &OciReference,
        out: &Path,
        progress: Option<&dyn Progress>,
    ) -> Result<Pulled, DistributionError> {
        let limits = self.settings.limits;
        self.download(reference, |download| async move {
            let (manifest_digest, (config_desc, layer_desc)) = download
                .manifest(OCI_MANIFEST_MEDIA_TYPE, |body| {
                    check_manifest(body, &limits)
                })
                .await?;
            let config = download.config(&config_desc).await?;
            check_layer_kind(&layer_desc, &config, download.reference)?;
            let layer_digest = download.layer(&layer_desc, out, progress).await?;
            Ok(Pulled {
                manifest_digest,
                layer_digest,
                layer_size: layer_desc.size,
                config,
            })
        })
    }

    fn list_tags(&self, repository: &OciRepository) -> Result<Vec<String>, DistributionError> {
        self.tags_of(repository)
    }
}

impl OciRegistry {
    /// Every tag of `repository`: the first page asked for with `?n=` ([`Limits::
    /// tags_page_size`]), each next page where the answer's `Link` names it (on the registry's
    /// origin, at the same tag list), at most [`Limits::tags_pages`] pages of at most
    /// [`Limits::tags_page_bytes`] each. Each page must be this repository's list of valid
    /// tags; a tag listed again is kept once.
    fn tags_of(&self, repository: &OciRepository) -> Result<Vec<String>, DistributionError> {
        // The adapter's HTTP is made for a reference; a tag list never uses its target, and
        // its errors name the repository (below).
        let reference = repository.at_digest(Sha256Digest([0; 32]));
        let limits = self.settings.limits;
        let name = endpoint(&reference).1;
        let name = &name;
        self.download(&reference, |download| async move {
            let fail = |kind| DistributionError::new(kind, download.reference);
            let (mut tags, mut seen) = (Vec::new(), BTreeSet::new());
            let mut next = Some(download.http.tags_url()?);
            let mut pages = 0u32;
            while let Some(url) = next.take() {
                pages += 1;
                if pages > limits.tags_pages {
                    return Err(fail(Kind::Malformed {
                        part: Part::Tags,
                        reason: format!(
                            "the tag list runs past {} pages of at most {} tags",
                            limits.tags_pages, limits.tags_page_size
                        ),
                    }));
                }
                let (body, following) = download.http.tags_page(url, &download.auth).await?;
                for tag in check_tag_page(&body, name).map_err(fail)? {
                    if seen.insert(tag.clone()) {
                        tags.push(tag);
                    }
                }
                next = following;
            }
            Ok(tags)
        })
        .map_err(|mut e| {
            e.reference = repository.to_string();
            e
        })
    }
}

/// One page of a tag list: `{"name": NAME, "tags": [TAG, ...]}` (`tags` may be `null`, as a
/// registry answers for a repository without tags), of the repository `name` asked for, every
/// tag a valid one. Other members are the registry's own and are ignored.
fn check_tag_page(body: &[u8], name: &str) -> Result<Vec<String>, Kind> {
    let bad = |reason: String| Kind::Malformed {
        part: Part::Tags,
        reason,
    };
    let value: Value = serde_json::from_slice(body).map_err(|_| bad("not JSON".into()))?;
    let listed = value
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("it has no \"name\" string".into()))?;
    if listed != name {
        return Err(bad(format!(
            "it lists the tags of repository {:?}, not of {name:?}",
            listed.chars().take(200).collect::<String>()
        )));
    }
    let tags = match value.get("tags") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(tags)) => tags,
        Some(_) => return Err(bad("its \"tags\" is not an array".into())),
    };
    tags.iter()
        .map(|t| match t.as_str() {
            Some(tag) if is_valid_tag(tag) => Ok(tag.to_owned()),
            _ => Err(bad(format!(
                "{} is not a tag (1 to 128 of [A-Za-z0-9_.-], not starting with '.' or '-')",
                t.to_string().chars().take(200).collect::<String>()
            ))),
        })
        .collect()
}

impl DocumentRegistry for OciRegistry {
    fn push_document(
        &self,
        reference: &OciReference,
        media_type: &str,
        document: &[u8],
    ) -> Result<Pushed, DistributionError> {
        let artifact = Artifact::document(media_type, document, reference)?;
        self.upload(reference, &artifact, None)
    }

    fn pull_document(
        &self,
        reference: &OciReference,
        accepted: &[&str],
    ) -> Result<PulledDocument, DistributionError> {
        let limit = self.settings.limits.document_bytes;
        self.download(reference, |download| async move {
            // The manifest alone is asked for: an index is no document.
            let (manifest_digest, layer) = download
                .manifest(OCI_MANIFEST_MEDIA_TYPE, |body| {
                    check_document_manifest(body, accepted, limit)
                })
                .await?;
            let mut bytes = Vec::new();
            let layer_digest = fetch_blob(
                &download.http,
                &download.auth,
                &layer,
                Part::Document,
                &mut bytes,
                None,
                download.reference,
            )
            .await?;
            Ok(PulledDocument {
                media_type: layer.media_type,
                manifest_digest,
                layer_digest,
                bytes,
            })
        })
    }

    fn resolve_document(
        &self,
        reference: &OciReference,
        accepted: &[&str],
    ) -> Result<Sha256Digest, DistributionError> {
        let limit = self.settings.limits.document_bytes;
        self.download(reference, |download| async move {
            let (manifest_digest, _) = download
                .manifest(OCI_MANIFEST_MEDIA_TYPE, |body| {
                    check_document_manifest(body, accepted, limit)
                })
                .await?;
            Ok(manifest_digest)
        })
    }
}

impl OciRegistry {
    /// Pushes `artifact`: its config and layer where the registry lacks them, then its
    /// manifest under `reference`.
    fn upload(
        &self,
        reference: &OciReference,
        artifact: &Artifact<'_>,
        progress: Option<&dyn Progress>,
    ) -> Result<Pushed, DistributionError> {
        check_pinned(reference, &artifact.manifest_digest)?;
        let http = self.http(reference)?;
        let credentials = self.auth(reference);
        let rt = runtime(reference)?;
        rt.block_on(async {
            let auth = http.authenticate(&credentials, "pull,push").await?;
            let upload = Upload {
                http,
                auth,
                reference,
            };
            upload.push_config(artifact).await?;
            upload.push_layer(artifact, progress).await?;
            upload.push_manifest(artifact).await
        })?;
        Ok(Pushed {
            manifest_digest: artifact.manifest_digest,
            layer_digest: artifact.layer_digest,
            layer_size: artifact.layer_size,
        })
    }

    /// Runs `steps` (a pull's requests) with a client authorised to pull from `reference`'s
    /// repository: on a runtime made for this call, or through the session kept for
    /// `reference` (see [`OciRegistry::keeping_sessions`]).
    fn download<'a, T, F>(
        &'a self,
        reference: &'a OciReference,
        steps: impl Fn(Download<'a>) -> F,
    ) -> Result<T, DistributionError>
    where
        F: std::future::Future<Output = Result<T, DistributionError>>,
    {
        let credentials = self.auth(reference);
        let steps = |http: Http, auth: Auth| {
            steps(Download {
                http,
                auth,
                reference,
            })
        };
        if let Some(kept) = &self.kept {
            // One call at a time uses the kept sessions; a poisoned lock held nothing that a
            // later call could trust less than a fresh one, so the sessions are dropped.
            let mut kept = kept.lock().unwrap_or_else(|poisoned| {
                let mut k = poisoned.into_inner();
                k.sessions.clear();
                k
            });
            return kept.run(reference, || self.http(reference), &credentials, steps);
        }
        let http = self.http(reference)?;
        let rt = runtime(reference)?;
        rt.block_on(async {
            let auth = http.authenticate(&credentials, "pull").await?;
            steps(http, auth).await
        })
    }
}

/// How many references' sessions a registry that keeps them holds at most.
const MAX_KEPT_SESSIONS: usize = 8;

/// The pull sessions an adapter keeps between calls: one runtime, and per reference the client
/// (with its connection pool) and the authorization found for it.
#[derive(Default)]
struct Kept {
    runtime: Option<tokio::runtime::Runtime>,
    /// `(reference, client, authorization)`, the most recently used last.
    sessions: Vec<(String, Http, Auth)>,
}

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kept")
            .field("sessions", &self.sessions.len())
            .finish_non_exhaustive()
    }
}

impl Kept {
    /// Runs `steps` for `reference` with its kept client and authorization, or with a client
    /// from `make` authorised now. A kept authorization answered with 401 is replaced and the
    /// steps run once more. The session is kept when the call succeeds, dropped when it fails.
    fn run<T, F>(
        &mut self,
        reference: &OciReference,
        make: impl FnOnce() -> Result<Http, DistributionError>,
        credentials: &RegistryAuth,
        steps: impl Fn(Http, Auth) -> F,
    ) -> Result<T, DistributionError>
    where
        F: std::future::Future<Output = Result<T, DistributionError>>,
    {
        if self.runtime.is_none() {
            self.runtime = Some(runtime(reference)?);
        }
        let key = reference.to_string();
        let held = self
            .sessions
            .iter()
            .position(|(k, ..)| *k == key)
            .map(|i| self.sessions.remove(i));
        let (http, held_auth) = match held {
            Some((_, http, auth)) => (http, Some(auth)),
            None => (make()?, None),
        };
        let Some(rt) = self.runtime.as_ref() else {
            unreachable!("the runtime was made above");
        };
        let answer = rt.block_on(async {
            let fresh = held_auth.is_none();
            let auth = match held_auth {
                Some(auth) => auth,
                None => http.authenticate(credentials, "pull").await?,
            };
            match steps(http.clone(), auth.clone()).await {
                Err(e) if !fresh && authorization_expired(&e) => {
                    let auth = http.authenticate(credentials, "pull").await?;
                    let t = steps(http.clone(), auth.clone()).await?;
                    Ok((t, auth))
                }
                answer => answer.map(|t| (t, auth)),
            }
        });
        let (t, auth) = answer?;
        if self.sessions.len() >= MAX_KEPT_SESSIONS {
            self.sessions.remove(0);
        }
        self.sessions.push((key, http, auth));
        Ok(t)
    }
}

/// Whether `e` is the registry refusing an authorization it took before: a 401, which a token
/// past its lifetime gets.
fn authorization_expired(e: &DistributionError) -> bool {
    matches!(e.kind, Kind::Unauthorized { status: 401, .. })
}

/// A pull's requests through the adapter's own bounded HTTP, one method a step: the manifest,
/// the config, the layer. Nothing is fetched that the manifest has not been checked to allow.
struct Download<'a> {
    http: Http,
    auth: Auth,
    reference: &'a OciReference,
}

impl Download<'_> {
    /// Fetches the manifest (an index is asked for too, so that it can be refused as one;
    /// `accept` is the manifest's own media type), checks it against a digest reference and
    /// with `check` for its shape, and returns its digest and what `check` found in it.
    async fn manifest<T>(
        &self,
        accept: &str,
        check: impl FnOnce(&[u8]) -> Result<T, Kind>,
    ) -> Result<(Sha256Digest, T), DistributionError> {
        let body = self
            .http
            .manifest(
                self.reference.target(),
                &format!("{accept}, {OCI_INDEX_MEDIA_TYPE}"),
                &self.auth,
            )
            .await?;
        let manifest_digest = Sha256Digest::of(&body);
        check_pinned(self.reference, &manifest_digest)?;
        let found = check(&body).map_err(|kind| DistributionError::new(kind, self.reference))?;
        Ok((manifest_digest, found))
    }

    /// Fetches the config blob and parses it as the package's artifact config.
    async fn config(&self, desc: &Descriptor) -> Result<ArtifactConfig, DistributionError> {
        let mut config = Vec::new();
        fetch_blob(
            &self.http,
            &self.auth,
            desc,
            Part::Config,
            &mut config,
            None,
            self.reference,
        )
        .await?;
        ArtifactConfig::parse(&config).map_err(|e| {
            DistributionError::new(
                Kind::Malformed {
                    part: Part::Config,
                    reason: e.to_string(),
                },
                self.reference,
            )
        })
    }

    /// Streams the layer into `out`, a new file; a failed download removes it again. Returns
    /// the layer's digest.
    async fn layer(
        &self,
        desc: &Descriptor,
        out: &Path,
        progress: Option<&dyn Progress>,
    ) -> Result<Sha256Digest, DistributionError> {
        let reference = self.reference;
        let mut file = std::io::BufWriter::with_capacity(
            CHUNK,
            File::options()
                .write(true)
                .create_new(true)
                .open(out)
                .map_err(|e| io_error("create", out, reference, e))?,
        );
        let written = fetch_blob(
            &self.http,
            &self.auth,
            desc,
            Part::Layer,
            &mut file,
            progress,
            reference,
        )
        .await
        .and_then(|d| {
            // Flushed, not synced: a pull into scratch space is installed (durably) and
            // removed; a caller that keeps the file syncs it (`guild pull` does).
            file.flush()
                .map_err(|e| io_error("write", out, reference, e))?;
            Ok(d)
        });
        match written {
            Ok(d) => Ok(d),
            Err(e) => {
                drop(file);
                let _ = std::fs::remove_file(out);
                Err(e)
            }
        }
    }
}

/// The layer's media type is the one for the kind of package the config names.
fn check_layer_kind(
    layer: &Descriptor,
    config: &ArtifactConfig,
    reference: &OciReference,
) -> Result<(), DistributionError> {
    if kind_of_layer(&layer.media_type) != Some(config.kind) {
        return Err(DistributionError::new(
            Kind::WrongMediaType {
                part: Part::Layer,
                found: layer.media_type.clone(),
                expected: layer_media_type(config.kind).to_owned(),
            },
            reference,
        ));
    }
    Ok(())
}

/// Where a push's layer comes from.
#[derive(Clone, Copy)]
enum LayerSource<'a> {
    /// A package archive, streamed up from its file.
    Archive(&'a Path),
    /// A document held whole in memory.
    Document(&'a [u8]),
}

/// What a push sends: the config and the manifest, made here, and the layer.
struct Artifact<'a> {
    config: Vec<u8>,
    /// `sha256:HEX` of `config`.
    config_digest: String,
    layer: LayerSource<'a>,
    layer_digest: Sha256Digest,
    layer_size: u64,
    manifest: Vec<u8>,
    manifest_digest: Sha256Digest,
}

impl<'a> Artifact<'a> {
    /// Hashes the archive and writes the config and the manifest that name it.
    fn describe(
        request: &PushRequest<'a>,
        reference: &OciReference,
    ) -> Result<Self, DistributionError> {
        let (layer_digest, layer_size) = hash_file(request.archive, reference)?;
        let config = request.config.to_json().into_bytes();
        let config_digest = format!("sha256:{}", sha256_of(&config));
        let manifest = manifest_json(
            request,
            &config_digest,
            config.len(),
            &layer_digest,
            layer_size,
        );
        Artifact::with_manifest(
            (config, config_digest),
            (
                LayerSource::Archive(request.archive),
                layer_digest,
                layer_size,
            ),
            &manifest,
            reference,
        )
    }

    /// A document artifact: the empty config, `document` as the one layer of `media_type`,
    /// which is also the manifest's `artifactType`. Refused when over the document limit.
    fn document(
        media_type: &str,
        document: &'a [u8],
        reference: &OciReference,
    ) -> Result<Self, DistributionError> {
        let limit = guild_domain::fleet::MAX_DOCUMENT_BYTES as u64;
        if document.len() as u64 > limit {
            return Err(DistributionError::new(
                Kind::TooLarge {
                    part: Part::Document,
                    size: document.len() as u64,
                    limit,
                },
                reference,
            ));
        }
        let config_digest = format!("sha256:{}", sha256_of(EMPTY_CONFIG));
        let layer_digest = Sha256Digest::of(document);
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST_MEDIA_TYPE,
            "artifactType": media_type,
            "config": {
                "mediaType": EMPTY_MEDIA_TYPE,
                "digest": config_digest,
                "size": EMPTY_CONFIG.len(),
            },
            "layers": [{
                "mediaType": media_type,
                "digest": oci_digest(&layer_digest),
                "size": document.len(),
            }],
        });
        Artifact::with_manifest(
            (EMPTY_CONFIG.to_vec(), config_digest),
            (
                LayerSource::Document(document),
                layer_digest,
                document.len() as u64,
            ),
            &manifest,
            reference,
        )
    }

    /// The artifact of this config, this layer and `manifest`, written out and hashed.
    fn with_manifest(
        (config, config_digest): (Vec<u8>, String),
        (layer, layer_digest, layer_size): (LayerSource<'a>, Sha256Digest, u64),
        manifest: &Value,
        reference: &OciReference,
    ) -> Result<Self, DistributionError> {
        let manifest = serde_json::to_vec(manifest).map_err(|e| {
            DistributionError::new(
                Kind::Malformed {
                    part: Part::Manifest,
                    reason: e.to_string(),
                },
                reference,
            )
        })?;
        let manifest_digest = Sha256Digest::of(&manifest);
        Ok(Artifact {
            config,
            config_digest,
            layer,
            layer_digest,
            layer_size,
            manifest,
            manifest_digest,
        })
    }
}

/// The package's image manifest: the config, the one layer (titled with the archive's file
/// name) and the request's annotations.
fn manifest_json(
    request: &PushRequest<'_>,
    config_digest: &str,
    config_size: usize,
    layer_digest: &Sha256Digest,
    layer_size: u64,
) -> Value {
    let mut annotations = serde_json::Map::new();
    for (k, v) in request.annotations {
        annotations.insert(k.clone(), Value::String(v.clone()));
    }
    serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST_MEDIA_TYPE,
        "artifactType": ARTIFACT_TYPE,
        "config": {
            "mediaType": CONFIG_MEDIA_TYPE,
            "digest": config_digest,
            "size": config_size,
        },
        "layers": [{
            "mediaType": layer_media_type(request.config.kind),
            "digest": oci_digest(layer_digest),
            "size": layer_size,
            "annotations": {
                "org.opencontainers.image.title": request
                    .archive
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            },
        }],
        "annotations": annotations,
    })
}

/// A push's requests, one method a step: the config, the layer, the manifest. A blob the
/// registry has already is not sent again.
struct Upload<'a> {
    http: Http,
    auth: Auth,
    reference: &'a OciReference,
}

impl Upload<'_> {
    async fn push_config(&self, artifact: &Artifact<'_>) -> Result<(), DistributionError> {
        self.push_bytes(
            &artifact.config_digest,
            &artifact.config,
            ("config upload", Part::Config),
        )
        .await
    }

    /// Sends a small blob held in memory, in one PUT, unless the registry has it.
    async fn push_bytes(
        &self,
        digest: &str,
        blob: &[u8],
        (what, part): (&'static str, Part),
    ) -> Result<(), DistributionError> {
        if self.http.has_blob(digest, &self.auth).await? {
            return Ok(());
        }
        let session = self.http.start_upload(&self.auth).await?;
        self.http
            .put_blob(
                session,
                digest,
                blob.len() as u64,
                Payload::Bytes(bytes::Bytes::copy_from_slice(blob)),
                (what, None),
                part,
                &self.auth,
            )
            .await
    }

    /// Sends the layer: a document in one PUT; an archive streamed up, reporting progress as
    /// it goes.
    async fn push_layer(
        &self,
        artifact: &Artifact<'_>,
        progress: Option<&dyn Progress>,
    ) -> Result<(), DistributionError> {
        let digest = oci_digest(&artifact.layer_digest);
        let archive = match artifact.layer {
            LayerSource::Archive(archive) => archive,
            LayerSource::Document(document) => {
                return self
                    .push_bytes(&digest, document, ("document upload", Part::Document))
                    .await
            }
        };
        if self.http.has_blob(&digest, &self.auth).await? {
            return Ok(());
        }
        let session = self.http.start_upload(&self.auth).await?;
        let file = File::open(archive).map_err(|e| io_error("open", archive, self.reference, e))?;
        if let Some(p) = progress {
            p.begin("uploading", artifact.layer_size);
        }
        let sent = Arc::new(AtomicU64::new(0));
        let body = reqwest::Body::wrap_stream(file_chunks(file, Arc::clone(&sent)));
        let upload = std::pin::pin!(self.http.put_blob(
            session,
            &digest,
            artifact.layer_size,
            Payload::Stream(Some(body)),
            ("package layer upload", Some(Arc::clone(&sent))),
            Part::Layer,
            &self.auth,
        ));
        let ticker = std::pin::pin!(report_progress(&sent, progress));
        let pushed = match futures_util::future::select(upload, ticker).await {
            futures_util::future::Either::Left((pushed, _)) => pushed,
            futures_util::future::Either::Right((never, _)) => never,
        };
        if let Some(p) = progress {
            p.finish();
        }
        pushed
    }

    async fn push_manifest(&self, artifact: &Artifact<'_>) -> Result<(), DistributionError> {
        self.http
            .put_manifest(
                self.reference.target(),
                bytes::Bytes::from(artifact.manifest.clone()),
                (
                    OCI_MANIFEST_MEDIA_TYPE,
                    &oci_digest(&artifact.manifest_digest),
                ),
                &self.auth,
            )
            .await
    }
}

/// The upload's body: the file read in chunks as the client asks for them, each counted into
/// `sent` for the progress bar and the stall rule. A read error ends the stream with that
/// error; a file that changed since it was hashed fails the registry's digest check.
fn file_chunks(
    mut file: File,
    sent: Arc<AtomicU64>,
) -> impl futures_util::Stream<Item = Result<bytes::Bytes, std::io::Error>> + Send + 'static {
    futures_util::stream::iter(std::iter::from_fn(move || {
        let mut buf = vec![0u8; CHUNK];
        match file.read(&mut buf) {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                sent.fetch_add(n as u64, Ordering::Relaxed);
                Some(Ok(bytes::Bytes::from(buf)))
            }
            Err(e) => Some(Err(e)),
        }
    }))
}

/// Advances the progress bar by what `sent` counted, every 100 ms; never ends (the upload it
/// runs beside does).
async fn report_progress<T>(sent: &AtomicU64, progress: Option<&dyn Progress>) -> T {
    let mut shown = 0;
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let now = sent.load(Ordering::Relaxed);
        if let Some(p) = progress {
            p.advance(now - shown);
        }
        shown = now;
    }
}

/// Checks a manifest's shape: an OCI image manifest (not an index) with the package config
/// and exactly one package layer, each within the limits. Returns their descriptors.
fn check_manifest(body: &[u8], limits: &Limits) -> Result<(Descriptor, Descriptor), Kind> {
    let value: Value = serde_json::from_slice(body).map_err(|_| malformed("not JSON"))?;
    check_image_manifest(&value)?;
    let config = config_descriptor(&value, limits)?;
    let layer = layer_descriptor(&value, limits)?;
    Ok((config, layer))
}

/// Checks a document artifact's manifest: an OCI image manifest with a config descriptor
/// (never fetched) and exactly one layer of one of the `accepted` media types, at most `limit`
/// bytes. Returns the layer's descriptor.
fn check_document_manifest(body: &[u8], accepted: &[&str], limit: u64) -> Result<Descriptor, Kind> {
    let value: Value = serde_json::from_slice(body).map_err(|_| malformed("not JSON"))?;
    check_image_manifest(&value)?;
    descriptor(value.get("config"), Part::Config)?;
    let layer = only_layer(&value, "a document", Part::Document)?;
    if !accepted.contains(&layer.media_type.as_str()) {
        return Err(Kind::WrongMediaType {
            part: Part::Document,
            found: layer.media_type,
            expected: accepted.join(" or "),
        });
    }
    if layer.size > limit {
        return Err(Kind::TooLarge {
            part: Part::Document,
            size: layer.size,
            limit,
        });
    }
    Ok(layer)
}

fn malformed(reason: &str) -> Kind {
    Kind::Malformed {
        part: Part::Manifest,
        reason: reason.to_owned(),
    }
}

/// An OCI image manifest of schema version 2: an index (OCI or Docker) is refused as one.
fn check_image_manifest(value: &Value) -> Result<(), Kind> {
    let media_type = value.get("mediaType").and_then(Value::as_str);
    if media_type == Some(OCI_INDEX_MEDIA_TYPE)
        || media_type == Some("application/vnd.docker.distribution.manifest.list.v2+json")
        || value.get("manifests").is_some()
    {
        return Err(Kind::IndexNotManifest);
    }
    if media_type != Some(OCI_MANIFEST_MEDIA_TYPE) {
        return Err(Kind::WrongMediaType {
            part: Part::Manifest,
            found: media_type.unwrap_or("(none)").to_owned(),
            expected: OCI_MANIFEST_MEDIA_TYPE.to_owned(),
        });
    }
    if value.get("schemaVersion").and_then(Value::as_u64) != Some(2) {
        return Err(malformed("schemaVersion is not 2"));
    }
    Ok(())
}

/// What a manifest says of a blob.
#[derive(Debug, Clone)]
struct Descriptor {
    media_type: String,
    /// `sha256:HEX`.
    digest: String,
    size: u64,
}

/// One descriptor: a media type, a `sha256:` digest of 64 hex digits, and a size.
fn descriptor(v: Option<&Value>, part: Part) -> Result<Descriptor, Kind> {
    let v = v.ok_or_else(|| malformed(&format!("no {part} descriptor")))?;
    let media_type = v
        .get("mediaType")
        .and_then(Value::as_str)
        .ok_or_else(|| malformed(&format!("the {part} has no mediaType")))?;
    let digest = v
        .get("digest")
        .and_then(Value::as_str)
        .filter(|d| {
            d.strip_prefix("sha256:")
                .is_some_and(|h| Sha256Digest::parse_hex(h).is_ok())
        })
        .ok_or_else(|| malformed(&format!("the {part}'s digest is not sha256:<64 hex>")))?;
    let size = v
        .get("size")
        .and_then(Value::as_u64)
        .ok_or_else(|| malformed(&format!("the {part}'s size is not a whole number")))?;
    Ok(Descriptor {
        media_type: media_type.to_owned(),
        digest: digest.to_owned(),
        size,
    })
}

/// The config's descriptor: the package config's media type, within the config limit.
fn config_descriptor(value: &Value, limits: &Limits) -> Result<Descriptor, Kind> {
    let config = descriptor(value.get("config"), Part::Config)?;
    if config.media_type != CONFIG_MEDIA_TYPE {
        return Err(Kind::WrongMediaType {
            part: Part::Config,
            found: config.media_type,
            expected: CONFIG_MEDIA_TYPE.to_owned(),
        });
    }
    if config.size > limits.config_bytes {
        return Err(Kind::TooLarge {
            part: Part::Config,
            size: config.size,
            limit: limits.config_bytes,
        });
    }
    Ok(config)
}

/// The descriptor of a manifest's one layer (`what` names the artifact for the error); an
/// artifact of either kind has exactly one.
fn only_layer(value: &Value, what: &str, part: Part) -> Result<Descriptor, Kind> {
    let layers = value
        .get("layers")
        .and_then(Value::as_array)
        .ok_or_else(|| malformed("no layers"))?;
    if layers.len() != 1 {
        return Err(malformed(&format!(
            "{what} artifact has one layer, this one has {}",
            layers.len()
        )));
    }
    descriptor(layers.first(), part)
}

/// The one layer's descriptor: a package layer's media type, within the layer limit.
fn layer_descriptor(value: &Value, limits: &Limits) -> Result<Descriptor, Kind> {
    let layer = only_layer(value, "a package", Part::Layer)?;
    if kind_of_layer(&layer.media_type).is_none() {
        return Err(Kind::WrongMediaType {
            part: Part::Layer,
            found: layer.media_type,
            expected: format!(
                "{} or {}",
                layer_media_type(PackageKind::Kernel),
                layer_media_type(PackageKind::Module)
            ),
        });
    }
    if layer.size > limits.layer_bytes {
        return Err(Kind::TooLarge {
            part: Part::Layer,
            size: layer.size,
            limit: limits.layer_bytes,
        });
    }
    Ok(layer)
}

/// Streams one blob into `out`, never accepting more bytes than the descriptor names, within
/// the download's deadline and stall rule, and checks its size and digest. Returns the digest.
async fn fetch_blob(
    http: &Http,
    auth: &Auth,
    desc: &Descriptor,
    part: Part,
    out: &mut dyn Write,
    progress: Option<&dyn Progress>,
    reference: &OciReference,
) -> Result<Sha256Digest, DistributionError> {
    let expected = desc.size;
    let mut blob = BlobCheck {
        part,
        expected,
        received: 0,
        hasher: Sha256::new(),
        reference,
    };
    let (mut response, mut watch) = http.blob(&desc.digest, part, auth).await?;
    if let Some(length) = response.content_length() {
        if length > expected {
            return Err(blob.too_large(length));
        }
    }
    if let Some(p) = progress {
        p.begin("downloading", expected);
    }
    let streamed = blob
        .stream(http, &mut response, &mut watch, out, progress)
        .await;
    if let Some(p) = progress {
        p.finish();
    }
    streamed?;
    blob.finish(&desc.digest)
}

/// One blob's bytes as they arrive: counted against the size its descriptor names, hashed,
/// and written out.
struct BlobCheck<'a> {
    part: Part,
    expected: u64,
    received: u64,
    hasher: Sha256,
    reference: &'a OciReference,
}

impl BlobCheck<'_> {
    fn fail(&self, kind: Kind) -> DistributionError {
        DistributionError::new(kind, self.reference)
    }

    fn too_large(&self, size: u64) -> DistributionError {
        self.fail(Kind::TooLarge {
            part: self.part,
            size,
            limit: self.expected,
        })
    }

    fn truncated(&self) -> DistributionError {
        self.fail(Kind::Truncated {
            part: self.part,
            received: self.received,
            expected: self.expected,
        })
    }

    /// Takes the response's chunks until it ends, each counted, hashed and written to `out`,
    /// and shown on the progress bar. Stops at the first failure.
    async fn stream(
        &mut self,
        http: &Http,
        response: &mut reqwest::Response,
        watch: &mut transport::Watch,
        out: &mut dyn Write,
        progress: Option<&dyn Progress>,
    ) -> Result<(), DistributionError> {
        loop {
            let bytes = match http.next_chunk(response, watch).await {
                Ok(Some(bytes)) => bytes,
                Ok(None) => return Ok(()),
                // A deadline, a stall, or the connection's end before the size the descriptor
                // names: a transport failure of the stream is reported as the truncation it is.
                Err(e) => {
                    return Err(match e.kind {
                        Kind::Transport { .. } => self.truncated().with_source(e),
                        _ => e,
                    })
                }
            };
            self.received += bytes.len() as u64;
            if self.received > self.expected {
                return Err(self.too_large(self.received));
            }
            self.hasher.update(&bytes);
            if let Err(e) = out.write_all(&bytes) {
                return Err(self
                    .fail(Kind::Io {
                        action: "write",
                        path: "the output file".into(),
                    })
                    .with_source(e));
            }
            if let Some(p) = progress {
                p.advance(bytes.len() as u64);
            }
        }
    }

    /// The whole blob arrived (`received` is the size named) and its digest is `digest`
    /// (`sha256:HEX`). Returns the digest.
    fn finish(self, digest: &str) -> Result<Sha256Digest, DistributionError> {
        if self.received < self.expected {
            return Err(self.truncated());
        }
        let actual = Sha256Digest(self.hasher.clone().finalize().into());
        let wanted = digest.strip_prefix("sha256:").unwrap_or(digest);
        if actual.to_hex() != wanted {
            return Err(self.fail(Kind::DigestMismatch {
                part: self.part,
                expected: wanted.to_owned(),
                actual: actual.to_hex(),
            }));
        }
        Ok(actual)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(media: &str, config_media: &str, layers: Value) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": media,
            "config": {"mediaType": config_media, "digest": format!("sha256:{}", "a".repeat(64)), "size": 10},
            "layers": layers,
        }))
        .unwrap()
    }

    fn layer(media: &str, size: u64) -> Value {
        serde_json::json!([{"mediaType": media, "digest": format!("sha256:{}", "b".repeat(64)), "size": size}])
    }

    #[test]
    fn a_tag_page_is_this_repositorys_list_of_valid_tags() {
        let page = |v: Value| check_tag_page(&serde_json::to_vec(&v).unwrap(), "guild/scan");
        assert_eq!(
            page(serde_json::json!({"name": "guild/scan", "tags": ["1.0.0", "latest"]})).unwrap(),
            ["1.0.0", "latest"]
        );
        assert!(
            page(serde_json::json!({"name": "guild/scan", "tags": null}))
                .unwrap()
                .is_empty()
        );
        for (v, says) in [
            (serde_json::json!({"name": "other", "tags": []}), "not of"),
            (serde_json::json!({"tags": []}), "no \"name\""),
            (
                serde_json::json!({"name": "guild/scan", "tags": "x"}),
                "not an array",
            ),
            (
                serde_json::json!({"name": "guild/scan", "tags": ["../x"]}),
                "is not a tag",
            ),
            (
                serde_json::json!({"name": "guild/scan", "tags": [7]}),
                "7 is not a tag",
            ),
        ] {
            let err = page(v).unwrap_err().to_string();
            assert!(err.contains(says), "{says}: {err}");
        }
        assert!(check_tag_page(b"<html>", "guild/scan").is_err());
    }

    #[test]
    fn plain_http_only_for_loopback_and_listed_hosts() {
        let r = |s: &str| OciReference::parse(s).unwrap();
        let listed = OciRegistry::new(OciSettings {
            insecure: vec!["lab.example:5000".into(), "cache.example".into()],
            ..OciSettings::default()
        });
        for (reference, plain) in [
            ("oci://127.0.0.1:5000/a:t", true),
            ("oci://localhost/a:t", true),
            ("oci://[::1]:5000/a:t", true),
            ("oci://lab.example:5000/a:t", true),
            ("oci://lab.example:5001/a:t", false),
            ("oci://cache.example:443/a:t", true),
            ("oci://registry.example.com/a:t", false),
            ("oci://127.example.com/a:t", false),
            ("oci://127.evil.example.com/a:t", false),
        ] {
            assert_eq!(listed.plain_http(&r(reference)), plain, "{reference}");
        }
        assert!(!OciRegistry::default().plain_http(&r("oci://lab.example:5000/a:t")));
    }

    #[test]
    fn the_registry_asked_is_the_references_own() {
        for (reference, host, repository) in [
            ("oci://127.0.0.1:5000/a/b:t", "127.0.0.1:5000", "a/b"),
            ("oci://localhost/a:t", "localhost", "a"),
            // A host without a dot or port is still the host named, never Docker Hub.
            ("oci://registry/guild/scan:t", "registry", "guild/scan"),
            ("oci://docker.io/scan:t", "index.docker.io", "library/scan"),
            (
                "oci://index.docker.io/org/scan:t",
                "index.docker.io",
                "org/scan",
            ),
        ] {
            let r = OciReference::parse(reference).unwrap();
            let (h, repo) = endpoint(&r);
            assert_eq!((h, repo.as_str()), (host, repository), "{reference}");
        }
    }

    #[test]
    fn manifests_are_checked_before_any_blob_is_fetched() {
        let limits = Limits::default();
        let good = manifest(
            OCI_MANIFEST_MEDIA_TYPE,
            CONFIG_MEDIA_TYPE,
            layer("application/vnd.guild.gkmodule.v1.tar", 100),
        );
        let (c, l) = check_manifest(&good, &limits).unwrap();
        assert_eq!((c.size, l.size), (10, 100));
        let index = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2, "mediaType": OCI_INDEX_MEDIA_TYPE, "manifests": []
        }))
        .unwrap();
        assert_eq!(
            check_manifest(&index, &limits).unwrap_err(),
            Kind::IndexNotManifest
        );
        let cases = [
            (
                manifest(
                    OCI_MANIFEST_MEDIA_TYPE,
                    "application/vnd.oci.image.config.v1+json",
                    layer("application/vnd.guild.gkmodule.v1.tar", 1),
                ),
                "config has media type",
            ),
            (
                manifest(
                    OCI_MANIFEST_MEDIA_TYPE,
                    CONFIG_MEDIA_TYPE,
                    layer("application/vnd.oci.image.layer.v1.tar+gzip", 1),
                ),
                "package layer has media type",
            ),
            (
                manifest(
                    OCI_MANIFEST_MEDIA_TYPE,
                    CONFIG_MEDIA_TYPE,
                    layer(
                        "application/vnd.guild.gkmodule.v1.tar",
                        limits.layer_bytes + 1,
                    ),
                ),
                "over the limit",
            ),
            (
                manifest(
                    OCI_MANIFEST_MEDIA_TYPE,
                    CONFIG_MEDIA_TYPE,
                    serde_json::json!([]),
                ),
                "one layer",
            ),
            (
                manifest(
                    "application/vnd.docker.distribution.manifest.v2+json",
                    CONFIG_MEDIA_TYPE,
                    layer("application/vnd.guild.gkmodule.v1.tar", 1),
                ),
                "manifest has media type",
            ),
        ];
        for (body, says) in cases {
            let err = check_manifest(&body, &limits).unwrap_err().to_string();
            assert!(err.contains(says), "{says}: {err}");
        }
    }
}
