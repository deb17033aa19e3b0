//! The registration host driven directly from Rust, through the same `extern "C"` callbacks a
//! plugin calls: every refusal rule with its exact status and reason, the extension chains that
//! must be refused (cycles, short structs, unknown tags where GOP1 belongs, missing callbacks),
//! the ones that must be accepted, the GOP1 conversion with a distinct value in every field, and
//! the staging rules (init thread only, nothing after close).

use std::ffi::{c_char, c_void};
use std::ptr;
use std::sync::{Arc, Mutex};

use guild_abi::{
    guild_error_info_t, guild_execute_args_v1_t, guild_ext_header_t, guild_host_api_v1_t,
    guild_kernel_op_desc_v1_t, guild_model_reader_v1_t, guild_operation_ext_v1_t,
    guild_operation_query_v1_t, guild_prefill_ext_header_t, guild_prefill_kernel_ext_v1_t,
    guild_runner_desc_v1_t, guild_runner_model_ext_v1_t, guild_runner_model_v1_t,
    guild_scratch_request_v1_t, guild_status_t, GUILD_BACKEND_CPU, GUILD_BACKEND_CUDA,
    GUILD_DTYPE_ANY, GUILD_DTYPE_BF16, GUILD_DTYPE_Q4_K, GUILD_GOP1_TAG, GUILD_GOP1_VERSION,
    GUILD_HOST_API_V1_BASE_SIZE, GUILD_KERNEL_ABI_VERSION, GUILD_LAYOUT_OUTER_STRIDED,
    GUILD_LOG_LEVEL_WARN, GUILD_MEMORY_DEVICE, GUILD_MEMORY_HOST, GUILD_MEMORY_MANAGED,
    GUILD_OP_ADD, GUILD_OP_CUSTOM, GUILD_OP_PREFILL_KERNELS, GUILD_PFKE_TAG, GUILD_PFKE_VERSION,
    GUILD_RMD1_TAG, GUILD_RMD1_VERSION, GUILD_STATUS_ERR_ABI_MISMATCH,
    GUILD_STATUS_ERR_ALREADY_EXISTS, GUILD_STATUS_ERR_INVALID_ARGUMENT,
    GUILD_STATUS_ERR_PERMISSION, GUILD_STATUS_ERR_STATE, GUILD_STATUS_OK,
    GUILD_SYNC_GRAPH_CAPTURABLE, GUILD_SYNC_STREAM_ORDERED,
};
use guild_adapters_posix::{
    OwnedKernel, PluginLog, Staged, StagingConfig, StagingHost, MAX_CHAIN_LENGTH,
};
use guild_domain::ids::{ImplId, OpName, RunnerId};
use guild_domain::operation::{
    Arity, Backend, Capabilities, CpuIsa, DType, LayoutSet, MemorySpaceSet, Numerics, OpCandidate,
    SyncModeSet,
};
use guild_domain::version::PackedVersion;

use crate::support::guild_text;

const OP: &str = "test.reg.op";
const RUNNER: &str = "test.reg.runner";

// ---------------------------------------------------------------------------------------------
// Driving a staging host
// ---------------------------------------------------------------------------------------------

/// What one registration call answered: its status and the error record it left.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    status: guild_status_t,
    component: String,
    message: String,
}

/// Opens a staging host declaring `ops` and `runners`, runs `f` with its table on this thread,
/// and closes it.
fn stage<R>(
    ops: &[&str],
    runners: &[&str],
    f: impl FnOnce(&guild_host_api_v1_t) -> R,
) -> (R, Staged) {
    let mut config = StagingConfig::new(PackedVersion::KERNEL_ABI_V1);
    config.provided_ops = ops
        .iter()
        .map(|id| ImplId::new(*id).expect("valid"))
        .collect();
    config.provided_runners = runners
        .iter()
        .map(|id| RunnerId::new(*id).expect("valid"))
        .collect();
    let host = StagingHost::open(config);
    // SAFETY: the table stays valid for the life of the process.
    let table = unsafe { &*host.table() };
    let result = f(table);
    (result, host.close())
}

fn register_kernel(table: &guild_host_api_v1_t, desc: *const guild_kernel_op_desc_v1_t) -> Answer {
    let register = table.register_kernel.expect("register_kernel is set");
    let mut error = guild_error_info_t::new();
    // SAFETY: the table comes from a StagingHost; `desc` is NULL or a descriptor whose pointers
    // lead to locals of the calling test that live across this call; `error` is a live record.
    let status = unsafe { register(table.host_context, desc, &mut error) };
    answer(status, &error)
}

fn register_runner(table: &guild_host_api_v1_t, desc: *const guild_runner_desc_v1_t) -> Answer {
    let register = table.register_runner.expect("register_runner is set");
    let mut error = guild_error_info_t::new();
    // SAFETY: as in register_kernel, for a runner descriptor.
    let status = unsafe { register(table.host_context, desc, &mut error) };
    answer(status, &error)
}

fn answer(status: guild_status_t, error: &guild_error_info_t) -> Answer {
    Answer {
        status,
        component: guild_text(&error.component),
        message: guild_text(&error.message),
    }
}

fn ok() -> Answer {
    Answer {
        status: GUILD_STATUS_OK,
        component: String::new(),
        message: String::new(),
    }
}

fn refused(status: guild_status_t, message: &str) -> Answer {
    Answer {
        status,
        component: "guild.host".into(),
        message: message.into(),
    }
}

// ---------------------------------------------------------------------------------------------
// Descriptors built in Rust
// ---------------------------------------------------------------------------------------------

unsafe extern "C" fn validate(
    _user: *mut c_void,
    _query: *const guild_operation_query_v1_t,
    _error: *mut guild_error_info_t,
) -> guild_status_t {
    GUILD_STATUS_OK
}

unsafe extern "C" fn query_scratch(
    _user: *mut c_void,
    _query: *const guild_operation_query_v1_t,
    _out: *mut guild_scratch_request_v1_t,
    _error: *mut guild_error_info_t,
) -> guild_status_t {
    GUILD_STATUS_OK
}

unsafe extern "C" fn execute(
    _user: *mut c_void,
    _args: *const guild_execute_args_v1_t,
    _error: *mut guild_error_info_t,
) -> guild_status_t {
    GUILD_STATUS_OK
}

unsafe extern "C" fn create(
    _user: *mut c_void,
    _model: *const guild_model_reader_v1_t,
    _out: *mut *mut c_void,
    _error: *mut guild_error_info_t,
) -> guild_status_t {
    GUILD_STATUS_OK
}

unsafe extern "C" fn destroy(_user: *mut c_void, _instance: *mut c_void) {}

unsafe extern "C" fn recognize(
    _user: *mut c_void,
    _model: *const guild_model_reader_v1_t,
    _error: *mut guild_error_info_t,
) -> guild_status_t {
    GUILD_STATUS_OK
}

unsafe extern "C" fn describe(
    _user: *mut c_void,
    _model: *const guild_model_reader_v1_t,
    _out: *mut guild_runner_model_v1_t,
    _error: *mut guild_error_info_t,
) -> guild_status_t {
    GUILD_STATUS_OK
}

unsafe extern "C" fn validate_numerics(
    _user: *mut c_void,
    _model: *const guild_model_reader_v1_t,
    _description: *const guild_runner_model_v1_t,
    _error: *mut guild_error_info_t,
) -> guild_status_t {
    GUILD_STATUS_OK
}

unsafe extern "C" fn gdn_ab(
    _user: *mut c_void,
    _args: *const guild_abi::guild_prefill_gdn_ab_args_v1_t,
    _error: *mut guild_error_info_t,
) -> guild_status_t {
    GUILD_STATUS_OK
}

fn header(tag: u32, version: u32, size: usize) -> guild_ext_header_t {
    guild_ext_header_t {
        struct_size: size as u32,
        tag,
        version,
        reserved: 0,
        next: ptr::null(),
    }
}

/// An extension header with a tag this host does not know.
fn unknown_ext() -> guild_ext_header_t {
    header(
        u32::from_be_bytes(*b"XYZ1"),
        1,
        size_of::<guild_ext_header_t>(),
    )
}

/// A valid GOP1 contract.
fn gop1() -> guild_operation_ext_v1_t {
    guild_operation_ext_v1_t {
        header: header(
            GUILD_GOP1_TAG,
            GUILD_GOP1_VERSION,
            size_of::<guild_operation_ext_v1_t>(),
        ),
        op_version: 0x0100_0000,
        reserved: 0,
        capabilities: 0,
        numerics: 0,
        input_dtype: GUILD_DTYPE_ANY,
        output_dtype: GUILD_DTYPE_ANY,
        min_inputs: 1,
        max_inputs: 1,
        min_outputs: 1,
        max_outputs: 1,
        layouts: 1,
        memory_spaces: GUILD_MEMORY_HOST,
        min_alignment: 0,
        min_rank: 1,
        max_rank: 8,
        sync_modes: 1,
        validate: Some(validate),
        query_scratch: Some(query_scratch),
        execute: Some(execute),
        user_data: ptr::null_mut(),
    }
}

/// A valid RMD1 extension.
fn rmd1() -> guild_runner_model_ext_v1_t {
    guild_runner_model_ext_v1_t {
        header: header(
            GUILD_RMD1_TAG,
            GUILD_RMD1_VERSION,
            size_of::<guild_runner_model_ext_v1_t>(),
        ),
        priority: 4,
        reserved: 0,
        recognize: Some(recognize),
        describe: Some(describe),
        validate_numerics: Some(validate_numerics),
        user_data: ptr::null_mut(),
    }
}

/// A `GUILD_OP_CUSTOM` CPU kernel named [`OP`] with no extension yet.
fn custom() -> guild_kernel_op_desc_v1_t {
    guild_kernel_op_desc_v1_t {
        struct_size: size_of::<guild_kernel_op_desc_v1_t>() as u32,
        abi_version: GUILD_KERNEL_ABI_VERSION,
        op_kind: GUILD_OP_CUSTOM,
        backend: GUILD_BACKEND_CPU,
        impl_id: c"test.reg.op".as_ptr(),
        op_name: c"test.reg.operation".as_ptr(),
        priority: 0,
        sync_mask: 0,
        max_dim: [0; 8],
        max_batch: 0,
        min_sm: 0,
        max_sm: 0,
        required_cpu_isa: 0,
        kernel_fns: ptr::null(),
        user_data: ptr::null_mut(),
        next_ext: ptr::null(),
    }
}

/// [`custom`] with `op` as its one extension.
fn custom_with(op: *const guild_operation_ext_v1_t) -> guild_kernel_op_desc_v1_t {
    let mut d = custom();
    d.next_ext = op.cast();
    d
}

/// A runner named [`RUNNER`] with no extension yet.
fn runner() -> guild_runner_desc_v1_t {
    guild_runner_desc_v1_t {
        struct_size: size_of::<guild_runner_desc_v1_t>() as u32,
        abi_version: GUILD_KERNEL_ABI_VERSION,
        runner_id: c"test.reg.runner".as_ptr(),
        priority: 2,
        reserved: 0,
        user_data: ptr::null_mut(),
        create: Some(create),
        destroy: Some(destroy),
        next_ext: ptr::null(),
    }
}

fn pfke() -> guild_prefill_kernel_ext_v1_t {
    guild_prefill_kernel_ext_v1_t {
        header: guild_prefill_ext_header_t {
            struct_size: size_of::<guild_prefill_kernel_ext_v1_t>() as u32,
            tag: GUILD_PFKE_TAG,
            version: GUILD_PFKE_VERSION,
        },
        gdn_ab: Some(gdn_ab),
        router_projection: None,
    }
}

// ---------------------------------------------------------------------------------------------
// Refusals, data-driven
// ---------------------------------------------------------------------------------------------

/// One refused registration: how to provoke it, and the status and reason it must give.
struct Case {
    name: &'static str,
    status: guild_status_t,
    reason: String,
    run: Box<dyn Fn(&guild_host_api_v1_t) -> Answer>,
}

fn case(
    name: &'static str,
    status: guild_status_t,
    reason: impl Into<String>,
    run: impl Fn(&guild_host_api_v1_t) -> Answer + 'static,
) -> Case {
    Case {
        name,
        status,
        reason: reason.into(),
        run: Box::new(run),
    }
}

/// Runs every case in its own session and checks the answer, the error record, and that the
/// session recorded exactly that refusal and accepted nothing. Reports every failing case.
fn check_refusals(cases: Vec<Case>) {
    let mut failures = Vec::new();
    for case in &cases {
        let (got, staged) = stage(&[OP], &[RUNNER], |t| (case.run)(t));
        let want = refused(case.status, &case.reason);
        if got != want {
            failures.push(format!(
                "{}: answered {got:?}, expected {want:?}",
                case.name
            ));
        }
        if staged.refusals != [case.reason.clone()] {
            failures.push(format!("{}: recorded {:?}", case.name, staged.refusals));
        }
        if !staged.kernels.is_empty() || !staged.runners.is_empty() {
            failures.push(format!("{}: something was accepted", case.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn kernel_reason(reason: &str) -> String {
    format!("kernel {OP}: {reason}")
}

#[test]
fn malformed_extension_chains_are_refused_with_a_reason() {
    let gop1_size = size_of::<guild_operation_ext_v1_t>();
    check_refusals(vec![
        case(
            "a GOP1 extension that links to itself",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            kernel_reason(
                "the next_ext chain has a cycle: extension 0 (GOP1) links back to extension 0",
            ),
            |t| {
                let mut op = gop1();
                let op_ptr = &raw mut op;
                // SAFETY: op_ptr points at the live local, accessed only through it from here.
                unsafe { (*op_ptr).header.next = op_ptr.cast() };
                register_kernel(t, &custom_with(op_ptr))
            },
        ),
        case(
            "a two-extension cycle",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            kernel_reason(
                "the next_ext chain has a cycle: extension 1 (GOP1) links back to extension 0",
            ),
            |t| {
                let mut vendor = unknown_ext();
                let mut op = gop1();
                let (vendor_ptr, op_ptr) = (&raw mut vendor, &raw mut op);
                // SAFETY: both pointers lead to live locals, accessed only through them.
                unsafe {
                    (*vendor_ptr).next = op_ptr.cast();
                    (*op_ptr).header.next = vendor_ptr;
                }
                let mut d = custom();
                d.next_ext = vendor_ptr;
                register_kernel(t, &d)
            },
        ),
        case(
            "an extension smaller than its header",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            kernel_reason(
                "extension 0 declares struct_size 8, smaller than the 24-byte extension header",
            ),
            |t| {
                let mut vendor = unknown_ext();
                vendor.struct_size = 8;
                let mut d = custom();
                d.next_ext = &vendor;
                register_kernel(t, &d)
            },
        ),
        case(
            "a GOP1 extension smaller than GOP1",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            kernel_reason(&format!(
                "extension 0 (GOP1) declares struct_size 24, smaller than the {gop1_size} bytes \
                 of guild_operation_ext_v1_t"
            )),
            |t| {
                let mut op = gop1();
                op.header.struct_size = 24;
                register_kernel(t, &custom_with(&op))
            },
        ),
        case(
            "a GOP1 layout version this host does not know",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            kernel_reason("extension 0 (GOP1) has version 2; this host reads version 1"),
            |t| {
                let mut op = gop1();
                op.header.version = 2;
                register_kernel(t, &custom_with(&op))
            },
        ),
        case(
            "an unknown tag where the GOP1 extension belongs",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            kernel_reason(
                "GUILD_OP_CUSTOM kernels need a GOP1 extension, and next_ext holds only [XYZ1]",
            ),
            |t| {
                let vendor = unknown_ext();
                let mut d = custom();
                d.next_ext = &vendor;
                register_kernel(t, &d)
            },
        ),
        case(
            "a custom kernel with no extension",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            kernel_reason(
                "GUILD_OP_CUSTOM kernels need a GOP1 extension, and next_ext holds an empty chain",
            ),
            |t| register_kernel(t, &custom()),
        ),
        case(
            "GOP1 without validate",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            kernel_reason("extension 0 (GOP1) has a NULL validate callback, which GOP1 requires"),
            |t| {
                let mut op = gop1();
                op.validate = None;
                register_kernel(t, &custom_with(&op))
            },
        ),
        case(
            "GOP1 without query_scratch",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            kernel_reason(
                "extension 0 (GOP1) has a NULL query_scratch callback, which GOP1 requires",
            ),
            |t| {
                let mut op = gop1();
                op.query_scratch = None;
                register_kernel(t, &custom_with(&op))
            },
        ),
        case(
            "GOP1 without execute",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            kernel_reason("extension 0 (GOP1) has a NULL execute callback, which GOP1 requires"),
            |t| {
                let mut op = gop1();
                op.execute = None;
                register_kernel(t, &custom_with(&op))
            },
        ),
        case(
            "a PFKE table in the chain",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            kernel_reason(
                "extension 0 has the PFKE tag, but PFKE is reached through kernel_fns and is \
                 not a next_ext extension",
            ),
            |t| {
                let table = pfke();
                let mut d = custom();
                d.next_ext = ptr::from_ref(&table).cast();
                register_kernel(t, &d)
            },
        ),
        case(
            "two GOP1 extensions",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            kernel_reason("extension 1 is a second GOP1 extension"),
            |t| {
                let second = gop1();
                let mut first = gop1();
                first.header.next = ptr::from_ref(&second).cast();
                register_kernel(t, &custom_with(&first))
            },
        ),
        case(
            "an RMD1 extension on a kernel",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            kernel_reason("extension 0 is RMD1, which belongs on a runner descriptor"),
            |t| {
                let model = rmd1();
                let mut d = custom();
                d.next_ext = ptr::from_ref(&model).cast();
                register_kernel(t, &d)
            },
        ),
        case(
            "GOP1 on a legacy kind",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            kernel_reason("extension 0 is GOP1, but op_kind 0x10 is not GUILD_OP_CUSTOM"),
            |t| {
                let op = gop1();
                let mut d = custom_with(&op);
                d.op_kind = GUILD_OP_ADD;
                register_kernel(t, &d)
            },
        ),
        case(
            "a chain that never ends",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            kernel_reason(&format!(
                "the next_ext chain is longer than {MAX_CHAIN_LENGTH} extensions"
            )),
            |t| {
                let mut chain = vec![unknown_ext(); MAX_CHAIN_LENGTH + 1];
                let base = chain.as_mut_ptr();
                for i in 0..MAX_CHAIN_LENGTH {
                    // SAFETY: i and i + 1 are within the vector, accessed only through `base`.
                    unsafe { (*base.add(i)).next = base.add(i + 1) };
                }
                let mut d = custom();
                d.next_ext = base;
                register_kernel(t, &d)
            },
        ),
        case(
            "kernel_fns on a custom kernel",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            kernel_reason(
                "kernel_fns must be NULL for GUILD_OP_CUSTOM; the GOP1 extension carries the \
                 callbacks",
            ),
            |t| {
                let op = gop1();
                let mut d = custom_with(&op);
                d.kernel_fns = ptr::from_ref(&op).cast();
                register_kernel(t, &d)
            },
        ),
        case(
            "a GOP1 contract the domain rejects",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            kernel_reason(
                "its GOP1 contract is malformed: rank bounds 0..=0 admit no rank in 1..=8",
            ),
            |t| {
                let mut op = gop1();
                op.min_rank = 0;
                op.max_rank = 0;
                register_kernel(t, &custom_with(&op))
            },
        ),
        case(
            "two backend bits",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            kernel_reason("backend 0x3 is not exactly one known GUILD_BACKEND_* bit"),
            |t| {
                let op = gop1();
                let mut d = custom_with(&op);
                d.backend = GUILD_BACKEND_CPU | GUILD_BACKEND_CUDA;
                register_kernel(t, &d)
            },
        ),
        case(
            "no backend bit",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            kernel_reason("backend 0x0 is not exactly one known GUILD_BACKEND_* bit"),
            |t| {
                let op = gop1();
                let mut d = custom_with(&op);
                d.backend = 0;
                register_kernel(t, &d)
            },
        ),
        case(
            "an unknown backend bit",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            kernel_reason("backend 0x8 is not exactly one known GUILD_BACKEND_* bit"),
            |t| {
                let op = gop1();
                let mut d = custom_with(&op);
                d.backend = 0x8;
                register_kernel(t, &d)
            },
        ),
        case(
            "a custom kernel without an operation name",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            kernel_reason("op_name is NULL; GUILD_OP_CUSTOM kernels must name their operation"),
            |t| {
                let op = gop1();
                let mut d = custom_with(&op);
                d.op_name = ptr::null();
                register_kernel(t, &d)
            },
        ),
        case(
            "a custom kernel with an invalid operation name",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            kernel_reason(&format!(
                "op_name: {}",
                OpName::new("Prefix Sum").expect_err("invalid")
            )),
            |t| {
                let op = gop1();
                let mut d = custom_with(&op);
                d.op_name = c"Prefix Sum".as_ptr();
                register_kernel(t, &d)
            },
        ),
        case(
            "prefill kernels without their PFKE table",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            kernel_reason("GUILD_OP_PREFILL_KERNELS needs a PFKE table in kernel_fns"),
            |t| {
                let mut d = custom();
                d.op_kind = GUILD_OP_PREFILL_KERNELS;
                register_kernel(t, &d)
            },
        ),
        case(
            "a PFKE table of an unknown version",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            kernel_reason("its PFKE table has version 7; this host reads version 1"),
            |t| {
                let mut table = pfke();
                table.header.version = 7;
                let mut d = custom();
                d.op_kind = GUILD_OP_PREFILL_KERNELS;
                d.kernel_fns = ptr::from_ref(&table).cast();
                register_kernel(t, &d)
            },
        ),
    ]);
}

#[test]
fn malformed_kernel_descriptors_are_refused_with_a_reason() {
    let desc_size = size_of::<guild_kernel_op_desc_v1_t>();
    check_refusals(vec![
        case(
            "a NULL descriptor",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            "register_kernel was given a NULL descriptor",
            |t| register_kernel(t, ptr::null()),
        ),
        case(
            "a descriptor smaller than v1",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            format!(
                "kernel descriptor: struct_size 16 is smaller than the {desc_size} bytes of \
                 guild_kernel_op_desc_v1_t"
            ),
            |t| {
                let mut d = custom();
                d.struct_size = 16;
                register_kernel(t, &d)
            },
        ),
        case(
            "a descriptor built for Kernel ABI 2",
            GUILD_STATUS_ERR_ABI_MISMATCH,
            "kernel descriptor: built against Kernel ABI 2.0.0, whose layout this Kernel ABI \
             1.0.0 host cannot read",
            |t| {
                let mut d = custom();
                d.abi_version = 0x0200_0000;
                register_kernel(t, &d)
            },
        ),
        case(
            "no impl id",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            "kernel descriptor: impl_id is NULL",
            |t| {
                let mut d = custom();
                d.impl_id = ptr::null();
                register_kernel(t, &d)
            },
        ),
        case(
            "an invalid impl id",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            format!(
                "kernel descriptor: impl_id: {}",
                ImplId::new("Test.Reg").expect_err("invalid")
            ),
            |t| {
                let mut d = custom();
                d.impl_id = c"Test.Reg".as_ptr();
                register_kernel(t, &d)
            },
        ),
        case(
            "an impl id that is not UTF-8",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            "kernel descriptor: impl_id is not UTF-8",
            |t| {
                let latin1: [c_char; 4] = [0x74, 0xe9u8 as c_char, 0x74, 0];
                let mut d = custom();
                d.impl_id = latin1.as_ptr();
                register_kernel(t, &d)
            },
        ),
    ]);
}

#[test]
fn malformed_runner_descriptors_are_refused_with_a_reason() {
    let rmd1_size = size_of::<guild_runner_model_ext_v1_t>();
    let runner_reason = |reason: &str| format!("runner {RUNNER}: {reason}");
    check_refusals(vec![
        case(
            "a NULL runner descriptor",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            "register_runner was given a NULL descriptor",
            |t| register_runner(t, ptr::null()),
        ),
        case(
            "no create",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            runner_reason("create is NULL"),
            |t| {
                let mut r = runner();
                r.create = None;
                register_runner(t, &r)
            },
        ),
        case(
            "no destroy",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            runner_reason("destroy is NULL"),
            |t| {
                let mut r = runner();
                r.destroy = None;
                register_runner(t, &r)
            },
        ),
        case(
            "an RMD1 extension smaller than RMD1",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            runner_reason(&format!(
                "extension 0 (RMD1) declares struct_size 32, smaller than the {rmd1_size} bytes \
                 of guild_runner_model_ext_v1_t"
            )),
            |t| {
                let mut model = rmd1();
                model.header.struct_size = 32;
                let mut r = runner();
                r.next_ext = ptr::from_ref(&model).cast();
                register_runner(t, &r)
            },
        ),
        case(
            "RMD1 without describe",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            runner_reason("extension 0 (RMD1) has a NULL describe callback, which RMD1 requires"),
            |t| {
                let mut model = rmd1();
                model.describe = None;
                let mut r = runner();
                r.next_ext = ptr::from_ref(&model).cast();
                register_runner(t, &r)
            },
        ),
        case(
            "a GOP1 extension on a runner",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            runner_reason("extension 0 is GOP1, which belongs on a GUILD_OP_CUSTOM kernel"),
            |t| {
                let op = gop1();
                let mut r = runner();
                r.next_ext = ptr::from_ref(&op).cast();
                register_runner(t, &r)
            },
        ),
        case(
            "a runner id that is not an id",
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            format!(
                "runner descriptor: runner_id: {}",
                RunnerId::new("").expect_err("invalid")
            ),
            |t| {
                let mut r = runner();
                r.runner_id = c"".as_ptr();
                register_runner(t, &r)
            },
        ),
    ]);
}

// ---------------------------------------------------------------------------------------------
// Accepted registrations
// ---------------------------------------------------------------------------------------------

#[test]
fn unknown_extensions_are_skipped_and_left_out_of_the_copy() {
    let ((first, second), staged) = stage(&[OP, "test.reg.prefill"], &[RUNNER], |t| {
        let op = gop1();
        let mut vendor = unknown_ext();
        vendor.next = ptr::from_ref(&op).cast();
        let mut d = custom();
        d.next_ext = &vendor;
        let kernel = register_kernel(t, &d);

        let model = rmd1();
        let mut tail = unknown_ext();
        tail.tag = u32::from_be_bytes(*b"ABC9");
        let mut head = model;
        head.header.next = &tail;
        let mut r = runner();
        r.next_ext = ptr::from_ref(&head).cast();
        (kernel, register_runner(t, &r))
    });
    assert_eq!((first, second), (ok(), ok()));
    assert!(staged.refusals.is_empty(), "{:?}", staged.refusals);

    let kernel = &staged.kernels[0];
    assert_eq!(kernel.skipped_tags(), [u32::from_be_bytes(*b"XYZ1")]);
    let op = kernel.operation().expect("GOP1 copied");
    assert_eq!(
        kernel.descriptor().next_ext,
        ptr::from_ref(op).cast::<guild_ext_header_t>(),
        "the copied chain starts at the GOP1 copy"
    );
    assert!(op.header.next.is_null());

    let runner = &staged.runners[0];
    assert_eq!(runner.skipped_tags(), [u32::from_be_bytes(*b"ABC9")]);
    let model = runner.model().expect("RMD1 copied");
    assert!(model.header.next.is_null());
    assert_eq!(runner.selection_priority(), 4);
}

#[test]
fn a_newer_minor_descriptor_is_read_up_to_the_v1_fields() {
    /// A descriptor as a newer minor might lay it out: v1 followed by appended fields.
    #[repr(C)]
    struct Newer {
        v1: guild_kernel_op_desc_v1_t,
        appended: [u64; 3],
    }
    /// A GOP1 extension with appended fields, likewise.
    #[repr(C)]
    struct NewerOp {
        v1: guild_operation_ext_v1_t,
        appended: [u64; 2],
    }
    let (answer, staged) = stage(&[OP], &[], |t| {
        let mut op = NewerOp {
            v1: gop1(),
            appended: [7; 2],
        };
        op.v1.header.struct_size = size_of::<NewerOp>() as u32;
        let mut d = Newer {
            v1: custom_with(&op.v1),
            appended: [9; 3],
        };
        d.v1.struct_size = size_of::<Newer>() as u32;
        register_kernel(t, &d.v1)
    });
    assert_eq!(answer, ok());
    let kernel = &staged.kernels[0];
    assert_eq!(
        kernel.descriptor().struct_size as usize,
        size_of::<guild_kernel_op_desc_v1_t>(),
        "the copy is a v1 struct and says so"
    );
    assert_eq!(
        kernel.operation().expect("GOP1").header.struct_size as usize,
        size_of::<guild_operation_ext_v1_t>()
    );
}

#[test]
fn a_prefill_kernel_keeps_a_copy_of_its_pfke_table() {
    let (answer, staged) = stage(&["test.reg.prefill"], &[], |t| {
        let table = pfke();
        let mut d = custom();
        d.impl_id = c"test.reg.prefill".as_ptr();
        d.op_kind = GUILD_OP_PREFILL_KERNELS;
        d.op_name = ptr::null();
        d.kernel_fns = ptr::from_ref(&table).cast();
        register_kernel(t, &d)
    });
    assert_eq!(answer, ok());
    let kernel = &staged.kernels[0];
    let table = kernel.prefill().expect("PFKE copied");
    assert_eq!(
        kernel.descriptor().kernel_fns,
        ptr::from_ref(table).cast::<c_void>()
    );
    assert_eq!(table.header.tag, GUILD_PFKE_TAG);
    assert!(table.gdn_ab.is_some() && table.router_projection.is_none());
    assert!(kernel.candidate().is_none());
}

/// Every GOP1 and descriptor field carries a value unlike the others (and unlike the stock
/// one), so that a field read from the wrong place cannot pass.
#[test]
fn gop1_converts_to_the_domain_with_every_field_in_place() {
    let (answer, staged) = stage(&[OP], &[], |t| {
        let mut op = gop1();
        op.op_version = 0x0200_3004;
        op.capabilities = 0x0000_00f0_0000_0101;
        op.numerics = 0x8000_0000_0000_0005;
        op.input_dtype = GUILD_DTYPE_Q4_K;
        op.output_dtype = GUILD_DTYPE_BF16;
        op.min_inputs = 2;
        op.max_inputs = 5;
        op.min_outputs = 1;
        op.max_outputs = 3;
        op.layouts = GUILD_LAYOUT_OUTER_STRIDED;
        op.memory_spaces = GUILD_MEMORY_DEVICE | GUILD_MEMORY_MANAGED;
        op.min_alignment = 256;
        op.min_rank = 2;
        op.max_rank = 6;
        op.sync_modes = (1 << GUILD_SYNC_STREAM_ORDERED) | (1 << GUILD_SYNC_GRAPH_CAPTURABLE);
        let mut d = custom_with(&op);
        d.backend = GUILD_BACKEND_CUDA;
        d.priority = -17;
        d.max_dim = [11, 12, 13, 14, 15, 16, 17, 18];
        d.max_batch = 1_000_003;
        d.min_sm = 80;
        d.max_sm = 90;
        d.required_cpu_isa = 0x4 | 0x8;
        register_kernel(t, &d)
    });
    assert_eq!(answer, ok());
    let expected = OpCandidate {
        impl_id: ImplId::new(OP).expect("valid"),
        op_name: OpName::new("test.reg.operation").expect("valid"),
        backend: Backend::Cuda,
        priority: -17,
        op_version: PackedVersion::new(2, 3, 4).expect("packs"),
        capabilities: Capabilities::from_bits(0x0000_00f0_0000_0101),
        numerics: Numerics::from_bits(0x8000_0000_0000_0005),
        input_dtype: DType::Q4_K,
        output_dtype: DType::BF16,
        inputs: Arity::new(2, 5),
        outputs: Arity::new(1, 3),
        layouts: LayoutSet::OUTER_STRIDED,
        memory_spaces: MemorySpaceSet::DEVICE | MemorySpaceSet::MANAGED,
        min_alignment: 256,
        min_rank: 2,
        max_rank: 6,
        max_dim: [11, 12, 13, 14, 15, 16, 17, 18],
        max_batch: 1_000_003,
        sync_modes: SyncModeSet::STREAM_ORDERED | SyncModeSet::GRAPH_CAPTURABLE,
        min_sm: 80,
        max_sm: 90,
        cpu_isa: CpuIsa::AVX2 | CpuIsa::FMA,
    };
    assert_eq!(staged.kernels[0].candidate(), Some(&expected));
    assert_eq!(staged.kernels[0].backend(), Backend::Cuda);
}

// ---------------------------------------------------------------------------------------------
// Session rules
// ---------------------------------------------------------------------------------------------

#[test]
fn a_second_registration_of_an_impl_id_is_refused() {
    let (answers, staged) = stage(&[OP], &[RUNNER], |t| {
        let op = gop1();
        let r = runner();
        [
            register_kernel(t, &custom_with(&op)),
            register_kernel(t, &custom_with(&op)),
            register_runner(t, &r),
            register_runner(t, &r),
        ]
    });
    assert_eq!(
        answers,
        [
            ok(),
            refused(
                GUILD_STATUS_ERR_ALREADY_EXISTS,
                "impl id test.reg.op is registered twice"
            ),
            ok(),
            refused(
                GUILD_STATUS_ERR_ALREADY_EXISTS,
                "runner id test.reg.runner is registered twice"
            ),
        ]
    );
    assert_eq!(
        staged.refusals,
        [
            "impl id test.reg.op is registered twice",
            "runner id test.reg.runner is registered twice"
        ]
    );
    assert_eq!((staged.kernels.len(), staged.runners.len()), (1, 1));
}

#[test]
fn ids_outside_the_manifest_are_answered_permission_and_reported_apart() {
    let (answers, staged) = stage(&[], &[], |t| {
        let op = gop1();
        [
            register_kernel(t, &custom_with(&op)),
            register_runner(t, &runner()),
        ]
    });
    assert_eq!(
        answers,
        [
            refused(
                GUILD_STATUS_ERR_PERMISSION,
                "impl id test.reg.op is not in the manifest's provided_ops"
            ),
            refused(
                GUILD_STATUS_ERR_PERMISSION,
                "runner id test.reg.runner is not in the manifest's provided_runners"
            ),
        ]
    );
    assert!(
        staged.refusals.is_empty(),
        "a mismatch is not a malformed registration"
    );
    assert_eq!(staged.undeclared_kernels, [OP]);
    assert_eq!(staged.undeclared_runners, [RUNNER]);
}

#[test]
fn registration_from_another_thread_gets_err_state_and_is_recorded() {
    let (answers, staged) = stage(&[OP], &[], |t| {
        let op = gop1();
        let d = custom_with(&op);
        // The C structs hold raw pointers and so are not Send; their addresses cross instead,
        // as they would between a plugin's threads.
        let (table_at, desc_at) = (
            ptr::from_ref(t).expose_provenance(),
            ptr::from_ref(&d).expose_provenance(),
        );
        let from_thread = std::thread::scope(|scope| {
            scope
                .spawn(move || {
                    // SAFETY: the table lives forever and `d` outlives the scope, which joins
                    // this thread before `stage`'s closure returns.
                    let table =
                        unsafe { &*ptr::with_exposed_provenance::<guild_host_api_v1_t>(table_at) };
                    register_kernel(table, ptr::with_exposed_provenance(desc_at))
                })
                .join()
                .expect("the helper thread ran")
        });
        (from_thread, register_kernel(t, &d))
    });
    let reason = "register_kernel was called from a thread other than the one running init; \
                  registration must happen synchronously on the init thread";
    assert_eq!(answers, (refused(GUILD_STATUS_ERR_STATE, reason), ok()));
    assert_eq!(staged.refusals, [reason]);
    assert_eq!(
        staged.kernels.len(),
        1,
        "the init thread's registration counts"
    );
}

#[test]
fn a_closed_session_answers_err_state_and_drops_logs() {
    let records: Arc<Mutex<Vec<PluginLog>>> = Arc::default();
    let sink = Arc::clone(&records);
    let mut config = StagingConfig::new(PackedVersion::KERNEL_ABI_V1);
    config.provided_ops = vec![ImplId::new(OP).expect("valid")];
    config.log = Some(Arc::new(move |record: &PluginLog| {
        sink.lock().expect("lock").push(record.clone());
    }));
    let host = StagingHost::open(config);
    let table_ptr = host.table();
    // SAFETY: staging host tables stay valid for the life of the process.
    let table = unsafe { &*table_ptr };
    let log = table.log.expect("log is set");
    let mut record = guild_error_info_t::new();
    record.status = -2;
    record.component[0] = b'p' as c_char;
    record.message[..2].copy_from_slice(&[b'h' as c_char, b'i' as c_char]);
    // SAFETY: a live record lent for the call, on the thread that opened the session.
    unsafe { log(table.host_context, GUILD_LOG_LEVEL_WARN, &record) };
    // A record too short to be a guild_error_info_t and a NULL record are dropped.
    let mut short = record;
    short.struct_size = 8;
    // SAFETY: as above; the host reads only struct_size of the short record.
    unsafe { log(table.host_context, GUILD_LOG_LEVEL_WARN, &short) };
    // SAFETY: NULL is checked by the host.
    unsafe { log(table.host_context, GUILD_LOG_LEVEL_WARN, ptr::null()) };
    let staged = host.close();
    assert!(staged.kernels.is_empty() && staged.refusals.is_empty());

    let op = gop1();
    let late = register_kernel(table, &custom_with(&op));
    assert_eq!(
        late,
        refused(
            GUILD_STATUS_ERR_STATE,
            "register_kernel was called through a staging host whose init has returned; the \
             host table is only valid during init"
        )
    );
    assert_eq!(
        register_runner(table, &runner()).status,
        GUILD_STATUS_ERR_STATE
    );
    // SAFETY: as above; the session is closed, so the host drops the record.
    unsafe { log(table.host_context, GUILD_LOG_LEVEL_WARN, &record) };

    assert_eq!(
        *records.lock().expect("lock"),
        [PluginLog {
            level: GUILD_LOG_LEVEL_WARN,
            status: -2,
            component: "p".into(),
            message: "hi".into(),
        }],
        "only the live, well-formed record reached the sink"
    );
}

#[test]
fn a_panicking_log_sink_does_not_unwind_into_the_plugin() {
    let mut config = StagingConfig::new(PackedVersion::KERNEL_ABI_V1);
    config.log = Some(Arc::new(|_: &PluginLog| panic!("the sink fails")));
    let host = StagingHost::open(config);
    // SAFETY: staging host tables stay valid for the life of the process.
    let table = unsafe { &*host.table() };
    let record = guild_error_info_t::new();
    let log = table.log.expect("log is set");
    // SAFETY: a live record lent for the call, on the session's thread. Reaching the next line
    // at all shows that the panic stopped at the boundary.
    unsafe { log(table.host_context, GUILD_LOG_LEVEL_WARN, &record) };
    assert!(host.close().refusals.is_empty());
}

#[test]
fn the_table_has_the_operations_tail_only_when_a_service_is_offered() {
    let mut config = StagingConfig::new(PackedVersion::KERNEL_ABI_V1);
    let old = StagingHost::open(config.clone());
    config.operations = Some(0x1000);
    let new = StagingHost::open(config);
    // SAFETY: staging host tables stay valid for the life of the process.
    let (old_table, new_table) = unsafe { (&*old.table(), &*new.table()) };

    assert_eq!(old_table.struct_size as usize, GUILD_HOST_API_V1_BASE_SIZE);
    assert!(old_table.operations.is_null());
    assert_eq!(
        new_table.struct_size as usize,
        size_of::<guild_host_api_v1_t>()
    );
    assert_eq!(new_table.operations.addr(), 0x1000);
    for table in [old_table, new_table] {
        assert_eq!(table.abi_version, GUILD_KERNEL_ABI_VERSION);
        assert!(table.register_kernel.is_some() && table.register_runner.is_some());
        assert!(table.log.is_some());
    }
    assert_ne!(
        old_table.host_context, new_table.host_context,
        "every session has its own context"
    );
    drop((old.close(), new.close()));
}

#[test]
fn owned_kernels_are_shareable_across_threads() {
    fn shareable<T: Send + Sync + 'static>() {}
    shareable::<OwnedKernel>();
    shareable::<guild_adapters_posix::OwnedRunner>();
    shareable::<guild_adapters_posix::DlopenLibrary>();
}
