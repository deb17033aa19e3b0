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
use guild_domain::operation::{Backend, CpuIsa, OpCandidate};
use guild_domain::version::{PackedVersion, Version};

use crate::provider::{KernelProvider, RunnerProvider};

/// The host's C operation service table (`guild_operation_service_v1_t`) for one plugin: its
/// address, which the loader puts into the optional tail of the host table it passes to `init`,
/// and the owner that keeps the table (and everything its entries reach) alive. The loader never
/// dereferences the address; it keeps `keep_alive` for as long as the library stays loaded and
/// drops it only after the library is closed, so that a plugin can call the table it copied
/// from any of its threads, at any time, shutdown included.
#[derive(Clone)]
pub struct ServiceTable {
    /// The table's address.
    pub address: usize,
    /// Keeps the table alive; held by the loaded library until after it is closed.
    pub keep_alive: Arc<dyn Any + Send + Sync>,
}

impl fmt::Debug for ServiceTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceTable")
            .field("address", &format_args!("{:#x}", self.address))
            .finish_non_exhaustive()
    }
}

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
///
/// Registration of a descriptor is not a promise of execution: a registered kernel and the
/// extension tables it carries have passed the loader's checks, but the app still chooses among
/// providers, may decline a table it cannot schedule, and binds callbacks only when it uses them.
/// It reaches them through [`provider`](Self::provider), never through a loader's own types.
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
    /// The CPU instruction sets the kernel's code needs (its descriptor's `required_cpu_isa`),
    /// whatever its backend: a device kernel's host-side code runs on the CPU too. The host
    /// neither selects nor binds nor executes a kernel where the CPU lacks one.
    pub required_cpu_isa: CpuIsa,
    /// The GOP1 contract in domain form, when the descriptor carries a GOP1 extension.
    pub operation: Option<OpCandidate>,
    /// What the kernel provides: its GOP1 callbacks, descriptor and extension tables, behind
    /// the port's interface whatever loader made it. Its callbacks may be called only while
    /// the library that registered the kernel is loaded.
    pub provider: Arc<dyn KernelProvider>,
}

impl fmt::Debug for RegisteredKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegisteredKernel")
            .field("impl_id", &self.impl_id)
            .field("op_kind", &self.op_kind)
            .field("op_name", &self.op_name)
            .field("backend", &self.backend)
            .field("priority", &self.priority)
            .field("required_cpu_isa", &self.required_cpu_isa)
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
    /// What the runner provides: its descriptor and RMD1 table (see
    /// [`RegisteredKernel::provider`]).
    pub provider: Arc<dyn RunnerProvider>,
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
    /// A registration was refused during `init` (a malformed descriptor, a duplicate impl id, a
    /// call from another thread). A refusal caused by one of a descriptor's extensions is
    /// reported as [`ExtensionRefused`](Self::ExtensionRefused) instead.
    #[error("registration refused: {reason}")]
    RegistrationRefused {
        /// Why the host refused it.
        reason: String,
    },
    /// A registration was refused during `init` because of one of its extensions (a size, tag,
    /// version, placement or callback the host cannot accept, or a malformed `next_ext` chain).
    #[error("registration refused: {refusal}{}", and_more(*.more))]
    ExtensionRefused {
        /// The first refusal of the load, in typed form.
        refusal: ExtensionRefusal,
        /// How many further registrations were refused in the same `init`.
        more: usize,
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

fn and_more(more: usize) -> String {
    if more == 0 {
        String::new()
    } else {
        format!(" (and {more} more)")
    }
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

// ---------------------------------------------------------------------------------------------
// Extension refusals
// ---------------------------------------------------------------------------------------------

/// The registration an extension refusal concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registrant {
    /// A kernel descriptor, by implementation id.
    Kernel(ImplId),
    /// A runner descriptor, by runner id.
    Runner(RunnerId),
}

impl fmt::Display for Registrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Registrant::Kernel(id) => write!(f, "kernel {id}"),
            Registrant::Runner(id) => write!(f, "runner {id}"),
        }
    }
}

/// An extension tag: four ASCII characters packed with the first one in the most significant
/// byte, as `GUILD_MAKE_TAG` packs them.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExtensionTag(pub u32);

impl ExtensionTag {
    /// The tag spelled by four characters, e.g. `ExtensionTag::from_chars(*b"CPE1")`.
    pub const fn from_chars(chars: [u8; 4]) -> Self {
        ExtensionTag(u32::from_be_bytes(chars))
    }
}

impl fmt::Display for ExtensionTag {
    /// The four characters when they are printable ASCII (`GOP1`), else the value in hex.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = self.0.to_be_bytes();
        if bytes.iter().all(u8::is_ascii_graphic) {
            bytes
                .iter()
                .try_for_each(|&b| write!(f, "{}", char::from(b)))
        } else {
            write!(f, "{:#010x}", self.0)
        }
    }
}

impl fmt::Debug for ExtensionTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ExtensionTag({self})")
    }
}

/// Where a refused extension was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtensionSite {
    /// The extension at this position of the descriptor's `next_ext` chain, counted from 0.
    Chain(usize),
    /// The table `kernel_fns` points at (PFKE, for `GUILD_OP_PREFILL_KERNELS`).
    KernelFns,
    /// The Qwen group that the CDM1 extension at this chain position points at.
    QwenGroup(usize),
}

/// What was wrong with an extension.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExtensionProblem {
    /// `struct_size` does not even cover the extension header.
    HeaderTooSmall {
        /// The declared `struct_size`.
        struct_size: u32,
        /// The header's size.
        header_size: u32,
    },
    /// `struct_size` is smaller than the first published layout of the extension's version.
    TooSmall {
        /// The layout version the extension declares.
        version: u32,
        /// The declared `struct_size`.
        struct_size: u32,
        /// The smallest `struct_size` of that version.
        minimum: u32,
        /// The C type whose size that minimum is.
        layout: String,
    },
    /// A consumed tag with a layout version this host does not know.
    UnknownVersion {
        /// The declared version.
        version: u32,
        /// The versions this host reads, ascending.
        known: Vec<u32>,
    },
    /// The table found where one particular extension must be has another tag.
    WrongTag {
        /// The tag that belongs there.
        expected: ExtensionTag,
    },
    /// A tag that is never part of a `next_ext` chain was found in one.
    NotAChainExtension {
        /// Where that extension is reached instead.
        reached_through: String,
    },
    /// A consumed extension on a descriptor it does not belong to.
    Misplaced {
        /// The kind of descriptor it belongs on.
        belongs_on: String,
        /// What about this descriptor rules it out, when it is the right kind of descriptor
        /// but the wrong op kind or backend.
        conflict: Option<String>,
    },
    /// A second extension with the same consumed tag.
    Duplicate,
    /// A callback the extension requires is NULL (or lies past its `struct_size`).
    NullCallback {
        /// The callback's field name.
        callback: String,
    },
    /// An extension whose callbacks are each optional offers none of them.
    NoCallbacks {
        /// The callbacks' field names.
        callbacks: Vec<String>,
    },
    /// The chain links back to an earlier extension.
    Cycle {
        /// The position of the extension it links back to.
        links_back_to: usize,
    },
    /// The chain is longer than the host's bound.
    ChainTooLong {
        /// The bound.
        limit: usize,
    },
}

/// A registration refused because of one of its extensions: whose, where, which tag, and what
/// was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtensionRefusal {
    /// The kernel or runner that carried the extension.
    pub registrant: Registrant,
    /// Where the extension was found.
    pub site: ExtensionSite,
    /// Its tag; `None` when its header was too short to hold one, or when the chain as a whole
    /// is at fault.
    pub tag: Option<ExtensionTag>,
    /// What was wrong.
    pub problem: ExtensionProblem,
}

impl ExtensionRefusal {
    /// How the text names the extension: `extension 2 (CPE1)`, `its PFKE table`, ...
    fn subject(&self) -> String {
        let tag = self.tag.map(|t| t.to_string());
        match (self.site, tag) {
            (ExtensionSite::Chain(i), Some(tag)) => format!("extension {i} ({tag})"),
            (ExtensionSite::Chain(i), None) => format!("extension {i}"),
            (ExtensionSite::KernelFns, Some(tag)) => format!("its {tag} table"),
            (ExtensionSite::KernelFns, None) => "its kernel_fns table".into(),
            (ExtensionSite::QwenGroup(i), Some(tag)) => {
                format!("the qwen group ({tag}) of extension {i} (CDM1)")
            }
            (ExtensionSite::QwenGroup(i), None) => {
                format!("the qwen group of extension {i} (CDM1)")
            }
        }
    }

    /// The position in the chain, for the texts that are about the chain itself.
    fn index(&self) -> usize {
        match self.site {
            ExtensionSite::Chain(i) | ExtensionSite::QwenGroup(i) => i,
            ExtensionSite::KernelFns => 0,
        }
    }
}

impl fmt::Display for ExtensionRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tag = self
            .tag
            .map_or_else(|| "an unknown tag".to_string(), |t| t.to_string());
        let subject = self.subject();
        let index = self.index();
        write!(f, "{}: ", self.registrant)?;
        match &self.problem {
            ExtensionProblem::HeaderTooSmall {
                struct_size,
                header_size,
            } => write!(
                f,
                "{subject} declares struct_size {struct_size}, smaller than the \
                 {header_size}-byte extension header"
            ),
            ExtensionProblem::TooSmall {
                struct_size,
                minimum,
                layout,
                ..
            } => write!(
                f,
                "{subject} declares struct_size {struct_size}, smaller than the {minimum} bytes \
                 of {layout}"
            ),
            ExtensionProblem::UnknownVersion { version, known } => {
                let list: Vec<String> = known.iter().map(u32::to_string).collect();
                let known = match list.split_last() {
                    Some((last, [])) => format!("version {last}"),
                    Some((last, rest)) => format!("versions {} and {last}", rest.join(", ")),
                    None => "no version".into(),
                };
                write!(
                    f,
                    "{subject} has version {version}; this host reads {known}"
                )
            }
            ExtensionProblem::WrongTag { expected } => match self.site {
                ExtensionSite::KernelFns => write!(
                    f,
                    "kernel_fns of a GUILD_OP_PREFILL_KERNELS kernel has tag {tag}, not {expected}"
                ),
                ExtensionSite::QwenGroup(i) => write!(
                    f,
                    "the qwen group of extension {i} (CDM1) has tag {tag}, not {expected}"
                ),
                ExtensionSite::Chain(i) => {
                    write!(f, "extension {i} has tag {tag}, not {expected}")
                }
            },
            ExtensionProblem::NotAChainExtension { reached_through } => write!(
                f,
                "extension {index} has the {tag} tag, but {tag} is reached through \
                 {reached_through} and is not a next_ext extension"
            ),
            ExtensionProblem::Misplaced {
                belongs_on,
                conflict,
            } => match conflict {
                Some(conflict) => write!(f, "extension {index} is {tag}, but {conflict}"),
                None => write!(
                    f,
                    "extension {index} is {tag}, which belongs on {belongs_on}"
                ),
            },
            ExtensionProblem::Duplicate => {
                write!(f, "extension {index} is a second {tag} extension")
            }
            ExtensionProblem::NullCallback { callback } => write!(
                f,
                "{subject} has a NULL {callback} callback, which {tag} requires"
            ),
            ExtensionProblem::NoCallbacks { callbacks } => write!(
                f,
                "{subject} offers none of its callbacks ({}); {tag} needs at least one",
                callbacks.join(", ")
            ),
            ExtensionProblem::Cycle { links_back_to } => write!(
                f,
                "the next_ext chain has a cycle: {subject} links back to extension \
                 {links_back_to}"
            ),
            ExtensionProblem::ChainTooLong { limit } => {
                write!(f, "the next_ext chain is longer than {limit} extensions")
            }
        }
    }
}
