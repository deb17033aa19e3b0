//! The checks of one GOP1 operation, run in the check process against the provider the loader
//! registered: negotiation over generated tensor descriptors (at, inside and just outside the
//! declared bounds, each query asked twice and compared field by field before and after), then
//! executions on generated inputs in guard-paged buffers ([`super::guarded`]).
//!
//! The generator knows nothing of an operation's meaning. It looks for one query that `validate`
//! accepts among a few shapes that most operations take (every tensor of one shape, or outputs
//! reduced along the innermost axis), dtypes the contract allows, and the declared counts; every
//! query and execution carries the parameter record the publisher gave (`guild check --params`),
//! 8-byte aligned. Every later check starts from the accepted query. An operation that accepts
//! none of them (one that needs a parameter record that was not given, say) gets its later
//! checks skipped with `validate`'s first reason, which `guild check` reports as a failure to
//! check unless the publisher allows it.
//!
//! Out of bounds, `validate` is not asked at all. module_abi.h's rule is that the host refuses
//! every query outside what the GOP1 fields declare (rank, counts, extents, dtypes, layouts,
//! memory spaces, alignment) before it calls `validate`, so `validate` checks only what the
//! fields cannot express and may index its tensors by the declared counts; the
//! `validate.outside_bounds` finding names the variants the host refuses, as information.

use std::ffi::CString;
use std::ptr;
use std::sync::Arc;

use guild_abi::call::{ExecuteCall, QueryCall};
use guild_abi::text::{fixed_buffer_text, status_name};
use guild_abi::{
    guild_error_info_t, guild_execute_args_v1_t, guild_operation_ext_v1_t,
    guild_operation_query_v1_t, guild_scratch_request_v1_t, guild_status_t, guild_tensor_desc_v1_t,
    GUILD_BACKEND_CPU, GUILD_BUDGET_UNLIMITED, GUILD_DTYPE_ANY, GUILD_LAYOUT_OUTER_STRIDED,
    GUILD_MAX_TENSOR_RANK, GUILD_MEMORY_HOST, GUILD_NUMERICS_DETERMINISTIC,
    GUILD_OPERATION_QUERY_VERSION, GUILD_STATUS_OK, GUILD_SYNC_HOST_BLOCKING,
};
use guild_domain::operation::{CpuIsa, DType, MemorySpace, TensorDesc};
use guild_ports::provider::KernelProvider;

use super::guarded::{Flush, Guarded, CANARY};
use super::{Recorder, Verdict};

/// Dtypes tried, in order, where the contract leaves the dtype to `validate`.
const TRY_DTYPES: [DType; 8] = [
    DType::F32,
    DType::F64,
    DType::I32,
    DType::I64,
    DType::F16,
    DType::BF16,
    DType::I16,
    DType::I8,
];

/// Extents of the generated tensors, innermost first.
const DIMS: [u64; GUILD_MAX_TENSOR_RANK] = [5, 3, 2, 2, 2, 2, 2, 2];

/// Threads and executions per thread of the concurrency check.
const THREADS: usize = 4;
const RUNS_PER_THREAD: usize = 2;

/// Runs of the determinism check.
const REPEATS: usize = 3;

/// What the checks need to know of one GOP1 kernel.
pub(crate) struct Operation<'a> {
    /// `impl_id (op_name)`, as findings name it.
    pub label: String,
    pub op_name: CString,
    pub provider: &'a Arc<dyn KernelProvider>,
    pub gop: guild_operation_ext_v1_t,
    pub backend: u32,
    /// The instruction sets the kernel's descriptor requires that this CPU lacks (empty: it
    /// can run here).
    pub lacks_isa: CpuIsa,
    pub max_dim: [u64; GUILD_MAX_TENSOR_RANK],
    pub max_batch: u64,
    /// The package declares module dependencies, which the check process does not load.
    pub has_dependencies: bool,
    /// Told before every call into the provider (the parent's time limit is per call).
    pub lines: super::Lines,
    /// The parameter record every query and execution carries.
    pub params: &'a ParamRecord,
}

/// The operation parameter record the publisher gave (`guild check --params`), held in 8-byte
/// words so that its address has the alignment module_abi.h promises providers.
pub(crate) struct ParamRecord {
    words: Vec<u64>,
    len: usize,
}

impl ParamRecord {
    pub(crate) fn new(bytes: &[u8]) -> Self {
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        for (word, chunk) in words.iter_mut().zip(bytes.chunks(8)) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            *word = u64::from_ne_bytes(b);
        }
        ParamRecord {
            words,
            len: bytes.len(),
        }
    }

    /// The record's address, NULL when it is empty.
    fn ptr(&self) -> *const std::ffi::c_void {
        if self.len == 0 {
            ptr::null()
        } else {
            self.words.as_ptr().cast()
        }
    }
}

// SAFETY: the raw pointers in the copied GOP1 extension are only passed back to the provider,
// whose callbacks may be called from any thread (module_abi.h); the provider itself is Sync.
unsafe impl Sync for Operation<'_> {}

/// The tensors of one generated query or execution.
#[derive(Clone)]
struct Case {
    inputs: Vec<guild_tensor_desc_v1_t>,
    outputs: Vec<guild_tensor_desc_v1_t>,
    sync_mode: u32,
    /// What was changed from the accepted base, for the findings.
    note: String,
}

// SAFETY: a case's data pointers are NULL or made-up addresses that nothing dereferences; each
// execution copies the descriptors and points them at buffers of its own.
unsafe impl Sync for Case {}

/// The answer of one callback.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    status: guild_status_t,
    message: String,
}

impl Answer {
    fn ok(&self) -> bool {
        self.status == GUILD_STATUS_OK
    }

    fn text(&self) -> String {
        if self.message.is_empty() {
            status_name(self.status).to_owned()
        } else {
            format!("{} ({})", status_name(self.status), self.message)
        }
    }
}

fn tensor(dtype: u32, rank: u32, dims: &[u64], memory: u32) -> guild_tensor_desc_v1_t {
    let mut d = [0u64; GUILD_MAX_TENSOR_RANK];
    for (slot, &x) in d.iter_mut().zip(dims).take(rank as usize) {
        *slot = x;
    }
    guild_tensor_desc_v1_t {
        dtype,
        rank,
        dims: d,
        strides: [0; GUILD_MAX_TENSOR_RANK],
        memory_space: memory,
        device_id: 0,
        data: ptr::null_mut(),
    }
}

/// Every field of a tensor descriptor, for comparing before and after a callback.
fn tensor_fields(t: &guild_tensor_desc_v1_t) -> Vec<u64> {
    let mut v = vec![u64::from(t.dtype), u64::from(t.rank)];
    v.extend_from_slice(&t.dims);
    v.extend_from_slice(&t.strides);
    v.extend([
        u64::from(t.memory_space),
        t.device_id as u64,
        t.data as usize as u64,
    ]);
    v
}

impl Operation<'_> {
    fn query(&self, case: &Case) -> guild_operation_query_v1_t {
        guild_operation_query_v1_t {
            struct_size: size_of::<guild_operation_query_v1_t>() as u32,
            version: GUILD_OPERATION_QUERY_VERSION,
            op_name: self.op_name.as_ptr(),
            min_op_version: self.gop.op_version,
            max_op_version: self.gop.op_version,
            backends: self.backend,
            sync_mode: case.sync_mode,
            required_capabilities: 0,
            required_numerics: 0,
            inputs: if case.inputs.is_empty() {
                ptr::null()
            } else {
                case.inputs.as_ptr()
            },
            input_count: case.inputs.len(),
            outputs: if case.outputs.is_empty() {
                ptr::null()
            } else {
                case.outputs.as_ptr()
            },
            output_count: case.outputs.len(),
            ram_budget: GUILD_BUDGET_UNLIMITED,
            vram_budget: GUILD_BUDGET_UNLIMITED,
            exact_impl_id: ptr::null(),
            device_caps: ptr::null(),
            params: self.params.ptr(),
            params_size: self.params.len,
        }
    }

    fn fingerprint(q: &guild_operation_query_v1_t, case: &Case) -> Vec<u64> {
        let mut v = vec![
            u64::from(q.struct_size),
            u64::from(q.version),
            q.op_name as usize as u64,
            u64::from(q.min_op_version),
            u64::from(q.max_op_version),
            u64::from(q.backends),
            u64::from(q.sync_mode),
            q.required_capabilities,
            q.required_numerics,
            q.inputs as usize as u64,
            q.input_count as u64,
            q.outputs as usize as u64,
            q.output_count as u64,
            q.ram_budget,
            q.vram_budget,
            q.exact_impl_id as usize as u64,
            q.device_caps as usize as u64,
            q.params as usize as u64,
            q.params_size as u64,
        ];
        for t in case.inputs.iter().chain(&case.outputs) {
            v.extend(tensor_fields(t));
        }
        v
    }

    /// Calls `validate` twice on `case`; an error names an impure callback.
    fn validate_twice(&self, case: &Case) -> Result<Answer, String> {
        let q = self.query(case);
        let before = Self::fingerprint(&q, case);
        let mut answers = Vec::new();
        for _ in 0..2 {
            let mut error = guild_error_info_t::new();
            self.lines.call();
            // SAFETY: the query's pointers lead into `self.op_name` and `case`, which outlive
            // the call; data addresses are NULL or made-up addresses that are only inspected.
            let status = self
                .provider
                .validate(unsafe { QueryCall::new(&q) }, &mut error);
            answers.push(Answer {
                status,
                message: fixed_buffer_text(&error.message),
            });
        }
        if Self::fingerprint(&q, case) != before {
            return Err(format!("validate wrote into the query ({})", case.note));
        }
        if answers[0].status != answers[1].status {
            return Err(format!(
                "validate answered {} and then {} to the same query ({})",
                answers[0].text(),
                answers[1].text(),
                case.note
            ));
        }
        Ok(answers.swap_remove(0))
    }

    fn scratch_once(&self, case: &Case) -> (Answer, guild_scratch_request_v1_t, bool) {
        let q = self.query(case);
        let before = Self::fingerprint(&q, case);
        let mut scratch = guild_scratch_request_v1_t {
            struct_size: size_of::<guild_scratch_request_v1_t>() as u32,
            alignment: 0,
            host_bytes: 0,
            device_bytes: 0,
        };
        let mut error = guild_error_info_t::new();
        self.lines.call();
        // SAFETY: as in validate_twice.
        let status =
            self.provider
                .query_scratch(unsafe { QueryCall::new(&q) }, &mut scratch, &mut error);
        let untouched = Self::fingerprint(&q, case) == before;
        (
            Answer {
                status,
                message: fixed_buffer_text(&error.message),
            },
            scratch,
            untouched,
        )
    }

    fn can_execute(&self) -> Result<(), String> {
        if self.backend != GUILD_BACKEND_CPU {
            return Err("the operation runs on a GPU backend; the check executes CPU operations only (validate and query_scratch were checked)".into());
        }
        if !self.lacks_isa.is_empty() {
            return Err(format!(
                "this CPU lacks {}, which the kernel's required_cpu_isa names; run the check on \
                 a CPU that has them to execute it (validate and query_scratch were checked)",
                self.lacks_isa
            ));
        }
        if self.gop.memory_spaces & GUILD_MEMORY_HOST == 0 {
            return Err(
                "the operation takes no host memory; the check executes on host memory only".into(),
            );
        }
        if self.gop.sync_modes & (1 << GUILD_SYNC_HOST_BLOCKING) == 0 {
            return Err("the operation has no host-blocking mode".into());
        }
        Ok(())
    }

    fn deterministic(&self) -> bool {
        self.gop.numerics & GUILD_NUMERICS_DETERMINISTIC != 0
    }

    fn bounded_dims(&self, rank: u32, dtype: DType) -> Vec<u64> {
        let mut dims: Vec<u64> = DIMS[..rank as usize].to_vec();
        if let Some(block) = dtype.block().filter(|b| b.elements > 1) {
            dims[0] = u64::from(block.elements);
        }
        for (d, &m) in dims.iter_mut().zip(&self.max_dim) {
            if m != 0 {
                *d = (*d).min(m);
            }
        }
        if self.max_batch != 0 {
            while dims.iter().skip(1).product::<u64>() > self.max_batch {
                if let Some(d) = dims.iter_mut().skip(1).find(|d| **d > 1) {
                    *d = 1;
                } else {
                    break;
                }
            }
        }
        dims
    }

    /// The queries the search for an accepted base tries, in order.
    fn candidates(&self) -> Vec<Case> {
        let g = &self.gop;
        let in_dtypes: Vec<DType> = if g.input_dtype == GUILD_DTYPE_ANY {
            TRY_DTYPES.to_vec()
        } else {
            vec![DType::from_raw(g.input_dtype)]
        };
        let memory = if g.memory_spaces & GUILD_MEMORY_HOST != 0 {
            GUILD_MEMORY_HOST
        } else {
            1 << g.memory_spaces.trailing_zeros().min(31)
        };
        let sync_mode = if g.sync_modes & 1 != 0 {
            GUILD_SYNC_HOST_BLOCKING
        } else {
            g.sync_modes.trailing_zeros().min(31)
        };
        let rank = 2u32.clamp(g.min_rank.max(1), g.max_rank.max(1));
        let count = |min: u32, max: u32| min.max(1).min(max) as usize;
        let (n_in, n_out) = (
            count(g.min_inputs, g.max_inputs),
            count(g.min_outputs, g.max_outputs),
        );
        let mut out = Vec::new();
        for dtype in in_dtypes {
            let out_dtype = if g.output_dtype == GUILD_DTYPE_ANY {
                dtype.raw()
            } else {
                g.output_dtype
            };
            let dims = self.bounded_dims(rank, dtype);
            for reduced in [false, true] {
                let mut out_dims = dims.clone();
                if reduced {
                    out_dims[0] = 1;
                }
                let mut case = Case {
                    inputs: vec![tensor(dtype.raw(), rank, &dims, memory); n_in],
                    outputs: vec![tensor(out_dtype, rank, &out_dims, memory); n_out],
                    sync_mode,
                    note: String::new(),
                };
                case.note = describe(&case);
                out.push(case);
            }
        }
        out
    }

    /// Variants inside the declared bounds: the rank bounds, each declared memory space and
    /// layout, data addresses at the declared alignment.
    fn inside(&self, base: &Case) -> Vec<Case> {
        let g = &self.gop;
        let mut out = Vec::new();
        for rank in [g.min_rank, g.max_rank] {
            if rank >= 1 && rank as usize <= GUILD_MAX_TENSOR_RANK {
                let mut c = base.clone();
                set_rank(&mut c, rank, &self.max_dim);
                c.note = format!("rank {rank}, at the declared bound");
                out.push(c);
            }
        }
        for bit in 0..4u32 {
            let space = 1u32 << bit;
            if g.memory_spaces & space != 0 {
                let mut c = base.clone();
                for t in c.inputs.iter_mut().chain(c.outputs.iter_mut()) {
                    t.memory_space = space;
                }
                c.note = format!("memory space {}", memory_name(space));
                out.push(c);
            }
        }
        if g.layouts & GUILD_LAYOUT_OUTER_STRIDED != 0 && base.inputs.iter().any(|t| t.rank >= 2) {
            let mut c = base.clone();
            stride_all(&mut c);
            c.note = "outer-strided tensors".into();
            out.push(c);
        }
        let align = u64::from(g.min_alignment.max(1)).min(0x800);
        let mut c = base.clone();
        set_addresses(&mut c, align);
        c.note = format!("data addresses aligned to exactly {align} bytes");
        out.push(c);
        for (axis, &m) in self.max_dim.iter().enumerate() {
            let rank = base.inputs.first().map_or(0, |t| t.rank as usize);
            if m != 0 && m != u64::MAX && axis < rank {
                let mut c = base.clone();
                for t in c.inputs.iter_mut().chain(c.outputs.iter_mut()) {
                    if axis < t.rank as usize && t.dims[axis] > 1 {
                        t.dims[axis] = m;
                        t.strides = [0; GUILD_MAX_TENSOR_RANK];
                    }
                }
                c.note = format!("extent {m} on axis {axis}, at max_dim");
                out.push(c);
            }
        }
        out
    }

    /// Variants just outside the bounds `validate` must refuse itself (the rank and the tensor
    /// counts), then those just outside the bounds the host checks before it asks `validate`.
    fn outside(&self, base: &Case) -> Vec<Case> {
        let mut out = Vec::new();
        self.outside_rank(base, &mut out);
        self.outside_counts(base, &mut out);
        self.outside_dtypes(base, &mut out);
        self.outside_alignment(base, &mut out);
        self.outside_memory_space(base, &mut out);
        self.outside_layout(base, &mut out);
        self.outside_extents(base, &mut out);
        out
    }

    /// One rank above `max_rank` and one below `min_rank`, where the ABI has such a rank.
    fn outside_rank(&self, base: &Case, out: &mut Vec<Case>) {
        let g = &self.gop;
        if (g.max_rank as usize) < GUILD_MAX_TENSOR_RANK {
            let mut c = base.clone();
            set_rank(&mut c, g.max_rank + 1, &[0; GUILD_MAX_TENSOR_RANK]);
            c.note = format!("rank {} above max_rank {}", g.max_rank + 1, g.max_rank);
            out.push(c);
        }
        if g.min_rank > 1 {
            let mut c = base.clone();
            set_rank(&mut c, g.min_rank - 1, &self.max_dim);
            c.note = format!("rank {} below min_rank {}", g.min_rank - 1, g.min_rank);
            out.push(c);
        }
    }

    /// One input more than the maximum and one fewer than the minimum, then the same for the
    /// outputs.
    fn outside_counts(&self, base: &Case, out: &mut Vec<Case>) {
        let g = &self.gop;
        let counts = [
            ("inputs", g.min_inputs, g.max_inputs, true),
            ("outputs", g.min_outputs, g.max_outputs, false),
        ];
        for (what, min, max, inputs) in counts {
            let list = |c: &mut Case| {
                if inputs {
                    std::mem::take(&mut c.inputs)
                } else {
                    std::mem::take(&mut c.outputs)
                }
            };
            let put = |c: &mut Case, v| {
                if inputs {
                    c.inputs = v;
                } else {
                    c.outputs = v;
                }
            };
            if max < 64 {
                let mut c = base.clone();
                let mut v = list(&mut c);
                if let Some(last) = v.last().copied() {
                    v.resize(max as usize + 1, last);
                    put(&mut c, v);
                    c.note = format!("{} {what}, above the declared {max}", max + 1);
                    out.push(c);
                }
            }
            if min > 0 {
                let mut c = base.clone();
                let mut v = list(&mut c);
                v.truncate(min as usize - 1);
                put(&mut c, v);
                c.note = format!("{} {what}, below the declared {min}", min - 1);
                out.push(c);
            }
        }
    }

    /// Inputs, then outputs, of another dtype than a declared one (host-checked).
    fn outside_dtypes(&self, base: &Case, out: &mut Vec<Case>) {
        let g = &self.gop;
        for (what, declared, inputs) in [
            ("input", g.input_dtype, true),
            ("output", g.output_dtype, false),
        ] {
            if declared == GUILD_DTYPE_ANY {
                continue;
            }
            let other = TRY_DTYPES
                .iter()
                .find(|d| d.raw() != declared)
                .map_or(0, |d| d.raw());
            let mut c = base.clone();
            let list = if inputs {
                &mut c.inputs
            } else {
                &mut c.outputs
            };
            for t in list.iter_mut() {
                t.dtype = other;
            }
            c.note = format!(
                "{what} dtype {} where the contract declares {}",
                dtype_name(other),
                dtype_name(declared)
            );
            out.push(c);
        }
    }

    /// Data addresses aligned to half of `min_alignment` (host-checked).
    fn outside_alignment(&self, base: &Case, out: &mut Vec<Case>) {
        let g = &self.gop;
        if g.min_alignment > 1 {
            let mut c = base.clone();
            set_addresses(&mut c, u64::from(g.min_alignment / 2));
            c.note = format!(
                "data addresses aligned to {} bytes below min_alignment {}",
                g.min_alignment / 2,
                g.min_alignment
            );
            out.push(c);
        }
    }

    /// The first memory space the contract does not declare (host-checked).
    fn outside_memory_space(&self, base: &Case, out: &mut Vec<Case>) {
        let g = &self.gop;
        if let Some(space) = (0..4u32)
            .map(|b| 1u32 << b)
            .find(|s| g.memory_spaces & s == 0)
        {
            let mut c = base.clone();
            for t in c.inputs.iter_mut().chain(c.outputs.iter_mut()) {
                t.memory_space = space;
            }
            c.note = format!(
                "memory space {} outside the declared set",
                memory_name(space)
            );
            out.push(c);
        }
    }

    /// Outer-strided tensors where the contract declares contiguous ones only (host-checked).
    fn outside_layout(&self, base: &Case, out: &mut Vec<Case>) {
        let g = &self.gop;
        if g.layouts & GUILD_LAYOUT_OUTER_STRIDED == 0 && base.inputs.iter().any(|t| t.rank >= 2) {
            let mut c = base.clone();
            stride_all(&mut c);
            c.note = "outer-strided tensors where the contract declares contiguous only".into();
            out.push(c);
        }
    }

    /// One more than `max_dim` on each axis that declares one (host-checked).
    fn outside_extents(&self, base: &Case, out: &mut Vec<Case>) {
        for (axis, &m) in self.max_dim.iter().enumerate() {
            if m == 0 || m == u64::MAX || axis >= base.inputs.first().map_or(0, |t| t.rank as usize)
            {
                continue;
            }
            let mut c = base.clone();
            for t in c.inputs.iter_mut().chain(c.outputs.iter_mut()) {
                if axis < t.rank as usize {
                    t.dims[axis] = m + 1;
                    t.strides = [0; GUILD_MAX_TENSOR_RANK];
                }
            }
            c.note = format!("extent {} on axis {axis} above max_dim {m}", m + 1);
            out.push(c);
        }
    }
}

/// Gives every tensor a made-up data address aligned to exactly `align` bytes (never to twice
/// that), for the negotiation callbacks to inspect; nothing dereferences it.
fn set_addresses(case: &mut Case, align: u64) {
    for (i, t) in case
        .inputs
        .iter_mut()
        .chain(case.outputs.iter_mut())
        .enumerate()
    {
        let addr = 0x10_0000 + i as u64 * 0x1_0000 + align;
        t.data = (addr as usize) as *mut _;
    }
}

fn stride_all(case: &mut Case) {
    for t in case.inputs.iter_mut().chain(case.outputs.iter_mut()) {
        if t.rank >= 2 {
            t.strides[1] = t.dims[0] + 3;
        }
    }
}

fn set_rank(case: &mut Case, rank: u32, max_dim: &[u64]) {
    for t in case.inputs.iter_mut().chain(case.outputs.iter_mut()) {
        for (axis, &d) in DIMS.iter().enumerate() {
            if axis >= rank as usize {
                t.dims[axis] = 0;
            } else if axis >= t.rank as usize {
                t.dims[axis] = match max_dim.get(axis) {
                    Some(&m) if m != 0 => d.min(m),
                    _ => d,
                };
            }
        }
        t.strides = [0; GUILD_MAX_TENSOR_RANK];
        t.rank = rank;
    }
}

fn dtype_name(raw: u32) -> String {
    DType::from_raw(raw)
        .name()
        .map_or_else(|| format!("#{raw}"), str::to_owned)
}

fn memory_name(space: u32) -> &'static str {
    match space {
        1 => "host",
        2 => "host-pinned",
        4 => "device",
        8 => "managed",
        _ => "unknown",
    }
}

fn shape_text(t: &guild_tensor_desc_v1_t) -> String {
    let dims: Vec<String> = t.dims[..(t.rank as usize).min(GUILD_MAX_TENSOR_RANK)]
        .iter()
        .map(u64::to_string)
        .collect();
    let mut s = format!("{}:{}", dtype_name(t.dtype), dims.join("x"));
    if t.strides.iter().any(|&x| x != 0) {
        let st: Vec<String> = t.strides[..(t.rank as usize).min(GUILD_MAX_TENSOR_RANK)]
            .iter()
            .map(u64::to_string)
            .collect();
        s.push('@');
        s.push_str(&st.join(","));
    }
    s
}

fn describe(case: &Case) -> String {
    let list =
        |v: &[guild_tensor_desc_v1_t]| v.iter().map(shape_text).collect::<Vec<_>>().join(" ");
    format!(
        "inputs {} -> outputs {}",
        list(&case.inputs),
        list(&case.outputs)
    )
}

fn domain_desc(t: &guild_tensor_desc_v1_t) -> TensorDesc {
    let rank = (t.rank as usize).min(GUILD_MAX_TENSOR_RANK);
    TensorDesc::new(DType::from_raw(t.dtype), &t.dims[..rank], MemorySpace::Host)
        .with_strides(&t.strides[..rank])
}

/// The byte offsets of every storage unit (element or block) of `t`, in logical order, and the
/// unit's size.
fn units(t: &guild_tensor_desc_v1_t) -> Result<(Vec<usize>, usize, usize), String> {
    let desc = domain_desc(t);
    let info = desc.check().map_err(|e| e.to_string())?;
    let block = desc.dtype.block().ok_or("unknown dtype")?;
    let rank = (t.rank as usize).min(GUILD_MAX_TENSOR_RANK);
    let mut eff = [0u64; GUILD_MAX_TENSOR_RANK];
    let inner_units = t.dims[0] / u64::from(block.elements);
    eff[0] = 1;
    let mut prev = (1u64, inner_units);
    for (axis, slot) in eff.iter_mut().enumerate().take(rank).skip(1) {
        let packed = prev.0 * prev.1;
        *slot = if t.strides[axis] == 0 {
            packed
        } else {
            t.strides[axis]
        };
        prev = (*slot, t.dims[axis]);
    }
    let mut offsets = Vec::new();
    let mut index = [0u64; GUILD_MAX_TENSOR_RANK];
    loop {
        let base: u64 = (1..rank).map(|a| index[a] * eff[a]).sum();
        for u in 0..inner_units {
            offsets.push(((base + u) * u64::from(block.bytes)) as usize);
        }
        let mut axis = 1;
        while axis < rank {
            index[axis] += 1;
            if index[axis] < t.dims[axis] {
                break;
            }
            index[axis] = 0;
            axis += 1;
        }
        if axis >= rank {
            break;
        }
    }
    Ok((offsets, block.bytes as usize, info.byte_extent as usize))
}

/// The bytes of generated value number `i` in `dtype`: small integers (-5..=5), exact in every
/// arithmetic type, so that sums come out the same in any order.
fn value(dtype: DType, i: usize, out: &mut [u8]) {
    let v = ((i * 7 + 3) % 11) as i64 - 5;
    match dtype {
        DType::F32 => out.copy_from_slice(&(v as f32).to_le_bytes()),
        DType::F64 => out.copy_from_slice(&(v as f64).to_le_bytes()),
        DType::I8 => out.copy_from_slice(&(v as i8).to_le_bytes()),
        DType::I16 => out.copy_from_slice(&(v as i16).to_le_bytes()),
        DType::I32 => out.copy_from_slice(&(v as i32).to_le_bytes()),
        DType::I64 => out.copy_from_slice(&v.to_le_bytes()),
        DType::BF16 => out.copy_from_slice(&(((v as f32).to_bits() >> 16) as u16).to_le_bytes()),
        _ => {
            for (k, b) in out.iter_mut().enumerate() {
                *b = ((i * 31 + k * 7) % 61) as u8;
            }
        }
    }
}

/// One execution's buffers and what came out of it.
struct Executed {
    /// Each output's units in logical order.
    outputs: Vec<Vec<u8>>,
}

/// Executes `case` on freshly generated inputs in guarded buffers.
fn execute(op: &Operation<'_>, case: &Case, flush: Flush) -> Result<Executed, String> {
    let align = (op.gop.min_alignment.max(1) as usize).max(16);
    let mut inputs = case.inputs.clone();
    let mut outputs = case.outputs.clone();
    let keep = generate_inputs(&mut inputs, align, flush)?;
    let outs = place_outputs(&mut outputs, align, flush)?;
    let (scratch, scratch_size) = host_scratch(op, case, align, flush)?;
    let mut args = execute_args(&inputs, &outputs, scratch.as_ref(), scratch_size);
    args.params = op.params.ptr();
    args.params_size = op.params.len;
    let mut error = guild_error_info_t::new();
    op.lines.call();
    // SAFETY: every descriptor's data leads into a live guarded buffer of the tensor's byte
    // extent (inputs readable, outputs writable), the scratch is NULL or live and as large as
    // requested, the case passed validate, and the buffers outlive the call.
    let status = op
        .provider
        .execute(unsafe { ExecuteCall::new(&args) }, &mut error);
    if status != GUILD_STATUS_OK {
        let answer = Answer {
            status,
            message: fixed_buffer_text(&error.message),
        };
        return Err(format!("execute returned {}", answer.text()));
    }
    let results = read_outputs(&outs)?;
    if let Some(s) = &scratch {
        if let Some(at) = s.intact() {
            return Err(format!(
                "execute wrote outside its host scratch (byte {at} relative to its start)"
            ));
        }
    }
    drop(keep);
    Ok(Executed { outputs: results })
}

/// One output's guarded buffer, the byte offsets of its units in logical order, and the unit's
/// size.
struct OutputBuffer {
    buf: Guarded,
    offsets: Vec<usize>,
    unit: usize,
}

/// Fills a read-only guarded buffer with generated values for each input and points its
/// descriptor at it; the buffers are returned to be kept for as long as the call runs.
fn generate_inputs(
    inputs: &mut [guild_tensor_desc_v1_t],
    align: usize,
    flush: Flush,
) -> Result<Vec<Guarded>, String> {
    let mut keep = Vec::new();
    for (n, t) in inputs.iter_mut().enumerate() {
        let (offsets, unit, extent) = units(t).map_err(|e| format!("input {n}: {e}"))?;
        let mut buf = Guarded::new(extent, align, flush).map_err(|e| e.to_string())?;
        let dtype = DType::from_raw(t.dtype);
        let bytes = buf.bytes_mut();
        for (i, &o) in offsets.iter().enumerate() {
            value(dtype, i + n * 1000, &mut bytes[o..o + unit]);
        }
        buf.set_read_only(true).map_err(|e| e.to_string())?;
        t.data = buf.ptr().cast();
        keep.push(buf);
    }
    Ok(keep)
}

/// Maps a guarded buffer, all canary, for each output and points its descriptor at it.
fn place_outputs(
    outputs: &mut [guild_tensor_desc_v1_t],
    align: usize,
    flush: Flush,
) -> Result<Vec<OutputBuffer>, String> {
    let mut outs = Vec::new();
    for (n, t) in outputs.iter_mut().enumerate() {
        let (offsets, unit, extent) = units(t).map_err(|e| format!("output {n}: {e}"))?;
        let buf = Guarded::new(extent, align, flush).map_err(|e| e.to_string())?;
        t.data = buf.ptr().cast();
        outs.push(OutputBuffer { buf, offsets, unit });
    }
    Ok(outs)
}

/// The host scratch `query_scratch` asks for this very case, in a guarded buffer (none when it
/// asks for no bytes), and the size it asked for.
fn host_scratch(
    op: &Operation<'_>,
    case: &Case,
    align: usize,
    flush: Flush,
) -> Result<(Option<Guarded>, u64), String> {
    let (answer, request, _) = op.scratch_once(case);
    if !answer.ok() {
        return Err(format!(
            "query_scratch refused the query: {}",
            answer.text()
        ));
    }
    if request.host_bytes == 0 {
        return Ok((None, request.host_bytes));
    }
    let len = usize::try_from(request.host_bytes)
        .ok()
        .filter(|&l| l <= 1 << 30)
        .ok_or_else(|| {
            format!(
                "query_scratch asked for {} bytes of host scratch",
                request.host_bytes
            )
        })?;
    let a = (request.alignment.max(1) as usize).max(align);
    let scratch = Guarded::new(len, a, flush).map_err(|e| e.to_string())?;
    Ok((Some(scratch), request.host_bytes))
}

/// The arguments of one host-blocking execution of `inputs` into `outputs` with the host
/// scratch `scratch` of `scratch_size` bytes.
fn execute_args(
    inputs: &[guild_tensor_desc_v1_t],
    outputs: &[guild_tensor_desc_v1_t],
    scratch: Option<&Guarded>,
    scratch_size: u64,
) -> guild_execute_args_v1_t {
    guild_execute_args_v1_t {
        scratch_host: scratch.map_or(ptr::null_mut(), |s| s.ptr().cast()),
        scratch_host_size: scratch_size,
        ..guild_execute_args_v1_t::host_blocking(inputs, outputs, &[])
    }
}

/// Each output's units in logical order, after checking that the execution changed nothing of
/// its buffer outside them.
fn read_outputs(outs: &[OutputBuffer]) -> Result<Vec<Vec<u8>>, String> {
    let mut results = Vec::new();
    for (n, OutputBuffer { buf, offsets, unit }) in outs.iter().enumerate() {
        let unit = *unit;
        if let Some(at) = buf.intact() {
            return Err(format!(
                "execute wrote outside output {n} (byte {at} relative to its start)"
            ));
        }
        // Between rows of an outer-strided output nothing may change either.
        let bytes = buf.bytes();
        let mut logical = vec![false; bytes.len()];
        for &o in offsets {
            logical[o..o + unit].iter_mut().for_each(|b| *b = true);
        }
        if let Some(at) = (0..bytes.len()).find(|&i| !logical[i] && bytes[i] != CANARY) {
            return Err(format!(
                "execute wrote between the rows of outer-strided output {n} (byte {at})"
            ));
        }
        let mut v = Vec::with_capacity(offsets.len() * unit);
        for &o in offsets {
            v.extend_from_slice(&bytes[o..o + unit]);
        }
        results.push(v);
    }
    Ok(results)
}

/// Whether two runs' outputs agree: bit for bit, or (for floating-point outputs of an operation
/// that does not declare deterministic numerics) within a relative 1e-3.
fn same_outputs(case: &Case, a: &Executed, b: &Executed, exact: bool) -> Result<(), String> {
    for (n, (x, y)) in a.outputs.iter().zip(&b.outputs).enumerate() {
        if x == y {
            continue;
        }
        let dtype = DType::from_raw(case.outputs[n].dtype);
        let close = !exact
            && match dtype {
                DType::F32 => close_floats(x, y, 4, |c| {
                    f64::from(f32::from_le_bytes(c.try_into().unwrap_or([0; 4])))
                }),
                DType::F64 => close_floats(x, y, 8, |c| {
                    f64::from_le_bytes(c.try_into().unwrap_or([0; 8]))
                }),
                _ => false,
            };
        if !close {
            let unit = dtype.block().map_or(1, |b| b.bytes as usize).max(1);
            let at = x.iter().zip(y).position(|(p, q)| p != q).unwrap_or(0) / unit;
            return Err(format!("output {n} differs at element {at}"));
        }
    }
    Ok(())
}

fn close_floats(x: &[u8], y: &[u8], size: usize, read: impl Fn(&[u8]) -> f64) -> bool {
    x.chunks(size).zip(y.chunks(size)).all(|(p, q)| {
        let (p, q) = (read(p), read(q));
        (p - q).abs() <= 1e-3 * p.abs().max(q.abs()).max(1.0)
    })
}

/// What one check found: its verdict and the reason the finding carries.
type Outcome = (Verdict, String);

/// Why the checks that start from an accepted query are skipped when there is none.
const NO_BASE: &str = "no generated query was accepted (see the validate check)";

/// The two guard checks: which guard each buffer touches, and what a pass says of it.
const GUARD_CHECKS: [(&str, Flush, &str); 2] = [
    (
        "execute.guard_front",
        Flush::Front,
        "every buffer starts at a guard page: a read or write before a tensor faults",
    ),
    (
        "execute.guard_back",
        Flush::Back,
        "every buffer ends at a guard page: a read or write past a tensor faults",
    ),
];

/// Runs every check of `op`, recording each: the negotiation checks from the first generated
/// query `validate` accepts, then the execution checks on that query.
pub(crate) fn check(op: &Operation<'_>, rec: &mut Recorder<'_>) {
    let label = op.label.clone();
    let label = Some(label.as_str());
    let candidates = op.candidates();

    let mut base: Option<Case> = None;
    rec.check_always("validate", label, || {
        let (accepted, outcome) = find_base(op, &candidates);
        base = accepted;
        outcome
    });
    rec.check("validate.inside_bounds", label, || {
        from_base(&base, |b| validate_inside_bounds(op, b))
    });
    rec.check("validate.outside_bounds", label, || {
        from_base(&base, |b| validate_outside_bounds(op, b))
    });
    rec.check("query_scratch", label, || {
        from_base(&base, |b| query_scratch_twice(op, b))
    });

    let runnable = runnable(op, &base);
    for (name, flush, what) in GUARD_CHECKS {
        rec.check(name, label, || {
            if_runnable(&runnable, |c| execute_guarded(op, c, flush, what))
        });
    }
    rec.check("execute.strides", label, || {
        if_runnable(&runnable, |c| execute_strided(op, c))
    });
    rec.check("execute.deterministic", label, || {
        if_runnable(&runnable, |c| execute_repeated(op, c))
    });
    rec.check("execute.concurrent", label, || {
        if_runnable(&runnable, |c| execute_concurrently(op, c))
    });
}

/// The `validate` check: the first candidate `validate` accepts, every answer given twice and
/// the query left alone.
fn find_base(op: &Operation<'_>, candidates: &[Case]) -> (Option<Case>, Outcome) {
    let mut first = String::new();
    for case in candidates {
        match op.validate_twice(case) {
            Err(impure) => return (None, (Verdict::Failed, impure)),
            Ok(a) if a.ok() => {
                let outcome = (
                    Verdict::Passed,
                    format!(
                        "accepted {}; the same answer twice, query unchanged",
                        case.note
                    ),
                );
                return (Some(case.clone()), outcome);
            }
            Ok(a) if first.is_empty() => first = format!("{}: {}", case.note, a.text()),
            Ok(_) => {}
        }
    }
    let given = if op.params.len == 0 {
        "no parameter record was given; pass the operation's with --params, or name it in the \
         manifest's check_params"
            .to_owned()
    } else {
        format!(
            "each carried the {}-byte parameter record given",
            op.params.len
        )
    };
    let outcome = (
        Verdict::Skipped,
        format!(
            "validate refused all {} generated queries (the first, {first}); {given}",
            candidates.len()
        ),
    );
    (None, outcome)
}

/// Runs `f` on the accepted query, or skips the check when there is none.
fn from_base(base: &Option<Case>, f: impl FnOnce(&Case) -> Outcome) -> Outcome {
    match base {
        Some(base) => f(base),
        None => (Verdict::Skipped, NO_BASE.into()),
    }
}

/// The `validate.inside_bounds` check: every variant at and inside the declared bounds is
/// answered the same twice without a write to the query (accepting it is up to `validate`).
fn validate_inside_bounds(op: &Operation<'_>, base: &Case) -> Outcome {
    let cases = op.inside(base);
    let mut accepted = 0;
    for case in &cases {
        match op.validate_twice(case) {
            Err(impure) => return (Verdict::Failed, impure),
            Ok(a) => accepted += usize::from(a.ok()),
        }
    }
    (
        Verdict::Passed,
        format!(
            "{} queries at and inside the bounds, {accepted} accepted, each answered the \
             same twice without writing to the query",
            cases.len()
        ),
    )
}

/// The `validate.outside_bounds` check: the variants just outside the declaration are named, and
/// `validate` is not asked about them. The host refuses every query outside what the GOP1 fields
/// declare (rank, counts, extents, dtypes, layouts, memory spaces, alignment) before it calls
/// `validate`, so a module written to module_abi.h may index its tensors by the declared counts
/// and bounds; asking it about such a query would test something no host does.
fn validate_outside_bounds(op: &Operation<'_>, base: &Case) -> Outcome {
    let cases = op.outside(base);
    if cases.is_empty() {
        return (
            Verdict::Skipped,
            "the declared bounds leave nothing just outside them to ask about".into(),
        );
    }
    let notes: Vec<&str> = cases.iter().map(|c| c.note.as_str()).collect();
    (
        Verdict::Passed,
        format!(
            "{} queries just outside the declaration are the host's to refuse before validate \
             is called, so validate was not asked (information): {}",
            cases.len(),
            notes.join("; ")
        ),
    )
}

/// The `query_scratch` check: the accepted query is accepted again, answered the same twice
/// without a write to the query, and with a well-formed request.
fn query_scratch_twice(op: &Operation<'_>, base: &Case) -> Outcome {
    let (a1, s1, clean1) = op.scratch_once(base);
    let (a2, s2, clean2) = op.scratch_once(base);
    if !clean1 || !clean2 {
        return (Verdict::Failed, "query_scratch wrote into the query".into());
    }
    if !a1.ok() {
        return (
            Verdict::Failed,
            format!(
                "query_scratch refused a query validate accepted: {}",
                a1.text()
            ),
        );
    }
    let fields =
        |s: &guild_scratch_request_v1_t| (s.struct_size, s.alignment, s.host_bytes, s.device_bytes);
    if a1 != a2 || fields(&s1) != fields(&s2) {
        return (
            Verdict::Failed,
            "query_scratch gave two different answers to the same query".into(),
        );
    }
    if s1.struct_size != size_of::<guild_scratch_request_v1_t>() as u32 {
        return (
            Verdict::Failed,
            "query_scratch changed the record's struct_size".into(),
        );
    }
    if s1.alignment > 1 && !s1.alignment.is_power_of_two() {
        return (
            Verdict::Failed,
            format!(
                "query_scratch asked for alignment {}, not a power of two",
                s1.alignment
            ),
        );
    }
    (
        Verdict::Passed,
        format!(
            "{} host and {} device bytes, the same twice",
            s1.host_bytes, s1.device_bytes
        ),
    )
}

/// The query the execution checks run, or why they are skipped.
fn runnable(op: &Operation<'_>, base: &Option<Case>) -> Result<Case, String> {
    match (base, op.can_execute()) {
        (None, _) => Err(NO_BASE.to_owned()),
        (Some(_), Err(why)) => Err(why),
        (Some(b), Ok(())) => Ok(b.clone()),
    }
}

/// Runs `f` on the query to execute, or skips the check with the reason there is none.
fn if_runnable(runnable: &Result<Case, String>, f: impl FnOnce(&Case) -> Outcome) -> Outcome {
    match runnable {
        Ok(case) => f(case),
        Err(why) => (Verdict::Skipped, why.clone()),
    }
}

/// The finding of an execution that failed with `e`: skipped rather than failed when `execute`
/// refused in a package that depends on modules the check process does not load.
fn refused(op: &Operation<'_>, e: String) -> Outcome {
    if op.has_dependencies && e.starts_with("execute returned") {
        (
            Verdict::Skipped,
            format!(
                "{e}; the package depends on other modules, which the check process does \
                 not load"
            ),
        )
    } else {
        (Verdict::Failed, e)
    }
}

/// The `execute.guard_front` and `execute.guard_back` checks: one execution with every buffer
/// flush against the guard `flush` names.
fn execute_guarded(op: &Operation<'_>, case: &Case, flush: Flush, what: &str) -> Outcome {
    match execute(op, case, flush) {
        Ok(_) => (
            Verdict::Passed,
            format!("{what}; inputs read-only; nothing outside the outputs and scratch changed"),
        ),
        Err(e) => refused(op, e),
    }
}

/// The `execute.strides` check: an outer-strided variant of the query, with the same values,
/// gives the packed run's outputs.
fn execute_strided(op: &Operation<'_>, case: &Case) -> Outcome {
    if op.gop.layouts & GUILD_LAYOUT_OUTER_STRIDED == 0 {
        return (
            Verdict::Skipped,
            "the contract does not accept outer-strided layouts".into(),
        );
    }
    if case.inputs.iter().chain(&case.outputs).all(|t| t.rank < 2) {
        return (Verdict::Skipped, "the generated tensors have rank 1".into());
    }
    let mut strided = case.clone();
    stride_all(&mut strided);
    strided.note = describe(&strided);
    match op.validate_twice(&strided) {
        Err(impure) => return (Verdict::Failed, impure),
        Ok(a) if !a.ok() => {
            return (
                Verdict::Skipped,
                format!(
                    "validate refused the outer-strided variant {}: {}",
                    strided.note,
                    a.text()
                ),
            )
        }
        Ok(_) => {}
    }
    let packed = match execute(op, case, Flush::Back) {
        Ok(r) => r,
        Err(e) => return refused(op, e),
    };
    let apart = match execute(op, &strided, Flush::Back) {
        Ok(r) => r,
        Err(e) => return refused(op, e),
    };
    match same_outputs(case, &packed, &apart, op.deterministic()) {
        Ok(()) => (
            Verdict::Passed,
            format!("{} gives the packed run's outputs", strided.note),
        ),
        Err(e) => (
            Verdict::Failed,
            format!(
                "{e} between the packed run and {} with the same values: the outer strides \
                 are not honoured",
                strided.note
            ),
        ),
    }
}

/// The `execute.deterministic` check: an operation that declares deterministic numerics gives
/// bit-identical outputs in [`REPEATS`] runs of the same inputs.
fn execute_repeated(op: &Operation<'_>, case: &Case) -> Outcome {
    if !op.deterministic() {
        return (
            Verdict::Skipped,
            "the operation does not declare GUILD_NUMERICS_DETERMINISTIC".into(),
        );
    }
    let first = match execute(op, case, Flush::Back) {
        Ok(r) => r,
        Err(e) => return refused(op, e),
    };
    for run in 1..REPEATS {
        let again = match execute(op, case, Flush::Back) {
            Ok(r) => r,
            Err(e) => return refused(op, e),
        };
        if let Err(e) = same_outputs(case, &first, &again, true) {
            return (
                Verdict::Failed,
                format!(
                    "run {} of the same inputs: {e}, although the operation declares \
                     deterministic numerics",
                    run + 1
                ),
            );
        }
    }
    (
        Verdict::Passed,
        format!("{REPEATS} runs, bit-identical outputs"),
    )
}

/// The `execute.concurrent` check: [`THREADS`] threads executing at once on buffers of their own
/// give the outputs of a run before them.
fn execute_concurrently(op: &Operation<'_>, case: &Case) -> Outcome {
    let reference = match execute(op, case, Flush::Back) {
        Ok(r) => r,
        Err(e) => return refused(op, e),
    };
    for (t, r) in run_on_threads(op, case).into_iter().enumerate() {
        let runs = match r {
            Ok(runs) => runs,
            Err(e) => return refused(op, format!("{e} (thread {t})")),
        };
        for run in &runs {
            if let Err(e) = same_outputs(case, &reference, run, op.deterministic()) {
                return (
                    Verdict::Failed,
                    format!(
                        "{e} on thread {t} running at the same time as {} others: the \
                         calls share state",
                        THREADS - 1
                    ),
                );
            }
        }
    }
    (
        Verdict::Passed,
        format!(
            "{THREADS} threads x {RUNS_PER_THREAD} calls on independent buffers at once \
             gave the sequential outputs"
        ),
    )
}

/// Executes `case` [`RUNS_PER_THREAD`] times on each of [`THREADS`] threads started together;
/// each thread's runs, or the first error of one, in thread order.
fn run_on_threads(op: &Operation<'_>, case: &Case) -> Vec<Result<Vec<Executed>, String>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| {
                    (0..RUNS_PER_THREAD)
                        .map(|_| execute(op, case, Flush::Back))
                        .collect::<Result<Vec<_>, _>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into())))
            .collect()
    })
}
