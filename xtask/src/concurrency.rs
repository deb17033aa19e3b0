//! The machine checks of the lock-free protocols (ARCHITECTURE.md, "Machine-checked
//! concurrency"): the loom models of the handle gate and the drain protocol, Miri over the
//! handle table and the call-tensor code, and ThreadSanitizer over the concurrency unit tests.
//! Miri and ThreadSanitizer need a nightly toolchain with `miri` and `rust-src`, which rustup
//! fetches when it is missing, as the MSRV step fetches its toolchain. A tool that cannot be
//! had fails the step in CI (`CI` set) and skips it elsewhere, with the reason.

use std::ffi::OsStr;

use crate::msrv::{installed, path_str, rustup};
use crate::util::{self, root};

const NIGHTLY: &str = "nightly";
/// The unit tests each tool runs, in `guild-runtime`: the gate and handle table, the call
/// tensors and call cells, the striped binding counts; ThreadSanitizer also the per-thread
/// impl-id tables and the expert pool, and in `guild-packages` the scoped thread map of the full
/// check.
const LOOM_FILTER: &str = "loom_";
const MIRI_FILTERS: &[&str] = &["operations::", "snapshot::"];
const TSAN_FILTERS: &[&str] = &[
    "operations::",
    "snapshot::",
    "parallel::",
    "id_lookup::",
    "experts::",
];

/// The loom models, in the test profile (the models are small; a release build of every
/// dependency would cost minutes) and in their own target directory, so that `--cfg loom`
/// never invalidates the ordinary build.
pub fn loom() -> Result<(), String> {
    let target = root().join("target").join("loom");
    let preemptions = std::env::var_os("LOOM_MAX_PREEMPTIONS").unwrap_or_else(|| "3".into());
    util::cargo_env(
        &[
            "test",
            "-p",
            "guild-runtime",
            "--lib",
            "--target-dir",
            path_str(&target)?,
            "--",
            LOOM_FILTER,
        ],
        &[
            ("RUSTFLAGS", OsStr::new("--cfg loom")),
            ("LOOM_MAX_PREEMPTIONS", &preemptions),
        ],
    )
}

/// Miri over the runtime's handle-table, snapshot and call-tensor unit tests (none calls C).
pub fn miri() -> Result<(), String> {
    if !nightly_with(&["miri", "rust-src"])? {
        return Ok(());
    }
    let target = root().join("target").join("miri");
    let mut args = vec![
        "run",
        NIGHTLY,
        "cargo",
        "miri",
        "test",
        "--locked",
        "-p",
        "guild-runtime",
        "--lib",
        // The CUDA adapter is all FFI; the code under test does not need it.
        "--no-default-features",
        "--target-dir",
        path_str(&target)?,
        "--",
    ];
    args.extend(MIRI_FILTERS);
    util::run(rustup().args(args))
}

/// ThreadSanitizer over the concurrency unit tests of the runtime and the package service, with a
/// std built with it
/// (`-Zbuild-std`), so that the atomics and locks of std are seen too.
pub fn tsan() -> Result<(), String> {
    if !nightly_with(&["rust-src"])? {
        return Ok(());
    }
    let target = root().join("target").join("tsan");
    let mut args = vec![
        "run",
        NIGHTLY,
        "cargo",
        "test",
        "--locked",
        "-Zbuild-std",
        "--target",
        "x86_64-unknown-linux-gnu",
        "-p",
        "guild-runtime",
        "-p",
        "guild-packages",
        "--lib",
        "--no-default-features",
        "--target-dir",
        path_str(&target)?,
        "--",
    ];
    args.extend(TSAN_FILTERS);
    util::run(
        rustup()
            .args(args)
            .env("RUSTFLAGS", "-Zsanitizer=thread")
            .env("RUSTDOCFLAGS", "-Zsanitizer=thread")
            .env("TSAN_OPTIONS", "halt_on_error=1"),
    )
}

/// Whether the nightly toolchain with `components` is here, after fetching what is missing
/// with rustup. In CI a failure to fetch fails the step; elsewhere it skips, saying why.
fn nightly_with(components: &[&str]) -> Result<bool, String> {
    match fetch_nightly(components) {
        Ok(()) => Ok(true),
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("xtask: skipping (CI requires it): {e}");
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

fn fetch_nightly(components: &[&str]) -> Result<(), String> {
    if !installed(NIGHTLY)? {
        eprintln!("xtask: installing the nightly toolchain with rustup");
        let list = components.join(",");
        return util::run(rustup().args([
            "toolchain",
            "install",
            NIGHTLY,
            "--profile",
            "minimal",
            "--component",
            &list,
        ]));
    }
    let out = rustup()
        .args(["component", "list", "--installed", "--toolchain", NIGHTLY])
        .output()
        .map_err(|e| format!("cannot run rustup: {e}"))?;
    let have = String::from_utf8_lossy(&out.stdout);
    let missing: Vec<&str> = components
        .iter()
        .copied()
        .filter(|c| !have.lines().any(|l| l.starts_with(c)))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!(
        "xtask: adding {} to the nightly toolchain",
        missing.join(", ")
    );
    let mut cmd = rustup();
    cmd.args(["component", "add", "--toolchain", NIGHTLY])
        .args(missing);
    util::run(&mut cmd)
}
