//! Finding, loading and reading the C test plugins, building load requests for them, and
//! reading the marker lines some of them write.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use guild_abi::{
    guild_plugin_descriptor_v1_t, guild_plugin_entry_fn, GUILD_PLUGIN_ENTRY_SYMBOL_V1,
};
use guild_domain::ids::{ImplId, PackageId, RunnerId};
use guild_domain::version::{PackedVersion, Version};
use guild_ports::loader::LoadRequest;
use libloading::{Library, Symbol};

/// The variable through which `cargo xtask test` names the directory of built plugins.
const PLUGIN_DIR_VAR: &str = "GUILD_TEST_PLUGIN_DIR";

/// The directory that holds the built test plugins.
fn plugin_dir() -> PathBuf {
    match std::env::var_os(PLUGIN_DIR_VAR) {
        Some(dir) => PathBuf::from(dir),
        // This crate lives at crates/adapters-posix, two levels below the workspace root.
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/test-plugins/lib"),
    }
}

/// The variable that tells the C test plugins where to write marker lines
/// (test-plugins/common/guild_test_marker.h).
const MARKER_DIR_VAR: &str = "GUILD_TEST_MARKER_DIR";

/// This test process's marker directory, created empty and announced to the plugins through the
/// environment the first time any test asks for a plugin.
///
/// The variable is set exactly once, before any plugin can run: every path that loads a plugin
/// goes through [`plugin_path`], which calls this first, and `OnceLock` makes every later caller
/// wait for the first. So no C code reads the environment while it is being written.
pub fn marker_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("adapters-posix-markers-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        std::env::set_var(MARKER_DIR_VAR, &dir);
        dir
    })
}

/// The marker lines `plugin` has written in this process, oldest first.
pub fn marker_lines(plugin: &str) -> Vec<String> {
    let path = marker_dir().join(format!("{plugin}.log"));
    match fs::read_to_string(&path) {
        Ok(text) => text.lines().map(str::to_owned).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => panic!("cannot read {}: {e}", path.display()),
    }
}

/// A load request for `test-plugins/<name>` as package `test.<name>` 1.0.0 under Kernel ABI
/// 1.0.0, declaring `ops` and `runners`, with no operation service.
pub fn request(name: &str, ops: &[&str], runners: &[&str]) -> LoadRequest {
    LoadRequest {
        package: PackageId::new(format!("test.{name}")).expect("a valid package id"),
        version: Version::new(1, 0, 0),
        library: plugin_path(name),
        provided_ops: ops
            .iter()
            .map(|id| ImplId::new(*id).expect("a valid impl id"))
            .collect(),
        provided_runners: runners
            .iter()
            .map(|id| RunnerId::new(*id).expect("a valid runner id"))
            .collect(),
        host_abi: PackedVersion::KERNEL_ABI_V1,
        operations: None,
    }
}

/// The path of the test plugin built from `test-plugins/<name>`. A missing library fails the
/// test: passing without having loaded anything would prove nothing.
pub fn plugin_path(name: &str) -> PathBuf {
    marker_dir();
    // CMake names MODULE libraries lib<name>.so on Linux and macOS alike.
    let path = plugin_dir().join(format!("lib{name}.so"));
    assert!(
        path.is_file(),
        "test plugin {} is missing; build the C test plugins with `cargo xtask plugins` \
         (or run everything with `cargo xtask test`), or point {PLUGIN_DIR_VAR} at their directory",
        path.display()
    );
    path
}

/// A loaded test plugin and the descriptor its entry point returned.
pub struct LoadedPlugin {
    descriptor: *const guild_plugin_descriptor_v1_t,
    // Declared last so that it is dropped last: the descriptor points into the library.
    _library: Library,
}

impl LoadedPlugin {
    /// Loads `test-plugins/<name>`, calls its entry point and checks that the descriptor is large
    /// enough to be read as a `guild_plugin_descriptor_v1_t`.
    pub fn load(name: &str) -> LoadedPlugin {
        let path = plugin_path(name);
        // SAFETY: loading a library runs its initialisers. The test plugins are C99 sources in
        // this repository (test-plugins/) with no constructors, built by `cargo xtask plugins`;
        // loading them is the trust decision this test exists to make.
        let library = unsafe { Library::new(&path) }
            .unwrap_or_else(|e| panic!("cannot load {}: {e}", path.display()));
        let entry = {
            // SAFETY: every Guild plugin exports this symbol with the type the mirror gives it
            // (`guild_plugin_entry_fn`, the header's `guild_plugin_entry_fn` with NULL as None);
            // the Symbol borrows `library`, which stays loaded for the whole block.
            let symbol: Symbol<'_, guild_plugin_entry_fn> =
                unsafe { library.get(GUILD_PLUGIN_ENTRY_SYMBOL_V1.to_bytes_with_nul()) }
                    .unwrap_or_else(|e| panic!("{} has no entry symbol: {e}", path.display()));
            (*symbol)
                .unwrap_or_else(|| panic!("{}: the entry symbol's address is NULL", path.display()))
        };
        // SAFETY: the entry point takes no arguments and, per the header, only returns a pointer
        // to the plugin's static descriptor (or NULL); the library is still loaded.
        let descriptor = unsafe { entry() };
        assert!(
            !descriptor.is_null(),
            "{}: the entry point returned NULL",
            path.display()
        );
        // SAFETY: `descriptor` is non-NULL and points at static storage in the loaded library.
        // `struct_size` is the first field of every version of the descriptor, so reading it
        // alone is valid before anything else is known about the plugin's layout.
        let struct_size = unsafe { std::ptr::addr_of!((*descriptor).struct_size).read() };
        let needed = std::mem::size_of::<guild_plugin_descriptor_v1_t>();
        assert!(
            usize::try_from(struct_size).is_ok_and(|size| size >= needed),
            "{}: descriptor struct_size {struct_size} is smaller than the {needed} bytes of v1",
            path.display()
        );
        LoadedPlugin {
            descriptor,
            _library: library,
        }
    }

    /// The plugin's descriptor, valid while `self` keeps the library loaded.
    pub fn descriptor(&self) -> &guild_plugin_descriptor_v1_t {
        // SAFETY: `load` checked that the pointer is non-NULL and that the plugin says the
        // descriptor spans at least a whole v1 struct; it has static storage in the library,
        // which `self` keeps loaded for as long as the returned borrow lives.
        unsafe { &*self.descriptor }
    }
}

/// The text of a fixed error-record buffer.
pub fn guild_text(buffer: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = buffer
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8(bytes).expect("UTF-8")
}

/// A host-blocking CPU query for `op` over the given tensors: same-major version 1, no required
/// capabilities or numerics, unlimited budgets, no exact impl id, no device capabilities.
pub fn host_query(
    op: &'static std::ffi::CStr,
    inputs: &[guild_abi::guild_tensor_desc_v1_t],
    outputs: &[guild_abi::guild_tensor_desc_v1_t],
) -> guild_abi::guild_operation_query_v1_t {
    guild_abi::guild_operation_query_v1_t {
        struct_size: size_of::<guild_abi::guild_operation_query_v1_t>() as u32,
        version: 1,
        op_name: op.as_ptr(),
        min_op_version: 0x0100_0000,
        max_op_version: 0x01ff_ffff,
        backends: guild_abi::GUILD_BACKEND_CPU,
        sync_mode: guild_abi::GUILD_SYNC_HOST_BLOCKING,
        required_capabilities: 0,
        required_numerics: 0,
        inputs: inputs.as_ptr(),
        input_count: inputs.len(),
        outputs: outputs.as_ptr(),
        output_count: outputs.len(),
        ram_budget: guild_abi::GUILD_BUDGET_UNLIMITED,
        vram_budget: guild_abi::GUILD_BUDGET_UNLIMITED,
        exact_impl_id: std::ptr::null(),
        device_caps: std::ptr::null(),
        params: std::ptr::null(),
        params_size: 0,
    }
}
