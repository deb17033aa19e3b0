//! The minimum supported Rust version: the workspace declares one (`rust-version` in the root
//! `Cargo.toml`), and this step proves it by type-checking every target with exactly that
//! toolchain, fetched with rustup when it is missing. Cargo refuses a dependency whose own
//! `rust-version` is newer, so a lock file that drifted past the MSRV fails here too.

use std::path::Path;
use std::process::Command;

use crate::util;

/// The value of `key` in the `[workspace.package]` table of `manifest` (the root `Cargo.toml`'s
/// text): `rust-version`, `version`.
pub(crate) fn workspace_package_key(manifest: &str, key: &str) -> Option<String> {
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
        let Some(rest) = line.strip_prefix(key) else {
            continue;
        };
        let Some(value) = rest.trim_start().strip_prefix('=') else {
            continue;
        };
        return Some(value.trim().trim_matches('"').to_owned());
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
    let version = declared_version()?;
    ensure_installed(&version)?;
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

/// A key of the root manifest's `[workspace.package]`: `rust-version`, `version`.
pub(crate) fn workspace_key(key: &str) -> Result<String, String> {
    let manifest_path = util::root().join("Cargo.toml");
    let manifest = std::fs::read_to_string(&manifest_path)
        .map_err(|e| format!("cannot read {}: {e}", manifest_path.display()))?;
    workspace_package_key(&manifest, key).ok_or_else(|| {
        format!(
            "{} declares no {key} under [workspace.package]",
            manifest_path.display()
        )
    })
}

/// The declared MSRV.
pub(crate) fn declared_version() -> Result<String, String> {
    workspace_key("rust-version")
}

/// Installs `version` with rustup unless it is there.
pub(crate) fn ensure_installed(version: &str) -> Result<(), String> {
    if !installed(version)? {
        eprintln!("xtask: installing Rust {version} (the workspace's MSRV) with rustup");
        util::run(rustup().args(["toolchain", "install", version, "--profile", "minimal"]))?;
    }
    Ok(())
}

pub(crate) fn path_str(path: &Path) -> Result<&str, String> {
    path.to_str()
        .ok_or_else(|| format!("{} is not UTF-8", path.display()))
}

#[cfg(test)]
mod tests {
    use super::workspace_package_key;
    fn declared(manifest: &str) -> Option<String> {
        workspace_package_key(manifest, "rust-version")
    }

    #[test]
    fn the_msrv_is_read_from_the_workspace_package_table_only() {
        let manifest = "[package]\nrust-version = \"1.70\"\n\n[workspace.package]\n\
                        edition = \"2021\"\nrust-version = \"1.89\"\n\n[dependencies]\n";
        assert_eq!(
            workspace_package_key(manifest, "rust-version").as_deref(),
            Some("1.89")
        );
        assert_eq!(declared("[workspace.package]\nedition = \"2021\"\n"), None);
        assert_eq!(
            declared("[workspace.package]\nrust-version=\"1.91.1\"").as_deref(),
            Some("1.91.1")
        );
    }
}
