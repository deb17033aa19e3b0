//! `cargo xtask gpu-check`: every GPU test in one prepared command, for a short lease of a GPU
//! machine.
//!
//! It asks the driver what it has first (`guild-cuda-probe`), so that a machine without a
//! usable GPU fails in seconds with the reason; then builds the SDK and the C test plugins and
//! runs the CUDA adapter's `gpu::` tests and the host's `gpu::` tests with `REQUIRE_GPU=1`, so
//! that no test may skip. A summary of every step follows, whatever failed.
//!
//! Then the figures a GPU machine (and its cores) can show, each printing its own verdict:
//! execute on a stream against a direct `cuLaunchKernel` of the same kernel (`cuda_execute`
//! bench), reader processes opening one store at once (`live` bench, `GUILD_BENCH_ONLY=open`)
//! and the full check's scaling with its threads (`store_open` bench,
//! `GUILD_BENCH_ONLY=full-check`).
//!
//! `cargo xtask gpu-check --bundle` does the building only, on any machine: it writes
//! `target/gpu-check/` with the probe, the two test executables and the three benchmarks
//! (stripped), release builds of `guild` and the example runner, the C test plugins, the one
//! workspace file a benchmark reads, and `run.sh`, which runs the same checks without cargo (a
//! GPU machine without a Rust toolchain or network access only needs that directory).

use std::fmt::Write as _;
use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::{sdk, util};

/// The test filter of the adapter's device tests.
const ADAPTER_FILTER: &str = "gpu::";
/// The test filter of the host's CUDA tests (device tests, the fake-driver run and the checks
/// that hold without a device).
const HOST_FILTER: &str = "gpu::";
/// The host's device tests alone (what the bundle runs: the others need a C compiler).
const HOST_DEVICE_FILTER: &str = "gpu::device::";
/// The benchmarks each run prints the figures of: step name, bench target, `GUILD_BENCH_ONLY`.
const BENCHES: &[(&str, &str, &str)] = &[
    ("stream execute against a direct launch", "cuda_execute", ""),
    ("reader processes opening one store at once", "live", "open"),
    (
        "full check scaling with its threads",
        "store_open",
        "full-check",
    ),
];
/// Packages in the store the full check's scaling runs over.
const FULL_CHECK_SIZE: usize = 10_000;

pub fn run(args: &[String]) -> Result<(), String> {
    match args {
        [] => check(),
        [flag] if flag == "--bundle" => bundle().map(|dir| {
            println!(
                "gpu-check: bundle ready in {}; on a GPU machine run `sh {}/run.sh`",
                dir.display(),
                dir.display()
            );
        }),
        other => Err(format!(
            "unexpected arguments {other:?}; usage: cargo xtask gpu-check [--bundle]"
        )),
    }
}

/// One step's outcome, for the summary.
struct Step {
    name: String,
    seconds: f64,
    outcome: Result<(), String>,
    /// `test result:` and `skipped:` lines the step printed.
    notes: Vec<String>,
}

fn check() -> Result<(), String> {
    let mut steps: Vec<Step> = Vec::new();
    let mut device = None;

    let probe = timed("probe the CUDA driver", || {
        let out = cargo_output(&[
            "run",
            "--quiet",
            "-p",
            "guild-adapters-cuda",
            "--bin",
            "guild-cuda-probe",
        ])?;
        match out.code {
            0 => {
                device = Some(out.stdout.trim().to_string());
                Ok(())
            }
            2 => Err(format!("no usable GPU: {}", out.stdout.trim())),
            code => Err(format!(
                "the probe failed (exit {code}): {}{}",
                out.stdout, out.stderr
            )),
        }
    });
    let probed = probe.outcome.is_ok();
    steps.push(probe);

    if probed {
        let mut plugins = None;
        let built = timed("build the SDK and the C test plugins", || {
            plugins = Some(sdk::plugins()?);
            Ok(())
        });
        let built_ok = built.outcome.is_ok();
        steps.push(built);
        if let (true, Some(plugins)) = (built_ok, plugins) {
            let env = [
                ("GUILD_TEST_PLUGIN_DIR", plugins.display().to_string()),
                ("REQUIRE_GPU", "1".to_string()),
            ];
            steps.push(test_step(
                "CUDA adapter tests (gpu::)",
                cargo_command(&[
                    "test",
                    "-p",
                    "guild-adapters-cuda",
                    "--test",
                    "it",
                    "--",
                    ADAPTER_FILTER,
                    "--test-threads=1",
                ]),
                &env,
            ));
            steps.push(test_step(
                "host CUDA tests (gpu::)",
                cargo_command(&[
                    "test",
                    "-p",
                    "guild-host",
                    "--test",
                    "it",
                    "--",
                    HOST_FILTER,
                    "--test-threads=1",
                ]),
                &env,
            ));
            for (name, bench, only) in BENCHES {
                let mut env = env.to_vec();
                if !only.is_empty() {
                    env.push(("GUILD_BENCH_ONLY", (*only).to_string()));
                }
                if *bench == "store_open" {
                    env.push(("GUILD_BENCH_FULL_CHECK_SIZE", FULL_CHECK_SIZE.to_string()));
                }
                steps.push(test_step(
                    name,
                    cargo_command(&["bench", "-p", "guild-host", "--bench", bench]),
                    &env,
                ));
            }
        }
    }
    summarise(&steps, device.as_deref())
}

/// Runs `f`, timing it and printing its name.
fn timed(name: &str, f: impl FnOnce() -> Result<(), String>) -> Step {
    eprintln!("==> {name}");
    let start = Instant::now();
    let outcome = f();
    let seconds = start.elapsed().as_secs_f64();
    match &outcome {
        Ok(()) => eprintln!("<== {name} ({seconds:.1}s)"),
        Err(e) => eprintln!("<== {name}: FAILED ({seconds:.1}s): {e}"),
    }
    Step {
        name: name.to_string(),
        seconds,
        outcome,
        notes: Vec::new(),
    }
}

/// Runs a test command with `env`, echoing its output and keeping its result, skip and note
/// lines (`<test>: skipped: ...`, `<test>: note: ...`, printed past libtest's capture).
fn test_step(name: &str, mut cmd: Command, env: &[(&str, String)]) -> Step {
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut notes = Vec::new();
    let mut step = timed(name, || {
        let (ok, lines) = run_echoing(&mut cmd)?;
        notes = lines
            .into_iter()
            .filter(|l| {
                l.starts_with("test result:")
                    || l.contains(": skipped: ")
                    || l.contains(": note: ")
                    || is_figure(l)
            })
            .collect();
        if ok {
            Ok(())
        } else {
            Err("tests failed".to_string())
        }
    });
    step.notes = notes;
    step
}

/// Whether `line` is one of the benchmarks' figures or verdicts (their headings, and their
/// rows, which are indented by two spaces).
fn is_figure(line: &str) -> bool {
    ["cuda_execute:", "live/open:", "full check scaling:", "  "]
        .iter()
        .any(|p| line.starts_with(p))
        && !line.starts_with("   ")
}

/// Runs `cmd` with its stdout and stderr echoed line by line; returns whether it succeeded and
/// every line it printed.
fn run_echoing(cmd: &mut Command) -> Result<(bool, Vec<String>), String> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {cmd:?}: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let echo_err = std::thread::spawn(move || echo(stderr, true));
    let mut lines = echo(stdout, false);
    lines.extend(echo_err.join().unwrap_or_default());
    let status = child
        .wait()
        .map_err(|e| format!("waiting for {cmd:?}: {e}"))?;
    Ok((status.success(), lines))
}

fn echo(stream: impl Read, to_stderr: bool) -> Vec<String> {
    let mut lines = Vec::new();
    for line in BufReader::new(stream).lines().map_while(Result::ok) {
        if to_stderr {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
        lines.push(line);
    }
    lines
}

fn summarise(steps: &[Step], device: Option<&str>) -> Result<(), String> {
    let mut out = String::from("\ngpu-check summary\n");
    if let Some(device) = device {
        for line in device.lines() {
            let _ = writeln!(out, "  {line}");
        }
    }
    for step in steps {
        let status = if step.outcome.is_ok() {
            "ok    "
        } else {
            "FAILED"
        };
        let _ = writeln!(out, "  {status} {:<40} {:>6.1}s", step.name, step.seconds);
        if let Err(e) = &step.outcome {
            let _ = writeln!(out, "         {e}");
        }
        for note in &step.notes {
            let _ = writeln!(out, "         {note}");
        }
    }
    print!("{out}");
    match steps.iter().find(|s| s.outcome.is_err()) {
        None => Ok(()),
        Some(failed) => Err(format!(
            "{} failed{}",
            failed.name,
            failed
                .outcome
                .as_ref()
                .err()
                .map_or(String::new(), |e| format!(": {e}"))
        )),
    }
}

fn cargo_command(args: &[&str]) -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(util::root()).args(util::locked(args));
    cmd
}

struct Output {
    code: i32,
    stdout: String,
    stderr: String,
}

fn cargo_output(args: &[&str]) -> Result<Output, String> {
    let out = cargo_command(args)
        .output()
        .map_err(|e| format!("cannot run cargo {}: {e}", args.join(" ")))?;
    Ok(Output {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

// ---------------------------------------------------------------------------------------------
// The bundle
// ---------------------------------------------------------------------------------------------

/// Copies `from` to `to`, without debug information when `strip` is there.
fn copy_stripped(from: &Path, to: &Path) -> Result<(), String> {
    copy_with_strip(from, to, "--strip-debug")
}

/// Copies `from` to `to` stripped with `how` (`--strip-debug` keeps the symbols a test's
/// backtrace names; `--strip-all` is for release binaries, whose panics say enough).
fn copy_with_strip(from: &Path, to: &Path, how: &str) -> Result<(), String> {
    fs::copy(from, to)
        .map_err(|e| format!("cannot copy {} to {}: {e}", from.display(), to.display()))?;
    // Debug information is most of a test binary's size; the bundle must stay small enough to
    // carry to another machine (64 MiB with the checkout). Without `strip` the copy stays as it
    // is.
    let _ = Command::new("strip").arg(how).arg(to).status();
    Ok(())
}

const RUN_SH: &str = r#"#!/bin/sh
# Runs the GPU checks of the Guild host from a bundle made by `cargo xtask gpu-check --bundle`:
# the CUDA driver probe, then the CUDA adapter's and the host's device tests with REQUIRE_GPU=1
# (no test may skip), then the benchmarks that need a GPU or many cores, each with its verdict.
# Prints a summary; exits non-zero when anything failed.
# Each step's full output goes to a log in GPU_CHECK_LOG_DIR (default: this directory).
here=$(cd "$(dirname "$0")" && pwd)
logs=${GPU_CHECK_LOG_DIR:-$here}
mkdir -p "$logs"
export GUILD_TEST_PLUGIN_DIR="$here/plugins"
export REQUIRE_GPU=1
summary=""
failed=0
step() {
  name=$1; shift
  echo "==> $name"
  start=$(date +%s)
  log="$logs/$(echo "$name" | tr -c 'a-zA-Z0-9\n' '_' ).log"
  "$@" >"$log" 2>&1
  rc=$?
  cat "$log"
  end=$(date +%s)
  if [ $rc -eq 0 ]; then status="ok    "; else status="FAILED"; failed=1; fi
  summary="$summary
  $status $name ($((end - start))s)"
  notes=$(grep -E '^test result:|: skipped: |: note: |^cuda_execute:|^live/open:|^full check scaling:|^  [^ ]' "$log" | sed 's/^/         /')
  if [ -n "$notes" ]; then summary="$summary
$notes"; fi
  return $rc
}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
if step "probe the CUDA driver" "$here/guild-cuda-probe"; then
  # One test at a time: their notes stay whole lines, and their timings see one GPU user.
  step "CUDA adapter tests (gpu::)" "$here/adapters-cuda-it" "__ADAPTER_FILTER__" --test-threads=1
  step "host device tests (gpu::device::)" "$here/host-it" "__HOST_FILTER__" --test-threads=1
  step "stream execute against a direct launch" "$here/bench/cuda_execute" --bench
  step "reader processes opening one store at once" env GUILD_BENCH_ONLY=open \
    GUILD_BENCH_BIN_DIR="$here/bin" GUILD_BENCH_WORKSPACE="$here/workspace" "$here/bench/live" --bench
  step "full check scaling with its threads" env GUILD_BENCH_ONLY=full-check \
    GUILD_BENCH_FULL_CHECK_SIZE="${GPU_CHECK_FULL_CHECK_SIZE:-__FULL_CHECK_SIZE__}" \
    GUILD_BENCH_STORES="$scratch/stores" "$here/bench/store_open" --bench
fi
echo
echo "gpu-check summary$summary"
exit $failed
"#;

fn bundle() -> Result<PathBuf, String> {
    let dir = util::root().join("target").join("gpu-check");
    if dir.exists() {
        fs::remove_dir_all(&dir).map_err(|e| format!("cannot remove {}: {e}", dir.display()))?;
    }
    let plugins_dir = dir.join("plugins");
    fs::create_dir_all(&plugins_dir)
        .map_err(|e| format!("cannot create {}: {e}", plugins_dir.display()))?;

    let plugins = util::step("SDK and test plugins", sdk::plugins)?;
    for entry in
        fs::read_dir(&plugins).map_err(|e| format!("cannot list {}: {e}", plugins.display()))?
    {
        let path = entry.map_err(|e| e.to_string())?.path();
        if let Some(name) = path.file_name() {
            fs::copy(&path, plugins_dir.join(name))
                .map_err(|e| format!("cannot copy {}: {e}", path.display()))?;
        }
    }
    util::step("the CUDA probe", || {
        util::cargo(&[
            "build",
            "-p",
            "guild-adapters-cuda",
            "--bin",
            "guild-cuda-probe",
        ])?;
        let probe = util::root()
            .join("target")
            .join("debug")
            .join("guild-cuda-probe");
        copy_stripped(&probe, &dir.join("guild-cuda-probe"))
    })?;
    util::step("the test executables", || {
        copy_stripped(
            &util::test_executable("guild-adapters-cuda")?,
            &dir.join("adapters-cuda-it"),
        )?;
        copy_stripped(&util::test_executable("guild-host")?, &dir.join("host-it"))
    })?;
    util::step("the benchmarks and the release binaries they start", || {
        let bench_dir = dir.join("bench");
        let bin_dir = dir.join("bin");
        for d in [&bench_dir, &bin_dir] {
            fs::create_dir_all(d).map_err(|e| format!("cannot create {}: {e}", d.display()))?;
        }
        let mut args = vec!["bench", "--no-run", "-p", "guild-host"];
        for (_, bench, _) in BENCHES {
            args.extend(["--bench", bench]);
        }
        for (_, bench, _) in BENCHES {
            copy_with_strip(
                &util::cargo_executable(&args, bench)?,
                &bench_dir.join(bench),
                "--strip-all",
            )?;
        }
        for (package, bin) in [
            ("guild-cli", "guild"),
            ("guild-example-runner", "guild-example-runner"),
        ] {
            let built =
                util::cargo_executable(&["build", "--release", "-p", package, "--bin", bin], bin)?;
            copy_with_strip(&built, &bin_dir.join(bin), "--strip-all")?;
        }
        // The live benchmark packs the example scan module from its manifest template.
        let template = Path::new("examples/modules/scan/manifest.json");
        let to = dir.join("workspace").join(template);
        fs::create_dir_all(to.parent().expect("a file in a directory"))
            .map_err(|e| format!("cannot create {}: {e}", to.display()))?;
        fs::copy(util::root().join(template), &to)
            .map_err(|e| format!("cannot copy {}: {e}", template.display()))?;
        Ok(())
    })?;
    let script = RUN_SH
        .replace("__ADAPTER_FILTER__", ADAPTER_FILTER)
        .replace("__HOST_FILTER__", HOST_DEVICE_FILTER)
        .replace("__FULL_CHECK_SIZE__", &FULL_CHECK_SIZE.to_string());
    let run_sh = dir.join("run.sh");
    fs::write(&run_sh, script).map_err(|e| format!("cannot write {}: {e}", run_sh.display()))?;
    println!("gpu-check: bundle is {} MiB", tree_size(&dir)? >> 20);
    Ok(dir)
}

/// The bytes of every file under `dir`.
fn tree_size(dir: &Path) -> Result<u64, String> {
    let mut total = 0;
    for entry in fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))? {
        let entry = entry.map_err(|e| e.to_string())?;
        let meta = entry.metadata().map_err(|e| e.to_string())?;
        total += if meta.is_dir() {
            tree_size(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}
