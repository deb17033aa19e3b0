//! `cargo xtask dist`: the release tarball for publishers and embedders,
//! `target/dist/guild-VERSION-TARGET.tar.gz` with a `.sha256` beside it. One prefix holds
//! everything: `bin/guild`, the SDK as `cargo xtask sdk` installs it (the ABI headers, the
//! `GuildKernelSDK` CMake package, the manifest schema and the example under `share/guild-sdk`),
//! libguild_host as `cargo xtask capi` installs it (the libraries, `guild/guild_host.h(pp)`, the
//! `GuildHost` CMake package, `lib/pkgconfig/guild-host.pc`), the LICENSE and a README. Both
//! CMake packages and the pkg-config file find the prefix from their own location, so the tree
//! can be unpacked anywhere.
//!
//! `--check` then does what a publisher does with it: unpacks it with the system `tar`, checks
//! it with `sha256sum -c`, and runs the unpacked `guild --version`. `cargo xtask test` runs
//! `dist --debug --check`.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{self, root};
use crate::{capi, sdk};

const USAGE: &str = "usage: cargo xtask dist [--debug] [--out DIR] [--check]";

/// The files every tarball must hold, relative to its top directory, besides the SDK's
/// [`sdk::AUTHOR_FILES`].
const REQUIRED: &[&str] = &[
    "bin/guild",
    "LICENSE",
    "README.md",
    "include/guild/abi/kernel_abi.h",
    "include/guild/abi/module_abi.h",
    "include/guild/guild_host.h",
    "include/guild/guild_host.hpp",
    "lib/libguild_host.so",
    "lib/libguild_host.a",
    "lib/cmake/GuildHost/GuildHostConfig.cmake",
    "lib/cmake/GuildKernelSDK/GuildKernelSDKConfig.cmake",
    "lib/pkgconfig/guild-host.pc",
];

/// The first file of [`REQUIRED`] or [`sdk::AUTHOR_FILES`] that the tree at `top` lacks.
fn lacking(top: &Path) -> Option<&'static str> {
    REQUIRED
        .iter()
        .chain(sdk::AUTHOR_FILES)
        .copied()
        .find(|f| !top.join(f).is_file())
}

const README: &str = "\
# Guild @VERSION@ (@TARGET@)

The Guild kernel host's tools for publishers and embedders, built with the @PROFILE@ profile.
Unpack it anywhere (`tar -xzf guild-@VERSION@-@TARGET@.tar.gz`); everything finds the prefix
from its own location.

- `bin/guild`: the command line. Put `bin` on your PATH; `guild --help` lists the commands
  (`pack`, `sign`, `check`, `install`, `resolve`, ...).
- The SDK for writing plugins and operation modules: the ABI headers under
  `include/guild/abi/`, the CMake package `find_package(GuildKernelSDK CONFIG)`, the manifest
  schema, the ABI conventions and an example module under `share/guild-sdk/`.
- libguild_host, the host for C and C++ engines: `lib/libguild_host.so` and `.a`,
  `include/guild/guild_host.h` (C) and `guild_host.hpp` (C++17), the CMake package
  `find_package(GuildHost CONFIG)` and `lib/pkgconfig/guild-host.pc`.

With CMake, point `CMAKE_PREFIX_PATH` at this directory. The documentation is in the source
repository's README.md and docs/ (plugin-authors.md, runner-authors.md, cli.md). Licensed under
the Apache License 2.0 (LICENSE).
";

/// What `dist` was asked for.
struct Args {
    release: bool,
    out: PathBuf,
    check: bool,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut parsed = Args {
        release: true,
        out: root().join("target/dist"),
        check: false,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--debug" => parsed.release = false,
            "--check" => parsed.check = true,
            "--out" => {
                let dir = it.next().ok_or(USAGE)?;
                parsed.out = PathBuf::from(dir);
            }
            _ => return Err(format!("unknown argument {arg:?}\n{USAGE}")),
        }
    }
    Ok(parsed)
}

/// `cargo xtask dist [--debug] [--out DIR] [--check]`.
pub fn run(args: &[String]) -> Result<(), String> {
    let args = parse(args)?;
    let tarball = build(args.release, &args.out)?;
    println!("dist: wrote {} and its .sha256", tarball.display());
    if args.check {
        let version = check(&tarball)?;
        println!(
            "dist: unpacked with tar, sha256sum -c passed, the unpacked guild says {version:?}"
        );
    }
    Ok(())
}

/// The workspace version (`[workspace.package] version`).
fn version() -> Result<String, String> {
    let path = root().join("Cargo.toml");
    let text = fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut in_package = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_package = line == "[workspace.package]";
        } else if in_package {
            if let Some(v) = line.strip_prefix("version") {
                let v = v.trim_start().strip_prefix('=').map(str::trim);
                if let Some(v) = v.and_then(|v| v.strip_prefix('"')?.strip_suffix('"')) {
                    return Ok(v.to_owned());
                }
            }
        }
    }
    Err(format!(
        "{} has no [workspace.package] version",
        path.display()
    ))
}

/// The host's target triple, as `rustc -vV` says.
fn target_triple() -> Result<String, String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = Command::new(rustc)
        .arg("-vV")
        .output()
        .map_err(|e| format!("cannot run rustc -vV: {e}"))?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .ok_or_else(|| "rustc -vV names no host triple".into())
}

/// Builds everything, stages it under `target/dist-work/NAME` and writes `out/NAME.tar.gz` and
/// `out/NAME.tar.gz.sha256`; answers the tarball's path.
fn build(release: bool, out: &Path) -> Result<PathBuf, String> {
    let name = format!("guild-{}-{}", version()?, target_triple()?);
    let work = root().join("target/dist-work");
    let stage = work.join(&name);
    remove_dir(&work)?;

    // Every file the tree will hold, by its path in the tree: a path two parts both ship must
    // have the same bytes in each (the ABI headers are in the SDK and beside guild_host.h).
    let mut files: BTreeMap<PathBuf, PathBuf> = BTreeMap::new();
    let add_tree = |dir: &Path, files: &mut BTreeMap<PathBuf, PathBuf>| {
        for file in sdk::files_under(dir)? {
            let from = dir.join(&file);
            if let Some(earlier) = files.get(&file) {
                if fs::read(earlier).ok() != fs::read(&from).ok() {
                    return Err(format!(
                        "{} and {} both ship as {} with different contents",
                        earlier.display(),
                        from.display(),
                        file.display()
                    ));
                }
            }
            files.insert(file, from);
        }
        Ok::<(), String>(())
    };

    let sdk_prefix = sdk::install()?;
    add_tree(&sdk_prefix, &mut files)?;
    let capi_prefix = work.join("capi");
    capi::install_profile(&capi_prefix, release)?;
    add_tree(&capi_prefix, &mut files)?;

    let mut cargo = vec!["build", "-p", "guild-cli", "--bin", "guild"];
    if release {
        cargo.push("--release");
    }
    util::cargo(&cargo)?;
    let profile = if release { "release" } else { "debug" };
    files.insert(
        PathBuf::from("bin/guild"),
        util::target_dir().join(profile).join("guild"),
    );
    files.insert(PathBuf::from("LICENSE"), root().join("LICENSE"));

    for (to, from) in &files {
        let to = stage.join(to);
        if let Some(dir) = to.parent() {
            fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        fs::copy(from, &to)
            .map_err(|e| format!("copying {} to {}: {e}", from.display(), to.display()))?;
    }
    let readme = README
        .replace("@VERSION@", &version()?)
        .replace("@TARGET@", &target_triple()?)
        .replace("@PROFILE@", if release { "release" } else { "dev (debug)" });
    fs::write(stage.join("README.md"), readme).map_err(|e| format!("README.md: {e}"))?;
    if let Some(missing) = lacking(&stage) {
        return Err(format!("the tarball would lack {missing}"));
    }

    fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let out = out
        .canonicalize()
        .map_err(|e| format!("{}: {e}", out.display()))?;
    let tarball = out.join(format!("{name}.tar.gz"));
    // Sorted, with no owner of this machine's in it, so that two builds of the same files differ
    // only in modification times.
    util::run(
        Command::new("tar")
            .args(["--sort=name", "--owner=0", "--group=0", "--numeric-owner"])
            .arg("-czf")
            .arg(&tarball)
            .arg("-C")
            .arg(&work)
            .arg(&name),
    )?;
    let sum = Command::new("sha256sum")
        .arg(tarball.file_name().unwrap_or_default())
        .current_dir(&out)
        .output()
        .map_err(|e| format!("cannot run sha256sum: {e}"))?;
    if !sum.status.success() {
        return Err(format!(
            "sha256sum {}: {}",
            tarball.display(),
            String::from_utf8_lossy(&sum.stderr)
        ));
    }
    let sha_file = out.join(format!("{name}.tar.gz.sha256"));
    fs::write(&sha_file, &sum.stdout).map_err(|e| format!("{}: {e}", sha_file.display()))?;
    remove_dir(&work)?;
    Ok(tarball)
}

/// Unpacks `tarball` with the system `tar` into a fresh directory, checks it with `sha256sum -c`
/// beside it, checks that it holds every file it must, and runs the unpacked `guild --version`;
/// answers what that printed.
fn check(tarball: &Path) -> Result<String, String> {
    let dir = tarball.parent().ok_or("the tarball has no directory")?;
    let file = tarball.file_name().unwrap_or_default().to_string_lossy();
    util::run(
        Command::new("sha256sum")
            .arg("-c")
            .arg(format!("{file}.sha256"))
            .current_dir(dir),
    )?;
    let unpacked = root().join("target/dist-check");
    remove_dir(&unpacked)?;
    fs::create_dir_all(&unpacked).map_err(|e| format!("{}: {e}", unpacked.display()))?;
    util::run(
        Command::new("tar")
            .arg("-xzf")
            .arg(tarball)
            .arg("-C")
            .arg(&unpacked),
    )?;
    let name = file.strip_suffix(".tar.gz").unwrap_or(&file);
    let top = unpacked.join(name);
    if let Some(missing) = lacking(&top) {
        return Err(format!("the unpacked tarball lacks {missing}"));
    }
    let out = Command::new(top.join("bin/guild"))
        .arg("--version")
        .output()
        .map_err(|e| format!("cannot run the unpacked guild: {e}"))?;
    let said = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let want = format!("guild {}", version()?);
    if !out.status.success() || said != want {
        return Err(format!(
            "the unpacked guild --version said {said:?} ({}), not {want:?}",
            out.status
        ));
    }
    remove_dir(&unpacked)?;
    Ok(said)
}

fn remove_dir(dir: &Path) -> Result<(), String> {
    match fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("cannot remove {}: {e}", dir.display())),
    }
}
