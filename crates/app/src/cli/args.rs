//! The command-line grammar of `guild`: global options, subcommands, their help and examples.
//!
//! Values with a grammar of their own (package ids, versions, digests) are parsed here, so that a
//! malformed one is a usage error (exit 2) before anything touches a store.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use guild_domain::ids::{PackageId, PublisherId, Sha256Digest};
use guild_domain::version::Version;

/// The exit codes, printed under `guild --help` and documented in docs/cli.md.
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  success
  1  unexpected failure (an I/O error outside the store, a bug)
  2  usage error (unknown option, malformed id, version or digest)
  3  rejected: a package, manifest template or key file is malformed, tampered,
     unauthenticated (untrusted publisher, revoked key or digest) or for another platform
  4  refused by policy: dependencies, leases, immutable versions, downgrades, trust rules,
     an existing key file
  5  store unusable: locked by another process, corrupt, unreadable, or an I/O failure in it
  6  not found: the package file, package id, version or key file does not exist

Store: --store DIR, else $GUILD_STORE, else $XDG_DATA_HOME/guild, else ~/.local/share/guild.
No option or variable loads unsigned or untrusted code, or skips verification.";

/// The `guild` command line.
#[derive(Debug, Parser)]
#[command(
    name = "guild",
    version,
    about = "Operate a Guild kernel store: keys, trust, signed packages, install and rollback",
    long_about = "Operate a Guild kernel store.\n\n\
        Publishers make keys, pack built plugins into .gkernel/.gkmodule archives and sign them. \
        Operators decide which publishers' keys they trust, then install, enable, disable, \
        remove and roll back packages in a store. Every package is authenticated against the \
        store's trust store before any of its files reach the store.",
    after_help = EXIT_CODES_HELP,
    after_long_help = EXIT_CODES_HELP
)]
pub struct Cli {
    /// The store directory (created on first use).
    #[arg(long, global = true, value_name = "DIR")]
    pub store: Option<PathBuf>,

    /// Print machine-readable JSON on stdout; errors become JSON on stderr.
    #[arg(long, global = true)]
    pub json: bool,

    /// Print nothing on success (errors are still printed).
    #[arg(long, short, global = true)]
    pub quiet: bool,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Make a publisher key pair: PREFIX.key (PKCS#8, mode 0600) and PREFIX.pub (SPKI).
    #[command(after_help = "Examples:\n  guild keygen --out keys/org.example\n  \
        guild keygen --out keys/org.example --force   # replace an existing pair")]
    Keygen {
        /// Path prefix of the two files (`.key` and `.pub` are appended).
        #[arg(long, value_name = "PREFIX")]
        out: PathBuf,
        /// Replace existing key files (the old private key is lost).
        #[arg(long)]
        force: bool,
    },

    /// Pack a directory of built files into a package archive, computing artifact hashes.
    #[command(
        after_help = "The template is the manifest payload without \"artifacts\", which is \
        computed from SOURCE_DIR.\n\nExamples:\n  \
        guild pack build/scan --manifest scan.json --out scan.gkmodule\n  \
        guild pack build/scan --manifest scan.json --out scan.gkmodule --key keys/org.example.key"
    )]
    Pack {
        /// The directory holding the package's files.
        #[arg(value_name = "SOURCE_DIR")]
        source: PathBuf,
        /// The manifest template (JSON payload fields except \"artifacts\").
        #[arg(long, value_name = "TEMPLATE.json")]
        manifest: PathBuf,
        /// Where to write the archive.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// Sign with this private key while packing.
        #[arg(long, value_name = "KEY.pem")]
        key: Option<PathBuf>,
    },

    /// Add a signature to a package (in place unless --out is given).
    #[command(
        after_help = "Examples:\n  guild sign scan.gkmodule --key keys/org.example.key\n  \
        guild sign scan.gkmodule --key keys/org.example.key --out signed/scan.gkmodule"
    )]
    Sign {
        /// The package archive.
        package: PathBuf,
        /// The private key (PKCS#8 or SEC1 PEM).
        #[arg(long, value_name = "KEY.pem")]
        key: PathBuf,
        /// Write the signed package here instead of replacing PACKAGE.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },

    /// Authenticate a package against the store's trust store and check every artifact.
    #[command(
        after_help = "Nothing in the store changes. The artifacts are extracted into a \
        temporary directory (under $TMPDIR) that is removed afterwards.\n\nExamples:\n  \
        guild verify scan.gkmodule\n  guild --store /srv/guild --json verify scan.gkmodule"
    )]
    Verify {
        /// The package archive or directory.
        package: PathBuf,
    },

    /// Show a package's manifest and signatures without verifying anything.
    #[command(
        after_help = "The output is UNVERIFIED: no signature is checked and no trust \
        decision is made. Use `guild verify` for that.\n\nExamples:\n  \
        guild inspect scan.gkmodule\n  guild --json inspect scan.gkmodule"
    )]
    Inspect {
        /// The package archive or directory.
        package: PathBuf,
    },

    /// Manage the store's trust store: trusted publisher keys and revocations.
    #[command(subcommand)]
    Trust(TrustCommand),

    /// Authenticate, validate and install a package (enabled unless --disabled).
    #[command(after_help = "Examples:\n  guild install scan.gkmodule\n  \
        guild install scan-0.9.0.gkmodule --allow-downgrade\n  \
        guild install scan.gkmodule --disabled")]
    Install {
        /// The package archive or directory.
        package: PathBuf,
        /// Install without enabling it.
        #[arg(long)]
        disabled: bool,
        /// Allow installing a version older than the current one (`rollback` is the usual way
        /// back).
        #[arg(long)]
        allow_downgrade: bool,
    },

    /// Enable the current version of a package.
    #[command(after_help = "Example:\n  guild enable example.scan")]
    Enable {
        /// The package id.
        #[arg(value_name = "ID", value_parser = parse_package_id)]
        id: PackageId,
    },

    /// Disable the enabled version of a package (refused while enabled packages depend on it).
    #[command(after_help = "Example:\n  guild disable example.scan")]
    Disable {
        /// The package id.
        #[arg(value_name = "ID", value_parser = parse_package_id)]
        id: PackageId,
    },

    /// Remove a package version's files (refused while depended on or leased).
    #[command(
        after_help = "The version stays recorded, so it can never return with other \
        content.\n\nExamples:\n  guild remove example.scan\n  \
        guild remove example.scan --version 0.9.0"
    )]
    Remove {
        /// The package id.
        #[arg(value_name = "ID", value_parser = parse_package_id)]
        id: PackageId,
        /// The version to remove (default: the current one).
        #[arg(long = "version", value_name = "V", value_parser = parse_version)]
        version: Option<Version>,
    },

    /// Restore a package's previous version.
    #[command(after_help = "Example:\n  guild rollback example.scan")]
    Rollback {
        /// The package id.
        #[arg(value_name = "ID", value_parser = parse_package_id)]
        id: PackageId,
    },

    /// List recorded packages with their versions and states.
    #[command(after_help = "Examples:\n  guild list\n  guild --json list")]
    List,

    /// Show one package in detail, or (without ID) a summary of the store.
    #[command(after_help = "Examples:\n  guild status\n  guild status example.scan")]
    Status {
        /// The package id (omit it for the whole store).
        #[arg(value_name = "ID", value_parser = parse_package_id)]
        id: Option<PackageId>,
    },

    /// Open the store, which recovers interrupted operations and re-verifies enabled packages,
    /// and report what was done.
    #[command(
        after_help = "Every command that opens the store recovers it first; this one \
        only reports.\n\nExample:\n  guild recover"
    )]
    Recover,
}

#[derive(Debug, Subcommand)]
pub enum TrustCommand {
    /// Trust a publisher's public key.
    #[command(after_help = "Example:\n  guild trust add org.example keys/org.example.pub")]
    Add(TrustAdd),

    /// Revoke a key: nothing signed only by it authenticates any more, installed packages
    /// included (they are disabled at once).
    #[command(after_help = "Example:\n  guild trust revoke-key 3f2a...e1 --reason \"leaked\"")]
    RevokeKey {
        /// The key id (64 hex digits, as `guild trust list` shows).
        #[arg(value_name = "KEY_ID", value_parser = parse_digest)]
        key_id: Sha256Digest,
        /// Why, recorded in the trust store.
        #[arg(long, value_name = "TEXT", default_value = "revoked by the operator")]
        reason: String,
    },

    /// Revoke one package payload by its digest (as `guild verify` or `guild list` show).
    #[command(
        after_help = "Example:\n  guild trust revoke-package 9b1c...07 --reason \"bad build\""
    )]
    RevokePackage {
        /// The payload SHA-256 (64 hex digits).
        #[arg(value_name = "SHA256", value_parser = parse_digest)]
        sha256: Sha256Digest,
        /// Why, recorded in the trust store.
        #[arg(long, value_name = "TEXT", default_value = "revoked by the operator")]
        reason: String,
    },

    /// List trusted publishers and keys, and revocations.
    #[command(after_help = "Example:\n  guild trust list")]
    List,
}

#[derive(Debug, Args)]
pub struct TrustAdd {
    /// The publisher id the key signs for.
    #[arg(value_name = "PUBLISHER", value_parser = parse_publisher_id)]
    pub publisher: PublisherId,
    /// The public key (SPKI PEM, as `guild keygen` or `openssl pkey -pubout` write).
    #[arg(value_name = "PUBKEY.pem")]
    pub key: PathBuf,
}

fn parse_package_id(s: &str) -> Result<PackageId, String> {
    PackageId::new(s).map_err(|e| e.to_string())
}

fn parse_publisher_id(s: &str) -> Result<PublisherId, String> {
    PublisherId::new(s).map_err(|e| e.to_string())
}

fn parse_version(s: &str) -> Result<Version, String> {
    Version::parse(s).map_err(|e| format!("{s:?} is not a semantic version: {e}"))
}

fn parse_digest(s: &str) -> Result<Sha256Digest, String> {
    Sha256Digest::parse_hex(s).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn grammar_is_consistent() {
        Cli::command().debug_assert();
    }
}
