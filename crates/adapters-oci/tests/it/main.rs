//! The adapter against a hostile registry: a small HTTP server on 127.0.0.1 that answers each
//! path as a test tells it to (redirect loops, an index, a truncated or oversized blob, a
//! manifest over the limit, a layer that is not the one the manifest names). Every answer must
//! be refused with its typed error, and a refused pull must leave no file behind.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Arc;

use guild_adapters_oci::{OciRegistry, OciSettings};
use guild_domain::distribution::{
    layer_media_type, ArtifactConfig, OciReference, CONFIG_MEDIA_TYPE, OCI_INDEX_MEDIA_TYPE,
    OCI_MANIFEST_MEDIA_TYPE,
};
use guild_domain::ids::{PackageId, PackageKind, PublisherId, Sha256Digest};
use guild_domain::version::Version;
use guild_ports::distribution::{ArtifactRegistry, DistributionErrorKind as Kind, Part};

/// One canned answer: status, extra headers, body, and optionally fewer body bytes than the
/// Content-Length announces (the connection then closes early).
#[derive(Clone)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    send_only: Option<usize>,
}

fn ok(content_type: &str, body: Vec<u8>) -> Answer {
    Answer {
        status: 200,
        headers: vec![("Content-Type".into(), content_type.into())],
        body,
        send_only: None,
    }
}

/// Serves `answers` by path (anything else is 404) until the test ends; returns the port.
fn serve(answers: HashMap<String, Answer>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let answers = Arc::new(answers);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let answers = Arc::clone(&answers);
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() {
                    return;
                }
                let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
                loop {
                    let mut header = String::new();
                    if reader.read_line(&mut header).unwrap_or(0) == 0 || header == "\r\n" {
                        break;
                    }
                }
                let path = path.split('?').next().unwrap_or("").to_owned();
                let answer = if path == "/v2/" {
                    ok("application/json", b"{}".to_vec())
                } else {
                    answers.get(&path).cloned().unwrap_or(Answer {
                        status: 404,
                        headers: Vec::new(),
                        body: br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"unknown"}]}"#
                            .to_vec(),
                        send_only: None,
                    })
                };
                let mut head = format!(
                    "HTTP/1.1 {} X\r\nContent-Length: {}\r\nConnection: close\r\n",
                    answer.status,
                    answer.body.len()
                );
                for (k, v) in &answer.headers {
                    head.push_str(&format!("{k}: {v}\r\n"));
                }
                head.push_str("\r\n");
                let _ = stream.write_all(head.as_bytes());
                let n = answer.send_only.unwrap_or(answer.body.len());
                let _ = stream.write_all(&answer.body[..n]);
                let _ = stream.flush();
            });
        }
    });
    port
}

fn config() -> Vec<u8> {
    ArtifactConfig {
        id: PackageId::new("example.scan").unwrap(),
        version: Version::parse("1.0.0").unwrap(),
        kind: PackageKind::Module,
        publisher: PublisherId::new("org.example").unwrap(),
        payload_sha256: Sha256Digest([1; 32]),
    }
    .to_json()
    .into_bytes()
}

fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", Sha256Digest::of(bytes).to_hex())
}

fn manifest(config: &[u8], layer: &[u8], layer_size: usize) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST_MEDIA_TYPE,
        "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": digest(config), "size": config.len()},
        "layers": [{"mediaType": layer_media_type(PackageKind::Module), "digest": digest(layer), "size": layer_size}],
    }))
    .unwrap()
}

/// A registry serving one package artifact at `scan:t`, with `change` applied to its answers.
fn registry(layer: &[u8], change: impl FnOnce(&mut HashMap<String, Answer>)) -> u16 {
    let config = config();
    let mut answers = HashMap::new();
    answers.insert(
        "/v2/scan/manifests/t".to_owned(),
        ok(
            OCI_MANIFEST_MEDIA_TYPE,
            manifest(&config, layer, layer.len()),
        ),
    );
    answers.insert(
        format!("/v2/scan/blobs/{}", digest(&config)),
        ok("application/octet-stream", config.clone()),
    );
    answers.insert(
        format!("/v2/scan/blobs/{}", digest(layer)),
        ok("application/octet-stream", layer.to_vec()),
    );
    change(&mut answers);
    serve(answers)
}

struct Pull {
    result: Result<guild_ports::distribution::Pulled, Kind>,
    left_file: bool,
}

fn pull(port: u16) -> Pull {
    pull_target(port, ":t")
}

/// Pulls `scan` by `target` (`:TAG` or `@sha256:…`).
fn pull_target(port: u16, target: &str) -> Pull {
    let dir = tempfile::tempdir().unwrap();
    let out: PathBuf = dir.path().join("pkg.gkmodule");
    let reference = OciReference::parse(&format!("oci://127.0.0.1:{port}/scan{target}")).unwrap();
    let result = OciRegistry::new(OciSettings::default())
        .pull(&reference, &out, None)
        .map_err(|e| e.kind);
    Pull {
        result,
        left_file: out.exists(),
    }
}

#[track_caller]
fn refused(p: Pull) -> Kind {
    assert!(!p.left_file, "a refused pull left its output file");
    p.result.expect_err("the pull was accepted")
}

const LAYER: &[u8] = b"a package archive, as far as the transport knows";

#[test]
fn an_honest_registry_is_pulled() {
    let p = pull(registry(LAYER, |_| {}));
    assert!(p.left_file);
    let pulled = p.result.unwrap();
    assert_eq!(pulled.layer_size, LAYER.len() as u64);
    assert_eq!(pulled.layer_digest, Sha256Digest::of(LAYER));
    assert_eq!(pulled.config.id.as_str(), "example.scan");
}

#[test]
fn a_redirect_loop_is_refused() {
    let port = registry(LAYER, |a| {
        a.insert(
            "/v2/scan/manifests/t".into(),
            Answer {
                status: 302,
                headers: vec![("Location".into(), "/v2/scan/manifests/t".into())],
                body: Vec::new(),
                send_only: None,
            },
        );
    });
    assert_eq!(refused(pull(port)), Kind::RedirectLoop);
}

#[test]
fn an_index_instead_of_a_manifest_is_refused() {
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": OCI_INDEX_MEDIA_TYPE, "manifests": []
    }))
    .unwrap();
    let port = registry(LAYER, |a| {
        a.insert(
            "/v2/scan/manifests/t".into(),
            ok(OCI_INDEX_MEDIA_TYPE, index),
        );
    });
    assert_eq!(refused(pull(port)), Kind::IndexNotManifest);
}

#[test]
fn a_manifest_over_the_limit_is_refused() {
    let mut big: serde_json::Value =
        serde_json::from_slice(&manifest(&config(), LAYER, LAYER.len())).unwrap();
    big["annotations"] = serde_json::json!({"padding": "x".repeat(300 * 1024)});
    let port = registry(LAYER, |a| {
        a.insert(
            "/v2/scan/manifests/t".into(),
            ok(OCI_MANIFEST_MEDIA_TYPE, serde_json::to_vec(&big).unwrap()),
        );
    });
    assert!(matches!(
        refused(pull(port)),
        Kind::TooLarge {
            part: Part::Manifest,
            ..
        }
    ));
}

#[test]
fn a_truncated_layer_stream_is_refused() {
    let port = registry(LAYER, |a| {
        let key = format!("/v2/scan/blobs/{}", digest(LAYER));
        a.get_mut(&key).unwrap().send_only = Some(10);
    });
    assert!(matches!(
        refused(pull(port)),
        Kind::Truncated {
            part: Part::Layer,
            received: 10,
            ..
        }
    ));
}

#[test]
fn a_layer_longer_than_its_descriptor_is_refused() {
    let port = registry(LAYER, |a| {
        let key = format!("/v2/scan/blobs/{}", digest(LAYER));
        a.get_mut(&key)
            .unwrap()
            .body
            .extend_from_slice(b" and more");
    });
    assert!(matches!(
        refused(pull(port)),
        Kind::TooLarge {
            part: Part::Layer,
            ..
        }
    ));
}

#[test]
fn a_layer_with_other_bytes_is_refused_by_digest() {
    let port = registry(LAYER, |a| {
        let key = format!("/v2/scan/blobs/{}", digest(LAYER));
        let body = &mut a.get_mut(&key).unwrap().body;
        body[0] ^= 1;
    });
    assert!(matches!(
        refused(pull(port)),
        Kind::DigestMismatch {
            part: Part::Layer,
            ..
        }
    ));
}

#[test]
fn a_layer_of_another_media_type_is_refused_before_it_is_fetched() {
    let config = config();
    let mut m: serde_json::Value =
        serde_json::from_slice(&manifest(&config, LAYER, LAYER.len())).unwrap();
    m["layers"][0]["mediaType"] = "application/vnd.oci.image.layer.v1.tar+gzip".into();
    let port = registry(LAYER, |a| {
        a.insert(
            "/v2/scan/manifests/t".into(),
            ok(OCI_MANIFEST_MEDIA_TYPE, serde_json::to_vec(&m).unwrap()),
        );
    });
    assert!(matches!(
        refused(pull(port)),
        Kind::WrongMediaType {
            part: Part::Layer,
            ..
        }
    ));
}

#[test]
fn a_manifest_that_is_not_the_pinned_digest_is_refused_naming_both_digests() {
    // The reference pins one manifest digest; the registry answers that path with another
    // manifest (the real one, whose digest differs).
    let served = manifest(&config(), LAYER, LAYER.len());
    let pinned = Sha256Digest::of(b"the manifest the publisher pushed");
    let port = registry(LAYER, |a| {
        a.insert(
            format!("/v2/scan/manifests/sha256:{}", pinned.to_hex()),
            ok(OCI_MANIFEST_MEDIA_TYPE, served.clone()),
        );
    });
    let kind = refused(pull_target(port, &format!("@sha256:{}", pinned.to_hex())));
    assert_eq!(
        kind,
        Kind::DigestMismatch {
            part: Part::Manifest,
            expected: pinned.to_hex(),
            actual: Sha256Digest::of(&served).to_hex(),
        }
    );
    let text = kind.to_string();
    assert_eq!(
        text,
        format!(
            "the manifest's digest is sha256:{}, the reference names sha256:{}",
            Sha256Digest::of(&served).to_hex(),
            pinned.to_hex()
        )
    );
}

#[test]
fn a_config_that_is_not_an_artifact_config_is_refused_as_malformed() {
    let config = br#"{"architecture": "amd64", "os": "linux"}"#.to_vec();
    let port = registry(LAYER, |a| {
        a.insert(
            "/v2/scan/manifests/t".into(),
            ok(
                OCI_MANIFEST_MEDIA_TYPE,
                manifest(&config, LAYER, LAYER.len()),
            ),
        );
        a.insert(
            format!("/v2/scan/blobs/{}", digest(&config)),
            ok("application/octet-stream", config.clone()),
        );
    });
    assert!(matches!(
        refused(pull(port)),
        Kind::Malformed {
            part: Part::Config,
            ..
        }
    ));
}
