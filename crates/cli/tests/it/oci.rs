//! `guild push`, `pull`, `install oci://…`, `lock` and `sync` against a real registry: Debian's
//! `docker-registry` (the CNCF distribution registry), started on 127.0.0.1 with a free port and
//! a temporary storage directory for each test, and stopped after it.
//!
//! Without the binary the tests say that they skipped; `GUILD_REQUIRE_REGISTRY=1` (which CI
//! sets, and `cargo xtask test` installs the package for) turns the skip into a failure.

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use guild_test_support::guild::{Bench, Run};
use guild_test_support::Scratch;

use crate::guild;

const BINARY: &str = "docker-registry";

/// A running registry; stopped (killed and reaped) when dropped.
pub struct Registry {
    child: Option<Child>,
    pub port: u16,
    pub storage: PathBuf,
    config: PathBuf,
    log: PathBuf,
    _dir: Scratch,
}

/// Basic-auth credentials for a registry started with an htpasswd file.
pub struct Credentials {
    pub user: &'static str,
    pub password: &'static str,
}

impl Registry {
    /// Starts a registry, or returns `None` (having said why) when the binary is absent and
    /// the environment does not require it.
    pub fn start(test: &str, auth: Option<&Credentials>) -> Option<Registry> {
        Self::start_with(test, auth, false)
    }

    /// [`Registry::start`] with the registry's access log (one line per request) written to
    /// [`Registry::access_log`].
    pub fn start_logged(test: &str) -> Option<Registry> {
        Self::start_with(test, None, true)
    }

    fn start_with(test: &str, auth: Option<&Credentials>, logged: bool) -> Option<Registry> {
        let found = Command::new(BINARY)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            let required = std::env::var("GUILD_REQUIRE_REGISTRY").is_ok_and(|v| v == "1");
            assert!(
                !required,
                "GUILD_REQUIRE_REGISTRY=1 but {BINARY} is not installed (apt-get install docker-registry)"
            );
            eprintln!(
                "{test}: skipped because {BINARY} is not installed (apt-get install \
                 docker-registry); set GUILD_REQUIRE_REGISTRY=1 to fail instead"
            );
            return None;
        }
        let dir = Scratch::new();
        let storage = dir.path().join("storage");
        fs::create_dir_all(&storage).unwrap();
        let port = free_port();
        let mut config = format!(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: {}\n\
             storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
             http:\n  addr: 127.0.0.1:{port}\n",
            !logged,
            storage.display()
        );
        if let Some(c) = auth {
            let htpasswd = dir.path().join("htpasswd");
            let out = Command::new("htpasswd")
                .args(["-Bbn", c.user, c.password])
                .output()
                .expect("htpasswd (apache2-utils) runs");
            assert!(out.status.success(), "htpasswd failed");
            fs::write(&htpasswd, out.stdout).unwrap();
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: guild-test\n    path: {}\n",
                htpasswd.display()
            ));
        }
        let config_path = dir.path().join("config.yml");
        fs::write(&config_path, config).unwrap();
        let mut registry = Registry {
            child: None,
            port,
            storage,
            config: config_path,
            log: dir.path().join("registry.log"),
            _dir: dir,
        };
        registry.resume();
        Some(registry)
    }

    /// Starts the registry again after [`Registry::stop`], on the same port with the same
    /// storage: what a registry that comes back after an outage serves.
    pub fn resume(&mut self) {
        assert!(self.child.is_none(), "the registry is running");
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(BINARY)
            .arg("serve")
            .arg(&self.config)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("docker-registry starts");
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = s.write_all(b"GET /v2/ HTTP/1.0\r\n\r\n");
                let mut buf = [0u8; 12];
                if s.read_exact(&mut buf).is_ok() && buf.starts_with(b"HTTP/1.") {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the registry did not answer on port {}", self.port);
    }

    /// `oci://127.0.0.1:PORT/REPO:TAG` (or any suffix).
    pub fn reference(&self, path: &str) -> String {
        format!("oci://127.0.0.1:{}/{path}", self.port)
    }

    /// Stops the registry now.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// What the registry printed (its access log, when started with [`Registry::start_logged`]).
    pub fn access_log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The file holding a blob in the registry's storage.
    pub fn blob_file(&self, hex: &str) -> PathBuf {
        self.storage
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A registry without authentication and a bench, or `None` when the test skips.
pub(crate) fn start(test: &str) -> Option<(Registry, Bench)> {
    Some((Registry::start(test, None)?, Bench::new(guild())))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs `guild --store STORE ARGS` with no credentials but `auth` (a config.json) and no
/// inherited registry settings.
pub(crate) fn run(bench: &Bench, store: &Path, auth: Option<&Path>, args: &[&str]) -> Run {
    let mut all = vec!["--store", store.to_str().unwrap()];
    all.extend_from_slice(args);
    let mut cmd = guild().command(bench.path(), &all);
    cmd.env("HOME", bench.path())
        .env_remove("DOCKER_CONFIG")
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("GUILD_INSECURE_REGISTRIES")
        .env_remove("REGISTRY_AUTH_FILE");
    if let Some(a) = auth {
        cmd.env("REGISTRY_AUTH_FILE", a);
    }
    let out = cmd.output().unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[track_caller]
pub(crate) fn ok(r: Run) -> Run {
    assert_eq!(r.code, 0, "stdout:\n{}\nstderr:\n{}", r.stdout, r.stderr);
    r
}

#[track_caller]
pub(crate) fn fails(r: Run, code: i32, says: &str) -> Run {
    assert_eq!(r.code, code, "stdout:\n{}\nstderr:\n{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains(says),
        "stderr lacks {says:?}:\n{}",
        r.stderr
    );
    r
}

/// A fresh store that trusts the bench's key.
fn trusting_store(bench: &Bench, name: &str) -> PathBuf {
    let store = bench.path().join(name);
    ok(run(
        bench,
        &store,
        None,
        &["trust", "add", "org.example", "k.pub"],
    ));
    store
}

/// The enabled packages of a store: (id, version, payload digest).
fn enabled(bench: &Bench, store: &Path) -> Vec<(String, String, String)> {
    let out = ok(run(bench, store, None, &["--json", "list"])).json();
    let mut rows = Vec::new();
    for p in out["packages"].as_array().unwrap() {
        let Some(v) = p["enabled"].as_str() else {
            continue;
        };
        let digest = p["versions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["version"] == v)
            .unwrap()["payload_sha256"]
            .as_str()
            .unwrap()
            .to_owned();
        rows.push((p["id"].as_str().unwrap().to_owned(), v.to_owned(), digest));
    }
    rows
}

fn push(bench: &Bench, file: &str, reference: &str) -> String {
    let out = ok(run(
        bench,
        &bench.store(),
        None,
        &["--json", "push", file, reference],
    ))
    .json();
    out["manifest_digest"].as_str().unwrap().to_owned()
}

#[test]
fn oci_push_then_install_by_tag_and_by_digest() {
    let Some((registry, bench)) = start("oci_push_then_install_by_tag_and_by_digest") else {
        return;
    };
    let archive = bench.package("example.scan", "1.0.0", b"scan one", "");
    let tag = registry.reference("guild/scan:1.0.0");
    let digest = push(&bench, &archive, &tag);
    assert!(
        digest.starts_with("sha256:") && digest.len() == 71,
        "{digest}"
    );
    // The plain output prints the manifest digest.
    let again = ok(run(&bench, &bench.store(), None, &["push", &archive, &tag]));
    assert!(again.stdout.contains(&digest), "{}", again.stdout);

    let by_tag = trusting_store(&bench, "by-tag");
    let out = ok(run(&bench, &by_tag, None, &["--json", "install", &tag])).json();
    assert_eq!(out["manifest_digest"], digest.as_str());
    assert_eq!(out["enabled"], true);
    let pinned = registry.reference(&format!("guild/scan@{digest}"));
    let by_digest = trusting_store(&bench, "by-digest");
    ok(run(&bench, &by_digest, None, &["install", &pinned]));
    assert_eq!(enabled(&bench, &by_tag), enabled(&bench, &by_digest));
    assert_eq!(enabled(&bench, &by_tag)[0].0, "example.scan");

    // Pull writes the archive, byte for byte.
    let out = bench.path().join("pulled.gkmodule");
    ok(run(
        &bench,
        &by_tag,
        None,
        &["pull", &pinned, "--out", out.to_str().unwrap()],
    ));
    assert_eq!(
        fs::read(&out).unwrap(),
        fs::read(bench.path().join(&archive)).unwrap()
    );
    // A digest that names no manifest is not found.
    let missing = registry.reference(&format!("guild/scan@sha256:{}", "0".repeat(64)));
    fails(
        run(&bench, &by_tag, None, &["install", &missing]),
        6,
        "not found",
    );
}

#[test]
fn oci_a_tag_moved_to_an_untrusted_package_is_refused_with_nothing_in_the_store() {
    let Some((registry, bench)) = start("oci_tag_moved_to_untrusted") else {
        return;
    };
    let archive = bench.package("example.scan", "1.0.0", b"genuine", "");
    let tag = registry.reference("guild/scan:stable");
    push(&bench, &archive, &tag);
    // Someone with registry access but not the publisher's key moves the tag.
    ok(run(
        &bench,
        &bench.store(),
        None,
        &["keygen", "--out", "evil"],
    ));
    let (src, template) = bench.source("example.scan", "1.0.1", b"evil", "");
    ok(run(
        &bench,
        &bench.store(),
        None,
        &[
            "pack",
            src.to_str().unwrap(),
            "--manifest",
            template.to_str().unwrap(),
            "--out",
            "evil.gkmodule",
            "--key",
            "evil.key",
        ],
    ));
    push(&bench, "evil.gkmodule", &tag);
    let store = trusting_store(&bench, "fleet");
    let before = guild_test_support::disk(&store);
    fails(
        run(&bench, &store, None, &["install", &tag]),
        3,
        "example.scan",
    );
    assert!(enabled(&bench, &store).is_empty());
    assert_eq!(
        guild_test_support::disk(&store),
        before,
        "the store changed"
    );
}

#[test]
fn oci_a_layer_corrupted_in_the_registry_is_refused_on_pull() {
    let Some((registry, bench)) = start("oci_corrupted_layer") else {
        return;
    };
    let archive = bench.package("example.scan", "1.0.0", b"to be corrupted", "");
    let tag = registry.reference("guild/scan:1.0.0");
    let out = ok(run(
        &bench,
        &bench.store(),
        None,
        &["--json", "push", &archive, &tag],
    ))
    .json();
    let layer = out["layer_sha256"].as_str().unwrap();
    let blob = registry.blob_file(layer);
    let mut bytes = fs::read(&blob).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0xff;
    fs::write(&blob, bytes).unwrap();

    let dest = bench.path().join("x.gkmodule");
    fails(
        run(
            &bench,
            &bench.store(),
            None,
            &["pull", &tag, "--out", dest.to_str().unwrap()],
        ),
        3,
        "digest",
    );
    assert!(!dest.exists(), "a refused pull left a file");
    let store = trusting_store(&bench, "fleet");
    fails(run(&bench, &store, None, &["install", &tag]), 3, "digest");
    assert!(enabled(&bench, &store).is_empty());
}

fn auth_file(bench: &Bench, registry: &Registry, user: &str, password: &str) -> PathBuf {
    let path = bench.path().join(format!("auth-{user}-{password}.json"));
    let body = serde_json::json!({"auths": {
        format!("127.0.0.1:{}", registry.port): {"auth": base64_encode(&format!("{user}:{password}"))}
    }});
    fs::write(&path, body.to_string()).unwrap();
    path
}

/// Standard base64, for the test's credential file.
fn base64_encode(text: &str) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes = text.as_bytes();
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[test]
fn oci_basic_auth_with_good_and_bad_credentials() {
    let creds = Credentials {
        user: "fleet",
        password: "s3cret",
    };
    let Some(registry) = Registry::start("oci_basic_auth", Some(&creds)) else {
        return;
    };
    let bench = Bench::new(guild());
    let archive = bench.package("example.scan", "1.0.0", b"behind auth", "");
    let tag = registry.reference("guild/scan:1.0.0");
    let good = auth_file(&bench, &registry, creds.user, creds.password);
    let bad = auth_file(&bench, &registry, creds.user, "wrong");
    fails(
        run(&bench, &bench.store(), None, &["push", &archive, &tag]),
        4,
        "credentials",
    );
    fails(
        run(
            &bench,
            &bench.store(),
            Some(&bad),
            &["push", &archive, &tag],
        ),
        4,
        "credentials",
    );
    ok(run(
        &bench,
        &bench.store(),
        Some(&good),
        &["push", &archive, &tag],
    ));
    let store = trusting_store(&bench, "fleet");
    fails(
        run(&bench, &store, Some(&bad), &["install", &tag]),
        4,
        "credentials",
    );
    assert!(enabled(&bench, &store).is_empty());
    ok(run(&bench, &store, Some(&good), &["install", &tag]));
    assert_eq!(enabled(&bench, &store).len(), 1);
}

/// A store with two packages installed from the registry, and its lock.
pub(crate) fn locked_store(bench: &Bench, registry: &Registry) -> (PathBuf, PathBuf) {
    let a = bench.package("example.scan", "1.0.0", b"scan", "");
    let b = bench.package("example.norm", "2.1.0", b"norm", "");
    push(bench, &a, &registry.reference("guild/scan:1.0.0"));
    push(bench, &b, &registry.reference("guild/norm:2.1.0"));
    let origin = trusting_store(bench, "origin");
    ok(run(
        bench,
        &origin,
        None,
        &["install", &registry.reference("guild/scan:1.0.0")],
    ));
    ok(run(
        bench,
        &origin,
        None,
        &["install", &registry.reference("guild/norm:2.1.0")],
    ));
    let lock = bench.path().join("guild.lock");
    ok(run(
        bench,
        &origin,
        None,
        &["lock", "--out", lock.to_str().unwrap()],
    ));
    (origin, lock)
}

#[test]
fn oci_lock_then_sync_a_fresh_store_to_identical_digests() {
    let Some((registry, bench)) = start("oci_lock_then_sync") else {
        return;
    };
    let (origin, lock) = locked_store(&bench, &registry);
    let text = fs::read_to_string(&lock).unwrap();
    assert!(
        text.contains("\"lock_format\": \"guild-lock-v1\""),
        "{text}"
    );
    assert!(text.contains("manifest_digest"), "{text}");

    let fresh = trusting_store(&bench, "fresh");
    // Something the lock does not name is disabled by the sync.
    let extra = bench.package("example.extra", "1.0.0", b"extra", "");
    ok(run(&bench, &fresh, None, &["install", &extra]));
    let synced = ok(run(
        &bench,
        &fresh,
        None,
        &["sync", lock.to_str().unwrap(), "--allow-shrink"],
    ));
    // One line per change, in the past tense, then one line saying the store matches.
    assert!(
        synced.stdout.contains("disabled example.extra 1.0.0"),
        "{}",
        synced.stdout
    );
    assert!(synced.stdout.contains("installed "), "{}", synced.stdout);
    assert!(
        !synced.stdout.contains("already matches"),
        "{}",
        synced.stdout
    );
    assert_eq!(
        synced.stdout.matches("the store matches").count(),
        1,
        "{}",
        synced.stdout
    );
    assert_eq!(enabled(&bench, &fresh), enabled(&bench, &origin));
    // A second sync changes nothing, and the fresh store's lock is the same file.
    let again = ok(run(
        &bench,
        &fresh,
        None,
        &["--json", "sync", lock.to_str().unwrap()],
    ))
    .json();
    assert_eq!(again["changes"].as_array().unwrap().len(), 0);
    let relock = bench.path().join("again.lock");
    ok(run(
        &bench,
        &fresh,
        None,
        &["lock", "--out", relock.to_str().unwrap()],
    ));
    assert_eq!(fs::read_to_string(&relock).unwrap(), text);
}

#[test]
fn oci_an_edited_lock_is_refused_naming_the_package() {
    let Some((registry, bench)) = start("oci_edited_lock") else {
        return;
    };
    let (origin, lock) = locked_store(&bench, &registry);
    let rows = enabled(&bench, &origin);
    let (id, _, digest) = rows.iter().find(|r| r.0 == "example.scan").unwrap();
    let edited = fs::read_to_string(&lock)
        .unwrap()
        .replace(digest.as_str(), &"e".repeat(64));
    let edited_path = bench.path().join("edited.lock");
    fs::write(&edited_path, edited).unwrap();
    let fresh = trusting_store(&bench, "fresh");
    // An unlocked package that a successful sync would disable stays as it is.
    let extra = bench.package("example.extra", "1.0.0", b"extra", "");
    ok(run(&bench, &fresh, None, &["install", &extra]));
    let before = guild_test_support::disk(&fresh);
    fails(
        run(
            &bench,
            &fresh,
            None,
            // Allowed to disable it, so that what refuses the sync is the edited payload.
            &["sync", edited_path.to_str().unwrap(), "--allow-shrink"],
        ),
        3,
        id,
    );
    assert_eq!(
        guild_test_support::disk(&fresh),
        before,
        "the store changed"
    );
    // A lock that is not one at all names the member.
    fs::write(&edited_path, "{\"lock_format\": \"guild-lock-v1\"}").unwrap();
    fails(
        run(
            &bench,
            &fresh,
            None,
            &["sync", edited_path.to_str().unwrap()],
        ),
        3,
        "packages",
    );
}

#[test]
fn oci_sync_from_a_mirror_with_the_registry_stopped() {
    let Some((mut registry, bench)) = start("oci_mirror") else {
        return;
    };
    let (origin, lock) = locked_store(&bench, &registry);
    let mirror = bench.path().join("mirror");
    ok(run(
        &bench,
        &origin,
        None,
        &[
            "pull",
            "--lock",
            lock.to_str().unwrap(),
            "--to",
            mirror.to_str().unwrap(),
        ],
    ));
    registry.stop();
    let fresh = trusting_store(&bench, "air-gapped");
    // Without the mirror the sync needs the registry, which is gone.
    let r = run(&bench, &fresh, None, &["sync", lock.to_str().unwrap()]);
    assert_ne!(r.code, 0, "{}", r.stdout);
    ok(run(
        &bench,
        &fresh,
        None,
        &[
            "sync",
            lock.to_str().unwrap(),
            "--from",
            mirror.to_str().unwrap(),
        ],
    ));
    assert_eq!(enabled(&bench, &fresh), enabled(&bench, &origin));
}

#[test]
fn oci_fleet_of_eight_stores_syncs_one_lock_concurrently() {
    let Some((registry, bench)) = start("oci_fleet") else {
        return;
    };
    let (origin, lock) = locked_store(&bench, &registry);
    let stores: Vec<PathBuf> = (0..8)
        .map(|i| trusting_store(&bench, &format!("node-{i}")))
        .collect();
    let children: Vec<_> = stores
        .iter()
        .map(|store| {
            let mut cmd = guild().command(
                bench.path(),
                &[
                    "--store",
                    store.to_str().unwrap(),
                    "sync",
                    lock.to_str().unwrap(),
                ],
            );
            cmd.env("HOME", bench.path())
                .env_remove("REGISTRY_AUTH_FILE")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            cmd.spawn().unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "a node's sync failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let want = enabled(&bench, &origin);
    assert_eq!(want.len(), 2);
    for store in &stores {
        assert_eq!(enabled(&bench, store), want, "{}", store.display());
    }
}

/// A listener on 127.0.0.1 that accepts one connection and never answers: a registry whose
/// download is still under way for as long as the test holds the connection.
fn stalling_listener() -> (TcpListener, u16) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    (listener, port)
}

#[test]
fn oci_sync_lets_writers_in_while_it_downloads() {
    let Some((registry, bench)) = start("oci_sync_lets_writers_in") else {
        return;
    };
    let (_, lock) = locked_store(&bench, &registry);
    // The same lock, its references pointing at a registry that never answers.
    let (listener, port) = stalling_listener();
    let stalled = fs::read_to_string(&lock).unwrap().replace(
        &format!("127.0.0.1:{}", registry.port),
        &format!("127.0.0.1:{port}"),
    );
    let stalled_lock = bench.path().join("stalled.lock");
    fs::write(&stalled_lock, stalled).unwrap();
    let fresh = trusting_store(&bench, "fresh");
    // A second key, for a writer to revoke while the sync downloads.
    ok(run(&bench, &fresh, None, &["keygen", "--out", "k2"]));
    let added = ok(run(
        &bench,
        &fresh,
        None,
        &["--json", "trust", "add", "org.example", "k2.pub"],
    ))
    .json();
    let key = added["key_id"].as_str().unwrap().to_owned();
    let before = guild_test_support::disk(&fresh);

    let mut cmd = guild().command(
        bench.path(),
        &[
            "--store",
            fresh.to_str().unwrap(),
            "sync",
            stalled_lock.to_str().unwrap(),
        ],
    );
    cmd.env("HOME", bench.path())
        .env_remove("REGISTRY_AUTH_FILE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    // The sync has connected: it is downloading.
    let (connection, _) = listener.accept().unwrap();
    let revoked = run(
        &bench,
        &fresh,
        None,
        &["trust", "revoke-key", &key, "--reason", "rotated"],
    );
    // Let the download fail, then see what the sync left.
    drop(connection);
    drop(listener);
    let out = child.wait_with_output().unwrap();
    ok(revoked);
    assert!(!out.status.success(), "the sync cannot have succeeded");
    let after = guild_test_support::disk(&fresh);
    // Only the trust change is there: the sync changed nothing.
    let changed: Vec<&String> = after
        .keys()
        .chain(before.keys())
        .filter(|k| after.get(*k) != before.get(*k))
        .collect();
    assert!(
        changed.iter().all(|k| k.starts_with("trust")
            || k.starts_with("registry")
            || k.starts_with("journal")),
        "{changed:?}"
    );
    assert!(enabled(&bench, &fresh).is_empty());
}

#[test]
fn oci_pull_to_a_mirror_replaces_a_corrupt_file_and_removes_leftovers() {
    let Some((registry, bench)) = start("oci_mirror_corrupt") else {
        return;
    };
    let (origin, lock) = locked_store(&bench, &registry);
    let mirror = bench.path().join("mirror");
    let pull = |bench: &Bench| {
        ok(run(
            bench,
            &origin,
            None,
            &[
                "pull",
                "--lock",
                lock.to_str().unwrap(),
                "--to",
                mirror.to_str().unwrap(),
            ],
        ))
    };
    pull(&bench);
    let name = "example.scan-1.0.0.gkmodule";
    let good = fs::read(mirror.join(name)).unwrap();
    // One artifact byte changed: the manifest, and so the payload digest, is still the locked one.
    let mut bad = good.clone();
    let at = bad.windows(4).rposition(|w| w == b"scan").unwrap();
    bad[at..at + 4].copy_from_slice(b"SCAN");
    fs::write(mirror.join(name), &bad).unwrap();
    // What a pull killed half way leaves: a temporary nobody holds.
    let leftover = mirror.join(format!(".{name}.4242.0.tmp"));
    fs::write(&leftover, b"half a download").unwrap();
    // Another file of the operator's that looks like one is not touched.
    let theirs = mirror.join(".notes.1.0.tmp");
    fs::write(&theirs, b"mine").unwrap();

    let again = pull(&bench);
    assert!(
        !again.stdout.contains(&format!(
            "{} is already in the mirror",
            mirror.join(name).display()
        )),
        "{}",
        again.stdout
    );
    assert!(
        again.stdout.contains("pulled example.scan 1.0.0"),
        "{}",
        again.stdout
    );
    assert_eq!(fs::read(mirror.join(name)).unwrap(), good);
    assert!(!leftover.exists(), "the leftover temporary is still there");
    assert_eq!(fs::read(&theirs).unwrap(), b"mine");
    // The untouched package was kept.
    assert!(
        again.stdout.contains("is already in the mirror"),
        "{}",
        again.stdout
    );
}

/// A registry on 127.0.0.1 that answers its API root and then nothing: every other request is
/// read and held unanswered for as long as the listener lives.
fn registry_that_stops_answering() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).is_ok_and(|n| n == 1) {
                head.push(byte[0]);
            }
            if head.starts_with(b"GET /v2/ ") {
                let _ = stream.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
                );
            } else {
                held.push(stream);
            }
        }
    });
    port
}

#[test]
fn oci_a_push_to_a_registry_that_stops_answering_ends_at_the_deadline_naming_the_setting() {
    let bench = Bench::new(guild());
    let archive = bench.package("example.scan", "1.0.0", b"scan one", "");
    let port = registry_that_stops_answering();
    let reference = format!("oci://127.0.0.1:{port}/guild/scan:1.0.0");
    let started = Instant::now();
    let out = guild()
        .command(
            bench.path(),
            &[
                "--store",
                bench.store().to_str().unwrap(),
                "push",
                &archive,
                &reference,
            ],
        )
        .env("HOME", bench.path())
        .env("GUILD_REGISTRY_DEADLINE_SECONDS", "2")
        .env_remove("GUILD_REGISTRY_STALL")
        .env_remove("REGISTRY_AUTH_FILE")
        .output()
        .unwrap();
    let r = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    let r = fails(r, 1, "did not arrive within the deadline of 2 s");
    assert!(r.stderr.contains(&reference), "{}", r.stderr);
    assert!(
        r.stderr.contains("GUILD_REGISTRY_DEADLINE_SECONDS"),
        "{}",
        r.stderr
    );
    // The push ended by its deadline, not by the client's two-minute read timeout.
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
}

/// How a hostile registry answers one request.
enum Hostile {
    /// This status and these headers, and a body of 1 GiB sent without a length.
    Huge(u16, Vec<(&'static str, String)>),
    /// This status, these headers and no body.
    Empty(u16, Vec<(&'static str, String)>),
}

/// A registry on 127.0.0.1 answering each request by `answer(METHOD, PATH, PORT)`; the
/// request's body (by its Content-Length) is read first.
fn hostile_registry(answer: fn(&str, &str, u16) -> Hostile) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).is_ok_and(|n| n == 1) {
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let mut words = head.split_whitespace();
                let method = words.next().unwrap_or("").to_owned();
                let path = words
                    .next()
                    .unwrap_or("")
                    .split('?')
                    .next()
                    .unwrap_or("")
                    .to_owned();
                let length: u64 = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse().ok())?
                    })
                    .unwrap_or(0);
                let _ = std::io::copy(&mut (&mut stream).take(length), &mut std::io::sink());
                let (status, headers, huge) = match answer(&method, &path, port) {
                    Hostile::Huge(s, h) => (s, h, true),
                    Hostile::Empty(s, h) => (s, h, false),
                };
                let mut out = format!("HTTP/1.1 {status} X\r\nConnection: close\r\n");
                if !huge {
                    out.push_str("Content-Length: 0\r\n");
                }
                for (k, v) in headers {
                    out.push_str(&format!("{k}: {v}\r\n"));
                }
                out.push_str("\r\n");
                if stream.write_all(out.as_bytes()).is_err() || !huge {
                    return;
                }
                let piece = vec![b'x'; 64 * 1024];
                for _ in 0..(1u64 << 30) / piece.len() as u64 {
                    if stream.write_all(&piece).is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// `guild ARGS` under `/usr/bin/time -v`: its exit code, its largest resident set (KiB) and
/// how long it ran. `GUILD_PEAK_BINARY` names another build to measure (a release build, or
/// one from before a change).
fn peak_memory(bench: &Bench, args: &[&str]) -> (i32, u64, Duration) {
    let binary = std::env::var_os("GUILD_PEAK_BINARY")
        .map(PathBuf::from)
        .unwrap_or_else(|| guild().path().to_owned());
    let started = Instant::now();
    let out = Command::new("/usr/bin/time")
        .arg("-v")
        .arg(binary)
        .args(["--store", bench.store().to_str().unwrap()])
        .args(args)
        .current_dir(bench.path())
        .env("HOME", bench.path())
        .env("NO_COLOR", "1")
        .env_remove("GUILD_STORE")
        .env_remove("REGISTRY_AUTH_FILE")
        .env_remove("GUILD_REGISTRY_DEADLINE_SECONDS")
        .env_remove("GUILD_REGISTRY_STALL")
        .output()
        .unwrap();
    let elapsed = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let kib = stderr
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("Maximum resident set size (kbytes): ")
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no figure from /usr/bin/time:\n{stderr}"));
    (out.status.code().unwrap_or(-1), kib, elapsed)
}

fn challenge(port: u16) -> Vec<(&'static str, String)> {
    vec![(
        "WWW-Authenticate",
        format!("Bearer realm=\"http://127.0.0.1:{port}/token\",service=\"reg\""),
    )]
}

/// A registry that has no blob, opens upload sessions and takes blobs.
fn uploads(method: &str, path: &str) -> Option<Hostile> {
    Some(match (method, path) {
        ("GET", "/v2/") => Hostile::Empty(200, vec![]),
        ("HEAD", _) => Hostile::Empty(404, vec![]),
        ("POST", _) => Hostile::Empty(202, vec![("Location", "/upload/1".into())]),
        ("PUT", "/upload/1") => Hostile::Empty(201, vec![("Location", "/v2/b".into())]),
        _ => return None,
    })
}

#[test]
#[ignore = "measures the peak memory of guild against registries that answer 1 GiB bodies \
            (needs /usr/bin/time and docker-registry; run with --ignored --nocapture)"]
fn oci_peak_memory_against_huge_answers() {
    let Some((registry, bench)) = start("oci_peak_memory_against_huge_answers") else {
        return;
    };
    let archive = bench.package("example.scan", "1.0.0", b"scan one", "");
    let tag = registry.reference("guild/scan:1.0.0");
    let hostile = |answer: fn(&str, &str, u16) -> Hostile| {
        format!(
            "oci://127.0.0.1:{}/guild/scan:1.0.0",
            hostile_registry(answer)
        )
    };
    let cases: Vec<(&str, Vec<String>)> = vec![
        (
            "push, a real registry",
            vec!["push".into(), archive.clone(), tag.clone()],
        ),
        (
            "install, a real registry",
            vec!["install".into(), tag.clone()],
        ),
        (
            "install, a 1 GiB manifest",
            vec![
                "install".into(),
                hostile(|_, path, _| match path {
                    "/v2/" => Hostile::Empty(200, vec![]),
                    _ => Hostile::Huge(
                        200,
                        vec![(
                            "Content-Type",
                            "application/vnd.oci.image.manifest.v1+json".into(),
                        )],
                    ),
                }),
            ],
        ),
        (
            "install, a 1 GiB error body (404)",
            vec![
                "install".into(),
                hostile(|_, path, _| match path {
                    "/v2/" => Hostile::Empty(200, vec![]),
                    _ => Hostile::Huge(404, vec![]),
                }),
            ],
        ),
        (
            "install, a 1 GiB token response",
            vec![
                "install".into(),
                hostile(|_, path, port| match path {
                    "/token" => Hostile::Huge(200, vec![]),
                    _ => Hostile::Empty(401, challenge(port)),
                }),
            ],
        ),
        (
            "push, a 1 GiB token response",
            vec![
                "push".into(),
                archive.clone(),
                hostile(|_, path, port| match path {
                    "/token" => Hostile::Huge(200, vec![]),
                    _ => Hostile::Empty(401, challenge(port)),
                }),
            ],
        ),
        (
            "push, a 1 GiB error body (500) on the upload request",
            vec![
                "push".into(),
                archive.clone(),
                hostile(|method, path, _| match (method, path) {
                    ("POST", _) => Hostile::Huge(500, vec![]),
                    _ => uploads(method, path).unwrap_or(Hostile::Empty(404, vec![])),
                }),
            ],
        ),
        (
            "push, a 1 GiB error body (400) on the manifest",
            vec![
                "push".into(),
                archive.clone(),
                hostile(|method, path, _| {
                    uploads(method, path).unwrap_or(Hostile::Huge(400, vec![]))
                }),
            ],
        ),
        (
            "push, a 1 GiB answer (201) to the manifest",
            vec![
                "push".into(),
                archive.clone(),
                hostile(|method, path, _| {
                    uploads(method, path).unwrap_or(Hostile::Huge(
                        201,
                        vec![("Location", "/v2/guild/scan/manifests/1.0.0".into())],
                    ))
                }),
            ],
        ),
    ];
    ok(run(
        &bench,
        &bench.store(),
        None,
        &["trust", "add", "org.example", "k.pub"],
    ));
    println!("| case | exit | max RSS (KiB) | time |");
    println!("|---|---|---|---|");
    for (name, args) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, kib, took) = peak_memory(&bench, &args);
        println!("| {name} | {code} | {kib} | {:.2} s |", took.as_secs_f64());
    }
}

/// `guild ARGS` on the bench's store with a registry that cannot be reached tried `attempts`
/// times, `delay` seconds before the second try; what it did and how long it took.
fn run_unreachable(bench: &Bench, attempts: &str, delay: &str, args: &[&str]) -> (Run, Duration) {
    let store = bench.store();
    let mut all = vec!["--store", store.to_str().unwrap()];
    all.extend_from_slice(args);
    let mut cmd = guild().command(bench.path(), &all);
    cmd.env("HOME", bench.path())
        .env_remove("REGISTRY_AUTH_FILE")
        .env("GUILD_REGISTRY_ATTEMPTS", attempts)
        .env("GUILD_REGISTRY_RETRY_DELAY", delay);
    let started = Instant::now();
    let out = cmd.output().unwrap();
    (Run::from(out), started.elapsed())
}

/// Nothing listens on the port: `pull`, `install oci://` and `sync` try the configured number
/// of times, waiting between tries, and exit 7 (`unreachable`) naming the tries, not 1.
#[test]
fn oci_an_unreachable_registry_is_tried_again_then_exit_7() {
    let bench = Bench::new(guild());
    let port = free_port();
    let reference = format!("oci://127.0.0.1:{port}/guild/scan:1.0.0");
    let (r, took) = run_unreachable(
        &bench,
        "3",
        "0.2",
        &["pull", &reference, "--out", "scan.gkmodule"],
    );
    assert_eq!(r.code, 7, "stdout:\n{}\nstderr:\n{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains("unreachable after 3 tries"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("GUILD_REGISTRY_ATTEMPTS"), "{}", r.stderr);
    // Waits of 0.2 s and then 0.4 s between the three tries.
    assert!(took >= Duration::from_millis(600), "took {took:?}");
    assert!(!bench.path().join("scan.gkmodule").exists());

    let (r, _) = run_unreachable(&bench, "2", "0", &["--json", "install", &reference]);
    assert_eq!(r.code, 7, "stdout:\n{}\nstderr:\n{}", r.stdout, r.stderr);
    assert_eq!(r.error_json()["category"], "unreachable", "{}", r.stderr);
    assert!(r.stderr.contains("after 2 tries"), "{}", r.stderr);

    // A lock whose package lives on the unreachable registry.
    let scan = bench.package("example.scan", "1.0.0", b"scan", "");
    let lock = bench.lock_of(&[&scan], &[]);
    let mut value: serde_json::Value = serde_json::from_slice(&fs::read(&lock).unwrap()).unwrap();
    value["packages"][0]["reference"] = reference.clone().into();
    value["packages"][0]["manifest_digest"] = format!("sha256:{}", "ab".repeat(32)).into();
    fs::write(&lock, serde_json::to_vec(&value).unwrap()).unwrap();
    ok(run(
        &bench,
        &bench.store(),
        None,
        &["trust", "add", "org.example", "k.pub"],
    ));
    let (r, _) = run_unreachable(&bench, "1", "0", &["sync", lock.to_str().unwrap()]);
    assert_eq!(r.code, 7, "stdout:\n{}\nstderr:\n{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("after 1 try"), "{}", r.stderr);

    // A setting that is not a number of tries is a usage error, naming the variable.
    let (r, _) = run_unreachable(&bench, "many", "0", &["pull", &reference, "--out", "x"]);
    assert_eq!(r.code, 2, "stdout:\n{}\nstderr:\n{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("GUILD_REGISTRY_ATTEMPTS"), "{}", r.stderr);
}
