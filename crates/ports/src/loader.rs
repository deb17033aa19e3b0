//! The plugin loader: opening an authenticated package's entry library, running its entry point
//! and `init` against a temporary registration host, and keeping the code mapped while anything
//! can still call into it.
//!
//! The contract the app relies on:
//! - `load` is only ever called for a package that the package manager has authenticated and
//!   whose dependencies are loaded; the loader itself makes no trust decision.
//! - On success, every registration has been copied (descriptor, strings and extension chain)
//!   into memory the loader owns, so nothing points into `init`'s stack.
//! - On any failure, the plugin's `shutdown` has run (if `init` was reached) and the library is
//!   closed again before `load` returns.
//! - The library stays loaded exactly as long as an `Arc` of [`LoadedLibrary`] lives. Dropping
//!   the last one runs `shutdown` and then closes the library. Whoever hands out pointers into the
//!   library (a binding, an operation handle) must hold such an `Arc` alongside them.

use std::any::Any;
use std::error::Error as StdError;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use guild_domain::ids::{ImplId, OpName, PackageId, RunnerId};
use guild_domain::operation::{Backend, OpCandidate};
use guild_domain::version::{PackedVersion, Version};

/// The address of the host's C operation service table (`guild_operation_service_v1_t`), which
/// the loader puts into the optional tail of the host table it passes to `init`. The loader never
/// dereferences it; the app guarantees that the table outlives every plugin loaded with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceTable(pub usize);

/// What to load.
#[derive(Debug, Clone)]
pub struct LoadRequest {
    /// The package being loaded.
    pub package: PackageId,
    /// Its version.
    pub version: Version,
    /// The entry library inside the installed, verified tree.
    pub library: PathBuf,
    /// The manifest's `provided_ops`: the registered impl ids must equal this set exactly.
    pub provided_ops: Vec<ImplId>,
    /// The manifest's `provided_runners`: the registered runner ids must equal this set exactly.
    pub provided_runners: Vec<RunnerId>,
    /// The Kernel ABI the host implements; the plugin's supported range must contain it.
    pub host_abi: PackedVersion,
    /// The operation service offered to the plugin through the host table's tail, if any.
    pub operations: Option<ServiceTable>,
}

/// A loaded plugin library. Dropping the last `Arc` runs the plugin's `shutdown` and closes the
/// library; see the module documentation.
pub trait LoadedLibrary: Send + Sync + fmt::Debug {
    /// The package the library belongs to.
    fn package(&self) -> &PackageId;
    /// The version of that package.
    fn version(&self) -> &Version;
}

/// One kernel the plugin registered, copied out of `init`.
#[derive(Clone)]
pub struct RegisteredKernel {
    /// The implementation id, unique across the registry.
    pub impl_id: ImplId,
    /// The kernel descriptor's `op_kind` (`GUILD_OP_*`).
    pub op_kind: u32,
    /// The namespaced operation name, when the descriptor has one (always for `GUILD_OP_CUSTOM`).
    pub op_name: Option<OpName>,
    /// The one backend the kernel runs on.
    pub backend: Backend,
    /// Selection priority: higher wins, ties go to the smaller impl id.
    pub priority: i32,
    /// The GOP1 contract in domain form, when the descriptor carries a GOP1 extension.
    pub operation: Option<OpCandidate>,
    /// The loader's owned copy of the C descriptor and its extensions. The app, which knows the
    /// concrete type its loader uses, downcasts it to reach the callbacks. Its function pointers
    /// are valid only while the library that registered it is loaded.
    pub raw: Arc<dyn Any + Send + Sync>,
}

impl fmt::Debug for RegisteredKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegisteredKernel")
            .field("impl_id", &self.impl_id)
            .field("op_kind", &self.op_kind)
            .field("op_name", &self.op_name)
            .field("backend", &self.backend)
            .field("priority", &self.priority)
            .field("operation", &self.operation.is_some())
            .finish_non_exhaustive()
    }
}

/// One runner the plugin registered, copied out of `init`.
#[derive(Clone)]
pub struct RegisteredRunner {
    /// The runner id, unique across the registry.
    pub runner_id: RunnerId,
    /// Selection priority: higher wins, ties go to the smaller runner id.
    pub priority: i32,
    /// The loader's owned copy of the C runner descriptor and its extensions (see
    /// [`RegisteredKernel::raw`]).
    pub raw: Arc<dyn Any + Send + Sync>,
}

impl fmt::Debug for RegisteredRunner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegisteredRunner")
            .field("runner_id", &self.runner_id)
            .field("priority", &self.priority)
            .finish_non_exhaustive()
    }
}

/// A successfully loaded plugin: its library and everything it registered.
#[derive(Debug, Clone)]
pub struct LoadedPlugin {
    /// The open library; the registrations' code lives in it.
    pub library: Arc<dyn LoadedLibrary>,
    /// The kernels `init` registered, in registration order.
    pub kernels: Vec<RegisteredKernel>,
    /// The runners `init` registered, in registration order.
    pub runners: Vec<RegisteredRunner>,
}

/// Opens plugin libraries. Implementations: the dlopen loader (`adapters-posix`) and in-memory
/// fakes for tests.
#[cfg_attr(feature = "mocks", mockall::automock)]
pub trait PluginLoader: Send + Sync {
    /// Loads the plugin that `request` names. See the module documentation for what success and
    /// failure guarantee.
    fn load(&self, request: &LoadRequest) -> Result<LoadedPlugin, LoadError>;
}

/// What went wrong while loading.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LoadErrorKind {
    /// The library could not be opened (missing file, unresolved symbol, wrong architecture).
    #[error("cannot open the library: {reason}")]
    Open {
        /// What the dynamic loader said.
        reason: String,
    },
    /// The library has no `guild_plugin_entry_v1`: it is not a Guild plugin.
    #[error("it does not export {symbol}; it is not a Guild plugin")]
    MissingEntry {
        /// The symbol looked for.
        symbol: &'static str,
    },
    /// The entry point returned NULL or a descriptor the host cannot read.
    #[error("its plugin descriptor is unusable: {reason}")]
    BadDescriptor {
        /// What is wrong with it.
        reason: String,
    },
    /// The plugin's Kernel ABI range does not contain the host's.
    #[error("it supports Kernel ABI {min}..={max}, and this host implements {host}")]
    AbiMismatch {
        /// The lowest Kernel ABI the plugin runs under.
        min: PackedVersion,
        /// The highest Kernel ABI the plugin runs under.
        max: PackedVersion,
        /// The Kernel ABI the host implements.
        host: PackedVersion,
    },
    /// `init` returned an error status.
    #[error("init failed with status {status} ({status_name}){}", describe_error(.component, .message))]
    InitFailed {
        /// The `guild_status_t` it returned.
        status: i32,
        /// That status's `GUILD_STATUS_*` name.
        status_name: &'static str,
        /// The component its error record named (may be empty).
        component: String,
        /// The message its error record held (may be empty).
        message: String,
    },
    /// A registration was refused during `init` (a malformed descriptor or extension, a
    /// duplicate impl id, a call from another thread).
    #[error("registration refused: {reason}")]
    RegistrationRefused {
        /// Why the host refused it.
        reason: String,
    },
    /// What `init` registered differs from what the manifest declares.
    #[error(
        "it registered {}, but its manifest declares {}",
        list_or_none(.registered),
        list_or_none(.declared)
    )]
    RegistrationMismatch {
        /// The ids `init` registered.
        registered: Vec<String>,
        /// The ids the manifest lists.
        declared: Vec<String>,
    },
}

fn describe_error(component: &str, message: &str) -> String {
    match (component.is_empty(), message.is_empty()) {
        (true, true) => String::new(),
        (true, false) => format!(": {message}"),
        (false, true) => format!(" in {component}"),
        (false, false) => format!(" in {component}: {message}"),
    }
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "nothing".into()
    } else {
        format!("[{}]", items.join(", "))
    }
}

/// A failed load, naming the package and its library.
#[derive(Debug)]
pub struct LoadError {
    /// Boxed to keep `Result<_, LoadError>` small on the success path.
    pub kind: Box<LoadErrorKind>,
    /// The package that failed to load.
    pub package: PackageId,
    /// Its version.
    pub version: Version,
    /// The library that was opened (or not).
    pub library: PathBuf,
    /// The underlying error, when there is one.
    pub source: Option<Box<dyn StdError + Send + Sync>>,
}

impl LoadError {
    /// A failure of `request`.
    pub fn new(kind: LoadErrorKind, request: &LoadRequest) -> Self {
        LoadError {
            kind: Box::new(kind),
            package: request.package.clone(),
            version: request.version.clone(),
            library: request.library.clone(),
            source: None,
        }
    }

    /// Attaches the underlying error.
    pub fn with_source(mut self, source: impl Into<Box<dyn StdError + Send + Sync>>) -> Self {
        self.source = Some(source.into());
        self
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "loading {}@{} ({}): {}",
            self.package,
            self.version,
            self.library.display(),
            self.kind
        )
    }
}

impl StdError for LoadError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}
