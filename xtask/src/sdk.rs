//! Builds the standalone SDK (`cargo xtask sdk`) and the C test plugins against it (`cargo xtask plugins`).
//!
//! The SDK is configured, installed and packaged with CMake alone, exactly as a publisher would do
//! it, and then checked from the outside: a compiler-free CMake project asks for it with several
//! version requests, once at the install prefix and once in a copy unpacked from the CPack archive
//! (which proves that the package is complete and relocatable). The example module the SDK ships
//! under share/guild-sdk/example is copied out of the prefix and built against it, as its README
//! tells an author to (this one check needs a C compiler). The test plugins are then built
//! against the install prefix only, and every plugin's dynamic symbol table is checked so that a
//! plugin exporting anything but its entry point fails the build.
//!
//! Everything lands under `target/`: `guild-sdk` (the prefix), `guild-sdk-build`,
//! `guild-sdk-package`, `guild-sdk-check`, `test-plugins-build` and `test-plugins/lib`.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::util;

/// The symbol every Guild plugin exports (`GUILD_PLUGIN_ENTRY_SYMBOL_V1`).
const ENTRY_SYMBOL: &str = "guild_plugin_entry_v1";

/// Symbols the toolchain may define in any shared library's dynamic table. They are not the
/// plugin's own code, so their presence does not break the one-exported-symbol rule.
const TOOLCHAIN_SYMBOLS: &[&str] = &["_init", "_fini", "_edata", "_end", "__bss_start"];

/// The plugins `plugins()` must produce; a missing one means the CMake project lost it.
const EXPECTED_PLUGINS: &[&str] = &[
    "minimal_kernel",
    "good_kernel",
    "init_fails",
    "duplicate_impl",
    "wrong_ids",
    "other_thread",
    "keeps_host",
    "wrong_abi",
    "no_entry",
    "legacy_provenance",
    "bad_descriptor",
    "scan_module",
    "scan_module_alt",
    "scan_module_tie",
    "scan_dependent",
    "service_probe",
    "cuda_scan",
    "cuda_dense",
    "op_probe",
    "op_many",
    "ext_probe",
    "expert_ref",
    "runner_llama",
    "runner_llama_low",
    "runner_llama_broken",
    "runner_hybrid",
    "runner_hybrid_bad",
    "faulty_none",
    "faulty_write_past",
    "faulty_read_before",
    "faulty_ignores_strides",
    "faulty_rank_accept",
    "faulty_nondeterministic",
    "faulty_crash_init",
    "faulty_hang_execute",
    "compat_scan",
    "compat_dependent",
    // The Llama decode's operations, and the two builds the live-switch test installs.
    "llama_ops",
    "llama_ops_v1",
    "llama_ops_v2",
    // examples/c-runner, built as part of test-plugins.
    "example_c_runner",
];

/// The plugins built only for x86-64 (with GCC or Clang): the AVX2 build of the Llama matvecs,
/// whose kernels carry target attributes, and whose other code must stay baseline x86-64
/// ([`check_isa_confined`]).
const X86_64_PLUGINS: &[&str] = &["llama_ops_avx2"];

/// Test libraries that deliberately lack the entry point (to test the loader's refusal of a
/// library that is not a Guild plugin). They must export nothing at all instead.
const EXPORTS_NOTHING: &[&str] = &["no_entry"];

/// Where every build product of this module goes.
struct Layout {
    root: PathBuf,
    sdk_source: PathBuf,
    sdk_build: PathBuf,
    sdk_prefix: PathBuf,
    sdk_package: PathBuf,
    sdk_check: PathBuf,
    plugins_source: PathBuf,
    plugins_build: PathBuf,
    plugins_out: PathBuf,
}

impl Layout {
    fn new() -> Layout {
        let root = util::root();
        let target = root.join("target");
        Layout {
            sdk_source: root.join("abi-headers"),
            sdk_build: target.join("guild-sdk-build"),
            sdk_prefix: target.join("guild-sdk"),
            sdk_package: target.join("guild-sdk-package"),
            sdk_check: target.join("guild-sdk-check"),
            plugins_source: root.join("test-plugins"),
            plugins_build: target.join("test-plugins-build"),
            plugins_out: target.join("test-plugins").join("lib"),
            root,
        }
    }

    /// A path relative to the workspace root, for short messages.
    fn show(&self, path: &Path) -> String {
        path.strip_prefix(&self.root)
            .unwrap_or(path)
            .display()
            .to_string()
    }
}

/// Configures and installs the SDK into `target/guild-sdk` (as [`sdk`] does, without packaging
/// or checking it) and returns the install prefix: what `cargo xtask dist` ships.
pub fn install() -> Result<PathBuf, String> {
    let layout = Layout::new();
    configure_and_install(&layout)?;
    Ok(layout.sdk_prefix)
}

/// Configures the SDK build without a compiler and installs it into the prefix, removing what
/// an older install left there; answers the CMake generator and the installed files.
fn configure_and_install(layout: &Layout) -> Result<(String, BTreeSet<PathBuf>), String> {
    require_cmake()?;
    let generator = prepare_build_dir(layout, &layout.sdk_source, &layout.sdk_build)?;

    // The SDK must not need a compiler. Pointing every compiler variable at nothing turns an
    // accidental enable_language() in abi-headers/CMakeLists.txt into an immediate failure here.
    let mut configure = Command::new("cmake");
    configure
        .arg("-S")
        .arg(&layout.sdk_source)
        .arg("-B")
        .arg(&layout.sdk_build)
        .args(["-G", &generator])
        .arg(define("CMAKE_INSTALL_PREFIX", &layout.sdk_prefix));
    no_compilers(&mut configure);
    run_captured(&mut configure)?;
    run_captured(
        Command::new("cmake")
            .arg("--install")
            .arg(&layout.sdk_build),
    )?;
    let installed = prune_install_prefix(layout)?;
    println!(
        "sdk: configured {} ({generator}, no compiler), installed {} files into {}",
        layout.show(&layout.sdk_build),
        installed.len(),
        layout.show(&layout.sdk_prefix)
    );
    Ok((generator, installed))
}

/// Configures, installs and packages the SDK into `target/guild-sdk`, checks the installed
/// package's version rules, builds the example module it ships, and returns the install prefix.
pub fn sdk() -> Result<PathBuf, String> {
    let layout = Layout::new();
    let start = Instant::now();
    let (generator, installed) = configure_and_install(&layout)?;

    let package = package_sdk(&layout)?;
    println!("sdk: packaged {}", layout.show(&package));

    let unpacked = unpack_package(&layout, &package, &installed)?;
    check_find_package(&layout, &generator, &layout.sdk_prefix, "prefix")?;
    check_find_package(&layout, &generator, &unpacked, "unpacked")?;
    println!(
        "sdk: find_package(GuildKernelSDK 1.4) finds 1.5.0 and requests for 1.6, 2.0 and 0.9 are \
         refused, at the prefix and in the unpacked archive ({:.1}s)",
        start.elapsed().as_secs_f64()
    );

    let started = Instant::now();
    let library = check_example(&layout, &generator, &installed)?;
    println!(
        "sdk: the shipped example ({EXAMPLE_DIR}) builds from a copy against the prefix alone into \
         {}, exporting only {ENTRY_SYMBOL} ({:.1}s)",
        layout.show(&library),
        started.elapsed().as_secs_f64()
    );
    Ok(layout.sdk_prefix)
}

/// Builds the SDK, then the C test plugins against the installed SDK only, checks each plugin's
/// exported symbols, and returns the directory that holds the plugin libraries.
pub fn plugins() -> Result<PathBuf, String> {
    let prefix = sdk()?;
    let layout = Layout::new();
    let start = Instant::now();
    require_tool("nm", "binutils")?;
    let generator = prepare_build_dir(&layout, &layout.plugins_source, &layout.plugins_build)?;

    // The cached GuildKernelSDK_DIR is dropped on every configure so that find_package searches
    // CMAKE_PREFIX_PATH afresh; the package registries are switched off so that nothing but the
    // prefix named here can answer. The project itself fails unless the SDK it found lies under
    // GUILD_SDK_EXPECTED_PREFIX.
    run_captured(
        Command::new("cmake")
            .arg("-S")
            .arg(&layout.plugins_source)
            .arg("-B")
            .arg(&layout.plugins_build)
            .args(["-G", &generator])
            .args(["-U", "GuildKernelSDK_DIR"])
            .arg(define("CMAKE_PREFIX_PATH", &prefix))
            .arg("-DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON")
            .arg("-DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF")
            .arg(define("GUILD_SDK_EXPECTED_PREFIX", &prefix))
            .arg(define("GUILD_TEST_PLUGIN_OUTPUT_DIR", &layout.plugins_out))
            .arg("-DCMAKE_BUILD_TYPE=Debug")
            .arg("-DCMAKE_EXPORT_COMPILE_COMMANDS=ON"),
    )?;
    let jobs = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .to_string();
    run_captured(
        Command::new("cmake")
            .arg("--build")
            .arg(&layout.plugins_build)
            .args(["--parallel", &jobs]),
    )?;
    check_compile_commands(&layout, &prefix)?;

    let x86_64 = if cfg!(target_arch = "x86_64") {
        X86_64_PLUGINS
    } else {
        &[]
    };
    for name in EXPECTED_PLUGINS.iter().chain(x86_64) {
        let path = layout.plugins_out.join(plugin_file_name(name));
        if !path.is_file() {
            return Err(format!("the build did not produce {}", path.display()));
        }
    }
    for name in x86_64 {
        check_isa_confined(&layout.plugins_out.join(plugin_file_name(name)))?;
    }
    // Every library in the output directory is checked, not only the expected ones: the tests
    // may load anything that lies there, including a plugin left over from an older build.
    let mut built = Vec::new();
    for file in files_under(&layout.plugins_out)? {
        let path = layout.plugins_out.join(&file);
        if path.extension().is_some_and(|ext| ext == "so") {
            let expected = if EXPORTS_NOTHING
                .iter()
                .any(|name| file == Path::new(&plugin_file_name(name)))
            {
                Exports::Nothing
            } else {
                Exports::EntryOnly
            };
            check_exports(&path, expected)?;
            built.push(layout.show(&path));
        }
    }
    println!(
        "plugins: built {} against {} only; each exports only {ENTRY_SYMBOL} ({} nothing at \
         all){} ({:.1}s)",
        built.join(", "),
        layout.show(&prefix),
        EXPORTS_NOTHING.join(", "),
        if x86_64.is_empty() {
            String::new()
        } else {
            format!(
                "; AVX instructions only in the *_avx2 kernels of {}",
                x86_64.join(", ")
            )
        },
        start.elapsed().as_secs_f64()
    );
    Ok(layout.plugins_out)
}

/// The file a CMake `MODULE` library target produces on this platform.
fn plugin_file_name(name: &str) -> String {
    if cfg!(windows) {
        format!("{name}.dll")
    } else {
        // CMake gives MODULE libraries the `lib` prefix and the `.so` suffix on Linux and on
        // macOS alike (CMAKE_SHARED_MODULE_SUFFIX is `.so` there, not `.dylib`).
        format!("lib{name}.so")
    }
}

fn require_cmake() -> Result<(), String> {
    require_tool("cmake", "cmake")
}

/// Fails with an installation hint when `tool` cannot be started.
fn require_tool(tool: &str, package: &str) -> Result<(), String> {
    match Command::new(tool).arg("--version").output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!("`{tool} --version` failed with {}; is {package} installed correctly?", out.status)),
        Err(e) => Err(format!(
            "`{tool}` is needed but cannot be run ({e}); install it, e.g. `apt-get install -y {package}` \
             (`cargo xtask demo` and `cargo xtask test` do this when run as root on Debian)"
        )),
    }
}

/// Whether `tool --version` runs.
fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success())
}

/// Makes `build` ready for `cmake -S source -B build` and returns the generator to use: the one
/// the build directory was made with when it is still usable, otherwise Ninja when installed,
/// otherwise Unix Makefiles. A build directory made for another source tree (a moved checkout) or
/// with a generator that is no longer installed is removed, and that is said.
fn prepare_build_dir(layout: &Layout, source: &Path, build: &Path) -> Result<String, String> {
    let cache = build.join("CMakeCache.txt");
    if let Ok(text) = fs::read_to_string(&cache) {
        let home = cache_value(&text, "CMAKE_HOME_DIRECTORY");
        let generator = cache_value(&text, "CMAKE_GENERATOR");
        let same_source = home.is_some_and(|h| same_path(Path::new(h), source));
        let usable = match generator {
            Some("Ninja") => have("ninja"),
            Some("Unix Makefiles") => have("make"),
            _ => false,
        };
        match generator {
            Some(g) if same_source && usable => return Ok(g.to_string()),
            _ => {
                println!(
                    "note: removing {} (made for {} with {}), which cannot be reused",
                    layout.show(build),
                    home.unwrap_or("an unknown source"),
                    generator.unwrap_or("an unknown generator")
                );
                fs::remove_dir_all(build)
                    .map_err(|e| format!("cannot remove {}: {e}", build.display()))?;
            }
        }
    }
    if have("ninja") {
        Ok("Ninja".to_string())
    } else if have("make") {
        Ok("Unix Makefiles".to_string())
    } else {
        Err("CMake needs a build tool and neither `ninja` nor `make` can be run; install one, e.g. \
             `apt-get install -y make`"
            .to_string())
    }
}

/// The value of `NAME:TYPE=value` in a CMakeCache.txt.
fn cache_value<'a>(cache: &'a str, name: &str) -> Option<&'a str> {
    cache.lines().find_map(|line| {
        let (key, value) = line.split_once('=')?;
        let (key_name, _type) = key.split_once(':')?;
        (key_name == name).then_some(value)
    })
}

fn same_path(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// `-DNAME=path`, with the path as CMake expects it (forward slashes are fine everywhere).
fn define(name: &str, path: &Path) -> String {
    format!("-D{name}={}", path.display())
}

/// Points every compiler variable CMake reads at a path that does not exist.
fn no_compilers(cmd: &mut Command) {
    for var in ["CC", "CXX", "CUDACXX", "HIPCXX", "FC"] {
        cmd.env(var, "/nonexistent/guild-sdk-needs-no-compiler");
    }
}

/// Runs a command with its output captured, so that a successful step prints nothing, and a
/// failed one prints everything it said.
fn run_captured(cmd: &mut Command) -> Result<String, String> {
    let shown = describe(cmd);
    let out = cmd
        .output()
        .map_err(|e| format!("cannot start `{shown}`: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "`{shown}` failed with {}\n{stdout}{stderr}",
            out.status
        ));
    }
    Ok(stdout)
}

fn describe(cmd: &Command) -> String {
    let mut parts = vec![cmd.get_program().to_string_lossy().into_owned()];
    parts.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    parts.join(" ")
}

/// Removes files under the install prefix that the last install did not write (left over from
/// an older SDK layout), so that the prefix holds exactly what the SDK installs. Returns the
/// installed files relative to the prefix.
fn prune_install_prefix(layout: &Layout) -> Result<BTreeSet<PathBuf>, String> {
    let manifest_path = layout.sdk_build.join("install_manifest.txt");
    let manifest = fs::read_to_string(&manifest_path).map_err(|e| {
        format!(
            "cannot read {} after installing: {e}",
            manifest_path.display()
        )
    })?;
    let prefix = &layout.sdk_prefix;
    let mut installed = BTreeSet::new();
    for line in manifest.lines().filter(|l| !l.is_empty()) {
        let relative = Path::new(line).strip_prefix(prefix).map_err(|_| {
            format!(
                "the SDK installed {line}, outside its prefix {}",
                prefix.display()
            )
        })?;
        installed.insert(relative.to_path_buf());
    }
    for file in files_under(prefix)? {
        if !installed.contains(&file) {
            let path = prefix.join(&file);
            fs::remove_file(&path)
                .map_err(|e| format!("cannot remove stale {}: {e}", path.display()))?;
            println!(
                "note: removed {}, which the SDK no longer installs",
                layout.show(&path)
            );
        }
    }
    Ok(installed)
}

/// Every regular file under `dir`, relative to it, sorted.
pub(crate) fn files_under(dir: &Path) -> Result<BTreeSet<PathBuf>, String> {
    let mut files = BTreeSet::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        let entries = fs::read_dir(&current)
            .map_err(|e| format!("cannot list {}: {e}", current.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("cannot list {}: {e}", current.display()))?;
            let path = entry.path();
            let kind = entry
                .file_type()
                .map_err(|e| format!("cannot stat {}: {e}", path.display()))?;
            if kind.is_dir() {
                pending.push(path);
            } else if let Ok(relative) = path.strip_prefix(dir) {
                files.insert(relative.to_path_buf());
            }
        }
    }
    Ok(files)
}

/// Runs CPack into `target/guild-sdk-package` and returns the archive it reports.
fn package_sdk(layout: &Layout) -> Result<PathBuf, String> {
    let config = layout.sdk_build.join("CPackConfig.cmake");
    let out = run_captured(
        Command::new("cpack")
            .arg("--config")
            .arg(&config)
            .arg("-B")
            .arg(&layout.sdk_package),
    )?;
    // CPack reports "CPack: - package: <path> generated." for each archive it writes.
    let package = out
        .lines()
        .filter_map(|line| {
            line.split_once("- package: ")?
                .1
                .strip_suffix(" generated.")
        })
        .map(PathBuf::from)
        .next()
        .ok_or_else(|| format!("cpack did not report a package:\n{out}"))?;
    if !package.is_file() {
        return Err(format!(
            "cpack reported {} but it does not exist",
            package.display()
        ));
    }
    Ok(package)
}

/// Unpacks the archive under `target/guild-sdk-check/unpacked` with CMake's own tar, checks that
/// it holds exactly the installed files, and returns the unpacked SDK's root.
fn unpack_package(
    layout: &Layout,
    package: &Path,
    installed: &BTreeSet<PathBuf>,
) -> Result<PathBuf, String> {
    let dir = layout.sdk_check.join("unpacked");
    if dir.exists() {
        fs::remove_dir_all(&dir).map_err(|e| format!("cannot remove {}: {e}", dir.display()))?;
    }
    fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    run_captured(
        Command::new("cmake")
            .current_dir(&dir)
            .args(["-E", "tar", "xzf"])
            .arg(package),
    )?;
    // CPack puts everything under one top-level directory named after the archive.
    let stem = package
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_suffix(".tar.gz"))
        .ok_or_else(|| format!("{} is not a .tar.gz archive", package.display()))?;
    let root = dir.join(stem);
    let unpacked = files_under(&root)?;
    if &unpacked != installed {
        let extra: Vec<_> = unpacked
            .difference(installed)
            .map(|p| p.display().to_string())
            .collect();
        let missing: Vec<_> = installed
            .difference(&unpacked)
            .map(|p| p.display().to_string())
            .collect();
        return Err(format!(
            "{} does not hold exactly the installed files; extra: [{}], missing: [{}]",
            package.display(),
            extra.join(", "),
            missing.join(", ")
        ));
    }
    Ok(root)
}

/// Configures test-plugins/sdk_version_check (a project with no languages) against `prefix`.
/// The build directory is made afresh each time so that no cached answer can stand in for the
/// search.
fn check_find_package(
    layout: &Layout,
    generator: &str,
    prefix: &Path,
    name: &str,
) -> Result<(), String> {
    let build = layout.sdk_check.join(format!("{name}-build"));
    if build.exists() {
        fs::remove_dir_all(&build)
            .map_err(|e| format!("cannot remove {}: {e}", build.display()))?;
    }
    let mut configure = Command::new("cmake");
    configure
        .arg("-S")
        .arg(layout.plugins_source.join("sdk_version_check"))
        .arg("-B")
        .arg(&build)
        .args(["-G", generator])
        .arg(define("CMAKE_PREFIX_PATH", prefix))
        .arg(define("GUILD_SDK_EXPECTED_PREFIX", prefix))
        .arg("-DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON")
        .arg("-DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF");
    no_compilers(&mut configure);
    run_captured(&mut configure).map(|_| ())
}

/// Where the SDK installs its example module, relative to the prefix.
const EXAMPLE_DIR: &str = "share/guild-sdk/example";

/// What a plugin author must find in the installed SDK besides headers and the CMake package.
pub(crate) const AUTHOR_FILES: &[&str] = &[
    "share/guild-sdk/README.md",
    "share/guild-sdk/gkmetadata-v1.schema.json",
    "share/guild-sdk/example/README.md",
    "share/guild-sdk/example/CMakeLists.txt",
    "share/guild-sdk/example/my_scan.c",
    "share/guild-sdk/example/manifest.json",
];

/// Builds the example module the SDK ships the way its README tells an author to: copied out of
/// the prefix into `target/guild-sdk-check/example/src`, configured against the prefix alone
/// (no package registry, no source tree), built with warnings as errors. Checks that CMake found
/// the SDK at the prefix, that the library the manifest template names was built and exports
/// only the entry point, and that it registers the implementation id the template lists.
/// Returns the built library.
fn check_example(
    layout: &Layout,
    generator: &str,
    installed: &BTreeSet<PathBuf>,
) -> Result<PathBuf, String> {
    for file in AUTHOR_FILES {
        if !installed.contains(Path::new(file)) {
            return Err(format!(
                "the SDK does not install {file}, which a plugin author needs"
            ));
        }
    }
    require_tool("cc", "gcc")?;
    require_tool("nm", "binutils")?;
    let dir = layout.sdk_check.join("example");
    if dir.exists() {
        fs::remove_dir_all(&dir).map_err(|e| format!("cannot remove {}: {e}", dir.display()))?;
    }
    let source = dir.join("src");
    let build = dir.join("build");
    fs::create_dir_all(&source).map_err(|e| format!("cannot create {}: {e}", source.display()))?;
    let shipped = layout.sdk_prefix.join(EXAMPLE_DIR);
    for file in files_under(&shipped)? {
        let (from, to) = (shipped.join(&file), source.join(&file));
        if let Some(parent) = to.parent() {
            fs::create_dir_all(parent)
                .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        }
        fs::copy(&from, &to).map_err(|e| format!("cannot copy {}: {e}", from.display()))?;
    }

    let mut configure = Command::new("cmake");
    configure
        .arg("-S")
        .arg(&source)
        .arg("-B")
        .arg(&build)
        .args(["-G", generator])
        .arg(define("CMAKE_PREFIX_PATH", &layout.sdk_prefix))
        .arg("-DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON")
        .arg("-DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF");
    if !cfg!(windows) {
        configure.arg("-DCMAKE_C_FLAGS=-Werror");
    }
    run_captured(&mut configure)?;
    let cache_path = build.join("CMakeCache.txt");
    let cache = fs::read_to_string(&cache_path)
        .map_err(|e| format!("cannot read {}: {e}", cache_path.display()))?;
    let expected = layout.sdk_prefix.join("lib/cmake/GuildKernelSDK");
    match cache_value(&cache, "GuildKernelSDK_DIR") {
        Some(found) if same_path(Path::new(found), &expected) => {}
        found => {
            return Err(format!(
                "the example found GuildKernelSDK at {found:?}, not at {}",
                expected.display()
            ))
        }
    }
    run_captured(Command::new("cmake").arg("--build").arg(&build))?;

    let manifest_path = source.join("manifest.json");
    let manifest = fs::read_to_string(&manifest_path)
        .map_err(|e| format!("cannot read {}: {e}", manifest_path.display()))?;
    let entry = json_string(&manifest, "entry")
        .ok_or_else(|| format!("{} has no \"entry\"", manifest_path.display()))?;
    let file_name = Path::new(entry)
        .file_name()
        .ok_or_else(|| format!("the example's entry {entry:?} names no file"))?;
    let library = build.join(file_name);
    if !library.is_file() {
        return Err(format!(
            "the example's manifest names {entry}, but its build did not produce {}",
            library.display()
        ));
    }
    check_exports(&library, Exports::EntryOnly)?;
    let bytes =
        fs::read(&library).map_err(|e| format!("cannot read {}: {e}", library.display()))?;
    let provided = json_string(&manifest, "provided_ops")
        .ok_or_else(|| format!("{} lists no provided_ops", manifest_path.display()))?;
    if !bytes
        .windows(provided.len())
        .any(|w| w == provided.as_bytes())
    {
        return Err(format!(
            "{} does not hold the implementation id {provided:?} that the example's manifest \
             lists",
            library.display()
        ));
    }
    Ok(library)
}

/// The first string after `"key":` in JSON text (inside an array too: `"key": ["a", ...]` gives
/// `a`); no escapes expected.
fn json_string<'a>(json: &'a str, key: &str) -> Option<&'a str> {
    let pattern = format!("\"{key}\":");
    let rest = json[json.find(&pattern)? + pattern.len()..].trim_start();
    let rest = rest.strip_prefix('[').map_or(rest, str::trim_start);
    let value = rest.strip_prefix('"')?;
    Some(&value[..value.find('"')?])
}

/// Checks that every compile command took the SDK's headers from the install prefix and none
/// from the source tree's abi-headers.
fn check_compile_commands(layout: &Layout, prefix: &Path) -> Result<(), String> {
    let path = layout.plugins_build.join("compile_commands.json");
    let text =
        fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let include = prefix.join("include").display().to_string();
    if !text.contains(&include) {
        return Err(format!(
            "{} never names the installed headers {include}",
            path.display()
        ));
    }
    let source_headers = layout.sdk_source.display().to_string();
    if text.contains(&source_headers) {
        return Err(format!(
            "{} names the source tree {source_headers}; plugins must use the installed SDK",
            path.display()
        ));
    }
    Ok(())
}

/// Fails unless the AVX instructions of an ISA-specific build are confined to its kernels: the
/// host runs the library's init (and everything but a kernel) on CPUs without AVX, so any
/// VEX-encoded instruction outside a function named `*_avx2*` (the target-attributed kernels,
/// and GCC's clones of them) would crash there. It also fails when no kernel holds a fused
/// multiply-add, which would mean the attributes were lost and the build is not what it says.
fn check_isa_confined(library: &Path) -> Result<(), String> {
    let out = run_captured(
        Command::new("objdump")
            .args(["-d", "--no-show-raw-insn", "--no-addresses"])
            .arg(library),
    )?;
    isa_problem(&out).map_or(Ok(()), |problem| {
        Err(format!("{}: {problem}", library.display()))
    })
}

/// What is wrong with an ISA-specific build, given its `objdump -d --no-show-raw-insn
/// --no-addresses` output, if anything (see [`check_isa_confined`]).
fn isa_problem(objdump_output: &str) -> Option<String> {
    let mut function = "";
    let mut outside = Vec::new();
    let mut fused = false;
    for line in objdump_output.lines() {
        // A function starts with `<name>:`; an instruction line is indented, its mnemonic first.
        if let Some(name) = line.strip_prefix('<').and_then(|l| l.strip_suffix(">:")) {
            function = name;
            continue;
        }
        if !line.starts_with(char::is_whitespace) {
            continue;
        }
        let Some(mnemonic) = line.split_whitespace().next() else {
            continue;
        };
        // Every AVX, AVX2, FMA and F16C instruction is VEX-encoded, and its mnemonic starts
        // with `v`; no baseline x86-64 instruction a compiler emits does (verr and verw are
        // system instructions).
        if !mnemonic.starts_with('v') {
            continue;
        }
        if function.contains("_avx2") {
            fused |= mnemonic.starts_with("vfmadd");
        } else if !outside.contains(&function) {
            outside.push(function);
        }
    }
    if !outside.is_empty() {
        return Some(format!(
            "AVX instructions outside the *_avx2 kernels, in {}; only the kernels may carry a \
             target attribute, never the whole library (-mavx2)",
            outside.join(", ")
        ));
    }
    (!fused).then(|| {
        "no *_avx2 function holds a vfmadd instruction: the kernels were not compiled for \
         AVX2 and FMA"
            .to_owned()
    })
}

/// What a test library's dynamic symbol table must define of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exports {
    /// The entry point and nothing else: every real plugin.
    EntryOnly,
    /// Nothing at all: the libraries in [`EXPORTS_NOTHING`].
    Nothing,
}

/// Fails unless the library's dynamic symbol table defines what `expected` says and nothing
/// else of its own.
fn check_exports(library: &Path, expected: Exports) -> Result<(), String> {
    let out = run_captured(
        Command::new("nm")
            .args(["-D", "--defined-only"])
            .arg(library),
    )?;
    export_problem(&out, expected).map_or(Ok(()), |problem| {
        Err(format!("{}: {problem}", library.display()))
    })
}

/// What is wrong with a plugin's exports, given `nm -D --defined-only` output, if anything.
fn export_problem(nm_output: &str, expected: Exports) -> Option<String> {
    let exported = exported_symbols(nm_output);
    if expected == Exports::Nothing {
        let own: Vec<&str> = exported
            .iter()
            .map(String::as_str)
            .filter(|s| !TOOLCHAIN_SYMBOLS.contains(s))
            .collect();
        return (!own.is_empty()).then(|| {
            format!(
                "exports {}, but this test library must export nothing",
                own.join(", ")
            )
        });
    }
    if !exported.iter().any(|s| s == ENTRY_SYMBOL) {
        return Some(format!(
            "{ENTRY_SYMBOL} is not exported; nm -D said:\n{nm_output}"
        ));
    }
    let unexpected: Vec<&str> = exported
        .iter()
        .map(String::as_str)
        .filter(|s| *s != ENTRY_SYMBOL && !TOOLCHAIN_SYMBOLS.contains(s))
        .collect();
    if unexpected.is_empty() {
        return None;
    }
    Some(format!(
        "exports {} besides {ENTRY_SYMBOL}; plugins must be built with hidden visibility \
         (guild_configure_gkernel_plugin does this)",
        unexpected.join(", ")
    ))
}

/// The symbol names in `nm -D --defined-only` output (`ADDRESS TYPE NAME` lines), without any
/// `@VERSION` suffix. Absolute `A` entries are version-node names, not code or data, and skipped.
fn exported_symbols(nm_output: &str) -> Vec<String> {
    nm_output
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace().rev();
            let name = fields.next()?;
            let kind = fields.next()?;
            (kind != "A").then(|| name.split('@').next().unwrap_or(name).to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn avx_instructions_may_appear_only_in_the_avx2_kernels() {
        let clean = "\n<llama_ops_init>:\n\tpush   %rbx\n\tmovss  %xmm0,(%rdi)\n\n\
                     <llama_matvec_f32_avx2.constprop.0>:\n\tvxorps %xmm0,%xmm0,%xmm0\n\
                     \tvfmadd231ps (%rsi),%ymm1,%ymm0\n";
        assert_eq!(isa_problem(clean), None);

        let leaked = "<llama_ops_init>:\n\tvmovss %xmm0,(%rdi)\n\
                      <llama_matvec_f32_avx2>:\n\tvfmadd231ps (%rsi),%ymm1,%ymm0\n\
                      <llama_execute>:\n\tvzeroupper\n\tvzeroupper\n";
        assert_eq!(
            isa_problem(leaked).as_deref(),
            Some(
                "AVX instructions outside the *_avx2 kernels, in llama_ops_init, llama_execute; \
                 only the kernels may carry a target attribute, never the whole library (-mavx2)"
            )
        );

        let scalar = "<llama_matvec_f32_avx2>:\n\tmulss  %xmm1,%xmm0\n\taddss  %xmm0,%xmm2\n";
        assert!(isa_problem(scalar)
            .unwrap()
            .contains("no *_avx2 function holds a vfmadd"));
    }

    #[test]
    fn nm_output_is_read_as_names_without_versions() {
        let out = "0000000000001139 T guild_plugin_entry_v1\n\
                   0000000000004010 B __bss_start\n\
                   0000000000001200 T helper@@PLUGIN_1.0\n\
                   0000000000000000 A PLUGIN_1.0\n\
                   \n";
        assert_eq!(
            exported_symbols(out),
            ["guild_plugin_entry_v1", "__bss_start", "helper"]
        );
    }

    #[test]
    fn only_the_entry_point_and_toolchain_symbols_may_be_exported() {
        let clean = "0000000000001108 T guild_plugin_entry_v1\n0000000000004020 B __bss_start\n\
                     0000000000001000 T _init\n0000000000001120 T _fini\n";
        assert_eq!(export_problem(clean, Exports::EntryOnly), None);

        let leaked = "0000000000001108 T guild_plugin_entry_v1\n00000000000010f9 T leaked_helper\n\
                      0000000000004010 D leaked_table\n";
        assert_eq!(
            export_problem(leaked, Exports::EntryOnly).as_deref(),
            Some(
                "exports leaked_helper, leaked_table besides guild_plugin_entry_v1; plugins must be \
                 built with hidden visibility (guild_configure_gkernel_plugin does this)"
            )
        );

        let missing = "00000000000010f9 T guild_plugin_entry_v2\n";
        assert_eq!(
            export_problem(missing, Exports::EntryOnly).as_deref(),
            Some("guild_plugin_entry_v1 is not exported; nm -D said:\n00000000000010f9 T guild_plugin_entry_v2\n")
        );
    }

    #[test]
    fn a_library_that_must_export_nothing_may_carry_only_toolchain_symbols() {
        let empty = "0000000000004020 B __bss_start\n0000000000001000 T _init\n";
        assert_eq!(export_problem(empty, Exports::Nothing), None);
        assert_eq!(export_problem("", Exports::Nothing), None);

        let with_entry =
            "0000000000001108 T guild_plugin_entry_v1\n0000000000004020 B __bss_start\n";
        assert_eq!(
            export_problem(with_entry, Exports::Nothing).as_deref(),
            Some("exports guild_plugin_entry_v1, but this test library must export nothing")
        );
    }

    #[test]
    fn json_strings_are_read_alone_or_first_in_an_array() {
        let manifest = "{\n  \"entry\": \"lib/libmy_scan.so\",\n  \"provided_ops\": [\"a.b.cpu\", \"c\"],\n  \"module_abi\": 1\n}";
        assert_eq!(json_string(manifest, "entry"), Some("lib/libmy_scan.so"));
        assert_eq!(json_string(manifest, "provided_ops"), Some("a.b.cpu"));
        assert_eq!(json_string(manifest, "module_abi"), None);
        assert_eq!(json_string(manifest, "os"), None);
        assert_eq!(json_string(r#"{"provided_ops": []}"#, "provided_ops"), None);
    }

    #[test]
    fn cache_values_are_found_by_name_whatever_their_type() {
        let cache = "# comment\nCMAKE_GENERATOR:INTERNAL=Unix Makefiles\nCMAKE_HOME_DIRECTORY:INTERNAL=/w/abi-headers\n";
        assert_eq!(
            cache_value(cache, "CMAKE_GENERATOR"),
            Some("Unix Makefiles")
        );
        assert_eq!(
            cache_value(cache, "CMAKE_HOME_DIRECTORY"),
            Some("/w/abi-headers")
        );
        assert_eq!(cache_value(cache, "CMAKE_GENERATOR_PLATFORM"), None);
    }
}
