//! The registry on disk: a checkpoint (`registry.json`) and the log of the commits after it
//! (`registry.log`).
//!
//! The checkpoint is a whole [`StoreState`] in format 2 (a format-1 file is a store written
//! before the log existed: the whole state, no log). The log starts with a header naming its
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
use guild_domain::store_state::{
    ApplyError, StoreState, StoreStateDecodeError, REGISTRY_FORMAT_V2,
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
    /// The checkpoint's format: 1 (no log yet) or 2.
    pub(crate) format: u64,
    pub(crate) checkpoint_len: u64,
    /// Where the last complete frame ends (0 without a log).
    pub(crate) log_len: u64,
    /// A compaction renamed a file but the fsync of the store directory that makes the rename
    /// durable failed: the next commit fsyncs it before appending.
    pub(crate) dir_unsynced: bool,
}

impl DiskInfo {
    /// Whether the log has grown past the checkpoint (and the floor), so that rewriting the
    /// checkpoint costs at most what the commits since the last one wrote.
    pub(crate) fn wants_compaction(&self, over: Option<u64>) -> bool {
        let frames = self.log_len.saturating_sub(HEADER_LEN);
        self.format == REGISTRY_FORMAT_V2
            && frames > 0
            && frames > over.unwrap_or(self.checkpoint_len.max(MIN_COMPACT_LEN))
    }
}

/// The committed registry as read from disk.
pub(crate) struct OnDisk {
    pub(crate) registry: StoreState,
    pub(crate) info: DiskInfo,
    /// The length of the log file, when it holds an uncommitted tail after `info.log_len`.
    pub(crate) torn_len: Option<u64>,
    /// A log beside a format-1 checkpoint: left by a migration that did not finish.
    pub(crate) stray_log: bool,
}

/// Reads the checkpoint and the log, or `None` when there is no checkpoint.
pub(crate) fn read(layout: &StoreLayout) -> Result<Option<OnDisk>, StoreError> {
    read_for(layout, None)
}

/// [`read`], keeping only package `only` when it is given: every other package's record, in
/// the checkpoint and in each frame, is passed over without being built
/// ([`StoreState::from_any_json_only`] says what that leaves unchecked). Every frame's checksum
/// and generation is checked as [`read`] checks them.
pub(crate) fn read_for(
    layout: &StoreLayout,
    only: Option<&PackageId>,
) -> Result<Option<OnDisk>, StoreError> {
    let path = &layout.registry;
    let Some(bytes) = read_store_file("read registry", path, MAX_REGISTRY_BYTES)? else {
        return Ok(None);
    };
    let decoded = match only {
        None => StoreState::from_any_json(&bytes),
        Some(only) => StoreState::from_any_json_only(&bytes, only),
    };
    let (checkpoint, format) = decoded.map_err(|e| {
        let kind = match e {
            StoreStateDecodeError::UnsupportedFormat { .. } => StoreErrorKind::UnsupportedFormat,
            _ => StoreErrorKind::Corrupt,
        };
        StoreError::new(kind, "decode registry")
            .at(path.clone())
            .caused_by(e)
    })?;
    let checkpoint_len = bytes.len() as u64;
    let log = read_store_file("read registry log", &layout.log, MAX_REGISTRY_BYTES)?;
    if format != REGISTRY_FORMAT_V2 {
        return Ok(Some(OnDisk {
            registry: checkpoint,
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
            "the registry is a checkpoint (format 2) but its log is missing",
        )
        .at(layout.log.clone()));
    };
    let mut registry = checkpoint;
    let (valid, torn) = replay(layout, &log, &mut registry, only)?;
    Ok(Some(OnDisk {
        registry,
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

/// Applies the frames of `log` above `state`'s generation to it. Answers where the last complete
/// frame ends and whether an uncommitted tail (a torn append, as the module says) follows.
fn replay(
    layout: &StoreLayout,
    log: &[u8],
    state: &mut StoreState,
    only: Option<&PackageId>,
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
    let from = state.generation();
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
        if delta.generation > state.generation() {
            state
                .apply(&delta)
                .map_err(|e| corrupt(offset, LogProblem::Apply(e)))?;
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
