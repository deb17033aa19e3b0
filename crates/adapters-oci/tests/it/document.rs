//! Documents (a fleet root or policy) as OCI artifacts: the manifest a push writes, the same
//! artifact pulled back, and a registry that offers another media type, a layer over the
//! document limit or a manifest that does not end: each refused before the layer is fetched or
//! before more than the limit is read.

use super::*;

use guild_domain::fleet::{MAX_DOCUMENT_BYTES, POLICY_MEDIA_TYPE, ROOT_MEDIA_TYPE};
use guild_ports::distribution::DocumentRegistry;

const DOCUMENT: &[u8] = b"{\"signed\": {}, \"signatures\": []}\n";
const EMPTY_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";

/// The manifest a document push writes, byte for byte (serde_json writes keys sorted).
fn document_manifest(media_type: &str, layer_media_type: &str, layer: &[u8], size: u64) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST_MEDIA_TYPE,
        "artifactType": media_type,
        "config": {"mediaType": EMPTY_MEDIA_TYPE, "digest": digest(b"{}"), "size": 2},
        "layers": [{"mediaType": layer_media_type, "digest": digest(layer), "size": size}],
    }))
    .unwrap()
}

/// A registry serving `manifest` at `fleet:prod` and `layer` as its blob.
fn document_registry(manifest: Vec<u8>, layer: Answer) -> Server {
    serve_seen(HashMap::from([
        (
            "/v2/fleet/manifests/prod".to_owned(),
            ok(OCI_MANIFEST_MEDIA_TYPE, manifest),
        ),
        (format!("/v2/fleet/blobs/{}", digest(DOCUMENT)), layer),
    ]))
}

fn reference(port: u16, target: &str) -> OciReference {
    OciReference::parse(&format!("oci://127.0.0.1:{port}/fleet{target}")).unwrap()
}

fn pull_document(port: u16, target: &str, media_type: &str) -> Result<Vec<u8>, Kind> {
    OciRegistry::default()
        .pull_document(&reference(port, target), &[media_type])
        .map(|p| p.bytes)
        .map_err(|e| e.kind)
}

/// No blob was asked for.
#[track_caller]
fn fetched_no_blob(server: &Server) {
    let requests = server.requests();
    assert!(
        !requests.iter().any(|r| r.contains("/blobs/")),
        "a blob was fetched: {requests:?}"
    );
}

#[test]
fn a_pushed_document_is_the_artifact_that_is_pulled_back() {
    let server = serve_seen(HashMap::from([
        (
            "POST /v2/fleet/blobs/uploads/".to_owned(),
            status(202, &[("Location", "/upload/1")]),
        ),
        (
            "PUT /upload/1".to_owned(),
            status(201, &[("Location", "/v2/fleet/blobs/stored")]),
        ),
        (
            "PUT /v2/fleet/manifests/prod".to_owned(),
            status(201, &[("Location", "/v2/fleet/manifests/prod")]),
        ),
    ]));
    let pushed = OciRegistry::default()
        .push_document(&reference(server.port, ":prod"), ROOT_MEDIA_TYPE, DOCUMENT)
        .expect("the push failed");
    let manifest = document_manifest(
        ROOT_MEDIA_TYPE,
        ROOT_MEDIA_TYPE,
        DOCUMENT,
        DOCUMENT.len() as u64,
    );
    assert_eq!(pushed.manifest_digest, Sha256Digest::of(&manifest));
    assert_eq!(pushed.layer_digest, Sha256Digest::of(DOCUMENT));
    let requests = server.requests();
    for expected in [
        format!("HEAD /v2/fleet/blobs/{}", digest(b"{}")),
        format!("HEAD /v2/fleet/blobs/{}", digest(DOCUMENT)),
        "PUT /v2/fleet/manifests/prod".to_owned(),
    ] {
        assert!(requests.contains(&expected), "{expected} in {requests:?}");
    }

    // That manifest, served, gives the document back, by tag and by its digest.
    let by_digest = format!(
        "/v2/fleet/manifests/sha256:{}",
        pushed.manifest_digest.to_hex()
    );
    let port = serve_seen(HashMap::from([
        (
            "/v2/fleet/manifests/prod".to_owned(),
            ok(OCI_MANIFEST_MEDIA_TYPE, manifest.clone()),
        ),
        (by_digest, ok(OCI_MANIFEST_MEDIA_TYPE, manifest)),
        (
            format!("/v2/fleet/blobs/{}", digest(DOCUMENT)),
            ok("application/octet-stream", DOCUMENT.to_vec()),
        ),
    ]))
    .port;
    for target in [
        ":prod".to_owned(),
        format!("@sha256:{}", pushed.manifest_digest.to_hex()),
    ] {
        let pulled = OciRegistry::default()
            .pull_document(
                &reference(port, &target),
                &[POLICY_MEDIA_TYPE, ROOT_MEDIA_TYPE],
            )
            .unwrap_or_else(|e| panic!("{target}: {e}"));
        assert_eq!(pulled.bytes, DOCUMENT);
        assert_eq!(pulled.media_type, ROOT_MEDIA_TYPE);
        assert_eq!(pulled.manifest_digest, pushed.manifest_digest);
        assert_eq!(pulled.layer_digest, pushed.layer_digest);
    }
}

#[test]
fn a_layer_of_another_media_type_is_refused_before_it_is_fetched() {
    let server = document_registry(
        document_manifest(
            POLICY_MEDIA_TYPE,
            POLICY_MEDIA_TYPE,
            DOCUMENT,
            DOCUMENT.len() as u64,
        ),
        ok("application/octet-stream", DOCUMENT.to_vec()),
    );
    let kind = pull_document(server.port, ":prod", ROOT_MEDIA_TYPE).unwrap_err();
    assert_eq!(
        kind,
        Kind::WrongMediaType {
            part: Part::Document,
            found: POLICY_MEDIA_TYPE.to_owned(),
            expected: ROOT_MEDIA_TYPE.to_owned(),
        }
    );
    fetched_no_blob(&server);
    // A package artifact is no document either.
    let package = serve_seen(HashMap::from([(
        "/v2/fleet/manifests/prod".to_owned(),
        ok(
            OCI_MANIFEST_MEDIA_TYPE,
            manifest(&config(), LAYER, LAYER.len()),
        ),
    )]));
    assert!(matches!(
        pull_document(package.port, ":prod", ROOT_MEDIA_TYPE).unwrap_err(),
        Kind::WrongMediaType {
            part: Part::Document,
            ..
        }
    ));
    fetched_no_blob(&package);
}

#[test]
fn a_layer_over_the_document_limit_is_refused_before_it_is_fetched() {
    let size = MAX_DOCUMENT_BYTES as u64 + 1;
    let server = document_registry(
        document_manifest(ROOT_MEDIA_TYPE, ROOT_MEDIA_TYPE, DOCUMENT, size),
        endless(200, HUGE),
    );
    assert_eq!(
        pull_document(server.port, ":prod", ROOT_MEDIA_TYPE).unwrap_err(),
        Kind::TooLarge {
            part: Part::Document,
            size,
            limit: MAX_DOCUMENT_BYTES as u64,
        }
    );
    fetched_no_blob(&server);
}

#[test]
fn a_layer_longer_than_its_manifest_says_is_cut_off_there() {
    // The manifest names a small layer; the registry sends far more, without a length.
    let server = document_registry(
        document_manifest(
            ROOT_MEDIA_TYPE,
            ROOT_MEDIA_TYPE,
            DOCUMENT,
            DOCUMENT.len() as u64,
        ),
        endless(200, HUGE),
    );
    let kind = pull_document(server.port, ":prod", ROOT_MEDIA_TYPE).unwrap_err();
    assert!(
        matches!(kind, Kind::TooLarge { part: Part::Document, limit, .. } if limit == DOCUMENT.len() as u64),
        "{kind:?}"
    );
    assert!(!server.sent_whole(&format!("/v2/fleet/blobs/{}", digest(DOCUMENT))));
}

#[test]
fn a_manifest_that_does_not_end_is_cut_off_at_the_limit() {
    let server = serve_seen(HashMap::from([(
        "/v2/fleet/manifests/prod".to_owned(),
        endless(200, HUGE),
    )]));
    let kind = pull_document(server.port, ":prod", ROOT_MEDIA_TYPE).unwrap_err();
    assert!(
        matches!(kind, Kind::ResponseTooLarge { what: "manifest", limit, .. } if limit == Limits::default().manifest_bytes),
        "{kind:?}"
    );
    assert!(!server.sent_whole("/v2/fleet/manifests/prod"));
    fetched_no_blob(&server);
}

#[test]
fn a_document_over_the_limit_is_not_pushed() {
    let server = serve_seen(HashMap::new());
    let big = vec![b' '; MAX_DOCUMENT_BYTES + 1];
    let kind = OciRegistry::default()
        .push_document(&reference(server.port, ":prod"), ROOT_MEDIA_TYPE, &big)
        .unwrap_err()
        .kind;
    assert!(
        matches!(
            kind,
            Kind::TooLarge {
                part: Part::Document,
                ..
            }
        ),
        "{kind:?}"
    );
    assert!(server.requests().is_empty());
}

/// A registry whose tokens expire: `/v2/` asks for a Bearer token from its own `/token`, which
/// issues `t1`, `t2`, … and makes the newest the only valid one; the document's manifest and
/// layer answer 401 to anything else. Storing 0 in the answered `AtomicU64` expires every
/// token issued so far; storing `u64::MAX` refuses every token until 0 is stored again.
fn registry_with_expiring_tokens() -> (Server, Arc<std::sync::atomic::AtomicU64>) {
    use std::sync::atomic::{AtomicU64, Ordering};
    let valid = Arc::new(AtomicU64::new(0));
    let issued = Arc::new(AtomicU64::new(0));
    let manifest = document_manifest(
        POLICY_MEDIA_TYPE,
        POLICY_MEDIA_TYPE,
        DOCUMENT,
        DOCUMENT.len() as u64,
    );
    let challenge = "Bearer realm=\"http://127.0.0.1:{PORT}/token\",service=\"reg\"";
    let state = Arc::clone(&valid);
    let server = serve_by(move |_, target, authorization| {
        let path = target.split('?').next().unwrap_or("");
        if path == "/token" {
            let n = issued.fetch_add(1, Ordering::SeqCst) + 1;
            // u64::MAX: the registry refuses every token, the new ones too.
            if state.load(Ordering::SeqCst) != u64::MAX {
                state.store(n, Ordering::SeqCst);
            }
            return Some(ok(
                "application/json",
                format!("{{\"token\": \"t{n}\"}}").into_bytes(),
            ));
        }
        let current = state.load(Ordering::SeqCst);
        let authorised =
            current > 0 && authorization == Some(format!("Bearer t{current}").as_str());
        if path == "/v2/" || !authorised {
            return Some(status(401, &[("WWW-Authenticate", challenge)]));
        }
        if path == "/v2/fleet/manifests/prod" {
            return Some(ok(OCI_MANIFEST_MEDIA_TYPE, manifest.clone()));
        }
        (path == format!("/v2/fleet/blobs/{}", digest(DOCUMENT)))
            .then(|| ok("application/octet-stream", DOCUMENT.to_vec()))
    });
    (server, valid)
}

/// The requests `server` saw after the first `from`, without their queries.
fn requests_after(server: &Server, from: usize) -> Vec<String> {
    server.requests()[from..]
        .iter()
        .map(|r| r.split('?').next().unwrap_or_default().to_owned())
        .collect()
}

/// An adapter that keeps its sessions pays the registry's API check and the token exchange
/// once: a poll of an unchanged tag is then its manifest request alone. When the registry
/// answers the kept token with 401 (it expired), the adapter authenticates again and asks once
/// more. Without kept sessions every call authenticates.
#[test]
fn a_kept_session_polls_with_one_request_and_authenticates_again_when_its_token_expires() {
    let (server, valid) = registry_with_expiring_tokens();
    let policy = reference(server.port, ":prod");
    let registry = OciRegistry::default().keeping_sessions();
    let pulled = registry
        .pull_document(&policy, &[POLICY_MEDIA_TYPE])
        .expect("the first pull failed");
    assert_eq!(pulled.bytes, DOCUMENT);
    let manifest = "GET /v2/fleet/manifests/prod".to_owned();
    let blob = format!("GET /v2/fleet/blobs/{}", digest(DOCUMENT));
    let authenticate = ["GET /v2/".to_owned(), "GET /token".to_owned()];
    let first: Vec<String> = authenticate
        .iter()
        .cloned()
        .chain([manifest.clone(), blob])
        .collect();
    assert_eq!(requests_after(&server, 0), first);

    for _ in 0..3 {
        let seen = server.requests().len();
        let resolved = registry
            .resolve_document(&policy, &[POLICY_MEDIA_TYPE])
            .expect("an unchanged poll failed");
        assert_eq!(resolved, pulled.manifest_digest);
        assert_eq!(
            requests_after(&server, seen),
            std::slice::from_ref(&manifest)
        );
    }

    // The token expires: one 401, the exchange again, the manifest again; then one request.
    valid.store(0, std::sync::atomic::Ordering::SeqCst);
    let seen = server.requests().len();
    registry
        .resolve_document(&policy, &[POLICY_MEDIA_TYPE])
        .expect("the poll after the token expired failed");
    let again: Vec<String> = std::iter::once(manifest.clone())
        .chain(authenticate.iter().cloned())
        .chain([manifest.clone()])
        .collect();
    assert_eq!(requests_after(&server, seen), again);
    let seen = server.requests().len();
    registry
        .resolve_document(&policy, &[POLICY_MEDIA_TYPE])
        .unwrap();
    assert_eq!(
        requests_after(&server, seen),
        std::slice::from_ref(&manifest)
    );

    // An adapter that keeps nothing authenticates at every call.
    let seen = server.requests().len();
    OciRegistry::default()
        .resolve_document(&policy, &[POLICY_MEDIA_TYPE])
        .unwrap();
    let fresh: Vec<String> = authenticate.iter().cloned().chain([manifest]).collect();
    assert_eq!(requests_after(&server, seen), fresh);
}

/// A kept session whose token the registry refuses even after a new exchange gives up after
/// that one retry, with the registry's refusal, and the next call starts afresh.
#[test]
fn a_kept_session_retries_a_refused_token_once() {
    let (server, valid) = registry_with_expiring_tokens();
    let policy = reference(server.port, ":prod");
    let registry = OciRegistry::default().keeping_sessions();
    registry
        .resolve_document(&policy, &[POLICY_MEDIA_TYPE])
        .unwrap();
    // From now on no token is valid: the newest is u64::MAX, which is never issued.
    valid.store(u64::MAX, std::sync::atomic::Ordering::SeqCst);
    let seen = server.requests().len();
    let kind = registry
        .resolve_document(&policy, &[POLICY_MEDIA_TYPE])
        .map(|_| ())
        .unwrap_err()
        .kind;
    assert!(
        matches!(kind, Kind::Unauthorized { status: 401, .. }),
        "{kind:?}"
    );
    let manifest = "GET /v2/fleet/manifests/prod".to_owned();
    assert_eq!(
        requests_after(&server, seen),
        [
            manifest.clone(),
            "GET /v2/".to_owned(),
            "GET /token".to_owned(),
            manifest.clone()
        ]
    );
    // The failed session was dropped: the next call authenticates first.
    valid.store(0, std::sync::atomic::Ordering::SeqCst);
    let seen = server.requests().len();
    registry
        .resolve_document(&policy, &[POLICY_MEDIA_TYPE])
        .unwrap();
    assert_eq!(
        requests_after(&server, seen),
        ["GET /v2/".to_owned(), "GET /token".to_owned(), manifest]
    );
}
