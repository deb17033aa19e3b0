//! The command-line grammar of `guild`: global options, subcommands, their help and examples.
//!
//! Values with a grammar of their own (package ids, versions, digests) are parsed here, so that a
//! malformed one is a usage error (exit 2) before anything touches a store.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use guild_domain::ids::{FleetId, ImplId, OpName, PackageId, PublisherId, Sha256Digest};
use guild_domain::operation::{DType, MemorySpace, TensorDesc};
use guild_domain::version::Version;
use guild_host::distribution::OciReference;

/// The exit codes, printed under `guild --help` and documented in docs/cli.md.
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  success
  1  unexpected failure (an I/O error outside the store, a bug)
  2  usage error (unknown option, malformed id, version or digest)
  3  rejected: a package, manifest template or key file is malformed, tampered,
     unauthenticated (untrusted publisher, revoked key or digest) or for another platform,
     or its library fails the registration check (registers other ids, crashes, hangs),
     or a build fails `guild check`
  4  refused by policy: dependencies, impl ids another package provides, leases, immutable
     versions, downgrades, trust rules, an existing key file
  5  store unusable: locked by another process, corrupt, unreadable, or an I/O failure in it
  6  not found: the package file, package id, version or key file does not exist
  7  unreachable: a registry could not be reached (refused, unresolved, timed out)
     after every attempt
  8  `guild sync --check` only: the store differs from the lock
  9  `guild check` only: every check of a category was skipped (see --allow-skipped)

Store: --store DIR, else $GUILD_STORE, else $XDG_DATA_HOME/guild, else ~/.local/share/guild.
No option or variable makes a store load unsigned or untrusted code, or skips verification;
`guild check` runs the build it is given, in child processes, and touches no store.";

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

    /// Authenticate a package against the store's trust store and check every artifact, or
    /// (--all) check every installed package of the store.
    #[command(
        after_help = "With PACKAGE nothing in the store changes: the artifacts are extracted \
        into a temporary directory (under $TMPDIR) that is removed afterwards.\n\nWith --all \
        every installed version (enabled, disabled and superseded) has its signatures checked \
        against the trust store and every file hashed against its signed manifest, on one \
        thread per core (--jobs N to choose). An enabled version that fails is disabled \
        (tainted when a file or signature changed), with what depends on it; a disabled \
        or superseded one is only reported. The exit code is 1 when anything failed.\n\n\
        Examples:\n  guild verify scan.gkmodule\n  guild --store /srv/guild --json verify \
        scan.gkmodule\n  guild verify --all --jobs 4"
    )]
    Verify {
        /// The package archive or directory.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        package: Option<PathBuf>,
        /// Check every installed package of the store instead.
        #[arg(long)]
        all: bool,
        /// Worker threads for --all (default: one per core).
        #[arg(long, value_name = "N", requires = "all", value_parser = clap::value_parser!(u16).range(1..))]
        jobs: Option<u16>,
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

    /// Lift the crash quarantine of builds whose init killed the process loading them.
    #[command(subcommand)]
    Quarantine(QuarantineCommand),

    /// Manage the store's trust store: trusted publisher keys and revocations.
    #[command(subcommand)]
    Trust(TrustCommand),

    /// Fleet roots and policies: write, sign, verify, push, pull; join a fleet and follow it.
    #[command(subcommand)]
    Fleet(FleetCommand),

    /// Authenticate, validate and install a package (enabled unless --disabled).
    #[command(after_help = "Examples:\n  guild install scan.gkmodule\n  \
        guild install scan-0.9.0.gkmodule --allow-downgrade\n  \
        guild install scan.gkmodule --disabled")]
    Install {
        /// The package archive or directory, or an oci://HOST/REPOSITORY(:TAG|@sha256:DIGEST)
        /// reference to pull it from.
        package: PathBuf,
        /// Install without enabling it.
        #[arg(long)]
        disabled: bool,
        /// Allow installing a version older than the current one (`rollback` is the usual way
        /// back).
        #[arg(long)]
        allow_downgrade: bool,
    },

    /// Upload a package to an OCI registry as an artifact; prints the manifest digest.
    #[command(
        after_help = "REFERENCE is oci://HOST[:PORT]/REPOSITORY:TAG (or @sha256:DIGEST, \
        which must then be the manifest's digest). HTTPS unless the host is loopback or listed in \
        GUILD_INSECURE_REGISTRIES; credentials from docker/podman config.json.\n\nExamples:\n  \
        guild push scan.gkmodule oci://registry.example.com/guild/scan:1.0.0\n  \
        guild push scan.gkmodule oci://localhost:5000/scan:1.0.0 --annotation team=inference"
    )]
    Push {
        /// The package archive.
        package: PathBuf,
        /// Where to push it.
        #[arg(value_name = "REFERENCE", value_parser = crate::distribute::parse_reference)]
        reference: OciReference,
        /// A manifest annotation (repeatable).
        #[arg(long = "annotation", value_name = "KEY=VALUE", value_parser = crate::distribute::parse_annotation)]
        annotations: Vec<(String, String)>,
    },

    /// Download a package from an OCI registry (its layer digest is checked; the package is
    /// verified when it is installed), or every package of a lock into a mirror directory.
    #[command(after_help = "Examples:\n  \
        guild pull oci://registry.example.com/guild/scan:1.0.0 --out scan.gkmodule\n  \
        guild pull --lock guild.lock --to mirror/   # for `guild sync --from mirror/`")]
    Pull {
        /// The artifact to download.
        #[arg(value_name = "REFERENCE", value_parser = crate::distribute::parse_reference,
              required_unless_present = "lock", conflicts_with = "lock", requires = "out")]
        reference: Option<OciReference>,
        /// Where to write the package.
        #[arg(long, value_name = "FILE", conflicts_with = "lock")]
        out: Option<PathBuf>,
        /// Download every package this lock names (by manifest digest).
        #[arg(long, value_name = "LOCK", requires = "to")]
        lock: Option<PathBuf>,
        /// The mirror directory for --lock.
        #[arg(long, value_name = "DIR", requires = "lock")]
        to: Option<PathBuf>,
    },

    /// Write a lock file: every enabled package with its version, payload digest, publisher,
    /// signing key and, where known, the registry reference it came from.
    #[command(
        after_help = "Examples:\n  guild lock\n  guild lock --out fleet/guild.lock\n  \
        guild lock --out -   # to standard output"
    )]
    Lock {
        /// The lock file to write; `-` writes it to standard output.
        #[arg(long, value_name = "FILE", default_value = "guild.lock")]
        out: PathBuf,
        /// Write the lock even when no package is enabled (a sync of it disables everything,
        /// and needs --allow-shrink).
        #[arg(long)]
        allow_empty: bool,
    },

    /// Make the store's enabled packages exactly those of a lock: fetch, install, enable and
    /// disable; refuse any package whose payload digest or signing key differs from the lock,
    /// and a lock that would disable enabled packages unless --allow-shrink.
    #[command(after_help = "Examples:\n  guild sync guild.lock\n  \
        guild sync guild.lock --from mirror/   # no network: archives from `guild pull --lock`\n  \
        guild sync guild.lock --dry-run        # print the plan, change nothing\n  \
        guild sync guild.lock --check          # exit 8 when the store differs, for monitoring")]
    Sync {
        /// The lock file.
        #[arg(value_name = "LOCK")]
        lock: PathBuf,
        /// Take the archives from this directory instead of the registry.
        #[arg(long, value_name = "DIR")]
        from: Option<PathBuf>,
        /// Allow the sync to disable enabled packages the lock does not name, or to follow an
        /// empty lock.
        #[arg(long)]
        allow_shrink: bool,
        /// Print what the sync would do and change nothing (nothing is fetched).
        #[arg(long, conflicts_with = "check")]
        dry_run: bool,
        /// Change nothing; exit 0 when the store matches the lock and 8 when it differs.
        #[arg(long)]
        check: bool,
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

    /// Forget removed versions of a package, so that list and status no longer show them.
    #[command(
        after_help = "Only removed versions can be purged (remove a version first). A removed \
        version's record is what keeps that version from ever returning with other content; \
        purging gives that up, so afterwards the version may be installed again with any \
        content its publisher signs.\n\nExamples:\n  guild purge example.scan\n  \
        guild purge example.scan --version 0.9.0"
    )]
    Purge {
        /// The package id.
        #[arg(value_name = "ID", value_parser = parse_package_id)]
        id: PackageId,
        /// The removed version to purge (default: every removed version of ID).
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

    /// Show which implementation the enabled packages would run for an operation, and why the
    /// others would not.
    #[command(
        after_help = "The enabled packages are loaded (their native code runs, as in a \
        runner) and the query is resolved; nothing is executed. A tensor is \
        DTYPE:DIMS[@STRIDES], innermost axis first: f32:8x2 is 2 rows of 8, and \
        f32:8x2@0,10 puts the rows 10 elements apart.\n\nExamples:\n  \
        guild resolve example.sequence.inclusive_scan --input f32:8x2 --output f32:8x2\n  \
        guild resolve example.sequence.inclusive_scan --input i64:4 --output i64:4 \
        --exact example.scan.inclusive.cpu\n  \
        guild --json resolve example.sequence.scan_then_total --input f64:5x3 --output f64:1x3"
    )]
    Resolve {
        /// The namespaced operation.
        #[arg(value_name = "OPERATION", value_parser = parse_op_name)]
        op: OpName,
        #[arg(
            long = "input",
            value_name = "TENSOR",
            value_parser = parse_tensor,
            help = "An input tensor, DTYPE:DIMS[@STRIDES] (repeat for each input, in order)"
        )]
        inputs: Vec<TensorDesc>,
        #[arg(
            long = "output",
            value_name = "TENSOR",
            value_parser = parse_tensor,
            help = "An output tensor, DTYPE:DIMS[@STRIDES] (repeat for each output, in order)"
        )]
        outputs: Vec<TensorDesc>,
        /// Accept only this implementation (no fallback).
        #[arg(long, value_name = "IMPL_ID", value_parser = parse_impl_id)]
        exact: Option<ImplId>,
        /// Bound on host scratch, in bytes.
        #[arg(long, value_name = "BYTES")]
        ram_budget: Option<u64>,
        /// The operation's parameter record: TYPE:VALUE,... (u8 i8 u16 i16 u32 i32 u64 i64 f32
        /// f64, packed in order with C struct alignment) or @FILE (raw bytes).
        #[arg(long, value_name = "RECORD", value_parser = crate::params::parse)]
        params: Option<crate::params::ParamRecord>,
    },

    /// Check this machine and the store: platform, store health, trust store, GPUs and the SDK.
    #[command(
        after_help = "Each check prints ok, warn or fail with what to do about it. The \
        exit code is 0 unless a check failed (5 when the store is unusable).\n\nExamples:\n  \
        guild doctor\n  guild doctor --deep\n  guild --json doctor"
    )]
    Doctor {
        /// Also check every installed package in full, as `guild verify --all` does, but only
        /// report (the doctor changes nothing).
        #[arg(long)]
        deep: bool,
        /// Worker threads for --deep (default: one per core).
        #[arg(long, value_name = "N", requires = "deep", value_parser = clap::value_parser!(u16).range(1..))]
        jobs: Option<u16>,
    },

    /// Internal: check the library of a verified package tree in this process and print one
    /// JSON result line. `guild install`, `enable` and `rollback` run it as a child process.
    #[command(name = "__check-library", hide = true)]
    CheckLibrary {
        /// The verified tree (a staging or installed package directory).
        #[arg(value_name = "DIR")]
        dir: PathBuf,
        /// The payload digest its `.gkmetadata` must have.
        #[arg(long = "payload-sha256", value_name = "SHA256", value_parser = parse_digest)]
        payload: Sha256Digest,
        /// A signature the parent holds beside the tree's (KEY_ID:SIGNATURE, hex); repeated.
        #[arg(long = "signature", value_name = "KEY_ID:SIGNATURE", value_parser = guild_host::registration::parse_signature_arg)]
        signatures: Vec<guild_domain::manifest::SignatureEntry>,
        /// The inherited descriptor of the result channel (its nonce, then the trust file, come
        /// on stdin).
        #[arg(long, value_name = "FD")]
        results_fd: i32,
    },

    /// Check a build against the plugin contract before signing it (runs its code).
    ///
    /// The build is loaded in a child process and held to every check: entry point, init,
    /// registration, and each GOP1 operation's callbacks on generated tensors.
    #[command(
        after_help = "This RUNS THE CODE at PATH, unverified: it is for your own build. \
        Nothing is installed and no store is touched. PATH is a package archive, an unpacked \
        package, or a directory of built files with --manifest (the template `guild pack` \
        takes). A crash, abort or hang in the plugin becomes a failed check; the exit code is 3 \
        when any check failed, 9 when every check of a category (validate, query_scratch or \
        execute) was skipped, as when an operation needs a parameter record that --params did \
        not give (--allow-skipped accepts that).\n\nExamples:\n  \
        guild check build/scan --manifest scan.json\n  \
        guild check axpy.gkmodule --params u32:8,f32:2.0\n  \
        guild check ops.gkmodule --params example.vector.axpy=u32:8,f32:2.0\n  \
        guild check scan.gkmodule --timeout 2\n  \
        guild --json check scan.gkmodule"
    )]
    Check {
        /// The package archive, unpacked package, or directory of built files.
        #[arg(value_name = "PATH")]
        path: PathBuf,
        /// The manifest template, when PATH is a directory of built files.
        #[arg(long, value_name = "TEMPLATE.json")]
        manifest: Option<PathBuf>,
        /// Time limit of one call into the plugin, in seconds.
        #[arg(long, value_name = "SECONDS", default_value_t = 10.0, value_parser = parse_seconds)]
        timeout: f64,
        /// The parameter record the generated queries and executions carry: TYPE:VALUE,...
        /// (u8 i8 u16 i16 u32 i32 u64 i64 f32 f64, packed in order with C struct alignment) or
        /// @FILE (raw bytes); OP=RECORD for the operation OP only (repeatable). Without one for
        /// an operation, the manifest's check_params record of it is used.
        #[arg(long, value_name = "[OP=]RECORD", value_parser = crate::params::parse_for_check)]
        params: Vec<crate::params::CheckParams>,
        /// Exit 0 even when every check of a category was skipped (the build was not executed,
        /// say).
        #[arg(long)]
        allow_skipped: bool,
    },

    /// Internal: the child process of `guild check`, which loads a staged tree and writes one
    /// JSON line to its result channel as each check starts and ends.
    #[command(name = "__conformance", hide = true)]
    Conformance {
        /// The staged package tree.
        #[arg(value_name = "DIR")]
        dir: PathBuf,
        /// Run only the checks numbered above this one (after a crash or hang).
        #[arg(long, value_name = "N")]
        resume_after: Option<u64>,
        /// An operation to leave alone: a call into it crashed or hung in an earlier child
        /// (repeatable).
        #[arg(long = "skip-operation", value_name = "OPERATION")]
        hung: Vec<String>,
        /// The parameter record of every query, in hexadecimal.
        #[arg(long, value_name = "HEX")]
        params_hex: Option<String>,
        /// The parameter record of one operation's queries, OP=HEX (repeatable).
        #[arg(long, value_name = "OP=HEX")]
        operation_params_hex: Vec<String>,
        /// The inherited descriptor of the result channel (its nonce comes on stdin).
        #[arg(long, value_name = "FD")]
        results_fd: i32,
    },

    /// Print a completion script for a shell.
    #[command(after_help = "Examples:\n  \
        guild completions bash > ~/.local/share/bash-completion/completions/guild\n  \
        guild completions zsh > ~/.zfunc/_guild\n  \
        guild completions fish > ~/.config/fish/completions/guild.fish")]
    Completions {
        /// The shell.
        #[arg(value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Subcommand)]
pub enum QuarantineCommand {
    /// Lift the crash quarantine of every build of a package, so the next host loads it again.
    #[command(
        after_help = "A build is quarantined when a process died while running its init; \
        `guild list` and `guild status` show it. Installing a new version lifts it too.\n\n\
        Example:\n  guild quarantine clear example.scan"
    )]
    Clear {
        /// The package id.
        #[arg(value_name = "ID", value_parser = parse_package_id)]
        id: PackageId,
    },
}

#[derive(Debug, Subcommand)]
pub enum FleetCommand {
    /// Fleet roots: the keys that sign for the fleet, and how many of them must.
    #[command(subcommand)]
    Root(FleetRootCommand),

    /// Fleet policies: trusted publishers and the desired packages.
    #[command(subcommand)]
    Policy(FleetPolicyCommand),

    /// Add one signature to a fleet root or policy, in place (atomically), and say how many
    /// valid signatures of which keys it now carries against the threshold.
    #[command(
        after_help = "Each holder signs in turn, with their own key, so no machine ever         holds the threshold of keys. A root is counted against its own keys; a policy against         the root given with --root (without it, the signature is added and not counted).         Signing does not change the document's digest. With --previous LAST.json a policy that         is not the same fleet's at a higher version, or that drops a revocation of LAST.json, is         refused (exit 4, naming each one dropped) and the file is left as it was.

Examples:
          guild fleet sign root.json --key keys/alice.key
          guild fleet sign policy.json --key keys/bob.key --root root.json --previous policy-41.json"
    )]
    Sign {
        /// The root or policy file.
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// The holder's private key (PKCS#8 or SEC1 PEM).
        #[arg(long, value_name = "KEY.pem")]
        key: PathBuf,
        /// The root whose keys count a policy's signatures.
        #[arg(long, value_name = "ROOT")]
        root: Option<PathBuf>,
        /// The last policy published: a policy is signed only if it is the same fleet's at a
        /// higher version and keeps every revocation of this one.
        #[arg(long, value_name = "LAST.json")]
        previous: Option<PathBuf>,
    },

    /// Check that a fleet root (against its own keys) or policy (against --root, and for
    /// consistency) carries a threshold of valid signatures.
    #[command(
        after_help = "Exit 0 when the threshold is met, 3 when it is not (the answer         names the keys whose signatures count and why the others do not). Expiry is reported,         not judged: a store judges it when it takes the document. With --previous LAST.json a         policy that is not the same fleet's at a higher version, or that drops a revocation of         LAST.json, is refused (exit 4, naming each one dropped).

Examples:
          guild fleet verify root.json
  guild fleet verify policy.json --root root.json"
    )]
    Verify {
        /// The root or policy file.
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// The root a policy is verified under (which is first verified against its own keys).
        #[arg(long, value_name = "ROOT")]
        root: Option<PathBuf>,
        /// The last policy published: a policy verifies only if it is the same fleet's at a
        /// higher version and keeps every revocation of this one.
        #[arg(long, value_name = "LAST.json")]
        previous: Option<PathBuf>,
    },

    /// Push a fleet root or policy to an OCI registry as an artifact of its own media type.
    #[command(
        after_help = "The file is read strictly (as a root or a policy) before it is         pushed; its signatures are not checked.

Examples:
          guild fleet push root.json oci://registry.example.com/fleet/root:prod
          guild fleet push policy.json oci://registry.example.com/fleet/policy:prod"
    )]
    Push {
        /// The root or policy file.
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// Where to push it (a tag, or the digest its manifest has).
        #[arg(value_name = "REFERENCE", value_parser = crate::distribute::parse_reference)]
        reference: OciReference,
    },

    /// Join this store to a fleet: pin its root (a file, a mirror directory's root.json, or an
    /// oci:// reference) in the store, so that it follows that fleet's signed policies.
    #[command(
        after_help = "The root must carry a threshold of its own keys' signatures. Give the \
        digest handed over out of band with --digest to pin exactly that root. Joining again with \
        the same root changes nothing; a store that follows another root or fleet refuses it. \
        From then on the fleet's policy owns the store's trust: `guild trust add` and \
        `revoke-key` are refused.

Examples:
  guild fleet join root.json --digest 3f1c…
  guild fleet join oci://registry.example.com/fleet/root:prod"
    )]
    Join {
        /// The root: a file, a mirror directory holding root.json, or an oci:// reference.
        #[arg(value_name = "ROOT")]
        root: PathBuf,
        /// The SHA-256 the root must have (of its signed part, as `guild fleet verify` prints
        /// it), handed over out of band.
        #[arg(long, value_name = "SHA256", value_parser = parse_digest)]
        digest: Option<Sha256Digest>,
        /// Take the root even if it has expired (logged as an operator's override).
        #[arg(long)]
        allow_expired: bool,
    },

    /// Fetch the fleet's policy (and newer roots), verify it under the pinned root, and apply
    /// it to the store in one transaction: its trust, its record, and its desired packages.
    #[command(
        after_help = "REF is a file, a mirror directory (policy.json, root*.json and the \
        packages as `guild pull --lock --to` names them), or an oci:// reference. A policy older \
        than the one applied, another document under the same version, one signed by too few \
        root keys, an expired one, or a package that differs from its entry is refused and \
        changes nothing. With --follow it polls every --interval seconds (±20%), backing off to \
        60 s while fetches fail, and prints each outcome; a poll that finds the tag unchanged is \
        one manifest request. SIGTERM or SIGINT stops it cleanly, after any sync under way: it \
        says so and exits 0. A policy that leaves out a revocation the store holds gets a \
        REVOCATION DROPPED warning; the store keeps the revocation.

Examples:
  guild fleet sync --policy oci://registry.example.com/fleet/policy:prod
  guild fleet sync --policy mirror/          # air gap: documents and packages from a directory
  guild fleet sync --policy policy.json --root root2.json
  guild fleet sync --policy oci://registry.example.com/fleet/policy:prod --follow --interval 300"
    )]
    Sync {
        /// The policy: a file, a mirror directory holding policy.json, or an oci:// reference.
        #[arg(long, value_name = "REF")]
        policy: PathBuf,
        /// A newer root (repeatable; a mirror directory gives every root*.json in it), taken
        /// only as a verified chain from the pinned root.
        #[arg(long = "root", value_name = "REF")]
        roots: Vec<PathBuf>,
        /// Apply the policy (and root) even if expired: an operator's override for air gaps,
        /// logged on every use.
        #[arg(long)]
        allow_expired: bool,
        /// Keep the store converged: poll and apply until stopped.
        #[arg(long)]
        follow: bool,
        /// Seconds between polls with --follow (jittered by ±20%).
        #[arg(long, value_name = "S", requires = "follow", default_value_t = 60,
              value_parser = clap::value_parser!(u64).range(1..))]
        interval: u64,
        /// Stop after this many polls (for tests).
        #[arg(long, hide = true, requires = "follow")]
        rounds: Option<u64>,
    },

    /// Download a fleet root or policy from an OCI registry.
    #[command(
        after_help = "Nothing is verified on pull beyond the size limit (4 MiB), the         layer's digest and the document's strict syntax: run `guild fleet verify` on the file         (with the root you trust) before relying on it.

Examples:
          guild fleet pull oci://registry.example.com/fleet/policy:prod --out policy.json"
    )]
    Pull {
        /// The artifact to download.
        #[arg(value_name = "REFERENCE", value_parser = crate::distribute::parse_reference)]
        reference: OciReference,
        /// Where to write the document (atomically).
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub enum FleetRootCommand {
    /// Write a new, unsigned fleet root: its keys and threshold.
    #[command(
        after_help = "--expires is a duration from now (30d, 12h, 90m, 3600s, 2w) or a         UNIX time in seconds. The root is written unsigned; each key holder then runs `guild         fleet sign`.

Examples:
          guild fleet root new --fleet example.prod --threshold 2 --key a.pub --key b.pub         --key c.pub --expires 365d --out root.json"
    )]
    New(FleetRootNew),
}

#[derive(Debug, Args)]
pub struct FleetRootNew {
    /// The fleet's id (never changes across rotations).
    #[arg(long, value_name = "ID", value_parser = parse_fleet_id)]
    pub fleet: FleetId,
    /// How many distinct keys must sign a root or policy.
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u16).range(1..))]
    pub threshold: u16,
    /// A public key that may sign (SPKI PEM; repeat for each key).
    #[arg(long = "key", value_name = "PUB.pem", required = true, num_args = 1..)]
    pub keys: Vec<PathBuf>,
    /// When the root expires: a duration from now or UNIX seconds.
    #[arg(long, value_name = "DURATION_OR_UNIX", value_parser = parse_expiry)]
    pub expires: u64,
    /// The root's version: 1 for the first root, one more for each rotation.
    #[arg(long = "version", value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub version: u64,
    /// The file to write (`-`: standard output).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
}

#[derive(Debug, Subcommand)]
pub enum FleetPolicyCommand {
    /// Write a new, unsigned fleet policy whose desired set is a lock's packages, or what a
    /// requirements file resolves to in a registry.
    #[command(
        after_help = "The desired set comes from exactly one of --from-lock and --requirements.\n\n\
        --from-lock LOCK: each package of the lock must have its registry source (a lock \
        written by `guild lock` from packages installed from oci://…), and its publisher and \
        signing key must be among the --publisher keys (within the publisher's --scope \
        prefixes, if any).\n\n\
        --requirements FILE: a JSON file {\"requirements\": [{\"id\": ID, \"version\": \
        REQ, \"repository\": \"oci://HOST/REPO\"}]}. Each is resolved to the highest tag of \
        its repository that names a version (1.2.0 or v1.2.0) matching REQ (^1.2, ~1.2.3, \
        >=1.0, <2.0, =1.2.3; a pre-release only when REQ names one), whose package is then \
        pulled and verified against the --publisher keys; its entry pins the manifest digest.\n\n\
        --entry-keys says which keys each entry allows to sign its package: `lock` (the \
        lock's one key; --from-lock's default), the keys whose signatures verified \
        (--requirements' default), or `publisher` (every unrevoked key given for the \
        entry's publisher: for a key rotation, give the old and the new key).\n\n\
        --expires is a duration from now (30d, 12h) or a UNIX time in seconds.\n\n\
        Examples:\n  \
        guild fleet policy new --fleet example.prod --version 1 --root-version 1 \
        --expires 30d --from-lock guild.lock --publisher org.example=keys/org.example.pub \
        --scope org.example=example --out policy.json\n  \
        guild fleet policy new --fleet example.prod --version 2 --root-version 1 \
        --expires 30d --requirements fleet-requirements.json \
        --publisher org.example=old.pub,new.pub --entry-keys publisher --out policy.json"
    )]
    New(FleetPolicyNew),
}

#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("desired").required(true).multiple(false))]
pub struct FleetPolicyNew {
    /// The fleet's id; must be the root's.
    #[arg(long, value_name = "ID", value_parser = parse_fleet_id)]
    pub fleet: FleetId,
    /// The policy's version: higher than every policy before it.
    #[arg(long = "version", value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub version: u64,
    /// When the policy expires: a duration from now or UNIX seconds.
    #[arg(long, value_name = "DURATION_OR_UNIX", value_parser = parse_expiry)]
    pub expires: u64,
    /// The version of the root whose keys sign it.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub root_version: u64,
    /// The lock whose packages are the desired set.
    #[arg(long, value_name = "LOCKFILE", group = "desired")]
    pub from_lock: Option<PathBuf>,
    /// A requirements file (JSON: package id, version requirement, repository) resolved
    /// against its registries' tags to make the desired set.
    #[arg(long, value_name = "FILE", group = "desired")]
    pub requirements: Option<PathBuf>,
    /// Which keys each desired package allows: `lock` (the lock's key; the default with
    /// --from-lock) or `publisher` (every unrevoked key given for its publisher). With
    /// --requirements the default is the keys whose signatures verified.
    #[arg(long, value_name = "lock|publisher", value_enum)]
    pub entry_keys: Option<EntryKeys>,
    /// A trusted publisher and its keys, ID=KEY.pem[,KEY2.pem] (repeat for each publisher).
    #[arg(long = "publisher", value_name = "ID=KEY.pem[,KEY2.pem]", required = true, value_parser = parse_publisher_keys)]
    pub publishers: Vec<(PublisherId, Vec<PathBuf>)>,
    /// Limit a publisher to package ids under a prefix, ID=PREFIX (repeatable).
    #[arg(long = "scope", value_name = "ID=PREFIX", value_parser = parse_scope)]
    pub scopes: Vec<(PublisherId, PackageId)>,
    /// Revoke a key, by its id (hex SHA-256 of its SPKI, as `guild trust list` shows it),
    /// optionally with a reason: KEY_ID[=REASON] (repeatable).
    #[arg(long = "revoke-key", value_name = "KEY_ID[=REASON]", value_parser = parse_revocation)]
    pub revoke_keys: Vec<(Sha256Digest, Option<String>)>,
    /// Revoke a build, by its payload digest: SHA256[=REASON] (repeatable).
    #[arg(long = "revoke-package", value_name = "SHA256[=REASON]", value_parser = parse_revocation)]
    pub revoke_packages: Vec<(Sha256Digest, Option<String>)>,
    /// The fleet's policy before this one: its revocations are carried into this one (a
    /// machine that skips a policy must still learn what it revoked), and this version must
    /// be higher than its.
    #[arg(long, value_name = "POLICY.json")]
    pub previous: Option<PathBuf>,
    /// The file to write (`-`: standard output).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
}

/// `--entry-keys`: which keys a desired package's entry allows to sign it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EntryKeys {
    /// The lock's key for the package (with --from-lock).
    Lock,
    /// Every key given for the package's publisher that is not revoked.
    Publisher,
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

    /// Rebuild the store's trust file when it is missing, an older copy, another store's,
    /// changed by hand or unreadable. Every revocation the store recorded is kept.
    #[command(
        after_help = "The store refuses to open while its trust file is not the one its registry \
        recorded (exit code 5, naming the file). This writes a new trust file bound to the store, \
        with every revocation the registry recorded and every revocation of the file found. It \
        trusts no key unless --keep-keys keeps the keys of the file found (revoked keys \
        excepted); add the others again with `guild trust add`.\n\nExamples:\n  \
        guild trust reset                # trust nothing; add keys again\n  \
        guild trust reset --keep-keys    # keep the keys of the trust file found"
    )]
    Reset {
        /// Keep the keys trusted by the trust file found (it must be readable).
        #[arg(long)]
        keep_keys: bool,
    },
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

fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x > 0.0 && x <= 3600.0 => Ok(x),
        _ => Err(format!(
            "{s:?} is not a number of seconds above 0 (at most 3600)"
        )),
    }
}

fn parse_package_id(s: &str) -> Result<PackageId, String> {
    PackageId::new(s).map_err(|e| e.to_string())
}

fn parse_fleet_id(s: &str) -> Result<FleetId, String> {
    FleetId::new(s).map_err(|e| e.to_string())
}

/// `30d`, `12h`, `90m`, `3600s`, `2w`: that long from now; a bare number: UNIX seconds, which
/// must be in the future.
fn parse_expiry(s: &str) -> Result<u64, String> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    expiry(s, now)
}

/// `--expires`: `30d`, `12h`, `90m`, `3600s` or `2w` from `now`, or a bare number of UNIX
/// seconds after `now`.
fn expiry(text: &str, now: u64) -> Result<u64, String> {
    let text = text.trim();
    let units = [
        ('s', 1u64),
        ('m', 60),
        ('h', 3600),
        ('d', 86_400),
        ('w', 604_800),
    ];
    if let Some((unit, scale)) = units.iter().find(|(u, _)| text.ends_with(*u)) {
        let n: u64 = text[..text.len() - 1]
            .parse()
            .map_err(|_| format!("{text:?} is not a whole number of {unit} units"))?;
        if n == 0 {
            return Err("an expiry must be in the future".into());
        }
        return n
            .checked_mul(*scale)
            .and_then(|d| d.checked_add(now))
            .ok_or_else(|| format!("{text} is too far in the future"));
    }
    let at: u64 = text.parse().map_err(|_| {
        format!("{text:?} is neither a duration (30d, 12h, 90m, 3600s, 2w) nor UNIX seconds")
    })?;
    if at <= now {
        return Err(format!(
            "{at} (UNIX seconds) is not in the future; give a duration such as 365d instead"
        ));
    }
    Ok(at)
}

/// `ID=KEY.pem[,KEY2.pem]`.
fn parse_publisher_keys(s: &str) -> Result<(PublisherId, Vec<PathBuf>), String> {
    let (id, keys) = s.split_once('=').ok_or("expected ID=KEY.pem[,KEY2.pem]")?;
    let keys: Vec<PathBuf> = keys
        .split(',')
        .filter(|k| !k.is_empty())
        .map(PathBuf::from)
        .collect();
    if keys.is_empty() {
        return Err(format!("publisher {id} is given no key file"));
    }
    Ok((parse_publisher_id(id)?, keys))
}

/// `ID=PREFIX`.
fn parse_scope(s: &str) -> Result<(PublisherId, PackageId), String> {
    let (id, prefix) = s.split_once('=').ok_or("expected ID=PREFIX")?;
    Ok((parse_publisher_id(id)?, parse_package_id(prefix)?))
}

fn parse_revocation(s: &str) -> Result<(Sha256Digest, Option<String>), String> {
    let (hex, reason) = match s.split_once('=') {
        Some((hex, reason)) => (hex, Some(reason.to_owned())),
        None => (s, None),
    };
    let digest = Sha256Digest::parse_hex(hex.strip_prefix("sha256:").unwrap_or(hex))
        .map_err(|e| format!("{hex:?} is not a SHA-256 in hex: {e}"))?;
    Ok((digest, reason))
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

fn parse_op_name(s: &str) -> Result<OpName, String> {
    OpName::new(s).map_err(|e| e.to_string())
}

fn parse_impl_id(s: &str) -> Result<ImplId, String> {
    ImplId::new(s).map_err(|e| e.to_string())
}

/// `DTYPE:DIMS[@STRIDES]`, innermost axis first: `f32:8x2`, `i64:4x3x2@0,6,24`.
pub fn parse_tensor(s: &str) -> Result<TensorDesc, String> {
    let (dtype, rest) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?} is not DTYPE:DIMS[@STRIDES] (for example f32:8x2)"))?;
    let dtype = (0..=u32::from(u8::MAX))
        .map(DType::from_raw)
        .find(|d| d.name() == Some(dtype))
        .ok_or_else(|| format!("{dtype:?} is not a dtype this host knows (f32, f64, i32, ...)"))?;
    let (dims, strides) = match rest.split_once('@') {
        Some((d, st)) => (d, Some(st)),
        None => (rest, None),
    };
    let number = |n: &str| {
        n.parse::<u64>()
            .map_err(|_| format!("{n:?} in {s:?} is not a whole number"))
    };
    let dims: Vec<u64> = dims.split('x').map(number).collect::<Result<_, _>>()?;
    let strides: Vec<u64> = match strides {
        Some(st) => st.split(',').map(number).collect::<Result<_, _>>()?,
        None => Vec::new(),
    };
    if strides.len() > dims.len() {
        return Err(format!("{s:?} has more strides than axes"));
    }
    let desc = TensorDesc::new(dtype, &dims, MemorySpace::Host).with_strides(&strides);
    desc.check().map_err(|e| format!("{s:?}: {e}"))?;
    Ok(desc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn grammar_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn tensors_parse_innermost_first_with_optional_strides() {
        let t = parse_tensor("f32:8x2@0,10").unwrap();
        assert_eq!(
            (t.dtype, t.shape(), &t.strides[..2]),
            (DType::F32, &[8, 2][..], &[0, 10][..])
        );
        assert_eq!(parse_tensor("i64:4").unwrap().shape(), &[4]);
        for (bad, says) in [
            ("f32", "is not DTYPE:DIMS"),
            ("float:4", "not a dtype"),
            ("f32:4xz", "not a whole number"),
            ("f32:4@0,1", "more strides than axes"),
            ("f32:0", "extent"),
            ("f32:4x2@1", "stride"),
        ] {
            let err = parse_tensor(bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn expiries_are_durations_from_now_or_future_unix_seconds() {
        assert_eq!(expiry("30d", 1000), Ok(1000 + 30 * 86_400));
        assert_eq!(expiry("12h", 0), Ok(12 * 3600));
        assert_eq!(expiry("2w", 5), Ok(5 + 2 * 604_800));
        assert_eq!(expiry("2000", 1000), Ok(2000));
        assert!(expiry("1000", 1000).is_err());
        assert!(expiry("0d", 1000).is_err());
        assert!(expiry("soon", 1000).is_err());
        assert!(expiry("99999999999999999999w", 0).is_err());
    }
}
