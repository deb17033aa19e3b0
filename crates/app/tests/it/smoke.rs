//! A first end-to-end pass through the package manager: pack, sign, trust, install, list,
//! disable, reopen.

use guild_adapters_crypto::SigningKey;
use guild_domain::ids::{PackageId, PublisherId};
use guild_domain::lifecycle::State;
use guild_host::packaging::pack;
use guild_host::{InstallOptions, PackageManager};

#[test]
fn pack_sign_trust_install_list_disable_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("libscan.so"), b"not really a library").unwrap();
    let template = tmp.path().join("manifest.json");
    std::fs::write(
        &template,
        br#"{"package_id": "example.scan", "kind": "gkmodule", "version": "1.0.0",
            "publisher_id": "org.example", "kernel_abi": {"min": "1.0.0", "max": "1.0.0"},
            "module_abi": 1, "os": "linux", "arch": "x86_64", "backends": ["cpu"],
            "entry": "libscan.so", "provided_ops": ["example.scan.inclusive.cpu"]}"#,
    )
    .unwrap();
    let key = SigningKey::generate().unwrap();
    let archive = tmp.path().join("scan.gkmodule");
    let packed = pack(&src, &template, &archive, Some(&key)).unwrap();

    let store = tmp.path().join("store");
    let (pm, report) = PackageManager::open_dir(&store).unwrap();
    assert!(report.disabled.is_empty());
    pm.update_trust(|t| {
        t.add_key(
            PublisherId::new("org.example").unwrap(),
            key.public_key().spki_der().to_vec(),
        )
        .map_err(Into::into)
    })
    .unwrap();
    let installed = pm.install(&archive, InstallOptions::default()).unwrap();
    assert!(installed.changed && installed.enabled);
    assert_eq!(installed.payload_digest, packed.metadata.payload_digest());
    // The identical payload again is a no-op.
    assert!(
        !pm.install(&archive, InstallOptions::default())
            .unwrap()
            .changed
    );

    let id = PackageId::new("example.scan").unwrap();
    let list = pm.list().unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].versions[0].state, State::Enabled);
    pm.disable(&id).unwrap();
    drop(pm);

    let (pm, report) = PackageManager::open_dir(&store).unwrap();
    assert!(report.recovery.is_clean(), "{:?}", report.recovery);
    assert_eq!(pm.list().unwrap()[0].versions[0].state, State::Disabled);
    pm.enable(&id).unwrap();
    drop(pm);
    let (_pm, report) = PackageManager::open_dir(&store).unwrap();
    assert_eq!(report.verified, 1);
    assert!(report.disabled.is_empty());
}
