//! [`DlopenLoader`], the [`PluginLoader`] that opens plugin libraries with the POSIX dynamic
//! loader: open, find the entry point, check the descriptor, run `init` against a staging host,
//! judge what it registered, and hand the library over to a [`DlopenLibrary`] whose drop runs
//! `shutdown` and closes it.

use std::collections::BTreeSet;
use std::ffi::c_void;
use std::fmt;
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use guild_abi::{
    guild_abi_version_major, guild_error_info_t, guild_plugin_descriptor_v1_t, guild_status_t,
    GUILD_STATUS_OK,
};
use guild_domain::ids::PackageId;
use guild_domain::version::PackedVersion;
use guild_ports::loader::{LoadError, LoadErrorKind, LoadRequest, LoadedPlugin, PluginLoader};

use crate::library::{DlopenLibrary, OpenLibrary, ShutdownFn};
use crate::owned::{OwnedKernel, OwnedRunner};
use crate::staging::{PluginLog, Staged, StagingConfig, StagingHost};
use guild_abi::text::{bounded_str, fixed_buffer_text, status_name, MAX_DESCRIPTOR_STRING};

/// The C name of the entry point, as the port's error names it.
const ENTRY_SYMBOL: &str = "guild_plugin_entry_v1";

/// Where the loader sends plugins' log records: the package that wrote one, and the record.
pub type LoaderLogSink = Arc<dyn Fn(&PackageId, &PluginLog) + Send + Sync>;

/// Loads plugins with `dlopen(RTLD_NOW | RTLD_LOCAL)`.
///
/// It makes no trust decision: per the [`PluginLoader`] contract, the app only asks it to load
/// libraries of packages it has authenticated. Loading runs the library's initialisers and its
/// `init`; this type cannot make that safe, only keep the host's side of the ABI.
///
/// Each loader counts the libraries it holds open ([`open_libraries`](Self::open_libraries)), so
/// that a caller can see a library really closed when its last holder let go.
#[derive(Clone, Default)]
pub struct DlopenLoader {
    open: Arc<AtomicUsize>,
    log: Option<LoaderLogSink>,
}

impl DlopenLoader {
    /// A loader that drops plugins' log records.
    pub fn new() -> Self {
        DlopenLoader::default()
    }

    /// The same loader (sharing its tally), sending plugins' log records to `sink`.
    pub fn with_log_sink(
        mut self,
        sink: impl Fn(&PackageId, &PluginLog) + Send + Sync + 'static,
    ) -> Self {
        self.log = Some(Arc::new(sink));
        self
    }

    /// How many libraries this loader (and its clones) currently hold open: loaded plugins
    /// whose last `Arc` is still alive, plus loads in progress. Every load that fails has closed
    /// its library again before it returns.
    pub fn open_libraries(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }
}

impl fmt::Debug for DlopenLoader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DlopenLoader")
            .field("open_libraries", &self.open_libraries())
            .field("log", &self.log.is_some())
            .finish()
    }
}

impl PluginLoader for DlopenLoader {
    fn load(&self, request: &LoadRequest) -> Result<LoadedPlugin, LoadError> {
        let fail = |kind: LoadErrorKind| LoadError::new(kind, request);
        // A relative path would let dlopen search the library path; an absolute one opens
        // exactly the file the package manager verified.
        let path = std::path::absolute(&request.library).map_err(|e| {
            fail(LoadErrorKind::Open {
                reason: format!("cannot make the path absolute: {e}"),
            })
            .with_source(e)
        })?;

        // SAFETY: the PluginLoader contract says the app calls load only for libraries of
        // authenticated packages; that is the trust decision opening (and running initialisers)
        // needs.
        let library = unsafe { OpenLibrary::open(&path, Arc::clone(&self.open)) }.map_err(|e| {
            fail(LoadErrorKind::Open {
                reason: open_failure(&e),
            })
            .with_source(e)
        })?;
        let entry = library.entry().ok_or_else(|| {
            fail(LoadErrorKind::MissingEntry {
                symbol: ENTRY_SYMBOL,
            })
        })?;
        // SAFETY: the entry point takes no arguments and returns the plugin's static descriptor
        // or NULL; `library` keeps the code mapped.
        let descriptor = unsafe { entry() };
        // SAFETY: per the header, a non-NULL result points at a static descriptor that stays
        // unchanged while the library is loaded, at least struct_size bytes long.
        let plugin = unsafe { check_descriptor(descriptor, request.host_abi) }.map_err(fail)?;

        let mut config = StagingConfig::new(request.host_abi);
        config.provided_ops = request.provided_ops.clone();
        config.provided_runners = request.provided_runners.clone();
        config.operations = request.operations.as_ref().map(|t| t.address);
        if let Some(sink) = &self.log {
            let sink = Arc::clone(sink);
            let package = request.package.clone();
            config.log = Some(Arc::new(move |record: &PluginLog| sink(&package, record)));
        }
        let staging = StagingHost::open(config);
        let mut plugin_state: *mut c_void = ptr::null_mut();
        let mut error = guild_error_info_t::new();
        // SAFETY: init comes from a checked descriptor of the open library; the host table is
        // valid (forever) and its session is live on this thread for the call; `plugin_state`
        // and `error` are live locals of the types the header names.
        let status = unsafe { (plugin.init)(staging.table(), &mut plugin_state, &mut error) };
        // From here on, dropping `loaded` runs shutdown with whatever init left and closes the
        // library, which is what every failure below needs.
        let loaded = DlopenLibrary {
            package: request.package.clone(),
            version: request.version.clone(),
            path,
            plugin_name: plugin.name,
            plugin_version: plugin.version,
            plugin_state,
            shutdown: plugin.shutdown,
            library,
            _service: request
                .operations
                .as_ref()
                .map(|t| Arc::clone(&t.keep_alive)),
        };
        let staged = staging.close();
        judge(request, status, &error, &staged).map_err(fail)?;

        Ok(LoadedPlugin {
            library: Arc::new(loaded),
            kernels: staged
                .kernels
                .into_iter()
                .map(OwnedKernel::into_registered)
                .collect(),
            runners: staged
                .runners
                .into_iter()
                .map(OwnedRunner::into_registered)
                .collect(),
        })
    }
}

/// What the loader needs from a checked plugin descriptor.
struct PluginEntry {
    name: String,
    version: String,
    init: InitFn,
    shutdown: ShutdownFn,
}

type InitFn = unsafe extern "C" fn(
    host: *const guild_abi::guild_host_api_v1_t,
    plugin_state: *mut *mut c_void,
    error: *mut guild_error_info_t,
) -> guild_status_t;

/// Checks the descriptor an entry point returned: present, large enough, a Kernel ABI range that
/// holds `host`, built against `host`'s major, both callbacks present, and name and version
/// readable.
///
/// # Safety
/// `descriptor` must be NULL or point at a descriptor readable for its declared `struct_size`
/// bytes, whose strings are NULL or NUL-terminated, for the duration of the call.
unsafe fn check_descriptor(
    descriptor: *const guild_plugin_descriptor_v1_t,
    host: PackedVersion,
) -> Result<PluginEntry, LoadErrorKind> {
    let bad = |reason: String| LoadErrorKind::BadDescriptor { reason };
    if descriptor.is_null() {
        return Err(bad("the entry point returned NULL".into()));
    }
    // SAFETY: non-NULL and readable per the contract; struct_size is the first field of every
    // version of the descriptor.
    let size = unsafe { ptr::addr_of!((*descriptor).struct_size).read_unaligned() };
    let needed = size_of::<guild_plugin_descriptor_v1_t>();
    if usize::try_from(size).map_or(true, |s| s < needed) {
        return Err(bad(format!(
            "struct_size {size} is smaller than the {needed} bytes of \
             guild_plugin_descriptor_v1_t"
        )));
    }
    // SAFETY: the plugin declares at least `needed` readable bytes.
    let d = unsafe { descriptor.read_unaligned() };
    let (min, max) = (
        PackedVersion::from_raw(d.min_kernel_abi),
        PackedVersion::from_raw(d.max_kernel_abi),
    );
    if !(min <= host && host <= max) {
        return Err(LoadErrorKind::AbiMismatch { min, max, host });
    }
    if guild_abi_version_major(d.abi_version) != host.major() {
        return Err(bad(format!(
            "it was built against Kernel ABI {}, whose layouts this Kernel ABI {host} host \
             cannot read",
            PackedVersion::from_raw(d.abi_version)
        )));
    }
    let init = d.init.ok_or_else(|| bad("init is NULL".into()))?;
    let shutdown = d.shutdown.ok_or_else(|| bad("shutdown is NULL".into()))?;
    // SAFETY: per the contract, the name is NULL or a NUL-terminated static string.
    let name = unsafe { bounded_str(d.plugin_name, MAX_DESCRIPTOR_STRING) }
        .map_err(|e| bad(format!("plugin_name {e}")))?;
    // SAFETY: as for the name.
    let version = unsafe { bounded_str(d.plugin_version, MAX_DESCRIPTOR_STRING) }
        .map_err(|e| bad(format!("plugin_version {e}")))?;
    Ok(PluginEntry {
        name: name.to_owned(),
        version: version.to_owned(),
        init,
        shutdown,
    })
}

/// Decides a finished init. A refused registration comes first (typed when an extension caused
/// it), because it is the host's finding and most likely the reason init then failed; next,
/// registrations outside the manifest; then init's own status; and last, with init successful,
/// whether it registered exactly what the manifest declares.
fn judge(
    request: &LoadRequest,
    status: guild_status_t,
    error: &guild_error_info_t,
    staged: &Staged,
) -> Result<(), LoadErrorKind> {
    if let Some(first) = staged.refusals.first() {
        if let Some(Some(refusal)) = staged.extension_refusals.first() {
            return Err(LoadErrorKind::ExtensionRefused {
                refusal: refusal.clone(),
                more: staged.refusals.len() - 1,
            });
        }
        let reason = match staged.refusals.len() {
            1 => first.clone(),
            n => format!("{first} (and {} more)", n - 1),
        };
        return Err(LoadErrorKind::RegistrationRefused { reason });
    }
    let kernels = mismatch(
        staged
            .kernels
            .iter()
            .map(|k| k.impl_id().as_str())
            .chain(staged.undeclared_kernels.iter().map(String::as_str)),
        request.provided_ops.iter().map(|id| id.as_str()),
    );
    let runners = mismatch(
        staged
            .runners
            .iter()
            .map(|r| r.runner_id().as_str())
            .chain(staged.undeclared_runners.iter().map(String::as_str)),
        request.provided_runners.iter().map(|id| id.as_str()),
    );
    // An id outside the manifest is a mismatch whatever init then returned. A declared id that
    // is missing only counts once init succeeded: a failed init registers little or nothing,
    // and its own error is the useful one.
    let undeclared = !staged.undeclared_kernels.is_empty() || !staged.undeclared_runners.is_empty();
    if undeclared || status == GUILD_STATUS_OK {
        if let Some(kind) = kernels.or(runners) {
            return Err(kind);
        }
    }
    if status != GUILD_STATUS_OK {
        return Err(LoadErrorKind::InitFailed {
            status,
            status_name: status_name(status),
            component: fixed_buffer_text(&error.component),
            message: fixed_buffer_text(&error.message),
        });
    }
    Ok(())
}

/// A mismatch error when the registered set differs from the declared one.
fn mismatch<'a>(
    registered: impl Iterator<Item = &'a str>,
    declared: impl Iterator<Item = &'a str>,
) -> Option<LoadErrorKind> {
    let registered: BTreeSet<&str> = registered.collect();
    let declared: BTreeSet<&str> = declared.collect();
    (registered != declared).then(|| LoadErrorKind::RegistrationMismatch {
        registered: registered.into_iter().map(str::to_owned).collect(),
        declared: declared.into_iter().map(str::to_owned).collect(),
    })
}

/// Why `dlopen` refused a library, in words: libloading's message says which call failed
/// ("dlopen failed") and its source carries dlerror's text, which names the file and the cause.
fn open_failure(e: &libloading::Error) -> String {
    use std::error::Error as _;
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::ffi::c_char;

    use guild_abi::{guild_host_api_v1_t, GUILD_KERNEL_ABI_VERSION};

    unsafe extern "C" fn init(
        _host: *const guild_host_api_v1_t,
        _state: *mut *mut c_void,
        _error: *mut guild_error_info_t,
    ) -> guild_status_t {
        GUILD_STATUS_OK
    }

    unsafe extern "C" fn shutdown(_state: *mut c_void) {}

    fn good() -> guild_plugin_descriptor_v1_t {
        guild_plugin_descriptor_v1_t {
            struct_size: size_of::<guild_plugin_descriptor_v1_t>() as u32,
            abi_version: GUILD_KERNEL_ABI_VERSION,
            min_kernel_abi: GUILD_KERNEL_ABI_VERSION,
            max_kernel_abi: GUILD_KERNEL_ABI_VERSION,
            plugin_name: c"unit".as_ptr(),
            plugin_version: c"1.0.0".as_ptr(),
            init: Some(init),
            shutdown: Some(shutdown),
        }
    }

    fn check(d: &guild_plugin_descriptor_v1_t) -> Result<(String, String), LoadErrorKind> {
        // SAFETY: a live descriptor built above, whose strings are static or local arrays that
        // outlive the call.
        unsafe { check_descriptor(d, PackedVersion::KERNEL_ABI_V1) }.map(|p| (p.name, p.version))
    }

    fn bad(reason: &str) -> Result<(String, String), LoadErrorKind> {
        Err(LoadErrorKind::BadDescriptor {
            reason: reason.into(),
        })
    }

    #[test]
    fn descriptor_checks_name_what_is_wrong() {
        assert_eq!(check(&good()), Ok(("unit".into(), "1.0.0".into())));
        // SAFETY: NULL is allowed.
        let null = unsafe { check_descriptor(ptr::null(), PackedVersion::KERNEL_ABI_V1) };
        assert_eq!(
            null.map(|p| p.name),
            Err(LoadErrorKind::BadDescriptor {
                reason: "the entry point returned NULL".into()
            })
        );

        let mut d = good();
        d.struct_size = 16;
        let expected = format!(
            "struct_size 16 is smaller than the {} bytes of guild_plugin_descriptor_v1_t",
            size_of::<guild_plugin_descriptor_v1_t>()
        );
        assert_eq!(check(&d), bad(&expected));

        let v = |major, minor| PackedVersion::new(major, minor, 0).map(PackedVersion::raw);
        let mut d = good();
        d.min_kernel_abi = v(1, 1).unwrap_or_default();
        d.max_kernel_abi = v(1, 9).unwrap_or_default();
        assert_eq!(
            check(&d),
            Err(LoadErrorKind::AbiMismatch {
                min: PackedVersion::from_raw(d.min_kernel_abi),
                max: PackedVersion::from_raw(d.max_kernel_abi),
                host: PackedVersion::KERNEL_ABI_V1,
            })
        );

        let mut d = good();
        d.max_kernel_abi = v(2, 0).unwrap_or_default();
        d.abi_version = v(2, 0).unwrap_or_default();
        assert_eq!(
            check(&d),
            bad("it was built against Kernel ABI 2.0.0, whose layouts this Kernel ABI 1.0.0 host cannot read")
        );

        let mut d = good();
        d.init = None;
        assert_eq!(check(&d), bad("init is NULL"));
        let mut d = good();
        d.shutdown = None;
        assert_eq!(check(&d), bad("shutdown is NULL"));

        let mut d = good();
        d.plugin_name = ptr::null();
        assert_eq!(check(&d), bad("plugin_name is NULL"));
        let latin1: [c_char; 3] = [0x74, 0xe9u8 as c_char, 0];
        let mut d = good();
        d.plugin_version = latin1.as_ptr();
        assert_eq!(check(&d), bad("plugin_version is not UTF-8"));
        let long = vec![b'a' as c_char; MAX_DESCRIPTOR_STRING + 1];
        let mut d = good();
        d.plugin_name = long.as_ptr();
        assert_eq!(
            check(&d),
            bad("plugin_name is not NUL-terminated within 256 bytes")
        );
    }
}
