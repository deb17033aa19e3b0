//! How a failed command is classified: its documented exit code, its cause chain and a hint.
//!
//! Commands return `anyhow::Error`s that wrap the library's typed errors. The classification
//! walks the chain from the outside in and lets the first typed error it recognises decide, so
//! that a context message added on top never hides what actually failed.

use std::io;
use std::path::Path;
use std::process::ExitCode;

use guild_domain::graph::{DisableRefusal, GraphProblem, RemoveRefusal, RollbackRefusal};
use guild_domain::store_state::StoreStateError;
use guild_domain::trust::{AuthError, SignatureOutcome, TrustChangeError, TrustFileMismatch};
use guild_host::packaging::{KeyError, KeyFileError, PackError, PublishError};
use guild_host::registration::LibraryCheckFailure;
use guild_host::{ErrorCategory, HostError};
use guild_ports::source::{SourceError, SourceErrorKind};
use guild_ports::store::{StoreError, StoreErrorKind};

/// The documented exit codes (see docs/cli.md and `guild --help`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Failure = 1,
    Usage = 2,
    Rejected = 3,
    Refused = 4,
    Store = 5,
    NotFound = 6,
    /// A registry could not be reached (connection refused, name not resolved, connection
    /// timed out) after every attempt: the network, not the package or the store.
    Unreachable = 7,
    /// `guild sync --check`: the store differs from the lock. Not an error: the answer.
    Differs = 8,
    /// `guild check`: every check of a category was skipped, so the build was not checked
    /// (never executed, say). Not a failure of the build: a failure to check it.
    Unchecked = 9,
}

impl Exit {
    /// The category name used in `--json` errors.
    pub fn category(self) -> &'static str {
        match self {
            Exit::Failure => "failure",
            Exit::Usage => "usage",
            Exit::Rejected => "rejected",
            Exit::Refused => "refused",
            Exit::Store => "store",
            Exit::NotFound => "not_found",
            Exit::Unreachable => "unreachable",
            Exit::Differs => "differs",
            Exit::Unchecked => "unchecked",
        }
    }

    pub fn code(self) -> u8 {
        self as u8
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> Self {
        ExitCode::from(exit.code())
    }
}

impl From<ErrorCategory> for Exit {
    fn from(category: ErrorCategory) -> Self {
        match category {
            ErrorCategory::PackageRejected => Exit::Rejected,
            ErrorCategory::Refused => Exit::Refused,
            ErrorCategory::NotFound => Exit::NotFound,
            ErrorCategory::Store => Exit::Store,
        }
    }
}

/// An error the CLI itself raises, with the exit code it deserves.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct CliError {
    pub exit: Exit,
    pub message: String,
    pub hint: Option<String>,
    /// Items the failure is about, each with why (a failed resolve's candidates), printed one a
    /// line and given in JSON as `candidates`.
    pub candidates: Vec<(String, String)>,
}

impl CliError {
    pub fn new(exit: Exit, message: impl Into<String>) -> Self {
        CliError {
            exit,
            message: message.into(),
            hint: None,
            candidates: Vec::new(),
        }
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    pub fn with_candidates(mut self, candidates: Vec<(String, String)>) -> Self {
        self.candidates = candidates;
        self
    }
}

/// A failed command, ready to print.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub exit: Exit,
    /// What failed and where (the outermost error).
    pub message: String,
    /// The causes below it, outermost first, each said once.
    pub causes: Vec<String>,
    pub hint: Option<String>,
    /// What the failure is about, item by item (see [`CliError::candidates`]).
    pub candidates: Vec<(String, String)>,
}

impl Failure {
    pub fn from_error(err: &anyhow::Error) -> Self {
        let mut links = err.chain();
        let message = links.next().map(|e| e.to_string()).unwrap_or_default();
        // Many errors repeat their source's text in their own message; print each text once.
        let mut causes: Vec<String> = Vec::new();
        let mut previous = message.clone();
        for link in links {
            let text = link.to_string();
            if !text.is_empty() && !previous.contains(&text) {
                causes.push(text.clone());
            }
            previous = text;
        }
        let (exit, hint) = classify(err);
        let candidates = err
            .chain()
            .find_map(|e| e.downcast_ref::<CliError>())
            .map(|e| e.candidates.clone())
            .unwrap_or_default();
        Failure {
            exit,
            message,
            causes,
            hint,
            candidates,
        }
    }
}

/// The exit code and hint of the first error in the chain that says what went wrong.
fn classify(err: &anyhow::Error) -> (Exit, Option<String>) {
    for link in err.chain() {
        if let Some(e) = link.downcast_ref::<CliError>() {
            return (e.exit, e.hint.clone());
        }
        if let Some(e) = link.downcast_ref::<HostError>() {
            if let HostError::LibraryCheck {
                failure: LibraryCheckFailure::Spawn { .. },
                ..
            } = e
            {
                // The package was not judged: this host could not run its own check.
                return (Exit::Failure, host_hint(e));
            }
            return (e.category().into(), host_hint(e));
        }
        if let Some(e) = link.downcast_ref::<PublishError>() {
            return publish(e);
        }
        if let Some(e) = link.downcast_ref::<KeyFileError>() {
            return key_file(e);
        }
        if let Some(e) = link.downcast_ref::<SourceError>() {
            return (source_exit(e), source_hint(e));
        }
        if let Some(e) = link.downcast_ref::<StoreError>() {
            // A version in use by a live process is a refusal of the change, not a broken store.
            if e.kind == StoreErrorKind::Pinned {
                return (Exit::Refused, store_hint(e));
            }
            return (Exit::Store, store_hint(e));
        }
        if let Some(e) = link.downcast_ref::<io::Error>() {
            if e.kind() == io::ErrorKind::NotFound {
                return (Exit::NotFound, None);
            }
        }
    }
    (Exit::Failure, None)
}

fn source_exit(e: &SourceError) -> Exit {
    if e.kind == SourceErrorKind::NotFound {
        Exit::NotFound
    } else {
        Exit::Rejected
    }
}

fn source_hint(e: &SourceError) -> Option<String> {
    match e.kind {
        SourceErrorKind::NotFound | SourceErrorKind::Io { .. } => None,
        SourceErrorKind::SizeMismatch { .. }
        | SourceErrorKind::DigestMismatch { .. }
        | SourceErrorKind::MissingArtifact
        | SourceErrorKind::UnlistedFile
        | SourceErrorKind::UnlistedDirectory => Some(
            "the package's files do not match its signed manifest: it was altered or damaged \
             after packing; do not install it, get it again from its publisher"
                .into(),
        ),
        _ => Some(
            "the archive is malformed or unsafe to unpack; get it again from its publisher".into(),
        ),
    }
}

fn publish(e: &PublishError) -> (Exit, Option<String>) {
    match e {
        PublishError::Read { source, .. } if source.kind() == io::ErrorKind::NotFound => {
            (Exit::NotFound, None)
        }
        PublishError::Read { .. } | PublishError::Pack(PackError::Io { .. }) => {
            (Exit::Failure, None)
        }
        PublishError::TemplateJson { .. }
        | PublishError::Template { .. }
        | PublishError::Manifest { .. } => (
            Exit::Rejected,
            Some("fix the template fields named above and pack again".into()),
        ),
        PublishError::Source(s) => (source_exit(s), source_hint(s)),
        PublishError::AlreadySigned { .. } => (
            Exit::Refused,
            Some("nothing to do: the package already carries this key's signature".into()),
        ),
        PublishError::Sign(_) => (Exit::Failure, None),
        _ => (Exit::Rejected, None),
    }
}

fn key_file(e: &KeyFileError) -> (Exit, Option<String>) {
    match e {
        KeyFileError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound => {
            (Exit::NotFound, None)
        }
        KeyFileError::AlreadyExists { .. } => (
            Exit::Refused,
            Some("pass --force to replace it (the old private key is then lost)".into()),
        ),
        KeyFileError::Io { .. } => (Exit::Failure, None),
        KeyFileError::Key {
            source: KeyError::UnexpectedPemLabel { expected, .. },
            ..
        } if expected.contains("PUBLIC") => (
            Exit::Rejected,
            Some(
                "`trust add` takes the publisher's public key (the .pub file `guild keygen` \
                 writes, `-----BEGIN PUBLIC KEY-----`); a private key never belongs in a trust \
                 store"
                    .into(),
            ),
        ),
        KeyFileError::Key {
            source: KeyError::UnexpectedPemLabel { .. },
            ..
        } => (
            Exit::Rejected,
            Some(
                "signing takes the publisher's private key (the .key file `guild keygen` \
                 writes: PKCS#8 or SEC1 PEM); a public key cannot sign"
                    .into(),
            ),
        ),
        _ => (
            Exit::Rejected,
            Some(
                "key files are P-256 PEM: `trust add` takes a public key (SPKI, the .pub file), \
                 `pack --key` and `sign --key` a private key (PKCS#8 or SEC1, the .key file); \
                 `guild keygen` and openssl write both"
                    .into(),
            ),
        ),
    }
}

fn store_hint(e: &StoreError) -> Option<String> {
    let where_ = e
        .path
        .as_ref()
        .map(|p| format!(" ({})", p.display()))
        .unwrap_or_default();
    match e.kind {
        StoreErrorKind::Locked => {
            Some("another guild command is changing this store; retry when it has finished".into())
        }
        StoreErrorKind::Pinned => Some(
            "a running process has this version loaded: stop it, or let it switch away (disable \
             or roll back the package first), then retry; `guild status ID` shows who uses what"
                .into(),
        ),
        // The store makes its lock file itself and never damages it; something else in its
        // place was put there, and a backup would not help.
        StoreErrorKind::Corrupt
            if e.path.as_ref().and_then(|p| p.file_name()) == Some("lock".as_ref()) =>
        {
            let path = e.path.as_deref().unwrap_or(Path::new("lock"));
            Some(format!(
                "remove {} (the store creates a fresh lock file) and find out who put it there",
                path.display()
            ))
        }
        StoreErrorKind::Corrupt | StoreErrorKind::UnsupportedFormat => Some(format!(
            "the store refuses to guess: restore the damaged file{where_} from a backup, then \
             run `guild recover`"
        )),
        StoreErrorKind::Io => Some(format!(
            "check the file system{where_}: does it exist, is it writable, is there space? \
             Then run `guild recover`"
        )),
        _ => Some(
            "run `guild recover`; if it fails the same way, restore the store from a backup".into(),
        ),
    }
}

fn host_hint(e: &HostError) -> Option<String> {
    match e {
        HostError::Source(s) => source_hint(s),
        HostError::Unauthenticated { source, .. } => auth_hint(source),
        HostError::Platform { .. } => {
            Some("get the build of this package made for this host's platform".into())
        }
        HostError::Manifest { .. } => Some(
            "the package's .gkmetadata is malformed; ask its publisher for a good package".into(),
        ),
        HostError::StoreState(r) => store_state_hint(r),
        HostError::Dependencies { action, problems } => Some(dependencies_hint(action, problems)),
        HostError::Disable(DisableRefusal::EnabledDependents { dependents, .. })
        | HostError::Remove(RemoveRefusal::EnabledDependents { dependents, .. }) => {
            let names: Vec<String> = dependents.iter().map(|d| d.node.id.to_string()).collect();
            Some(format!(
                "disable the dependents first: guild disable {}",
                names.join(" && guild disable ")
            ))
        }
        HostError::Rollback(RollbackRefusal::Incompatible { problems, .. }) => Some(format!(
            "{} would not accept that version; update or disable them first",
            dependents_of(problems).join(", ")
        )),
        HostError::Disable(_) | HostError::Remove(_) | HostError::Rollback(_) => {
            Some("see what is installed with `guild list`".into())
        }
        HostError::Leased(_) => {
            Some("a session is using the package; retry when it has been released".into())
        }
        HostError::TrustChange(TrustChangeError::KeyRevoked { .. }) => {
            Some("a revoked key is never trusted again; ask the publisher for a new key".into())
        }
        HostError::TrustChange(_) => None,
        HostError::Store(s) => store_hint(s),
        HostError::TrustFile(_) => Some(
            "the trust file cannot be read, so nothing is trusted: put back this store's latest \
             copy of it, or rebuild it with `guild trust reset` (every revocation the store \
             recorded is kept; trust publishers' keys again with `guild trust add`)"
                .into(),
        ),
        HostError::TrustBinding { problem, .. } => Some(trust_binding_hint(problem)),
        HostError::InstalledTree { .. } | HostError::Graph(_) => Some(
            "run `guild recover`; if it fails the same way, restore the store from a backup".into(),
        ),
        HostError::Publish(p) => publish(p).1,
        HostError::ImplIdConflict(c) => Some(format!(
            "if {} should provide these ids, remove {} first (guild remove {}); otherwise ask \
             the publisher of {} to rename its ids",
            c.claimant.id, c.owner.id, c.owner.id, c.claimant.id
        )),
        HostError::RegistrationMismatch { .. } | HostError::UndeclaredBackend { .. } => Some(
            "the library does not register what its signed manifest declares; ask its \
             publisher for a corrected package"
                .into(),
        ),
        HostError::LibraryCheck { failure, .. } => Some(match failure {
            LibraryCheckFailure::TimedOut { .. } => format!(
                "the library hangs while loading or in init; a slow but working one may need \
                 a longer {}",
                guild_host::registration::TIMEOUT_VARIABLE
            ),
            LibraryCheckFailure::Spawn { .. } => {
                "guild runs a copy of itself to check libraries; check that its executable is \
                 still in place"
                    .into()
            }
            _ => "the library cannot be published as it is; nothing was changed. Ask its \
                  publisher for a corrected package"
                .into(),
        }),
        _ => None,
    }
}

/// What to do about a trust file the registry does not recognise. Each way out keeps every
/// revocation the registry recorded.
fn trust_binding_hint(problem: &TrustFileMismatch) -> String {
    let keep = "`guild trust reset --keep-keys` keeps the keys of the file that is there and adds \
                back every revocation the store recorded";
    match problem {
        TrustFileMismatch::Missing { .. } | TrustFileMismatch::MissingWithPackages => {
            "put back this store's latest trust file, or run `guild trust reset`: it writes a new \
             one with every revocation the store recorded and no trusted key; then trust \
             publishers' keys again with `guild trust add`"
                .into()
        }
        TrustFileMismatch::Foreign { .. } | TrustFileMismatch::NotRecorded { .. } => format!(
            "put back this store's own trust file, or run `guild trust reset` (it trusts no key; \
             {keep} if you mean to trust that file's keys here)"
        ),
        TrustFileMismatch::Unbound { .. }
        | TrustFileMismatch::Older { .. }
        | TrustFileMismatch::Newer { .. }
        | TrustFileMismatch::Altered { .. } => format!(
            "put back this store's latest trust file, or {keep}; `guild trust reset` alone \
             trusts no key"
        ),
    }
}

fn auth_hint(e: &AuthError) -> Option<String> {
    match e {
        AuthError::PublisherNotTrusted { publisher } => Some(format!(
            "if you trust this publisher, add its public key: guild trust add {publisher} PUBKEY.pem"
        )),
        AuthError::NoSignatures => {
            Some("the package must be signed first: guild sign PACKAGE --key KEY.pem".into())
        }
        AuthError::DigestRevoked { .. } => {
            Some("this exact package was revoked; install another version".into())
        }
        AuthError::InvalidTrustedSignature { .. } => Some(
            "the package was altered after signing or a signature was damaged; do not install \
             it, ask the publisher for a fresh copy"
                .into(),
        ),
        AuthError::NoValidSignature {
            publisher,
            attempts,
        } => {
            if attempts
                .iter()
                .any(|(_, o)| matches!(o, SignatureOutcome::UnknownKey))
            {
                Some(format!(
                    "if the signing key belongs to {publisher}, trust it: guild trust add \
                     {publisher} PUBKEY.pem"
                ))
            } else if attempts
                .iter()
                .all(|(_, o)| matches!(o, SignatureOutcome::KeyRevoked { .. }))
            {
                Some("its keys are revoked; ask the publisher for a package signed with a current key".into())
            } else {
                Some("the package was altered after signing or signed for another publisher; do not install it".into())
            }
        }
    }
}

fn store_state_hint(e: &StoreStateError) -> Option<String> {
    match e {
        StoreStateError::Downgrade { id, .. } => Some(format!(
            "to return to the previous version run `guild rollback {id}`; to install this older \
             version anyway, pass --allow-downgrade"
        )),
        StoreStateError::ImmutableVersion(_) => Some(
            "published versions never change; publish the new content under a new version".into(),
        ),
        StoreStateError::UnknownPackage { .. }
        | StoreStateError::NotInstalled { .. }
        | StoreStateError::NotRecorded { .. } => {
            Some("see what is installed with `guild list`".into())
        }
        StoreStateError::NotRemoved { id, version, .. } => Some(format!(
            "purge forgets only removed versions: run `guild remove {id} --version {version}` \
             first"
        )),
        StoreStateError::NothingToPurge { id } => Some(format!(
            "only removed versions can be purged; `guild status {id}` lists its versions"
        )),
        StoreStateError::NoCurrentVersion { id } => Some(format!(
            "its current version was removed: `guild rollback {id}` makes the previous version \
             current again, or install a package of {id} (`guild install PACKAGE`); `guild \
             status {id}` lists its versions"
        )),
        StoreStateError::NoPreviousVersion { id } => Some(format!(
            "rollback returns to the version the last change superseded, and there is none now; \
             to go forward to a superseded version, install its package again (`guild install \
             PACKAGE`, with --allow-downgrade for an older one); `guild status {id}` lists the \
             versions"
        )),
        StoreStateError::Tainted { id, version, .. } => Some(format!(
            "it failed re-verification: install a genuine copy of {id} {version} to repair it \
             (guild install PACKAGE), or remove it (guild remove {id} --version {version})"
        )),
        _ => None,
    }
}

/// A hint for a change refused because of the dependency graph. The change's own package (named
/// at the end of `action`, "installing a@1.0.0") may be the one whose requirements fail, or
/// other packages may depend on it; the hint differs.
fn dependencies_hint(action: &str, problems: &[GraphProblem]) -> String {
    let subject = action.rsplit(' ').next().unwrap_or("");
    let mut needed: Vec<String> = Vec::new();
    let mut others: Vec<String> = Vec::new();
    for p in problems {
        let (list, name) = match (p.dependent(), p.target_id()) {
            (Some(dependent), Some(target)) if dependent.to_string() == subject => {
                (&mut needed, target.to_string())
            }
            (Some(dependent), _) => (&mut others, dependent.to_string()),
            _ => continue,
        };
        if !list.contains(&name) {
            list.push(name);
        }
    }
    let mut parts = Vec::new();
    if !needed.is_empty() {
        parts.push(format!(
            "install and enable a version of {} that {subject} accepts first",
            needed.join(", ")
        ));
    }
    if !others.is_empty() {
        parts.push(format!(
            "{} would break; disable {} first (guild disable ID)",
            others.join(", "),
            if others.len() == 1 { "it" } else { "them" }
        ));
    }
    if parts.is_empty() {
        "see `guild list` and `guild status ID` for the packages involved".into()
    } else {
        parts.join("; ")
    }
}

/// The packages named as dependents in graph problems, each once, in order.
fn dependents_of(problems: &[GraphProblem]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for p in problems {
        let name = p
            .dependent()
            .map_or_else(|| p.to_string(), ToString::to_string);
        if !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_are_listed_once_each() {
        let inner = io::Error::other("disk on fire");
        let err = anyhow::Error::new(inner).context("cannot write x: disk on fire");
        let f = Failure::from_error(&err);
        assert_eq!(f.message, "cannot write x: disk on fire");
        assert!(f.causes.is_empty());
        assert_eq!(f.exit, Exit::Failure);
    }

    #[test]
    fn cli_errors_keep_their_exit_code_under_context() {
        let err = anyhow::Error::new(CliError::new(Exit::NotFound, "no such thing").with_hint("h"))
            .context("while doing y");
        let f = Failure::from_error(&err);
        assert_eq!(f.exit, Exit::NotFound);
        assert_eq!(f.causes, vec!["no such thing".to_string()]);
        assert_eq!(f.hint.as_deref(), Some("h"));
    }
}
