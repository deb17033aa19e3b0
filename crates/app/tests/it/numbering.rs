//! The domain names the ABI's numbers in its own types (it may not depend on `guild-abi`), so the
//! composition root, which sees both, proves that each number means the same thing on both sides.
//! A renumbering on either side fails here before any conversion can go wrong.

use guild_abi as abi;
use guild_domain::operation::{
    Backend, BackendSet, Budget, CpuIsa, DType, LayoutSet, MemorySpace, MemorySpaceSet, Numerics,
    SyncMode, SyncModeSet, MAX_TENSOR_RANK,
};
use guild_domain::version::PackedVersion;

#[test]
fn dtype_ids_agree() {
    let pairs = [
        (DType::F32, abi::GUILD_DTYPE_F32),
        (DType::F16, abi::GUILD_DTYPE_F16),
        (DType::Q4_0, abi::GUILD_DTYPE_Q4_0),
        (DType::Q4_1, abi::GUILD_DTYPE_Q4_1),
        (DType::Q5_0, abi::GUILD_DTYPE_Q5_0),
        (DType::Q5_1, abi::GUILD_DTYPE_Q5_1),
        (DType::Q8_0, abi::GUILD_DTYPE_Q8_0),
        (DType::Q8_1, abi::GUILD_DTYPE_Q8_1),
        (DType::Q2_K, abi::GUILD_DTYPE_Q2_K),
        (DType::Q3_K, abi::GUILD_DTYPE_Q3_K),
        (DType::Q4_K, abi::GUILD_DTYPE_Q4_K),
        (DType::Q5_K, abi::GUILD_DTYPE_Q5_K),
        (DType::Q6_K, abi::GUILD_DTYPE_Q6_K),
        (DType::Q8_K, abi::GUILD_DTYPE_Q8_K),
        (DType::I8, abi::GUILD_DTYPE_I8),
        (DType::I16, abi::GUILD_DTYPE_I16),
        (DType::I32, abi::GUILD_DTYPE_I32),
        (DType::I64, abi::GUILD_DTYPE_I64),
        (DType::F64, abi::GUILD_DTYPE_F64),
        (DType::BF16, abi::GUILD_DTYPE_BF16),
        (DType::ANY, abi::GUILD_DTYPE_ANY),
    ];
    for (domain, c) in pairs {
        assert_eq!(domain.raw(), c, "{domain:?}");
    }
    // Every id the domain knows is covered above: the known ids are exactly these.
    let known = (0..64).filter(|&id| DType::from_raw(id).is_known()).count();
    assert_eq!(known, pairs.len() - 1);
}

#[test]
fn bit_sets_agree() {
    assert_eq!(Backend::Cpu.bit(), abi::GUILD_BACKEND_CPU);
    assert_eq!(Backend::Cuda.bit(), abi::GUILD_BACKEND_CUDA);
    assert_eq!(Backend::Hip.bit(), abi::GUILD_BACKEND_HIP);
    assert_eq!(
        BackendSet::KNOWN.bits(),
        abi::GUILD_BACKEND_CPU | abi::GUILD_BACKEND_CUDA | abi::GUILD_BACKEND_HIP
    );

    assert_eq!(LayoutSet::CONTIGUOUS.bits(), abi::GUILD_LAYOUT_CONTIGUOUS);
    assert_eq!(
        LayoutSet::OUTER_STRIDED.bits(),
        abi::GUILD_LAYOUT_OUTER_STRIDED
    );

    assert_eq!(MemorySpace::Host.bit(), abi::GUILD_MEMORY_HOST);
    assert_eq!(MemorySpace::HostPinned.bit(), abi::GUILD_MEMORY_HOST_PINNED);
    assert_eq!(MemorySpace::Device.bit(), abi::GUILD_MEMORY_DEVICE);
    assert_eq!(MemorySpace::Managed.bit(), abi::GUILD_MEMORY_MANAGED);
    assert_eq!(MemorySpaceSet::KNOWN.bits(), 0xf);

    for (mode, raw) in [
        (SyncMode::HostBlocking, abi::GUILD_SYNC_HOST_BLOCKING),
        (SyncMode::StreamOrdered, abi::GUILD_SYNC_STREAM_ORDERED),
        (SyncMode::GraphCapturable, abi::GUILD_SYNC_GRAPH_CAPTURABLE),
    ] {
        assert_eq!(mode.raw(), raw);
        assert_eq!(mode.bit(), abi::guild_sync_bit(raw));
    }
    assert_eq!(
        SyncModeSet::GRAPH_CAPTURABLE.bits(),
        abi::guild_sync_bit(abi::GUILD_SYNC_GRAPH_CAPTURABLE)
    );

    assert_eq!(
        Numerics::DETERMINISTIC.bits(),
        abi::GUILD_NUMERICS_DETERMINISTIC
    );
    assert_eq!(
        Numerics::F32_ACCUMULATION.bits(),
        abi::GUILD_NUMERICS_F32_ACCUMULATION
    );
    assert_eq!(
        Numerics::ORDERED_REDUCTION.bits(),
        abi::GUILD_NUMERICS_ORDERED_REDUCTION
    );
    assert_eq!(
        Numerics::EXACT_INTEGER.bits(),
        abi::GUILD_NUMERICS_EXACT_INTEGER
    );

    let isa = [
        (CpuIsa::SSE4_2, abi::GUILD_CPU_ISA_SSE4_2),
        (CpuIsa::AVX, abi::GUILD_CPU_ISA_AVX),
        (CpuIsa::AVX2, abi::GUILD_CPU_ISA_AVX2),
        (CpuIsa::FMA, abi::GUILD_CPU_ISA_FMA),
        (CpuIsa::F16C, abi::GUILD_CPU_ISA_F16C),
        (CpuIsa::AVX512F, abi::GUILD_CPU_ISA_AVX512F),
        (CpuIsa::AVX512BW, abi::GUILD_CPU_ISA_AVX512BW),
        (CpuIsa::AVX512_VNNI, abi::GUILD_CPU_ISA_AVX512_VNNI),
        (CpuIsa::AVX512_BF16, abi::GUILD_CPU_ISA_AVX512_BF16),
        (CpuIsa::AVX_VNNI, abi::GUILD_CPU_ISA_AVX_VNNI),
        (CpuIsa::NEON, abi::GUILD_CPU_ISA_NEON),
        (CpuIsa::ARM_DOTPROD, abi::GUILD_CPU_ISA_ARM_DOTPROD),
        (CpuIsa::ARM_I8MM, abi::GUILD_CPU_ISA_ARM_I8MM),
        (CpuIsa::SVE, abi::GUILD_CPU_ISA_SVE),
        (CpuIsa::SVE2, abi::GUILD_CPU_ISA_SVE2),
    ];
    let mut all = 0;
    for (domain, c) in isa {
        assert_eq!(domain.bits(), c);
        all |= c;
    }
    assert_eq!(CpuIsa::KNOWN.bits(), all);
}

#[test]
fn scalars_agree() {
    assert_eq!(MAX_TENSOR_RANK, abi::GUILD_MAX_TENSOR_RANK);
    assert_eq!(Budget::UNLIMITED.get(), abi::GUILD_BUDGET_UNLIMITED);
    assert_eq!(
        PackedVersion::KERNEL_ABI_V1.raw(),
        abi::GUILD_KERNEL_ABI_VERSION
    );
    assert_eq!(
        PackedVersion::new(1, 5, 0).unwrap().raw(),
        abi::guild_kernel_abi_make_version(
            abi::GUILD_SDK_VERSION_MAJOR,
            abi::GUILD_SDK_VERSION_MINOR,
            abi::GUILD_SDK_VERSION_PATCH
        )
    );
    assert_eq!(
        guild_domain::dependency::MODULE_ABI_TAG_V1.as_bytes(),
        abi::GUILD_MODULE_ABI_TAG_V1.to_bytes()
    );
    assert_eq!(
        guild_domain::dependency::MODULE_ABI_V1,
        abi::GUILD_MODULE_ABI_VERSION
    );
}
