//! The minimum supported Rust version: the workspace declares one (`rust-version` in the root
//! `Cargo.toml`), and this step proves it by type-checking every target with exactly that
//! toolchain, fetched with rustup when it is missing. Cargo refuses a dependency whose own
//! `rust-version` is newer, so a lock file that drifted past the MSRV fails here too.

use std::path::Path;
use std::process::Command;

use crate::util;

/// The `rust-version` of `[workspace.package]` in `manifest` (the root `Cargo.toml`'s text).
fn declared(manifest: &str) -> Option<String> {
    let mut in_package = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_package = line == "[workspace.package]";
            continue;
        }
        if !in_package {
            continue;
        }
        let Some(rest) = line.strip_prefix("rust-version") else {
            continue;
        };
        let value = rest.trim_start().strip_prefix('=')?.trim();
        return Some(value.trim_matches('"').to_owned());
    }
    None
}

/// A `Command` for `rustup` with the variables the outer cargo set removed, so that the inner
/// build uses the pinned toolchain's cargo and rustc, not this process's.
pub(crate) fn rustup() -> Command {
    let mut cmd = Command::new("rustup");
    for var in [
        "CARGO",
        "RUSTC",
        "RUSTDOC",
        "RUSTUP_TOOLCHAIN",
        "CARGO_TARGET_DIR",
    ] {
        cmd.env_remove(var);
    }
    cmd.current_dir(util::root());
    cmd
}

/// Whether rustup has `toolchain` installed (`rustup run` answers without fetching anything).
pub(crate) fn installed(toolchain: &str) -> Result<bool, String> {
    let out = rustup()
        .args(["run", toolchain, "rustc", "--version"])
        .output()
        .map_err(|e| {
            format!(
                "cannot run rustup ({e}); the MSRV, Miri and ThreadSanitizer steps need it: \
                 install it from https://rustup.rs, then run `rustup toolchain install \
                 {toolchain} --profile minimal`"
            )
        })?;
    Ok(out.status.success())
}

/// Type-checks the whole workspace (every target, `--locked`) with the declared MSRV, in its own
/// target directory (`target/msrv`) so that it never invalidates the main build.
pub fn run() -> Result<(), String> {
    let root = util::root();
    let manifest_path = root.join("Cargo.toml");
    let manifest = std::fs::read_to_string(&manifest_path)
        .map_err(|e| format!("cannot read {}: {e}", manifest_path.display()))?;
    let version = declared(&manifest).ok_or_else(|| {
        format!(
            "{} declares no rust-version under [workspace.package]",
            manifest_path.display()
        )
    })?;
    if !installed(&version)? {
        eprintln!("xtask: installing Rust {version} (the workspace's MSRV) with rustup");
        util::run(rustup().args(["toolchain", "install", &version, "--profile", "minimal"]))?;
    }
    let target = root.join("target").join("msrv");
    util::run(rustup().args([
        "run",
        &version,
        "cargo",
        "check",
        "--locked",
        "--workspace",
        "--all-targets",
        "--target-dir",
        path_str(&target)?,
    ]))
}

pub(crate) fn path_str(path: &Path) -> Result<&str, String> {
    path.to_str()
        .ok_or_else(|| format!("{} is not UTF-8", path.display()))
}

#[cfg(test)]
mod tests {
    use super::declared;

    #[test]
    fn the_msrv_is_read_from_the_workspace_package_table_only() {
        let manifest = "[package]\nrust-version = \"1.70\"\n\n[workspace.package]\n\
                        edition = \"2021\"\nrust-version = \"1.89\"\n\n[dependencies]\n";
        assert_eq!(declared(manifest).as_deref(), Some("1.89"));
        assert_eq!(declared("[workspace.package]\nedition = \"2021\"\n"), None);
        assert_eq!(
            declared("[workspace.package]\nrust-version=\"1.91.1\"").as_deref(),
            Some("1.91.1")
        );
    }
}
