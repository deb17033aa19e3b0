//! A push against a hostile registry: huge or dripped answers to the upload requests, an
//! upload session elsewhere over plain HTTP, a registry that stores something else. Each must
//! end promptly with its typed error, having read no more of any answer than the limits allow.

use super::*;

use guild_ports::distribution::{PushRequest, Pushed};

/// Where the registry below opens upload sessions (with a state of its own in the query).
const SESSION: &str = "/upload/1?_state=abc";
/// Where the registry below says a manifest it took is (as the distribution spec has it).
const STORED: (&str, &str) = ("Location", "/v2/scan/manifests/t");

/// A registry that has no blob and takes every upload: the session at [`SESSION`], blobs PUT
/// there (or PATCHed), the manifest PUT at `scan:t`; `change` applied to its answers.
fn push_registry(change: impl FnOnce(&mut HashMap<String, Answer>)) -> Server {
    let mut answers = HashMap::from([
        (
            "POST /v2/scan/blobs/uploads/".to_owned(),
            status(202, &[("Location", SESSION)]),
        ),
        (
            "PATCH /upload/1".to_owned(),
            status(202, &[("Location", SESSION)]),
        ),
        (
            "PUT /upload/1".to_owned(),
            status(201, &[("Location", "/v2/scan/blobs/stored")]),
        ),
        (
            "PUT /v2/scan/manifests/t".to_owned(),
            status(201, &[STORED]),
        ),
    ]);
    change(&mut answers);
    serve_seen(answers)
}

fn artifact_config() -> ArtifactConfig {
    ArtifactConfig::parse(&config()).unwrap()
}

fn push_with(port: u16, settings: OciSettings) -> Result<Pushed, Kind> {
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("scan.gkmodule");
    std::fs::write(&archive, LAYER).unwrap();
    let reference = OciReference::parse(&format!("oci://127.0.0.1:{port}/scan:t")).unwrap();
    let config = artifact_config();
    OciRegistry::new(settings)
        .push(
            &reference,
            PushRequest {
                archive: &archive,
                config: &config,
                annotations: &[],
            },
            None,
        )
        .map_err(|e| e.kind)
}

fn push(port: u16) -> Result<Pushed, Kind> {
    push_with(port, OciSettings::default())
}

#[test]
fn an_honest_registry_is_pushed_to() {
    let server = push_registry(|_| {});
    let pushed = push(server.port).expect("the push failed");
    assert_eq!(pushed.layer_digest, Sha256Digest::of(LAYER));
    assert_eq!(pushed.layer_size, LAYER.len() as u64);
    let requests = server.requests();
    let config_digest = digest(&config()).replace(':', "%3A");
    let layer_digest = digest(LAYER).replace(':', "%3A");
    for expected in [
        format!("HEAD /v2/scan/blobs/{}", digest(&config())),
        format!("PUT {SESSION}&digest={config_digest}"),
        format!("HEAD /v2/scan/blobs/{}", digest(LAYER)),
        format!("PUT {SESSION}&digest={layer_digest}"),
        "PUT /v2/scan/manifests/t".to_owned(),
    ] {
        assert!(requests.contains(&expected), "{expected} in {requests:?}");
    }
    assert_eq!(
        requests
            .iter()
            .filter(|r| *r == "POST /v2/scan/blobs/uploads/")
            .count(),
        2,
        "{requests:?}"
    );
}

#[test]
fn blobs_the_registry_has_are_not_sent_again() {
    let server = push_registry(|a| {
        for blob in [digest(&config()), digest(LAYER)] {
            a.insert(format!("HEAD /v2/scan/blobs/{blob}"), status(200, &[]));
        }
    });
    push(server.port).expect("the push failed");
    let requests = server.requests();
    assert!(
        !requests.iter().any(|r| r.starts_with("POST")),
        "{requests:?}"
    );
    assert!(requests.contains(&"PUT /v2/scan/manifests/t".to_owned()));
}

#[test]
fn a_huge_error_body_on_the_upload_request_is_not_read_whole() {
    let path = "/v2/scan/blobs/uploads/";
    let server = push_registry(|a| {
        a.insert(format!("POST {path}"), endless(500, HUGE));
    });
    let kind = push(server.port).expect_err("the push was accepted");
    assert!(
        matches!(&kind, Kind::Registry { status: 500, .. }),
        "{kind:?}"
    );
    assert!(!server.sent_whole(path), "the error body was read whole");
}

#[test]
fn a_huge_error_body_on_the_manifest_upload_is_not_read_whole() {
    let path = "/v2/scan/manifests/t";
    let server = push_registry(|a| {
        a.insert(format!("PUT {path}"), endless(400, HUGE));
    });
    let kind = push(server.port).expect_err("the push was accepted");
    assert!(
        matches!(&kind, Kind::Registry { status: 400, .. }),
        "{kind:?}"
    );
    assert!(!server.sent_whole(path), "the error body was read whole");
}

#[test]
fn a_huge_answer_to_a_manifest_upload_that_succeeded_is_not_read() {
    let path = "/v2/scan/manifests/t";
    let server = push_registry(|a| {
        a.insert(
            format!("PUT {path}"),
            Answer {
                headers: vec![(STORED.0.into(), STORED.1.into())],
                ..endless(201, HUGE)
            },
        );
    });
    push(server.port).expect("the push failed");
    assert!(!server.sent_whole(path), "the answer was read whole");
}

#[test]
fn an_upload_session_on_plain_http_elsewhere_is_refused() {
    let server = push_registry(|a| {
        a.insert(
            "POST /v2/scan/blobs/uploads/".into(),
            status(202, &[("Location", "http://uploads.invalid/session")]),
        );
    });
    let kind = push(server.port).expect_err("the push was accepted");
    assert!(
        matches!(&kind, Kind::Insecure { reason } if reason.contains("http://uploads.invalid/session")),
        "{kind:?}"
    );
}

#[test]
fn an_upload_session_dripped_past_the_deadline_is_refused_naming_the_limit() {
    let path = "/v2/scan/blobs/uploads/";
    let server = push_registry(|a| {
        a.insert(
            format!("POST {path}"),
            Answer {
                slow_head: Some(Duration::from_millis(150)),
                ..status(202, &[("Location", SESSION)])
            },
        );
    });
    let settings = with_limits(|l| {
        l.download_deadline = Duration::from_secs(2);
        l.stall_window = Duration::from_secs(30);
        l.stall_bytes = 1;
    });
    let kind = push_with(server.port, settings).expect_err("the push was accepted");
    assert_eq!(
        kind,
        Kind::DeadlineExceeded {
            what: "upload session",
            url: format!("http://127.0.0.1:{}{path}", server.port),
            limit: Duration::from_secs(2),
        }
    );
}

#[test]
fn a_manifest_upload_answer_that_stalls_is_refused_naming_the_rate() {
    let path = "/v2/scan/manifests/t";
    let server = push_registry(|a| {
        a.insert(
            format!("PUT {path}"),
            Answer {
                slow_head: Some(Duration::from_millis(150)),
                ..status(201, &[STORED])
            },
        );
    });
    let settings = with_limits(|l| {
        l.stall_window = Duration::from_secs(2);
        l.stall_bytes = 1000;
    });
    let kind = push_with(server.port, settings).expect_err("the push was accepted");
    assert_eq!(
        kind,
        Kind::Stalled {
            what: "manifest upload",
            url: format!("http://127.0.0.1:{}{path}", server.port),
            min_bytes: 1000,
            window: Duration::from_secs(2),
        }
    );
}

#[test]
fn a_manifest_stored_under_another_digest_is_refused() {
    let other = format!("sha256:{}", "0".repeat(64));
    let server = push_registry(|a| {
        a.insert(
            "PUT /v2/scan/manifests/t".into(),
            status(201, &[STORED, ("Docker-Content-Digest", &other)]),
        );
    });
    let kind = push(server.port).expect_err("the push was accepted");
    assert!(
        matches!(&kind, Kind::Registry { status: 201, message } if message.contains(&other)),
        "{kind:?}"
    );
}

#[test]
fn a_refused_upload_is_a_refusal_of_the_credentials() {
    for (code, body) in [
        (401, &b""[..]),
        (403, &b""[..]),
        (
            400,
            &br#"{"errors":[{"code":"DENIED","message":"no"}]}"#[..],
        ),
    ] {
        let server = push_registry(|a| {
            a.insert(
                "PUT /v2/scan/manifests/t".into(),
                Answer {
                    body: body.to_vec(),
                    ..status(code, &[])
                },
            );
        });
        let kind = push(server.port).expect_err("the push was accepted");
        assert!(
            matches!(&kind, Kind::Unauthorized { registry, status }
                if *registry == format!("127.0.0.1:{}", server.port) && *status == code),
            "{code}: {kind:?}"
        );
    }
}

#[test]
fn the_token_is_asked_for_push_and_sent_with_every_request_to_the_registry() {
    let server = push_registry(|a| {
        a.insert("/token".into(), token_answer());
        a.insert(
            "/v2/".into(),
            status(
                401,
                &[(
                    "WWW-Authenticate",
                    "Bearer realm=\"http://127.0.0.1:{PORT}/token\",service=\"reg\"",
                )],
            ),
        );
    });
    let dir = tempfile::tempdir().unwrap();
    push_with(server.port, alice_for(server.port, &dir)).expect("the push failed");
    let requests = server.requests();
    let token = requests
        .iter()
        .find(|r| r.starts_with("GET /token"))
        .expect("no token request");
    assert!(
        token.contains("scope=repository%3Ascan%3Apull%2Cpush"),
        "{token}"
    );
    for (request, authorization) in requests.iter().zip(server.authorizations()) {
        let expected = if request.starts_with("GET /token") {
            Some(ALICE)
        } else if request == "GET /v2/" {
            None
        } else {
            Some("Bearer t0k3n")
        };
        assert_eq!(authorization.as_deref(), expected, "{request}");
    }
}
