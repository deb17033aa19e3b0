//! What a registered kernel or runner provides, as the app reaches it: the typed interface a
//! loader puts behind every [`RegisteredKernel`](crate::loader::RegisteredKernel) and
//! [`RegisteredRunner`](crate::loader::RegisteredRunner), so that the operation service, the
//! model runners and the bound extension tables never need to know which loader made them.
//!
//! The interface speaks the ABI mirror's `#[repr(C)]` types, because the Kernel ABI is the
//! contract between host and provider: the C face of the operation service hands a caller's
//! tensor array and error record to [`KernelProvider::execute`] as they are, with nothing
//! converted per call, and the dlopen loader's implementation hands them on to the plugin's
//! callback the same way. A provider written in Rust (the fakes') reads the same structs
//! through the safe accessors of [`QueryCall`] and [`ExecuteCall`].
//!
//! Every method has a default that offers nothing (no GOP1 callbacks, no tables), so a
//! provider implements only what it has.
//!
//! The tables a provider returns ([`KernelProvider::cpu_backend`] and the CUDA ones,
//! [`RunnerProvider::model`]) hold function pointers and `user_data` that the app calls as the
//! extension's header describes. A provider promises that they stay callable for as long as the
//! [`LoadedLibrary`](crate::loader::LoadedLibrary) it was registered with lives; whoever calls
//! them holds that library (through a binding).

use std::any::Any;
use std::ffi::c_void;
use std::fmt;

pub use guild_abi::call::{ExecuteCall, QueryCall};
use guild_abi::text::set_error;
use guild_abi::{
    guild_cpu_backend_ext_v2_t, guild_cuda_attn_ext_v1_t, guild_cuda_dense_ext_v1_t,
    guild_cuda_moe_ext_v1_t, guild_cuda_qwen_group_v1_t, guild_error_info_t,
    guild_execute_args_v1_t, guild_kernel_op_desc_v1_t, guild_operation_ext_v1_t,
    guild_runner_desc_v1_t, guild_runner_model_ext_v1_t, guild_scratch_request_v1_t,
    guild_status_t, GUILD_STATUS_ERR_UNSUPPORTED,
};

/// A GOP1 `execute` callback and the `user_data` it is called with; see
/// [`KernelProvider::execute_entry`].
#[derive(Debug, Clone, Copy)]
pub struct ExecuteEntry {
    /// The callback.
    pub execute: unsafe extern "C" fn(
        *mut c_void,
        *const guild_execute_args_v1_t,
        *mut guild_error_info_t,
    ) -> guild_status_t,
    /// Its first argument.
    pub user_data: *mut c_void,
}

/// The component named in the error records the defaults write.
pub const PROVIDER_COMPONENT: &str = "guild.provider";

/// One negotiated extension table: the table in this host's layout (fields the provider did not
/// carry are zero), the layout version the provider declared, and the optional callbacks it does
/// not offer, in field order.
pub struct ExtensionTable<'a, T> {
    /// The table.
    pub table: &'a T,
    /// The layout version the provider declared.
    pub version: u32,
    /// The optional callbacks the table does not offer, in field order.
    pub absent_callbacks: Vec<&'static str>,
}

impl<T> fmt::Debug for ExtensionTable<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExtensionTable")
            .field("version", &self.version)
            .field("absent_callbacks", &self.absent_callbacks)
            .finish_non_exhaustive()
    }
}

/// Fills `error` with the refusal of a provider that has no GOP1 callbacks, and returns its
/// status (`GUILD_STATUS_ERR_UNSUPPORTED`): what the defaults of [`KernelProvider`] answer.
pub fn no_operation(error: &mut guild_error_info_t) -> guild_status_t {
    set_error(
        error,
        GUILD_STATUS_ERR_UNSUPPORTED,
        PROVIDER_COMPONENT,
        "the provider has no operation callbacks to negotiate with",
    );
    GUILD_STATUS_ERR_UNSUPPORTED
}

/// What one registered kernel provides: the GOP1 callbacks of a `GUILD_OP_CUSTOM` kernel, and
/// the descriptor and extension tables the app may bind. See the module documentation.
///
/// The GOP1 methods follow module_abi.h: they return a `guild_status_t`, fill `error` on
/// failure, and may be called from any thread. `validate` and `query_scratch` are negotiation
/// callbacks (they must not retain the query); `execute` runs on the host's checked call and may
/// call the operation service itself.
///
/// `Any` is a supertrait so that a test can recognise its own provider behind a binding; the
/// app never downcasts a provider.
pub trait KernelProvider: Any + Send + Sync + fmt::Debug {
    /// GOP1 `validate`: whether the provider serves `query`.
    fn validate(&self, query: QueryCall<'_>, error: &mut guild_error_info_t) -> guild_status_t {
        let _ = query;
        no_operation(error)
    }

    /// GOP1 `query_scratch`: the scratch (sizes and alignment) an execute of `query` needs,
    /// written into `scratch` on success.
    fn query_scratch(
        &self,
        query: QueryCall<'_>,
        scratch: &mut guild_scratch_request_v1_t,
        error: &mut guild_error_info_t,
    ) -> guild_status_t {
        let _ = (query, scratch);
        no_operation(error)
    }

    /// GOP1 `execute`: runs one call the host has checked against the negotiated contract.
    /// This is the operation service's hot path: the call and record are the caller's own.
    fn execute(&self, call: ExecuteCall<'_>, error: &mut guild_error_info_t) -> guild_status_t {
        let _ = call;
        no_operation(error)
    }

    /// The C function and `user_data` that [`KernelProvider::execute`] hands every call to,
    /// when it is exactly that call and nothing more (the dlopen loader's plugins): the
    /// operation service then calls the function itself, with arguments it has checked as
    /// [`ExecuteCall::new`] requires, sparing each call the trait's indirection. The function
    /// stays callable for as long as the provider's library is loaded, like the tables'. `None`
    /// (the default) keeps every call on `execute`.
    fn execute_entry(&self) -> Option<ExecuteEntry> {
        None
    }

    /// The host's copy of the C kernel descriptor, when there is one (the dlopen loader always
    /// has one; its pointers lead into memory the provider owns), for `describe`.
    fn descriptor(&self) -> Option<&guild_kernel_op_desc_v1_t> {
        None
    }

    /// The host's copy of the GOP1 extension, when there is one, for `describe`.
    fn operation(&self) -> Option<&guild_operation_ext_v1_t> {
        None
    }

    /// The CPE1 / CPU backend table of a `GUILD_OP_BATCHED_EXPERT_EXEC` CPU kernel, in the v2
    /// layout whatever the declared version.
    fn cpu_backend(&self) -> Option<ExtensionTable<'_, guild_cpu_backend_ext_v2_t>> {
        None
    }

    /// The CDD1 (CUDA dense projections) table of a CUDA kernel.
    fn cuda_dense(&self) -> Option<ExtensionTable<'_, guild_cuda_dense_ext_v1_t>> {
        None
    }

    /// The CDA1 (CUDA attention) table of a CUDA kernel.
    fn cuda_attn(&self) -> Option<ExtensionTable<'_, guild_cuda_attn_ext_v1_t>> {
        None
    }

    /// The CDM1 (CUDA mixture-of-experts) table of a CUDA kernel; its `qwen` is NULL or
    /// [`cuda_qwen`](Self::cuda_qwen)'s table.
    fn cuda_moe(&self) -> Option<ExtensionTable<'_, guild_cuda_moe_ext_v1_t>> {
        None
    }

    /// The Qwen specialization group of the CDM1 table, when it has one.
    fn cuda_qwen(&self) -> Option<ExtensionTable<'_, guild_cuda_qwen_group_v1_t>> {
        None
    }
}

/// What one registered runner provides: its C descriptor (`create`, `destroy`, `user_data`)
/// and its RMD1 model-description table, which model selection calls. See the module
/// documentation.
pub trait RunnerProvider: Any + Send + Sync + fmt::Debug {
    /// The host's copy of the C runner descriptor, when there is one.
    fn descriptor(&self) -> Option<&guild_runner_desc_v1_t> {
        None
    }

    /// The RMD1 extension, when the runner has one.
    fn model(&self) -> Option<ExtensionTable<'_, guild_runner_model_ext_v1_t>> {
        None
    }
}

/// A provider that offers nothing: the payload of registrations that only exist to be listed,
/// ranked or counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NoCallbacks;

impl KernelProvider for NoCallbacks {}
impl RunnerProvider for NoCallbacks {}
