//! The member stream that both package sources produce and the one extraction path consumes.
//!
//! A tar archive and a directory differ only in how members are found; everything that decides
//! whether a member is acceptable lives in `extract`, so that the two sources cannot drift apart
//! in what they let through.

use std::io::{self, Read};
use std::path::{Path, PathBuf};

use guild_ports::source::{SourceError, SourceErrorKind};

/// How many characters of a member name an error keeps, so that a hostile name cannot make an
/// error message arbitrarily large.
const ERROR_NAME_CHARS: usize = 300;

/// What a member is, as its source describes it. Only `File` and `Dir` are ever accepted; the
/// others exist so that the refusal names what was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MemberKind {
    File,
    Dir,
    Symlink,
    HardLink,
    Device,
    Fifo,
    Socket,
    Sparse,
    /// A tar type flag with no other meaning here.
    Other(char),
}

impl MemberKind {
    /// The refusal for a kind that is neither a regular file nor a directory.
    pub(crate) fn refusal(self) -> Option<SourceErrorKind> {
        Some(match self {
            MemberKind::File | MemberKind::Dir => return None,
            MemberKind::Symlink => SourceErrorKind::Symlink,
            MemberKind::HardLink => SourceErrorKind::HardLink,
            MemberKind::Device => SourceErrorKind::Device,
            MemberKind::Fifo => SourceErrorKind::Fifo,
            MemberKind::Socket => SourceErrorKind::Socket,
            MemberKind::Sparse => SourceErrorKind::Sparse,
            MemberKind::Other(type_flag) => SourceErrorKind::UnsupportedEntryType { type_flag },
        })
    }
}

/// One member header: its name exactly as the source spells it (a directory's single trailing
/// `/` already removed), what it is, and for a file the number of data bytes it declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    pub(crate) name: Vec<u8>,
    pub(crate) kind: MemberKind,
    pub(crate) size: u64,
}

/// A source of members, read in order. The modes a source records are not part of a member:
/// extraction sets every mode itself, so there is nothing in them worth carrying.
pub(crate) trait MemberStream: Send {
    /// The next member, or `None` after the last. Any data of the previous member that was not
    /// read is skipped.
    fn next_member(&mut self) -> Result<Option<Member>, SourceError>;

    /// The data of the member last returned. It may end early (a short read or an
    /// `UnexpectedEof` error), which extraction reports as [`MemberStream::short_data`], and a
    /// directory source may offer more than the declared size, which extraction refuses.
    fn data(&mut self) -> Result<&mut dyn Read, SourceError>;

    /// The kind to report when a member's data ends early: a truncated archive, or a file of a
    /// directory source that shrank.
    fn short_data(&self) -> SourceErrorKind;

    /// The package being read, for error messages.
    fn location(&self) -> &Path;
}

/// The one rule by which every source counts a package's entries against
/// [`ExtractLimits::max_entries`](guild_ports::source::ExtractLimits): each distinct path of the
/// package tree counts once. That is `.gkmetadata`, every file, and every directory, whether a
/// member names it or only lies on the path of a file. An extracted (installed) tree holds
/// exactly those paths, so the archive reader and the directory walk that verifies the tree
/// later always arrive at the same count, and a package accepted once is never refused for its
/// size when it is checked again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EntryCount {
    counted: u64,
    limit: u64,
}

impl EntryCount {
    /// A count under `limit` that already holds `.gkmetadata`.
    pub(crate) fn new(limit: u64) -> Self {
        EntryCount { counted: 1, limit }
    }

    /// Counts `paths` more paths of the tree, refusing once the total passes the limit.
    pub(crate) fn add(&mut self, paths: u64) -> Result<(), SourceErrorKind> {
        self.counted = self.counted.saturating_add(paths);
        if self.counted > self.limit {
            return Err(SourceErrorKind::TooManyEntries { limit: self.limit });
        }
        Ok(())
    }
}

/// Builds errors about one package.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    pub(crate) location: PathBuf,
}

impl Ctx {
    pub(crate) fn new(location: &Path) -> Self {
        Ctx {
            location: location.to_path_buf(),
        }
    }

    /// An error about the package as a whole.
    pub(crate) fn err(&self, kind: SourceErrorKind) -> SourceError {
        SourceError::new(kind, self.location.clone())
    }

    /// An error about the member named `name`.
    pub(crate) fn member(&self, kind: SourceErrorKind, name: &[u8]) -> SourceError {
        self.err(kind).with_member(display_name(name))
    }

    /// An IO error while doing `action`.
    pub(crate) fn io(&self, action: &'static str, e: io::Error) -> SourceError {
        self.err(SourceErrorKind::Io { action }).with_source(e)
    }
}

/// A member name as text for messages: invalid UTF-8 replaced, cut to a bounded length.
pub(crate) fn display_name(name: &[u8]) -> String {
    String::from_utf8_lossy(name)
        .chars()
        .take(ERROR_NAME_CHARS)
        .collect()
}

/// Reads into `buf` until it is full or the reader ends, retrying on interruption, and returns
/// how many bytes were read.
pub(crate) fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(buf.get_mut(filled..).unwrap_or_default()) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}
