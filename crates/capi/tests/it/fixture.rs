//! Stores the tests open: the scan module (test-plugins scan_module) signed, its publisher trusted
//! and installed by a package manager that is closed again, as an operator's `guild install`
//! leaves it; and the operator's later changes.

use std::ffi::{c_char, CStr, CString};
use std::path::{Path, PathBuf};
use std::ptr;

use guild_host::{InstallOptions, PackageId, Version};
use guild_host_capi::ffi::*;
use guild_host_capi::{guild_host_error_s, guild_host_get_api};
use guild_test_support::adapters::crypto::SigningKey;
use guild_test_support::plugins::scan_spec;
use guild_test_support::{key, open_dir, trust, Workshop, PUBLISHER};

/// A store with the scan module installed and enabled.
pub struct ScanStore {
    pub shop: Workshop,
    pub store: PathBuf,
    pub key: SigningKey,
}

impl ScanStore {
    /// The scan at `version` installed into a new store.
    pub fn new(version: &str) -> Self {
        let shop = Workshop::new();
        let key = key();
        let store = shop.fresh("store");
        let (pm, _) = open_dir(&store).unwrap();
        trust(&pm, PUBLISHER, &key);
        drop(pm);
        let s = ScanStore { shop, store, key };
        s.install(version);
        s
    }

    /// The operator installs the scan at `version` (enabling it), from a writer of its own.
    pub fn install(&self, version: &str) {
        self.install_spec(&scan_spec(version));
    }

    /// The operator installs the package `spec` describes, from a writer of its own.
    pub fn install_spec(&self, spec: &guild_test_support::Spec) {
        let built = self.shop.build(spec, &self.key);
        let (pm, _) = open_dir(&self.store).unwrap();
        pm.install(&built.archive, InstallOptions::default())
            .unwrap();
    }

    /// The operator revokes the scan's `version` by its payload digest.
    pub fn revoke(&self, version: &str) {
        let (pm, _) = open_dir(&self.store).unwrap();
        let digest = pm
            .metadata(
                &PackageId::new("example.scan").unwrap(),
                &Version::parse(version).unwrap(),
            )
            .unwrap()
            .payload_digest();
        pm.update_trust(|t| {
            t.revoke_digest(digest, "revoked by the capi tests");
            Ok(())
        })
        .unwrap();
    }

    pub fn path(&self) -> &Path {
        &self.store
    }
}

/// The version 1 table.
pub fn api() -> &'static guild_host_capi_v1_t {
    let table = guild_host_get_api(GUILD_HOST_CAPI_VERSION);
    assert!(!table.is_null());
    // SAFETY: a non-NULL table is static.
    unsafe { &*table }
}

/// A failure read back from an error object (which is freed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failed {
    pub code: guild_host_code_t,
    pub message: String,
}

/// The code and, for a failure, the error object's contents (freeing it).
pub fn outcome(code: guild_host_code_t, error: *mut guild_host_error_s) -> Result<(), Failed> {
    let api = api();
    if code == GUILD_HOST_OK {
        assert!(error.is_null(), "a success leaves out_error untouched");
        return Ok(());
    }
    assert!(!error.is_null(), "a failure writes an error object");
    // SAFETY: an error object the library just made.
    let (c, message) = unsafe {
        let c = (api.error_code)(error);
        let m = CStr::from_ptr((api.error_message)(error))
            .to_string_lossy()
            .into_owned();
        (api.error_free)(error);
        (c, m)
    };
    assert_eq!(c, code, "the object's code is the returned one");
    Err(Failed { code, message })
}

/// Default options for `store`, CPU only.
pub fn options(store: &CString) -> guild_host_open_options_v1_t {
    guild_host_open_options_v1_t {
        struct_size: size_of::<guild_host_open_options_v1_t>() as u32,
        flags: GUILD_HOST_OPEN_CPU_ONLY,
        store_dir: store.as_ptr(),
        lock_file: ptr::null(),
        log: None,
        log_user: ptr::null_mut(),
    }
}

pub fn c_path(path: &Path) -> CString {
    CString::new(path.to_str().unwrap()).unwrap()
}

/// Opens `store` through the table.
pub fn open(store: &Path) -> Result<(*mut guild_host_t, guild_host_open_report_v1_t), Failed> {
    let path = c_path(store);
    let o = options(&path);
    let mut host: *mut guild_host_t = ptr::null_mut();
    let mut report = guild_host_open_report_v1_t {
        struct_size: size_of::<guild_host_open_report_v1_t>() as u32,
        ..Default::default()
    };
    let mut error = ptr::null_mut();
    // SAFETY: valid options, out-pointers and error slot.
    let code = unsafe { (api().open)(&o, &mut host, &mut report, &mut error) };
    outcome(code, error)?;
    assert!(!host.is_null());
    Ok((host, report))
}

/// Closes `host` through the table.
pub fn close(host: *mut guild_host_t) -> Result<(), Failed> {
    let mut error = ptr::null_mut();
    // SAFETY: a live host.
    let code = unsafe { (api().close)(host, &mut error) };
    outcome(code, error)
}

/// Text of a fixed C buffer.
pub fn text(buffer: &[c_char]) -> String {
    let bytes: Vec<u8> = buffer
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8(bytes).unwrap()
}
