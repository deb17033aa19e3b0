//! Key files: PEM on disk, private keys readable only by their owner, every write atomic.
//!
//! A key file is written to a temporary file in the same directory, synced, and then published
//! under its name in one step, so that a crash leaves either no key or a whole key, never half
//! of one. Publishing by default refuses to replace an existing file (a hard link, which fails
//! atomically if the name is taken): losing a private key by running `keygen` twice is not a
//! mistake that can be undone. On Unix a private key file is created with mode 0600 from the
//! start, so there is no moment at which it is readable by others.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use p256::elliptic_curve::zeroize::Zeroizing;

use crate::error::KeyFileError;
use crate::keys::{PublicKey, SigningKey};

/// The largest key file read. A PEM P-256 key is a few hundred bytes; the cap keeps a wrong path
/// (a disk image, `/dev/zero`) from being read into memory.
pub const MAX_KEY_FILE_BYTES: u64 = MAX_KEY_FILE_LEN as u64;

const MAX_KEY_FILE_LEN: usize = 64 * 1024;

/// Unix mode of private key files.
pub const PRIVATE_KEY_FILE_MODE: u32 = 0o600;

/// Unix mode of public key files, before the process umask.
pub const PUBLIC_KEY_FILE_MODE: u32 = 0o644;

/// How many temporary names are tried before giving up; a name is only taken if an earlier run
/// crashed between creating and publishing it.
const TEMP_ATTEMPTS: u32 = 16;

/// How a key file is published.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyFileOptions {
    /// Replace a file that already has the name (atomically, by rename). Off by default, in
    /// which case an existing file is an error and is left untouched.
    pub replace_existing: bool,
}

/// Writes `key` as PKCS#8 PEM to `path`, mode 0600 on Unix.
pub fn write_private_key(
    path: &Path,
    key: &SigningKey,
    options: &KeyFileOptions,
) -> Result<(), KeyFileError> {
    let pem = key.to_pkcs8_pem().map_err(|source| KeyFileError::Key {
        path: path.to_owned(),
        source,
    })?;
    write_atomic(path, pem.as_bytes(), PRIVATE_KEY_FILE_MODE, options)
}

/// Writes `key` as SubjectPublicKeyInfo PEM to `path`, mode 0644 (less the umask) on Unix.
pub fn write_public_key(
    path: &Path,
    key: &PublicKey,
    options: &KeyFileOptions,
) -> Result<(), KeyFileError> {
    let pem = key.to_spki_pem().map_err(|source| KeyFileError::Key {
        path: path.to_owned(),
        source,
    })?;
    write_atomic(path, pem.as_bytes(), PUBLIC_KEY_FILE_MODE, options)
}

/// Reads a private key PEM file (PKCS#8 or SEC1; see [`SigningKey::from_pem`]).
pub fn read_private_key(path: &Path) -> Result<SigningKey, KeyFileError> {
    let bytes = read_capped(path)?;
    let text = std::str::from_utf8(&bytes).map_err(|_| KeyFileError::NotText {
        path: path.to_owned(),
    })?;
    SigningKey::from_pem(text).map_err(|source| KeyFileError::Key {
        path: path.to_owned(),
        source,
    })
}

/// Reads a public key PEM file (`PUBLIC KEY`; see [`PublicKey::from_spki_pem`]).
pub fn read_public_key(path: &Path) -> Result<PublicKey, KeyFileError> {
    let bytes = read_capped(path)?;
    let text = std::str::from_utf8(&bytes).map_err(|_| KeyFileError::NotText {
        path: path.to_owned(),
    })?;
    PublicKey::from_spki_pem(text).map_err(|source| KeyFileError::Key {
        path: path.to_owned(),
        source,
    })
}

fn io_error(operation: &'static str, path: &Path) -> impl FnOnce(io::Error) -> KeyFileError {
    let path = path.to_owned();
    move |source| KeyFileError::Io {
        operation,
        path,
        source,
    }
}

/// Reads at most [`MAX_KEY_FILE_BYTES`] into a buffer that is wiped when dropped. The buffer is
/// allocated once at full size so that no reallocation leaves a copy of a private key behind.
fn read_capped(path: &Path) -> Result<Zeroizing<Vec<u8>>, KeyFileError> {
    let file = File::open(path).map_err(io_error("open", path))?;
    let too_large = |size| KeyFileError::TooLarge {
        path: path.to_owned(),
        size,
        limit: MAX_KEY_FILE_BYTES,
    };
    let size = file.metadata().map_err(io_error("inspect", path))?.len();
    if size > MAX_KEY_FILE_BYTES {
        return Err(too_large(size));
    }
    let mut bytes = Zeroizing::new(Vec::with_capacity(MAX_KEY_FILE_LEN + 1));
    file.take(MAX_KEY_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io_error("read", path))?;
    // The file may have grown since it was inspected (or be a device that reports size 0).
    let read = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    if read > MAX_KEY_FILE_BYTES {
        return Err(too_large(read));
    }
    Ok(bytes)
}

/// Distinguishes temporary names made by this process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

fn write_atomic(
    path: &Path,
    bytes: &[u8],
    mode: u32,
    options: &KeyFileOptions,
) -> Result<(), KeyFileError> {
    let Some(name) = path.file_name() else {
        return Err(KeyFileError::Io {
            operation: "name a file",
            path: path.to_owned(),
            source: io::Error::new(io::ErrorKind::InvalidInput, "the path has no file name"),
        });
    };
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    // An early, friendly refusal; the hard link below is what makes the refusal race-free.
    if !options.replace_existing && fs::symlink_metadata(path).is_ok() {
        return Err(KeyFileError::AlreadyExists {
            path: path.to_owned(),
        });
    }
    let (temp, mut file) = create_temp(&dir, &name.to_string_lossy(), mode)?;
    let result = (|| {
        file.write_all(bytes).map_err(io_error("write", &temp))?;
        file.sync_all().map_err(io_error("sync", &temp))?;
        drop(file);
        publish(&temp, path, options)?;
        sync_dir(&dir)
    })();
    if result.is_err() {
        // Best effort: the temporary file holds nothing that is not also in memory, and a
        // failure to remove it must not hide the error that matters.
        let _ = fs::remove_file(&temp);
    }
    result
}

fn create_temp(dir: &Path, name: &str, mode: u32) -> Result<(PathBuf, File), KeyFileError> {
    let mut last = None;
    for _ in 0..TEMP_ATTEMPTS {
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let temp = dir.join(format!(".{name}.{}.{n}.tmp", std::process::id()));
        let mut open = OpenOptions::new();
        open.write(true).create_new(true);
        set_mode(&mut open, mode);
        match open.open(&temp) {
            Ok(file) => return Ok((temp, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some((temp, e)),
            Err(e) => return Err(io_error("create", &temp)(e)),
        }
    }
    let (temp, source) = last.unwrap_or_else(|| {
        (
            dir.to_owned(),
            io::Error::other("no temporary name was tried"),
        )
    });
    Err(io_error("create", &temp)(source))
}

fn publish(temp: &Path, path: &Path, options: &KeyFileOptions) -> Result<(), KeyFileError> {
    if options.replace_existing {
        return fs::rename(temp, path).map_err(io_error("rename a temporary file onto", path));
    }
    match fs::hard_link(temp, path) {
        Ok(()) => fs::remove_file(temp).map_err(io_error("remove", temp)),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(KeyFileError::AlreadyExists {
            path: path.to_owned(),
        }),
        Err(e) => Err(io_error("link a temporary file to", path)(e)),
    }
}

#[cfg(unix)]
fn set_mode(open: &mut OpenOptions, mode: u32) {
    use std::os::unix::fs::OpenOptionsExt;
    open.mode(mode);
}

#[cfg(not(unix))]
fn set_mode(_open: &mut OpenOptions, _mode: u32) {
    // Other systems protect files with ACLs inherited from the directory; there is no mode to
    // set at creation.
}

/// Makes the new directory entry durable.
#[cfg(unix)]
fn sync_dir(dir: &Path) -> Result<(), KeyFileError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_error("sync directory", dir))
}

#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> Result<(), KeyFileError> {
    // Directories cannot be opened for syncing on other systems; the rename is durable once
    // the file system commits it.
    Ok(())
}
