//! The kernel registry: lock-free lookups, priority order, duplicate refusal, bindings that keep a
//! library loaded, and a bounded stress test of lookups against concurrent publication.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use guild_domain::ids::{ImplId, OpName, PackageId};
use guild_domain::operation::Backend;
use guild_domain::version::Version;
use guild_host::registry::{OwnedRegistry, RegistryChangeError, Selector};
use guild_ports::loader::{LoadedLibrary, LoadedPlugin, RegisteredKernel};
use guild_ports::provider::KernelProvider;

const GUILD_OP_CUSTOM: u32 = 0x10000;

/// A stand-in library that records when it is closed.
#[derive(Debug)]
struct TestLibrary {
    id: PackageId,
    version: Version,
    closed: Arc<AtomicBool>,
    open: Arc<AtomicU64>,
}

impl LoadedLibrary for TestLibrary {
    fn package(&self) -> &PackageId {
        &self.id
    }
    fn version(&self) -> &Version {
        &self.version
    }
}

impl Drop for TestLibrary {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::SeqCst);
        self.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A provider that offers nothing but its library's closed flag, which the stress test reads
/// through each binding.
#[derive(Debug)]
struct ClosedFlag(Arc<AtomicBool>);

impl KernelProvider for ClosedFlag {}

/// The closed flag of the library behind `kernel`.
fn closed_flag(kernel: &RegisteredKernel) -> &AtomicBool {
    let provider: &dyn std::any::Any = kernel.provider.as_ref();
    &provider
        .downcast_ref::<ClosedFlag>()
        .expect("a test plugin's kernel")
        .0
}

pub(crate) struct Plugin {
    plugin: LoadedPlugin,
    closed: Arc<AtomicBool>,
}

pub(crate) fn plugin(
    id: &str,
    version: &str,
    kernels: &[(&str, i32)],
    open: &Arc<AtomicU64>,
) -> Plugin {
    let closed = Arc::new(AtomicBool::new(false));
    open.fetch_add(1, Ordering::SeqCst);
    let library = Arc::new(TestLibrary {
        id: PackageId::new(id).unwrap(),
        version: Version::parse(version).unwrap(),
        closed: closed.clone(),
        open: open.clone(),
    });
    let kernels = kernels
        .iter()
        .map(|(impl_id, priority)| RegisteredKernel {
            impl_id: ImplId::new(*impl_id).unwrap(),
            op_kind: GUILD_OP_CUSTOM,
            op_name: Some(OpName::new("example.sequence.inclusive_scan").unwrap()),
            backend: Backend::Cpu,
            priority: *priority,
            required_cpu_isa: guild_domain::operation::CpuIsa::EMPTY,
            operation: None,
            // The library itself is what a binding must keep alive; carry a handle to it so the
            // stress test can check it through the binding.
            provider: Arc::new(ClosedFlag(closed.clone())),
        })
        .collect();
    Plugin {
        plugin: LoadedPlugin {
            library,
            kernels,
            runners: vec![],
        },
        closed,
    }
}

pub(crate) fn publish(reg: &OwnedRegistry, p: Plugin) -> Arc<AtomicBool> {
    let id = p.plugin.library.package().clone();
    let version = p.plugin.library.version().clone();
    reg.commit(reg.prepare(&id, &version, p.plugin, true).unwrap());
    p.closed
}

pub(crate) fn scan() -> Selector {
    Selector {
        op_kind: GUILD_OP_CUSTOM,
        op_name: Some(OpName::new("example.sequence.inclusive_scan").unwrap()),
        backend: None,
    }
}

fn pkg(s: &str) -> PackageId {
    PackageId::new(s).unwrap()
}

#[test]
fn select_prefers_priority_then_impl_id_whatever_the_publication_order() {
    let open = Arc::new(AtomicU64::new(0));
    for order in [[0, 1, 2], [2, 1, 0], [1, 0, 2]] {
        let reg = OwnedRegistry::new();
        let plugins = [
            ("a.pkg", "a.scan.z", 5),
            ("b.pkg", "b.scan.b", 10),
            ("c.pkg", "c.scan.a", 10),
        ];
        for i in order {
            let (id, impl_id, prio) = plugins[i];
            publish(&reg, plugin(id, "1.0.0", &[(impl_id, prio)], &open));
        }
        assert_eq!(reg.select(&scan()).unwrap().impl_id.as_str(), "b.scan.b");
        let mut cpu = scan();
        cpu.backend = Some(Backend::Cuda);
        assert!(reg.select(&cpu).is_none());
        assert_eq!(
            reg.find_by_id(&ImplId::new("a.scan.z").unwrap())
                .unwrap()
                .package(),
            &pkg("a.pkg")
        );
    }
}

#[test]
fn a_duplicate_impl_id_across_packages_is_refused_and_changes_nothing() {
    let open = Arc::new(AtomicU64::new(0));
    let reg = OwnedRegistry::new();
    publish(&reg, plugin("a.pkg", "1.0.0", &[("shared.scan", 1)], &open));
    let dup = plugin("b.pkg", "1.0.0", &[("b.own", 1), ("shared.scan", 9)], &open);
    let err = reg
        .prepare(&pkg("b.pkg"), &Version::new(1, 0, 0), dup.plugin, true)
        .unwrap_err();
    assert_eq!(
        err,
        RegistryChangeError::DuplicateImplId {
            package: "b.pkg@1.0.0".into(),
            impl_id: ImplId::new("shared.scan").unwrap(),
            owner: "a.pkg@1.0.0".into(),
        }
    );
    // The refused plugin was dropped, so its library closed; the registry still serves a.pkg.
    assert!(dup.closed.load(Ordering::SeqCst));
    assert!(reg.find_by_id(&ImplId::new("b.own").unwrap()).is_none());
    assert_eq!(reg.select(&scan()).unwrap().package(), &pkg("a.pkg"));
    assert_eq!(open.load(Ordering::SeqCst), 1);
}

#[test]
fn a_binding_keeps_the_library_loaded_through_unload_and_replacement() {
    let open = Arc::new(AtomicU64::new(0));
    let reg = OwnedRegistry::new();
    let closed_v1 = publish(&reg, plugin("a.pkg", "1.0.0", &[("a.scan", 1)], &open));
    let binding = reg.find_by_id(&ImplId::new("a.scan").unwrap()).unwrap();
    assert_eq!(reg.live_bindings(&pkg("a.pkg")), 1);

    // Replacement: the new version serves lookups at once, the old library stays for the binding.
    let closed_v2 = publish(&reg, plugin("a.pkg", "2.0.0", &[("a.scan", 1)], &open));
    assert_eq!(
        reg.find_by_id(&ImplId::new("a.scan").unwrap())
            .unwrap()
            .version(),
        &Version::new(2, 0, 0)
    );
    assert!(!closed_v1.load(Ordering::SeqCst));
    assert_eq!(
        reg.live_bindings(&pkg("a.pkg")),
        1,
        "the old version's binding still counts"
    );

    // Unload: deferred while bound.
    let unloaded = reg.unload(&pkg("a.pkg")).unwrap();
    assert_eq!(unloaded.deferred_bindings, 0, "v2 has no bindings");
    assert!(closed_v2.load(Ordering::SeqCst), "v2 closes at once");
    assert!(reg.select(&scan()).is_none());
    assert!(!closed_v1.load(Ordering::SeqCst));
    let clone = binding.clone();
    drop(binding);
    assert!(!closed_v1.load(Ordering::SeqCst));
    assert_eq!(reg.live_bindings(&pkg("a.pkg")), 1);
    drop(clone);
    assert!(
        closed_v1.load(Ordering::SeqCst),
        "the last binding closes the library"
    );
    assert_eq!(reg.live_bindings(&pkg("a.pkg")), 0);
    assert_eq!(open.load(Ordering::SeqCst), 0);
    assert_eq!(
        reg.unload(&pkg("a.pkg")).unwrap_err(),
        RegistryChangeError::NotLoaded {
            package: pkg("a.pkg")
        }
    );
}

#[test]
fn disabled_packages_are_not_selected_but_stay_loaded() {
    let open = Arc::new(AtomicU64::new(0));
    let reg = OwnedRegistry::new();
    publish(&reg, plugin("a.pkg", "1.0.0", &[("a.scan", 1)], &open));
    reg.set_enabled(&pkg("a.pkg"), false).unwrap();
    assert!(reg.select(&scan()).is_none());
    assert_eq!(
        reg.loaded_version(&pkg("a.pkg")),
        Some(Version::new(1, 0, 0))
    );
    reg.set_enabled(&pkg("a.pkg"), true).unwrap();
    assert!(reg.select(&scan()).is_some());
}

/// `find_by_id` reads a copy of the registry's impl-id table that each thread keeps between
/// lookups: that copy must follow every change and must keep no library loaded, also while the
/// thread that made it sits idle.
#[test]
fn a_thread_that_looked_up_a_kernel_follows_changes_and_keeps_no_library_loaded() {
    use std::sync::mpsc;
    let open = Arc::new(AtomicU64::new(0));
    let reg = Arc::new(OwnedRegistry::new());
    let closed_v1 = publish(&reg, plugin("a.pkg", "1.0.0", &[("a.scan", 1)], &open));
    let (ask, asked) = mpsc::channel::<()>();
    let (answer, answers) = mpsc::channel::<Option<Version>>();
    let reader = {
        let reg = reg.clone();
        std::thread::spawn(move || {
            let id = ImplId::new("a.scan").unwrap();
            // One lookup per request; the binding is dropped before the answer is sent, and
            // the thread then waits idle for the next request.
            while asked.recv().is_ok() {
                let found = reg.find_by_id(&id).map(|b| b.version().clone());
                answer.send(found).unwrap();
            }
        })
    };
    let lookup = || {
        ask.send(()).unwrap();
        answers.recv().unwrap()
    };
    assert_eq!(lookup(), Some(Version::new(1, 0, 0)));

    let closed_v2 = publish(&reg, plugin("a.pkg", "2.0.0", &[("a.scan", 1)], &open));
    assert!(
        closed_v1.load(Ordering::SeqCst),
        "the replaced library closes although the idle reader looked its kernel up"
    );
    assert_eq!(lookup(), Some(Version::new(2, 0, 0)));
    reg.set_enabled(&pkg("a.pkg"), false).unwrap();
    assert_eq!(lookup(), None, "a disabled package is not found");
    reg.set_enabled(&pkg("a.pkg"), true).unwrap();
    assert_eq!(lookup(), Some(Version::new(2, 0, 0)));
    reg.unload(&pkg("a.pkg")).unwrap();
    assert!(
        closed_v2.load(Ordering::SeqCst),
        "the unloaded library closes although the idle reader looked its kernel up"
    );
    assert_eq!(lookup(), None);
    assert_eq!(open.load(Ordering::SeqCst), 0);
    drop(ask);
    reader.join().expect("the reader panicked");
}

/// One thread looks up in more registries than it keeps tables for, all with the same impl
/// id: each answers its own kernel, also after a change while its table was pushed out.
#[test]
fn lookups_across_many_registries_on_one_thread_each_answer_their_own() {
    let open = Arc::new(AtomicU64::new(0));
    let registries: Vec<_> = (0..6)
        .map(|i| {
            let reg = OwnedRegistry::new();
            publish(
                &reg,
                plugin(&format!("p{i}.pkg"), "1.0.0", &[("shared.scan", i)], &open),
            );
            reg
        })
        .collect();
    let id = ImplId::new("shared.scan").unwrap();
    let owner = |reg: &OwnedRegistry| {
        let b = reg.find_by_id(&id).expect("every registry has the kernel");
        (b.package().to_string(), b.version().to_string())
    };
    for round in 0..3 {
        for (i, reg) in registries.iter().enumerate() {
            assert_eq!(owner(reg), (format!("p{i}.pkg"), "1.0.0".to_string()));
        }
        // The first registry's table was pushed out of this thread's cache by the others
        // (it keeps four); change it now and look again.
        let v = format!("1.0.{}", round + 1);
        publish(
            &registries[0],
            plugin("p0.pkg", &v, &[("shared.scan", 0)], &open),
        );
        assert_eq!(owner(&registries[0]), ("p0.pkg".to_string(), v.clone()));
        publish(
            &registries[0],
            plugin("p0.pkg", "1.0.0", &[("shared.scan", 0)], &open),
        );
    }
    drop(registries);
    assert_eq!(open.load(Ordering::SeqCst), 0);
}

/// A thread that keeps tables of several registries still sees a change to one of them that
/// was made while it used the others (its table there is then out of date).
#[test]
fn a_change_to_one_cached_registry_is_seen_after_lookups_in_another() {
    let open = Arc::new(AtomicU64::new(0));
    let (a, b) = (OwnedRegistry::new(), OwnedRegistry::new());
    publish(&a, plugin("a.pkg", "1.0.0", &[("shared.scan", 1)], &open));
    publish(&b, plugin("b.pkg", "1.0.0", &[("shared.scan", 1)], &open));
    let id = ImplId::new("shared.scan").unwrap();
    let version = |reg: &OwnedRegistry| reg.find_by_id(&id).map(|b| b.version().clone());
    for round in 1..=3u64 {
        assert!(version(&a).is_some() && version(&b).is_some());
        publish(
            &a,
            plugin(
                "a.pkg",
                &format!("2.0.{round}"),
                &[("shared.scan", 1)],
                &open,
            ),
        );
        // The thread's table of `b` is current, and found first; `a`'s must not be taken.
        assert_eq!(version(&b), Some(Version::new(1, 0, 0)));
        assert_eq!(version(&a), Some(Version::new(2, 0, round)));
        a.set_enabled(&pkg("a.pkg"), false).unwrap();
        assert!(version(&b).is_some());
        assert_eq!(
            version(&a),
            None,
            "disabled while the thread used another registry"
        );
        a.set_enabled(&pkg("a.pkg"), true).unwrap();
    }
}

/// Registries made and dropped one after another on one thread (a new one may take a dropped
/// one's address) each answer their own kernels, never a dropped registry's.
#[test]
fn a_new_registry_never_answers_from_a_dropped_registrys_table() {
    let open = Arc::new(AtomicU64::new(0));
    let id = ImplId::new("shared.scan").unwrap();
    for i in 0..12 {
        let reg = Box::new(OwnedRegistry::new());
        // Every other registry stays empty: a table taken over from its predecessor would
        // answer the predecessor's kernel.
        if i % 2 == 0 {
            publish(
                &reg,
                plugin(&format!("p{i}.pkg"), "1.0.0", &[("shared.scan", 1)], &open),
            );
            let found = reg.find_by_id(&id).expect("the registry's own kernel");
            assert_eq!(found.package().as_str(), format!("p{i}.pkg"));
        } else {
            assert!(
                reg.find_by_id(&id).is_none(),
                "an empty registry found a kernel"
            );
        }
        drop(reg);
    }
    assert_eq!(open.load(Ordering::SeqCst), 0);
}

/// Readers select and take bindings on two threads while a writer publishes, replaces, disables
/// and unloads in a loop. Every binding checks, while it holds it, that its library is open.
#[test]
fn stress_lookups_against_publication_and_unload() {
    let open = Arc::new(AtomicU64::new(0));
    let reg = Arc::new(OwnedRegistry::new());
    let stop = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + Duration::from_millis(1500);
    let seen = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (reg, stop, seen) = (reg.clone(), stop.clone(), seen.clone());
            std::thread::spawn(move || {
                let ids = [
                    ImplId::new("a.scan").unwrap(),
                    ImplId::new("b.scan").unwrap(),
                ];
                let mut held = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    // Hand the processor on each pass, so the writer keeps running even where
                    // threads are scheduled one at a time.
                    std::thread::yield_now();
                    let found = reg
                        .select(&scan())
                        .into_iter()
                        .chain(ids.iter().filter_map(|i| reg.find_by_id(i)));
                    for b in found {
                        let closed = closed_flag(&b);
                        assert!(
                            !closed.load(Ordering::SeqCst),
                            "a binding saw a closed library"
                        );
                        seen.fetch_add(1, Ordering::Relaxed);
                        held.push(b);
                    }
                    if held.len() > 16 {
                        // Keep some bindings across writer iterations, then let them go.
                        for b in held.drain(..8) {
                            let closed = closed_flag(&b);
                            assert!(!closed.load(Ordering::SeqCst));
                        }
                    }
                }
            })
        })
        .collect();
    let mut rounds = 0u64;
    // At least 20 rounds and 200 checked bindings, so that a slow or serialised run (valgrind
    // runs one thread at a time) still exercises every path; a hard cap keeps it bounded.
    let hard_stop = Instant::now() + Duration::from_secs(30);
    while (rounds < 20 || seen.load(Ordering::Relaxed) < 200 || Instant::now() < deadline)
        && Instant::now() < hard_stop
    {
        // Let the readers make progress between writer rounds, so the two interleave even
        // when the threads are run one at a time.
        let before = seen.load(Ordering::Relaxed);
        let wait_until = Instant::now() + Duration::from_millis(50);
        while seen.load(Ordering::Relaxed) == before && Instant::now() < wait_until {
            std::thread::yield_now();
        }
        let v = format!("1.0.{rounds}");
        publish(
            &reg,
            plugin("a.pkg", &v, &[("a.scan", (rounds % 7) as i32)], &open),
        );
        publish(&reg, plugin("b.pkg", &v, &[("b.scan", 3)], &open));
        reg.set_enabled(&pkg("a.pkg"), rounds.is_multiple_of(2))
            .unwrap();
        if rounds.is_multiple_of(3) {
            reg.unload(&pkg("b.pkg")).unwrap();
        }
        rounds += 1;
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().expect("a reader panicked");
    }
    reg.unload(&pkg("a.pkg")).unwrap();
    let _ = reg.unload(&pkg("b.pkg"));
    assert_eq!(
        open.load(Ordering::SeqCst),
        0,
        "every library closed once its bindings were gone"
    );
    eprintln!(
        "registry stress: {rounds} writer rounds, {} bindings checked",
        seen.load(Ordering::Relaxed)
    );
    assert!(rounds > 10 && seen.load(Ordering::Relaxed) > 100);
}
