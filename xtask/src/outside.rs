//! A runner outside the workspace, built against the packaged crates: what a user gets from
//! `cargo add guild-host` once the crates are published. `cargo package` writes every crate as
//! it would be uploaded; this step unpacks them, points a fresh crate at them (a
//! `[patch.crates-io]` per unpacked crate, so that the normalised manifests' plain version
//! requirements resolve to them) and type-checks it twice: with this toolchain and a fresh
//! resolution of every other dependency (the newest releases, as a new project gets them), and
//! with the declared MSRV and a resolution that respects it. A warning in any of our crates
//! fails the step: unpacked, they build as path dependencies, whose warnings cargo shows, as
//! it does for a user who vendors them; registry crates' are capped as they are for everyone.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::msrv::{self, path_str, rustup};
use crate::util;

/// What the outside runner does with the library: the README's example.
const MAIN_RS: &str = r#"use guild_host::prelude::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = std::env::args().nth(1).ok_or("usage: outside-runner STORE")?;
    let OpenedHost { host, report: _ } = Host::builder(store).open()?;
    let service = OperationService::new(host.kernels());

    let x = TensorDesc::new(DType::F32, &[8], MemorySpace::Host);
    let op = OpName::new("example.sequence.inclusive_scan")?;
    let handle = service.resolve(&OperationRequest::cpu(op, vec![x], vec![x]))?;
    let input = [1.0f32; 8];
    let mut output = [0.0f32; 8];
    handle.execute(&[TensorArg::new(&x, &input)], &mut [TensorArgMut::new(&x, &mut output)], None)?;
    drop(handle);
    Ok(())
}
"#;

/// Unpacks the published crates from `target/package` and checks the outside runner with both
/// toolchains.
pub fn run() -> Result<(), String> {
    let root = util::root();
    let work = root.join("target").join("outside");
    let packages = work.join("packages");
    let unpacked = unpack(&root.join("target").join("package"), &packages)?;
    let version = msrv::declared_version()?;
    for (name, rust_version) in [("stable", None), ("msrv", Some(version.as_str()))] {
        let dir = work.join(name);
        write_runner(&dir, &unpacked, rust_version)?;
        let mut cmd = match rust_version {
            None => Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())),
            Some(v) => {
                msrv::ensure_installed(v)?;
                let mut cmd = rustup();
                cmd.args(["run", v, "cargo"]);
                cmd
            }
        };
        // A fresh resolution every time: the lock file of the last run is not the user's.
        let _ = std::fs::remove_file(dir.join("Cargo.lock"));
        cmd.current_dir(&dir)
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("RUSTFLAGS")
            .args(["check", "--message-format", "short", "--target-dir"])
            .arg(path_str(&work.join("target").join(name))?);
        let out = cmd
            .output()
            .map_err(|e| format!("cannot start {cmd:?}: {e}"))?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            return Err(format!(
                "the outside runner ({name}) does not build against the packaged crates:\n{stderr}"
            ));
        }
        // The crates the runner does not use (the command line, the C API) are patched in
        // too, and cargo says so; that is no warning about our code.
        let warnings: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains("warning:") && !l.contains("was not used in the crate graph"))
            .collect();
        if !warnings.is_empty() {
            return Err(format!(
                "the outside runner ({name}) builds with {} warning line(s) from the packaged \
                 crates:\n{}",
                warnings.len(),
                warnings.join("\n")
            ));
        }
        eprintln!(
            "    the outside runner ({name}) builds against {} packaged crates with no warning",
            unpacked.len()
        );
        util::prune_side_build(&format!("outside/target/{name}"))?;
    }
    Ok(())
}

/// Unpacks every `guild-*` crate of the host's version from `from` into `into`; answers each
/// crate's name and directory.
fn unpack(from: &Path, into: &Path) -> Result<Vec<(String, PathBuf)>, String> {
    let version = msrv::workspace_key("version")?;
    let suffix = format!("-{version}.crate");
    let _ = std::fs::remove_dir_all(into);
    std::fs::create_dir_all(into).map_err(|e| format!("{}: {e}", into.display()))?;
    let entries = std::fs::read_dir(from).map_err(|e| {
        format!(
            "{}: {e} (run `cargo package --workspace` first)",
            from.display()
        )
    })?;
    let mut out = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        let Some(file) = path.file_name().and_then(|f| f.to_str()) else {
            continue;
        };
        let Some(name) = file.strip_suffix(&suffix) else {
            continue;
        };
        if !name.starts_with("guild-") {
            continue;
        }
        util::run(
            Command::new("tar")
                .arg("-xzf")
                .arg(&path)
                .arg("-C")
                .arg(into),
        )?;
        out.push((name.to_owned(), into.join(format!("{name}-{version}"))));
    }
    out.sort();
    if !out.iter().any(|(name, _)| name == "guild-host") {
        return Err(format!(
            "{} holds no guild-host-{version}.crate (run `cargo package --workspace` first)",
            from.display()
        ));
    }
    Ok(out)
}

/// Writes the outside runner into `dir`: a crate of its own workspace depending on
/// `guild-host` by version, each packaged crate patched in.
fn write_runner(
    dir: &Path,
    unpacked: &[(String, PathBuf)],
    rust_version: Option<&str>,
) -> Result<(), String> {
    let version = msrv::workspace_key("version")?;
    let mut manifest = String::from(
        "[package]\nname = \"outside-runner\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
         publish = false\n",
    );
    if let Some(v) = rust_version {
        manifest.push_str(&format!("rust-version = \"{v}\"\n"));
    }
    manifest.push_str(&format!(
        "\n[dependencies]\nguild-host = \"{version}\"\n\n[workspace]\n"
    ));
    // Resolver 3 honours rust-version when it picks releases; without one, it takes the newest.
    manifest.push_str(if rust_version.is_some() {
        "resolver = \"3\"\n"
    } else {
        "resolver = \"2\"\n"
    });
    manifest.push_str("\n[patch.crates-io]\n");
    for (name, path) in unpacked {
        manifest.push_str(&format!("{name} = {{ path = \"{}\" }}\n", path_str(path)?));
    }
    let src = dir.join("src");
    std::fs::create_dir_all(&src).map_err(|e| format!("{}: {e}", src.display()))?;
    std::fs::write(dir.join("Cargo.toml"), manifest)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    std::fs::write(src.join("main.rs"), MAIN_RS).map_err(|e| format!("{}: {e}", src.display()))
}
