//! The `guild` command line for operators and publishers; see docs/cli.md.
//!
//! The command-line code lives in the binary's own module tree (`cli`), so that the
//! `guild_host` library that runners embed carries none of it.

#![forbid(unsafe_code)]

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
