//! The host: load order with failing dependencies (fake loader), and a real dlopen'ed plugin whose
//! library stays loaded while a binding holds it through unload, replacement and rollback.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use guild_adapters_posix::DlopenLoader;
use guild_domain::ids::ImplId;
use guild_domain::lease::{Leased, QuiescentAction};
use guild_host::{DeviceSupport, Host, HostError, InstallOptions, OpenedHost};
use guild_ports::fakes::{fake_kernel, FakeLoader, FakePlugin};
use guild_ports::loader::{LoadError, LoadErrorKind, LoadRequest, LoadedPlugin, PluginLoader};
use guild_test_support::plugins::plugin_library;
use guild_test_support::{id, key, open_dir, trust, ModDep, Spec, Workshop, PUBLISHER};

/// Shares one fake loader between the host and the test that watches it.
pub(crate) struct Shared(pub(crate) Arc<FakeLoader>);

impl PluginLoader for Shared {
    fn load(&self, request: &LoadRequest) -> Result<LoadedPlugin, LoadError> {
        self.0.load(request)
    }
}

#[test]
fn a_failed_dependency_stops_its_dependents_before_they_are_opened() {
    let shop = Workshop::new();
    let k = key();
    let store = shop.fresh("store");
    let (pm, _) = open_dir(&store).unwrap();
    trust(&pm, PUBLISHER, &k);
    let base = shop.build(&Spec::module("ex.base", "1.0.0"), &k);
    let dep = shop.build(
        &Spec::module("ex.dep", "1.0.0").module_dep(ModDep::on("ex.base", "1.0.0")),
        &k,
    );
    let solo = shop.build(&Spec::module("ex.solo", "1.0.0"), &k);
    for b in [&base, &dep, &solo] {
        pm.install(&b.archive, InstallOptions::default()).unwrap();
    }

    let fake = Arc::new(FakeLoader::new());
    let plan = pm.load_plan().unwrap();
    let library = |name: &str| -> PathBuf {
        let p = plan.order.iter().find(|p| p.id.as_str() == name).unwrap();
        p.dir.join(
            pm.metadata(&p.id, &p.version)
                .unwrap()
                .manifest()
                .entry
                .as_str(),
        )
    };
    let (base_lib, dep_lib, solo_lib) = (library("ex.base"), library("ex.dep"), library("ex.solo"));
    fake.insert(
        &base_lib,
        FakePlugin::failing(LoadErrorKind::InitFailed {
            status: -9,
            status_name: "GUILD_STATUS_ERR_DEVICE",
            component: "ex.base".into(),
            message: "no device".into(),
        }),
    );
    let cpu = guild_domain::operation::Backend::Cpu;
    fake.insert(
        &dep_lib,
        FakePlugin::new().with_kernel(fake_kernel(ImplId::new("ex.dep.op.cpu").unwrap(), 1, cpu)),
    );
    fake.insert(
        &solo_lib,
        FakePlugin::new().with_kernel(fake_kernel(ImplId::new("ex.solo.op.cpu").unwrap(), 1, cpu)),
    );

    let host = Host::new(pm, Box::new(Shared(fake.clone())));
    let report = host.load_enabled().unwrap();
    assert_eq!(
        report
            .loaded
            .iter()
            .map(|l| l.id.as_str())
            .collect::<Vec<_>>(),
        ["ex.solo"]
    );
    assert_eq!(report.failed.len(), 1);
    let (failed_id, _, error) = &report.failed[0];
    assert_eq!(failed_id.as_str(), "ex.base");
    assert!(
        matches!(error, HostError::Load(e) if matches!(*e.kind, LoadErrorKind::InitFailed { status: -9, .. })),
        "{error}"
    );
    assert!(error.to_string().contains("no device"), "{error}");
    assert_eq!(report.skipped.len(), 1);
    assert_eq!(report.skipped[0].id.as_str(), "ex.dep");
    assert!(
        report.skipped[0].reason.contains("ex.base"),
        "{}",
        report.skipped[0].reason
    );
    // The dependent's library was never opened; the failed base was shut down after init.
    assert!(!fake.opened().contains(&dep_lib));
    assert_eq!(fake.shutdowns_of(&base_lib), 1);
    assert!(host
        .kernels()
        .find_by_id(&ImplId::new("ex.solo.op.cpu").unwrap())
        .is_some());
    assert!(host
        .kernels()
        .find_by_id(&ImplId::new("ex.dep.op.cpu").unwrap())
        .is_none());
}

fn good_kernel(version: &str, library: &[u8]) -> Spec {
    let mut spec = Spec::kernel("test.good", version)
        .library(library)
        .runner("test.good_kernel.runner");
    spec.provided_ops = vec![
        "test.good_kernel.rms_norm_f32".into(),
        "test.good_kernel.prefix_sum_f32".into(),
    ];
    spec
}

#[test]
fn the_builder_wires_the_plugin_log_and_the_devices_and_reports_what_opening_did() {
    let library = plugin_library("good_kernel");
    let shop = Workshop::new();
    let k = key();
    let store = shop.fresh("store");
    {
        let (pm, _) = open_dir(&store).unwrap();
        trust(&pm, PUBLISHER, &k);
        let built = shop.build(&good_kernel("1.0.0", &library), &k);
        pm.install(&built.archive, InstallOptions::default())
            .unwrap();
    }

    // Not loaded on open when asked not to; the log sink is the dlopen loader's.
    let records: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let sink = Arc::clone(&records);
    let OpenedHost { host, report } = Host::builder(&store)
        .devices(DeviceSupport::host())
        .plugin_log(move |package, record| {
            sink.lock()
                .unwrap()
                .push((package.to_string(), record.message.clone()))
        })
        .load_enabled(false)
        .open()
        .unwrap();
    assert_eq!(report.store.verified, 1);
    assert!(report.loaded.loaded.is_empty());
    assert_eq!(report.no_cuda, None, "the devices were given, not detected");
    assert!(records.lock().unwrap().is_empty());

    let loaded = host.load_enabled().unwrap();
    assert_eq!(loaded.loaded.len(), 1, "{loaded:?}");
    let records = records.lock().unwrap().clone();
    assert!(
        records
            .iter()
            .any(|(package, message)| package == "test.good"
                && message.contains("registered 2 kernels")),
        "the plugin's init record reached the sink: {records:?}"
    );
    drop(host);

    // Detected devices: the reason there is no CUDA device is kept, not thrown away.
    let OpenedHost { host, report } = Host::builder(&store).open().unwrap();
    assert_eq!(report.loaded.loaded.len(), 1);
    assert_eq!(
        report.no_cuda.is_some(),
        DeviceSupport::detect().1.is_some()
    );
    // The simple path is the same open.
    drop(host);
    let (_host, opened, loaded) = Host::open_dir(&store).unwrap();
    assert_eq!((opened.verified, loaded.loaded.len()), (1, 1));
}

/// A runner given a mistyped store path fails at open, naming it, and nothing is made there: the
/// builder (and `Host::open_dir`) open an existing store unless told to create one.
#[test]
fn the_builder_opens_only_an_existing_store_unless_told_to_create_it() {
    let shop = Workshop::new();
    let missing = shop.path().join("no-such-store");
    let empty = shop.fresh("empty");
    std::fs::create_dir_all(&empty).unwrap();
    for dir in [&missing, &empty] {
        match Host::builder(dir).devices(DeviceSupport::host()).open() {
            Err(HostError::NotAStore { path, .. }) => assert_eq!(&path, dir),
            Err(other) => panic!("{}: {other}", dir.display()),
            Ok(_) => panic!("opened {} as a store", dir.display()),
        }
        match Host::open_dir(dir) {
            Err(HostError::NotAStore { path, .. }) => assert_eq!(&path, dir),
            Err(other) => panic!("{}: {other}", dir.display()),
            Ok(_) => panic!("open_dir opened {} as a store", dir.display()),
        }
    }
    assert!(!missing.exists(), "{} was created", missing.display());
    assert_eq!(
        std::fs::read_dir(&empty).unwrap().count(),
        0,
        "the empty directory was written"
    );

    // Asked to, the builder makes the store, and opens it as one from then on.
    let OpenedHost { report, .. } = Host::builder(&missing)
        .devices(DeviceSupport::host())
        .create_store(true)
        .open()
        .unwrap();
    assert_eq!(report.store.verified, 0);
    Host::builder(&missing)
        .devices(DeviceSupport::host())
        .open()
        .unwrap();
}

#[test]
fn a_binding_holds_a_real_library_through_rollback_remove_replacement_and_disable() {
    let library = plugin_library("good_kernel");
    let shop = Workshop::new();
    let k = key();
    let store = shop.fresh("store");
    let (pm, _) = open_dir(&store).unwrap();
    trust(&pm, PUBLISHER, &k);
    let loader = DlopenLoader::new();
    let host = Host::new(pm, Box::new(loader.clone()));
    let pkg = id("test.good");
    let v = |s: &str| shop.build(&good_kernel(s, &library), &k);
    let (v1, v2, v3) = (v("1.0.0"), v("1.1.0"), v("1.2.0"));

    host.install(&v1.archive, InstallOptions::default())
        .unwrap();
    assert_eq!(loader.open_libraries(), 1);
    host.install(&v2.archive, InstallOptions::default())
        .unwrap();
    assert_eq!(
        loader.open_libraries(),
        1,
        "nothing held 1.0.0, so replacing it closed it"
    );

    let binding = host
        .kernels()
        .find_by_id(&ImplId::new("test.good_kernel.prefix_sum_f32").unwrap())
        .unwrap();
    assert_eq!(binding.version().to_string(), "1.1.0");
    assert_eq!(host.active_package_leases(&pkg), 1);
    // Runners are shared the same way: a runner reference counts as a lease while it lives.
    let runner_id = guild_domain::ids::RunnerId::new("test.good_kernel.runner").unwrap();
    let runner = host.kernels().find_runner(&runner_id).unwrap();
    assert_eq!(runner.package(), &pkg);
    assert_eq!(host.kernels().runners().len(), 1);
    assert_eq!(host.active_package_leases(&pkg), 2);
    drop(runner);
    assert_eq!(host.active_package_leases(&pkg), 1);

    let leased = |e: HostError, action| match e {
        HostError::Leased(Leased {
            id,
            action: a,
            bindings,
            ..
        }) => {
            assert_eq!((id, a, bindings), (pkg.clone(), action, 1));
        }
        other => panic!("expected a lease refusal, got {other}"),
    };
    // Nothing that would unload or replace the bound code goes through while it is held.
    leased(host.rollback(&pkg).unwrap_err(), QuiescentAction::Rollback);
    leased(
        host.remove(&pkg, None).unwrap_err(),
        QuiescentAction::Remove,
    );
    leased(
        host.install(&v3.archive, InstallOptions::default())
            .unwrap_err(),
        QuiescentAction::Replace,
    );
    leased(host.disable(&pkg).unwrap_err(), QuiescentAction::Unload);
    assert_eq!(
        loader.open_libraries(),
        1,
        "refusals load nothing and close nothing"
    );
    assert_eq!(
        host.kernels().loaded_version(&pkg).unwrap().to_string(),
        "1.1.0"
    );

    // Disabling while bound waits for the binding when asked to.
    std::thread::scope(|s| {
        let waiting = s.spawn(|| host.disable_waiting(&pkg, std::time::Duration::from_secs(30)));
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!waiting.is_finished(), "disable went through while bound");
        drop(binding);
        assert_eq!(waiting.join().unwrap().unwrap().to_string(), "1.1.0");
    });
    assert_eq!(
        loader.open_libraries(),
        0,
        "the last binding gone, the library closed"
    );
    assert_eq!(host.active_package_leases(&pkg), 0);

    // Unbound, a replacement goes through.
    host.enable(&pkg).unwrap();
    host.install(&v3.archive, InstallOptions::default())
        .unwrap();
    assert_eq!(
        loader.open_libraries(),
        1,
        "1.1.0 closed as it was replaced"
    );
    assert_eq!(
        host.kernels().loaded_version(&pkg).unwrap().to_string(),
        "1.2.0"
    );

    // With nothing held, rollback goes through and loads the restored version.
    let rolled = host.rollback(&pkg).unwrap();
    assert_eq!(rolled.to.to_string(), "1.1.0");
    assert_eq!(loader.open_libraries(), 1);
    assert_eq!(
        host.kernels().loaded_version(&pkg).unwrap().to_string(),
        "1.1.0"
    );
}

#[test]
fn a_plugin_whose_registrations_differ_from_its_manifest_is_not_installed() {
    let library = plugin_library("good_kernel");
    let shop = Workshop::new();
    let k = key();
    let store = shop.fresh("store");
    let (pm, _) = open_dir(&store).unwrap();
    trust(&pm, PUBLISHER, &k);
    let loader = DlopenLoader::new();
    let host = Host::new(pm, Box::new(loader.clone()));
    let mut spec = good_kernel("1.0.0", &library);
    spec.provided_ops.pop();
    let built = shop.build(&spec, &k);
    let err = host
        .install(&built.archive, InstallOptions::default())
        .unwrap_err();
    assert!(
        matches!(&err, HostError::Load(e) if matches!(*e.kind, LoadErrorKind::RegistrationMismatch { .. })),
        "{err}"
    );
    // Publication was aborted before the commit: nothing recorded, nothing left open.
    assert!(host.packages().list().unwrap().is_empty());
    assert_eq!(loader.open_libraries(), 0);
}

/// A host over a fresh store with one enabled module whose library the fake loader serves.
fn fake_host(
    shop: &Workshop,
    k: &guild_adapters_crypto::SigningKey,
) -> (Host, Arc<FakeLoader>, PathBuf) {
    let store = shop.fresh("store");
    let (pm, _) = open_dir(&store).unwrap();
    trust(&pm, PUBLISHER, k);
    let built = shop.build(&Spec::module("ex.fake", "1.0.0"), k);
    pm.install(&built.archive, InstallOptions::default())
        .unwrap();
    let plan = pm.load_plan().unwrap();
    let p = &plan.order[0];
    let lib = p.dir.join(
        pm.metadata(&p.id, &p.version)
            .unwrap()
            .manifest()
            .entry
            .as_str(),
    );
    let fake = Arc::new(FakeLoader::new());
    let cpu = guild_domain::operation::Backend::Cpu;
    fake.insert(
        &lib,
        FakePlugin::new().with_kernel(fake_kernel(ImplId::new("ex.fake.op.cpu").unwrap(), 1, cpu)),
    );
    (Host::new(pm, Box::new(Shared(fake.clone()))), fake, lib)
}

fn revoke(host: &Host, k: &guild_adapters_crypto::SigningKey) {
    host.update_trust(|t| {
        t.revoke_key(k.key_id(), "test");
        Ok(())
    })
    .unwrap();
}

#[test]
fn a_key_revoked_while_running_stops_loading_and_reverify_unloads() {
    let shop = Workshop::new();
    let k = key();

    // Revoked after the store was opened but before loading: the library is never opened.
    let (host, fake, lib) = fake_host(&shop, &k);
    revoke(&host, &k);
    let report = host.load_enabled().unwrap();
    assert!(report.loaded.is_empty());
    assert!(
        matches!(report.failed[0].2, HostError::Unauthenticated { .. }),
        "{}",
        report.failed[0].2
    );
    assert!(!fake.opened().contains(&lib));

    // Revoked after loading: reverify disables it in the store and takes it out of the registry.
    let (host, fake, _) = fake_host(&shop, &k);
    assert_eq!(host.load_enabled().unwrap().loaded.len(), 1);
    revoke(&host, &k);
    let disabled = host.reverify().unwrap();
    assert_eq!(
        disabled.iter().map(|q| q.id.as_str()).collect::<Vec<_>>(),
        ["ex.fake"]
    );
    assert!(host
        .kernels()
        .find_by_id(&ImplId::new("ex.fake.op.cpu").unwrap())
        .is_none());
    assert_eq!(fake.live_libraries(), 0);
}

#[test]
fn rollback_and_enable_recheck_the_installed_files_before_loading() {
    let shop = Workshop::new();
    let k = key();
    let store = shop.fresh("store");
    let (pm, _) = open_dir(&store).unwrap();
    trust(&pm, PUBLISHER, &k);
    let v1 = shop.build(&Spec::module("ex.files", "1.0.0"), &k);
    let v2 = shop.build(&Spec::module("ex.files", "2.0.0"), &k);
    pm.install(&v1.archive, InstallOptions::default()).unwrap();
    pm.install(&v2.archive, InstallOptions::default()).unwrap();
    // Damage the superseded version's library on disk.
    let plan_dir = store.join("packages/ex.files/1.0.0");
    let entry = v1.metadata.manifest().entry.as_str().to_owned();
    guild_test_support::make_writable(&plan_dir);
    std::fs::write(plan_dir.join(&entry), b"tampered").unwrap();
    let err = pm.rollback(&id("ex.files")).unwrap_err();
    assert!(matches!(err, HostError::Source(_)), "{err}");
    assert!(err.to_string().contains(&entry), "{err}");
    // Nothing changed: 2.0.0 is still the enabled version.
    assert_eq!(
        pm.list().unwrap()[0].enabled.as_ref().unwrap().to_string(),
        "2.0.0"
    );
}

#[test]
fn a_host_under_a_lock_loads_only_what_the_lock_admits() {
    use guild_domain::distribution::{LockFile, LockRefusal, LockedPackage};
    let shop = Workshop::new();
    let k = key();
    let store = shop.fresh("store");
    let (pm, _) = open_dir(&store).unwrap();
    trust(&pm, PUBLISHER, &k);
    let base = shop.build(&Spec::module("ex.base", "1.0.0"), &k);
    let dep = shop.build(
        &Spec::module("ex.dep", "1.0.0").module_dep(ModDep::on("ex.base", "1.0.0")),
        &k,
    );
    let solo = shop.build(&Spec::module("ex.solo", "1.0.0"), &k);
    let stray = shop.build(&Spec::module("ex.stray", "1.0.0"), &k);
    for b in [&base, &dep, &solo, &stray] {
        pm.install(&b.archive, InstallOptions::default()).unwrap();
    }
    let fake = Arc::new(FakeLoader::new());
    let cpu = guild_domain::operation::Backend::Cpu;
    for p in pm.load_plan().unwrap().order {
        let m = pm.metadata(&p.id, &p.version).unwrap();
        let impl_id = ImplId::new(format!("{}.op.cpu", p.id)).unwrap();
        fake.insert(
            p.dir.join(m.manifest().entry.as_str()),
            FakePlugin::new().with_kernel(fake_kernel(impl_id, 1, cpu)),
        );
    }
    let entry = |b: &guild_test_support::Built, digest| LockedPackage {
        id: b.id(),
        version: b.version(),
        kind: guild_domain::ids::PackageKind::Module,
        payload_sha256: digest,
        publisher: guild_test_support::publisher(PUBLISHER),
        key_id: k.key_id(),
        source: None,
    };
    // ex.base is locked with another digest (so ex.dep, which needs it, is skipped), ex.solo
    // as installed, ex.dep as installed, and ex.stray not at all.
    let lock = LockFile::new([
        entry(&base, guild_domain::ids::Sha256Digest([7; 32])),
        entry(&dep, dep.digest()),
        entry(&solo, solo.digest()),
    ])
    .unwrap();
    let host = Host::new(pm, Box::new(Shared(fake.clone()))).under_lock(lock);
    let report = host.load_enabled().unwrap();
    let loaded: Vec<&str> = report.loaded.iter().map(|l| l.id.as_str()).collect();
    assert_eq!(loaded, ["ex.solo"]);
    let refused: Vec<(&str, &LockRefusal)> = report
        .refused_by_lock
        .iter()
        .map(|r| (r.id.as_str(), &r.reason))
        .collect();
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert!(matches!(
        refused.iter().find(|r| r.0 == "ex.base").unwrap().1,
        LockRefusal::DigestDiffers { .. }
    ));
    assert_eq!(
        refused.iter().find(|r| r.0 == "ex.stray").unwrap().1,
        &LockRefusal::NotLocked
    );
    assert_eq!(report.skipped.len(), 1);
    assert_eq!(report.skipped[0].id.as_str(), "ex.dep");
    // Nothing the lock refused was opened.
    assert_eq!(fake.opened().len(), 1);
}

/// Every lifecycle change a `Host` makes takes the host's and the package manager's locks and
/// runs the registry's hook inside them; a lock taken twice on one path would hang the caller
/// for ever. The changes run on a thread of their own, and each must report back before a
/// deadline, so that such a cycle fails naming the change it hung in instead of stopping the
/// suite (the hung thread is left behind; the test process ends it). The deadline is generous,
/// since valgrind runs this file: it only tells "returned" from "never returns".
#[test]
fn every_lifecycle_change_through_a_host_returns() {
    use std::sync::mpsc;
    use std::time::Duration;

    let library = plugin_library("good_kernel");
    let shop = Workshop::new();
    let k = key();
    let store = shop.fresh("store");
    let (pm, _) = open_dir(&store).unwrap();
    trust(&pm, PUBLISHER, &k);
    let host = Host::new(pm, Box::new(DlopenLoader::new()));
    let pkg = id("test.good");
    let v1 = shop.build(&good_kernel("1.0.0", &library), &k).archive;
    let v2 = shop.build(&good_kernel("1.1.0", &library), &k).archive;
    let (done, changes) = mpsc::channel();
    let changing = std::thread::spawn(move || {
        let step = |what: &'static str, outcome: Result<(), HostError>| {
            done.send((what, outcome.map_err(|e| e.to_string())))
                .unwrap();
        };
        let install = InstallOptions::default;
        step("install 1.0.0", host.install(&v1, install()).map(drop));
        step("install 1.1.0", host.install(&v2, install()).map(drop));
        step("rollback", host.rollback(&pkg).map(drop));
        step("disable", host.disable(&pkg).map(drop));
        step("enable", host.enable(&pkg).map(drop));
        let superseded = "1.1.0".parse().unwrap();
        step(
            "remove 1.1.0",
            host.remove(&pkg, Some(&superseded)).map(drop),
        );
        step("purge 1.1.0", host.purge(&pkg, Some(&superseded)).map(drop));
        host.kernels().loaded_version(&pkg).map(|v| v.to_string())
    });
    let mut last = "the start";
    for _ in 0..7 {
        match changes.recv_timeout(Duration::from_secs(300)) {
            Ok((what, outcome)) => {
                assert!(outcome.is_ok(), "{what} failed: {outcome:?}");
                last = what;
            }
            Err(_) => panic!("the change after {last} did not return within 300 s: a lock cycle?"),
        }
    }
    assert_eq!(changing.join().unwrap().as_deref(), Some("1.0.0"));
}
