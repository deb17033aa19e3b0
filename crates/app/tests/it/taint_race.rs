//! A reader that finds a version's files damaged right before a load taints it only after
//! hashing them again under the store's lock: a same-version repair that another process
//! committed between its hash and its taint is not punished.
//!
//! The seam is the package source: the reader's hash fails on the damaged tree, and before that
//! answer reaches the package manager, a second package manager on the same store (standing for
//! another process) repairs the version by installing its genuine archive again.

use std::fmt;
use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use guild_adapters_crypto::P256Verifier;
use guild_adapters_fs::archive::GkpkSource;
use guild_adapters_fs::store::{read_registry, FsStore, StoreOptions};
use guild_domain::manifest::{Artifact, Manifest};
use guild_host::{InstallOptions, PackageManager};
use guild_ports::source::{ExtractedPackage, OpenedPackage, PackageSource, SourceError};
use guild_test_support::{key, platform, trust, Spec, Workshop, PUBLISHER};

type Hook = Arc<Mutex<Option<Box<dyn FnOnce() + Send>>>>;

/// The production source, running the hook (once) when a check of an installed tree fails.
struct HookedSource {
    inner: GkpkSource,
    hook: Hook,
}

impl PackageSource for HookedSource {
    fn open(&self, location: &Path) -> Result<Box<dyn OpenedPackage>, SourceError> {
        Ok(Box::new(Hooked {
            inner: self.inner.open(location)?,
            hook: Arc::clone(&self.hook),
        }))
    }
}

struct Hooked {
    inner: Box<dyn OpenedPackage>,
    hook: Hook,
}

impl fmt::Debug for Hooked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl OpenedPackage for Hooked {
    fn metadata_bytes(&self) -> &[u8] {
        self.inner.metadata_bytes()
    }

    fn extract_to(
        self: Box<Self>,
        manifest: &Manifest,
        staging: &Path,
    ) -> Result<ExtractedPackage, SourceError> {
        self.inner.extract_to(manifest, staging)
    }

    fn verify_in_place(self: Box<Self>, manifest: &Manifest) -> Result<Vec<Artifact>, SourceError> {
        let checked = self.inner.verify_in_place(manifest);
        if checked.is_err() {
            let hook = self.hook.lock().unwrap().take();
            if let Some(hook) = hook {
                hook();
            }
        }
        checked
    }
}

#[test]
fn a_repair_between_a_readers_hash_and_its_taint_is_not_tainted() {
    let shop = Workshop::new();
    let signer = key();
    let store = shop.fresh("store");
    let built = shop.build(&Spec::module("ex.race", "1.0.0"), &signer);
    let (id, version) = (built.id(), built.version());
    {
        let (pm, _) = PackageManager::open_dir(&store).unwrap();
        trust(&pm, PUBLISHER, &signer);
        pm.install(&built.archive, InstallOptions::default())
            .unwrap();
    }
    // The library is changed behind the store's back.
    let library = store
        .join("packages")
        .join(id.as_str())
        .join(version.to_string())
        .join("lib")
        .join("librace.so");
    {
        use std::os::unix::fs::PermissionsExt as _;
        fs::set_permissions(&library, fs::Permissions::from_mode(0o644)).unwrap();
        fs::write(&library, b"tampered").unwrap();
        fs::set_permissions(&library, fs::Permissions::from_mode(0o444)).unwrap();
    }

    let hook: Hook = Arc::default();
    let (reader_store, recovery) =
        FsStore::open_with(&store, StoreOptions::new().reader()).unwrap();
    let (reader, _) = PackageManager::open(
        Box::new(reader_store),
        recovery,
        Box::new(HookedSource {
            inner: GkpkSource::default(),
            hook: Arc::clone(&hook),
        }),
        Box::new(P256Verifier::new()),
        platform(),
    )
    .unwrap();
    let (repairer, _) = PackageManager::open_dir_reader(&store).unwrap();
    let repaired = Arc::new(AtomicBool::new(false));
    *hook.lock().unwrap() = Some(Box::new({
        let (archive, repaired) = (built.archive.clone(), Arc::clone(&repaired));
        move || {
            let out = repairer
                .install(&archive, InstallOptions::default())
                .unwrap();
            assert!(out.repaired, "{out:?}");
            repaired.store(true, Ordering::SeqCst);
        }
    }));

    let checked = reader.check_files_before_load(&id, &version);
    assert!(repaired.load(Ordering::SeqCst), "the repair ran in between");
    let registry = read_registry(&store).unwrap().unwrap();
    let record = registry.record(&id, &version).unwrap();
    assert_eq!(
        record.taint, None,
        "the freshly repaired version was tainted ({checked:?})"
    );
    assert!(record.state.is_enabled(), "{record:?}");
    // Its files are the genuine ones now, as the check under the lock found: it may load.
    checked.unwrap();
    assert_eq!(
        fs::read(&library).unwrap(),
        fs::read(built.src.join("lib").join("librace.so")).unwrap()
    );
}
