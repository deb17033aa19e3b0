//! The registry on disk: a checkpoint (`registry.json`) and the log of the commits after it
//! (`registry.log`).
//!
//! The checkpoint is a whole [`StoreState`] in format 3, with the index of its packages that a
//! listing and a reader of one package read instead of its records (format 2, the same without
//! the index, is read too; a format-1 file is a store written before the log existed: the whole
//! state, no log). The log starts with a header naming its
//! *base* generation (the checkpoint's when the log was started) and holds one frame per commit:
//!
//! ```text
//! header  "GKRLOG\0\x01"  base generation (u64 LE)  SHA-256 of the 16 bytes before it
//! frame   length n (u32 LE)  SHA-256 of (length ++ payload)  payload: n bytes of StoreStateDelta JSON
//! ```
//!
//! Frames follow each other without gaps, generation base + 1, base + 2, ... The state is the
//! checkpoint with every frame above its generation applied; frames at or below it are already
//! in the checkpoint (a compaction that replaced the checkpoint but not yet the log) and are
//! skipped. The log's base may not be above the checkpoint's generation: frames would be
//! missing.
//!
//! The end of the log is where a commit in flight writes, and nowhere else: the commit's journal
//! record is durable before its frame is appended and is removed only after the frame's
//! fdatasync. So a frame that cannot be read (shorter than its length says, failing its
//! checksum, or a tail of zero bytes that a file system may leave after a power loss) is taken
//! for a torn append, a commit that did not happen, only when both hold:
//!
//! - nothing after it could be a frame: no later offset starts a complete frame whose checksum
//!   holds (a damaged length would otherwise hide every frame after it; the search hashes at
//!   most about twice the log's length, and a log it cannot finish is not read), and
//! - the journal holds the record of the commit from the last good frame's generation, the one
//!   whose append was in flight.
//!
//! Readers then ignore the tail and a writer's recovery cuts it off. Anything else is damage the
//! store cannot account for: reading fails closed with [`StoreErrorKind::Corrupt`], the log's
//! path and a [`LogCorruption`] naming the byte offset, and nothing is cut or deleted.

use std::ops::Range;

use guild_domain::ids::{PackageId, Sha256Digest};
use guild_domain::store_log::StoreStateDelta;
use guild_domain::store_state::listing::Listing;
use guild_domain::store_state::{
    ApplyError, StoreState, StoreStateDecodeError, REGISTRY_FORMAT_V1,
};
use guild_ports::store::{StoreError, StoreErrorKind};

use super::durable::{read_store_file, Run};
use super::journal::{self, Intent};
use super::{StoreLayout, MAX_RECORD_BYTES, MAX_REGISTRY_BYTES};

/// Why the registry log cannot be read in full: where, and what is wrong there. It is the cause
/// of the [`StoreErrorKind::Corrupt`] error a reader or writer then fails with, whose path names
/// the log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("at byte offset {offset}: {problem}")]
pub struct LogCorruption {
    /// The byte offset of the header (0) or of the frame that cannot be accounted for.
    pub offset: u64,
    pub problem: LogProblem,
}

/// What is wrong at a [`LogCorruption`]'s offset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LogProblem {
    #[error("not a registry log header")]
    NotAHeader,
    #[error("the header fails its checksum")]
    HeaderChecksum,
    #[error("the log starts at generation {base}, after the checkpoint's {checkpoint}")]
    BaseAfterCheckpoint { base: u64, checkpoint: u64 },
    /// A frame that runs past the end of the file or fails its checksum, with a good frame after
    /// it: not a torn append, which only ever leaves the end of the file bad.
    #[error(
        "a frame runs past the end of the file or fails its checksum, and a complete frame \
         follows it at byte offset {next}"
    )]
    DamagedBeforeFrame { next: u64 },
    /// A bad frame followed by more bytes than the search for frames after it may check.
    #[error(
        "a frame runs past the end of the file or fails its checksum, and the {len} bytes from \
         it to the end cannot be checked for complete frames at a bounded cost"
    )]
    DamagedBeforeUnchecked { len: u64 },
    /// A bad last frame with no commit in flight to explain it: a committed frame damaged.
    #[error(
        "the last frame runs past the end of the file or fails its checksum, and no journal \
         record says that the commit to generation {generation} was in flight, so it is not a \
         torn append"
    )]
    DamagedWithoutCommitInFlight { generation: u64 },
    #[error("the frame does not decode: {0}")]
    Decode(StoreStateDecodeError),
    #[error("the frame is for generation {found}, not {expected}")]
    WrongGeneration { found: u64, expected: u64 },
    #[error("the frame does not apply: {0}")]
    Apply(ApplyError),
}

const MAGIC: &[u8; 8] = b"GKRLOG\0\x01";
/// The length of the log's header.
pub(crate) const HEADER_LEN: u64 = 48;
/// The bytes in front of each frame's payload: length and checksum.
const FRAME_OVERHEAD: usize = 36;
/// A log shorter than this is never compacted, whatever the checkpoint's size: compacting a small
/// store often would cost more fsyncs than it saves bytes.
pub(crate) const MIN_COMPACT_LEN: u64 = 64 * 1024;
/// The log is compacted once its frames outgrow this fraction of the checkpoint (and
/// [`MIN_COMPACT_LEN`]): a reader of the whole store decodes every frame, while a listing or a
/// reader of one package reads the checkpoint's index, so the log bounds what they cost. A
/// compaction then writes at most this many bytes of checkpoint per byte of frames.
pub(crate) const COMPACT_RATIO: u64 = 16;

/// The log's header for base generation `base`.
pub(crate) fn header(base: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN as usize);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&base.to_le_bytes());
    let digest = Sha256Digest::of(&out);
    out.extend_from_slice(&digest.0);
    out
}

/// The checksum of a frame: SHA-256 over its length field and its payload.
fn frame_digest(len: &[u8], payload: &[u8]) -> [u8; 32] {
    use sha2::Digest as _;
    let mut hasher = sha2::Sha256::new();
    hasher.update(len);
    hasher.update(payload);
    hasher.finalize().into()
}

/// Creates the log, empty and based at generation `base`, atomically and durably (four steps).
pub(crate) fn create(layout: &StoreLayout, run: &mut Run, base: u64) -> Result<(), StoreError> {
    run.atomic_write(
        [
            "write new registry log",
            "fsync new registry log",
            "rename new registry log",
            "fsync store directory",
        ],
        &layout.log_tmp,
        &layout.log,
        &header(base),
    )
}

/// One frame holding `delta`.
pub(crate) fn frame(delta: &StoreStateDelta) -> Vec<u8> {
    let payload = delta.to_json();
    let len = u32::try_from(payload.len())
        .unwrap_or(u32::MAX)
        .to_le_bytes();
    let mut out = Vec::with_capacity(FRAME_OVERHEAD + payload.len());
    out.extend_from_slice(&len);
    out.extend_from_slice(&frame_digest(&len, &payload));
    out.extend_from_slice(&payload);
    out
}

/// The sizes a writer keeps to append and to decide on compaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DiskInfo {
    /// The checkpoint's format: 1 (no log yet), 2 or 3.
    pub(crate) format: u64,
    pub(crate) checkpoint_len: u64,
    /// Where the last complete frame ends (0 without a log).
    pub(crate) log_len: u64,
    /// A compaction renamed a file but the fsync of the store directory that makes the rename
    /// durable failed: the next commit fsyncs it before appending.
    pub(crate) dir_unsynced: bool,
}

impl DiskInfo {
    /// Whether the log has grown past a [`COMPACT_RATIO`]th of the checkpoint (and the floor),
    /// so that rewriting the checkpoint costs at most that many times what the commits since
    /// the last one wrote.
    pub(crate) fn wants_compaction(&self, over: Option<u64>) -> bool {
        let frames = self.log_len.saturating_sub(HEADER_LEN);
        let threshold = (self.checkpoint_len / COMPACT_RATIO).max(MIN_COMPACT_LEN);
        self.format != REGISTRY_FORMAT_V1 && frames > 0 && frames > over.unwrap_or(threshold)
    }
}

/// What of the registry a read builds.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Part<'a> {
    /// The whole state.
    Whole,
    /// The store-wide facts and this package's record alone.
    Package(&'a PackageId),
    /// The store-wide facts and the [`Listing`], from a checkpoint's index where it has one.
    Listing,
}

/// The committed registry as read from disk.
pub(crate) struct OnDisk {
    /// The whole state; with [`Part::Package`] the facts and that package; with
    /// [`Part::Listing`] the facts alone.
    pub(crate) registry: StoreState,
    /// With [`Part::Listing`], the listing of the state.
    pub(crate) listing: Option<Listing>,
    pub(crate) info: DiskInfo,
    /// The length of the log file, when it holds an uncommitted tail after `info.log_len`.
    pub(crate) torn_len: Option<u64>,
    /// A log beside a format-1 checkpoint: left by a migration that did not finish.
    pub(crate) stray_log: bool,
}

/// Reads the checkpoint and the log, or `None` when there is no checkpoint.
pub(crate) fn read(layout: &StoreLayout) -> Result<Option<OnDisk>, StoreError> {
    read_for(layout, Part::Whole)
}

/// [`read`], building `part` of the registry. For a package, every other package's record, in
/// the checkpoint and in each frame, is passed over without being built
/// ([`StoreState::from_any_json_only`] says what that leaves unchecked). For a listing, a
/// checkpoint with an index is read up to its index ([`Listing::from_checkpoint`]) and each
/// frame's packages make their rows again. Every frame's checksum and generation is checked as
/// [`read`] checks them.
pub(crate) fn read_for(layout: &StoreLayout, part: Part<'_>) -> Result<Option<OnDisk>, StoreError> {
    let path = &layout.registry;
    let (checkpoint, format, mut listing, checkpoint_len) = match read_indexed(path, part) {
        Some(read) => read,
        None => {
            let Some(bytes) = read_store_file("read registry", path, MAX_REGISTRY_BYTES)? else {
                return Ok(None);
            };
            let (state, format, listing) = decode_whole(&bytes, part).map_err(|e| {
                let kind = match e {
                    StoreStateDecodeError::UnsupportedFormat { .. } => {
                        StoreErrorKind::UnsupportedFormat
                    }
                    _ => StoreErrorKind::Corrupt,
                };
                StoreError::new(kind, "decode registry")
                    .at(path.clone())
                    .caused_by(e)
            })?;
            (state, format, listing, bytes.len() as u64)
        }
    };
    let log = read_store_file("read registry log", &layout.log, MAX_REGISTRY_BYTES)?;
    if format == REGISTRY_FORMAT_V1 {
        let (registry, listing) = listed(checkpoint, part);
        return Ok(Some(OnDisk {
            registry,
            listing,
            info: DiskInfo {
                format,
                checkpoint_len,
                log_len: 0,
                dir_unsynced: false,
            },
            torn_len: None,
            stray_log: log.is_some(),
        }));
    }
    let Some(log) = log else {
        return Err(StoreError::new(
            StoreErrorKind::Corrupt,
            "the registry is a checkpoint (format 2 or 3) but its log is missing",
        )
        .at(layout.log.clone()));
    };
    let mut registry = checkpoint;
    let (valid, torn) = match &mut listing {
        Some(listing) => replay(layout, &log, listing.generation(), None, &mut |d| {
            listing.apply(d)
        })?,
        None => {
            let only = match part {
                Part::Package(only) => Some(only),
                _ => None,
            };
            replay(layout, &log, registry.generation(), only, &mut |d| {
                registry.apply(d)
            })?
        }
    };
    let (registry, listing) = match listing {
        Some(listing) => (listing.facts().clone(), Some(listing)),
        None => listed(registry, part),
    };
    Ok(Some(OnDisk {
        registry,
        listing,
        info: DiskInfo {
            format,
            checkpoint_len,
            log_len: valid,
            dir_unsynced: false,
        },
        torn_len: torn.then_some(log.len() as u64),
        stray_log: false,
    }))
}

/// A checkpoint at least this long is read in parts when it has an index: its first bytes,
/// which say how long its head and index are, then the rest of those, its last two bytes and
/// then no record (a listing), one package's record (a reader of that package), or every
/// record, a run of them at a time into one buffer (a reader of the whole state).
const PARTS_OVER: u64 = 128 << 10;
/// How many bytes the read in parts starts with.
const PREFIX: u64 = 64 << 10;

/// How many times a checkpoint was read in parts ([`read_indexed`]), for tests that a large store
/// is not read whole.
static READ_IN_PARTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many times a checkpoint has been read in parts (its head and index, then none, one or
/// every one of its records; a small one is read whole) in this process.
pub fn reads_in_parts() -> u64 {
    READ_IN_PARTS.load(std::sync::atomic::Ordering::Relaxed)
}

/// `part` of a format-3 checkpoint at `path`, read in parts ([`PARTS_OVER`]): the state, its
/// format, the listing and the file's length. For the whole state, the head and the index,
/// then the records a run of adjoining ones at a time. `None` for a file that is missing, short
/// or of another format, and anything that does not read: the caller reads the whole file,
/// which reports what is wrong.
fn read_indexed(
    path: &std::path::Path,
    part: Part<'_>,
) -> Option<(StoreState, u64, Option<Listing>, u64)> {
    use guild_domain::store_state::listing::{index_len, CheckpointParts};
    use guild_domain::store_state::REGISTRY_FORMAT_V3;
    let file = crate::durable_file::PartialFile::open(path, MAX_REGISTRY_BYTES).ok()?;
    let len = file.len();
    if len < PARTS_OVER {
        return None;
    }
    let mut head = file.read_at(0..PREFIX).ok()?;
    let head_len = u64::try_from(index_len(&head)?).ok()?;
    if head_len > len {
        return None;
    }
    if head_len > PREFIX {
        file.append_at(PREFIX..head_len, &mut head).ok()?;
    } else {
        head.truncate(head_len as usize);
    }
    let tail = file.read_at(len - 2..len).ok()?;
    let doc_len = usize::try_from(len).ok()?;
    if let Part::Listing = part {
        // The listing keeps the head: its rows are views into it.
        let listing = Listing::from_checkpoint_head(head, doc_len, &tail)?;
        READ_IN_PARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return Some((
            listing.facts().clone(),
            REGISTRY_FORMAT_V3,
            Some(listing),
            len,
        ));
    }
    let parts = CheckpointParts {
        head: &head,
        len: doc_len,
        tail: &tail,
    };
    match part {
        Part::Package(only) => {
            let (state, format) = StoreState::from_checkpoint_parts_only(parts, only, |r| {
                file.read_at(r.start as u64..r.end as u64).ok()
            })?;
            READ_IN_PARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Some((state, format, None, len))
        }
        Part::Whole => {
            // The records a run at a time into one buffer: a checkpoint of 10,000 packages
            // read into memory of its own cost the first touch of each of its 1,300 pages,
            // about as much as decoding it.
            let (state, format) = StoreState::from_checkpoint_parts(parts, |r, buffer| {
                file.append_at(r.start as u64..r.end as u64, buffer).ok()
            })?;
            READ_IN_PARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Some((state, format, None, len))
        }
        Part::Listing => None,
    }
}

/// The whole checkpoint `bytes` decoded for `part`: the state, its format and (for a listing
/// of a checkpoint with an index) the listing.
fn decode_whole(
    bytes: &[u8],
    part: Part<'_>,
) -> Result<(StoreState, u64, Option<Listing>), StoreStateDecodeError> {
    match part {
        Part::Whole => StoreState::from_any_json(bytes).map(|(s, f)| (s, f, None)),
        Part::Package(only) => {
            StoreState::from_any_json_only(bytes, only).map(|(s, f)| (s, f, None))
        }
        Part::Listing => match Listing::from_checkpoint(bytes)? {
            Some(listing) => Ok((
                listing.facts().clone(),
                guild_domain::store_state::REGISTRY_FORMAT_V3,
                Some(listing),
            )),
            None => StoreState::from_any_json(bytes).map(|(s, f)| (s, f, None)),
        },
    }
}

/// A whole state read for `part`: for a listing, its facts and its listing.
fn listed(state: StoreState, part: Part<'_>) -> (StoreState, Option<Listing>) {
    match part {
        Part::Listing => {
            let listing = Listing::of(&state);
            (listing.facts().clone(), Some(listing))
        }
        _ => (state, None),
    }
}

/// Applies the frames of `log` above generation `from` (the checkpoint's) through `apply`, in
/// order; with `only`, each frame is decoded for that package alone. Answers where the last
/// complete frame ends and whether an uncommitted tail (a torn append, as the module says)
/// follows.
fn replay(
    layout: &StoreLayout,
    log: &[u8],
    from: u64,
    only: Option<&PackageId>,
    apply: &mut dyn FnMut(&StoreStateDelta) -> Result<(), ApplyError>,
) -> Result<(u64, bool), StoreError> {
    let corrupt = |offset: usize, problem: LogProblem| {
        StoreError::new(StoreErrorKind::Corrupt, "read registry log")
            .at(layout.log.clone())
            .caused_by(LogCorruption {
                offset: offset as u64,
                problem,
            })
    };
    let head = log
        .get(..HEADER_LEN as usize)
        .filter(|h| h.starts_with(MAGIC))
        .ok_or_else(|| corrupt(0, LogProblem::NotAHeader))?;
    let base = u64::from_le_bytes(head[8..16].try_into().unwrap_or_default());
    if head[16..] != Sha256Digest::of(&head[..16]).0 {
        return Err(corrupt(0, LogProblem::HeaderChecksum));
    }
    if base > from {
        return Err(corrupt(
            0,
            LogProblem::BaseAfterCheckpoint {
                base,
                checkpoint: from,
            },
        ));
    }
    let mut expected = base;
    let mut offset = HEADER_LEN as usize;
    while offset < log.len() {
        let Some(payload) = frame_at(log, offset) else {
            // Incomplete, or failing its checksum: torn only if it is the last thing in the file
            // and a commit was in flight.
            match after_bad_frame(log, offset) {
                After::Nothing => {}
                After::Frame(next) => {
                    return Err(corrupt(
                        offset,
                        LogProblem::DamagedBeforeFrame { next: next as u64 },
                    ))
                }
                After::Unchecked => {
                    return Err(corrupt(
                        offset,
                        LogProblem::DamagedBeforeUnchecked {
                            len: (log.len() - offset) as u64,
                        },
                    ))
                }
            }
            if !commit_in_flight(layout, expected)? {
                return Err(corrupt(
                    offset,
                    LogProblem::DamagedWithoutCommitInFlight {
                        generation: expected.saturating_add(1),
                    },
                ));
            }
            return Ok((offset as u64, true));
        };
        let end = payload.end;
        let payload = &log[payload];
        let delta = match only {
            None => StoreStateDelta::from_json(payload),
            Some(only) => StoreStateDelta::from_json_only(payload, only),
        }
        .map_err(|e| corrupt(offset, LogProblem::Decode(e)))?;
        expected = expected.saturating_add(1);
        if delta.generation != expected {
            return Err(corrupt(
                offset,
                LogProblem::WrongGeneration {
                    found: delta.generation,
                    expected,
                },
            ));
        }
        if delta.generation > from {
            apply(&delta).map_err(|e| corrupt(offset, LogProblem::Apply(e)))?;
        }
        offset = end;
    }
    Ok((offset as u64, false))
}

/// The payload of the frame at `at`, if the frame lies wholly within `log` and its checksum
/// (over its length and payload) holds.
fn frame_at(log: &[u8], at: usize) -> Option<Range<usize>> {
    let rest = log.get(at..)?;
    let len = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize;
    let end = len
        .checked_add(FRAME_OVERHEAD)
        .filter(|&end| end <= rest.len())?;
    let holds = rest[4..FRAME_OVERHEAD] == frame_digest(&rest[..4], &rest[FRAME_OVERHEAD..end]);
    holds.then(|| at + FRAME_OVERHEAD..at + end)
}

/// What lies after a bad frame.
enum After {
    /// No offset starts a frame that lies wholly within the log with its checksum holding.
    Nothing,
    /// One does, at this offset.
    Frame(usize),
    /// Ruling frames out would hash more than [`scan_budget`] bytes.
    Unchecked,
}

/// How many payload bytes the search after a bad frame may hash, for a log of `len` bytes: a
/// bound linear in the log, so that crafted lengths cannot make the search quadratic.
fn scan_budget(len: usize) -> usize {
    len.saturating_mul(2).saturating_add(64 << 10)
}

/// Whether any offset after `bad` starts a frame that lies wholly within `log` with its checksum
/// holding. A torn append leaves none (its bytes are a prefix of one frame, or zeros); a damaged
/// length or payload in front of committed frames leaves them. Cheap in practice: at most
/// offsets the length read there runs past the end of the file, and the checksum is computed only
/// where it fits; past [`scan_budget`] the search gives up and the log is not read.
fn after_bad_frame(log: &[u8], bad: usize) -> After {
    let mut budget = scan_budget(log.len());
    for at in bad + 1..log.len() {
        let Some(len) = log
            .get(at..at + 4)
            .and_then(|l| l.try_into().ok())
            .map(|l| u32::from_le_bytes(l) as usize)
        else {
            break;
        };
        if len.saturating_add(FRAME_OVERHEAD) > log.len() - at {
            continue;
        }
        let Some(left) = budget.checked_sub(len + 4) else {
            return After::Unchecked;
        };
        budget = left;
        if frame_at(log, at).is_some() {
            return After::Frame(at);
        }
    }
    After::Nothing
}

/// Whether the journal holds the record of the commit from generation `from`: written durably
/// before that commit's frame was appended and removed only after its fdatasync, it is what
/// makes a bad end of the log a torn append rather than damage.
fn commit_in_flight(layout: &StoreLayout, from: u64) -> Result<bool, StoreError> {
    let Some(to) = from.checked_add(1) else {
        return Ok(false);
    };
    let path = journal::record_path(&layout.journal, to);
    let record = read_store_file("read journal record", &path, MAX_RECORD_BYTES)?;
    // A record that does not decode proves nothing (and stops a writer's recovery anyway).
    Ok(record
        .is_some_and(|bytes| Intent::from_json(&bytes).is_ok_and(|i| i.from_generation == from)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use guild_domain::store_state::{REGISTRY_FORMAT_V2, REGISTRY_FORMAT_V3};

    fn info(format: u64, checkpoint_len: u64, frames: u64) -> DiskInfo {
        DiskInfo {
            format,
            checkpoint_len,
            log_len: HEADER_LEN + frames,
            dir_unsynced: false,
        }
    }

    /// The log is compacted once its frames pass a sixteenth of the checkpoint, and never below
    /// 64 KiB of frames; a format-2 checkpoint is compacted as a format-3 one is (into format
    /// 3), a format-1 store never (its first write migrates it instead).
    #[test]
    fn the_log_is_compacted_past_a_sixteenth_of_the_checkpoint_and_the_floor() {
        let mib = 1 << 20;
        for format in [REGISTRY_FORMAT_V2, REGISTRY_FORMAT_V3] {
            assert!(!info(format, 16 * mib, mib).wants_compaction(None));
            assert!(info(format, 16 * mib, mib + 1).wants_compaction(None));
            // Below the floor, however small the checkpoint.
            assert!(!info(format, 1000, MIN_COMPACT_LEN).wants_compaction(None));
            assert!(info(format, 1000, MIN_COMPACT_LEN + 1).wants_compaction(None));
            assert!(!info(format, 1000, 0).wants_compaction(Some(0)));
            assert!(info(format, 1000, 1).wants_compaction(Some(0)));
        }
        assert!(!info(REGISTRY_FORMAT_V1, 1000, 10 * mib).wants_compaction(None));
    }
}
