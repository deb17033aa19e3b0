//! The `guild` command line for operators.

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!(
        "guild: no subcommands are available yet; the package commands arrive with the store"
    );
    ExitCode::from(2)
}
