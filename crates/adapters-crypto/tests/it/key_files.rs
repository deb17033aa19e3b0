//! Key files: private keys are written 0600 and atomically, never over an existing file unless
//! asked, and read back with a size cap.

use std::os::unix::fs::PermissionsExt;

use guild_adapters_crypto::files::{
    read_private_key, read_public_key, write_private_key, write_public_key, KeyFileOptions,
    MAX_KEY_FILE_BYTES,
};
use guild_adapters_crypto::{KeyError, KeyFileError, SigningKey};

use crate::support::openssl_ok;

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("a temporary directory")
}

fn names(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

#[test]
fn a_private_key_file_is_0600_pkcs8_and_leaves_no_temporary_file() {
    let dir = tempdir();
    let path = dir.path().join("signing.pem");
    let key = SigningKey::generate().unwrap();
    write_private_key(&path, &key, &KeyFileOptions::default()).unwrap();
    assert_eq!(mode(&path), 0o600);
    assert_eq!(names(dir.path()), ["signing.pem"]);
    let back = read_private_key(&path).unwrap();
    assert_eq!(back.key_id(), key.key_id());
    // OpenSSL reads the file as written.
    openssl_ok(
        dir.path(),
        &["pkey", "-in", "signing.pem", "-check", "-noout"],
    );
}

#[test]
fn an_existing_key_file_is_not_replaced_unless_asked() {
    let dir = tempdir();
    let path = dir.path().join("signing.pem");
    let first = SigningKey::generate().unwrap();
    let second = SigningKey::generate().unwrap();
    write_private_key(&path, &first, &KeyFileOptions::default()).unwrap();
    match write_private_key(&path, &second, &KeyFileOptions::default()) {
        Err(KeyFileError::AlreadyExists { path: p }) => assert_eq!(p, path),
        other => panic!("{other:?}"),
    }
    assert_eq!(read_private_key(&path).unwrap().key_id(), first.key_id());
    assert_eq!(names(dir.path()), ["signing.pem"]);

    let replace = KeyFileOptions {
        replace_existing: true,
    };
    write_private_key(&path, &second, &replace).unwrap();
    assert_eq!(read_private_key(&path).unwrap().key_id(), second.key_id());
    assert_eq!(mode(&path), 0o600);
    assert_eq!(names(dir.path()), ["signing.pem"]);
}

#[test]
fn public_key_files_round_trip() {
    let dir = tempdir();
    let path = dir.path().join("signing.pub");
    let key = SigningKey::generate().unwrap();
    write_public_key(&path, key.public_key(), &KeyFileOptions::default()).unwrap();
    assert_eq!(mode(&path) & 0o022, 0, "never group- or world-writable");
    assert_eq!(&read_public_key(&path).unwrap(), key.public_key());
    let der = openssl_ok(
        dir.path(),
        &["pkey", "-pubin", "-in", "signing.pub", "-outform", "DER"],
    );
    assert_eq!(der, key.public_key().spki_der());
}

#[test]
fn reading_refuses_oversized_binary_missing_and_wrong_files() {
    let dir = tempdir();
    let d = dir.path();
    let big = d.join("big.pem");
    std::fs::write(&big, vec![b'a'; MAX_KEY_FILE_BYTES as usize + 1]).unwrap();
    match read_private_key(&big) {
        Err(KeyFileError::TooLarge { size, limit, .. }) => {
            assert_eq!((size, limit), (MAX_KEY_FILE_BYTES + 1, MAX_KEY_FILE_BYTES))
        }
        other => panic!("{other:?}"),
    }
    let binary = d.join("binary.pem");
    std::fs::write(&binary, [0xff, 0xfe, 0x00]).unwrap();
    assert!(matches!(
        read_private_key(&binary),
        Err(KeyFileError::NotText { .. })
    ));
    match read_public_key(&d.join("missing.pub")) {
        Err(KeyFileError::Io {
            operation, source, ..
        }) => {
            assert_eq!(operation, "open");
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("{other:?}"),
    }
    // A public key where a private key is expected says so, with the path.
    let key = SigningKey::generate().unwrap();
    let public = d.join("key.pub");
    write_public_key(&public, key.public_key(), &KeyFileOptions::default()).unwrap();
    match read_private_key(&public) {
        Err(e @ KeyFileError::Key { .. }) => {
            assert_eq!(
                e.to_string(),
                format!("{} does not hold a usable key", public.display())
            );
            let KeyFileError::Key { source, .. } = e else {
                unreachable!()
            };
            assert!(matches!(source, KeyError::UnexpectedPemLabel { .. }));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn writing_into_a_missing_directory_fails_cleanly() {
    let dir = tempdir();
    let path = dir.path().join("no/such/dir/key.pem");
    let key = SigningKey::generate().unwrap();
    match write_private_key(&path, &key, &KeyFileOptions::default()) {
        Err(KeyFileError::Io { operation, .. }) => assert_eq!(operation, "create"),
        other => panic!("{other:?}"),
    }
    assert!(names(dir.path()).is_empty());
}
