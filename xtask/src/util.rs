//! Small helpers for running commands and locating the workspace.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

/// The workspace root (the parent of this crate's directory).
pub fn root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .expect("xtask lives inside the workspace")
        .to_path_buf()
}

/// Where cargo builds: `CARGO_TARGET_DIR`, or `target` under the workspace root.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

/// Runs one named step, printing its name and how long it took.
pub fn step<T>(name: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    eprintln!("==> {name}");
    let start = Instant::now();
    let out = f().map_err(|e| format!("{name}: {e}"))?;
    eprintln!("<== {name} ({:.1}s)", start.elapsed().as_secs_f64());
    Ok(out)
}

/// Removes a side build's target directory (`target/msrv`, `target/loom`, ...) after its step
/// passed, when `GUILD_CI_PRUNE` is set: CI machines may have little disk, and nothing later
/// reads those builds. A developer's machine keeps them as caches.
pub fn prune_side_build(name: &str) -> Result<(), String> {
    if std::env::var_os("GUILD_CI_PRUNE").is_none() {
        return Ok(());
    }
    let dir = root().join("target").join(name);
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => {
            eprintln!("    removed {} (GUILD_CI_PRUNE)", dir.display());
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("cannot remove {}: {e}", dir.display())),
    }
}

/// Runs a command to completion, failing with its name when it exits unsuccessfully.
pub fn run(cmd: &mut Command) -> Result<(), String> {
    let status = cmd
        .status()
        .map_err(|e| format!("cannot start {cmd:?}: {e}"))?;
    if !status.success() {
        return Err(format!("{cmd:?} failed with {status}"));
    }
    Ok(())
}

/// `args` with `--locked` after the subcommand when it resolves dependencies (everything but
/// `fmt`), so that a build never changes Cargo.lock: CI builds exactly what was committed.
pub fn locked<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut out = args.to_vec();
    if let Some(sub) = args.first() {
        if *sub != "fmt" {
            out.insert(1, "--locked");
        }
    }
    out
}

pub fn cargo(args: &[&str]) -> Result<(), String> {
    cargo_env(args, &[])
}

pub fn cargo_env(args: &[&str], env: &[(&str, &OsStr)]) -> Result<(), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root()).args(locked(args));
    for (k, v) in env {
        cmd.env(k, v);
    }
    run(&mut cmd)
}

/// The test executable that `cargo test --no-run` builds for `package`'s `it` target.
pub fn test_executable(package: &str) -> Result<PathBuf, String> {
    cargo_executable(&["test", "-p", package, "--test", "it", "--no-run"], "it")
}

/// Runs cargo with `args` (a build, or a `--no-run` test or bench) and answers the executable
/// cargo reports for the target named `target`.
pub fn cargo_executable(args: &[&str], target: &str) -> Result<PathBuf, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut all = locked(args);
    all.push("--message-format=json");
    let out = Command::new(cargo)
        .current_dir(root())
        .args(&all)
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo {} failed:\n{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    // Each line is one JSON message; the one for the target carries its executable. xtask
    // keeps no JSON dependency, so read the one field by hand.
    let name = format!("\"name\":\"{target}\"");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter(|l| l.contains(&name) && l.contains("\"executable\":\""))
        .find_map(|l| {
            let start = l.find("\"executable\":\"")? + "\"executable\":\"".len();
            let end = l[start..].find('"')? + start;
            Some(PathBuf::from(&l[start..end]))
        })
        .ok_or_else(|| {
            format!(
                "cargo {} did not report the executable of `{target}`",
                args.join(" ")
            )
        })
}
