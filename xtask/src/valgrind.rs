//! Runs the tests that cross the C boundary under valgrind: the dlopen loader's tests (every
//! C test plugin) and the host's real-plugin, registry-stress and operation-service tests (both
//! faces, the dependent module calling back through the C service, the concurrency tests). Any
//! memory error, or a definite or indirect leak, fails the run.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{self, root};

/// The test executable that `cargo test --no-run` builds for `package`'s `it` target.
fn test_executable(package: &str) -> Result<PathBuf, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(root())
        .args([
            "test",
            "-p",
            package,
            "--test",
            "it",
            "--no-run",
            "--message-format=json",
        ])
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!("building the tests of {package} failed"));
    }
    // Each line is one JSON message; the one for the `it` test target carries its executable.
    // xtask keeps no JSON dependency, so read the one field by hand.
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter(|l| l.contains("\"name\":\"it\"") && l.contains("\"executable\":\""))
        .find_map(|l| {
            let start = l.find("\"executable\":\"")? + "\"executable\":\"".len();
            let end = l[start..].find('"')? + start;
            Some(PathBuf::from(&l[start..end]))
        })
        .ok_or_else(|| format!("cargo did not report the `it` test executable of {package}"))
}

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
            // Runner selection: the RMD1 callbacks and the C model reader.
            "runners::",
            // Bound CPE1 tables and the expert worker pool calling them across threads.
            "experts::",
            // The C runner example: a module calling the scans through the C service.
            "examples::c_runner_",
        ],
    )
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
