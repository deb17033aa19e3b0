//! Writing GKPK v1 archives for the `pack` command, and listing a source directory's artifacts.
//!
//! The archive is deterministic: `.gkmetadata` first, then the files sorted by path, each a
//! ustar regular-file header with mode `0644`, owner and group 0, empty owner names and mtime 0,
//! and no directory entries (extraction creates parents itself). A path too long for the ustar
//! name and prefix fields gets a PAX header with a single `path` record, the one extension the
//! reader honours. The archive is written to a temporary file beside `out`, fsynced, renamed over
//! `out`, and the directory fsynced, so that `out` is either the old file or the whole new one.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use guild_domain::ids::Sha256Digest;
use guild_domain::manifest::{Artifact, MAX_METADATA_BYTES};
use guild_domain::path::{ArtifactPath, RESERVED_METADATA_NAME};
use guild_ports::source::{ExtractLimits, SourceError};
use sha2::{Digest, Sha256};
use tar::{EntryType, Header};

use super::dir::{open_same, DirStream};
use super::extract::{scan, COPY_BUFFER};
use super::ustar::BLOCK;

/// Largest member a ustar size field can describe: eleven octal digits.
pub const MAX_MEMBER_BYTES: u64 = 0o777_7777_7777;

/// Why an archive could not be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PackError {
    /// Reading an input or writing the archive failed.
    #[error("could not {action} {}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The metadata is larger than any host reads.
    #[error(".gkmetadata is {size} bytes; the limit is {limit}")]
    MetadataTooLarge { size: usize, limit: usize },
    /// The same artifact path twice.
    #[error("artifact {path} is listed twice")]
    DuplicatePath { path: ArtifactPath },
    /// Two artifact paths equal once ASCII case is folded.
    #[error("artifact {path} collides with {other} on a case-insensitive file system")]
    CaseCollision {
        path: ArtifactPath,
        other: ArtifactPath,
    },
    /// An artifact path that passes through another artifact, as if that file were a directory.
    #[error("artifact {path} would need artifact {other} to be a directory")]
    PathConflict {
        path: ArtifactPath,
        other: ArtifactPath,
    },
    /// An input that is a symbolic link, a directory or another non-file.
    #[error("{} (for artifact {path}) is not a regular file", source_path.display())]
    NotARegularFile {
        path: ArtifactPath,
        source_path: PathBuf,
    },
    /// An input larger than a ustar member can hold.
    #[error("{} is {size} bytes; an archive member holds at most {MAX_MEMBER_BYTES}", source_path.display())]
    TooLarge { source_path: PathBuf, size: u64 },
    /// An input that changed size while it was being archived.
    #[error("{} changed while it was being archived", source_path.display())]
    Changed { source_path: PathBuf },
}

/// Writes a GKPK v1 archive at `out` holding `metadata_json` as `.gkmetadata` and each
/// `(artifact path, file on disk)` pair, and returns the artifacts as written (sorted by path,
/// with the size and SHA-256 of the bytes that went into the archive), so that the caller can
/// check them against the manifest it signed.
pub fn write_gkpk(
    out: &Path,
    metadata_json: &[u8],
    files: &[(ArtifactPath, PathBuf)],
) -> Result<Vec<Artifact>, PackError> {
    if metadata_json.len() > MAX_METADATA_BYTES {
        return Err(PackError::MetadataTooLarge {
            size: metadata_json.len(),
            limit: MAX_METADATA_BYTES,
        });
    }
    let files = sorted_unique(files)?;
    let temp = TempFile::create(out)?;
    let written = write_members(&temp, metadata_json, &files)?;
    temp.commit(out)?;
    Ok(written)
}

/// Lists the regular files under `dir` as artifacts (relative path, size, SHA-256), sorted by
/// path, under the rules extraction applies: no links or special files, valid and
/// non-colliding paths, the default caps. A `.gkmetadata` at the root is not an artifact and is
/// left out.
pub fn scan_artifacts(dir: &Path) -> Result<Vec<Artifact>, SourceError> {
    let limits = ExtractLimits::default();
    let mut stream = DirStream::new(dir, dir, limits.max_entries);
    scan(&mut stream, limits)
}

/// Sorts the inputs by path and refuses duplicates, case collisions and a file used as a
/// directory, all of which extraction would refuse.
fn sorted_unique(
    files: &[(ArtifactPath, PathBuf)],
) -> Result<Vec<(&ArtifactPath, &PathBuf)>, PackError> {
    let mut sorted: Vec<_> = files.iter().map(|(a, p)| (a, p)).collect();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    let mut folded: BTreeMap<String, &ArtifactPath> = BTreeMap::new();
    for (path, _) in &sorted {
        if let Some(other) = folded.insert(path.collision_key(), path) {
            return Err(if other == *path {
                PackError::DuplicatePath {
                    path: (*path).clone(),
                }
            } else {
                PackError::CaseCollision {
                    path: (*path).clone(),
                    other: other.clone(),
                }
            });
        }
    }
    for (path, _) in &sorted {
        let key = path.collision_key();
        let mut prefix = String::new();
        for component in key.split('/') {
            if let Some(other) = folded.get(&prefix) {
                return Err(PackError::PathConflict {
                    path: (*path).clone(),
                    other: (*other).clone(),
                });
            }
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(component);
        }
    }
    Ok(sorted)
}

fn write_members(
    temp: &TempFile,
    metadata: &[u8],
    files: &[(&ArtifactPath, &PathBuf)],
) -> Result<Vec<Artifact>, PackError> {
    let io_err = |action, e| PackError::Io {
        action,
        path: temp.path.clone(),
        source: e,
    };
    let mut w = BufWriter::with_capacity(COPY_BUFFER, &temp.file);
    let header = member_header(RESERVED_METADATA_NAME, metadata.len() as u64, &mut w)
        .map_err(|e| io_err("write the archive", e))?;
    w.write_all(header.as_bytes())
        .and_then(|()| w.write_all(metadata))
        .and_then(|()| pad(&mut w, metadata.len() as u64))
        .map_err(|e| io_err("write the archive", e))?;
    let mut buf = vec![0u8; COPY_BUFFER];
    let mut written = Vec::with_capacity(files.len());
    for (path, source_path) in files {
        let (file, size) = open_input(path, source_path)?;
        let header = member_header(path.as_str(), size, &mut w)
            .map_err(|e| io_err("write the archive", e))?;
        w.write_all(header.as_bytes())
            .map_err(|e| io_err("write the archive", e))?;
        let sha256 = copy_input(file, size, source_path, &mut buf, &mut w, temp)?;
        pad(&mut w, size).map_err(|e| io_err("write the archive", e))?;
        written.push(Artifact {
            path: (*path).clone(),
            size,
            sha256,
        });
    }
    w.write_all(&[0u8; 2 * BLOCK])
        .and_then(|()| w.flush())
        .map_err(|e| io_err("write the archive", e))?;
    Ok(written)
}

/// Opens an input, which must be a regular file reached through no symbolic link.
fn open_input(path: &ArtifactPath, source_path: &Path) -> Result<(File, u64), PackError> {
    let io_err = |e| PackError::Io {
        action: "read",
        path: source_path.to_path_buf(),
        source: e,
    };
    let metadata = fs::symlink_metadata(source_path).map_err(io_err)?;
    if !metadata.is_file() {
        return Err(PackError::NotARegularFile {
            path: path.clone(),
            source_path: source_path.to_path_buf(),
        });
    }
    if metadata.len() > MAX_MEMBER_BYTES {
        return Err(PackError::TooLarge {
            source_path: source_path.to_path_buf(),
            size: metadata.len(),
        });
    }
    let file = open_same(source_path, &metadata).map_err(|_| PackError::Changed {
        source_path: source_path.to_path_buf(),
    })?;
    Ok((file, metadata.len()))
}

/// Copies exactly `size` bytes of an input into the archive, hashing them.
fn copy_input(
    file: File,
    size: u64,
    source_path: &Path,
    buf: &mut [u8],
    w: &mut impl Write,
    temp: &TempFile,
) -> Result<Sha256Digest, PackError> {
    let changed = || PackError::Changed {
        source_path: source_path.to_path_buf(),
    };
    let mut reader = file.take(size.saturating_add(1));
    let mut hasher = Sha256::new();
    let mut total = 0u64;
    loop {
        let n = match reader.read(buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(PackError::Io {
                    action: "read",
                    path: source_path.to_path_buf(),
                    source: e,
                })
            }
        };
        total += n as u64;
        if total > size {
            return Err(changed());
        }
        let bytes = &buf[..n];
        hasher.update(bytes);
        w.write_all(bytes).map_err(|e| PackError::Io {
            action: "write the archive",
            path: temp.path.clone(),
            source: e,
        })?;
    }
    if total != size {
        return Err(changed());
    }
    Ok(Sha256Digest(hasher.finalize().into()))
}

/// The header of a regular-file member, written after a PAX header carrying the path when the
/// path does not fit the ustar fields.
fn member_header(path: &str, size: u64, w: &mut impl Write) -> io::Result<Header> {
    let mut header = fixed_header(EntryType::Regular, size);
    if header.set_path(path).is_err() {
        let record = pax_record("path", path);
        let mut pax = fixed_header(EntryType::XHeader, record.len() as u64);
        pax.set_path("PaxHeader")?;
        pax.set_cksum();
        w.write_all(pax.as_bytes())?;
        w.write_all(&record)?;
        pad(w, record.len() as u64)?;
        // Readers that do not know PAX see the last component, which always fits.
        let last = path.rsplit('/').next().unwrap_or(path);
        header.set_path(last)?;
    }
    header.set_cksum();
    Ok(header)
}

fn fixed_header(entry_type: EntryType, size: u64) -> Header {
    let mut header = Header::new_ustar();
    header.set_entry_type(entry_type);
    header.set_size(size);
    header.set_mode(0o644);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header
}

/// One PAX record, `"<len> <key>=<value>\n"`, where `<len>` counts the whole record, itself
/// included.
fn pax_record(key: &str, value: &str) -> Vec<u8> {
    let body = key.len() + value.len() + 3; // space, '=', newline
    let mut len = body + 1;
    while len != body + len.to_string().len() {
        len = body + len.to_string().len();
    }
    format!("{len} {key}={value}\n").into_bytes()
}

fn pad(w: &mut impl Write, size: u64) -> io::Result<()> {
    let rem = (size % BLOCK as u64) as usize;
    if rem == 0 {
        return Ok(());
    }
    w.write_all(&[0u8; BLOCK][rem..])
}

/// A temporary file beside the output, removed unless committed.
#[derive(Debug)]
struct TempFile {
    path: PathBuf,
    file: File,
    committed: bool,
}

impl TempFile {
    fn create(out: &Path) -> Result<Self, PackError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let dir = parent_dir(out);
        let name = out
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!(".{name}.{}.{n}.tmp", std::process::id()));
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| PackError::Io {
                action: "create",
                path: path.clone(),
                source: e,
            })?;
        Ok(TempFile {
            path,
            file,
            committed: false,
        })
    }

    fn commit(mut self, out: &Path) -> Result<(), PackError> {
        let io_err = |action, path: &Path, e| PackError::Io {
            action,
            path: path.to_path_buf(),
            source: e,
        };
        self.file
            .sync_all()
            .map_err(|e| io_err("fsync", &self.path, e))?;
        fs::rename(&self.path, out).map_err(|e| io_err("rename the archive to", out, e))?;
        self.committed = true;
        sync_parent(out).map_err(|e| io_err("fsync the directory of", out, e))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.committed {
            // Best effort: the error being returned matters more.
            let _ = fs::remove_file(&self.path);
        }
    }
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

fn sync_parent(path: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        File::open(parent_dir(path))?.sync_all()
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pax_record_length_counts_itself() {
        assert_eq!(pax_record("path", "a"), b"9 path=a\n");
        for n in 0..2000 {
            let r = pax_record("path", &"x".repeat(n));
            let text = String::from_utf8(r.clone()).unwrap();
            let (len, rest) = text.split_once(' ').unwrap();
            assert_eq!(len.parse::<usize>().unwrap(), r.len(), "value of {n} bytes");
            assert_eq!(rest, format!("path={}\n", "x".repeat(n)));
        }
    }
}
