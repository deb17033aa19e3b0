//! The scan runtime modules (test-plugins/scan_module, scan_module_alt, scan_dependent) loaded
//! through `DlopenLoader`: their GOP1 contracts converted to the domain field by field, their
//! validate refusals, and both scans executed directly through the copied callbacks over
//! generated shapes, dtypes and outer strides, against a Rust reference.

use std::ffi::c_void;
use std::sync::Arc;

use guild_abi::{
    guild_error_info_t, guild_execute_args_v1_t, guild_operation_ext_v1_t,
    guild_operation_query_v1_t, guild_scratch_request_v1_t, guild_tensor_desc_v1_t,
    GUILD_DTYPE_F16, GUILD_DTYPE_F32, GUILD_DTYPE_F64, GUILD_DTYPE_I32, GUILD_DTYPE_I64,
    GUILD_MEMORY_HOST, GUILD_STATUS_ERR_UNSUPPORTED, GUILD_STATUS_OK, GUILD_SYNC_HOST_BLOCKING,
};
use guild_adapters_posix::{DlopenLoader, OwnedKernel};
use guild_domain::ids::{ImplId, OpName};
use guild_domain::operation::{
    Arity, Backend, Capabilities, CpuIsa, DType, LayoutSet, MemorySpaceSet, Numerics, OpCandidate,
    SyncModeSet,
};
use guild_domain::version::PackedVersion;
use guild_ports::loader::{LoadedPlugin, PluginLoader};
use proptest::prelude::*;

use crate::support::{guild_text, request};

const INCLUSIVE_OP: &str = "example.sequence.inclusive_scan";
const EXCLUSIVE_OP: &str = "example.sequence.exclusive_scan";
const INCLUSIVE: &str = "example.scan.inclusive.cpu";
const EXCLUSIVE: &str = "example.scan.exclusive.cpu";
const ALT_INCLUSIVE: &str = "example.scan_alt.inclusive.cpu";
const ALT_EXCLUSIVE: &str = "example.scan_alt.exclusive.cpu";
const TOTAL: &str = "example.dependent.total.cpu";

/// Capability bits of the scan operations (test-plugins/scan_module/scan_core.h).
const CAP_IN_PLACE: u64 = 1 << 0;
const CAP_WIDE_TYPES: u64 = 1 << 1;
const CAP_INTEGERS: u64 = 1 << 2;
const CAP_OUTER_STRIDED: u64 = 1 << 3;

fn load(name: &str, ops: &[&str]) -> LoadedPlugin {
    DlopenLoader::new()
        .load(&request(name, ops, &[]))
        .unwrap_or_else(|e| panic!("{name} failed to load: {e}"))
}

fn load_scan() -> LoadedPlugin {
    load("scan_module", &[INCLUSIVE, EXCLUSIVE])
}

fn load_alt() -> LoadedPlugin {
    load("scan_module_alt", &[ALT_INCLUSIVE, ALT_EXCLUSIVE])
}

fn owned_kernel(plugin: &LoadedPlugin, id: &str) -> Arc<OwnedKernel> {
    let kernel = plugin
        .kernels
        .iter()
        .find(|k| k.impl_id.as_str() == id)
        .unwrap_or_else(|| panic!("{id} is not registered"));
    let provider: Arc<dyn std::any::Any + Send + Sync> = kernel.provider.clone();
    provider
        .downcast::<OwnedKernel>()
        .expect("the loader's provider is an OwnedKernel")
}

/// The contract both scan providers share; each test overrides what differs.
fn scan_candidate(impl_id: &str, op_name: &str) -> OpCandidate {
    OpCandidate {
        impl_id: ImplId::new(impl_id).expect("valid"),
        op_name: OpName::new(op_name).expect("valid"),
        backend: Backend::Cpu,
        priority: 10,
        op_version: PackedVersion::new(1, 0, 0).expect("packs"),
        capabilities: Capabilities::from_bits(
            CAP_IN_PLACE | CAP_WIDE_TYPES | CAP_INTEGERS | CAP_OUTER_STRIDED,
        ),
        numerics: Numerics::DETERMINISTIC
            | Numerics::F32_ACCUMULATION
            | Numerics::ORDERED_REDUCTION
            | Numerics::EXACT_INTEGER,
        input_dtype: DType::ANY,
        output_dtype: DType::ANY,
        inputs: Arity::exactly(1),
        outputs: Arity::exactly(1),
        layouts: LayoutSet::CONTIGUOUS | LayoutSet::OUTER_STRIDED,
        memory_spaces: MemorySpaceSet::HOST,
        min_alignment: 4,
        min_rank: 1,
        max_rank: 8,
        max_dim: [0; 8],
        max_batch: 0,
        sync_modes: SyncModeSet::HOST_BLOCKING,
        min_sm: 0,
        max_sm: 0,
        cpu_isa: CpuIsa::EMPTY,
    }
}

fn alt_candidate(impl_id: &str, op_name: &str) -> OpCandidate {
    OpCandidate {
        priority: 5,
        capabilities: Capabilities::from_bits(CAP_WIDE_TYPES),
        numerics: Numerics::DETERMINISTIC
            | Numerics::F32_ACCUMULATION
            | Numerics::ORDERED_REDUCTION,
        layouts: LayoutSet::CONTIGUOUS,
        max_rank: 4,
        ..scan_candidate(impl_id, op_name)
    }
}

fn check_candidate(plugin: &LoadedPlugin, expected: &OpCandidate) {
    let id = expected.impl_id.as_str();
    let kernel = plugin
        .kernels
        .iter()
        .find(|k| k.impl_id.as_str() == id)
        .unwrap_or_else(|| panic!("{id} is not registered"));
    let c = kernel.operation.as_ref().expect("a GOP1 contract");
    // Field by field first, so that a failure names the field; then the whole value.
    assert_eq!(c.impl_id, expected.impl_id);
    assert_eq!(c.op_name, expected.op_name, "{id}");
    assert_eq!(c.backend, expected.backend, "{id}");
    assert_eq!(c.priority, expected.priority, "{id}");
    assert_eq!(c.op_version, expected.op_version, "{id}");
    assert_eq!(c.capabilities, expected.capabilities, "{id}");
    assert_eq!(c.numerics, expected.numerics, "{id}");
    assert_eq!(c.input_dtype, expected.input_dtype, "{id}");
    assert_eq!(c.output_dtype, expected.output_dtype, "{id}");
    assert_eq!(c.inputs, expected.inputs, "{id}");
    assert_eq!(c.outputs, expected.outputs, "{id}");
    assert_eq!(c.layouts, expected.layouts, "{id}");
    assert_eq!(c.memory_spaces, expected.memory_spaces, "{id}");
    assert_eq!(c.min_alignment, expected.min_alignment, "{id}");
    assert_eq!(
        (c.min_rank, c.max_rank),
        (expected.min_rank, expected.max_rank),
        "{id}"
    );
    assert_eq!(c.max_dim, expected.max_dim, "{id}");
    assert_eq!(c.max_batch, expected.max_batch, "{id}");
    assert_eq!(c.sync_modes, expected.sync_modes, "{id}");
    assert_eq!((c.min_sm, c.max_sm), (expected.min_sm, expected.max_sm));
    assert_eq!(c.cpu_isa, expected.cpu_isa, "{id}");
    assert_eq!(c, expected);
    assert_eq!(c.check(), Ok(()), "{id}");
    assert_eq!(owned_kernel(plugin, id).candidate(), Some(expected));
}

#[test]
fn scan_module_registers_exactly_its_two_scans() {
    let plugin = load_scan();
    let mut ids: Vec<&str> = plugin.kernels.iter().map(|k| k.impl_id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, [EXCLUSIVE, INCLUSIVE]);
    assert!(plugin.runners.is_empty());
    check_candidate(&plugin, &scan_candidate(INCLUSIVE, INCLUSIVE_OP));
    check_candidate(&plugin, &scan_candidate(EXCLUSIVE, EXCLUSIVE_OP));
}

#[test]
fn scan_module_alt_competes_with_a_narrower_contract() {
    let plugin = load_alt();
    let mut ids: Vec<&str> = plugin.kernels.iter().map(|k| k.impl_id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, [ALT_EXCLUSIVE, ALT_INCLUSIVE]);
    check_candidate(&plugin, &alt_candidate(ALT_INCLUSIVE, INCLUSIVE_OP));
    check_candidate(&plugin, &alt_candidate(ALT_EXCLUSIVE, EXCLUSIVE_OP));
}

#[test]
fn provided_ops_must_match_exactly() {
    let loader = DlopenLoader::new();
    // One id missing from the manifest: registering it is refused and the load fails.
    assert!(loader
        .load(&request("scan_module", &[INCLUSIVE], &[]))
        .is_err());
    // One id the module never registers: the load fails too.
    assert!(loader
        .load(&request(
            "scan_module",
            &[INCLUSIVE, EXCLUSIVE, "example.scan.other.cpu"],
            &[]
        ))
        .is_err());
    assert_eq!(loader.open_libraries(), 0);
}

// ------------------------------------------------------------------------------------------
// Calling the copied callbacks
// ------------------------------------------------------------------------------------------

/// The three GOP1 callbacks of one kernel, with the plugin that keeps them loaded.
struct Callbacks {
    _plugin: LoadedPlugin,
    kernel: Arc<OwnedKernel>,
}

impl Callbacks {
    fn new(plugin: LoadedPlugin, id: &str) -> Self {
        let kernel = owned_kernel(&plugin, id);
        Callbacks {
            _plugin: plugin,
            kernel,
        }
    }

    fn op(&self) -> &guild_operation_ext_v1_t {
        self.kernel.operation().expect("a GOP1 copy")
    }

    fn validate(
        &self,
        inputs: &[guild_tensor_desc_v1_t],
        outputs: &[guild_tensor_desc_v1_t],
    ) -> (i32, String) {
        let op = self.op();
        let query = query(inputs, outputs);
        let mut error = guild_error_info_t::new();
        // SAFETY: the library is loaded (`_plugin`); validate gets its registered user_data and
        // a query whose arrays live for the call.
        let status = unsafe { (op.validate.expect("validate"))(op.user_data, &query, &mut error) };
        (status, guild_text(&error.message))
    }

    fn scratch(
        &self,
        inputs: &[guild_tensor_desc_v1_t],
        outputs: &[guild_tensor_desc_v1_t],
    ) -> (i32, guild_scratch_request_v1_t) {
        let op = self.op();
        let query = query(inputs, outputs);
        let mut error = guild_error_info_t::new();
        let mut scratch = guild_scratch_request_v1_t {
            struct_size: size_of::<guild_scratch_request_v1_t>() as u32,
            alignment: 99,
            host_bytes: 99,
            device_bytes: 99,
        };
        // SAFETY: as in `validate`; `scratch` is a live record of the declared size.
        let status = unsafe {
            (op.query_scratch.expect("query_scratch"))(
                op.user_data,
                &query,
                &mut scratch,
                &mut error,
            )
        };
        (status, scratch)
    }

    fn execute(
        &self,
        inputs: &[guild_tensor_desc_v1_t],
        outputs: &[guild_tensor_desc_v1_t],
        scratch: &mut [u64],
    ) -> (i32, String) {
        let op = self.op();
        let args = guild_execute_args_v1_t {
            struct_size: size_of::<guild_execute_args_v1_t>() as u32,
            reserved: 0,
            inputs: inputs.as_ptr(),
            input_count: inputs.len(),
            outputs: outputs.as_ptr(),
            output_count: outputs.len(),
            scratch_host: if scratch.is_empty() {
                std::ptr::null_mut()
            } else {
                scratch.as_mut_ptr().cast()
            },
            scratch_host_size: size_of_val(scratch) as u64,
            scratch_device: std::ptr::null_mut(),
            scratch_device_size: 0,
            stream: std::ptr::null_mut(),
            device_id: 0,
            sync_mode: GUILD_SYNC_HOST_BLOCKING,
            params: std::ptr::null(),
            params_size: 0,
        };
        let mut error = guild_error_info_t::new();
        // SAFETY: as in `validate`; the tensors' data pointers address live buffers that span
        // the tensors' extents (built by `Buffer`), and no other thread touches them.
        let status = unsafe { (op.execute.expect("execute"))(op.user_data, &args, &mut error) };
        (status, guild_text(&error.message))
    }
}

fn tensor(dtype: u32, dims: &[u64], strides: &[u64], data: *mut c_void) -> guild_tensor_desc_v1_t {
    let mut t = guild_tensor_desc_v1_t {
        dtype,
        rank: dims.len() as u32,
        dims: [0; 8],
        strides: [0; 8],
        memory_space: GUILD_MEMORY_HOST,
        device_id: 0,
        data,
    };
    t.dims[..dims.len()].copy_from_slice(dims);
    t.strides[..strides.len()].copy_from_slice(strides);
    t
}

fn query(
    inputs: &[guild_tensor_desc_v1_t],
    outputs: &[guild_tensor_desc_v1_t],
) -> guild_operation_query_v1_t {
    crate::support::host_query(c"example.sequence.inclusive_scan", inputs, outputs)
}

/// Effective element strides (axis 0 = 1) by the header's rule: 0 means the stride of the axis
/// inside times its extent.
fn effective_strides(dims: &[u64], strides: &[u64]) -> Vec<u64> {
    let mut eff = vec![1u64; dims.len()];
    for i in 1..dims.len() {
        let packed = eff[i - 1] * dims[i - 1];
        eff[i] = if strides[i] == 0 { packed } else { strides[i] };
    }
    eff
}

/// Element offsets of every row start, outer axes in order with axis 1 fastest.
fn row_offsets(dims: &[u64], strides: &[u64]) -> Vec<usize> {
    let eff = effective_strides(dims, strides);
    let mut offsets = vec![0u64];
    for axis in 1..dims.len() {
        let step = eff[axis];
        let inner = offsets;
        offsets = (0..dims[axis])
            .flat_map(|i| inner.iter().map(move |&o| o + i * step))
            .collect();
    }
    offsets.into_iter().map(|o| o as usize).collect()
}

/// The smallest element count that holds a tensor.
fn extent(dims: &[u64], strides: &[u64]) -> usize {
    let eff = effective_strides(dims, strides);
    1 + dims
        .iter()
        .zip(&eff)
        .map(|(&d, &s)| ((d - 1) * s) as usize)
        .sum::<usize>()
}

/// An element type the scans support, with its reference arithmetic.
trait Elem: Copy + PartialEq + std::fmt::Debug + 'static {
    const DTYPE: u32;
    const ZERO: Self;
    fn add(self, other: Self) -> Self;
    fn from_i64(v: i64) -> Self;
    /// Bitwise equality, so that floats compare exactly (and -0.0 differs from 0.0).
    fn bits(self) -> u64;
}

impl Elem for f32 {
    const DTYPE: u32 = GUILD_DTYPE_F32;
    const ZERO: Self = 0.0;
    fn add(self, other: Self) -> Self {
        self + other
    }
    fn from_i64(v: i64) -> Self {
        v as f32 / 8.0
    }
    fn bits(self) -> u64 {
        u64::from(self.to_bits())
    }
}

impl Elem for f64 {
    const DTYPE: u32 = GUILD_DTYPE_F64;
    const ZERO: Self = 0.0;
    fn add(self, other: Self) -> Self {
        self + other
    }
    fn from_i64(v: i64) -> Self {
        v as f64 / 3.0
    }
    fn bits(self) -> u64 {
        self.to_bits()
    }
}

impl Elem for i32 {
    const DTYPE: u32 = GUILD_DTYPE_I32;
    const ZERO: Self = 0;
    fn add(self, other: Self) -> Self {
        self.wrapping_add(other)
    }
    fn from_i64(v: i64) -> Self {
        v as i32
    }
    fn bits(self) -> u64 {
        u64::from(self as u32)
    }
}

impl Elem for i64 {
    const DTYPE: u32 = GUILD_DTYPE_I64;
    const ZERO: Self = 0;
    fn add(self, other: Self) -> Self {
        self.wrapping_add(other)
    }
    fn from_i64(v: i64) -> Self {
        v.wrapping_mul(1 << 33)
    }
    fn bits(self) -> u64 {
        self as u64
    }
}

/// The reference scan: left to right along dims[0], for every row.
fn reference<T: Elem>(
    input: &[T],
    output: &mut [T],
    dims: &[u64],
    in_strides: &[u64],
    out_strides: &[u64],
    exclusive: bool,
) {
    let n = dims[0] as usize;
    for (ri, ro) in row_offsets(dims, in_strides)
        .into_iter()
        .zip(row_offsets(dims, out_strides))
    {
        let mut acc = T::ZERO;
        for k in 0..n {
            let v = input[ri + k];
            if exclusive {
                output[ro + k] = acc;
                acc = acc.add(v);
            } else {
                acc = acc.add(v);
                output[ro + k] = acc;
            }
        }
    }
}

/// A generated case: shape, outer strides of input and output (0 = packed, or packed plus a
/// gap), input values and which scan.
#[derive(Debug, Clone)]
struct Case {
    dims: Vec<u64>,
    in_strides: Vec<u64>,
    out_strides: Vec<u64>,
    values: Vec<i64>,
    exclusive: bool,
    dtype: usize,
}

/// Strides for `dims`: per outer axis 0 (packed) or the packed extent plus `gap`.
fn strides_from(dims: &[u64], gaps: &[Option<u64>]) -> Vec<u64> {
    let mut strides = vec![0u64; dims.len()];
    let mut prev = 1u64;
    for i in 1..dims.len() {
        let packed = prev * dims[i - 1];
        strides[i] = gaps[i - 1].map_or(0, |gap| packed + gap);
        prev = if strides[i] == 0 { packed } else { strides[i] };
    }
    strides
}

fn case() -> impl Strategy<Value = Case> {
    (1usize..=4)
        .prop_flat_map(|rank| {
            (
                proptest::collection::vec(1u64..=5, rank),
                proptest::collection::vec(proptest::option::of(0u64..=3), rank - 1),
                proptest::collection::vec(proptest::option::of(0u64..=3), rank - 1),
                any::<bool>(),
                0usize..4,
            )
        })
        .prop_flat_map(|(dims, in_gaps, out_gaps, exclusive, dtype)| {
            let in_strides = strides_from(&dims, &in_gaps);
            let out_strides = strides_from(&dims, &out_gaps);
            let len = extent(&dims, &in_strides);
            proptest::collection::vec(-1000i64..=1000, len).prop_map(move |values| Case {
                dims: dims.clone(),
                in_strides: in_strides.clone(),
                out_strides: out_strides.clone(),
                values,
                exclusive,
                dtype,
            })
        })
}

/// Runs one case through `callbacks` and the reference; returns the C and Rust outputs.
fn run_case<T: Elem>(callbacks: &Callbacks, case: &Case) -> (Vec<u64>, Vec<u64>) {
    const SENTINEL: i64 = 7777;
    let mut input: Vec<T> = case.values.iter().map(|&v| T::from_i64(v)).collect();
    let out_len = extent(&case.dims, &case.out_strides);
    let mut output = vec![T::from_i64(SENTINEL); out_len];
    let mut expected = output.clone();
    reference(
        &input,
        &mut expected,
        &case.dims,
        &case.in_strides,
        &case.out_strides,
        case.exclusive,
    );
    let before = input.clone();
    let inputs = [tensor(
        T::DTYPE,
        &case.dims,
        &case.in_strides,
        input.as_mut_ptr().cast(),
    )];
    let outputs = [tensor(
        T::DTYPE,
        &case.dims,
        &case.out_strides,
        output.as_mut_ptr().cast(),
    )];
    assert_eq!(
        callbacks.validate(&inputs, &outputs),
        (GUILD_STATUS_OK, String::new())
    );
    let (status, scratch) = callbacks.scratch(&inputs, &outputs);
    assert_eq!(status, GUILD_STATUS_OK);
    assert_eq!((scratch.host_bytes, scratch.device_bytes), (0, 0));
    let (status, message) = callbacks.execute(&inputs, &outputs, &mut []);
    assert_eq!(status, GUILD_STATUS_OK, "{message}");
    assert_eq!(input, before, "the input is left alone");
    (
        output.iter().map(|v| v.bits()).collect(),
        expected.iter().map(|v| v.bits()).collect(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn both_scans_match_the_reference_over_shapes_dtypes_and_strides(case in case()) {
        let id = if case.exclusive { EXCLUSIVE } else { INCLUSIVE };
        let callbacks = Callbacks::new(load_scan(), id);
        let (got, want) = match case.dtype {
            0 => run_case::<f32>(&callbacks, &case),
            1 => run_case::<f64>(&callbacks, &case),
            2 => run_case::<i32>(&callbacks, &case),
            _ => run_case::<i64>(&callbacks, &case),
        };
        // Padding between rows keeps the sentinel: the scan writes only inside the tensor.
        prop_assert_eq!(got, want);
    }
}

#[test]
fn a_hand_checked_strided_case_and_in_place() {
    let callbacks = Callbacks::new(load_scan(), EXCLUSIVE);
    // Two rows of three, the input's second row six elements on, the output packed.
    let mut input = [1i32, 2, 3, -9, -9, -9, 10, 20, 30];
    let mut output = [0i32; 6];
    let inputs = [tensor(
        GUILD_DTYPE_I32,
        &[3, 2],
        &[0, 6],
        input.as_mut_ptr().cast(),
    )];
    let outputs = [tensor(
        GUILD_DTYPE_I32,
        &[3, 2],
        &[],
        output.as_mut_ptr().cast(),
    )];
    assert_eq!(
        callbacks.execute(&inputs, &outputs, &mut []).0,
        GUILD_STATUS_OK
    );
    assert_eq!(output, [0, 1, 3, 0, 10, 30]);

    // In place, same layout (capability bit 0).
    let both = [tensor(
        GUILD_DTYPE_I32,
        &[3, 2],
        &[0, 6],
        input.as_mut_ptr().cast(),
    )];
    assert_eq!(callbacks.execute(&both, &both, &mut []).0, GUILD_STATUS_OK);
    assert_eq!(input, [0, 1, 3, -9, -9, -9, 0, 10, 30]);

    // The alternative provider does not run in place and touches nothing.
    let alt = Callbacks::new(load_alt(), ALT_INCLUSIVE);
    let mut data = [1.0f32, 2.0, 3.0];
    let same = [tensor(GUILD_DTYPE_F32, &[3], &[], data.as_mut_ptr().cast())];
    assert_eq!(
        alt.execute(&same, &same, &mut []),
        (
            GUILD_STATUS_ERR_UNSUPPORTED,
            "this scan does not run in place".into()
        )
    );
    assert_eq!(data, [1.0, 2.0, 3.0]);
}

#[test]
fn validate_refuses_mismatches_with_a_reason() {
    let scan = Callbacks::new(load_scan(), INCLUSIVE);
    let alt = Callbacks::new(load_alt(), ALT_INCLUSIVE);
    let null = std::ptr::null_mut();
    let t = |dtype, dims: &[u64], strides: &[u64]| tensor(dtype, dims, strides, null);
    let refused = |c: &Callbacks, i, o, message: &str| {
        assert_eq!(
            c.validate(&[i], &[o]),
            (GUILD_STATUS_ERR_UNSUPPORTED, message.to_owned())
        );
    };

    refused(
        &scan,
        t(GUILD_DTYPE_F32, &[4, 2], &[]),
        t(GUILD_DTYPE_F64, &[4, 2], &[]),
        "output dtype 28 (f64) differs from input dtype 0 (f32)",
    );
    refused(
        &scan,
        t(GUILD_DTYPE_I64, &[4, 2], &[]),
        t(GUILD_DTYPE_I64, &[4, 3], &[]),
        "output shape differs from input shape at axis 1 (3 != 2)",
    );
    refused(
        &scan,
        t(GUILD_DTYPE_I32, &[4, 2], &[]),
        t(GUILD_DTYPE_I32, &[4], &[]),
        "output rank 1 differs from input rank 2",
    );
    refused(
        &scan,
        t(GUILD_DTYPE_F16, &[4], &[]),
        t(GUILD_DTYPE_F16, &[4], &[]),
        "input dtype 1 (unsupported) is not supported by this scan",
    );
    refused(
        &scan,
        t(GUILD_DTYPE_F32, &[4, 2], &[0, 3]),
        t(GUILD_DTYPE_F32, &[4, 2], &[]),
        "input: stride 3 of axis 1 overlaps the axes inside it (packed 4)",
    );
    // The alternative provider: floats only, contiguous only, rank 4 at most.
    refused(
        &alt,
        t(GUILD_DTYPE_I32, &[4], &[]),
        t(GUILD_DTYPE_I32, &[4], &[]),
        "input dtype 26 (i32) is not supported by this scan",
    );
    refused(
        &alt,
        t(GUILD_DTYPE_F32, &[4, 2], &[0, 5]),
        t(GUILD_DTYPE_F32, &[4, 2], &[]),
        "axis 1 is outer-strided; this scan takes contiguous tensors only",
    );
    refused(
        &alt,
        t(GUILD_DTYPE_F64, &[1, 1, 1, 1, 1], &[]),
        t(GUILD_DTYPE_F64, &[1, 1, 1, 1, 1], &[]),
        "input: rank 5 is outside 1..4",
    );
    // An explicit stride equal to the packed one is still contiguous.
    assert_eq!(
        alt.validate(
            &[t(GUILD_DTYPE_F64, &[4, 2], &[0, 4])],
            &[t(GUILD_DTYPE_F64, &[4, 2], &[])]
        ),
        (GUILD_STATUS_OK, String::new())
    );
    // Two inputs: the arity is refused too.
    let one = t(GUILD_DTYPE_F32, &[4], &[]);
    assert_eq!(
        scan.validate(&[one, one], &[one]),
        (
            GUILD_STATUS_ERR_UNSUPPORTED,
            "a scan takes exactly one input and one output".into()
        )
    );
}

#[test]
fn execute_refuses_tensors_outside_the_contract_without_writing() {
    let scan = Callbacks::new(load_scan(), INCLUSIVE);
    let mut input = [1.0f64, 2.0];
    let mut output = [5.0f32, 5.0];
    let inputs = [tensor(
        GUILD_DTYPE_F64,
        &[2],
        &[],
        input.as_mut_ptr().cast(),
    )];
    let outputs = [tensor(
        GUILD_DTYPE_F32,
        &[2],
        &[],
        output.as_mut_ptr().cast(),
    )];
    let (status, message) = scan.execute(&inputs, &outputs, &mut []);
    assert_eq!(status, guild_abi::GUILD_STATUS_ERR_INVALID_ARGUMENT);
    assert_eq!(
        message,
        "output dtype 0 (f32) differs from input dtype 28 (f64)"
    );
    assert_eq!(output, [5.0, 5.0], "nothing is written on failure");

    let nothing = [tensor(GUILD_DTYPE_F64, &[2], &[], std::ptr::null_mut())];
    let (status, message) = scan.execute(&inputs, &nothing, &mut []);
    assert_eq!(status, guild_abi::GUILD_STATUS_ERR_INVALID_ARGUMENT);
    assert_eq!(message, "the input or output data pointer is NULL");
}

#[test]
fn scan_dependent_loads_without_a_service_and_refuses_to_execute() {
    let plugin = load("scan_dependent", &[TOTAL]);
    let c = plugin.kernels[0]
        .operation
        .as_ref()
        .expect("a GOP1 contract");
    assert_eq!(c.op_name.as_str(), "example.sequence.scan_then_total");
    assert_eq!(c.impl_id.as_str(), TOTAL);
    assert_eq!(c.priority, 10);
    assert_eq!(c.check(), Ok(()));
    let total = Callbacks::new(plugin, TOTAL);

    let mut input = [1i64, 2, 3, 4, 5, 6];
    let mut output = [-1i64; 2];
    let inputs = [tensor(
        GUILD_DTYPE_I64,
        &[3, 2],
        &[],
        input.as_mut_ptr().cast(),
    )];
    let outputs = [tensor(
        GUILD_DTYPE_I64,
        &[1, 2],
        &[],
        output.as_mut_ptr().cast(),
    )];
    assert_eq!(
        total.validate(&inputs, &outputs),
        (GUILD_STATUS_OK, String::new())
    );
    let (status, scratch) = total.scratch(&inputs, &outputs);
    assert_eq!(status, GUILD_STATUS_OK);
    assert_eq!(
        (scratch.alignment, scratch.host_bytes, scratch.device_bytes),
        (8, 48, 0)
    );
    let mut buffer = [0u64; 6];
    let (status, message) = total.execute(&inputs, &outputs, &mut buffer);
    assert_eq!(status, GUILD_STATUS_ERR_UNSUPPORTED);
    assert_eq!(
        message,
        "no operation service: the host offered none at init, so \
         example.sequence.inclusive_scan cannot be resolved"
    );
    assert_eq!(output, [-1, -1], "nothing is written on failure");

    // Its own contract: one total per row.
    assert_eq!(
        total.validate(
            &inputs,
            &[tensor(GUILD_DTYPE_I64, &[3, 2], &[], std::ptr::null_mut())]
        ),
        (
            GUILD_STATUS_ERR_UNSUPPORTED,
            "output dims[0] must be 1 (one total per row), not 3".into()
        )
    );
}
