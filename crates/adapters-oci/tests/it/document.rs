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
