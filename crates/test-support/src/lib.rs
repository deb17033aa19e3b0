//! The fixtures that the workspace's integration tests share (a dev-dependency of guild-host and
//! guild-cli, and of guild-host's benchmarks; it ships with nothing).
//!
//! At the root: signing keys, packages built and signed from templates (with dependencies), a
//! package manager opened over a real `FsStore` with an optional fault plan, and snapshots of a
//! store's disk and of what its package manager shows. [`plugins`] finds the C test plugins and
//! makes package specs of them; [`guild`] runs the `guild` binary as an operator would.
//!
//! Packages go through the publisher's own path (`packaging::pack`), so that a test installs exactly
//! what `guild pack` would produce. The store is wrapped in [`Spy`], which counts the calls that
//! write into the store; a refusal that happened before extraction shows zero staging requests.

pub mod guild;
pub mod plugins;

/// The adapters the fixtures stand on, for tests that reach below the host's API (a store
/// written by hand, a key file read back) in crates that may not depend on an adapter
/// themselves (only the application crates do).
pub mod adapters {
    pub use guild_adapters_crypto as crypto;
    pub use guild_adapters_fs as fs;
}

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use guild_adapters_crypto::{P256Verifier, SigningKey};
use guild_adapters_fs::archive::{write_gkpk, GkpkSource};
use guild_adapters_fs::store::{Fault, FsStore, StoreLayout, StoreOptions};
use guild_domain::ids::{PackageId, PackageKind, PublisherId, Sha256Digest};
use guild_domain::json::Value;
use guild_domain::manifest::Metadata;
use guild_domain::path::ArtifactPath;
use guild_domain::store_state::StoreState;
use guild_domain::version::Version;
use guild_host::package_manager::PackageSummary;
use guild_host::packaging::pack;
use guild_host::{HostError, HostPlatform, OpenReport, PackageManager};
use guild_ports::store::{
    Committed, PackageStore, RecoveryReport, StoreError, StoreErrorKind, Transaction,
};

/// The publisher every test package names unless it says otherwise.
pub const PUBLISHER: &str = "org.example";

pub fn id(s: &str) -> PackageId {
    PackageId::new(s).unwrap()
}

pub fn v(s: &str) -> Version {
    Version::parse(s).unwrap()
}

pub fn publisher(s: &str) -> PublisherId {
    PublisherId::new(s).unwrap()
}

/// A fresh P-256 signing key.
pub fn key() -> SigningKey {
    SigningKey::generate().unwrap()
}

/// Builds `bin` of workspace package `package` with cargo (the dev profile) and answers its
/// executable, as cargo reports it (so a custom target directory works too).
pub fn cargo_binary(package: &str, bin: &str) -> PathBuf {
    cargo_binary_with(package, bin, false)
}

/// [`cargo_binary`], optimised (`--release`) when `release` is set: what a benchmark that times
/// a process should run, since a debug build spends its time in unoptimised hashing.
///
/// With `GUILD_BENCH_BIN_DIR` set, nothing is built: the executable is `bin` in that directory
/// (how the GPU bundle runs the process benchmarks on a machine without cargo).
pub fn cargo_binary_with(package: &str, bin: &str, release: bool) -> PathBuf {
    if let Some(dir) = std::env::var_os("GUILD_BENCH_BIN_DIR") {
        let path = PathBuf::from(dir).join(bin);
        assert!(
            path.is_file(),
            "GUILD_BENCH_BIN_DIR is set but {} is not a file",
            path.display()
        );
        return path;
    }
    let mut args = vec!["build", "-p", package, "--bin", bin];
    if release {
        args.push("--release");
    }
    args.push("--message-format=json-render-diagnostics");
    let out = std::process::Command::new(env!("CARGO"))
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
        .args(&args)
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "building {bin} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|m| m["target"]["name"] == bin && m["executable"].is_string())
        .and_then(|m| m["executable"].as_str().map(PathBuf::from))
        .unwrap_or_else(|| panic!("cargo reports the executable of {bin}"))
}

/// The platform of this test run: packages are built for it, so only the fields a test changes
/// on purpose can make one fail the platform check.
pub fn platform() -> HostPlatform {
    HostPlatform::current().expect("the tests run on a platform packages can name")
}

/// A temporary directory that can be removed even when the store has sealed trees in it read-only
/// (which an unprivileged user could not otherwise delete from).
#[derive(Debug)]
pub struct Scratch {
    dir: Option<tempfile::TempDir>,
}

impl Default for Scratch {
    fn default() -> Self {
        Self::new()
    }
}

impl Scratch {
    pub fn new() -> Self {
        Scratch {
            dir: Some(tempfile::tempdir().unwrap()),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.as_ref().map(|d| d.path()).unwrap_or(Path::new(""))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(dir) = self.dir.take() {
            make_writable(dir.path());
            let _ = dir.close();
        }
    }
}

/// Makes every directory under `path` writable again, so that the tree can be deleted.
pub fn make_writable(path: &Path) {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return;
    };
    if meta.is_dir() {
        let mut perms = meta.permissions();
        #[allow(clippy::permissions_set_readonly_false)]
        perms.set_readonly(false);
        let _ = fs::set_permissions(path, perms);
        if let Ok(entries) = fs::read_dir(path) {
            for entry in entries.flatten() {
                make_writable(&entry.path());
            }
        }
    }
}

/// Copies the tree at `from` to `to` (which must not exist), keeping every entry's read-only
/// flag. A copy of a closed store is a fresh store in exactly the same state.
pub fn copy_tree(from: &Path, to: &Path) {
    let meta = fs::symlink_metadata(from).unwrap();
    if meta.is_dir() {
        fs::create_dir(to).unwrap();
        for entry in fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            copy_tree(&entry.path(), &to.join(entry.file_name()));
        }
        // Sealed last: a read-only directory cannot receive its children.
        fs::set_permissions(to, meta.permissions()).unwrap();
    } else {
        assert!(meta.is_file(), "{} is not a plain file", from.display());
        fs::copy(from, to).unwrap();
    }
}

/// A module dependency record as a manifest template spells it.
#[derive(Debug, Clone)]
pub struct ModDep {
    pub module_id: String,
    pub min: String,
    pub max: Option<String>,
    pub abi_tag: String,
    pub publisher: Option<String>,
    pub sha256: Option<Sha256Digest>,
}

impl ModDep {
    /// A runtime edge (`guild.module.v1`) on `module_id` at `min` or later.
    pub fn on(module_id: &str, min: &str) -> Self {
        ModDep {
            module_id: module_id.into(),
            min: min.into(),
            max: None,
            abi_tag: guild_domain::dependency::MODULE_ABI_TAG_V1.into(),
            publisher: None,
            sha256: None,
        }
    }

    pub fn max(mut self, max: &str) -> Self {
        self.max = Some(max.into());
        self
    }

    pub fn publisher(mut self, publisher: &str) -> Self {
        self.publisher = Some(publisher.into());
        self
    }

    pub fn sha256(mut self, digest: Sha256Digest) -> Self {
        self.sha256 = Some(digest);
        self
    }

    pub fn abi_tag(mut self, tag: &str) -> Self {
        self.abi_tag = tag.into();
        self
    }
}

/// A package to build: the manifest template fields and the files of its source directory.
#[derive(Debug, Clone)]
pub struct Spec {
    pub id: String,
    pub version: String,
    pub kind: PackageKind,
    pub publisher: String,
    /// `(artifact path, bytes)`; the first is the entry library.
    pub files: Vec<(String, Vec<u8>)>,
    pub backends: Vec<String>,
    pub provided_ops: Vec<String>,
    pub provided_runners: Vec<String>,
    /// `(package id, min, max)`.
    pub dependencies: Vec<(String, String, Option<String>)>,
    pub module_dependencies: Vec<ModDep>,
    /// `(operation name, record in the --params notation)`: the manifest's `check_params`.
    pub check_params: Vec<(String, String)>,
}

impl Spec {
    /// A `gkmodule` with one library whose bytes name the package and version (so that two
    /// versions never share a payload) and one provided operation.
    pub fn module(id: &str, version: &str) -> Self {
        let last = id.rsplit('.').next().unwrap_or(id);
        Spec {
            id: id.into(),
            version: version.into(),
            kind: PackageKind::Module,
            publisher: PUBLISHER.into(),
            files: vec![(
                format!("lib/lib{last}.so"),
                format!("\x7fELF {id}@{version}\n").into_bytes(),
            )],
            backends: vec!["cpu".into()],
            provided_ops: vec![format!("{id}.op.cpu")],
            provided_runners: Vec::new(),
            dependencies: Vec::new(),
            module_dependencies: Vec::new(),
            check_params: Vec::new(),
        }
    }

    /// A `gkernel`, otherwise as [`Spec::module`].
    pub fn kernel(id: &str, version: &str) -> Self {
        Spec {
            kind: PackageKind::Kernel,
            ..Self::module(id, version)
        }
    }

    pub fn publisher(mut self, publisher: &str) -> Self {
        self.publisher = publisher.into();
        self
    }

    /// Replaces the entry library's bytes.
    pub fn library(mut self, bytes: &[u8]) -> Self {
        if let Some(first) = self.files.first_mut() {
            first.1 = bytes.to_vec();
        }
        self
    }

    /// Adds a file (an artifact that is not the entry).
    pub fn file(mut self, path: &str, bytes: &[u8]) -> Self {
        self.files.push((path.into(), bytes.to_vec()));
        self
    }

    pub fn runner(mut self, runner: &str) -> Self {
        self.provided_runners.push(runner.into());
        self
    }

    pub fn backend(mut self, backend: &str) -> Self {
        self.backends.push(backend.into());
        self
    }

    pub fn op(mut self, op: &str) -> Self {
        self.provided_ops.push(op.into());
        self
    }

    pub fn depends_on(mut self, package: &str, min: &str, max: Option<&str>) -> Self {
        self.dependencies
            .push((package.into(), min.into(), max.map(Into::into)));
        self
    }

    pub fn module_dep(mut self, dep: ModDep) -> Self {
        self.module_dependencies.push(dep);
        self
    }

    /// Names the record `guild check` passes operation `op` (the manifest's `check_params`).
    pub fn check_params(mut self, op: &str, record: &str) -> Self {
        self.check_params.push((op.into(), record.into()));
        self
    }

    /// The manifest template `guild pack` reads: every payload field except `artifacts`.
    pub fn template(&self) -> Value {
        let platform = platform();
        let strings =
            |items: &[String]| Value::Array(items.iter().map(|s| s.as_str().into()).collect());
        let mut m: Vec<(String, Value)> = vec![
            ("package_id".into(), self.id.as_str().into()),
            ("kind".into(), self.kind.as_str().into()),
            ("version".into(), self.version.as_str().into()),
            ("publisher_id".into(), self.publisher.as_str().into()),
            (
                "kernel_abi".into(),
                Value::Object(vec![
                    ("min".into(), "1.0.0".into()),
                    ("max".into(), "1.0.0".into()),
                ]),
            ),
        ];
        if self.kind == PackageKind::Module {
            m.push(("module_abi".into(), 1u64.into()));
        }
        m.push(("os".into(), platform.os.as_str().into()));
        m.push(("arch".into(), platform.arch.as_str().into()));
        m.push(("backends".into(), strings(&self.backends)));
        m.push(("entry".into(), self.files[0].0.as_str().into()));
        m.push(("provided_ops".into(), strings(&self.provided_ops)));
        if !self.provided_runners.is_empty() {
            m.push(("provided_runners".into(), strings(&self.provided_runners)));
        }
        if !self.dependencies.is_empty() {
            let deps = self
                .dependencies
                .iter()
                .map(|(p, min, max)| {
                    let mut o = vec![
                        ("package_id".to_owned(), p.as_str().into()),
                        ("min_version".to_owned(), min.as_str().into()),
                    ];
                    if let Some(max) = max {
                        o.push(("max_version".into(), max.as_str().into()));
                    }
                    Value::Object(o)
                })
                .collect();
            m.push(("dependencies".into(), Value::Array(deps)));
        }
        if !self.module_dependencies.is_empty() {
            let deps = self
                .module_dependencies
                .iter()
                .map(|d| {
                    let mut o = vec![
                        ("module_id".to_owned(), d.module_id.as_str().into()),
                        ("min_version".to_owned(), d.min.as_str().into()),
                    ];
                    if let Some(max) = &d.max {
                        o.push(("max_version".into(), max.as_str().into()));
                    }
                    o.push(("abi_tag".into(), d.abi_tag.as_str().into()));
                    if let Some(p) = &d.publisher {
                        o.push(("publisher_id".into(), p.as_str().into()));
                    }
                    if let Some(h) = &d.sha256 {
                        o.push(("sha256".into(), h.to_hex().into()));
                    }
                    Value::Object(o)
                })
                .collect();
            m.push(("module_dependencies".into(), Value::Array(deps)));
        }
        if !self.check_params.is_empty() {
            let records = self
                .check_params
                .iter()
                .map(|(op, record)| (op.clone(), record.as_str().into()))
                .collect();
            m.push(("check_params".into(), Value::Object(records)));
        }
        Value::Object(m)
    }
}

/// A package built by [`Workshop::build`]: the archive, the source directory it was packed from,
/// and its signed metadata.
#[derive(Debug, Clone)]
pub struct Built {
    pub archive: PathBuf,
    pub src: PathBuf,
    pub metadata: Metadata,
}

impl Built {
    pub fn id(&self) -> PackageId {
        self.metadata.manifest().package_id.clone()
    }

    pub fn version(&self) -> Version {
        self.metadata.manifest().version.clone()
    }

    /// The payload digest: what the registry records and what digest pins name.
    pub fn digest(&self) -> Sha256Digest {
        self.metadata.payload_digest()
    }

    /// The source files as `write_gkpk` takes them, in manifest order.
    pub fn files(&self) -> Vec<(ArtifactPath, PathBuf)> {
        self.metadata
            .manifest()
            .artifacts
            .iter()
            .map(|a| (a.path.clone(), self.src.join(a.path.as_str())))
            .collect()
    }
}

/// Where packages are built: one scratch directory, one subdirectory per package.
#[derive(Debug)]
pub struct Workshop {
    dir: Scratch,
    next: AtomicUsize,
}

impl Default for Workshop {
    fn default() -> Self {
        Self::new()
    }
}

impl Workshop {
    pub fn new() -> Self {
        Workshop {
            dir: Scratch::new(),
            next: AtomicUsize::new(0),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A fresh, unused path in the workshop, named after `stem`.
    pub fn fresh(&self, stem: &str) -> PathBuf {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        self.dir.path().join(format!("{n:04}-{stem}"))
    }

    /// Packs `spec` through `packaging::pack` and signs it with `key`.
    pub fn build(&self, spec: &Spec, key: &SigningKey) -> Built {
        self.build_with(spec, Some(key))
    }

    /// Packs `spec`, signed by `key` when one is given.
    pub fn build_with(&self, spec: &Spec, key: Option<&SigningKey>) -> Built {
        let base = self.fresh(&format!("{}-{}", spec.id, spec.version));
        let src = base.join("src");
        for (path, bytes) in &spec.files {
            let file = src.join(path);
            fs::create_dir_all(file.parent().unwrap()).unwrap();
            fs::write(&file, bytes).unwrap();
        }
        let template = base.join("manifest.json");
        fs::write(&template, spec.template().to_pretty_string()).unwrap();
        let ext = match spec.kind {
            PackageKind::Kernel => "gkernel",
            PackageKind::Module => "gkmodule",
        };
        let archive = base.join(format!("{}.{ext}", spec.id));
        let packed = pack(&src, &template, &archive, key).unwrap();
        Built {
            archive,
            src,
            metadata: packed.metadata,
        }
    }

    /// An archive with the artifacts of `built` and `metadata` as its `.gkmetadata`, exactly as
    /// given (no signing, no re-serialising).
    pub fn with_metadata(&self, built: &Built, metadata: &[u8]) -> PathBuf {
        let out = self.fresh("tampered.gkmodule");
        write_gkpk(&out, metadata, &built.files()).unwrap();
        out
    }
}

/// Trusts `key` for `publisher` through the package manager.
pub fn trust(pm: &PackageManager, publisher_id: &str, key: &SigningKey) {
    let spki = key.public_key().spki_der().to_vec();
    pm.update_trust(|t| t.add_key(publisher(publisher_id), spki).map_err(Into::into))
        .unwrap();
}

/// How many store calls that write have been made through a [`Spy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Calls {
    pub staging: usize,
    pub commits: usize,
    pub trust_writes: usize,
}

#[derive(Debug, Default)]
struct Counters {
    staging: AtomicUsize,
    commits: AtomicUsize,
    trust_writes: AtomicUsize,
    /// Nanoseconds spent in the store's `commit` and `registry`, for the benchmarks' phases.
    commit_nanos: AtomicU64,
    registry_nanos: AtomicU64,
}

/// Time spent inside the store, summed over every call made through a [`Spy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreTime {
    /// In `PackageStore::commit` (the durable write of a transaction).
    pub commit: Duration,
    /// In `PackageStore::registry` (handing out a copy of the committed registry).
    pub registry: Duration,
}

/// Runs `f`, adding the nanoseconds it took to `total`.
fn timed_into<T>(total: &AtomicU64, f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let out = f();
    let nanos = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
    total.fetch_add(nanos, Ordering::SeqCst);
    out
}

/// A `PackageStore` that forwards to a shared `FsStore` and counts the calls that write. The test
/// keeps the `FsStore` to read its statistics (steps, fsyncs) after handing the spy to the
/// package manager.
#[derive(Debug, Clone)]
pub struct Spy {
    store: Arc<FsStore>,
    counters: Arc<Counters>,
}

impl Spy {
    pub fn calls(&self) -> Calls {
        Calls {
            staging: self.counters.staging.load(Ordering::SeqCst),
            commits: self.counters.commits.load(Ordering::SeqCst),
            trust_writes: self.counters.trust_writes.load(Ordering::SeqCst),
        }
    }

    pub fn store_time(&self) -> StoreTime {
        let read = |n: &AtomicU64| Duration::from_nanos(n.load(Ordering::SeqCst));
        StoreTime {
            commit: read(&self.counters.commit_nanos),
            registry: read(&self.counters.registry_nanos),
        }
    }
}

impl PackageStore for Spy {
    fn registry(&self) -> Result<StoreState, StoreError> {
        timed_into(&self.counters.registry_nanos, || self.store.registry())
    }

    fn new_staging_dir(&self) -> Result<PathBuf, StoreError> {
        self.counters.staging.fetch_add(1, Ordering::SeqCst);
        self.store.new_staging_dir()
    }

    fn discard_staging(&self, staged: &Path) -> Result<(), StoreError> {
        self.store.discard_staging(staged)
    }

    fn commit(&self, tx: Transaction) -> Result<Committed, StoreError> {
        // A trust change is a transaction of its own (the registry records the trust file); it
        // is counted as a trust write, so that `commits` keeps counting package changes.
        let counter = if tx.trust.is_some() {
            &self.counters.trust_writes
        } else {
            &self.counters.commits
        };
        counter.fetch_add(1, Ordering::SeqCst);
        timed_into(&self.counters.commit_nanos, || self.store.commit(tx))
    }

    fn package_dir(&self, id: &PackageId, version: &Version) -> PathBuf {
        self.store.package_dir(id, version)
    }

    fn read_trust(&self) -> Result<Option<Vec<u8>>, StoreError> {
        self.store.read_trust()
    }

    fn trust_path(&self) -> PathBuf {
        self.store.trust_path()
    }

    fn write_trust(&self, bytes: &[u8]) -> Result<(), StoreError> {
        self.counters.trust_writes.fetch_add(1, Ordering::SeqCst);
        self.store.write_trust(bytes)
    }

    fn recover(&self) -> Result<RecoveryReport, StoreError> {
        self.store.recover()
    }
}

/// A package manager over a real `FsStore`, with the store and a spy on it kept for the test.
#[derive(Debug)]
pub struct Host {
    pub pm: PackageManager,
    pub store: Arc<FsStore>,
    pub spy: Spy,
    pub report: OpenReport,
    pub root: PathBuf,
}

impl Host {
    /// The generation of the registry the store holds.
    pub fn generation(&self) -> u64 {
        self.store.registry().unwrap().generation()
    }
}

/// Runs `open` again while it fails only because the store is locked, for up to five seconds.
///
/// A store opened right after its last handle was dropped can find its lock still held for a
/// moment: a process that another test spawns at that instant is forked with a copy of every
/// open descriptor, the store's lock included, and keeps it until its `exec` closes it. Waiting
/// that out is sound; a lock held for longer is a real failure and is returned.
pub fn retry_locked<T>(mut open: impl FnMut() -> Result<T, HostError>) -> Result<T, HostError> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match open() {
            Err(HostError::Store(e))
                if e.kind == StoreErrorKind::Locked && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(2));
            }
            other => return other,
        }
    }
}

/// `PackageManager::open_dir`, the way a restarted host opens its store (see [`retry_locked`]).
pub fn open_dir(root: &Path) -> Result<(PackageManager, OpenReport), HostError> {
    retry_locked(|| PackageManager::open_dir(root))
}

/// Opens the store at `root` (creating it when absent) with the production source and verifier
/// and an optional fault plan for the store's next durable operation.
pub fn open_host(root: &Path, fault: Option<Fault>) -> Result<Host, HostError> {
    let (store, recovery) = retry_locked(|| {
        Ok(FsStore::open_with(
            root,
            StoreOptions::new().with_fault(fault),
        )?)
    })?;
    let store = Arc::new(store);
    let spy = Spy {
        store: store.clone(),
        counters: Arc::default(),
    };
    let (pm, report) = PackageManager::open(
        Box::new(spy.clone()),
        recovery,
        Box::new(GkpkSource::default()),
        Box::new(P256Verifier::new()),
        platform(),
    )?;
    Ok(Host {
        pm,
        store,
        spy,
        report,
        root: root.to_path_buf(),
    })
}

/// One entry of a store directory, with its contents hashed.
#[derive(Clone, PartialEq, Eq)]
pub enum Entry {
    Dir {
        read_only: bool,
    },
    File {
        sha256: Sha256Digest,
        len: u64,
        read_only: bool,
    },
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Entry::Dir { read_only } => write!(f, "dir (ro {read_only})"),
            Entry::File {
                sha256,
                len,
                read_only,
            } => write!(f, "{len} bytes {:.12} (ro {read_only})", sha256.to_hex()),
        }
    }
}

/// The store's files, as [`disk`] has them, but for its history: the registry's log, which
/// records every commit (a sync's steps and a return to where it started, say), and the directory
/// of pin files, which holds none once the runs that pinned are over.
pub fn store_files(root: &Path) -> BTreeMap<String, Entry> {
    let mut files = disk(root);
    files.remove("registry.log");
    files.remove("pins");
    files
}

/// Every entry under the store root (the lock file aside), by relative path: the registry, the
/// trust file, the journal, staging and every installed tree, byte for byte.
pub fn disk(root: &Path) -> BTreeMap<String, Entry> {
    let mut out = BTreeMap::new();
    walk(root, "", &mut out);
    out.remove("lock");
    out
}

fn walk(dir: &Path, prefix: &str, out: &mut BTreeMap<String, Entry>) {
    let mut entries: Vec<_> = fs::read_dir(dir).unwrap().map(|e| e.unwrap()).collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = format!("{prefix}{}", entry.file_name().to_string_lossy());
        let meta = fs::symlink_metadata(entry.path()).unwrap();
        let read_only = meta.permissions().readonly();
        if meta.is_dir() {
            out.insert(name.clone(), Entry::Dir { read_only });
            walk(&entry.path(), &format!("{name}/"), out);
        } else {
            assert!(meta.is_file(), "{name} is neither a file nor a directory");
            let bytes = fs::read(entry.path()).unwrap();
            out.insert(
                name,
                Entry::File {
                    sha256: Sha256Digest::of(&bytes),
                    len: meta.len(),
                    read_only,
                },
            );
        }
    }
}

/// The store holds nothing but its own files: empty staging and journal, no temporary files.
pub fn assert_no_leftovers(root: &Path, label: &str) {
    let layout = StoreLayout::new(root);
    let names = |dir: &Path| -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        names(&layout.staging),
        Vec::<String>::new(),
        "{label}: staging"
    );
    assert_eq!(
        names(&layout.journal),
        Vec::<String>::new(),
        "{label}: journal"
    );
    for name in names(root) {
        assert!(
            [
                "lock",
                "registry.json",
                "registry.log",
                "trust",
                "journal",
                "staging",
                "packages",
                "pins"
            ]
            .contains(&name.as_str()),
            "{label}: unexpected {name} in the store root"
        );
    }
}

/// What a user of the store can observe: the package manager's listing, the trust store (as its
/// file text, which is deterministic and reads well in a failure), and the installed trees on
/// disk with a digest of each tree's contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub packages: Vec<PackageSummary>,
    pub trust: String,
    pub trees: BTreeMap<String, Sha256Digest>,
}

/// Observes the store through an open package manager.
pub fn observe(pm: &PackageManager, root: &Path) -> Observed {
    Observed {
        packages: pm.list().unwrap(),
        trust: pm.trust().unwrap().to_json(),
        trees: trees(root),
    }
}

/// Every `packages/<id>/<version>` tree with a digest of its file names and contents.
pub fn trees(root: &Path) -> BTreeMap<String, Sha256Digest> {
    let packages = StoreLayout::new(root).packages;
    let mut out = BTreeMap::new();
    for id in sorted_dir(&packages) {
        for version in sorted_dir(&id) {
            let mut all = BTreeMap::new();
            walk(&version, "", &mut all);
            let listing: String = all
                .iter()
                .map(|(name, entry)| match entry {
                    Entry::Dir { read_only } => format!("{name} dir {read_only}\n"),
                    Entry::File {
                        sha256,
                        len,
                        read_only,
                    } => format!("{name} {len} {sha256} {read_only}\n"),
                })
                .collect();
            let name = format!(
                "{}@{}",
                id.file_name().unwrap().to_string_lossy(),
                version.file_name().unwrap().to_string_lossy()
            );
            out.insert(name, Sha256Digest::of(listing.as_bytes()));
        }
    }
    out
}

fn sorted_dir(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

/// The installed `id@version` names, for short assertions.
pub fn tree_names(root: &Path) -> BTreeSet<String> {
    trees(root).into_keys().collect()
}
