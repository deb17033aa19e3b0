//! The adapter against a hostile registry: a small HTTP server on 127.0.0.1 that answers each
//! path as a test tells it to (redirect loops, an index, a truncated or oversized blob, a
//! manifest over the limit, a layer that is not the one the manifest names). Every answer must
//! be refused with its typed error, and a refused pull must leave no file behind. `push` does
//! the same for uploads.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use guild_adapters_oci::{Limits, OciRegistry, OciSettings};
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
    /// Instead of `body`: this many bytes, sent without a Content-Length (the end of the
    /// connection ends the body), generated as they go and never held whole.
    endless: Option<Drip>,
    /// The status line and headers sent a byte at a time, this long apart.
    slow_head: Option<Duration>,
}

/// A generated body: `total` bytes in pieces of `piece`, with `pause` between pieces.
#[derive(Clone, Copy)]
struct Drip {
    total: u64,
    piece: usize,
    pause: Duration,
}

/// A body far larger than anything the adapter may read, sent as fast as it is taken.
const HUGE: Drip = Drip {
    total: 256 << 20,
    piece: 64 * 1024,
    pause: Duration::ZERO,
};

fn ok(content_type: &str, body: Vec<u8>) -> Answer {
    Answer {
        status: 200,
        headers: vec![("Content-Type".into(), content_type.into())],
        body,
        send_only: None,
        endless: None,
        slow_head: None,
    }
}

fn status(status: u16, headers: &[(&str, &str)]) -> Answer {
    Answer {
        status,
        headers: headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        body: Vec::new(),
        send_only: None,
        endless: None,
        slow_head: None,
    }
}

/// What a server saw: each request's path and Authorization header, each request as
/// `METHOD TARGET` (the query kept), and the paths whose generated body it managed to send
/// whole.
#[derive(Default)]
struct Seen {
    requests: Vec<(String, Option<String>)>,
    lines: Vec<String>,
    sent_whole: Vec<String>,
}

struct Server {
    port: u16,
    seen: Arc<Mutex<Seen>>,
}

impl Server {
    fn authorization_of(&self, path: &str) -> Vec<Option<String>> {
        let seen = self.seen.lock().unwrap();
        seen.requests
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, a)| a.clone())
            .collect()
    }

    /// Every request so far, as `METHOD TARGET`.
    fn requests(&self) -> Vec<String> {
        self.seen.lock().unwrap().lines.clone()
    }

    /// The Authorization header of every request so far.
    fn authorizations(&self) -> Vec<Option<String>> {
        let seen = self.seen.lock().unwrap();
        seen.requests.iter().map(|(_, a)| a.clone()).collect()
    }

    fn sent_whole(&self, path: &str) -> bool {
        self.seen
            .lock()
            .unwrap()
            .sent_whole
            .iter()
            .any(|p| p == path)
    }
}

/// Serves `answers` by path (anything else is 404) until the test ends; returns the port.
fn serve(answers: HashMap<String, Answer>) -> u16 {
    serve_seen(answers).port
}

/// Serves `answers` by `METHOD TARGET` or target (the query kept), else by `METHOD PATH` or
/// path (`/v2/` answers 200 unless listed; anything else is 404) until the test ends,
/// recording what it saw. A request's body (by its Content-Length, or chunked) is read and
/// dropped before the answer.
fn serve_seen(answers: HashMap<String, Answer>) -> Server {
    serve_by(move |method, target, _| {
        // The whole target (its query kept) first: one page of a list each.
        let path = target.split('?').next().unwrap_or("");
        answers
            .get(&format!("{method} {target}"))
            .or_else(|| answers.get(target))
            .or_else(|| answers.get(&format!("{method} {path}")))
            .or_else(|| answers.get(path))
            .cloned()
    })
}

/// Serves what `answer(METHOD, TARGET, AUTHORIZATION)` says (TARGET is the path with its query) (`None`: `/v2/` answers 200,
/// anything else 404), as [`serve_seen`] does.
fn serve_by(
    answer: impl Fn(&str, &str, Option<&str>) -> Option<Answer> + Send + Sync + 'static,
) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let answers = Arc::new(answer);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let record = Arc::clone(&seen);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let answers = Arc::clone(&answers);
            let record = Arc::clone(&record);
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() {
                    return;
                }
                let method = line.split_whitespace().next().unwrap_or("").to_owned();
                let target = line.split_whitespace().nth(1).unwrap_or("").to_owned();
                let mut authorization = None;
                let mut length = 0usize;
                let mut chunked = false;
                loop {
                    let mut header = String::new();
                    if reader.read_line(&mut header).unwrap_or(0) == 0 || header == "\r\n" {
                        break;
                    }
                    if let Some((k, v)) = header.split_once(':') {
                        if k.eq_ignore_ascii_case("authorization") {
                            authorization = Some(v.trim().to_owned());
                        } else if k.eq_ignore_ascii_case("content-length") {
                            length = v.trim().parse().unwrap_or(0);
                        } else if k.eq_ignore_ascii_case("transfer-encoding") {
                            chunked = v.trim().eq_ignore_ascii_case("chunked");
                        }
                    }
                }
                if !read_body(&mut reader, length, chunked) {
                    return;
                }
                let path = target.split('?').next().unwrap_or("").to_owned();
                let found = answers(&method, &target, authorization.as_deref());
                {
                    let mut seen = record.lock().unwrap();
                    seen.requests.push((path.clone(), authorization));
                    seen.lines.push(format!("{method} {target}"));
                }
                let answer = match found {
                    Some(a) => a,
                    None if path == "/v2/" => ok("application/json", b"{}".to_vec()),
                    None => Answer {
                        status: 404,
                        headers: Vec::new(),
                        body: br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"unknown"}]}"#
                            .to_vec(),
                        send_only: None,
                        endless: None,
                        slow_head: None,
                    },
                };
                let mut head = format!("HTTP/1.1 {} X\r\nConnection: close\r\n", answer.status);
                if answer.endless.is_none() {
                    head.push_str(&format!("Content-Length: {}\r\n", answer.body.len()));
                }
                for (k, v) in &answer.headers {
                    let v = v.replace("{PORT}", &port.to_string());
                    head.push_str(&format!("{k}: {v}\r\n"));
                }
                head.push_str("\r\n");
                match answer.slow_head {
                    Some(pause) => {
                        for byte in head.as_bytes() {
                            if stream.write_all(&[*byte]).is_err() {
                                return;
                            }
                            std::thread::sleep(pause);
                        }
                    }
                    None => {
                        let _ = stream.write_all(head.as_bytes());
                    }
                }
                if let Some(drip) = answer.endless {
                    let piece = vec![b'x'; drip.piece];
                    let mut sent = 0u64;
                    while sent < drip.total {
                        let n = piece.len().min((drip.total - sent) as usize);
                        if stream.write_all(&piece[..n]).is_err() {
                            return;
                        }
                        sent += n as u64;
                        std::thread::sleep(drip.pause);
                    }
                    record.lock().unwrap().sent_whole.push(path);
                    return;
                }
                let n = answer.send_only.unwrap_or(answer.body.len());
                let _ = stream.write_all(&answer.body[..n]);
                let _ = stream.flush();
            });
        }
    });
    Server { port, seen }
}

/// Reads and drops a request body of `length` bytes, or a chunked one. False when the
/// connection failed.
fn read_body(reader: &mut impl BufRead, length: usize, chunked: bool) -> bool {
    if !chunked {
        return std::io::copy(&mut reader.take(length as u64), &mut std::io::sink()).is_ok();
    }
    loop {
        let mut size = String::new();
        if reader.read_line(&mut size).unwrap_or(0) == 0 {
            return false;
        }
        let Ok(n) = u64::from_str_radix(size.trim(), 16) else {
            return false;
        };
        // The chunk and its CRLF (after the last, empty chunk: the final CRLF).
        if std::io::copy(&mut reader.take(n + 2), &mut std::io::sink()).is_err() {
            return false;
        }
        if n == 0 {
            return true;
        }
    }
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
    pull_with(port, target, OciSettings::default())
}

fn pull_with(port: u16, target: &str, settings: OciSettings) -> Pull {
    let dir = tempfile::tempdir().unwrap();
    let out: PathBuf = dir.path().join("pkg.gkmodule");
    let reference = OciReference::parse(&format!("oci://127.0.0.1:{port}/scan{target}")).unwrap();
    let result = OciRegistry::new(settings)
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
                endless: None,
                slow_head: None,
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
    // The announced length is over the limit: refused before a byte of the body is read.
    assert!(matches!(
        refused(pull(port)),
        Kind::ResponseTooLarge {
            what: "manifest",
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

/// The registry of `registry` with its answer at `path` replaced by `answer`, and what it saw.
fn registry_seen(layer: &[u8], path: &str, answer: Answer) -> Server {
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
    answers.insert(path.to_owned(), answer);
    serve_seen(answers)
}

fn endless(status_code: u16, drip: Drip) -> Answer {
    Answer {
        endless: Some(drip),
        ..status(status_code, &[("Content-Type", "application/octet-stream")])
    }
}

#[test]
fn a_manifest_that_does_not_end_is_cut_off_at_the_limit_naming_its_url() {
    let path = "/v2/scan/manifests/t";
    let server = registry_seen(LAYER, path, endless(200, HUGE));
    let kind = refused(pull(server.port));
    let Kind::ResponseTooLarge { what, url, limit } = &kind else {
        panic!("not cut off: {kind:?}");
    };
    assert_eq!(
        (*what, *limit),
        ("manifest", Limits::default().manifest_bytes)
    );
    assert_eq!(url, &format!("http://127.0.0.1:{}{path}", server.port));
    assert!(
        kind.to_string()
            .contains(&format!("larger than {limit} bytes")),
        "{kind}"
    );
    assert!(!server.sent_whole(path), "the manifest was read whole");
}

#[test]
fn a_huge_error_body_is_not_read_whole() {
    let path = "/v2/scan/manifests/t";
    let server = registry_seen(LAYER, path, endless(404, HUGE));
    assert_eq!(refused(pull(server.port)), Kind::NotFound);
    assert!(!server.sent_whole(path), "the error body was read whole");
}

#[test]
fn a_token_response_that_does_not_end_is_cut_off() {
    let realm = serve_seen(HashMap::from([("/token".to_owned(), endless(200, HUGE))]));
    let challenge = format!(
        "Bearer realm=\"http://127.0.0.1:{}/token\",service=\"reg\"",
        realm.port
    );
    let server = registry_seen(
        LAYER,
        "/v2/",
        status(401, &[("WWW-Authenticate", &challenge)]),
    );
    let kind = refused(pull(server.port));
    assert!(
        matches!(&kind, Kind::ResponseTooLarge { what: "token response", url, .. }
            if url.starts_with(&format!("http://127.0.0.1:{}/token", realm.port))),
        "{kind:?}"
    );
    assert!(
        !realm.sent_whole("/token"),
        "the token response was read whole"
    );
}

/// A layer of 40 bytes sent one byte every 150 ms: six seconds in all. The limits below leave
/// two seconds for everything before the layer, however loaded the machine.
const SLOW: Drip = Drip {
    total: 40,
    piece: 1,
    pause: Duration::from_millis(150),
};

fn slow_layer_registry() -> (Server, String) {
    let layer = vec![b'x'; SLOW.total as usize];
    let path = format!("/v2/scan/blobs/{}", digest(&layer));
    (registry_seen(&layer, &path, endless(200, SLOW)), path)
}

fn with_limits(change: impl FnOnce(&mut Limits)) -> OciSettings {
    let mut settings = OciSettings::default();
    change(&mut settings.limits);
    settings
}

#[test]
fn a_layer_dripped_past_the_deadline_is_refused_naming_the_limit() {
    let (server, path) = slow_layer_registry();
    let settings = with_limits(|l| {
        l.download_deadline = Duration::from_secs(2);
        l.stall_window = Duration::from_secs(30);
        l.stall_bytes = 1;
    });
    let kind = refused(pull_with(server.port, ":t", settings));
    assert_eq!(
        kind,
        Kind::DeadlineExceeded {
            what: "package layer",
            url: format!("http://127.0.0.1:{}{path}", server.port),
            limit: Duration::from_secs(2),
        }
    );
}

#[test]
fn a_layer_that_stalls_is_refused_naming_the_rate() {
    let (server, path) = slow_layer_registry();
    let settings = with_limits(|l| {
        l.stall_window = Duration::from_secs(2);
        l.stall_bytes = 1000;
    });
    let kind = refused(pull_with(server.port, ":t", settings));
    assert_eq!(
        kind,
        Kind::Stalled {
            what: "package layer",
            url: format!("http://127.0.0.1:{}{path}", server.port),
            min_bytes: 1000,
            window: Duration::from_secs(2),
        }
    );
}

/// Settings whose credential file gives `alice:s3cr3t` for the registry on `port`.
fn alice_for(port: u16, dir: &tempfile::TempDir) -> OciSettings {
    let file = dir.path().join("config.json");
    std::fs::write(
        &file,
        // base64("alice:s3cr3t")
        format!(r#"{{"auths": {{"127.0.0.1:{port}": {{"auth": "YWxpY2U6czNjcjN0"}}}}}}"#),
    )
    .unwrap();
    OciSettings {
        auth_files: vec![file],
        ..OciSettings::default()
    }
}

const ALICE: &str = "Basic YWxpY2U6czNjcjN0";

fn token_answer() -> Answer {
    ok("application/json", br#"{"token": "t0k3n"}"#.to_vec())
}

#[test]
fn basic_credentials_are_not_sent_to_a_plain_http_realm_of_another_origin() {
    let realm = serve_seen(HashMap::from([("/token".to_owned(), token_answer())]));
    let challenge = format!(
        "Bearer realm=\"http://127.0.0.1:{}/token\",service=\"reg\"",
        realm.port
    );
    let server = registry_seen(
        LAYER,
        "/v2/",
        status(401, &[("WWW-Authenticate", &challenge)]),
    );
    let dir = tempfile::tempdir().unwrap();
    let p = pull_with(server.port, ":t", alice_for(server.port, &dir));
    p.result.expect("the pull failed");
    assert_eq!(realm.authorization_of("/token"), vec![None]);
    assert_eq!(
        server.authorization_of("/v2/scan/manifests/t"),
        vec![Some("Bearer t0k3n".to_owned())]
    );
}

#[test]
fn basic_credentials_go_to_a_realm_of_the_registry_itself() {
    let mut answers = HashMap::from([
        ("/token".to_owned(), token_answer()),
        (
            "/v2/".to_owned(),
            status(
                401,
                &[(
                    "WWW-Authenticate",
                    "Bearer realm=\"http://127.0.0.1:{PORT}/token\",service=\"reg\"",
                )],
            ),
        ),
    ]);
    let config = config();
    answers.insert(
        "/v2/scan/manifests/t".to_owned(),
        ok(
            OCI_MANIFEST_MEDIA_TYPE,
            manifest(&config, LAYER, LAYER.len()),
        ),
    );
    answers.insert(
        format!("/v2/scan/blobs/{}", digest(&config)),
        ok("application/octet-stream", config.clone()),
    );
    answers.insert(
        format!("/v2/scan/blobs/{}", digest(LAYER)),
        ok("application/octet-stream", LAYER.to_vec()),
    );
    let server = serve_seen(answers);
    let dir = tempfile::tempdir().unwrap();
    let p = pull_with(server.port, ":t", alice_for(server.port, &dir));
    p.result.expect("the pull failed");
    assert_eq!(
        server.authorization_of("/token"),
        vec![Some(ALICE.to_owned())]
    );
}

#[test]
fn a_blob_redirect_to_plain_http_elsewhere_is_refused() {
    let path = format!("/v2/scan/blobs/{}", digest(LAYER));
    let server = registry_seen(
        LAYER,
        &path,
        status(307, &[("Location", "http://blobs.invalid/layer")]),
    );
    let kind = refused(pull(server.port));
    assert!(
        matches!(&kind, Kind::Insecure { reason } if reason.contains("http://blobs.invalid/layer")),
        "{kind:?}"
    );
}

#[test]
fn a_token_realm_on_plain_http_elsewhere_is_refused() {
    let server = registry_seen(
        LAYER,
        "/v2/",
        status(
            401,
            &[(
                "WWW-Authenticate",
                "Bearer realm=\"http://auth.invalid/token\",service=\"reg\"",
            )],
        ),
    );
    let kind = refused(pull(server.port));
    assert!(
        matches!(&kind, Kind::Insecure { reason } if reason.contains("http://auth.invalid/token")),
        "{kind:?}"
    );
}

mod document;
mod push;
mod tags;
