//! Runs the tests that cross the C boundary under valgrind: the dlopen loader's tests (every
//! C test plugin) and the host's real-plugin, registry-stress and operation-service tests (both
//! faces, the dependent module calling back through the C service, the concurrency tests); and
//! the C and C++ test programs of the embedding API (`libguild_host`), which the capi test
//! binary runs under valgrind itself when `GUILD_CAPI_VALGRIND=1`. Any memory error, or a
//! definite or indirect leak, fails the run.

use std::path::Path;
use std::process::Command;

use crate::util::{self, root, test_executable};

fn valgrind(exe: &Path, plugins: &Path, filters: &[&str]) -> Result<(), String> {
    let mut cmd = Command::new("valgrind");
    cmd.current_dir(root())
        .args([
            "--quiet",
            // Round-robin scheduling, so the stress tests' threads really interleave.
            "--fair-sched=yes",
            "--error-exitcode=99",
            "--leak-check=full",
            "--errors-for-leak-kinds=definite,indirect",
            // libtest keeps a thread handle alive on purpose; report only real leaks.
            "--show-leak-kinds=definite,indirect",
        ])
        .arg(exe)
        .args(filters)
        .args(["--test-threads=2"])
        .env("GUILD_TEST_PLUGIN_DIR", plugins)
        // The generated scan cases cost the same code paths each; fewer keep the step short.
        .env("GUILD_PROPTEST_CASES", "24");
    util::run(&mut cmd)
}

pub fn run_all(plugins: &Path) -> Result<(), String> {
    let posix = test_executable("guild-adapters-posix")?;
    valgrind(&posix, plugins, &[])?;
    let host = test_executable("guild-host")?;
    valgrind(
        &host,
        plugins,
        &[
            "host::",
            "registry::",
            "operations::",
            "gkmodule::",
            "rejections::",
            // Stale, doubly released and racing handles; plugins outliving their registry.
            "service_safety::",
            // Reshapes: refused, raced by executes, of released and stale handles, from inside
            // the handle's own execute.
            "reshape::",
            // Runner selection: the RMD1 callbacks and the C model reader.
            "runners::",
            // Bound CPE1 tables and the expert worker pool calling them across threads.
            "experts::",
            // The C runner example: a module calling the scans through the C service.
            "examples::c_runner_",
            // The Llama operations module: a whole decode, and the refusals of its contracts.
            "llama::tiny_llama_",
            "llama::the_module_refuses_",
            // Its stored-weight operations: the decode per dtype, the hand-built blocks, and
            // the refused malformed descriptors (what must never reach the C arithmetic).
            "llama::each_weight_dtype_",
            "llama::the_stored_weight_operations_",
            "llama::malformed_quantized_",
            // The AVX2 build of the matvecs beside the portable one: both run on every storage
            // type, alone and in the decode (valgrind runs AVX2, FMA and F16C code).
            "llama_isa::",
            // Not the live switch test (`llama::live_`): its module runs in the runner process
            // it starts, which valgrind does not follow, so it would check nothing here.
        ],
    )?;
    capi_programs(plugins)
}

/// The embedding API's C and C++ test programs, each under valgrind. The test binary itself runs
/// natively: it builds the programs and plays the operator who changes the store under them.
fn capi_programs(plugins: &Path) -> Result<(), String> {
    let capi = test_executable("guild-host-capi")?;
    let mut cmd = Command::new(&capi);
    cmd.current_dir(root().join("crates/capi"))
        .args(["programs::", "--test-threads=2"])
        .env("GUILD_TEST_PLUGIN_DIR", plugins)
        .env("GUILD_CAPI_VALGRIND", "1");
    util::run(&mut cmd)
}

pub fn run(plugins: &Path) -> Result<(), String> {
    if Command::new("valgrind").arg("--version").output().is_err() {
        if std::env::var_os("CI").is_some() {
            return Err("valgrind is missing; .ci/run installs it".into());
        }
        eprintln!("valgrind is not installed: skipping the valgrind step (CI requires it)");
        return Ok(());
    }
    run_all(plugins)
}
