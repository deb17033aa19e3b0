//! Project automation: `cargo xtask <task>`. Everything CI runs is reachable from here, so that a
//! green `cargo xtask ci` on a developer's machine means a green CI.

mod capi;
mod concurrency;
mod demo;
mod dist;
mod gpu;
mod modules;
mod msrv;
mod outside;
mod sdk;
mod tidy;
mod tools;
mod util;
mod valgrind;

use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <task>

tasks:
  sdk       configure, install and package the standalone SDK into target/guild-sdk
  plugins   build the C test plugins against the installed SDK into target/test-plugins
  capi      install libguild_host (library, headers, CMake package, guild-host.pc) into
            target/guild-host [--prefix DIR], and build the C++ example engine against it
            with CMake and with pkg-config
  dist      the release tarball target/dist/guild-VERSION-TARGET.tar.gz (+ .sha256): guild,
            the SDK, libguild_host, LICENSE, README [--debug] [--out DIR]; --check unpacks
            it with tar, runs sha256sum -c and the unpacked guild --version
  tidy      check the crate dependency rules and source hygiene
  msrv      type-check every target with the declared rust-version (rustup fetches it)
  outside   after `cargo package --workspace`: type-check a runner outside the workspace
            against the packaged crates, with stable and the MSRV, failing on any warning
  loom      the loom models of the handle gate and the drain protocol
  miri      Miri over the handle table, snapshot and call-tensor unit tests (nightly)
  tsan      ThreadSanitizer over the concurrency unit tests (nightly, -Zbuild-std)
  test      everything CI runs: fmt, tidy, clippy (also a CPU-only host), docs, SDK,
            plugins, libguild_host and the C++ engine, all tests, the MSRV check, loom, Miri, ThreadSanitizer
  ci        the same as test, for CI
  gpu-check every GPU test with REQUIRE_GPU=1, with a summary (fails without a GPU);
            --bundle builds target/gpu-check/ to run them on a GPU machine without cargo
  demo      the end-to-end demo: build, sign, trust, install, run, refuse, roll back
            (everything it writes goes under target/demo)
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let task = args.first().map(String::as_str).unwrap_or("help");
    let result = match task {
        "sdk" => sdk::sdk().map(|_| ()),
        "plugins" => sdk::plugins().map(|_| ()),
        "capi" => capi::run(&args[1..]),
        "dist" => dist::run(&args[1..]),
        "tidy" => tidy::run(),
        "msrv" => msrv::run(),
        "outside" => outside::run(),
        "loom" => concurrency::loom(),
        "miri" => concurrency::miri(),
        "tsan" => concurrency::tsan(),
        "test" | "ci" => test(),
        "gpu-check" => gpu::run(&args[1..]),
        "demo" => demo::run(),
        "help" | "-h" | "--help" => {
            print!("{USAGE}");
            Ok(())
        }
        other => Err(format!("unknown task {other:?}\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask {task}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs every check CI runs, in order from cheapest to slowest so that a failure shows early.
fn test() -> Result<(), String> {
    use util::{cargo, step};
    tools::require(tools::Task::Test)?;
    step("cargo fmt --check", || {
        cargo(&["fmt", "--all", "--", "--check"])
    })?;
    step("tidy", tidy::run)?;
    step("cargo clippy", || {
        cargo(&[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ])
    })?;
    // A CPU-only runner turns the host's `cuda` feature off; that build must stay warning-free
    // (clippy is a check that also sees the imports only the CUDA code used).
    step("guild-host without default features (no CUDA)", || {
        cargo(&[
            "clippy",
            "-p",
            "guild-host",
            "--no-default-features",
            "--",
            "-D",
            "warnings",
        ])
    })?;
    // Every crate must stay packageable, in dependency order (versions on internal
    // dependencies, included files, a lock file for the binaries), though none is uploaded.
    // The verify build is the next step's: a runner outside the workspace built against the
    // packaged guild-host and everything it stands on.
    step("cargo package --workspace", || {
        cargo(&["package", "--workspace", "--no-verify", "--allow-dirty"])
    })?;
    step(
        "an outside runner against the packaged crates (stable and MSRV, no warnings)",
        outside::run,
    )?;
    step("cargo doc (warnings are errors)", || {
        util::cargo_env(
            &["doc", "--workspace", "--no-deps"],
            &[("RUSTDOCFLAGS", std::ffi::OsStr::new("-D warnings"))],
        )
    })?;
    let plugins = step("SDK and test plugins", sdk::plugins)?;
    step(
        "libguild_host: install, then the C++ example engine with CMake and pkg-config",
        || capi::install_and_build(&util::root().join("target/guild-host")).map(drop),
    )?;
    // The release tarball, in the dev profile for speed: unpacked with the system tar, its
    // .sha256 checked with sha256sum -c, the unpacked guild run.
    step("dist --debug --check: the publisher's tarball", || {
        let out = util::root().join("target/dist-debug");
        dist::run(&[
            "--debug".into(),
            "--check".into(),
            "--out".into(),
            out.display().to_string(),
        ])
    })?;
    let env = [("GUILD_TEST_PLUGIN_DIR", plugins.as_os_str())];
    step("cargo test", || {
        util::cargo_env(
            &[
                "test",
                "--workspace",
                "--all-targets",
                "--exclude",
                "guild-abi",
            ],
            &env,
        )
    })?;
    // `--all-targets` leaves doctests out; the library's examples must compile too.
    step("cargo test --doc -p guild-host", || {
        util::cargo_env(&["test", "--doc", "-p", "guild-host"], &env)
    })?;
    // The ABI tests print what they covered (structs, fields, constants, compilations), which
    // is worth seeing in every CI log.
    step("cargo test -p guild-abi", || {
        util::cargo_env(
            &[
                "test",
                "-p",
                "guild-abi",
                "--all-targets",
                "--",
                "--nocapture",
            ],
            &env,
        )
    })?;
    step("valgrind: the tests that cross the C boundary", || {
        valgrind::run(&plugins)
    })?;
    step("MSRV: cargo check with the declared rust-version", || {
        msrv::run()?;
        util::prune_side_build("msrv")
    })?;
    step("loom: the models of the lock-free protocols", || {
        concurrency::loom()?;
        util::prune_side_build("loom")
    })?;
    step("Miri: the handle table and the call tensors", || {
        concurrency::miri()?;
        util::prune_side_build("miri")
    })?;
    step("ThreadSanitizer: the concurrency unit tests", || {
        concurrency::tsan()?;
        util::prune_side_build("tsan")
    })?;
    Ok(())
}
