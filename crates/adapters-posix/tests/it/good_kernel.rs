//! The good C plugin in depth: its GOP1 contract converted to the domain field by field, the
//! copies the host kept (and where their pointers lead), its callbacks working after init's stack
//! is gone, its view of the host table, and the library's lifetime.

use std::ffi::c_void;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use guild_abi::{
    guild_error_info_t, guild_execute_args_v1_t, guild_ext_header_t, guild_host_api_v1_t,
    guild_operation_query_v1_t, guild_operation_service_v1_t, guild_scratch_request_v1_t,
    guild_tensor_desc_v1_t, GUILD_DTYPE_F32, GUILD_GOP1_TAG, GUILD_HOST_API_V1_BASE_SIZE,
    GUILD_LOG_LEVEL_INFO, GUILD_MEMORY_HOST, GUILD_OPERATION_SERVICE_VERSION, GUILD_STATUS_OK,
    GUILD_SYNC_HOST_BLOCKING,
};
use guild_adapters_posix::{DlopenLoader, OwnedKernel, OwnedRunner, PluginLog};
use guild_domain::ids::{ImplId, OpName, PackageId};
use guild_domain::operation::{
    Arity, Backend, Capabilities, CpuIsa, DType, LayoutSet, MemorySpaceSet, Numerics, OpCandidate,
    SyncModeSet,
};
use guild_domain::version::PackedVersion;
use guild_ports::loader::{LoadedPlugin, PluginLoader, ServiceTable};

use crate::support::{plugin_path, request};

const RMS_NORM: &str = "test.good_kernel.rms_norm_f32";
const PREFIX_SUM: &str = "test.good_kernel.prefix_sum_f32";
const RUNNER: &str = "test.good_kernel.runner";

fn load_good(loader: &DlopenLoader) -> LoadedPlugin {
    loader
        .load(&request("good_kernel", &[RMS_NORM, PREFIX_SUM], &[RUNNER]))
        .unwrap_or_else(|e| panic!("good_kernel failed to load: {e}"))
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

/// The CPU feature good_kernel.c requires on this architecture.
fn expected_isa() -> CpuIsa {
    if cfg!(target_arch = "x86_64") {
        CpuIsa::SSE4_2
    } else if cfg!(target_arch = "aarch64") {
        CpuIsa::NEON
    } else {
        CpuIsa::EMPTY
    }
}

#[test]
fn the_gop1_contract_converts_field_by_field() {
    let loader = DlopenLoader::new();
    let plugin = load_good(&loader);
    let kernel = plugin
        .kernels
        .iter()
        .find(|k| k.impl_id.as_str() == PREFIX_SUM)
        .expect("the prefix sum is registered");
    let c = kernel
        .operation
        .as_ref()
        .expect("the prefix sum carries a GOP1 contract");

    // Field by field first, so that a failure names the field; then the whole value, so that a
    // field added to OpCandidate later cannot be left out of this test.
    assert_eq!(c.impl_id.as_str(), PREFIX_SUM);
    assert_eq!(c.op_name.as_str(), "test.sequence.prefix_sum");
    assert_eq!(c.backend, Backend::Cpu);
    assert_eq!(c.priority, 50);
    assert_eq!(c.op_version, PackedVersion::new(1, 2, 0).expect("packs"));
    assert_eq!(c.capabilities, Capabilities::from_bits(0x21));
    assert_eq!(
        c.numerics,
        Numerics::DETERMINISTIC | Numerics::F32_ACCUMULATION | Numerics::ORDERED_REDUCTION
    );
    assert_eq!(c.input_dtype, DType::F32);
    assert_eq!(c.output_dtype, DType::F32);
    assert_eq!(c.inputs, Arity::exactly(1));
    assert_eq!(c.outputs, Arity::exactly(1));
    assert_eq!(c.layouts, LayoutSet::CONTIGUOUS | LayoutSet::OUTER_STRIDED);
    assert_eq!(
        c.memory_spaces,
        MemorySpaceSet::HOST | MemorySpaceSet::HOST_PINNED
    );
    assert_eq!(c.min_alignment, 16);
    assert_eq!((c.min_rank, c.max_rank), (1, 2));
    assert_eq!(c.max_dim, [1 << 20, 1 << 16, 0, 0, 0, 0, 0, 0]);
    assert_eq!(c.max_batch, 1 << 16);
    assert_eq!(c.sync_modes, SyncModeSet::HOST_BLOCKING);
    assert_eq!((c.min_sm, c.max_sm), (0, 0));
    assert_eq!(c.cpu_isa, expected_isa());

    let expected = OpCandidate {
        impl_id: ImplId::new(PREFIX_SUM).expect("valid"),
        op_name: OpName::new("test.sequence.prefix_sum").expect("valid"),
        backend: Backend::Cpu,
        priority: 50,
        op_version: PackedVersion::new(1, 2, 0).expect("packs"),
        capabilities: Capabilities::from_bits(0x21),
        numerics: Numerics::DETERMINISTIC
            | Numerics::F32_ACCUMULATION
            | Numerics::ORDERED_REDUCTION,
        input_dtype: DType::F32,
        output_dtype: DType::F32,
        inputs: Arity::exactly(1),
        outputs: Arity::exactly(1),
        layouts: LayoutSet::CONTIGUOUS | LayoutSet::OUTER_STRIDED,
        memory_spaces: MemorySpaceSet::HOST | MemorySpaceSet::HOST_PINNED,
        min_alignment: 16,
        min_rank: 1,
        max_rank: 2,
        max_dim: [1 << 20, 1 << 16, 0, 0, 0, 0, 0, 0],
        max_batch: 1 << 16,
        sync_modes: SyncModeSet::HOST_BLOCKING,
        min_sm: 0,
        max_sm: 0,
        cpu_isa: expected_isa(),
    };
    assert_eq!(c, &expected);
    assert_eq!(c.check(), Ok(()));
    let owned = owned_kernel(&plugin, PREFIX_SUM);
    assert_eq!(owned.candidate(), Some(&expected));
}

#[test]
fn the_host_keeps_copies_that_point_into_its_own_memory() {
    let loader = DlopenLoader::new();
    let plugin = load_good(&loader);

    let scan = owned_kernel(&plugin, PREFIX_SUM);
    let d = scan.descriptor();
    assert_eq!(d.struct_size as usize, size_of_val(d));
    assert_eq!(d.impl_id, scan.impl_id_cstr().as_ptr());
    assert_eq!(scan.impl_id_cstr(), c"test.good_kernel.prefix_sum_f32");
    assert_eq!(d.op_name, scan.op_name_cstr().expect("an op name").as_ptr());
    let op = scan.operation().expect("a GOP1 copy");
    assert_eq!(
        d.next_ext,
        std::ptr::from_ref(op).cast::<guild_ext_header_t>()
    );
    assert_eq!(op.header.tag, GUILD_GOP1_TAG);
    assert_eq!(op.header.struct_size as usize, size_of_val(op));
    assert!(op.header.next.is_null(), "the copied chain ends at GOP1");
    assert!(d.kernel_fns.is_null());
    assert!(scan.skipped_tags().is_empty());

    // The legacy kernel's chain held only a vendor extension, which was skipped, not copied.
    let norm = owned_kernel(&plugin, RMS_NORM);
    assert_eq!(norm.skipped_tags(), [u32::from_be_bytes(*b"TST1")]);
    assert!(norm.descriptor().next_ext.is_null());
    assert!(norm.operation().is_none());
    assert!(norm.op_name_cstr().is_none());
    assert!(
        !norm.descriptor().kernel_fns.is_null(),
        "a legacy table pointer is carried as it is"
    );
    assert_eq!(norm.descriptor().max_dim[0], 8192);

    let provider: Arc<dyn std::any::Any + Send + Sync> = plugin.runners[0].provider.clone();
    let runner = provider
        .downcast::<OwnedRunner>()
        .expect("the loader's provider is an OwnedRunner");
    assert_eq!(runner.runner_id().as_str(), RUNNER);
    assert_eq!(
        runner.descriptor().runner_id,
        runner.runner_id_cstr().as_ptr()
    );
    let model = runner.model().expect("an RMD1 copy");
    assert_eq!(
        runner.descriptor().next_ext,
        std::ptr::from_ref(model).cast::<guild_ext_header_t>()
    );
    assert_eq!((runner.descriptor().priority, model.priority), (3, 7));
    assert_eq!(runner.selection_priority(), 7);
    assert!(model.header.next.is_null());
}

#[test]
fn the_copied_callbacks_work_after_init_returned() {
    let loader = DlopenLoader::new();
    let plugin = load_good(&loader);
    let scan = owned_kernel(&plugin, PREFIX_SUM);
    let op = scan.operation().expect("a GOP1 copy");
    let (validate, query_scratch, execute) = (
        op.validate.expect("validate"),
        op.query_scratch.expect("query_scratch"),
        op.execute.expect("execute"),
    );

    // Two rows of four, the second starting six elements after the first (outer-strided).
    let mut input = [1.0f32, 2.0, 3.0, 4.0, -7.0, -7.0, 10.0, 20.0, 30.0, 40.0];
    let mut output = [0.0f32; 10];
    let shape = |data: *mut f32| {
        let mut t = tensor(&[4, 2], data.cast());
        t.strides[1] = 6;
        t
    };
    let inputs = [shape(input.as_mut_ptr())];
    let outputs = [shape(output.as_mut_ptr())];
    let query = query(&inputs, &outputs);
    let mut error = guild_error_info_t::new();
    let mut scratch = guild_scratch_request_v1_t {
        struct_size: size_of::<guild_scratch_request_v1_t>() as u32,
        alignment: 99,
        host_bytes: 99,
        device_bytes: 99,
    };
    let args = guild_execute_args_v1_t {
        struct_size: size_of::<guild_execute_args_v1_t>() as u32,
        reserved: 0,
        inputs: inputs.as_ptr(),
        input_count: 1,
        outputs: outputs.as_ptr(),
        output_count: 1,
        scratch_host: std::ptr::null_mut(),
        scratch_host_size: 0,
        scratch_device: std::ptr::null_mut(),
        scratch_device_size: 0,
        stream: std::ptr::null_mut(),
        device_id: 0,
        sync_mode: GUILD_SYNC_HOST_BLOCKING,
        params: std::ptr::null(),
        params_size: 0,
    };

    // SAFETY: the library is loaded (`plugin` holds it); each callback gets the user_data it
    // was registered with and records that live for the call, as GOP1 prescribes.
    let statuses = unsafe {
        [
            validate(op.user_data, &query, &mut error),
            query_scratch(op.user_data, &query, &mut scratch, &mut error),
            execute(op.user_data, &args, &mut error),
        ]
    };

    assert_eq!(statuses, [GUILD_STATUS_OK; 3], "{:?}", error.message);
    assert_eq!(
        (scratch.alignment, scratch.host_bytes, scratch.device_bytes),
        (0, 0, 0)
    );
    assert_eq!(
        output,
        [1.0, 3.0, 6.0, 10.0, 0.0, 0.0, 10.0, 30.0, 60.0, 100.0]
    );
    assert_eq!(input[..4], [1.0, 2.0, 3.0, 4.0], "the input is left alone");
}

#[test]
fn init_sees_the_operations_tail_only_when_the_host_offers_it() {
    let logs: Arc<Mutex<Vec<(PackageId, PluginLog)>>> = Arc::default();
    let sink = Arc::clone(&logs);
    let loader = DlopenLoader::new().with_log_sink(move |package, record| {
        sink.lock()
            .expect("log lock")
            .push((package.clone(), record.clone()));
    });
    let service = guild_operation_service_v1_t {
        struct_size: size_of::<guild_operation_service_v1_t>() as u32,
        version: GUILD_OPERATION_SERVICE_VERSION,
        user: std::ptr::null_mut(),
        resolve: None,
        describe: None,
        scratch: None,
        execute: None,
        release: None,
        reshape: None,
    };

    let plain = request("good_kernel", &[RMS_NORM, PREFIX_SUM], &[RUNNER]);
    let mut with_service = plain.clone();
    let owner: Arc<dyn std::any::Any + Send + Sync> = Arc::new(());
    with_service.operations = Some(ServiceTable {
        address: std::ptr::from_ref(&service).expose_provenance(),
        keep_alive: Arc::clone(&owner),
    });
    for request in [&plain, &with_service] {
        let plugin = loader
            .load(request)
            .unwrap_or_else(|e| panic!("good_kernel failed to load: {e}"));
        if request.operations.is_some() {
            // The request's copy, the test's, and the loaded library's.
            assert_eq!(
                Arc::strong_count(&owner),
                3,
                "a loaded library keeps the owner of the service table it was given"
            );
        }
        drop(plugin);
    }
    drop(with_service);
    assert_eq!(
        Arc::strong_count(&owner),
        1,
        "the library lets go of the table's owner once it is closed"
    );

    let expected = |size: usize, service: &str| {
        (
            PackageId::new("test.good_kernel").expect("valid"),
            PluginLog {
                level: GUILD_LOG_LEVEL_INFO,
                status: GUILD_STATUS_OK,
                component: "test.good_kernel".into(),
                message: format!(
                    "registered 2 kernels and 1 runner; host table of {size} bytes; operation \
                     service {service}"
                ),
            },
        )
    };
    assert_eq!(
        *logs.lock().expect("log lock"),
        [
            expected(GUILD_HOST_API_V1_BASE_SIZE, "absent"),
            expected(size_of::<guild_host_api_v1_t>(), "copied")
        ]
    );
}

#[test]
fn dropping_the_last_arc_runs_shutdown_and_unmaps_the_library() {
    // A private copy of the library, so that no other test holds the same file open and the
    // process's memory map shows exactly this load.
    let copy = private_copy("good_kernel", "lifetime");
    let loader = DlopenLoader::new();
    let mut request = request("good_kernel", &[RMS_NORM, PREFIX_SUM], &[RUNNER]);
    request.library = copy.clone();
    let before = loader.open_libraries();

    let plugin = loader
        .load(&request)
        .unwrap_or_else(|e| panic!("good_kernel failed to load: {e}"));
    let library = Arc::clone(&plugin.library);
    assert_eq!(loader.open_libraries(), before + 1);
    assert!(mapped(&copy), "the library is mapped while loaded");

    // Dropping everything but one Arc of the library keeps it loaded.
    drop(plugin);
    assert_eq!(loader.open_libraries(), before + 1);
    assert!(mapped(&copy));

    drop(library);
    assert_eq!(loader.open_libraries(), before);
    if cfg!(target_os = "linux") {
        assert!(
            !mapped(&copy),
            "dlclose of the only handle unmaps the library"
        );
    }
    let _ = fs::remove_file(&copy);
}

#[test]
fn concurrent_loads_each_get_their_own_session() {
    let loader = DlopenLoader::new();
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for _ in 0..25 {
                    let plugin = load_good(&loader);
                    assert_eq!(plugin.kernels.len(), 2);
                    assert_eq!(plugin.runners.len(), 1);
                }
            });
        }
    });
    assert_eq!(loader.open_libraries(), 0);
}

/// Copies `lib<name>.so` to a file only this test uses.
fn private_copy(name: &str, tag: &str) -> PathBuf {
    let source = plugin_path(name);
    let copy = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("lib{name}-{tag}-{}.so", std::process::id()));
    fs::copy(&source, &copy).unwrap_or_else(|e| {
        panic!(
            "cannot copy {} to {}: {e}",
            source.display(),
            copy.display()
        )
    });
    copy
}

/// Whether `path` appears in this process's memory map; `true` where there is no
/// `/proc/self/maps` to ask (outside Linux), so that only the loader's tally is checked there.
fn mapped(path: &Path) -> bool {
    let Ok(maps) = fs::read_to_string("/proc/self/maps") else {
        return true;
    };
    let path = path.to_str().expect("a UTF-8 path");
    maps.lines().any(|line| line.ends_with(path))
}

fn tensor(dims: &[u64], data: *mut c_void) -> guild_tensor_desc_v1_t {
    let mut t = guild_tensor_desc_v1_t {
        dtype: GUILD_DTYPE_F32,
        rank: dims.len() as u32,
        dims: [0; 8],
        strides: [0; 8],
        memory_space: GUILD_MEMORY_HOST,
        device_id: 0,
        data,
    };
    t.dims[..dims.len()].copy_from_slice(dims);
    t
}

fn query(
    inputs: &[guild_tensor_desc_v1_t],
    outputs: &[guild_tensor_desc_v1_t],
) -> guild_operation_query_v1_t {
    crate::support::host_query(c"test.sequence.prefix_sum", inputs, outputs)
}
