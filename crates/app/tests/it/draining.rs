//! Lifecycle changes and the lease ledger: a session lease dropped, or the ledger queried, while
//! an installation is inside plugin loading does not wait for it, and a lease on the package
//! being replaced is refused as pending instead of slipping under the change.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use guild_adapters_posix::DlopenLoader;
use guild_domain::ids::PackageId;
use guild_domain::lease::{LeaseError, LeaseKind, QuiescentAction};
use guild_host::{Host, HostError, InstallOptions};
use guild_ports::loader::{LoadError, LoadRequest, LoadedPlugin, PluginLoader};

use crate::operations::{alt_spec, scan_spec};
use crate::support::{id, key, open_dir, trust, Workshop, PUBLISHER};

const SCAN: &str = "example.scan";

/// A bound for waits that only a deadlock would exceed; no assertion depends on how long
/// anything takes.
const DEADLOCK_GUARD: Duration = Duration::from_secs(20);

/// An armed gate: where the loader says it entered, and where it waits to be told to go on.
type Gate = Option<(mpsc::Sender<()>, mpsc::Receiver<()>)>;

/// A loader that, once armed, stops inside `load` until told to go on: an installation whose
/// plugin init is as slow as the test wants, with the ordering proven by channels.
struct GatedLoader {
    inner: DlopenLoader,
    gate: Arc<Mutex<Gate>>,
}

impl PluginLoader for GatedLoader {
    fn load(&self, request: &LoadRequest) -> Result<LoadedPlugin, LoadError> {
        let armed = self.gate.lock().unwrap().take();
        if let Some((entered, go)) = armed {
            entered.send(()).unwrap();
            // The test always sends `go` (also when an assertion is about to fail).
            let _ = go.recv();
        }
        self.inner.load(request)
    }
}

/// Runs `f` on another thread of `s` and answers what it returned, or `None` when it did not
/// return within [`DEADLOCK_GUARD`] (it is still joined when the scope ends).
fn returns<'s, T: Send + 's>(
    s: &'s std::thread::Scope<'s, '_>,
    f: impl FnOnce() -> T + Send + 's,
) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    s.spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(DEADLOCK_GUARD).ok()
}

#[test]
fn a_session_lease_drop_during_a_slow_install_does_not_wait_for_it() {
    let shop = Workshop::new();
    let k = key();
    let (pm, _) = open_dir(&shop.fresh("store")).unwrap();
    trust(&pm, PUBLISHER, &k);
    let gate = Arc::new(Mutex::new(None));
    let host = Host::new(
        pm,
        Box::new(GatedLoader {
            inner: DlopenLoader::new(),
            gate: gate.clone(),
        }),
    );
    for spec in [scan_spec("1.0.0"), alt_spec("1.0.0")] {
        host.install(&shop.build(&spec, &k).archive, InstallOptions::default())
            .unwrap();
    }
    let (scan, alt): (PackageId, PackageId) = (id(SCAN), id("example.scan_alt"));
    let lease = host.packages().lease(&alt).unwrap();
    let v11 = shop.build(&scan_spec("1.1.0"), &k);

    let (entered_tx, entered_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel();
    *gate.lock().unwrap() = Some((entered_tx, go_rx));
    let in_install = AtomicBool::new(false);
    std::thread::scope(|s| {
        let install = s.spawn(|| {
            in_install.store(true, Ordering::SeqCst);
            let outcome = host.install(&v11.archive, InstallOptions::default());
            in_install.store(false, Ordering::SeqCst);
            outcome
        });
        entered_rx
            .recv_timeout(DEADLOCK_GUARD)
            .expect("the installation reaches plugin loading");
        // From here until `go`, the installation is inside the loader.
        let dropped = returns(s, move || drop(lease));
        let counted = returns(s, || host.packages().active_package_leases(&alt));
        let leased = returns(s, || host.packages().lease(&scan).map(drop));
        let still_installing = in_install.load(Ordering::SeqCst) && !install.is_finished();
        go_tx.send(()).unwrap();
        let installed = install.join().unwrap();

        assert!(still_installing, "the installation went on without `go`");
        assert!(
            dropped.is_some(),
            "dropping a session lease waited for an installation in progress"
        );
        assert_eq!(
            counted.expect("a ledger query waited for an installation in progress"),
            Default::default()
        );
        // A lease on the package being replaced is refused while the change is pending
        // (instead of waiting for it, or slipping under it).
        match leased.expect("a lease request waited for an installation in progress") {
            Err(HostError::Lease(LeaseError::ChangePending { id, kind, action })) => {
                assert_eq!(
                    (id, kind, action),
                    (scan.clone(), LeaseKind::Lease, QuiescentAction::Replace)
                );
            }
            other => panic!("expected the lease to be refused as pending, got {other:?}"),
        }
        assert_eq!(installed.unwrap().version.to_string(), "1.1.0");
    });
    // Once the change is over, leases are granted again.
    drop(host.packages().lease(&scan).unwrap());
}
