//! Runtime module dependencies of a real module. test-plugins/scan_dependent declares a
//! `guild.module.v1` edge on the scan module (`example.scan`, test-plugins/scan_module). Every way
//! that edge can fail (the dependency missing, disabled, outside the edge's version range, from
//! another publisher than pinned, with another payload than the pinned digest) stops the
//! dependent before its library is opened: at install, at enable, and when a store in that state
//! is opened and loaded.
//!
//! The host's loader here records every load request before handing it to the dlopen loader, so
//! a test sees both that the dependent's library was never asked for and, through the dlopen
//! loader's count, what is open. refusals.rs checks the same graph problems through the package
//! manager alone with placeholder libraries; here the host and dlopen take part.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use guild_adapters_crypto::SigningKey;
use guild_adapters_fs::store::StoreLayout;
use guild_adapters_posix::DlopenLoader;
use guild_domain::graph::{GraphProblem, NodeRef, Requirement};
use guild_domain::ids::{ImplId, PackageId};
use guild_domain::operation::DType;
use guild_host::package_manager::LeftOut;
use guild_host::{
    Host, HostError, InstallOptions, Installed, LoadReport, OpenReport, OperationRequest,
    OperationService,
};
use guild_ports::loader::{LoadError, LoadRequest, LoadedPlugin, PluginLoader};
use guild_test_support::plugins::{plugin_library, scan_spec};
use guild_test_support::{
    id, key, open_dir, publisher, retry_locked, trust, v, Built, ModDep, Spec, Workshop, PUBLISHER,
};

use crate::c_face::{tensor, Query, Service};
use crate::operations::{desc, op};
use guild_abi::GUILD_DTYPE_F32;

use guild_test_support::plugins::SCAN_PACKAGE as BASE;
const DEPENDENT: &str = "example.dependent";
const DEPENDENT_IMPL: &str = "example.dependent.total.cpu";
use guild_test_support::plugins::TOTAL_OP as DEPENDENT_OP;

/// The dependent module with one module dependency.
fn dependent_spec(dep: ModDep) -> Spec {
    let mut spec = Spec::module(DEPENDENT, "1.0.0").library(&plugin_library("scan_dependent"));
    spec.provided_ops = vec![DEPENDENT_IMPL.into()];
    spec.module_dep(dep)
}

/// The dlopen loader behind a log of every package the host asked it to load.
#[derive(Clone, Default)]
struct Watched {
    dlopen: DlopenLoader,
    asked: Arc<Mutex<Vec<PackageId>>>,
    /// The address of the operation service table each load was offered, as its plugin sees it.
    tables: Arc<Mutex<Vec<(PackageId, usize)>>>,
}

impl Watched {
    /// The packages asked for so far, in order.
    fn asked(&self) -> Vec<String> {
        let asked = self.asked.lock().unwrap();
        asked.iter().map(|p| p.as_str().to_owned()).collect()
    }

    /// The operation service table the last load of `package` was offered.
    fn table_of(&self, package: &str) -> guild_abi::guild_operation_service_v1_t {
        let tables = self.tables.lock().unwrap();
        let (_, address) = tables
            .iter()
            .rev()
            .find(|(p, _)| p.as_str() == package)
            .unwrap_or_else(|| panic!("{package} was offered no operation service"));
        // SAFETY: the loader keeps the table alive while the package's library is loaded,
        // which the caller's host does for as long as it uses the copy.
        unsafe { *(*address as *const guild_abi::guild_operation_service_v1_t) }
    }

    /// Libraries open now.
    fn open(&self) -> usize {
        self.dlopen.open_libraries()
    }
}

impl PluginLoader for Watched {
    fn load(&self, request: &LoadRequest) -> Result<LoadedPlugin, LoadError> {
        self.asked.lock().unwrap().push(request.package.clone());
        if let Some(table) = &request.operations {
            let entry = (request.package.clone(), table.address);
            self.tables.lock().unwrap().push(entry);
        }
        self.dlopen.load(request)
    }
}

/// A host over a fresh, trusting store, loading through a [`Watched`] loader.
struct Bench {
    shop: Workshop,
    key: SigningKey,
    store: PathBuf,
    host: Host,
    loader: Watched,
}

impl Bench {
    fn new() -> Self {
        let shop = Workshop::new();
        let key = key();
        let store = shop.fresh("store");
        let (pm, _) = open_dir(&store).unwrap();
        trust(&pm, PUBLISHER, &key);
        let loader = Watched::default();
        let host = Host::new(pm, Box::new(loader.clone()));
        Bench {
            shop,
            key,
            store,
            host,
            loader,
        }
    }

    fn base(&self, version: &str) -> Built {
        self.shop.build(&scan_spec(version), &self.key)
    }

    fn dependent(&self, dep: ModDep) -> Built {
        self.shop.build(&dependent_spec(dep), &self.key)
    }

    fn install(&self, built: &Built, enable: bool) -> Installed {
        self.host
            .install(
                &built.archive,
                InstallOptions {
                    enable,
                    ..InstallOptions::default()
                },
            )
            .unwrap()
    }

    /// Closes the host and opens its store again, the way a restarted process does, with a new
    /// watched loader; nothing is loaded yet.
    fn reopen(self) -> (Bench, OpenReport) {
        self.reopen_after(|_| {})
    }

    /// [`Bench::reopen`], running `meanwhile` on the store while no host has it open.
    fn reopen_after(self, meanwhile: impl FnOnce(&Path)) -> (Bench, OpenReport) {
        let Bench {
            shop,
            key,
            store,
            host,
            ..
        } = self;
        drop(host);
        meanwhile(&store);
        let (pm, report) = open_dir(&store).unwrap();
        let loader = Watched::default();
        let host = Host::new(pm, Box::new(loader.clone()));
        let bench = Bench {
            shop,
            key,
            store,
            host,
            loader,
        };
        (bench, report)
    }

    /// Closes the host; answers the store and the workshop that holds it.
    fn close(self) -> (PathBuf, Workshop) {
        drop(self.host);
        (self.store, self.shop)
    }

    /// Whether the dependent's kernel is registered.
    fn dependent_registered(&self) -> bool {
        self.host
            .kernels()
            .find_by_id(&ImplId::new(DEPENDENT_IMPL).unwrap())
            .is_some()
    }

    /// Whether the store records any version of the dependent.
    fn dependent_recorded(&self) -> bool {
        self.host
            .packages()
            .list()
            .unwrap()
            .iter()
            .any(|p| p.id.as_str() == DEPENDENT)
    }
}

fn node(built: &Built) -> NodeRef {
    NodeRef {
        id: built.id(),
        version: built.version(),
    }
}

/// The dependent's one module dependency, as the graph reports it.
fn requirement(dependent: &Built) -> Requirement {
    Requirement::Module(dependent.metadata.manifest().module_dependencies[0].clone())
}

/// Checks that `err` is the dependency refusal of `action` with exactly `problem`, and that its
/// text names the dependent, the dependency and the reason.
#[track_caller]
fn assert_refused(err: HostError, action: &str, problem: &GraphProblem, reason: &str) {
    let text = err.to_string();
    match err {
        HostError::Dependencies {
            action: a,
            problems,
        } => {
            assert_eq!(a, action);
            assert_eq!(problems, vec![problem.clone()]);
        }
        other => panic!("{action}: expected a dependency refusal, got {other}"),
    }
    for part in ["example.dependent@1.0.0", "module example.scan", reason] {
        assert!(text.contains(part), "{action}: {text:?} lacks {part:?}");
    }
}

/// The five ways the edge fails, and which state of the base module each needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Missing,
    Disabled,
    OutOfRange,
    OtherPublisher,
    OtherDigest,
}

const FAULTS: [Fault; 5] = [
    Fault::Missing,
    Fault::Disabled,
    Fault::OutOfRange,
    Fault::OtherPublisher,
    Fault::OtherDigest,
];

/// For `fault` (`other` is a build of the base at 1.1.0 that is never installed): the edge the
/// dependent declares, and words its refusal must contain.
fn edge_for(fault: Fault, other: &Built) -> (ModDep, &'static str) {
    let on = ModDep::on(BASE, "1.0.0");
    match fault {
        Fault::Missing => (on, "is not installed"),
        Fault::Disabled => (on, "no version of example.scan is enabled"),
        Fault::OutOfRange => (
            ModDep::on(BASE, "1.1.0").max("1.9.0"),
            "but the enabled version is example.scan@1.0.0",
        ),
        Fault::OtherPublisher => (on.publisher("org.other"), "from publisher org.other"),
        Fault::OtherDigest => (on.sha256(other.digest()), "with payload sha256"),
    }
}

/// The graph problem the edge of `fault` meets, with the base installed as `base`.
fn problem_for(fault: Fault, dependent: &Built, base: &Built, other: &Built) -> GraphProblem {
    let (dependent_node, requirement) = (node(dependent), requirement(dependent));
    match fault {
        Fault::Missing => GraphProblem::Missing {
            dependent: dependent_node,
            target: id(BASE),
            requirement,
        },
        Fault::Disabled => GraphProblem::Disabled {
            dependent: dependent_node,
            target: id(BASE),
            requirement,
            installed: vec![v("1.0.0")],
        },
        Fault::OutOfRange => GraphProblem::VersionOutOfRange {
            dependent: dependent_node,
            target: node(base),
            requirement,
        },
        Fault::OtherPublisher => GraphProblem::PublisherMismatch {
            dependent: dependent_node,
            target: node(base),
            requirement,
            expected: publisher("org.other"),
            found: publisher(PUBLISHER),
        },
        Fault::OtherDigest => GraphProblem::DigestMismatch {
            dependent: dependent_node,
            target: node(base),
            requirement,
            expected: other.digest(),
            found: base.digest(),
        },
    }
}

/// Puts the base module in the state `fault` needs: absent, installed disabled, or enabled.
fn place_base(bench: &Bench, fault: Fault, base: &Built) {
    match fault {
        Fault::Missing => {}
        Fault::Disabled => {
            bench.install(base, false);
        }
        _ => {
            bench.install(base, true);
        }
    }
}

#[test]
fn an_unusable_dependency_refuses_installing_the_dependent_before_dlopen() {
    let mut cases = 0;
    for fault in FAULTS {
        let b = Bench::new();
        let base = b.base("1.0.0");
        let other = b.base("1.1.0");
        place_base(&b, fault, &base);
        let base_open = usize::from(fault != Fault::Missing && fault != Fault::Disabled);
        assert_eq!(b.loader.open(), base_open, "{fault:?}");
        let asked_before = b.loader.asked();

        let (edge, reason) = edge_for(fault, &other);
        let dependent = b.dependent(edge);
        let err = b
            .host
            .install(&dependent.archive, InstallOptions::default())
            .unwrap_err();
        let problem = problem_for(fault, &dependent, &base, &other);
        assert_refused(err, "installing example.dependent@1.0.0", &problem, reason);

        // The dependent's library was never asked for, nothing more is open, nothing recorded.
        assert_eq!(b.loader.asked(), asked_before, "{fault:?}");
        assert_eq!(b.loader.open(), base_open, "{fault:?}");
        assert!(!b.dependent_recorded(), "{fault:?}");
        assert!(!b.dependent_registered(), "{fault:?}");
        cases += 1;
    }

    // Out of range from above: the enabled base is newer than the edge's maximum.
    let b = Bench::new();
    let base = b.base("1.1.0");
    b.install(&base, true);
    let dependent = b.dependent(ModDep::on(BASE, "1.0.0").max("1.0.9"));
    let err = b
        .host
        .install(&dependent.archive, InstallOptions::default())
        .unwrap_err();
    let problem = GraphProblem::VersionOutOfRange {
        dependent: node(&dependent),
        target: node(&base),
        requirement: requirement(&dependent),
    };
    assert_refused(
        err,
        "installing example.dependent@1.0.0",
        &problem,
        "requires module example.scan 1.0.0..=1.0.9, but the enabled version is example.scan@1.1.0",
    );
    assert_eq!(b.loader.asked(), [BASE]);
    assert_eq!(b.loader.open(), 1);
    cases += 1;
    println!("module dependencies refused at install: {cases} cases");
}

/// Writes the store's registry with `id` enabled, as a store edited outside the host (by hand,
/// by another tool, or copied from elsewhere) could hold it. The host itself never commits a
/// registry with an enabled package whose runtime edge fails; this is how a test gets one.
fn enable_behind_the_hosts_back(store: &Path, id: &PackageId) {
    let layout = StoreLayout::new(store);
    let state = guild_adapters_fs::store::read_registry(store)
        .unwrap()
        .unwrap();
    let mut next = state.successor();
    next.enable(id).unwrap();
    // The whole registry in format 1, as a tool that knows no log would write it.
    let edited = layout.root.join("registry.json.edited");
    fs::write(&edited, next.to_json()).unwrap();
    fs::rename(&edited, &layout.registry).unwrap();
    fs::remove_file(&layout.log).unwrap();
}

#[test]
fn an_unusable_dependency_refuses_enabling_the_dependent_and_blocks_it_at_open() {
    let mut cases = 0;
    for fault in FAULTS {
        let b = Bench::new();
        let base = b.base("1.0.0");
        let other = b.base("1.1.0");
        place_base(&b, fault, &base);
        let (edge, reason) = edge_for(fault, &other);
        let dependent = b.dependent(edge);
        let problem = problem_for(fault, &dependent, &base, &other);

        // Installed disabled, the dependent's edges are not judged and nothing is loaded.
        let installed = b.install(&dependent, false);
        assert!(installed.changed && !installed.enabled, "{fault:?}");
        let asked_before = b.loader.asked();
        assert!(!asked_before.contains(&DEPENDENT.to_owned()), "{fault:?}");

        // Enabling it is refused before its library is opened.
        let err = b.host.enable(&id(DEPENDENT)).unwrap_err();
        assert_refused(err, "enabling example.dependent@1.0.0", &problem, reason);
        assert_eq!(b.loader.asked(), asked_before, "{fault:?}");
        assert!(!b.dependent_registered(), "{fault:?}");
        cases += 1;

        // A store that has it enabled anyway: opening disables it (its edge fails), naming the
        // problem, and loading never opens it.
        let (b, report) =
            b.reopen_after(|store| enable_behind_the_hosts_back(store, &id(DEPENDENT)));
        let left_out = LeftOut {
            id: id(DEPENDENT),
            version: v("1.0.0"),
            reason: format!("example.dependent@1.0.0 cannot load: {problem}"),
        };
        assert_eq!(report.disabled, vec![left_out], "{fault:?}: {report:?}");
        let loaded = b.host.load_enabled().unwrap();
        assert!(loaded.skipped.is_empty(), "{fault:?}: {:?}", loaded.skipped);
        assert!(loaded.failed.is_empty(), "{fault:?}: {:?}", loaded.failed);
        let base_loads = fault != Fault::Missing && fault != Fault::Disabled;
        let names = |r: &LoadReport| -> Vec<String> {
            r.loaded.iter().map(|l| l.id.as_str().to_owned()).collect()
        };
        let want: Vec<String> = if base_loads {
            vec![BASE.to_owned()]
        } else {
            Vec::new()
        };
        assert_eq!(names(&loaded), want, "{fault:?}");
        assert_eq!(b.loader.asked(), want, "{fault:?}");
        assert_eq!(b.loader.open(), want.len(), "{fault:?}");
        assert!(!b.dependent_registered(), "{fault:?}");

        // The production path, Host::open_dir, finds it disabled and leaves it so.
        let (store, _shop) = b.close();
        let (host, report, loaded) = retry_locked(|| Host::open_dir(&store)).unwrap();
        assert!(report.disabled.is_empty(), "{fault:?}: {report:?}");
        assert!(loaded.skipped.is_empty(), "{fault:?}");
        assert_eq!(names(&loaded), want, "{fault:?}");
        assert!(host
            .kernels()
            .find_by_id(&ImplId::new(DEPENDENT_IMPL).unwrap())
            .is_none());
        cases += 1;
    }
    println!("module dependencies refused at enable and disabled at open: {cases} cases");
}

/// A bench whose base module is signed with a key of its own (`base_key`, trusted for the same
/// publisher), so that revoking that key distrusts the base and nothing else.
fn bench_with_base_key() -> (Bench, SigningKey, Built) {
    let b = Bench::new();
    let base_key = key();
    let spki = base_key.public_key().spki_der().to_vec();
    b.host
        .update_trust(|t| t.add_key(publisher(PUBLISHER), spki).map_err(Into::into))
        .unwrap();
    let base = b.shop.build(&scan_spec("1.0.0"), &base_key);
    (b, base_key, base)
}

fn revoke(host: &Host, k: &SigningKey) {
    host.update_trust(|t| {
        assert!(t.revoke_key(k.key_id(), "test"));
        Ok(())
    })
    .unwrap();
}

#[test]
fn a_dependency_distrusted_since_it_was_installed_takes_its_dependent_down_before_dlopen() {
    // Revoked between two runs: opening taints the base and, because its edge now meets a
    // disabled module, the dependent; loading then opens nothing.
    let (b, base_key, base) = bench_with_base_key();
    b.install(&base, true);
    let dependent = b.dependent(ModDep::on(BASE, "1.0.0"));
    b.install(&dependent, true);
    assert_eq!(b.loader.asked(), [BASE, DEPENDENT]);
    assert_eq!(b.loader.open(), 2);
    revoke(&b.host, &base_key);
    let (b, report) = b.reopen();
    assert_eq!(report.disabled.len(), 2, "{:?}", report.disabled);
    let (first, second) = (&report.disabled[0], &report.disabled[1]);
    assert_eq!((first.id.as_str(), &first.version), (BASE, &v("1.0.0")));
    assert!(
        first.reason.starts_with("no longer authenticated: "),
        "{}",
        first.reason
    );
    let disabled = GraphProblem::Disabled {
        dependent: node(&dependent),
        target: id(BASE),
        requirement: requirement(&dependent),
        installed: vec![v("1.0.0")],
    };
    assert_eq!(
        second,
        &LeftOut {
            id: id(DEPENDENT),
            version: v("1.0.0"),
            reason: format!("example.dependent@1.0.0 cannot load: {disabled}"),
        }
    );
    let loaded = b.host.load_enabled().unwrap();
    assert!(
        loaded.loaded.is_empty() && loaded.failed.is_empty() && loaded.skipped.is_empty(),
        "{loaded:?}"
    );
    assert!(b.loader.asked().is_empty());
    assert_eq!(b.loader.open(), 0);

    // Revoked after the store was opened but before loading: the base fails its trust check
    // and the dependent is skipped for it; neither library is asked for.
    let (b, base_key, base) = bench_with_base_key();
    b.install(&base, true);
    b.install(&b.dependent(ModDep::on(BASE, "1.0.0")), true);
    let (b, report) = b.reopen();
    assert!(report.disabled.is_empty(), "{report:?}");
    revoke(&b.host, &base_key);
    let loaded = b.host.load_enabled().unwrap();
    assert!(loaded.loaded.is_empty(), "{loaded:?}");
    assert_eq!(loaded.failed.len(), 1, "{loaded:?}");
    let (failed, version, err) = &loaded.failed[0];
    assert_eq!((failed.as_str(), version), (BASE, &v("1.0.0")));
    assert!(
        matches!(err, HostError::Unauthenticated { package, .. } if package == "example.scan@1.0.0"),
        "{err}"
    );
    assert_eq!(
        loaded.skipped,
        vec![LeftOut {
            id: id(DEPENDENT),
            version: v("1.0.0"),
            reason: "its dependency example.scan could not be loaded".into(),
        }]
    );
    assert!(b.loader.asked().is_empty());
    assert_eq!(b.loader.open(), 0);
    assert!(!b.dependent_registered());
}

#[test]
fn a_satisfied_edge_loads_the_dependent_after_its_dependency() {
    let b = Bench::new();
    let base = b.base("1.0.0");
    b.install(&base, true);
    // Every check of the edge is in play and passes: range, publisher and digest.
    let dependent = b.dependent(
        ModDep::on(BASE, "1.0.0")
            .max("1.9.0")
            .publisher(PUBLISHER)
            .sha256(base.digest()),
    );
    let installed = b.install(&dependent, true);
    assert!(installed.changed && installed.enabled);
    assert_eq!(b.loader.asked(), [BASE, DEPENDENT]);
    assert_eq!(b.loader.open(), 2);
    assert!(b.dependent_registered());
    assert_resolves(&b.host);

    // Opened again, the dependency loads first.
    let (b, report) = b.reopen();
    assert!(report.disabled.is_empty(), "{report:?}");
    let loaded = b.host.load_enabled().unwrap();
    assert!(
        loaded.failed.is_empty() && loaded.skipped.is_empty(),
        "{loaded:?}"
    );
    let order: Vec<(&str, String, usize)> = loaded
        .loaded
        .iter()
        .map(|l| (l.id.as_str(), l.version.to_string(), l.kernels))
        .collect();
    assert_eq!(
        order,
        [(BASE, "1.0.0".into(), 2), (DEPENDENT, "1.0.0".into(), 1)]
    );
    assert_eq!(b.loader.asked(), [BASE, DEPENDENT]);
    assert_eq!(b.loader.open(), 2);
    assert_resolves(&b.host);
}

/// The dependent's operation resolves to its own kernel, which asks for one packed copy of the
/// input as scratch.
#[track_caller]
fn assert_resolves(host: &Host) {
    let service = OperationService::new(host.kernels());
    let handle = service
        .resolve(&OperationRequest::cpu(
            op(DEPENDENT_OP),
            vec![desc(DType::F32, &[4, 2], &[])],
            vec![desc(DType::F32, &[1, 2], &[])],
        ))
        .unwrap();
    let d = handle.describe();
    assert_eq!(d.impl_id.as_str(), DEPENDENT_IMPL);
    assert_eq!(d.package.as_str(), DEPENDENT);
    assert_eq!(d.scratch.host_bytes, 32);
}

/// `Host::load_enabled` never opens a package whose dependency failed to load; install and
/// enable must not either. The store's graph is satisfied here (the dependency is enabled there),
/// but its library is not loaded (its key was revoked after the store was opened), so both are
/// refused with `DependencyNotLoaded` before the dependent's library is opened.
#[test]
fn a_dependent_is_not_opened_while_its_dependency_failed_to_load() {
    let (b, base_key, base) = bench_with_base_key();
    b.install(&base, true);
    let (b, _) = b.reopen();
    revoke(&b.host, &base_key);
    let loaded = b.host.load_enabled().unwrap();
    assert_eq!(loaded.failed.len(), 1, "{loaded:?}");
    assert_eq!(b.host.kernels().loaded_version(&id(BASE)), None);

    // Installing the dependent now: whatever the answer, its library must not be opened.
    let dependent = b.dependent(ModDep::on(BASE, "1.0.0"));
    let installed = b
        .host
        .install(&dependent.archive, InstallOptions::default());
    let install_opened = b.loader.asked().contains(&DEPENDENT.to_owned());
    let registered_by_install = b.dependent_registered();

    // The same through enable, from a dependent installed disabled.
    let (b2, base_key2, base2) = bench_with_base_key();
    b2.install(&base2, true);
    b2.install(&b2.dependent(ModDep::on(BASE, "1.0.0")), false);
    let (b2, _) = b2.reopen();
    revoke(&b2.host, &base_key2);
    assert_eq!(b2.host.load_enabled().unwrap().failed.len(), 1);
    let enabled = b2.host.enable(&id(DEPENDENT));
    let enable_opened = b2.loader.asked().contains(&DEPENDENT.to_owned());

    for (what, outcome) in [
        ("install", installed.as_ref().map(|_| ())),
        ("enable", enabled.as_ref().map(|_| ())),
    ] {
        match outcome {
            Err(HostError::DependencyNotLoaded {
                package,
                dependency,
                loaded: None,
                ..
            }) => {
                assert_eq!(*package, format!("{DEPENDENT}@1.0.0"), "{what}");
                assert_eq!(*dependency, id(BASE), "{what}");
            }
            other => panic!("{what}: expected DependencyNotLoaded, got {other:?}"),
        }
    }
    assert!(
        !install_opened && !registered_by_install && !enable_opened,
        "the dependent was opened although example.scan is not loaded: install answered \
         {installed:?} (opened {install_opened}, kernels published {registered_by_install}); \
         enable answered {enabled:?} (opened {enable_opened})"
    );
}

/// A module may keep a handle between calls (the plugin guide allows it until its `shutdown`);
/// the host tells those apart from the handles the embedding process resolved through the
/// runner's table, which are the ones that keep a C engine from closing (libguild_host's close).
#[test]
fn handles_a_module_keeps_are_counted_apart_from_the_runners_own() {
    let b = Bench::new();
    let base = b.base("1.0.0");
    b.install(&base, true);
    b.install(&b.dependent(ModDep::on(BASE, "1.0.0")), true);
    let kernels = b.host.kernels();
    let scan = || {
        Query::cpu(
            "example.sequence.inclusive_scan",
            vec![tensor(GUILD_DTYPE_F32, &[4], &[])],
            vec![tensor(GUILD_DTYPE_F32, &[4], &[])],
        )
    };

    // Resolved through the table the dependent module was given, as its code would.
    let module = Service::with_table(kernels, b.loader.table_of(DEPENDENT));
    let kept = module.resolve(&scan()).unwrap();
    assert_eq!(kernels.live_c_handles(), 1);
    assert_eq!(kernels.live_runner_c_handles(), 0);

    // Resolved through the runner's table: counted as the process's own.
    let runner = Service::of(kernels);
    let own = runner.resolve(&scan()).unwrap();
    assert_eq!(kernels.live_c_handles(), 2);
    assert_eq!(kernels.live_runner_c_handles(), 1);

    drop(own);
    assert_eq!(kernels.live_runner_c_handles(), 0);
    drop(kept);
    assert_eq!(kernels.live_c_handles(), 0);
    assert_eq!(kernels.live_runner_c_handles(), 0);
}
