//! What the store benchmarks share: synthetic package versions and trees, and a store of `n`
//! enabled packages written directly (no signing), since only the store's work is measured.

use std::fs;
use std::path::Path;

use guild_adapters_fs::store::StoreLayout;
use guild_domain::ids::{PackageId, PackageKind, PublisherId, Sha256Digest};
use guild_domain::store_state::{NewVersion, PublishOptions, StoreState};
use guild_domain::version::Version;

/// Publishes enabled, never as a downgrade.
pub const ENABLE: PublishOptions = PublishOptions {
    enable: true,
    allow_downgrade: false,
};

/// A version whose payload digest is that of `tag`.
pub fn new_version(tag: &str) -> NewVersion {
    NewVersion {
        payload_digest: Sha256Digest::of(tag.as_bytes()),
        kind: PackageKind::Kernel,
        publisher: PublisherId::new("org.bench").expect("valid publisher id"),
        signed_by: Vec::new(),
        facts: None,
    }
}

/// Writes a package tree as the extractor would leave it: a manifest and one library.
pub fn write_tree(dir: &Path, library: &[u8]) {
    fs::create_dir_all(dir.join("lib")).expect("create tree");
    fs::write(dir.join(".gkmetadata"), b"{\"bench\": true}").expect("write manifest");
    fs::write(dir.join("lib/libbench.so"), library).expect("write library");
}

/// A store of `n` enabled packages, `bench.pkgNNNNN` 1.0.0: the registry in format 1 (through
/// the domain's encoder, as the code before the registry log wrote it; a first commit migrates
/// it) and the trees with plain writes.
pub fn build_store(root: &Path, n: usize) {
    let layout = StoreLayout::new(root);
    for dir in [
        &layout.root,
        &layout.journal,
        &layout.staging,
        &layout.packages,
    ] {
        fs::create_dir_all(dir).expect("create layout");
    }
    let mut registry = StoreState::new();
    let version = Version::new(1, 0, 0);
    for i in 0..n {
        let id = PackageId::new(format!("bench.pkg{i:05}")).expect("valid id");
        registry
            .publish(&id, &version, new_version(&format!("{i}")), ENABLE)
            .expect("publish is legal");
        write_tree(&layout.package_dir(&id, &version), b"\x7fELF");
    }
    fs::write(&layout.registry, registry.successor().to_json()).expect("write registry");
}
