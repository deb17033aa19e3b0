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

/// Runs one named step, printing its name and how long it took.
pub fn step<T>(name: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    eprintln!("==> {name}");
    let start = Instant::now();
    let out = f().map_err(|e| format!("{name}: {e}"))?;
    eprintln!("<== {name} ({:.1}s)", start.elapsed().as_secs_f64());
    Ok(out)
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

pub fn cargo(args: &[&str]) -> Result<(), String> {
    cargo_env(args, &[])
}

pub fn cargo_env(args: &[&str], env: &[(&str, &OsStr)]) -> Result<(), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root()).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    run(&mut cmd)
}
