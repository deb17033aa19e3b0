//! A CUDA kernel's CDD1 (dense projections), CDA1 (attention) and CDM1 (mixture of experts,
//! with its optional CDMQ Qwen group) tables, bound once with a lease on the package, the same
//! way [`BoundExpertTable`](crate::experts::BoundExpertTable) binds CPE1.
//!
//! The loader checked and copied each table at registration (tag, version, size, required
//! callbacks, placement on a CUDA kernel). [`BoundCudaTables::bind`] copies those copies by value
//! into a struct that holds the [`KernelBinding`], so the tables' callbacks stay loaded and the
//! package refuses disable, replace and rollback while it lives, and a model never looks the
//! kernel up again.
//!
//! The execution callbacks take device pointers and streams, which only a device adapter can
//! vouch for; this module offers safe wrappers for the host-side queries only (CDA1 `configure`,
//! CDM1 `query_workspace` for routing) and exposes the bound tables, read-only, to the code
//! that drives a device.

use std::ffi::CStr;
use std::fmt;
use std::mem::size_of;
use std::ptr;

use guild_abi::text::fixed_buffer_text;
use guild_abi::{
    guild_cuda_attn_config_args_v1_t, guild_cuda_attn_ext_v1_t, guild_cuda_dense_ext_v1_t,
    guild_cuda_moe_ext_v1_t, guild_cuda_moe_route_args_v1_t,
    guild_cuda_moe_workspace_query_args_v1_t, guild_cuda_qwen_group_v1_t, guild_error_info_t,
    guild_status_t, GUILD_BACKEND_CUDA, GUILD_CUDA_CONFIG_VALUE_INT, GUILD_CUDA_MOE_OP_ROUTE,
    GUILD_STATUS_OK,
};
use guild_domain::ids::{ImplId, PackageId};
use guild_ports::provider::ExtensionTable;
use thiserror::Error;

use crate::error::PluginReason;
use crate::experts::ExpertError;
use crate::registry::{KernelBinding, KernelRegistry};

/// Why a kernel binding could not become [`BoundCudaTables`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum CudaBindError {
    /// No kernel with this implementation id is registered (or its package is disabled).
    #[error("no kernel {0} is registered")]
    NoSuchKernel(ImplId),
    /// The kernel is not a CUDA kernel carrying CDD1, CDA1 or CDM1.
    #[error("kernel {0} carries no CDD1, CDA1 or CDM1 table")]
    NoCudaTables(ImplId),
}

/// A bound table of one tag: the plugin's table in this host's layout, and the optional
/// callbacks it does not offer.
#[derive(Debug, Clone)]
pub struct BoundTable<T> {
    table: T,
    version: u32,
    absent: Vec<&'static str>,
}

impl<T> BoundTable<T> {
    /// The table (fields the plugin's size did not carry are zero; `header.next` is NULL).
    pub fn table(&self) -> &T {
        &self.table
    }

    /// The layout version the plugin declared.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The optional callbacks the plugin does not offer, in field order.
    pub fn absent_callbacks(&self) -> &[&'static str] {
        &self.absent
    }
}

/// Copies a negotiated table out of the kernel's provider, cutting its link to the next copy.
fn bound<T: Copy>(
    lent: Option<ExtensionTable<'_, T>>,
    unlink: impl FnOnce(&mut T),
) -> Option<BoundTable<T>> {
    lent.map(|lent| {
        let mut table = *lent.table;
        unlink(&mut table);
        BoundTable {
            table,
            version: lent.version,
            absent: lent.absent_callbacks,
        }
    })
}

/// A CUDA kernel's CDD1, CDA1 and CDM1 tables (whichever it carries), bound with a lease.
pub struct BoundCudaTables {
    dense: Option<BoundTable<guild_cuda_dense_ext_v1_t>>,
    attn: Option<BoundTable<guild_cuda_attn_ext_v1_t>>,
    moe: Option<BoundTable<guild_cuda_moe_ext_v1_t>>,
    qwen: Option<BoundTable<guild_cuda_qwen_group_v1_t>>,
    // Last, so that the code the tables point into is released after everything else.
    binding: KernelBinding,
}

// SAFETY: the tables hold the plugin's function pointers and user_data, valid while `binding`
// lives and never written after bind; the CUDA extension headers make their callbacks callable
// from any host thread (each call names its own stream).
unsafe impl Send for BoundCudaTables {}
// SAFETY: as for Send: shared use only reads the tables and calls the callbacks.
unsafe impl Sync for BoundCudaTables {}

impl fmt::Debug for BoundCudaTables {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoundCudaTables")
            .field("impl_id", self.impl_id())
            .field("dense", &self.dense.is_some())
            .field("attn", &self.attn.is_some())
            .field("moe", &self.moe.is_some())
            .field("qwen", &self.qwen.is_some())
            .finish_non_exhaustive()
    }
}

impl BoundCudaTables {
    /// Binds the CDD1, CDA1 and CDM1 tables (and CDM1's Qwen group) of the CUDA kernel
    /// `binding` refers to. The binding moves in and keeps the package leased.
    pub fn bind(binding: KernelBinding) -> Result<Self, CudaBindError> {
        let refused = || CudaBindError::NoCudaTables(binding.kernel().impl_id.clone());
        if binding.kernel().backend.bit() != GUILD_BACKEND_CUDA {
            return Err(refused());
        }
        let kernel = binding.kernel().provider.as_ref();
        let dense = bound(kernel.cuda_dense(), |t| t.header.next = ptr::null());
        let attn = bound(kernel.cuda_attn(), |t| t.header.next = ptr::null());
        // The Qwen group is bound beside CDM1; the CDM1 copy no longer points at it.
        let moe = bound(kernel.cuda_moe(), |t| {
            t.header.next = ptr::null();
            t.qwen = ptr::null();
        });
        let qwen = bound(kernel.cuda_qwen(), |t| t.header.next = ptr::null());
        if dense.is_none() && attn.is_none() && moe.is_none() {
            return Err(refused());
        }
        Ok(BoundCudaTables {
            dense,
            attn,
            moe,
            qwen,
            binding,
        })
    }

    /// Binds the tables of the registered kernel `impl_id` (one registry lookup, now).
    pub fn bind_id(registry: &KernelRegistry, impl_id: &ImplId) -> Result<Self, CudaBindError> {
        let binding = registry
            .find_by_id(impl_id)
            .ok_or_else(|| CudaBindError::NoSuchKernel(impl_id.clone()))?;
        Self::bind(binding)
    }

    /// The provider kernel.
    pub fn impl_id(&self) -> &ImplId {
        &self.binding.kernel().impl_id
    }

    /// The package whose library holds the callbacks.
    pub fn package(&self) -> &PackageId {
        self.binding.package()
    }

    /// The CDD1 table, when the kernel carries one.
    pub fn dense(&self) -> Option<&BoundTable<guild_cuda_dense_ext_v1_t>> {
        self.dense.as_ref()
    }

    /// The CDA1 table, when the kernel carries one.
    pub fn attn(&self) -> Option<&BoundTable<guild_cuda_attn_ext_v1_t>> {
        self.attn.as_ref()
    }

    /// The CDM1 table, when the kernel carries one (its `qwen` pointer is NULL: see
    /// [`BoundCudaTables::qwen`]).
    pub fn moe(&self) -> Option<&BoundTable<guild_cuda_moe_ext_v1_t>> {
        self.moe.as_ref()
    }

    /// CDM1's Qwen group, when the CDM1 table pointed at one.
    pub fn qwen(&self) -> Option<&BoundTable<guild_cuda_qwen_group_v1_t>> {
        self.qwen.as_ref()
    }

    fn not_offered(&self, callback: &'static str) -> ExpertError {
        ExpertError::NotOffered {
            impl_id: self.impl_id().clone(),
            callback,
        }
    }

    /// Sets the CDA1 configuration key `key` to the integer `value` (CDA1 `configure`).
    pub fn configure_attn_int(&self, key: &CStr, value: i64) -> Result<(), ExpertError> {
        const NAME: &str = "configure";
        let attn = self.attn.as_ref().ok_or_else(|| self.not_offered(NAME))?;
        let f = attn.table.configure.ok_or_else(|| self.not_offered(NAME))?;
        let args = guild_cuda_attn_config_args_v1_t {
            struct_size: size_u32::<guild_cuda_attn_config_args_v1_t>(),
            value_kind: GUILD_CUDA_CONFIG_VALUE_INT,
            key: key.as_ptr(),
            int_value: value,
            float_value: 0.0,
            text_value: ptr::null(),
        };
        // SAFETY: the callback is loaded while `self.binding` lives; the args and the key are
        // live for the call.
        call(NAME, |e| unsafe { f(attn.table.user_data, &args, e) })
    }

    /// The workspace bytes CDM1 `route` needs for `token_count` tokens over `expert_count`
    /// experts choosing `top_k` (CDM1 `query_workspace`; no device memory is named).
    pub fn route_workspace(
        &self,
        gating: u32,
        token_count: u32,
        expert_count: u32,
        top_k: u32,
    ) -> Result<u64, ExpertError> {
        const NAME: &str = "query_workspace";
        let moe = self.moe.as_ref().ok_or_else(|| self.not_offered(NAME))?;
        let f = moe
            .table
            .query_workspace
            .ok_or_else(|| self.not_offered(NAME))?;
        // SAFETY: the route args are integers, floats and pointers; all-zero (NULL) is valid.
        let mut route: guild_cuda_moe_route_args_v1_t = unsafe { std::mem::zeroed() };
        route.struct_size = size_u32::<guild_cuda_moe_route_args_v1_t>();
        route.gating = gating;
        route.token_count = token_count;
        route.expert_count = expert_count;
        route.top_k = top_k;
        route.weight_scale = 1.0;
        let mut bytes = 0u64;
        let args = guild_cuda_moe_workspace_query_args_v1_t {
            struct_size: size_u32::<guild_cuda_moe_workspace_query_args_v1_t>(),
            operation: GUILD_CUDA_MOE_OP_ROUTE,
            op_args: (&raw const route).cast(),
            workspace_bytes_out: &mut bytes,
        };
        // SAFETY: the callback is loaded while `self.binding` lives; the route args and the
        // output are live locals for the call.
        call(NAME, |e| unsafe { f(moe.table.user_data, &args, e) })?;
        Ok(bytes)
    }
}

fn size_u32<T>() -> u32 {
    u32::try_from(size_of::<T>()).unwrap_or(u32::MAX)
}

fn call(
    callback: &'static str,
    f: impl FnOnce(*mut guild_error_info_t) -> guild_status_t,
) -> Result<(), ExpertError> {
    let mut error = guild_error_info_t::new();
    let status = f(&mut error);
    if status == GUILD_STATUS_OK {
        return Ok(());
    }
    Err(ExpertError::Provider {
        callback,
        reason: PluginReason {
            status,
            component: fixed_buffer_text(&error.component),
            message: fixed_buffer_text(&error.message),
        },
    })
}
