//! The package manager tells a watcher how far an installation's reading of artifacts has come:
//! one `begin` with the package and its total artifact bytes, `advance` calls that add up to
//! that total, and one `finish`, also when the package turns out to be damaged.

use std::sync::{Arc, Mutex};

use guild_host::InstallOptions;
use guild_ports::source::Progress;
use guild_test_support::{key, open_dir, trust, Spec, Workshop, PUBLISHER};

#[derive(Debug, Default)]
struct Recorder(Mutex<Vec<String>>, Mutex<u64>);

impl Progress for Recorder {
    fn begin(&self, label: &str, total_bytes: u64) {
        self.0
            .lock()
            .unwrap()
            .push(format!("begin {label} {total_bytes}"));
    }
    fn advance(&self, bytes: u64) {
        *self.1.lock().unwrap() += bytes;
    }
    fn finish(&self) {
        let done = *self.1.lock().unwrap();
        self.0.lock().unwrap().push(format!("finish after {done}"));
    }
}

#[test]
fn an_installation_reports_its_artifact_bytes_to_a_watcher() {
    let shop = Workshop::new();
    let k = key();
    let (pm, _) = open_dir(&shop.fresh("store")).unwrap();
    trust(&pm, PUBLISHER, &k);
    let library = vec![7u8; 3 * 1024 * 1024 + 11];
    let spec = Spec::module("example.big", "1.0.0")
        .library(&library)
        .file("share/notes.txt", b"twelve bytes");
    let built = shop.build(&spec, &k);
    let recorder = Arc::new(Recorder::default());
    pm.set_progress(Some(recorder.clone()));
    pm.install(&built.archive, InstallOptions::default())
        .unwrap();
    let total = library.len() as u64 + 12;
    assert_eq!(
        *recorder.0.lock().unwrap(),
        [
            format!("begin example.big@1.0.0 {total}"),
            format!("finish after {total}")
        ]
    );

    // A damaged copy of the installed version is read (and refused) under a watch too.
    let mut bytes = std::fs::read(&built.archive).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 1;
    let damaged = shop.fresh("damaged.gkmodule");
    std::fs::write(&damaged, bytes).unwrap();
    recorder.0.lock().unwrap().clear();
    *recorder.1.lock().unwrap() = 0;
    pm.install(&damaged, InstallOptions::default()).unwrap_err();
    let events = recorder.0.lock().unwrap().clone();
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0], format!("begin example.big@1.0.0 {total}"));
    assert!(events[1].starts_with("finish after"), "{events:?}");

    pm.set_progress(None);
}
