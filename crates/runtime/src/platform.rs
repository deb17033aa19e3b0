//! The platform this host runs on, and whether a package was built for it.

use guild_domain::operation::CpuIsa;

// What a package must match and why it may not: pure rules, kept in the domain so that the
// package service and the runtime share them without naming each other.
pub use guild_domain::platform::{HostPlatform, PlatformMismatch};

/// The `GUILD_CPU_ISA_*` bits of the CPU this process runs on, detected at run time.
pub fn cpu_isa() -> CpuIsa {
    let mut bits = 0u64;
    #[cfg(target_arch = "x86_64")]
    {
        let features = [
            (std::arch::is_x86_feature_detected!("sse4.2"), 0),
            (std::arch::is_x86_feature_detected!("avx"), 1),
            (std::arch::is_x86_feature_detected!("avx2"), 2),
            (std::arch::is_x86_feature_detected!("fma"), 3),
            (std::arch::is_x86_feature_detected!("f16c"), 4),
            (std::arch::is_x86_feature_detected!("avx512f"), 5),
            (std::arch::is_x86_feature_detected!("avx512bw"), 6),
            (std::arch::is_x86_feature_detected!("avx512vnni"), 7),
            (std::arch::is_x86_feature_detected!("avx512bf16"), 8),
            (std::arch::is_x86_feature_detected!("avxvnni"), 9),
        ];
        for (present, bit) in features {
            if present {
                bits |= 1 << bit;
            }
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        let features = [
            (std::arch::is_aarch64_feature_detected!("neon"), 32),
            (std::arch::is_aarch64_feature_detected!("dotprod"), 33),
            (std::arch::is_aarch64_feature_detected!("i8mm"), 34),
            (std::arch::is_aarch64_feature_detected!("sve"), 35),
            (std::arch::is_aarch64_feature_detected!("sve2"), 36),
        ];
        for (present, bit) in features {
            if present {
                bits |= 1 << bit;
            }
        }
    }
    CpuIsa::from_bits(bits)
}

/// The bits of `required` this CPU lacks (empty: a kernel needing `required` can run here).
pub fn lacking(required: CpuIsa) -> CpuIsa {
    if required.is_empty() {
        return required;
    }
    required.difference(cpu_isa())
}

/// One CUDA device as the driver reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CudaDevice {
    /// The device ordinal (what `guild_device_caps_v1_t.device_id` holds).
    pub ordinal: i32,
    /// The marketing name.
    pub name: String,
    /// Compute capability times ten (9.0 -> 90), as the operation service compares it.
    pub sm: u32,
    /// Device memory in bytes.
    pub total_memory: u64,
}

/// Why the CUDA devices could not be listed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CudaUnavailable {
    /// The driver could not be opened or queried (no driver, no device, an old driver...).
    #[error(transparent)]
    Driver(Box<dyn std::error::Error + Send + Sync>),
    /// This host was built without the `cuda` feature: it has no CUDA adapter to ask.
    #[error("built without CUDA support")]
    NotBuilt,
}

/// The CUDA devices the driver reports (an empty list when it is loaded but sees none), for
/// diagnostics such as `guild doctor`; the operation service itself uses
/// [`DeviceSupport::detect`](crate::operations::DeviceSupport::detect).
#[cfg(feature = "cuda")]
pub fn cuda_devices() -> Result<Vec<CudaDevice>, CudaUnavailable> {
    let devices = guild_adapters_cuda::probe().map_err(|e| CudaUnavailable::Driver(Box::new(e)))?;
    Ok(devices
        .into_iter()
        .map(|d| CudaDevice {
            ordinal: d.ordinal,
            name: d.name,
            sm: d.sm,
            total_memory: d.total_memory,
        })
        .collect())
}

/// Without the `cuda` feature there is no driver to ask: always [`CudaUnavailable::NotBuilt`].
#[cfg(not(feature = "cuda"))]
pub fn cuda_devices() -> Result<Vec<CudaDevice>, CudaUnavailable> {
    Err(CudaUnavailable::NotBuilt)
}
