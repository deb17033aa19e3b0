//! The durable store: the crash matrix, fail-closed opening, locking, recovery and transaction
//! validation.

mod files;
mod log;
mod matrix;
mod open;
mod replace;
mod shared;

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::path::Path;

use guild_adapters_fs::store::{FsStore, StoreLayout};
use guild_domain::ids::{PackageId, PackageKind, PublisherId, Sha256Digest};
use guild_domain::store_state::{
    NewVersion, PublishKind, PublishOptions, StoreState, StoreStateError,
};
use guild_domain::version::Version;
use guild_ports::store::{Committed, PackageStore, StoreError, Transaction};

pub(crate) fn id(s: &str) -> PackageId {
    PackageId::new(s).unwrap()
}

pub(crate) fn v(s: &str) -> Version {
    Version::parse(s).unwrap()
}

/// The facts of a test package version; its digest is derived from its name, so that the same
/// `id@version` always has the same payload.
pub(crate) fn new_version(pkg: &str, ver: &str) -> NewVersion {
    NewVersion {
        payload_digest: Sha256Digest::of(format!("{pkg}@{ver}").as_bytes()),
        kind: PackageKind::Module,
        publisher: PublisherId::new("org.example").unwrap(),
        signed_by: Vec::new(),
        facts: None,
    }
}

/// Creates the tree an extractor would leave for `pkg@ver` at a fresh staging path: a manifest,
/// a library in a subdirectory, and a data file.
pub(crate) fn stage_tree(store: &FsStore, pkg: &str, ver: &str) -> std::path::PathBuf {
    let staged = store.new_staging_dir().unwrap();
    fs::create_dir(&staged).unwrap();
    fs::write(
        staged.join(".gkmetadata"),
        format!("{{\"pkg\": \"{pkg}@{ver}\"}}"),
    )
    .unwrap();
    fs::create_dir(staged.join("lib")).unwrap();
    fs::write(
        staged.join("lib").join(format!("lib{pkg}.so")),
        format!("ELF {pkg} {ver}").repeat(50),
    )
    .unwrap();
    staged
}

/// Publishes `pkg@ver` through one transaction, the way the package manager will.
pub(crate) fn publish(
    store: &FsStore,
    pkg: &str,
    ver: &str,
    options: PublishOptions,
) -> Result<Committed, StoreError> {
    let before = store.registry()?;
    let mut next = before.successor();
    let out = next
        .publish(&id(pkg), &v(ver), new_version(pkg, ver), options)
        .unwrap();
    assert_eq!(out.kind, PublishKind::New);
    let staged = stage_tree(store, pkg, ver);
    store.commit(Transaction::new(before.generation(), next).with_install(id(pkg), v(ver), staged))
}

/// Publishes every `pkg@ver` of `versions` (each new to the store) through one transaction, as a
/// sync does; `more` may change the draft further and add installs (a replacement, say) before
/// it commits.
pub(crate) fn publish_many(
    store: &FsStore,
    versions: &[(&str, &str)],
    more: impl FnOnce(&mut StoreState, Transaction) -> Transaction,
) -> Result<Committed, StoreError> {
    let before = store.registry()?;
    let mut next = before.successor();
    let mut staged = Vec::new();
    for (pkg, ver) in versions {
        let out = next
            .publish(&id(pkg), &v(ver), new_version(pkg, ver), ENABLED)
            .unwrap();
        assert_eq!(out.kind, PublishKind::New);
        staged.push((id(pkg), v(ver), stage_tree(store, pkg, ver)));
    }
    let mut tx = Transaction::new(before.generation(), StoreState::new());
    for (pkg, ver, tree) in staged {
        tx = tx.with_install(pkg, ver, tree);
    }
    let mut tx = more(&mut next, tx);
    tx.new_state = next;
    store.commit(tx)
}

pub(crate) const ENABLED: PublishOptions = PublishOptions {
    enable: true,
    allow_downgrade: false,
};

/// Applies a state-only registry change through one transaction.
pub(crate) fn change(
    store: &FsStore,
    f: impl FnOnce(&mut StoreState) -> Result<(), StoreStateError>,
) -> Result<Committed, StoreError> {
    let before = store.registry()?;
    let mut next = before.successor();
    f(&mut next).unwrap();
    store.commit(Transaction::new(before.generation(), next))
}

/// Commits a trust file naming `note` with its record in the registry, as the package manager
/// does for every trust change.
pub(crate) fn commit_trust(store: &FsStore, note: &str) -> Result<Committed, StoreError> {
    let before = store.registry()?;
    let generation = before
        .trust_anchor()
        .map_or(1, |a| a.binding.generation + 1);
    let mut trust = guild_domain::trust::TrustStore::new();
    trust.revoke_digest(Sha256Digest::of(note.as_bytes()), note);
    if let Some(anchor) = before.trust_anchor() {
        for (d, r) in &anchor.revoked_digests {
            trust.revoke_digest(*d, r.clone());
        }
    }
    let (bytes, anchor) = trust.seal(STORE_ID, generation);
    let mut next = before.successor();
    next.set_trust_anchor(anchor);
    store.commit(Transaction::new(before.generation(), next).with_trust(bytes))
}

/// The store id the tests bind trust files to.
pub(crate) const STORE_ID: &str = "0123456789abcdef0123456789abcdef";

/// Changes the library of the installed `pkg@ver` behind the store's back.
pub(crate) fn tamper(store: &FsStore, pkg: &str, ver: &str) {
    use std::os::unix::fs::PermissionsExt as _;
    let lib = store
        .package_dir(&id(pkg), &v(ver))
        .join("lib")
        .join(format!("lib{pkg}.so"));
    fs::set_permissions(&lib, fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(&lib, b"tampered").unwrap();
    fs::set_permissions(&lib, fs::Permissions::from_mode(0o444)).unwrap();
}

/// One entry under `packages/`.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Node {
    Dir { read_only: bool },
    File { bytes: Vec<u8>, read_only: bool },
}

/// Everything durable in a store: the registry and trust bytes and every package tree, byte for
/// byte, with each entry's read-only flag.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Snapshot {
    pub(crate) registry: Vec<u8>,
    pub(crate) trust: Option<Vec<u8>>,
    pub(crate) packages: BTreeMap<String, Node>,
}

// Failure messages show text and digests rather than byte arrays.
impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Node::Dir { read_only } => write!(f, "dir (read-only: {read_only})"),
            Node::File { bytes, read_only } => write!(
                f,
                "{} bytes, sha256 {:.12} (read-only: {read_only})",
                bytes.len(),
                Sha256Digest::of(bytes).to_hex()
            ),
        }
    }
}

impl fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Snapshot")
            .field("registry", &String::from_utf8_lossy(&self.registry))
            .field("trust", &self.trust.as_deref().map(String::from_utf8_lossy))
            .field("packages", &self.packages)
            .finish()
    }
}

pub(crate) fn snapshot(root: &Path) -> Snapshot {
    let layout = StoreLayout::new(root);
    let mut packages = BTreeMap::new();
    walk(&layout.packages, "", &mut packages);
    Snapshot {
        // The committed state, whatever mix of checkpoint and log frames holds it.
        registry: guild_adapters_fs::store::read_registry(root)
            .unwrap()
            .unwrap()
            .to_json(),
        trust: fs::read(&layout.trust).ok(),
        packages,
    }
}

fn walk(dir: &Path, prefix: &str, out: &mut BTreeMap<String, Node>) {
    for entry in fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = format!("{prefix}{}", entry.file_name().to_string_lossy());
        let meta = fs::symlink_metadata(entry.path()).unwrap();
        let read_only = meta.permissions().readonly();
        if meta.is_dir() {
            out.insert(name.clone(), Node::Dir { read_only });
            walk(&entry.path(), &format!("{name}/"), out);
        } else {
            assert!(meta.is_file(), "{name} is neither a file nor a directory");
            out.insert(
                name,
                Node::File {
                    bytes: fs::read(entry.path()).unwrap(),
                    read_only,
                },
            );
        }
    }
}

/// The store holds nothing but its own files: empty staging and journal, no temporary files.
pub(crate) fn assert_no_leftovers(root: &Path) {
    let layout = StoreLayout::new(root);
    let names = |dir: &Path| -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&layout.staging), Vec::<String>::new(), "staging");
    assert_eq!(names(&layout.journal), Vec::<String>::new(), "journal");
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
            "unexpected {name} in the store root"
        );
    }
}
