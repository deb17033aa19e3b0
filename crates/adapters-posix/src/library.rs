//! An open plugin library and the loaded plugin that owns it: the two places where this crate
//! runs `dlclose`, and the one place where it runs a plugin's `shutdown`.

use std::ffi::c_void;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use guild_abi::{
    guild_plugin_descriptor_v1_t, guild_plugin_entry_fn, GUILD_PLUGIN_ENTRY_SYMBOL_V1,
};
use guild_domain::ids::PackageId;
use guild_domain::version::Version;
use guild_ports::loader::LoadedLibrary;
use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};

/// The entry point's function type, with NULL already ruled out.
pub(crate) type EntryFn = unsafe extern "C" fn() -> *const guild_plugin_descriptor_v1_t;

/// A plugin's `shutdown`.
pub(crate) type ShutdownFn = unsafe extern "C" fn(plugin_state: *mut c_void);

/// A library opened with `RTLD_NOW | RTLD_LOCAL`, counted in its loader's tally of open
/// libraries until it is closed again on drop.
pub(crate) struct OpenLibrary {
    library: Option<Library>,
    open: Arc<AtomicUsize>,
}

impl OpenLibrary {
    /// Opens `path`, resolving every symbol now (so that a missing dependency fails here, not at
    /// a later call) and keeping its symbols out of the global namespace (so that two plugins
    /// cannot capture each other's).
    ///
    /// # Safety
    /// Opening a library runs its initialisers, which can do anything. The caller must have
    /// decided to trust the library's code: for the loader, that the package manager
    /// authenticated the package this path belongs to.
    pub(crate) unsafe fn open(
        path: &Path,
        open: Arc<AtomicUsize>,
    ) -> Result<Self, libloading::Error> {
        // SAFETY: the caller made the trust decision this function's contract asks for.
        let library = unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL) }?;
        open.fetch_add(1, Ordering::SeqCst);
        Ok(OpenLibrary {
            library: Some(library),
            open,
        })
    }

    /// The plugin entry point, if the library exports a non-NULL `guild_plugin_entry_v1`. The
    /// pointer is valid while `self` is open.
    pub(crate) fn entry(&self) -> Option<EntryFn> {
        let library = self.library.as_ref()?;
        // SAFETY: a Guild plugin exports this symbol as a function of exactly this type (the
        // header's guild_plugin_entry_fn, NULL mapped to None). A library that exports the name
        // with another type breaks the ABI it claims, which no loader can detect.
        let symbol = unsafe {
            library.get::<guild_plugin_entry_fn>(GUILD_PLUGIN_ENTRY_SYMBOL_V1.to_bytes_with_nul())
        };
        symbol.ok().and_then(|symbol| *symbol)
    }
}

impl Drop for OpenLibrary {
    fn drop(&mut self) {
        if let Some(library) = self.library.take() {
            // A failing dlclose leaves the library mapped, which is safe; there is nobody to
            // tell from a destructor, and the tally still counts what the loader holds.
            let _ = library.close();
        }
        self.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A loaded plugin: its library, kept open, and the state its `init` produced. Dropping the last
/// `Arc` of it calls the plugin's `shutdown` with that state and then closes the library.
pub struct DlopenLibrary {
    pub(crate) package: PackageId,
    pub(crate) version: Version,
    pub(crate) path: PathBuf,
    pub(crate) plugin_name: String,
    pub(crate) plugin_version: String,
    pub(crate) plugin_state: *mut c_void,
    pub(crate) shutdown: ShutdownFn,
    // Dropped after `Drop::drop` has run shutdown, so the code shutdown runs is still mapped.
    pub(crate) library: OpenLibrary,
    /// The owner of the operation service table the plugin was given: dropped after the library
    /// is closed (fields drop in order), so no code of the plugin can run without it.
    pub(crate) _service: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

// SAFETY: the plugin state is opaque to Rust: it is never dereferenced, only passed back to the
// plugin's shutdown, exactly once, from whichever thread drops the last Arc. The ABI allows
// shutdown on any thread (it must quiesce the plugin's own threads), and libloading's Library is
// Send + Sync.
unsafe impl Send for DlopenLibrary {}
// SAFETY: shared access reads immutable fields only; the state pointer is not used through &self.
unsafe impl Sync for DlopenLibrary {}

impl DlopenLibrary {
    /// The library file that was opened (made absolute).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The name the plugin's descriptor gives itself.
    pub fn plugin_name(&self) -> &str {
        &self.plugin_name
    }

    /// The version the plugin's descriptor states (for logs; the package version is the
    /// manifest's).
    pub fn plugin_version(&self) -> &str {
        &self.plugin_version
    }
}

impl Drop for DlopenLibrary {
    fn drop(&mut self) {
        // SAFETY: init was called and returned (successfully or not) with this state, and this
        // is the one shutdown call the ABI promises for it. The library is still open: the
        // `library` field is dropped only after this body returns.
        unsafe { (self.shutdown)(self.plugin_state) };
    }
}

impl LoadedLibrary for DlopenLibrary {
    fn package(&self) -> &PackageId {
        &self.package
    }

    fn version(&self) -> &Version {
        &self.version
    }
}

impl fmt::Debug for DlopenLibrary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DlopenLibrary")
            .field("package", &self.package)
            .field("version", &self.version)
            .field("path", &self.path)
            .field("plugin_name", &self.plugin_name)
            .field("plugin_version", &self.plugin_version)
            .field("open", &self.library.library.is_some())
            .finish_non_exhaustive()
    }
}
