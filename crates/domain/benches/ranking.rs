//! Benchmarks the ranking: `resolve` over 256 candidates of one operation with a provider whose
//! negotiation callbacks do nothing, so that the figures are the domain's own cost (static
//! checks, sorting, verdicts). Goal: under 20 µs.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use guild_domain::ids::{ImplId, OpName};
use guild_domain::operation::{
    resolve, Arity, Backend, BackendSet, Budget, Capabilities, CpuIsa, DType, DeviceCaps,
    LayoutSet, MemorySpace, MemorySpaceSet, Negotiator, Numerics, OpCandidate, OpQuery,
    ProviderRefusal, QuerySpec, ScratchRequest, SyncMode, SyncModeSet, TensorDesc,
};
use guild_domain::version::PackedVersion;

const OP: &str = "example.sequence.inclusive_scan";

/// Accepts everything and asks for no scratch.
struct NoOp;

impl Negotiator for NoOp {
    fn validate(&self, _: usize, _: &OpCandidate, _: &OpQuery<'_>) -> Result<(), ProviderRefusal> {
        Ok(())
    }

    fn query_scratch(
        &self,
        _: usize,
        _: &OpCandidate,
        _: &OpQuery<'_>,
    ) -> Result<ScratchRequest, ProviderRefusal> {
        Ok(ScratchRequest::default())
    }
}

fn version(text: &str) -> PackedVersion {
    PackedVersion::parse(text).expect("benchmark version parses")
}

fn spec() -> QuerySpec {
    let tensor = |addr| {
        TensorDesc::new(DType::F32, &[4096, 32], MemorySpace::Host)
            .with_strides(&[0, 8192])
            .with_data_addr(addr)
    };
    QuerySpec {
        op_name: OpName::new(OP).expect("benchmark op name is valid"),
        min_version: version("1.0.0"),
        max_version: version("1.9.0"),
        backends: BackendSet::CPU | BackendSet::CUDA,
        capabilities: Capabilities::from_bits(0b1),
        numerics: Numerics::EMPTY,
        sync_mode: SyncMode::HostBlocking,
        inputs: vec![tensor(0x10_0000), tensor(0x20_0000)],
        outputs: vec![tensor(0x30_0000)],
        ram_budget: Budget::bytes(1 << 30),
        vram_budget: Budget::UNLIMITED,
        exact_impl: None,
        device: DeviceCaps {
            device_id: 0,
            cuda_sm: Some(86),
            cpu_isa: CpuIsa::from_bits(0b111),
        },
    }
}

/// Candidate `i` of `n`, compatible with [`query`]. Priorities repeat every 8 so that many
/// comparisons fall through to the impl id, and ids share a long prefix as real ones do.
fn candidate(i: usize) -> OpCandidate {
    OpCandidate {
        impl_id: ImplId::new(format!("org.example.scan.variant_{:03}", (i * 37) % 256))
            .expect("benchmark impl id is valid"),
        op_name: OpName::new(OP).expect("benchmark op name is valid"),
        backend: Backend::Cpu,
        priority: i32::try_from(i % 8).unwrap_or(0),
        op_version: version("1.2.0"),
        capabilities: Capabilities::from_bits(0b11),
        numerics: Numerics::from_bits(0b1),
        input_dtype: DType::F32,
        output_dtype: DType::F32,
        inputs: Arity::new(1, 4),
        outputs: Arity::exactly(1),
        layouts: LayoutSet::CONTIGUOUS | LayoutSet::OUTER_STRIDED,
        memory_spaces: MemorySpaceSet::HOST | MemorySpaceSet::HOST_PINNED,
        min_alignment: 64,
        min_rank: 1,
        max_rank: 4,
        max_dim: [1 << 20; 8],
        max_batch: 1 << 16,
        sync_modes: SyncModeSet::HOST_BLOCKING | SyncModeSet::STREAM_ORDERED,
        min_sm: 0,
        max_sm: 0,
        cpu_isa: CpuIsa::from_bits(0b1),
    }
}

/// Breaks candidate `c` at one of several stages of the static checks, chosen by `k`, so that
/// rejections happen early, midway and late.
fn break_statically(c: &mut OpCandidate, k: usize) {
    match k % 6 {
        0 => c.op_version = version("2.0.0"),
        1 => c.backend = Backend::Hip,
        2 => c.sync_modes = SyncModeSet::STREAM_ORDERED,
        3 => c.max_rank = 1,
        4 => c.layouts = LayoutSet::CONTIGUOUS,
        _ => c.cpu_isa = CpuIsa::from_bits(0x100),
    }
}

fn ranking(crit: &mut Criterion) {
    let spec = spec();
    let q = OpQuery::new(&spec).expect("benchmark query is valid");

    let compatible: Vec<OpCandidate> = (0..256).map(candidate).collect();
    crit.bench_function("resolve 256 candidates, all compatible", |b| {
        b.iter(|| resolve(black_box(&q), black_box(&compatible), &NoOp))
    });

    let mostly_rejected: Vec<OpCandidate> = (0..256)
        .map(|i| {
            let mut c = candidate(i);
            // One candidate in sixteen survives.
            if i % 16 != 0 {
                break_statically(&mut c, i);
            }
            c
        })
        .collect();
    crit.bench_function("resolve 256 candidates, 240 rejected statically", |b| {
        b.iter(|| resolve(black_box(&q), black_box(&mostly_rejected), &NoOp))
    });

    let competing: Vec<OpCandidate> = (0..64).map(candidate).collect();
    crit.bench_function("resolve 64 candidates, all compatible", |b| {
        b.iter(|| resolve(black_box(&q), black_box(&competing), &NoOp))
    });
}

criterion_group!(benches, ranking);
criterion_main!(benches);
