//! The one extraction path: every member of every source is admitted here, or refused, before a
//! byte of it is written.
//!
//! Admission, in order: a second `.gkmetadata`; the name as an [`ArtifactPath`]; the member
//! kind (regular files and directories only); the tree (no duplicate, no case collision, no file
//! where a directory is needed or the reverse); the entry count, by the one rule of
//! [`EntryCount`]; and for a file, the per-file and total caps on its declared size. Extraction
//! then requires a file to be a manifest artifact of the declared size, and a directory to lie
//! on the path of one (so that nothing unsigned is created, not even an empty directory); it
//! writes the file with `create_new` under directories it created itself inside the staging
//! directory it created itself, hashes exactly the bytes it writes, and compares the digest with
//! the manifest. A guard removes the staging directory on any failure.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use guild_domain::ids::Sha256Digest;
use guild_domain::manifest::{Artifact, Manifest};
use guild_domain::path::{ArtifactPath, RESERVED_METADATA_NAME};
use guild_ports::source::{
    Durability, ExtractLimits, ExtractOptions, ExtractedPackage, Progress, SourceError,
    SourceErrorKind,
};
use sha2::{Digest, Sha256};

use super::entry::{read_full, Ctx, EntryCount, Member, MemberKind, MemberStream};

/// The copy buffer. Large reads keep the per-call overhead of reading, hashing and writing well
/// below the cost of the hash itself.
pub(crate) const COPY_BUFFER: usize = 1 << 20;
/// Mode of every extracted file: readable by all, writable by none.
const FILE_MODE: u32 = 0o444;
/// Mode of a file while it is being written, before it becomes read-only.
const FILE_MODE_WRITING: u32 = 0o600;
/// Mode of every extracted directory.
const DIR_MODE: u32 = 0o755;

/// A member that passed admission.
#[derive(Debug)]
pub(crate) struct Admitted {
    pub(crate) path: ArtifactPath,
    /// Directories that must be created before the member, parents first (and the member
    /// itself, if it is a directory not seen before).
    pub(crate) new_dirs: Vec<String>,
}

/// One path known to the tree, keyed by its case-folded spelling.
#[derive(Debug)]
struct Node {
    exact: String,
    dir: bool,
    /// Whether a member named it (rather than being implied as some member's parent).
    explicit: bool,
}

/// The admission rules that do not depend on a manifest, shared by extraction and scanning.
#[derive(Debug)]
pub(crate) struct Checker {
    ctx: Ctx,
    limits: ExtractLimits,
    entries: EntryCount,
    total: u64,
    tree: HashMap<String, Node>,
}

impl Checker {
    pub(crate) fn new(ctx: Ctx, limits: ExtractLimits) -> Self {
        Checker {
            ctx,
            limits,
            entries: EntryCount::new(limits.max_entries),
            total: 0,
            tree: HashMap::new(),
        }
    }

    pub(crate) fn admit(&mut self, member: &Member) -> Result<Admitted, SourceError> {
        let at = |kind| self.ctx.member(kind, &member.name);
        if member
            .name
            .eq_ignore_ascii_case(RESERVED_METADATA_NAME.as_bytes())
        {
            return Err(at(SourceErrorKind::MetadataDuplicated));
        }
        // A name that is not UTF-8 gets replacement characters, which the path grammar refuses.
        let text = String::from_utf8_lossy(&member.name).into_owned();
        let path = ArtifactPath::new(text)
            .map_err(|e| at(SourceErrorKind::UnsafePath { rule: e.rule }))?;
        if let Some(kind) = member.kind.refusal() {
            return Err(at(kind));
        }
        let is_dir = member.kind == MemberKind::Dir;
        let new_dirs = place(&mut self.tree, &path, is_dir).map_err(at)?;
        // The paths this member adds to the tree: the directories it implies (itself, for a
        // directory not seen before) and, for a file, the file.
        let new_paths = new_dirs.len() as u64 + u64::from(!is_dir);
        self.entries.add(new_paths).map_err(at)?;
        if !is_dir {
            let limits = self.limits;
            if member.size > limits.max_file_bytes {
                return Err(at(SourceErrorKind::FileTooLarge {
                    size: member.size,
                    limit: limits.max_file_bytes,
                }));
            }
            self.total = self.total.saturating_add(member.size);
            if self.total > limits.max_total_bytes {
                return Err(at(SourceErrorKind::TotalTooLarge {
                    total: self.total,
                    limit: limits.max_total_bytes,
                }));
            }
        }
        Ok(Admitted { path, new_dirs })
    }
}

/// Records `path` in the tree and returns the directories it needs created.
fn place(
    tree: &mut HashMap<String, Node>,
    path: &ArtifactPath,
    is_dir: bool,
) -> Result<Vec<String>, SourceErrorKind> {
    let components: Vec<&str> = path.components().collect();
    let mut new_dirs = Vec::new();
    let mut prefix = String::new();
    for (i, component) in components.iter().enumerate() {
        if i > 0 {
            prefix.push('/');
        }
        prefix.push_str(component);
        let last = i + 1 == components.len();
        let key = prefix.to_ascii_lowercase();
        match tree.get_mut(&key) {
            None => {
                let dir = !last || is_dir;
                if dir {
                    new_dirs.push(prefix.clone());
                }
                let exact = prefix.clone();
                let explicit = last;
                tree.insert(
                    key,
                    Node {
                        exact,
                        dir,
                        explicit,
                    },
                );
            }
            Some(node) if node.exact != prefix => {
                return Err(SourceErrorKind::CaseCollision {
                    other: node.exact.clone(),
                })
            }
            Some(node) if !last => {
                if !node.dir {
                    return Err(SourceErrorKind::PathConflict {
                        other: node.exact.clone(),
                    });
                }
            }
            Some(node) => match (node.dir, is_dir) {
                (true, true) if !node.explicit => node.explicit = true,
                (true, true) | (false, false) => return Err(SourceErrorKind::DuplicateEntry),
                _ => {
                    return Err(SourceErrorKind::PathConflict {
                        other: node.exact.clone(),
                    })
                }
            },
        }
    }
    Ok(new_dirs)
}

/// Why copying a member's data stopped.
#[derive(Debug)]
enum CopyError {
    /// The data ended before the declared size.
    Short,
    /// More data than the declared size (directory sources only).
    Grown,
    Read(io::Error),
    Write(io::Error),
}

/// Copies exactly `size` bytes from `data` into `sink` (if any), hashing the bytes handed to the
/// sink, and checks that the data ends there.
fn copy_hashed(
    data: &mut dyn Read,
    size: u64,
    buf: &mut [u8],
    mut sink: Option<&mut File>,
) -> Result<Sha256Digest, CopyError> {
    let mut hasher = Sha256::new();
    let mut left = size;
    while left > 0 {
        let want = usize::try_from(left).map_or(buf.len(), |left| left.min(buf.len()));
        let chunk = &mut buf[..want];
        let n = read_some(data, chunk)?;
        let bytes = &chunk[..n];
        if let Some(file) = sink.as_deref_mut() {
            file.write_all(bytes).map_err(CopyError::Write)?;
        }
        hasher.update(bytes);
        left -= n as u64;
    }
    check_ended(data)?;
    Ok(Sha256Digest(hasher.finalize().into()))
}

/// Files at least this large are written by [`copy_hashed_pipelined`]: starting a thread costs
/// tens of microseconds, which only a file of several milliseconds of hashing repays.
const PIPELINE_BYTES: u64 = 4 << 20;
/// The chunks of the pipelined copy: small enough that a chunk just read is still in cache
/// when it is written and hashed, large enough that handing it over costs nothing next to its
/// hash.
const PIPELINE_CHUNK: usize = 256 << 10;
/// Chunks read and written ahead of the hash, at most; with the one being hashed and one being
/// returned, this bounds the memory of a copy to a few chunks whatever the file's size.
const PIPELINE_DEPTH: usize = 4;

/// [`copy_hashed`] into `file`, with the hash on a second thread: this one reads each chunk and
/// writes it, then hands that same buffer, no longer written to, to the hashing thread; so the
/// digest is of exactly the bytes written, as in [`copy_hashed`], and a copy costs about its
/// hash alone rather than the hash plus reading and writing. Falls back to [`copy_hashed`]
/// (with `buf`) if no thread can be started.
fn copy_hashed_pipelined(
    data: &mut dyn Read,
    size: u64,
    buf: &mut [u8],
    file: &mut File,
) -> Result<Sha256Digest, CopyError> {
    std::thread::scope(|scope| {
        let (to_hasher, chunks) = mpsc::sync_channel::<Vec<u8>>(PIPELINE_DEPTH);
        let (to_reader, hashed) = mpsc::channel::<Vec<u8>>();
        let spawned = std::thread::Builder::new()
            .name("guild-extract-hash".into())
            .spawn_scoped(scope, move || {
                let mut hasher = Sha256::new();
                for chunk in chunks {
                    hasher.update(&chunk);
                    // The reader may have stopped already; the buffer is then simply dropped.
                    let _ = to_reader.send(chunk);
                }
                hasher
            });
        let Ok(hashing) = spawned else {
            return copy_hashed(data, size, buf, Some(file));
        };
        let mut fresh = PIPELINE_DEPTH + 2;
        let mut left = size;
        let copied = loop {
            if left == 0 {
                break Ok(());
            }
            let mut chunk = if fresh > 0 {
                fresh -= 1;
                vec![0; PIPELINE_CHUNK]
            } else {
                match hashed.recv() {
                    Ok(chunk) => chunk,
                    // Only a hashing thread that died drops its sender early; `join` says why.
                    Err(_) => break Ok(()),
                }
            };
            chunk.resize(PIPELINE_CHUNK, 0);
            let want = usize::try_from(left).map_or(PIPELINE_CHUNK, |l| l.min(PIPELINE_CHUNK));
            let n = match read_some(data, &mut chunk[..want]) {
                Ok(n) => n,
                Err(e) => break Err(e),
            };
            chunk.truncate(n);
            if let Err(e) = file.write_all(&chunk) {
                break Err(CopyError::Write(e));
            }
            left -= n as u64;
            if to_hasher.send(chunk).is_err() {
                break Ok(());
            }
        };
        drop(to_hasher);
        let hasher = hashing
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        copied?;
        check_ended(data)?;
        Ok(Sha256Digest(hasher.finalize().into()))
    })
}

/// One read of at most `chunk.len()` (non-zero) bytes of a member's data, retried when
/// interrupted; data that ends here ends early.
fn read_some(data: &mut dyn Read, chunk: &mut [u8]) -> Result<usize, CopyError> {
    loop {
        return match data.read(chunk) {
            Ok(0) => Err(CopyError::Short),
            Ok(n) => Ok(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(CopyError::Short),
            Err(e) => Err(CopyError::Read(e)),
        };
    }
}

/// Checks that a member's data ends at its declared size, all of which has been read.
fn check_ended(data: &mut dyn Read) -> Result<(), CopyError> {
    let mut probe = [0u8; 1];
    match read_full(data, &mut probe) {
        Ok(0) => Ok(()),
        Ok(_) => Err(CopyError::Grown),
        Err(e) => Err(CopyError::Read(e)),
    }
}

/// The error for a copy of the member `rel` that stopped; `short` is the source's kind for
/// data that ended early.
fn copy_error(ctx: &Ctx, rel: &str, short: SourceErrorKind, e: CopyError) -> SourceError {
    match e {
        CopyError::Short => ctx.err(short).with_member(rel),
        CopyError::Grown => ctx
            .err(SourceErrorKind::ChangedWhileReading)
            .with_member(rel),
        CopyError::Read(e) => ctx.io("read the package", e).with_member(rel),
        CopyError::Write(e) => ctx.io("write a file", e).with_member(rel),
    }
}

/// The staging directory being filled. Dropping it before [`Staging::finish`] succeeds removes
/// it and everything under it.
#[derive(Debug)]
struct Staging {
    root: PathBuf,
    ctx: Ctx,
    durability: Durability,
    /// Directories created under the root, parents before children.
    dirs: Vec<PathBuf>,
    buf: Vec<u8>,
    armed: bool,
}

impl Staging {
    /// Creates `root`, which must not exist.
    fn create(root: &Path, ctx: &Ctx, durability: Durability) -> Result<Self, SourceError> {
        if let Err(e) = dir_builder().create(root) {
            let kind = if e.kind() == io::ErrorKind::AlreadyExists {
                SourceErrorKind::StagingExists {
                    path: root.to_path_buf(),
                }
            } else {
                SourceErrorKind::Io {
                    action: "create the staging directory",
                }
            };
            return Err(ctx.err(kind).with_source(e));
        }
        let staging = Staging {
            root: root.to_path_buf(),
            ctx: ctx.clone(),
            durability,
            dirs: Vec::new(),
            buf: vec![0; COPY_BUFFER],
            armed: true,
        };
        set_dir_mode(root).map_err(|e| ctx.io("set the staging directory's mode", e))?;
        Ok(staging)
    }

    /// The on-disk path of a validated relative path.
    fn join(&self, rel: &str) -> PathBuf {
        let mut path = self.root.clone();
        path.extend(rel.split('/'));
        path
    }

    fn mkdir(&mut self, rel: &str) -> Result<(), SourceError> {
        let path = self.join(rel);
        let at = |action, e| self.ctx.io(action, e).with_member(rel);
        dir_builder()
            .create(&path)
            .map_err(|e| at("create a directory", e))?;
        set_dir_mode(&path).map_err(|e| at("set a directory's mode", e))?;
        self.dirs.push(path);
        Ok(())
    }

    /// Writes a file of `size` bytes from `data` and returns the digest of what was written.
    fn write_file(
        &mut self,
        rel: &str,
        data: &mut dyn Read,
        size: u64,
        short: SourceErrorKind,
    ) -> Result<Sha256Digest, SourceError> {
        let path = self.join(rel);
        let ctx = &self.ctx;
        let at = |action, e| ctx.io(action, e).with_member(rel);
        let mut file = create_new(&path).map_err(|e| at("create a file", e))?;
        let digest = if size >= PIPELINE_BYTES {
            copy_hashed_pipelined(data, size, &mut self.buf, &mut file)
        } else {
            copy_hashed(data, size, &mut self.buf, Some(&mut file))
        }
        .map_err(|e| copy_error(ctx, rel, short, e))?;
        set_file_mode(&file).map_err(|e| at("set a file's mode", e))?;
        if self.durability == Durability::Fsync {
            file.sync_all().map_err(|e| at("fsync a file", e))?;
        }
        Ok(digest)
    }

    /// Flushes the directories (when asked to) and keeps the tree.
    fn finish(mut self) -> Result<PathBuf, SourceError> {
        if self.durability == Durability::Fsync {
            // The parent records the staging directory's own entry; a relative staging path
            // without one lives in the current directory.
            let parent = match self.root.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            };
            let dirs = self.dirs.iter().rev().chain([&self.root, &parent]);
            for dir in dirs {
                sync_dir(dir).map_err(|e| self.ctx.io("fsync a directory", e))?;
            }
        }
        self.armed = false;
        Ok(std::mem::take(&mut self.root))
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if self.armed {
            // Best effort: the error being returned matters more than a failed cleanup, and
            // the tree holds nothing that was not checked or is still unverified.
            let _ = fs::remove_dir_all(&self.root);
        }
    }
}

/// Extracts the members of `stream` into `staging` and checks them against `manifest`.
pub(crate) fn extract(
    stream: &mut dyn MemberStream,
    metadata: &[u8],
    manifest: &Manifest,
    staging: &Path,
    options: &ExtractOptions,
    progress: Option<&dyn Progress>,
) -> Result<ExtractedPackage, SourceError> {
    let ctx = Ctx::new(stream.location());
    let mut out = Staging::create(staging, &ctx, options.durability)?;
    out.write_file(
        RESERVED_METADATA_NAME,
        &mut &metadata[..],
        metadata.len() as u64,
        SourceErrorKind::Truncated,
    )?;
    let files = check_against(
        stream,
        manifest,
        &mut Target::Staging(&mut out),
        &ctx,
        options.limits,
        progress,
    )?;
    let root = out.finish()?;
    Ok(ExtractedPackage { root, files })
}

/// Checks the members of `stream` against `manifest` exactly as extraction does, writing
/// nothing.
pub(crate) fn verify(
    stream: &mut dyn MemberStream,
    manifest: &Manifest,
    limits: ExtractLimits,
    progress: Option<&dyn Progress>,
) -> Result<Vec<Artifact>, SourceError> {
    let ctx = Ctx::new(stream.location());
    // One buffer per thread, reused by every verification it runs: a freshly zeroed 1 MiB
    // buffer per package was about a third of the cost of re-hashing a small one.
    let mut buf = HASH_BUFFER.with(|b| std::mem::take(&mut *b.borrow_mut()));
    buf.resize(COPY_BUFFER, 0);
    let mut target = Target::Hash(buf);
    let checked = check_against(stream, manifest, &mut target, &ctx, limits, progress);
    if let Target::Hash(buf) = target {
        HASH_BUFFER.with(|b| *b.borrow_mut() = buf);
    }
    checked
}

thread_local! {
    /// The hashing buffer of [`verify`] on this thread (empty until its first use).
    static HASH_BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A reader that tells a progress display how many bytes went through it.
struct Counted<'a> {
    inner: &'a mut dyn Read,
    progress: &'a dyn Progress,
}

impl Read for Counted<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.progress.advance(n as u64);
        Ok(n)
    }
}

/// What happens to admitted members: written into a staging directory, or only hashed.
enum Target<'a> {
    Staging(&'a mut Staging),
    Hash(Vec<u8>),
}

fn check_against(
    stream: &mut dyn MemberStream,
    manifest: &Manifest,
    target: &mut Target<'_>,
    ctx: &Ctx,
    limits: ExtractLimits,
    progress: Option<&dyn Progress>,
) -> Result<Vec<Artifact>, SourceError> {
    let listed: BTreeMap<&ArtifactPath, &Artifact> =
        manifest.artifacts.iter().map(|a| (&a.path, a)).collect();
    let implied = implied_dirs(manifest);
    let mut written: BTreeMap<ArtifactPath, Artifact> = BTreeMap::new();
    let mut checker = Checker::new(ctx.clone(), limits);
    while let Some(member) = stream.next_member()? {
        let admitted = checker.admit(&member)?;
        let at = |kind| ctx.member(kind, &member.name);
        let artifact = match member.kind {
            MemberKind::File => {
                let artifact = *listed
                    .get(&admitted.path)
                    .ok_or_else(|| at(SourceErrorKind::UnlistedFile))?;
                if member.size != artifact.size {
                    return Err(at(SourceErrorKind::SizeMismatch {
                        expected: artifact.size,
                        actual: member.size,
                    }));
                }
                Some(artifact)
            }
            MemberKind::Dir => {
                if !implied.contains(admitted.path.as_str()) {
                    return Err(at(SourceErrorKind::UnlistedDirectory));
                }
                None
            }
            _ => None,
        };
        if let Target::Staging(out) = target {
            for dir in &admitted.new_dirs {
                out.mkdir(dir)?;
            }
        }
        let Some(artifact) = artifact else {
            continue;
        };
        let rel = admitted.path.as_str();
        let short = stream.short_data();
        let data = stream.data()?;
        let mut counted;
        let data: &mut dyn Read = match progress {
            Some(progress) => {
                counted = Counted {
                    inner: data,
                    progress,
                };
                &mut counted
            }
            None => data,
        };
        let digest = match target {
            Target::Staging(out) => out.write_file(rel, data, member.size, short)?,
            Target::Hash(buf) => copy_hashed(data, member.size, buf, None)
                .map_err(|e| copy_error(ctx, rel, short, e))?,
        };
        if digest != artifact.sha256 {
            return Err(at(SourceErrorKind::DigestMismatch {
                expected: Box::new(artifact.sha256),
                actual: Box::new(digest),
            }));
        }
        written.insert(admitted.path, artifact.clone());
    }
    if let Some(missing) = manifest
        .artifacts
        .iter()
        .find(|a| !written.contains_key(&a.path))
    {
        return Err(ctx
            .err(SourceErrorKind::MissingArtifact)
            .with_member(missing.path.as_str()));
    }
    Ok(written.into_values().collect())
}

/// The directories the manifest's artifacts lie in: every proper prefix of every artifact
/// path, spelled exactly as the manifest spells it.
fn implied_dirs(manifest: &Manifest) -> BTreeSet<&str> {
    manifest
        .artifacts
        .iter()
        .flat_map(|a| {
            let path = a.path.as_str();
            path.match_indices('/').map(move |(i, _)| &path[..i])
        })
        .collect()
}

/// Lists the files of `stream` with their sizes and digests, under the same admission rules as
/// extraction, writing nothing.
pub(crate) fn scan(
    stream: &mut dyn MemberStream,
    limits: ExtractLimits,
) -> Result<Vec<Artifact>, SourceError> {
    let ctx = Ctx::new(stream.location());
    let mut checker = Checker::new(ctx.clone(), limits);
    let mut buf = vec![0; COPY_BUFFER];
    let mut found = Vec::new();
    while let Some(member) = stream.next_member()? {
        let admitted = checker.admit(&member)?;
        if member.kind != MemberKind::File {
            continue;
        }
        let rel = admitted.path.as_str();
        let short = stream.short_data();
        let data = stream.data()?;
        let sha256 = copy_hashed(data, member.size, &mut buf, None)
            .map_err(|e| copy_error(&ctx, rel, short, e))?;
        found.push(Artifact {
            path: admitted.path,
            size: member.size,
            sha256,
        });
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(found)
}

fn dir_builder() -> fs::DirBuilder {
    #[allow(unused_mut)]
    let mut builder = fs::DirBuilder::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(DIR_MODE);
    }
    builder
}

/// Creates a file that must not exist, through no link.
fn create_new(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(FILE_MODE_WRITING);
    }
    options.open(path)
}

/// Sets a directory's mode exactly, whatever the umask took away when it was created.
fn set_dir_mode(path: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        File::open(path)?.set_permissions(fs::Permissions::from_mode(DIR_MODE))
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        Ok(())
    }
}

/// Makes an extracted file read-only, through its open handle.
fn set_file_mode(file: &File) -> io::Result<()> {
    #[cfg(unix)]
    let permissions = {
        use std::os::unix::fs::PermissionsExt;
        fs::Permissions::from_mode(FILE_MODE)
    };
    #[cfg(not(unix))]
    let permissions = {
        let mut p = file.metadata()?.permissions();
        p.set_readonly(true);
        p
    };
    file.set_permissions(permissions)
}

fn sync_dir(path: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        File::open(path)?.sync_all()
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::dir::DirStream;
    use super::*;

    /// A directory stream positioned on its only file, `a`, of 4 bytes.
    fn one_file(dir: &Path) -> (DirStream, Member) {
        fs::write(dir.join("a"), b"abcd").unwrap();
        let mut stream = DirStream::new(dir, dir, 10);
        let member = stream.next_member().unwrap().unwrap();
        assert_eq!((member.name.as_slice(), member.size), (&b"a"[..], 4));
        (stream, member)
    }

    fn copy(stream: &mut DirStream, member: &Member) -> Result<Sha256Digest, CopyError> {
        let mut buf = vec![0; 3];
        let data = stream
            .data()
            .map_err(|e| CopyError::Read(io::Error::other(e)))?;
        copy_hashed(data, member.size, &mut buf, None)
    }

    /// A reader of `data` that hands out at most `most` bytes a call, so that chunks end at
    /// odd places.
    struct Dribble<'a> {
        data: &'a [u8],
        most: usize,
    }

    impl Read for Dribble<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = buf.len().min(self.most).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    /// Enough bytes that every buffer of the pipeline is reused several times.
    fn pipelined_bytes() -> Vec<u8> {
        let len = PIPELINE_CHUNK * (PIPELINE_DEPTH + 2) * 3 + 17;
        (0..len).map(|i| (i % 251) as u8).collect()
    }

    fn pipelined(data: &[u8], size: u64, file: &mut File) -> Result<Sha256Digest, CopyError> {
        let mut source = Dribble {
            data,
            most: 100_003,
        };
        copy_hashed_pipelined(&mut source, size, &mut [0; 7], file)
    }

    #[test]
    fn the_pipelined_copy_writes_and_hashes_exactly_the_bytes() {
        let temp = tempfile::tempdir().unwrap();
        let path = temp.path().join("out");
        let data = pipelined_bytes();
        let mut file = create_new(&path).unwrap();
        let digest = pipelined(&data, data.len() as u64, &mut file).unwrap();
        assert_eq!(digest, Sha256Digest::of(&data));
        assert_eq!(fs::read(&path).unwrap(), data);
        let sequential = copy_hashed(&mut &data[..], data.len() as u64, &mut [0; 4096], None);
        assert_eq!(sequential.unwrap(), digest);
    }

    #[test]
    fn the_pipelined_copy_refuses_data_that_ends_early_or_goes_on() {
        let temp = tempfile::tempdir().unwrap();
        let data = pipelined_bytes();
        let size = data.len() as u64;
        let mut file = create_new(&temp.path().join("short")).unwrap();
        let short = pipelined(&data, size + 1, &mut file);
        assert!(matches!(short, Err(CopyError::Short)), "{short:?}");
        let mut file = create_new(&temp.path().join("grown")).unwrap();
        let grown = pipelined(&data, size - 1, &mut file);
        assert!(matches!(grown, Err(CopyError::Grown)), "{grown:?}");
    }

    #[test]
    fn the_pipelined_copy_reports_a_failed_write() {
        let temp = tempfile::tempdir().unwrap();
        let path = temp.path().join("read-only");
        fs::write(&path, b"").unwrap();
        let mut file = File::open(&path).unwrap();
        let data = pipelined_bytes();
        let failed = pipelined(&data, data.len() as u64, &mut file);
        assert!(matches!(failed, Err(CopyError::Write(_))), "{failed:?}");
    }

    #[test]
    fn a_directory_file_read_as_examined_hashes_its_bytes() {
        let temp = tempfile::tempdir().unwrap();
        let (mut stream, member) = one_file(temp.path());
        assert_eq!(
            copy(&mut stream, &member).unwrap(),
            Sha256Digest::of(b"abcd")
        );
    }

    #[test]
    fn a_directory_file_that_grows_is_refused() {
        let temp = tempfile::tempdir().unwrap();
        let (mut stream, member) = one_file(temp.path());
        fs::write(temp.path().join("a"), b"abcde").unwrap();
        assert!(matches!(copy(&mut stream, &member), Err(CopyError::Grown)));
    }

    #[test]
    fn a_directory_file_that_shrinks_is_refused() {
        let temp = tempfile::tempdir().unwrap();
        let (mut stream, member) = one_file(temp.path());
        fs::write(temp.path().join("a"), b"ab").unwrap();
        assert!(matches!(copy(&mut stream, &member), Err(CopyError::Short)));
        assert_eq!(stream.short_data(), SourceErrorKind::ChangedWhileReading);
    }

    #[test]
    fn a_directory_file_swapped_after_examination_is_refused() {
        let temp = tempfile::tempdir().unwrap();
        let (mut stream, _) = one_file(temp.path());
        fs::write(temp.path().join("b"), b"evil").unwrap();
        fs::rename(temp.path().join("b"), temp.path().join("a")).unwrap();
        let err = stream.data().map(|_| ()).unwrap_err();
        assert_eq!(err.kind, SourceErrorKind::ChangedWhileReading);
        assert_eq!(err.member.as_deref(), Some("a"));
    }

    #[test]
    fn a_directory_file_swapped_for_a_symlink_is_refused() {
        let temp = tempfile::tempdir().unwrap();
        let (mut stream, _) = one_file(temp.path());
        fs::write(temp.path().join("target"), b"abcd").unwrap();
        fs::remove_file(temp.path().join("a")).unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink("target", temp.path().join("a")).unwrap();
        let err = stream.data().map(|_| ()).unwrap_err();
        assert_eq!(err.kind, SourceErrorKind::ChangedWhileReading);
    }
}
