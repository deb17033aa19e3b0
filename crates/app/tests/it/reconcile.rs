//! A serving runner reaches whatever the operator committed, whatever failed once on the way
//! (issue G20, items 1 and 2): a refresh that failed after the package manager had read the new
//! generation, and a switch whose load failed, are both retried by later refreshes (and by a
//! `Host::watch`er without any new store event) until the runner serves what the store enables.
//!
//! The faults are real or at the loader port: the crash-record directories replaced by a plain
//! file (so listing or writing them fails, whoever runs the test, root included) and a loader
//! that wraps the dlopen loader and refuses the first loads of one version as a failing `init`
//! would. Every wait is bounded by [`PATIENCE`], a guard against hangs, not a timing assertion.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use guild_adapters_crypto::SigningKey;
use guild_adapters_posix::DlopenLoader;
use guild_host::ports::loader::{
    LoadError, LoadErrorKind, LoadRequest, LoadedLibrary, LoadedPlugin, PluginLoader,
};
use guild_host::registry::KernelBinding;
use guild_host::{
    DeviceSupport, Host, ImplId, InstallOptions, OpHandle, OperationService, PackageId,
    PendingCause, ResolveError, Version,
};
use guild_ports::fakes::{fake_kernel, FakeLoader, FakePlugin};
use guild_test_support::{id, key, open_dir, trust, v, ModDep, Spec, Workshop, PUBLISHER};

use crate::examples::{pack_example_at, SCAN};

use guild_test_support::plugins::INCLUSIVE_OP as OP;

/// How long a host may take to reach the committed state before the test gives up: only a host
/// that never follows exceeds it.
const PATIENCE: Duration = Duration::from_secs(30);

/// Wraps the dlopen loader and fails the next `n` loads of a version as an `init` that returned
/// an error would.
#[derive(Clone, Default)]
struct FlakyLoader {
    failures: Arc<Mutex<BTreeMap<String, usize>>>,
    attempts: Arc<Mutex<BTreeMap<String, usize>>>,
}

impl FlakyLoader {
    fn fail_next(&self, version: &str, n: usize) {
        self.failures.lock().unwrap().insert(version.to_owned(), n);
    }

    fn attempts(&self, version: &str) -> usize {
        self.attempts
            .lock()
            .unwrap()
            .get(version)
            .copied()
            .unwrap_or(0)
    }
}

impl PluginLoader for FlakyLoader {
    fn load(&self, request: &LoadRequest) -> Result<LoadedPlugin, LoadError> {
        let version = request.version.to_string();
        *self
            .attempts
            .lock()
            .unwrap()
            .entry(version.clone())
            .or_default() += 1;
        if let Some(left) = self.failures.lock().unwrap().get_mut(&version) {
            if *left > 0 {
                *left -= 1;
                return Err(LoadError::new(
                    LoadErrorKind::InitFailed {
                        status: -1,
                        status_name: "GUILD_STATUS_ERR_INTERNAL",
                        component: "test".into(),
                        message: "a transient failure".into(),
                    },
                    request,
                ));
            }
        }
        DlopenLoader::new().load(request)
    }
}

/// A store with the publisher trusted and the example scan 1.0.0 installed by a writer that is
/// closed again; the key.
fn store_with_scan(shop: &Workshop) -> (PathBuf, SigningKey) {
    let k = key();
    let store = shop.fresh("store");
    let (pm, _) = open_dir(&store).unwrap();
    trust(&pm, PUBLISHER, &k);
    pm.install(
        &pack_example_at(shop, &k, &SCAN, None),
        InstallOptions::default(),
    )
    .unwrap();
    (store, k)
}

/// The operator commits scan `version` from another writer (the runner's host holds no lock).
fn operator_installs(shop: &Workshop, store: &Path, k: &SigningKey, version: &str) {
    let archive = pack_example_at(shop, k, &SCAN, Some(version));
    let (pm, _) = open_dir(store).unwrap();
    pm.install(&archive, InstallOptions::default()).unwrap();
}

/// A runner's host on `store`, loading through `loader` when one is given.
fn runner(store: &Path, loader: Option<FlakyLoader>) -> Host {
    let mut builder = Host::builder(store).devices(DeviceSupport::host());
    if let Some(loader) = loader {
        builder = builder.loader(Box::new(loader));
    }
    builder.open().unwrap().host
}

fn scan_handle<'r>(service: &OperationService<'r>) -> Result<OpHandle<'r>, ResolveError> {
    use guild_host::{DType, MemorySpace, OperationRequest, TensorDesc};
    let d = TensorDesc::new(DType::I64, &[4, 2], MemorySpace::Host);
    service.resolve(&OperationRequest::cpu(
        guild_host::OpName::new(OP).unwrap(),
        vec![d],
        vec![d],
    ))
}

/// The version of the scan a new resolution reaches.
fn serving(host: &Host) -> String {
    let service = OperationService::new(host.kernels());
    let handle = scan_handle(&service).expect("the scan resolves");
    handle.describe().package_version.to_string()
}

/// Refreshes until `host` serves `version`, a few milliseconds apart, for at most [`PATIENCE`];
/// answers every refresh's outcome in words.
fn refresh_until_serving(host: &Host, version: &str) -> Vec<String> {
    let start = Instant::now();
    let mut seen = Vec::new();
    loop {
        let outcome = host.refresh();
        seen.push(format!("{outcome:?}"));
        if serving(host) == version {
            return seen;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "the runner still serves {} and not {version} after {} refreshes in {PATIENCE:?}; \
             the last: {:?}",
            serving(host),
            seen.len(),
            seen.last()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Replaces the store's crash-quarantine directory with a plain file, so that listing it fails
/// whoever runs the test; answers the file.
fn break_quarantine_dir(store: &Path) -> PathBuf {
    let path = store.join("quarantine");
    if path.is_dir() {
        std::fs::remove_dir_all(&path).unwrap();
    }
    std::fs::write(&path, b"not a directory").unwrap();
    path
}

/// Item 1: the crash-record directory cannot be listed for a moment, after the package manager
/// has read the new generation. The refresh fails; the next one brings the runner to 1.1.0.
#[test]
fn a_refresh_that_failed_after_reading_the_new_generation_is_caught_up_by_the_next() {
    let shop = Workshop::new();
    let (store, k) = store_with_scan(&shop);
    let host = runner(&store, None);
    assert_eq!(serving(&host), "1.0.0");
    operator_installs(&shop, &store, &k, "1.1.0");

    let broken = break_quarantine_dir(&store);
    let failed = host.refresh();
    assert!(
        failed.is_err(),
        "the quarantine could not be listed, yet the refresh answered {failed:?}"
    );
    assert_eq!(serving(&host), "1.0.0");
    std::fs::remove_file(&broken).unwrap();

    let report = host.refresh().unwrap();
    // It works from the generation it had applied, not from the one the package manager read.
    assert!(report.from_generation < report.generation, "{report:?}");
    let loaded: Vec<String> = report
        .loaded
        .iter()
        .map(|l| format!("{}@{}", l.id, l.version))
        .collect();
    assert_eq!(loaded, ["example.scan@1.1.0"], "{report:?}");
    assert_eq!(serving(&host), "1.1.0");
    assert!(host.refresh().unwrap().is_quiet(), "nothing is left to do");
}

/// Item 2: the new version's library fails to load once (its `init` fails). A later refresh
/// loads it, with no new commit.
#[test]
fn a_switch_whose_load_failed_once_is_retried_by_a_later_refresh() {
    let shop = Workshop::new();
    let (store, k) = store_with_scan(&shop);
    let loader = FlakyLoader::default();
    let host = runner(&store, Some(loader.clone()));
    assert_eq!(serving(&host), "1.0.0");
    operator_installs(&shop, &store, &k, "1.1.0");
    loader.fail_next("1.1.0", 1);

    let first = host.refresh().unwrap();
    assert_eq!(first.failed.len(), 1, "{first:?}");
    assert_eq!(first.failed[0].1.to_string(), "1.1.0");
    assert_eq!(serving(&host), "1.0.0", "the old version keeps serving");
    // The failed switch is owed, with its cause.
    assert_eq!(first.pending.len(), 1, "{first:?}");
    let owed = &first.pending[0];
    assert_eq!(owed.id.as_str(), "example.scan");
    assert_eq!(
        owed.from.as_ref().map(ToString::to_string).as_deref(),
        Some("1.0.0")
    );
    assert_eq!(
        owed.to.as_ref().map(ToString::to_string).as_deref(),
        Some("1.1.0")
    );
    assert_eq!(owed.attempts, 1);
    assert!(
        matches!(&owed.cause, PendingCause::Failed { error } if error.contains("a transient failure")),
        "{owed:?}"
    );
    assert!(!first.is_quiet());

    refresh_until_serving(&host, "1.1.0");
    // One failed attempt and one that loaded: a refresh within the delay tries nothing.
    assert_eq!(loader.attempts("1.1.0"), 2);
    assert!(
        host.refresh().unwrap().is_quiet(),
        "nothing is owed any more"
    );
}

/// Item 2: the new version cannot be pinned once (a directory stands where its pin file goes, so
/// opening the pin fails whoever runs the test). A later refresh loads it, with no new commit.
#[test]
fn a_switch_whose_pin_could_not_be_taken_is_retried_by_a_later_refresh() {
    let shop = Workshop::new();
    let (store, k) = store_with_scan(&shop);
    let host = runner(&store, None);
    operator_installs(&shop, &store, &k, "1.1.0");

    let blocker = store.join("pins").join("example.scan@1.1.0");
    std::fs::create_dir_all(&blocker).unwrap();
    let first = host.refresh().unwrap();
    assert_eq!(first.failed.len(), 1, "{first:?}");
    assert_eq!(first.pending.len(), 1, "{first:?}");
    assert_eq!(serving(&host), "1.0.0");
    std::fs::remove_dir(&blocker).unwrap();

    refresh_until_serving(&host, "1.1.0");
    assert!(
        host.refresh().unwrap().is_quiet(),
        "nothing is owed any more"
    );
}

/// A `Host::watch`er retries a failed switch by itself: no new commit, and a fallback far longer
/// than the test, so only the host's own retry can bring the runner to 1.1.0.
#[test]
fn a_watcher_retries_a_failed_switch_without_a_new_store_event() {
    let shop = Workshop::new();
    let (store, k) = store_with_scan(&shop);
    let loader = FlakyLoader::default();
    loader.fail_next("1.1.0", 2);
    let host = Arc::new(runner(&store, Some(loader.clone())));
    let (tx, reports) = channel();
    let _watcher = host
        .watch(Duration::from_secs(3600), move |outcome| {
            let _ = tx.send(format!("{outcome:?}"));
        })
        .unwrap();
    operator_installs(&shop, &store, &k, "1.1.0");

    let start = Instant::now();
    let mut seen = Vec::new();
    while serving(&host) != "1.1.0" {
        let left = PATIENCE.saturating_sub(start.elapsed());
        match reports.recv_timeout(left) {
            Ok(report) => seen.push(report),
            Err(_) => panic!(
                "the watcher did not bring the runner to 1.1.0 within {PATIENCE:?}; \
                 it reported {seen:#?}"
            ),
        }
    }
    assert_eq!(loader.attempts("1.1.0"), 3, "{seen:#?}");
}

/// A `Host::watch`er whose refresh failed after reading the new generation tries again by
/// itself once the fault is gone, without a new commit.
#[test]
fn a_watcher_catches_up_after_a_failed_refresh_without_a_new_store_event() {
    let shop = Workshop::new();
    let (store, k) = store_with_scan(&shop);
    let host = Arc::new(runner(&store, None));
    let broken = break_quarantine_dir(&store);
    let (tx, reports) = channel();
    let _watcher = host
        .watch(Duration::from_secs(3600), move |outcome| {
            let _ = tx.send((outcome.is_err(), format!("{outcome:?}")));
        })
        .unwrap();
    operator_installs(&shop, &store, &k, "1.1.0");

    let start = Instant::now();
    let mut seen = Vec::new();
    // The watcher's refresh fails while the quarantine cannot be listed.
    loop {
        let left = PATIENCE.saturating_sub(start.elapsed());
        let (failed, report) = reports
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no failed refresh within {PATIENCE:?}: {seen:#?}"));
        seen.push(report);
        if failed {
            break;
        }
    }
    std::fs::remove_file(&broken).unwrap();
    while serving(&host) != "1.1.0" {
        let left = PATIENCE.saturating_sub(start.elapsed());
        match reports.recv_timeout(left) {
            Ok((_, report)) => seen.push(report),
            Err(_) => panic!(
                "the watcher did not catch up with 1.1.0 within {PATIENCE:?}; it reported \
                 {seen:#?}"
            ),
        }
    }
}

/// A library that holds a binding into another package until it is closed, as a module that
/// keeps a handle into its dependency does.
#[derive(Debug)]
struct Holding {
    library: Arc<dyn LoadedLibrary>,
    binding: Mutex<Option<KernelBinding>>,
}

impl LoadedLibrary for Holding {
    fn package(&self) -> &PackageId {
        self.library.package()
    }

    fn version(&self) -> &Version {
        self.library.version()
    }
}

/// The fake loader, with the library at `holder` wrapped in a [`Holding`] the test reaches
/// through `held`.
struct HoldingLoader {
    fake: FakeLoader,
    holder: PathBuf,
    held: Mutex<Weak<Holding>>,
}

struct SharedHolding(Arc<HoldingLoader>);

impl PluginLoader for SharedHolding {
    fn load(&self, request: &LoadRequest) -> Result<LoadedPlugin, LoadError> {
        let mut plugin = self.0.fake.load(request)?;
        if request.library == self.0.holder {
            let holding = Arc::new(Holding {
                library: plugin.library,
                binding: Mutex::new(None),
            });
            *self.0.held.lock().unwrap() = Arc::downgrade(&holding);
            plugin.library = holding;
        }
        Ok(plugin)
    }
}

/// ex.base and ex.dep 1.0.0 (ex.dep needs ex.base) on a runner host whose loader wraps ex.dep
/// 1.0.0's library in a [`Holding`]; 1.1.0 of both (ex.dep 1.1.0 needing ex.base 1.1.0) are in
/// the fake loader, for the operator to install.
struct Cycle {
    shop: Workshop,
    k: guild_adapters_crypto::SigningKey,
    store: PathBuf,
    host: Host,
    loader: Arc<HoldingLoader>,
}

fn cycle() -> Cycle {
    let shop = Workshop::new();
    let k = key();
    let store = shop.fresh("store");
    let (pm, _) = open_dir(&store).unwrap();
    trust(&pm, PUBLISHER, &k);
    for spec in [
        Spec::module("ex.base", "1.0.0"),
        Spec::module("ex.dep", "1.0.0").module_dep(ModDep::on("ex.base", "1.0.0")),
    ] {
        pm.install(&shop.build(&spec, &k).archive, InstallOptions::default())
            .unwrap();
    }
    drop(pm);
    let library = |package: &str, version: &str| {
        let last = package.rsplit('.').next().unwrap();
        store
            .join("packages")
            .join(package)
            .join(version)
            .join(format!("lib/lib{last}.so"))
    };
    let fake = FakeLoader::new();
    let cpu = guild_host::domain::operation::Backend::Cpu;
    for version in ["1.0.0", "1.1.0"] {
        for package in ["ex.base", "ex.dep"] {
            let impl_id = ImplId::new(format!("{package}.op.cpu")).unwrap();
            fake.insert(
                library(package, version),
                FakePlugin::new().with_kernel(fake_kernel(impl_id, 1, cpu)),
            );
        }
    }
    let loader = Arc::new(HoldingLoader {
        fake,
        holder: library("ex.dep", "1.0.0"),
        held: Mutex::new(Weak::new()),
    });
    let host = Host::builder(&store)
        .devices(DeviceSupport::host())
        .loader(Box::new(SharedHolding(Arc::clone(&loader))))
        .open()
        .unwrap()
        .host;
    Cycle {
        shop,
        k,
        store,
        host,
        loader,
    }
}

impl Cycle {
    /// The operator moves ex.base to 1.1.0, then ex.dep to 1.1.0, which needs ex.base 1.1.0.
    fn operator_moves_both(&self) {
        let (pm, _) = open_dir(&self.store).unwrap();
        for spec in [
            Spec::module("ex.base", "1.1.0"),
            Spec::module("ex.dep", "1.1.0").module_dep(ModDep::on("ex.base", "1.1.0")),
        ] {
            pm.install(
                &self.shop.build(&spec, &self.k).archive,
                InstallOptions::default(),
            )
            .unwrap();
        }
    }

    fn loaded(&self) -> (Option<Version>, Option<Version>) {
        (
            self.host.kernels().loaded_version(&id("ex.base")),
            self.host.kernels().loaded_version(&id("ex.dep")),
        )
    }

    /// Refreshes until both run 1.1.0 (or PATIENCE ends, failing).
    fn both_switch(&self) {
        let start = Instant::now();
        let mut seen = Vec::new();
        while self.loaded() != (Some(v("1.1.0")), Some(v("1.1.0"))) {
            seen.push(format!("{:?}", self.host.refresh()));
            assert!(
                start.elapsed() < PATIENCE,
                "both should have switched; loaded {:?}: {:#?}",
                self.loaded(),
                &seen[seen.len().saturating_sub(2)..]
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The dependency cycle: ex.dep 1.0.0's library keeps a binding into ex.base for as long as it
/// is loaded (as a module keeps the handles it resolved at `init`), and the operator moves both,
/// ex.dep's new version needing ex.base's. ex.base cannot switch while ex.dep 1.0.0 holds it and
/// ex.dep 1.1.0 cannot load before ex.base 1.1.0: waiting would never end. The refresh breaks the
/// cycle in a defined order, taking the dependent out first, so that both reach 1.1.0 at once.
#[test]
fn a_dependent_holding_its_dependency_is_taken_out_first_and_both_switch() {
    let c = cycle();
    let binding = c
        .host
        .kernels()
        .find_by_id(&ImplId::new("ex.base.op.cpu").unwrap())
        .unwrap();
    // Only the library keeps the Holding (and so the binding) alive from here on.
    let holding = {
        let strong = c.loader.held.lock().unwrap().upgrade().unwrap();
        *strong.binding.lock().unwrap() = Some(binding);
        Arc::downgrade(&strong)
    };
    c.operator_moves_both();

    let report = c.host.refresh().unwrap();
    assert_eq!(
        c.loaded(),
        (Some(v("1.1.0")), Some(v("1.1.0"))),
        "the cycle is broken within the refresh: {report:#?}"
    );
    assert!(report.pending.is_empty(), "nothing is owed: {report:#?}");
    assert!(holding.upgrade().is_none(), "ex.dep 1.0.0's library closed");
    let dep_out = report
        .taken_out
        .iter()
        .find(|q| q.id == id("ex.dep") && q.version == v("1.0.0"))
        .unwrap_or_else(|| panic!("ex.dep 1.0.0 is reported taken out: {report:#?}"));
    assert!(
        dep_out.reason.contains("ex.base"),
        "the reason names the dependency it held: {dep_out:?}"
    );
    assert_eq!(
        c.host
            .kernels()
            .live_bindings_of(&id("ex.base"), &v("1.0.0")),
        0
    );
}

/// The runner, not the dependent, holds a binding into ex.base while the operator moves both:
/// ex.dep must keep serving 1.0.0 meanwhile (taking it out would release nothing), and both
/// switch once the runner lets go.
#[test]
fn a_runner_holding_the_dependency_leaves_the_dependent_serving() {
    let c = cycle();
    let runner = c
        .host
        .kernels()
        .find_by_id(&ImplId::new("ex.base.op.cpu").unwrap())
        .unwrap();
    c.operator_moves_both();
    let report = c.host.refresh().unwrap();
    assert_eq!(
        c.loaded(),
        (Some(v("1.0.0")), Some(v("1.0.0"))),
        "{report:#?}"
    );
    assert!(
        c.host
            .kernels()
            .find_by_id(&ImplId::new("ex.dep.op.cpu").unwrap())
            .is_some(),
        "ex.dep is still served: {report:#?}"
    );
    // Taking ex.dep out would release nothing the runner holds: after the one attempt that
    // shows it, ex.dep keeps serving 1.0.0 and later refreshes do not load it again and again.
    for _ in 0..3 {
        c.host.refresh().unwrap();
    }
    let dep_1_0 = c.store.join("packages/ex.dep/1.0.0/lib/libdep.so");
    let opened = c
        .loader
        .fake
        .opened()
        .iter()
        .filter(|p| **p == dep_1_0)
        .count();
    assert!(
        opened <= 2,
        "ex.dep 1.0.0 was loaded {opened} times: a failed attempt at the cycle is not repeated \
         while nothing changed"
    );
    assert_eq!(c.loaded(), (Some(v("1.0.0")), Some(v("1.0.0"))));
    drop(runner);
    c.both_switch();
}

/// The operator revokes ex.base 1.0.0 while the crash-record directory cannot be listed: the
/// refresh fails for the loading it cannot do, but the revocation needs only the trust check,
/// so no new lookup reaches the revoked version afterwards.
#[test]
fn a_revocation_reaches_the_runner_even_when_its_refresh_cannot_load() {
    let c = cycle();
    let (pm, _) = open_dir(&c.store).unwrap();
    let revoked = pm
        .metadata(&id("ex.base"), &v("1.0.0"))
        .unwrap()
        .payload_digest();
    pm.update_trust(|t| {
        t.revoke_digest(revoked, "test");
        Ok(())
    })
    .unwrap();
    drop(pm);
    break_quarantine_dir(&c.store);
    let outcome = c.host.refresh();
    assert!(
        outcome.is_err(),
        "the crash records cannot be read: {outcome:?}"
    );
    assert!(
        c.host
            .kernels()
            .find_by_id(&ImplId::new("ex.base.op.cpu").unwrap())
            .is_none(),
        "a new lookup still reaches revoked ex.base 1.0.0"
    );
}

/// A load that fails in a call the runner makes itself (`load_enabled`), while a `Host::watch`er
/// sleeps toward its fallback (an hour) with nothing owed: the watcher is woken for the retry
/// the failure recorded and loads the scan, without any store event.
#[test]
fn a_watcher_is_woken_for_a_retry_another_thread_recorded() {
    let shop = Workshop::new();
    let (store, _) = store_with_scan(&shop);
    let loader = FlakyLoader::default();
    let host = Host::builder(&store)
        .devices(DeviceSupport::host())
        .loader(Box::new(loader.clone()))
        .load_enabled(false)
        .open()
        .unwrap()
        .host;
    let host = Arc::new(host);
    let (tx, reports) = channel();
    let _watcher = host
        .watch(Duration::from_secs(3600), move |outcome| {
            let _ = tx.send(format!("{outcome:?}"));
        })
        .unwrap();
    // The watcher is asleep by now (nothing is owed); this thread's load fails once.
    std::thread::sleep(Duration::from_millis(100));
    loader.fail_next("1.0.0", 1);
    let report = host.load_enabled().unwrap();
    assert!(
        !report.failed.is_empty(),
        "the load fails once: {report:#?}"
    );

    let start = Instant::now();
    let mut seen = Vec::new();
    while scan_handle(&OperationService::new(host.kernels())).is_err() {
        let left = PATIENCE.saturating_sub(start.elapsed());
        match reports.recv_timeout(left) {
            Ok(report) => seen.push(report),
            Err(_) => panic!(
                "the watcher was not woken for the retry within {PATIENCE:?}; it reported \
                 {seen:#?}"
            ),
        }
    }
    assert_eq!(loader.attempts("1.0.0"), 2, "{seen:#?}");
}

/// ex.dep 1.0.0's library keeps a binding into ex.base 1.0.0, whose payload the operator
/// revokes (installing ex.base 1.1.0 beside it). The refresh that reports the revocation must
/// leave no code path into the revoked version: ex.dep's library, which holds the binding, is
/// taken out (and loaded again, now over ex.base 1.1.0), so the binding is gone.
#[test]
fn a_revocation_takes_out_a_dependent_whose_library_holds_the_revoked_code() {
    let c = cycle();
    let binding = c
        .host
        .kernels()
        .find_by_id(&ImplId::new("ex.base.op.cpu").unwrap())
        .unwrap();
    // Only the library keeps the Holding (and so the binding) alive from here on.
    let holding = {
        let strong = c.loader.held.lock().unwrap().upgrade().unwrap();
        *strong.binding.lock().unwrap() = Some(binding);
        Arc::downgrade(&strong)
    };
    let (pm, _) = open_dir(&c.store).unwrap();
    pm.install(
        &c.shop
            .build(&Spec::module("ex.base", "1.1.0"), &c.k)
            .archive,
        InstallOptions::default(),
    )
    .unwrap();
    let revoked = pm
        .metadata(&id("ex.base"), &v("1.0.0"))
        .unwrap()
        .payload_digest();
    pm.update_trust(|t| {
        t.revoke_digest(revoked, "test");
        Ok(())
    })
    .unwrap();
    drop(pm);

    let report = c.host.refresh().unwrap();
    assert_eq!(
        c.host
            .kernels()
            .live_bindings_of(&id("ex.base"), &v("1.0.0")),
        0,
        "something still runs revoked ex.base 1.0.0 after the refresh that reported it: \
         {report:#?}"
    );
    assert!(holding.upgrade().is_none(), "ex.dep 1.0.0's library closed");
    assert_eq!(
        c.loaded(),
        (Some(v("1.1.0")), Some(v("1.0.0"))),
        "{report:#?}"
    );
}

/// The runner holds ex.base, so taking ex.dep out frees nothing, and loading ex.dep 1.0.0 again
/// fails (its library is gone from the loader): the refresh says so (taken out, the load
/// failed), ex.dep's change to 1.1.0 stays owed, and once the runner lets go both reach 1.1.0.
#[test]
fn a_dependent_that_cannot_be_loaded_again_is_reported_and_still_switches_later() {
    let c = cycle();
    let runner = c
        .host
        .kernels()
        .find_by_id(&ImplId::new("ex.base.op.cpu").unwrap())
        .unwrap();
    let dep_1_0 = c.store.join("packages/ex.dep/1.0.0/lib/libdep.so");
    assert!(c.loader.fake.remove(&dep_1_0).is_some());
    c.operator_moves_both();

    let report = c.host.refresh().unwrap();
    let out = report
        .taken_out
        .iter()
        .find(|q| q.id == id("ex.dep"))
        .unwrap_or_else(|| panic!("ex.dep is reported out: {report:#?}"));
    assert!(out.reason.contains("failed"), "{out:?}");
    assert!(
        report
            .pending
            .iter()
            .any(|p| p.id == id("ex.dep") && p.to == Some(v("1.1.0"))),
        "ex.dep's switch to 1.1.0 stays owed: {report:#?}"
    );
    assert_eq!(c.loaded(), (Some(v("1.0.0")), None));
    drop(runner);
    c.both_switch();
}
