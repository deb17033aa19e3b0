//! Members of a package that is a plain directory, walked without following symbolic links.
//!
//! Every entry is examined with `symlink_metadata`, so a link is reported as a link and never
//! followed. A subdirectory is listed only after extraction has accepted its own name, which
//! bounds the depth of the walk by the path rules; listings are sorted so that a directory yields
//! its members in the same order every time, and counted (under the one rule extraction counts
//! archives by) so that a huge directory is refused before it is held in memory. A file is opened only when its data is wanted, and the opened
//! file must be the one that was examined (same device and inode, still a regular file); one that
//! was swapped, grew or shrank meanwhile is refused.

use std::ffi::OsString;
use std::fs::{self, File, Metadata};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use guild_ports::source::{SourceError, SourceErrorKind};

use super::entry::{Ctx, EntryCount, Member, MemberKind, MemberStream};

/// The manifest's name; at the root of a directory source it is read by `open`, not walked.
const METADATA_NAME: &str = ".gkmetadata";

/// One directory being listed.
#[derive(Debug)]
struct Level {
    /// Its path relative to the root, `/`-separated; empty for the root.
    prefix: Vec<u8>,
    /// Its path on disk.
    dir: PathBuf,
    /// Its entries not yet yielded, in order.
    names: std::vec::IntoIter<OsString>,
}

/// The file whose data is wanted next.
#[derive(Debug)]
struct Pending {
    path: PathBuf,
    metadata: Metadata,
    name: Vec<u8>,
}

/// Members of a directory source.
#[derive(Debug)]
pub(crate) struct DirStream {
    ctx: Ctx,
    root: PathBuf,
    /// Directory entries listed so far, across all directories, under the rule extraction
    /// counts by (the root's `.gkmetadata` is in it from the start).
    listed: EntryCount,
    started: bool,
    stack: Vec<Level>,
    /// A directory yielded last, to be listed once its name has been accepted.
    descend: Option<(Vec<u8>, PathBuf)>,
    /// The file yielded last, and once opened, its reader.
    pending: Option<Pending>,
    open: Option<io::Take<File>>,
    /// What a member without data reads from.
    empty: io::Empty,
}

impl DirStream {
    pub(crate) fn new(root: &Path, location: &Path, max_entries: u64) -> Self {
        DirStream {
            ctx: Ctx::new(location),
            root: root.to_path_buf(),
            listed: EntryCount::new(max_entries),
            started: false,
            stack: Vec::new(),
            descend: None,
            pending: None,
            open: None,
            empty: io::empty(),
        }
    }

    fn list(&mut self, prefix: Vec<u8>, dir: PathBuf) -> Result<(), SourceError> {
        let entries = fs::read_dir(&dir).map_err(|e| {
            self.ctx
                .io("list a directory", e)
                .with_member(display(&prefix))
        })?;
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| {
                self.ctx
                    .io("list a directory", e)
                    .with_member(display(&prefix))
            })?;
            let name = entry.file_name();
            // The root's `.gkmetadata` is counted already; every other entry is one more path.
            if !(prefix.is_empty() && name == METADATA_NAME) {
                self.listed.add(1).map_err(|kind| self.ctx.err(kind))?;
            }
            names.push(name);
        }
        names.sort();
        self.stack.push(Level {
            prefix,
            dir,
            names: names.into_iter(),
        });
        Ok(())
    }
}

impl MemberStream for DirStream {
    fn next_member(&mut self) -> Result<Option<Member>, SourceError> {
        self.pending = None;
        self.open = None;
        if !self.started {
            self.started = true;
            self.list(Vec::new(), self.root.clone())?;
        }
        if let Some((prefix, dir)) = self.descend.take() {
            self.list(prefix, dir)?;
        }
        loop {
            let Some(level) = self.stack.last_mut() else {
                return Ok(None);
            };
            let Some(file_name) = level.names.next() else {
                self.stack.pop();
                continue;
            };
            if level.prefix.is_empty() && file_name == METADATA_NAME {
                continue;
            }
            let mut name = level.prefix.clone();
            if !name.is_empty() {
                name.push(b'/');
            }
            name.extend_from_slice(&name_bytes(&file_name));
            let path = level.dir.join(&file_name);
            let metadata = fs::symlink_metadata(&path).map_err(|e| {
                let kind = if e.kind() == io::ErrorKind::NotFound {
                    SourceErrorKind::ChangedWhileReading
                } else {
                    SourceErrorKind::Io {
                        action: "read file metadata",
                    }
                };
                self.ctx.member(kind, &name).with_source(e)
            })?;
            let kind = kind_of(&metadata);
            let size = match kind {
                MemberKind::File => metadata.len(),
                _ => 0,
            };
            match kind {
                MemberKind::Dir => self.descend = Some((name.clone(), path)),
                MemberKind::File => {
                    self.pending = Some(Pending {
                        path,
                        metadata,
                        name: name.clone(),
                    })
                }
                _ => {}
            }
            return Ok(Some(Member { name, kind, size }));
        }
    }

    fn data(&mut self) -> Result<&mut dyn Read, SourceError> {
        if self.open.is_none() {
            let Some(pending) = &self.pending else {
                return Ok(&mut self.empty);
            };
            let file = open_same(&pending.path, &pending.metadata)
                .map_err(|kind| self.ctx.member(kind, &pending.name))?;
            // One byte more than the examined size, so that a file that grew is noticed.
            self.open = Some(file.take(pending.metadata.len().saturating_add(1)));
        }
        match &mut self.open {
            Some(reader) => Ok(reader),
            None => Err(self.ctx.err(SourceErrorKind::ChangedWhileReading)),
        }
    }

    fn short_data(&self) -> SourceErrorKind {
        SourceErrorKind::ChangedWhileReading
    }

    fn location(&self) -> &Path {
        &self.ctx.location
    }
}

/// What a directory entry is, from metadata that did not follow links.
fn kind_of(metadata: &Metadata) -> MemberKind {
    let t = metadata.file_type();
    if t.is_symlink() {
        return MemberKind::Symlink;
    }
    if t.is_dir() {
        return MemberKind::Dir;
    }
    if t.is_file() {
        return MemberKind::File;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return MemberKind::Fifo;
        }
        if t.is_socket() {
            return MemberKind::Socket;
        }
        if t.is_char_device() || t.is_block_device() {
            return MemberKind::Device;
        }
    }
    MemberKind::Other('?')
}

/// Opens `path` for reading and checks that it is still the regular file `examined` describes.
pub(crate) fn open_same(path: &Path, examined: &Metadata) -> Result<File, SourceErrorKind> {
    let file = File::open(path).map_err(|_| SourceErrorKind::ChangedWhileReading)?;
    let opened = file
        .metadata()
        .map_err(|_| SourceErrorKind::ChangedWhileReading)?;
    if !opened.is_file() || !same_file(&opened, examined) {
        return Err(SourceErrorKind::ChangedWhileReading);
    }
    Ok(file)
}

#[cfg(unix)]
fn same_file(a: &Metadata, b: &Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    a.dev() == b.dev() && a.ino() == b.ino()
}

#[cfg(not(unix))]
fn same_file(a: &Metadata, b: &Metadata) -> bool {
    a.len() == b.len() && a.modified().ok() == b.modified().ok()
}

/// A file name as bytes: exact on Unix; elsewhere, names that are not Unicode get replacement
/// characters, which path validation then refuses.
fn name_bytes(name: &OsString) -> Vec<u8> {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        name.as_bytes().to_vec()
    }
    #[cfg(not(unix))]
    {
        name.to_string_lossy().into_owned().into_bytes()
    }
}

fn display(name: &[u8]) -> String {
    super::entry::display_name(name)
}

/// Reads the `.gkmetadata` at the root of a directory source.
pub(crate) fn read_metadata(
    root: &Path,
    ctx: &Ctx,
    max_bytes: u64,
) -> Result<Vec<u8>, SourceError> {
    let path = root.join(METADATA_NAME);
    let name = METADATA_NAME.as_bytes();
    let metadata = match fs::symlink_metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(ctx.err(SourceErrorKind::MetadataMissing))
        }
        Err(e) => {
            return Err(ctx
                .member(
                    SourceErrorKind::Io {
                        action: "read file metadata",
                    },
                    name,
                )
                .with_source(e))
        }
    };
    match kind_of(&metadata) {
        MemberKind::File => {}
        MemberKind::Dir => return Err(ctx.member(SourceErrorKind::MetadataNotAFile, name)),
        other => {
            let kind = other.refusal().unwrap_or(SourceErrorKind::MetadataNotAFile);
            return Err(ctx.member(kind, name));
        }
    }
    let too_large = |size| {
        ctx.member(
            SourceErrorKind::MetadataTooLarge {
                size,
                limit: max_bytes,
            },
            name,
        )
    };
    if metadata.len() > max_bytes {
        return Err(too_large(metadata.len()));
    }
    let file = open_same(&path, &metadata).map_err(|kind| ctx.member(kind, name))?;
    let mut bytes = Vec::new();
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| ctx.io("read .gkmetadata", e).with_member(METADATA_NAME))?;
    if bytes.len() as u64 > max_bytes {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}
