//! `guild`: the operator's and publisher's command line over `guild-host` (see docs/cli.md).
//! It parses the arguments, runs one command against the library, and prints its result or its
//! error (with the documented exit code).
//!
//! It lives in its own crate so that the `guild_host` library that runners embed carries none
//! of its dependencies (clap, clap_complete, anyhow). Nothing here adds a way around
//! verification for a store: every package goes through the same `PackageManager` calls that an
//! embedding runner uses (`guild check`, which runs a publisher's unsigned build in child
//! processes, opens no store), and the adapters it needs (key files, archives, the store's layout, the CUDA
//! probe) are reached through `guild-host`'s re-exports, never named directly.

#![forbid(unsafe_code)]

mod args;
mod check;
mod distribute;
mod doctor;
mod failure;
mod fleet;
mod output;
mod params;
mod progress;
mod publisher;
mod quarantine;
mod render;
mod resolve;
mod store;
mod trust;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::error::ErrorKind;
use clap::Parser;

use args::{Cli, Command, FleetCommand, QuarantineCommand};
use failure::{CliError, Exit, Failure};
use output::{Output, Report};

/// Runs `guild` with the process's arguments.
fn main() -> ExitCode {
    // Ctrl-C or SIGTERM while a command loads packages (`resolve`, `status`) ends it as before,
    // but is not taken for a crash in the library being initialised.
    let _ = guild_host::termination::install_termination_handlers();
    let raw: Vec<OsString> = std::env::args_os().collect();
    let cli = match Cli::try_parse_from(&raw) {
        Ok(cli) => cli,
        Err(e) => return usage(e, asks_for_json(&raw)),
    };
    let out = Output {
        json: cli.json,
        quiet: cli.quiet,
    };
    // A command that did its work but whose report could not reach stdout fails as well.
    let done = run(&cli).and_then(|report| {
        let exit = report.exit;
        out.last_success(report).map_err(|e| {
            CliError::new(
                Exit::Failure,
                format!(
                    "the command completed, but its output could not be written to standard \
                     output: {e}"
                ),
            )
        })?;
        Ok(exit)
    });
    match done {
        Ok(exit) => exit.map_or(ExitCode::SUCCESS, Into::into),
        Err(err) => {
            let failure = Failure::from_error(&err);
            out.failure(&failure);
            failure.exit.into()
        }
    }
}

/// Help and version requests succeed; everything else clap refuses is a usage error (exit 2),
/// printed as JSON when the command line asked for JSON.
fn usage(e: clap::Error, json: bool) -> ExitCode {
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    if json {
        // clap's rendered first line is "error: <what>"; keep only the message.
        let rendered = e.to_string();
        let first = rendered.lines().next().unwrap_or("");
        let text = first.strip_prefix("error: ").unwrap_or(first);
        let _ = output::print_json(&mut std::io::stderr(), &output::usage_json(text));
    } else {
        let _ = e.print();
    }
    Exit::Usage.into()
}

/// Whether `--json` appears among the options (before a `--` separator), for errors raised
/// before the command line is understood.
fn asks_for_json(raw: &[OsString]) -> bool {
    raw.iter()
        .skip(1)
        .take_while(|a| a.as_os_str() != "--")
        .any(|a| a.as_os_str() == "--json")
}

fn run(cli: &Cli) -> anyhow::Result<Report> {
    match &cli.command {
        Command::Keygen { out, force } => publisher::keygen(out, *force),
        Command::Pack {
            source,
            manifest,
            out,
            key,
        } => publisher::pack(source, manifest, out, key.as_deref()),
        Command::Sign { package, key, out } => publisher::sign(package, key, out.as_deref()),
        Command::Verify {
            package: Some(package),
            all: false,
            ..
        } => publisher::verify(
            &store_dir(cli, false)?,
            package,
            progress::for_stderr(cli.json, cli.quiet),
        ),
        Command::Verify { jobs, .. } => store::verify_all(&store_dir(cli, true)?, jobs_of(*jobs)),
        Command::Inspect { package } => publisher::inspect(package),
        Command::Trust(t) => trust::run(&store_dir(cli, true)?, t),
        Command::Fleet(f @ (FleetCommand::Join { .. } | FleetCommand::Sync { .. })) => {
            let out = Output {
                json: cli.json,
                quiet: cli.quiet,
            };
            fleet::run_on_store(
                &store_dir(cli, true)?,
                f,
                &out,
                progress::for_stderr(cli.json, cli.quiet),
            )
        }
        Command::Fleet(f) => fleet::run(f),
        Command::Quarantine(QuarantineCommand::Clear { id }) => {
            store::quarantine_clear(&store_dir(cli, true)?, id)
        }
        Command::Install {
            package,
            disabled,
            allow_downgrade,
        } if distribute::is_reference(package) => distribute::install(
            &store_dir(cli, true)?,
            &distribute::parse_reference(&package.to_string_lossy())
                .map_err(|e| CliError::new(Exit::Usage, e))?,
            !*disabled,
            *allow_downgrade,
            progress::for_stderr(cli.json, cli.quiet),
        ),
        Command::Install {
            package,
            disabled,
            allow_downgrade,
        } => store::install(
            &store_dir(cli, true)?,
            package,
            !*disabled,
            *allow_downgrade,
            progress::for_stderr(cli.json, cli.quiet),
        ),
        Command::Push {
            package,
            reference,
            annotations,
        } => distribute::push(
            package,
            reference,
            annotations,
            progress::for_stderr(cli.json, cli.quiet),
        ),
        Command::Pull {
            reference,
            out,
            lock,
            to,
        } => match (reference, out, lock, to) {
            (Some(r), Some(out), _, _) => {
                distribute::pull(r, out, progress::for_stderr(cli.json, cli.quiet))
            }
            (_, _, Some(lock), Some(to)) => {
                distribute::mirror(lock, to, progress::for_stderr(cli.json, cli.quiet))
            }
            _ => Err(CliError::new(
                Exit::Usage,
                "give REFERENCE --out FILE, or --lock LOCK --to DIR",
            )
            .into()),
        },
        Command::Lock { out, allow_empty } => {
            distribute::lock(&store_dir(cli, true)?, out, *allow_empty)
        }
        Command::Sync {
            lock,
            from,
            allow_shrink,
            dry_run,
            check,
        } => distribute::sync(
            &store_dir(cli, true)?,
            lock,
            &distribute::SyncRequest {
                from: from.as_deref(),
                allow_shrink: *allow_shrink,
                mode: if *check {
                    distribute::SyncMode::Check
                } else if *dry_run {
                    distribute::SyncMode::DryRun
                } else {
                    distribute::SyncMode::Apply
                },
            },
            progress::for_stderr(cli.json, cli.quiet),
        ),
        Command::Enable { id } => store::enable(&store_dir(cli, true)?, id),
        Command::Disable { id } => store::disable(&store_dir(cli, true)?, id),
        Command::Remove { id, version } => {
            store::remove(&store_dir(cli, true)?, id, version.as_ref())
        }
        Command::Purge { id, version } => {
            store::purge(&store_dir(cli, true)?, id, version.as_ref())
        }
        Command::Rollback { id } => store::rollback(&store_dir(cli, true)?, id),
        Command::List => store::list(&store_dir(cli, true)?, cli.json),
        Command::Status { id } => store::status(&store_dir(cli, true)?, id.as_ref()),
        Command::Recover => store::recover(&store_dir(cli, true)?),
        Command::Resolve {
            op,
            inputs,
            outputs,
            exact,
            ram_budget,
            params,
        } => resolve::run(
            &store_dir(cli, true)?,
            op,
            inputs,
            outputs,
            exact.as_ref(),
            *ram_budget,
            params.as_ref().map_or(&[][..], |p| &p.0),
        ),
        Command::Doctor { deep, jobs } => {
            doctor::run(&store_dir(cli, true)?, deep.then(|| jobs_of(*jobs)))
        }
        Command::Check {
            path,
            manifest,
            timeout,
            params,
            allow_skipped,
        } => check::run(
            path,
            manifest.as_deref(),
            &check::Settings::new(*timeout, params, *allow_skipped)?,
        ),
        Command::Conformance {
            dir,
            resume_after,
            hung,
            params_hex,
            operation_params_hex,
            results_fd,
        } => check::child(
            dir,
            *resume_after,
            hung,
            params_hex.as_deref(),
            operation_params_hex,
            *results_fd,
        ),
        Command::CheckLibrary {
            dir,
            payload,
            signatures,
            results_fd,
        } => store::check_library(dir, payload, signatures, *results_fd),
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(*shell, &mut command, "guild", &mut std::io::stdout());
            // The script is the output; there is nothing else to report.
            Ok(Report::new("completions").silent())
        }
    }
}

/// How a full check runs for `--jobs N` (one thread per core without it).
fn jobs_of(jobs: Option<u16>) -> guild_host::VerifyOptions {
    guild_host::VerifyOptions {
        jobs: jobs.map(usize::from),
    }
}

/// The store directory: `--store`, else `$GUILD_STORE`, else `$XDG_DATA_HOME/guild`, else
/// `$HOME/.local/share/guild`. Empty variables count as unset. With `prepare`, a missing data
/// directory above the default store is created (commands that only read pass `false`).
fn store_dir(cli: &Cli, prepare: bool) -> anyhow::Result<PathBuf> {
    if let Some(dir) = &cli.store {
        return named_store(dir.clone(), "--store", prepare);
    }
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = var("GUILD_STORE") {
        return named_store(PathBuf::from(dir), "GUILD_STORE", prepare);
    }
    let data = var("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|home| PathBuf::from(home).join(".local/share")));
    if let Some(data) = data {
        // The data directory itself may not exist yet on a fresh account; the store creates
        // only its own directory, so that a mistyped explicit --store is an error, not a tree.
        if prepare {
            std::fs::create_dir_all(&data)
                .with_context(|| format!("cannot create the data directory {}", data.display()))?;
        }
        return Ok(data.join("guild"));
    }
    Err(CliError::new(
        Exit::Usage,
        "no store directory: neither --store, GUILD_STORE, XDG_DATA_HOME nor HOME is set",
    )
    .with_hint("pass --store DIR")
    .into())
}

/// A store directory the operator named (`from`: `--store` or `GUILD_STORE`). The store creates
/// its own directory on first use but never the directories above it, so that a mistyped path
/// is an error rather than a new tree; a missing parent is said as such (not as a damaged
/// store) before any command tries to create the store in it.
fn named_store(dir: PathBuf, from: &str, prepare: bool) -> anyhow::Result<PathBuf> {
    let parent = dir.parent().filter(|p| !p.as_os_str().is_empty());
    if let Some(parent) = parent.filter(|p| prepare && !dir.exists() && !p.exists()) {
        return Err(CliError::new(
            Exit::NotFound,
            format!(
                "the store directory {} cannot be created: its parent directory {} does not exist",
                dir.display(),
                parent.display()
            ),
        )
        .with_hint(format!(
            "check the path given by {from}; if it is right, create {} first (`mkdir -p`)",
            parent.display()
        ))
        .into());
    }
    Ok(dir)
}
