//! What a listing of the store shows of each package ([`ListedRow`]), and the index of those
//! rows that a checkpoint of format 3 carries.
//!
//! A format-3 checkpoint ([`REGISTRY_FORMAT_V3`]) is the format-2 document with one more member
//! before its packages, `"index"`; its members come in the order guild_registry, generation,
//! trust, fleet, index, packages:
//!
//! ```text
//! "index": {"length": SIZE, "packages_end": END, "keys": [KEY, ...], "packages": [ROW, ...]}
//! SIZE    = the index's own length in bytes, from its `{` to its `}`
//! END     = the byte offset of the `]` that ends the packages (the document ends `]}` there)
//! KEY     = 64 hex digits: each signing key the rows name, once, in order of first use
//! ROW     = [ID, OFFSET, LENGTH, KIND, PUBLISHER, PREVIOUS, CURRENT, TAINTED]
//! OFFSET  = the byte offset in the file of the package's record (its `{`)
//! LENGTH  = the record's length in bytes
//! PREVIOUS = [] | [VERSION]                 the rollback target
//! CURRENT  = [] | [VERSION, STATE, [N, ...]] the current version, its state and its signing
//!                                            keys (indexes into KEY; [] where the record
//!                                            names none, as in stores that predate them)
//! TAINTED  = [[VERSION, REASON] | [VERSION, REASON, FILE], ...]  every tainted version, with
//!                                            the file concerned where one is known
//! ```
//!
//! One row per package, in the order of the packages, which is id order. The numbers `SIZE`,
//! `END`, `OFFSET` and `LENGTH` are written as ten characters (right-aligned in spaces, which
//! JSON allows), so that the writer knows the index's length before it writes the records.
//!
//! The full reader of a checkpoint holds the index to the records: every row must be exactly the
//! row of the record at its byte range (`ListedRow::matches`), the index as long as it says and
//! the packages ending where it says, or the checkpoint is refused as corrupt. A listing
//! ([`Listing::from_checkpoint`]) reads the head and the index alone and answers from the rows
//! without holding them to the records; a reader of one package reads the head, its own row and
//! the one record the row points at, held to each other. Both check the index's length and the
//! document's end against what the index says, so that a file cut short, grown, or rearranged
//! around the index is refused; damage that keeps every length (another package's row or record
//! garbled in place, or, for a listing, a row changed in place) is found by the next full reader
//! (every writer's open is one), not by them.
//!
//! A listing read from an index keeps the index's text and where each row's cells are in it,
//! so that reading 10,000 rows makes no string: [`Listing::rows`] answers views into it. A row
//! laid out as every writer lays it out (no whitespace but the numbers' padding, no taint) is
//! read byte by byte; any other row is read with the JSON cursor, which reads or refuses it,
//! so that what is accepted and refused does not depend on the way a row was read.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use super::bytes::Bytes;
use super::{
    decode_fleet, decode_trust, field, in_writer_order, once, read_package, At, FieldProblem,
    PackageRecord, StoreState, StoreStateDecodeError, Taint, VersionRecord, REGISTRY_FORMAT_V3,
};
use crate::ids::{is_valid_id, PackageId, PackageKind, PublisherId, Sha256Digest};
use crate::json::{self, Cursor};
use crate::lifecycle::State;
use crate::version::Version;

/// The width of an index row's offset and length fields, in characters.
const NUMBER_WIDTH: usize = 10;
/// The largest offset or length the index can record; a larger checkpoint is written without a
/// usable index, which every reader refuses (no store comes near: the store bounds its files far
/// below this).
const NUMBER_MAX: u64 = 9_999_999_999;
/// What every writer writes between the index and the first record.
const OPEN_PACKAGES: &[u8] = b",\"packages\":[";

/// What a listing shows of one package, borrowed from the [`Listing`] it is a row of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedRow<'a> {
    /// The package's id.
    pub id: &'a str,
    /// Its kind and publisher, as its first recorded version gives them.
    pub kind: PackageKind,
    /// See `kind`.
    pub publisher: &'a str,
    /// The version a rollback restores, if any.
    pub previous: Option<Cow<'a, str>>,
    /// The current (enabled or disabled) version, if any.
    pub current: Option<ListedVersion<'a>>,
    /// Every tainted version, ascending, with why.
    pub tainted: &'a [(Version, Taint)],
}

/// The current version of a package as a listing shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedVersion<'a> {
    /// The version.
    pub version: Cow<'a, str>,
    /// Enabled or disabled.
    pub state: State,
    /// Whether it is tainted.
    pub tainted: bool,
    /// The keys that signed it: those recorded when it was installed, then those of signatures
    /// added later, each once. `None` when the record names none (a version installed before
    /// the store recorded them): its installed metadata says. Rows that name the same keys
    /// share one list.
    pub keys: Option<&'a [Sha256Digest]>,
}

impl ListedRow<'_> {
    /// Whether this is the row of package `id` with record `record`: the full reader holds every
    /// row of an index to its record, and a reader of one package its one row.
    pub(crate) fn matches(&self, id: &PackageId, record: &PackageRecord) -> bool {
        let Some((_, first)) = record.versions().next() else {
            return false;
        };
        let current_matches = match (&self.current, record.current()) {
            (None, None) => true,
            (Some(c), Some((version, r))) => {
                version_is(version, &c.version)
                    && c.state == r.state
                    && c.tainted == r.taint.is_some()
                    && match c.keys {
                        // Without a later signature, the keys are those recorded: no copy.
                        Some(keys) if r.signatures.is_empty() => *keys == *r.signed_by,
                        keys => keys == listed_keys(r).as_deref(),
                    }
            }
            _ => false,
        };
        let previous_matches = match (&self.previous, record.previous()) {
            (None, None) => true,
            (Some(text), Some(version)) => version_is(version, text),
            _ => false,
        };
        self.id == id.as_str()
            && self.kind == first.kind
            && self.publisher == first.publisher.as_str()
            && previous_matches
            && current_matches
            && self.tainted.iter().map(|(v, q)| (v, q)).eq(record
                .versions()
                .filter_map(|(v, r)| Some((v, r.taint.as_ref()?))))
    }
}

/// Whether `version` is written exactly `text` ([`displays_as`]). A version with no pre-release
/// or build part, which nearly every record holds, is written `MAJOR.MINOR.PATCH`: where the text
/// is such a version ([`plain_numbers`]), its three numbers are compared with the version's
/// without formatting (a tenth of what the full reader of a 10,000-package checkpoint spent
/// holding its index to the records went into formatting).
fn version_is(version: &Version, text: &str) -> bool {
    if !version.pre.is_empty() || !version.build.is_empty() {
        return displays_as(version, text);
    }
    match plain_numbers(text) {
        Some(numbers) => numbers == [version.major, version.minor, version.patch],
        // Anything else (a number of 20 digits included) is rare enough to format.
        None => displays_as(version, text),
    }
}

/// Whether `value` displays as exactly `text`, without making the text.
fn displays_as(value: &impl fmt::Display, text: &str) -> bool {
    struct Rest<'t>(&'t str);
    impl fmt::Write for Rest<'_> {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            self.0 = self.0.strip_prefix(s).ok_or(fmt::Error)?;
            Ok(())
        }
    }
    let mut rest = Rest(text);
    fmt::write(&mut rest, format_args!("{value}")).is_ok() && rest.0.is_empty()
}

/// A package's row made from its record ([`ListingRow::of`]): what a writer writes into the
/// index, and what a listing holds for the packages a log frame changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ListingRow {
    id: PackageId,
    kind: PackageKind,
    publisher: PublisherId,
    previous: Option<Version>,
    current: Option<MadeVersion>,
    tainted: Vec<(Version, Taint)>,
}

/// [`ListedVersion`] made from a record.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MadeVersion {
    version: Version,
    state: State,
    tainted: bool,
    keys: Option<Arc<[Sha256Digest]>>,
}

impl ListingRow {
    /// The row of package `id`; `None` for a record without versions (which the store state's
    /// invariants never let through).
    pub(crate) fn of(id: &PackageId, record: &PackageRecord) -> Option<Self> {
        let (_, first) = record.versions().next()?;
        let current = record.current().map(|(version, r)| MadeVersion {
            version: version.clone(),
            state: r.state,
            tainted: r.taint.is_some(),
            keys: listed_keys(r).map(Arc::from),
        });
        Some(ListingRow {
            id: id.clone(),
            kind: first.kind,
            publisher: first.publisher.clone(),
            previous: record.previous().cloned(),
            current,
            tainted: record
                .versions()
                .filter_map(|(v, r)| Some((v.clone(), r.taint.clone()?)))
                .collect(),
        })
    }

    fn view(&self) -> ListedRow<'_> {
        ListedRow {
            id: self.id.as_str(),
            kind: self.kind,
            publisher: self.publisher.as_str(),
            previous: self.previous.as_ref().map(|v| Cow::Owned(v.to_string())),
            current: self.current.as_ref().map(|c| ListedVersion {
                version: Cow::Owned(c.version.to_string()),
                state: c.state,
                tainted: c.tainted,
                keys: c.keys.as_deref(),
            }),
            tainted: &self.tainted,
        }
    }
}

/// The keys a listing shows for version record `r` ([`ListedVersion::keys`]).
fn listed_keys(r: &VersionRecord) -> Option<Vec<Sha256Digest>> {
    if r.signed_by.is_empty() {
        return None;
    }
    let mut keys = r.signed_by.clone();
    for s in &r.signatures {
        if !keys.contains(&s.key_id) {
            keys.push(s.key_id);
        }
    }
    Some(keys)
}

/// Where a cell is in the text an index was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    start: u32,
    len: u32,
}

impl Span {
    fn of(self, text: &str) -> &str {
        let start = self.start as usize;
        text.get(start..start + self.len as usize)
            .unwrap_or_default()
    }
}

/// One row as read from an index: where its cells are in the index's text. Every cell was
/// checked when it was read (an id, a publisher id and versions that parse), so that a view of
/// it is as good as a row made from a record.
#[derive(Debug, Clone)]
pub(crate) struct IndexRow {
    id: Span,
    kind: PackageKind,
    publisher: Span,
    previous: Option<Span>,
    current: Option<IndexVersion>,
    /// Taints are rare: read whole, and only where a row has them.
    tainted: Option<Box<[(Version, Taint)]>>,
}

#[derive(Debug, Clone)]
struct IndexVersion {
    version: Span,
    state: State,
    tainted: bool,
    keys: Option<Arc<[Sha256Digest]>>,
}

impl IndexRow {
    /// The row, seen in `text`, the text it was read from.
    pub(crate) fn view<'t>(&'t self, text: &'t str) -> ListedRow<'t> {
        ListedRow {
            id: self.id.of(text),
            kind: self.kind,
            publisher: self.publisher.of(text),
            previous: self.previous.map(|v| Cow::Borrowed(v.of(text))),
            current: self.current.as_ref().map(|c| ListedVersion {
                version: Cow::Borrowed(c.version.of(text)),
                state: c.state,
                tainted: c.tainted,
                keys: c.keys.as_deref(),
            }),
            tainted: self.tainted.as_deref().unwrap_or_default(),
        }
    }
}

/// A row of a listing: read from an index, or made from a record (a package a log frame
/// changed, or every package of a listing made from a whole state).
#[derive(Debug, Clone)]
pub(crate) enum Row {
    Indexed(IndexRow),
    Made(Box<ListingRow>),
}

impl Row {
    /// The row, seen in `text` (the text an indexed row was read from).
    pub(crate) fn view<'t>(&'t self, text: &'t str) -> ListedRow<'t> {
        match self {
            Row::Indexed(row) => row.view(text),
            Row::Made(row) => row.view(),
        }
    }
}

/// Every package of the committed state as a listing shows it, in id order, with the
/// store-wide facts of that state.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    /// The state's generation, trust anchor and fleet membership, and no package.
    facts: StoreState,
    /// The text of the index the rows were read from (empty for a listing made from a state).
    text: Arc<String>,
    /// Shared between copies: a listing is copied out of the handle that read it.
    rows: Arc<Vec<Row>>,
}

impl PartialEq for Listing {
    fn eq(&self, other: &Self) -> bool {
        self.facts == other.facts && self.rows().eq(other.rows())
    }
}

impl Eq for Listing {}

impl Listing {
    /// The listing of `state`.
    pub fn of(state: &StoreState) -> Self {
        Listing {
            facts: state.facts_only(),
            text: Arc::default(),
            rows: Arc::new(
                state
                    .packages()
                    .filter_map(|(id, record)| ListingRow::of(id, record))
                    .map(|row| Row::Made(Box::new(row)))
                    .collect(),
            ),
        }
    }

    /// The generation of the state listed.
    pub fn generation(&self) -> u64 {
        self.facts.generation()
    }

    /// The listed state's generation, trust anchor and fleet membership, in a state that
    /// records no package.
    pub fn facts(&self) -> &StoreState {
        &self.facts
    }

    /// How many packages are listed.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether no package is listed.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The rows, in id order.
    pub fn rows(&self) -> impl ExactSizeIterator<Item = ListedRow<'_>> + Clone + '_ {
        self.rows.iter().map(|row| self.view(row))
    }

    fn view<'s>(&'s self, row: &'s Row) -> ListedRow<'s> {
        row.view(&self.text)
    }

    fn id_of<'s>(&'s self, row: &'s Row) -> &'s str {
        match row {
            Row::Indexed(row) => row.id.of(&self.text),
            Row::Made(row) => row.id.as_str(),
        }
    }

    /// Makes the row of package `id` again from its new record, or removes it (`None`), and
    /// takes on `facts`: the change of one commit (the `store_log` module applies it).
    pub(crate) fn replace(
        &mut self,
        changes: impl Iterator<Item = (PackageId, Option<ListingRow>)>,
        facts: StoreState,
    ) {
        let mut rows = std::mem::take(&mut self.rows);
        let list = Arc::make_mut(&mut rows);
        for (id, made) in changes {
            let at = list.binary_search_by(|r| self.id_of(r).cmp(id.as_str()));
            match (at, made) {
                (Ok(i), Some(row)) => list[i] = Row::Made(Box::new(row)),
                (Err(i), Some(row)) => list.insert(i, Row::Made(Box::new(row))),
                (Ok(i), None) => {
                    list.remove(i);
                }
                (Err(_), None) => {}
            }
        }
        self.rows = rows;
        self.facts = facts.facts_only();
    }

    /// The listing a checkpoint's index gives, with the checkpoint's generation: `Ok(None)` for a
    /// checkpoint without an index (formats 1 and 2), which is listed from the whole state. Only
    /// the document's head and its index are read ([the module](self) says what that leaves
    /// unchecked). A checkpoint this refuses is read in full to name what is wrong, and answered
    /// from the whole state should that read find nothing wrong.
    pub fn from_checkpoint(bytes: &[u8]) -> Result<Option<Self>, StoreStateDecodeError> {
        let whole = CheckpointParts::whole(bytes);
        // Keep the head and index only: the records after them are not the listing's.
        let head = index_len(bytes)
            .and_then(|n| bytes.get(..n))
            .unwrap_or(bytes);
        let parts = CheckpointParts { head, ..whole };
        match Self::read_parts(parts) {
            Some(None) => return Ok(None),
            Some(Some(listing)) => return Ok(Some(listing)),
            None => {}
        }
        let (state, format) = StoreState::from_any_json(bytes)?;
        Ok((format == REGISTRY_FORMAT_V3).then(|| Listing::of(&state)))
    }

    /// [`Listing::from_checkpoint`] from the parts of a format-3 checkpoint a listing reads:
    /// `head` is [`CheckpointParts::head`] (which the listing keeps, as the text its rows are
    /// read from), `len` and `tail` the document's length and last two bytes. `None` for anything
    /// this does not read (another format included), which the caller then reads whole with
    /// [`Listing::from_checkpoint`].
    pub fn from_checkpoint_head(head: Vec<u8>, len: usize, tail: &[u8]) -> Option<Self> {
        Self::read_head(String::from_utf8(head).ok()?, len, tail)?
    }

    /// `Some(None)` for a document of another format, `None` for anything refused.
    fn read_parts(parts: CheckpointParts<'_>) -> Option<Option<Self>> {
        let text = std::str::from_utf8(parts.head).ok()?.to_owned();
        Self::read_head(text, parts.len, parts.tail)
    }

    fn read_head(text: String, len: usize, tail: &[u8]) -> Option<Option<Self>> {
        let text = Arc::new(text);
        let parts = CheckpointParts {
            head: text.as_bytes(),
            len,
            tail,
        };
        // A row takes about a hundred bytes: room for more costs address space, not memory
        // (up to a bound, past which the rows grow as they are read).
        let capacity = (text.len() / 64).min(1 << 20);
        // The records' ranges are checked as the rows are read, and not kept: a listing reads
        // no record.
        let Some(head) = IndexedHead::read(&text, parts, |_| true, capacity, Ranges::Dropped)?
        else {
            return Some(None);
        };
        let rows = head.index.rows;
        let listing = Listing {
            facts: head.facts,
            text,
            rows: Arc::new(rows),
        };
        // Strictly ascending ids, as the packages are.
        let mut ids = listing.rows.iter().map(|r| listing.id_of(r));
        let mut before = ids.next();
        for id in ids {
            if before >= Some(id) {
                return None;
            }
            before = Some(id);
        }
        Some(Some(listing))
    }
}

/// The parts of a format-3 checkpoint that a listing or a reader of one package reads, so that
/// the records they do not read are not read from the file at all.
#[derive(Debug, Clone, Copy)]
pub struct CheckpointParts<'a> {
    /// The document's first bytes: its head and its index, up to its first record
    /// ([`index_len`] says how many), or more (the whole document, say).
    pub head: &'a [u8],
    /// The document's length in bytes.
    pub len: usize,
    /// The document's last two bytes.
    pub tail: &'a [u8],
}

impl<'a> CheckpointParts<'a> {
    /// The parts of the whole document `bytes`.
    pub fn whole(bytes: &'a [u8]) -> Self {
        CheckpointParts {
            head: bytes,
            len: bytes.len(),
            tail: bytes
                .get(bytes.len().saturating_sub(2)..)
                .unwrap_or_default(),
        }
    }
}

/// How many bytes at the start of a format-3 checkpoint hold its head and its index (the offset
/// of its first record), read from `prefix`, the document's first bytes. `None` when `prefix`
/// does not tell: another format, an index without rows, a head longer than `prefix`, or
/// anything malformed (the caller reads the whole document).
pub fn index_len(prefix: &[u8]) -> Option<usize> {
    // A prefix may end inside a character.
    let valid = match std::str::from_utf8(prefix) {
        Ok(_) => prefix.len(),
        Err(e) => e.valid_up_to(),
    };
    let mut c = Cursor::new(&prefix[..valid])?;
    let mut first = None;
    let _ = c.object(|c, key| match key {
        "guild_registry" => c.u64().filter(|f| *f == REGISTRY_FORMAT_V3).map(drop),
        "generation" => c.u64().map(drop),
        "trust" | "fleet" => c.skip(),
        "index" => {
            c.object(|c, key| match key {
                "length" | "packages_end" | "keys" => c.skip(),
                "packages" => {
                    // The first row's offset, then stop.
                    let _ = c.array(|c| {
                        let mut at = 0;
                        let _ = c.array(|c| {
                            at += 1;
                            if at == 1 {
                                return c.str().map(drop);
                            }
                            first = Some(c.u64()?);
                            None
                        });
                        None
                    });
                    None
                }
                _ => None,
            });
            None
        }
        _ => None,
    });
    usize::try_from(first?).ok()
}

/// The head of a format-3 checkpoint as read: the store-wide facts and the index.
struct IndexedHead {
    facts: StoreState,
    index: Index,
}

impl IndexedHead {
    /// Reads the head and the index of the checkpoint `parts` are of, from `text`, its head as
    /// text, keeping the rows for which `keep(id)` holds (room for `capacity` of them is made
    /// at once) and, as `ranges` says, their records' byte ranges: `Some(None)` for a document
    /// of another format, `None` for anything refused.
    fn read(
        text: &str,
        parts: CheckpointParts<'_>,
        keep: impl FnMut(&str) -> bool,
        capacity: usize,
        ranges: Ranges,
    ) -> Option<Option<Self>> {
        let mut c = Cursor::of_str(text);
        let mut keep = Some(keep);
        let mut facts = Facts::default();
        let mut index = None;
        // Stops once the index is read: the packages follow it in what every writer writes.
        // A member out of the writer's order stops the read unfinished, and so refuses the
        // head ([`in_writer_order`]).
        let mut order = 0;
        let _ = c.object(|c, key| match key {
            _ if !in_writer_order(&mut order, key) => None,
            "index" => {
                let read = read_rows(c, keep.take()?, capacity, ranges)?;
                read.frames(parts).then_some(())?;
                index = Some(read);
                None
            }
            _ => facts.member(c, key),
        });
        match facts.format? {
            REGISTRY_FORMAT_V3 => Some(Some(IndexedHead {
                facts: facts.state()?,
                index: index?,
            })),
            _ => Some(None),
        }
    }
}

/// Reads package `only` of a format-3 checkpoint through its index: the store-wide facts and
/// the record the index points at, which `record` reads from the document (given its byte
/// range) and which must be `only`'s, as its row says. `None` for anything refused (another
/// format included): the caller reads the whole document to name it.
///
/// The row is found by searching the index for the text a writer writes at the start of
/// `only`'s row (`["ID",`; an id is never escaped) instead of by reading every row: that text
/// can only start a row (a quote inside a string is escaped), and what is found must read as a
/// whole row, found once. The record's range must lie among the records, the index end where
/// the records start and the document in `]}`. Where the search finds no row, every row is
/// read, so that a row damaged where the search looked is not taken for an absent package.
pub(crate) fn read_indexed_only(
    parts: CheckpointParts<'_>,
    only: &PackageId,
    record: impl FnOnce(Range<usize>) -> Option<Vec<u8>>,
) -> Option<(StoreState, Option<PackageRecord>)> {
    let text = std::str::from_utf8(parts.head).ok()?;
    if let Some(found) = find_row(text, parts, only)? {
        let row = found.row.view(found.text);
        return read_record(only, found.facts, row, record(found.range)?);
    }
    // An index without rows, no row found, text found that is not a row: every row read.
    let mut head = IndexedHead::read(text, parts, |id| id == only.as_str(), 1, Ranges::Kept)??;
    if head.index.rows.len() > 1 {
        return None;
    }
    let (Some(row), Some(range)) = (head.index.rows.pop(), head.index.kept.pop()) else {
        return Some((head.facts, None));
    };
    let bytes = record(range)?;
    read_record(only, head.facts, row.view(text), bytes)
}

/// How many bytes of records [`read_indexed_whole`] asks for at a time, at most (a record longer
/// than this is asked for alone).
pub(crate) const RECORDS_BATCH: usize = 256 << 10;

/// Every package of a format-3 checkpoint, read from its parts: the head and the index from
/// `parts`, then the records at the byte ranges the rows give, adjoining records asked for
/// together through `read`, at most `batch` bytes of them at a time (it fills the buffer it is
/// given with exactly the bytes of the range it is given), so that the records are never all
/// in memory at once. `parts` and `read` must be views of one file: the records' place is
/// checked against the parts' length and last bytes. Each record must be exactly the bytes of
/// its range, start with its `{`, be followed by the comma before the next one (the `]` after
/// the last), and be what its row says; the head, the index and where the records lie are
/// checked as for a listing ([`IndexedHead::read`]). `None` for a document of another format
/// and for anything this refuses: the caller reads the document whole, which names what is
/// wrong. Each package read is handed to `take` (which can refuse it), in the order of the
/// records.
pub(crate) fn read_indexed_whole(
    parts: CheckpointParts<'_>,
    batch: usize,
    mut read: impl FnMut(Range<usize>, &mut Vec<u8>) -> Option<()>,
    mut take: impl FnMut(PackageId, PackageRecord) -> Option<()>,
) -> Option<StoreState> {
    let text = std::str::from_utf8(parts.head).ok()?;
    let capacity = (text.len() / 64).min(1 << 20);
    let head = IndexedHead::read(text, parts, |_| true, capacity, Ranges::Kept)??;
    let Index { rows, kept, .. } = head.index;
    let mut buffer = Vec::new();
    let mut first = 0;
    while first < rows.len() {
        // Adjoining records up to the batch's size, each with the byte after it (the comma
        // before the next record, or the `]` after the last).
        let start = kept[first].start;
        let mut last = first;
        while last + 1 < rows.len() && kept[last + 1].end - start <= batch {
            last += 1;
        }
        let end = kept[last].end.checked_add(1)?;
        buffer.clear();
        read(start..end, &mut buffer)?;
        (buffer.len() == end - start).then_some(())?;
        for i in first..=last {
            let range = &kept[i];
            let bytes = buffer.get(range.start - start..range.end - start)?;
            let after = if i + 1 < rows.len() { b',' } else { b']' };
            if buffer.get(range.end - start) != Some(&after) {
                return None;
            }
            (bytes.first() == Some(&b'{')).then_some(())?;
            let mut c = Cursor::new(bytes)?;
            let (id, package) = read_package(&mut c)?;
            (c.position() == bytes.len() && rows[i].view(text).matches(&id, &package))
                .then_some(())?;
            take(id, package)?;
        }
        first = last + 1;
    }
    Some(head.facts)
}

/// The facts and package `only`'s record read from `bytes`, which its row points at: `None`
/// unless `bytes` is exactly that package's record and the row is what the record says.
fn read_record(
    only: &PackageId,
    facts: StoreState,
    row: ListedRow<'_>,
    bytes: Vec<u8>,
) -> Option<(StoreState, Option<PackageRecord>)> {
    let mut r = Cursor::new(&bytes)?;
    let (id, package) = read_package(&mut r)?;
    (r.at_end() && id == *only && row.matches(&id, &package)).then_some((facts, Some(package)))
}

/// The facts, package `only`'s row (with the text it was read from) and its record's byte
/// range, found by the text a writer writes at the start of its row ([`read_indexed_only`]):
/// `Some(None)` when the search cannot tell (every row is read then), `None` for a checkpoint
/// refused.
fn find_row<'t>(
    text: &'t str,
    parts: CheckpointParts<'_>,
    only: &PackageId,
) -> Option<Option<FoundRow<'t>>> {
    // The first record's offset: the index ends just before `,"packages":[` there.
    let Some(records) = index_len(parts.head) else {
        return Some(None);
    };
    let index_end = records.checked_sub(OPEN_PACKAGES.len())?;
    let ToRows {
        facts,
        keys,
        rows_start,
        index_end: said_end,
        packages_end: last,
    } = read_to_rows(text.get(..records)?)?;
    // The index ends where the records' `,"packages":[` starts (nothing between the two, and
    // the index as long as it says), and the document ends where the index says.
    if said_end != index_end
        || parts.head.get(index_end..records) != Some(OPEN_PACKAGES)
        || parts.tail != b"]}"
        || last.checked_add(2) != Some(parts.len)
        || last < records
    {
        return None;
    }
    let rows = text.get(rows_start..index_end)?;
    let pattern = format!("[\"{}\",", only.as_str());
    // Not found: absent, or a row damaged where the search looked; every row is read then.
    let Some(at) = rows.find(&pattern) else {
        return Some(None);
    };
    if rows[at + 1..].contains(&pattern) {
        return Some(None);
    }
    let row_text = &rows[at..];
    let mut c = Cursor::of_str(row_text);
    let Some(Ok((row, range))) = read_row(&mut c, &mut KeyLists::new(keys), &mut |_| true) else {
        return Some(None);
    };
    if row.id.of(row_text) != only.as_str() || range.start < records || range.end > last {
        return None;
    }
    Some(Some(FoundRow {
        facts,
        row,
        text: row_text,
        range,
    }))
}

/// What [`find_row`] found.
struct FoundRow<'t> {
    facts: StoreState,
    /// The row, read from `text`.
    row: IndexRow,
    text: &'t str,
    /// Its record's byte range.
    range: Range<usize>,
}

/// Reads a format-3 checkpoint's head up to the first row of its index: the store-wide facts,
/// the index's key table, the offset of the first row (just after the `[` of the index's
/// `"packages"`), and where the index says it ends and the packages end.
fn read_to_rows(text: &str) -> Option<ToRows> {
    let mut c = Cursor::of_str(text);
    let mut facts = Facts::default();
    let mut keys = None;
    let mut length = None;
    let mut index_start = None;
    let mut packages_end = None;
    let mut rows_start = None;
    let mut order = 0;
    let _ = c.object(|c, key| match key {
        _ if !in_writer_order(&mut order, key) => None,
        "index" => {
            index_start = Some(c.offset());
            let _ = c.object(|c, key| match key {
                "length" => once(&mut length, c.u64()?),
                "packages_end" => once(&mut packages_end, c.u64()?),
                "keys" => once(&mut keys, read_keys(c)?),
                "packages" => {
                    rows_start = Some(c.offset() + 1);
                    None
                }
                _ => None,
            });
            None
        }
        _ => facts.member(c, key),
    });
    if facts.format? != REGISTRY_FORMAT_V3 || text.as_bytes().get(rows_start? - 1) != Some(&b'[') {
        return None;
    }
    let packages_end = usize::try_from(packages_end?).ok()?;
    let index_end = index_start?.checked_add(usize::try_from(length?).ok()?)?;
    Some(ToRows {
        facts: facts.state()?,
        keys: keys?,
        rows_start: rows_start?,
        index_end,
        packages_end,
    })
}

/// What [`read_to_rows`] reads.
struct ToRows {
    facts: StoreState,
    keys: Vec<Sha256Digest>,
    /// Where the first row starts.
    rows_start: usize,
    /// Where the index says it ends.
    index_end: usize,
    /// Where the index says the packages end.
    packages_end: usize,
}

/// The members of a checkpoint before its index: its format and the store-wide facts.
#[derive(Default)]
struct Facts {
    format: Option<u64>,
    generation: Option<u64>,
    trust: Option<crate::trust::TrustAnchor>,
    fleet: Option<crate::fleet::FleetMembership>,
}

impl Facts {
    /// Reads member `key`: `None` for another key, a repeated one or a value refused.
    fn member(&mut self, c: &mut Cursor<'_>, key: &str) -> Option<()> {
        match key {
            "guild_registry" => once(&mut self.format, c.u64()?),
            "generation" => once(&mut self.generation, c.u64()?),
            "trust" => once(&mut self.trust, decode_trust(&c.value()?, At::Root).ok()?),
            "fleet" => once(&mut self.fleet, decode_fleet(&c.value()?, At::Root).ok()?),
            _ => None,
        }
    }

    /// The facts as a state that records no package; `None` without a generation.
    fn state(self) -> Option<StoreState> {
        Some(StoreState::facts(self.generation?, self.trust, self.fleet))
    }
}

/// An index's key table.
fn read_keys(c: &mut Cursor<'_>) -> Option<Vec<Sha256Digest>> {
    let mut list = Vec::new();
    c.array(|c| {
        list.push(Sha256Digest::parse_hex(&c.str()?).ok()?);
        Some(())
    })?;
    Some(list)
}

/// A checkpoint's index as read.
pub(crate) struct Index {
    /// The rows kept (all read from the index), in the text the cursor that read them was
    /// reading.
    pub(crate) rows: Vec<Row>,
    /// The byte range each kept row gives for its record (none when read with
    /// [`Ranges::Dropped`]).
    pub(crate) kept: Vec<Range<usize>>,
    /// Where the rows say the records are, as far as [`Index::frames`] needs to know.
    layout: Layout,
    /// The byte offset of the `]` that ends the packages, as the index records it.
    pub(crate) packages_end: usize,
    /// Where the index's value ends in the document.
    end: usize,
}

impl Index {
    /// Whether the records the index points at are laid out as a writer lays them out, right
    /// after the index: `,"packages":[`, then one record at each row's range, one byte (the
    /// comma) between two, then `]}` ending the document. A reader that does not read the
    /// records checks this, so that a truncated or extended checkpoint, or one whose index
    /// points anywhere else, is refused; it cannot see damage inside a record it does not read.
    fn frames(&self, parts: CheckpointParts<'_>) -> bool {
        let Some(mut at) = self.end.checked_add(OPEN_PACKAGES.len()) else {
            return false;
        };
        if parts.head.get(self.end..at) != Some(OPEN_PACKAGES) {
            return false;
        }
        match self.layout {
            Layout::Empty => {}
            Layout::Adjoining { first, end } if first == at => at = end,
            Layout::Adjoining { .. } | Layout::Apart => return false,
        }
        at == self.packages_end && at.checked_add(2) == Some(parts.len) && parts.tail == b"]}"
    }
}

/// What the byte ranges of an index's rows say of where the records are, gathered row by
/// row ([`Layout::add`]) instead of kept, for [`Index::frames`].
#[derive(Debug, Clone, Copy)]
enum Layout {
    /// No row.
    Empty,
    /// Every record is at least one byte long and starts one byte (the comma) after the one
    /// before it ends: the first starts at `first`, the last ends at `end`.
    Adjoining { first: usize, end: usize },
    /// Some record is empty or not where that rule puts it.
    Apart,
}

impl Layout {
    /// The layout once the next row's record is at `range`.
    fn add(self, range: &Range<usize>) -> Self {
        let start = match self {
            Layout::Empty => range.start,
            // The offsets are the file's word: no arithmetic on them may overflow.
            Layout::Adjoining { end, .. } => match end.checked_add(1) {
                Some(start) => start,
                None => return Layout::Apart,
            },
            Layout::Apart => return Layout::Apart,
        };
        if range.start != start || range.end <= range.start {
            return Layout::Apart;
        }
        let first = match self {
            Layout::Adjoining { first, .. } => first,
            _ => range.start,
        };
        Layout::Adjoining {
            first,
            end: range.end,
        }
    }
}

/// Whether a read of an index keeps the byte range of each row it keeps ([`Index::kept`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ranges {
    Kept,
    Dropped,
}

/// Reads an index (`{"keys": [...], "packages": [ROW, ...]}`), keeping each row for which
/// `keep(id)` holds (room for `capacity` rows is made at once).
pub(crate) fn read_index(
    c: &mut Cursor<'_>,
    keep: impl FnMut(&str) -> bool,
    capacity: usize,
) -> Option<Index> {
    read_rows(c, keep, capacity, Ranges::Kept)
}

/// [`read_index`], keeping the kept rows' byte ranges as `ranges` says.
fn read_rows(
    c: &mut Cursor<'_>,
    mut keep: impl FnMut(&str) -> bool,
    capacity: usize,
    ranges: Ranges,
) -> Option<Index> {
    let mut keys: Option<KeyLists> = None;
    let mut length = None;
    let mut packages_end = None;
    let start = c.offset();
    let mut index = Index {
        rows: Vec::with_capacity(capacity),
        kept: match ranges {
            Ranges::Kept => Vec::with_capacity(capacity),
            Ranges::Dropped => Vec::new(),
        },
        layout: Layout::Empty,
        packages_end: 0,
        end: 0,
    };
    let mut read = false;
    c.object(|c, key| match key {
        "length" if packages_end.is_none() => once(&mut length, c.u64()?),
        "packages_end" if keys.is_none() => once(&mut packages_end, c.u64()?),
        "keys" if !read => once(&mut keys, KeyLists::new(read_keys(c)?)),
        "packages" if !read => {
            let table = keys.as_mut()?;
            read = true;
            c.array(|c| {
                match read_row(c, table, &mut keep)? {
                    Ok((row, range)) => {
                        index.layout = index.layout.add(&range);
                        if ranges == Ranges::Kept {
                            index.kept.push(range);
                        }
                        index.rows.push(Row::Indexed(row));
                    }
                    Err(range) => index.layout = index.layout.add(&range),
                }
                Some(())
            })
        }
        _ => None,
    })?;
    read.then_some(())?;
    index.packages_end = usize::try_from(packages_end?).ok()?;
    index.end = c.position();
    // The index is as long as it says: nothing was added to it, or cut from it.
    (start.checked_add(usize::try_from(length?).ok()?) == Some(index.end)).then_some(())?;
    Some(index)
}

/// An index's key table, and each list of keys its rows name, made once and shared by every
/// row that names the same keys (nearly all rows of a store name the same one or two); and the
/// last publisher id checked, which the next row most likely names again.
pub(crate) struct KeyLists {
    keys: Vec<Sha256Digest>,
    lists: Vec<(Vec<usize>, Arc<[Sha256Digest]>)>,
    scratch: Vec<usize>,
    publisher: Option<String>,
}

impl KeyLists {
    fn new(keys: Vec<Sha256Digest>) -> Self {
        KeyLists {
            keys,
            lists: Vec::new(),
            scratch: Vec::new(),
            publisher: None,
        }
    }

    /// Reads a row's `[N, ...]`: `Some(None)` for `[]`.
    fn read(&mut self, c: &mut Cursor<'_>) -> Option<Option<Arc<[Sha256Digest]>>> {
        self.scratch.clear();
        let scratch = &mut self.scratch;
        let count = self.keys.len();
        c.array(|c| {
            let n = usize::try_from(c.u64()?).ok().filter(|n| *n < count)?;
            scratch.push(n);
            Some(())
        })?;
        self.list()
    }

    /// The list of the keys whose indexes `scratch` holds (each checked to be in the table):
    /// `Some(None)` for none.
    fn list(&mut self) -> Option<Option<Arc<[Sha256Digest]>>> {
        if self.scratch.is_empty() {
            return Some(None);
        }
        if let Some((_, list)) = self.lists.iter().find(|(n, _)| *n == self.scratch) {
            return Some(Some(Arc::clone(list)));
        }
        let list: Arc<[Sha256Digest]> = self.scratch.iter().map(|&n| self.keys[n]).collect();
        self.lists.push((self.scratch.clone(), Arc::clone(&list)));
        Some(Some(list))
    }
}

/// A string cell: where its text is in the cursor's input, and the text. `None` for one
/// written with an escape, which no writer does in the cells read this way.
fn span<'a>(c: &mut Cursor<'a>) -> Option<(Span, &'a str)> {
    let start = c.offset().checked_add(1)?;
    match c.str()? {
        Cow::Borrowed(text) => Some((
            Span {
                start: u32::try_from(start).ok()?,
                len: u32::try_from(text.len()).ok()?,
            },
            text,
        )),
        Cow::Owned(_) => None,
    }
}

/// A version cell: checked to be a version, kept as its text.
fn version_span(c: &mut Cursor<'_>) -> Option<Span> {
    let (span, text) = span(c)?;
    (is_plain_version(text) || Version::parse(text).is_ok()).then_some(span)
}

/// Whether `text` is `MAJOR.MINOR.PATCH`, three numbers without leading zeros that fit a `u64`:
/// a version, checked without the general parser (which reads anything else).
fn is_plain_version(text: &str) -> bool {
    plain_numbers(text).is_some()
}

/// The three numbers of `text` when it is `MAJOR.MINOR.PATCH` ([`is_plain_version`]), read in
/// the one pass that checks it: a version is read for nearly every row of an index, and
/// compared with its record's for every row the full reader holds to its record.
fn plain_numbers(text: &str) -> Option<[u64; 3]> {
    let mut numbers = [0u64; 3];
    let mut part = 0;
    let mut digits = 0;
    let mut leading_zero = false;
    for &b in text.as_bytes() {
        match b {
            b'.' if digits > 0 && part < 2 => {
                part += 1;
                digits = 0;
                leading_zero = false;
            }
            // At most 19 digits, which a `u64` holds.
            b'0'..=b'9' if digits < 19 && !leading_zero => {
                leading_zero = digits == 0 && b == b'0';
                digits += 1;
                numbers[part] = numbers[part] * 10 + u64::from(b - b'0');
            }
            _ => return None,
        }
    }
    (part == 2 && digits > 0).then_some(numbers)
}

/// A row of an index with the byte range it gives for its record, or (`Err`) the range alone,
/// for a row passed over.
type RowRead = Result<(IndexRow, Range<usize>), Range<usize>>;

/// One row of an index with the byte range it gives; `Err` with the range alone for a row that
/// `keep` passes over once its id is read. A row laid out as every writer lays it out is read
/// byte by byte ([`quick_row`]); any other is read by the cursor ([`read_row_generic`]), which
/// answers for it (refuses it, or reads what the quick reader does not recognise).
fn read_row(
    c: &mut Cursor<'_>,
    keys: &mut KeyLists,
    keep: &mut impl FnMut(&str) -> bool,
) -> Option<RowRead> {
    let start = c.offset();
    if let Some((read, end)) = quick_row(c.text(), start, keys, keep) {
        c.pass_to(end)?;
        return Some(read);
    }
    read_row_generic(c, keys, keep)
}

/// What [`quick_row`] reads of an index's text beyond [`Bytes`]' own.
impl<'t> Bytes<'t> {
    /// A string without escapes ([`Bytes::string`]): its span and its text.
    fn spanned(&mut self) -> Option<(Span, &'t str)> {
        let start = self.at + 1;
        let text = self.string()?;
        Some((
            Span {
                start: u32::try_from(start).ok()?,
                len: u32::try_from(text.len()).ok()?,
            },
            text,
        ))
    }

    /// A number written in [`NUMBER_WIDTH`] characters: spaces, then digits without a leading
    /// zero (JSON's whitespace and integer), then the comma or `]` that follows.
    fn padded_number(&mut self) -> Option<u64> {
        let field = self.text.as_bytes().get(self.at..self.at + NUMBER_WIDTH)?;
        let digits = &field[field.iter().position(|&b| b != b' ')?..];
        if !digits.iter().all(u8::is_ascii_digit) || (digits.len() > 1 && digits[0] == b'0') {
            return None;
        }
        self.at += NUMBER_WIDTH;
        // At most ten digits: no overflow.
        Some(digits.iter().fold(0, |n, &d| n * 10 + u64::from(d - b'0')))
    }

    /// A key's index, `0` or digits without a leading zero, below `count`.
    fn key(&mut self, count: usize) -> Option<usize> {
        let n = usize::try_from(self.digits(9)?).ok()?;
        (n < count).then_some(n)
    }

    /// A version cell: a string that is a version ([`version_span`]).
    fn version(&mut self) -> Option<Span> {
        let (span, text) = self.spanned()?;
        (is_plain_version(text) || Version::parse(text).is_ok()).then_some(span)
    }
}

/// A row at byte `at` of `text` as every writer lays it out (no whitespace but the numbers'
/// padding, an empty `TAINTED`), read byte by byte, with where it ends: `None` for any other
/// row, which the caller reads with the cursor. It checks what [`read_row_generic`] checks, so
/// that what it reads, the cursor would read the same (a unit test holds them to each other on
/// every row a writer writes and on damaged ones).
fn quick_row(
    text: &str,
    at: usize,
    keys: &mut KeyLists,
    keep: &mut impl FnMut(&str) -> bool,
) -> Option<(RowRead, usize)> {
    let mut b = Bytes::new(text, at);
    b.eat(b'[')?;
    let (id, id_text) = b.spanned()?;
    b.eat(b',')?;
    let offset = usize::try_from(b.padded_number()?).ok()?;
    b.eat(b',')?;
    let end = offset.checked_add(usize::try_from(b.padded_number()?).ok()?)?;
    b.eat(b',')?;
    let (_, kind) = b.spanned()?;
    let kind = PackageKind::parse(kind)?;
    b.eat(b',')?;
    let (publisher, publisher_text) = b.spanned()?;
    b.eat(b',')?;
    b.eat(b'[')?;
    let previous = match b.eat(b']') {
        Some(()) => None,
        None => {
            let v = b.version()?;
            b.eat(b']')?;
            Some(v)
        }
    };
    b.eat(b',')?;
    b.eat(b'[')?;
    let current = match b.eat(b']') {
        Some(()) => None,
        None => {
            let version = b.version()?;
            b.eat(b',')?;
            let (_, state) = b.spanned()?;
            let state = state_named(state)?;
            b.eat(b',')?;
            b.eat(b'[')?;
            keys.scratch.clear();
            if b.eat(b']').is_none() {
                loop {
                    keys.scratch.push(b.key(keys.keys.len())?);
                    if b.eat(b']').is_some() {
                        break;
                    }
                    b.eat(b',')?;
                }
            }
            b.eat(b']')?;
            Some((version, state))
        }
    };
    // Taints are rare: a row with any is read by the cursor.
    b.eat(b',')?;
    b.eat(b'[')?;
    b.eat(b']')?;
    b.eat(b']')?;
    if !keep(id_text) {
        return Some((Err(offset..end), b.at));
    }
    is_valid_id(id_text).then_some(())?;
    if keys.publisher.as_deref() != Some(publisher_text) {
        is_valid_id(publisher_text).then_some(())?;
        keys.publisher = Some(publisher_text.to_owned());
    }
    let current = match current {
        None => None,
        Some((version, state)) => Some(IndexVersion {
            version,
            state,
            // No taints: the current version is not tainted.
            tainted: false,
            keys: keys.list()?,
        }),
    };
    let row = IndexRow {
        id,
        kind,
        publisher,
        previous,
        current,
        tainted: None,
    };
    Some((Ok((row, offset..end)), b.at))
}

/// The state written as `text` ([`State::as_str`]).
fn state_named(text: &str) -> Option<State> {
    // Nearly every row's current version is enabled: that name is tried first.
    if text == State::Enabled.as_str() {
        return Some(State::Enabled);
    }
    State::ALL.into_iter().find(|s| s.as_str() == text)
}

/// [`read_row`] through the cursor: any row, as the JSON grammar allows it.
fn read_row_generic(
    c: &mut Cursor<'_>,
    keys: &mut KeyLists,
    keep: &mut impl FnMut(&str) -> bool,
) -> Option<RowRead> {
    let mut at = 0;
    let mut kept = true;
    let mut id = None;
    let mut offset = None;
    let mut length = None;
    let mut kind = None;
    let mut publisher = None;
    let mut previous = None;
    let mut current = None;
    let mut tainted = None;
    c.array(|c| {
        at += 1;
        match at {
            4.. if !kept => c.skip(),
            1 => {
                let (span, text) = span(c)?;
                kept = keep(text);
                if kept {
                    is_valid_id(text).then_some(())?;
                    id = Some(span);
                }
                Some(())
            }
            2 => once(&mut offset, c.u64()?),
            3 => once(&mut length, c.u64()?),
            4 => once(&mut kind, PackageKind::parse(&c.str()?)?),
            5 => {
                let (span, text) = span(c)?;
                // Nearly every row names the same publisher as the row before it.
                if keys.publisher.as_deref() != Some(text) {
                    is_valid_id(text).then_some(())?;
                    keys.publisher = Some(text.to_owned());
                }
                once(&mut publisher, span)
            }
            6 => {
                let mut v = None;
                c.array(|c| once(&mut v, version_span(c)?))?;
                once(&mut previous, v)
            }
            7 => once(&mut current, read_current(c, keys)?),
            8 => {
                let mut list = Vec::new();
                c.array(|c| {
                    list.push(read_taint(c)?);
                    Some(())
                })?;
                once(&mut tainted, list)
            }
            _ => None,
        }
    })?;
    let offset = usize::try_from(offset?).ok()?;
    let end = offset.checked_add(usize::try_from(length?).ok()?)?;
    if !kept {
        return Some(Err(offset..end));
    }
    if at != 8 {
        return None;
    }
    let tainted: Vec<(Version, Taint)> = tainted?;
    let mut current: Option<IndexVersion> = current?;
    if let Some(current) = &mut current {
        // The index does not repeat the current version's taint: its row's taints say.
        let version = current.version.of(c.text());
        current.tainted = tainted.iter().any(|(v, _)| displays_as(v, version));
    }
    Some(Ok((
        IndexRow {
            id: id?,
            kind: kind?,
            publisher: publisher?,
            previous: previous?,
            current,
            tainted: (!tainted.is_empty()).then(|| tainted.into_boxed_slice()),
        },
        offset..end,
    )))
}

/// A row's `CURRENT`: `[]` or `[VERSION, STATE, [N, ...]]`.
fn read_current(c: &mut Cursor<'_>, keys: &mut KeyLists) -> Option<Option<IndexVersion>> {
    let mut at = 0;
    let mut version = None;
    let mut state = None;
    let mut listed = None;
    c.array(|c| {
        at += 1;
        match at {
            1 => once(&mut version, version_span(c)?),
            2 => {
                let text = c.str()?;
                let s = State::ALL.into_iter().find(|s| s.as_str() == text)?;
                once(&mut state, s)
            }
            3 => once(&mut listed, keys.read(c)?),
            _ => None,
        }
    })?;
    match at {
        0 => Some(None),
        3 => Some(Some(IndexVersion {
            version: version?,
            state: state?,
            // Set from the row's taints by `read_row`: the index does not repeat it.
            tainted: false,
            keys: listed?,
        })),
        _ => None,
    }
}

/// One `[VERSION, REASON]` or `[VERSION, REASON, FILE]` of a row's `TAINTED`.
fn read_taint(c: &mut Cursor<'_>) -> Option<(Version, Taint)> {
    let mut at = 0;
    let mut version = None;
    let mut reason = None;
    let mut file = None;
    c.array(|c| {
        at += 1;
        match at {
            1 => once(&mut version, Version::parse(&c.str()?).ok()?),
            2 => once(&mut reason, c.str()?.into_owned()),
            3 => once(&mut file, c.str()?.into_owned()),
            _ => None,
        }
    })?;
    Some((
        version?,
        Taint {
            reason: reason?,
            file,
        },
    ))
}

/// Writes a checkpoint's index and, after it, its packages, in one buffer: the rows are written
/// with room for their byte ranges, which are filled in as the records are written.
pub(crate) struct IndexedWriter {
    out: Vec<u8>,
    /// Where each row's offset field starts (the length field follows after a comma).
    slots: Vec<usize>,
    /// Where the index's `packages_end` field starts.
    end_slot: usize,
}

impl IndexedWriter {
    /// Starts the index of `rows` after the `head` already written into `out`.
    pub(crate) fn new<'r>(
        mut out: String,
        rows: impl Iterator<Item = &'r ListingRow> + Clone,
    ) -> Self {
        let mut table: HashMap<Sha256Digest, usize> = HashMap::new();
        let mut keys = Vec::new();
        for row in rows.clone() {
            for key in row
                .current
                .iter()
                .flat_map(|c| c.keys.iter().flat_map(|k| k.iter()))
            {
                table.entry(*key).or_insert_with(|| {
                    keys.push(*key);
                    keys.len() - 1
                });
            }
        }
        out.push_str("\"index\":");
        let index_start = out.len();
        out.push_str("{\"length\":");
        let length_slot = out.len();
        out.extend(std::iter::repeat_n(' ', NUMBER_WIDTH));
        out.push_str(",\"packages_end\":");
        let end_slot = out.len();
        out.extend(std::iter::repeat_n(' ', NUMBER_WIDTH));
        out.push_str(",\"keys\":[");
        for (i, key) in keys.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push('"');
            out.push_str(&key.to_hex());
            out.push('"');
        }
        out.push_str("],\"packages\":[");
        let mut slots = Vec::new();
        for (i, row) in rows.enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push('[');
            json::write_escaped(&mut out, row.id.as_str());
            out.push(',');
            slots.push(out.len());
            out.extend(std::iter::repeat_n(' ', 2 * NUMBER_WIDTH + 1));
            out.push(',');
            json::write_escaped(&mut out, row.kind.as_str());
            out.push(',');
            json::write_escaped(&mut out, row.publisher.as_str());
            out.push_str(",[");
            if let Some(previous) = &row.previous {
                json::write_escaped(&mut out, &previous.to_string());
            }
            out.push_str("],[");
            if let Some(current) = &row.current {
                json::write_escaped(&mut out, &current.version.to_string());
                out.push(',');
                json::write_escaped(&mut out, current.state.as_str());
                out.push_str(",[");
                for (i, key) in current.keys.iter().flat_map(|k| k.iter()).enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&table[key].to_string());
                }
                out.push(']');
            }
            out.push_str("],[");
            for (i, (version, taint)) in row.tainted.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push('[');
                json::write_escaped(&mut out, &version.to_string());
                out.push(',');
                json::write_escaped(&mut out, &taint.reason);
                if let Some(file) = &taint.file {
                    out.push(',');
                    json::write_escaped(&mut out, file);
                }
                out.push(']');
            }
            out.push_str("]]");
        }
        out.push_str("]}");
        let length = number((out.len() - index_start) as u64);
        out.replace_range(length_slot..length_slot + NUMBER_WIDTH, &length);
        IndexedWriter {
            out: out.into_bytes(),
            slots,
            end_slot,
        }
    }

    /// The text written so far, to append to (records and the document's end).
    pub(crate) fn text(&mut self) -> &mut Vec<u8> {
        &mut self.out
    }

    /// Records that row `i`'s record occupies `range` of the text.
    pub(crate) fn fill(&mut self, i: usize, range: Range<usize>) {
        let Some(&slot) = self.slots.get(i) else {
            return;
        };
        let offset = number(range.start as u64);
        let length = number(range.len() as u64);
        self.out[slot..slot + NUMBER_WIDTH].copy_from_slice(offset.as_bytes());
        self.out[slot + NUMBER_WIDTH] = b',';
        self.out[slot + NUMBER_WIDTH + 1..slot + 2 * NUMBER_WIDTH + 1]
            .copy_from_slice(length.as_bytes());
    }

    /// The whole document, once the text ends with the `]}` closing the packages and the
    /// document: the index's `packages_end` is filled in.
    pub(crate) fn finish(mut self) -> Vec<u8> {
        let end = number(self.out.len().saturating_sub(2) as u64);
        self.out[self.end_slot..self.end_slot + NUMBER_WIDTH].copy_from_slice(end.as_bytes());
        self.out
    }
}

/// `n` right-aligned in [`NUMBER_WIDTH`] characters; a number too large for them is written as
/// one that no checkpoint can hold, so that readers refuse the index.
fn number(n: u64) -> String {
    format!("{:>width$}", n.min(NUMBER_MAX), width = NUMBER_WIDTH)
}

/// Checks a format-3 checkpoint's index against the records of `state`, which `bytes` decoded
/// to: the first row that is not exactly the row of the record at its byte range, as a field
/// error at that row. The full reader's fast path refuses such a file; this names why.
pub(crate) fn check_index(bytes: &[u8], state: &StoreState) -> Result<(), StoreStateDecodeError> {
    let at = |i: usize| json::JsonPath::root().key("index").key("packages").index(i);
    let invalid = |i: usize, detail: String| field(at(i), FieldProblem::Invalid { detail });
    let Some(read) = index_and_ranges(bytes) else {
        return Err(field(
            json::JsonPath::root().key("index"),
            FieldProblem::Invalid {
                detail: "not an index of the packages (see the store's documentation of \
                         format 3)"
                    .to_owned(),
            },
        ));
    };
    let mut records = state.packages();
    for (i, (row, range)) in read.rows.iter().enumerate() {
        let row = row.view(read.text);
        let Some((id, record)) = records.next() else {
            return Err(invalid(
                i,
                format!("a row for {}, which has no record", row.id),
            ));
        };
        if read.ranges.get(i) != Some(range) {
            return Err(invalid(
                i,
                format!("the byte range it gives for {id}'s record is not where the record is"),
            ));
        }
        if !row.matches(id, record) {
            return Err(invalid(
                i,
                format!("the row of {id} is not what its record says"),
            ));
        }
    }
    if let Some((id, _)) = records.next() {
        return Err(invalid(read.rows.len(), format!("no row for {id}")));
    }
    if read.packages_end != read.end {
        return Err(field(
            json::JsonPath::root().key("index").key("packages_end"),
            FieldProblem::Invalid {
                detail: format!(
                    "the packages end at byte offset {}, not {}",
                    read.end, read.packages_end
                ),
            },
        ));
    }
    Ok(())
}

/// A checkpoint's index and where its records are, read with a cursor that passes over the
/// records ([`check_index`]).
struct IndexAndRecords<'t> {
    text: &'t str,
    rows: Vec<(Row, Range<usize>)>,
    /// Where the index says the packages end.
    packages_end: usize,
    /// Each record's byte range.
    ranges: Vec<Range<usize>>,
    /// Where the packages end.
    end: usize,
}

/// `None` when the document or its index does not read.
fn index_and_ranges(bytes: &[u8]) -> Option<IndexAndRecords<'_>> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut c = Cursor::of_str(text);
    let mut index = None;
    let mut ranges = Vec::new();
    let mut end = None;
    c.object(|c, key| match key {
        "index" => once(&mut index, read_index(c, |_| true, 0)?),
        "packages" => {
            c.array(|c| {
                let start = c.offset();
                c.skip()?;
                ranges.push(start..c.position());
                Some(())
            })?;
            end = c.position().checked_sub(1);
            Some(())
        }
        _ => c.skip(),
    })?;
    let index = index?;
    Some(IndexAndRecords {
        text,
        rows: index.rows.into_iter().zip(index.kept).collect(),
        packages_end: index.packages_end,
        ranges,
        end: end?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::PublisherId;
    use crate::store_state::{NewVersion, PublishOptions};

    const ENABLE: PublishOptions = PublishOptions {
        enable: true,
        allow_downgrade: false,
    };

    /// Publishes and enables `pkg` at `version`, signed by `signed_by`, with a payload digest of
    /// its own.
    fn publish(state: &mut StoreState, pkg: &str, version: &str, signed_by: Vec<Sha256Digest>) {
        let new = NewVersion {
            payload_digest: Sha256Digest::of(format!("{pkg} {version}").as_bytes()),
            kind: PackageKind::Module,
            publisher: PublisherId::new("org.example").unwrap(),
            signed_by,
            facts: None,
        };
        let id = PackageId::new(pkg).unwrap();
        state
            .publish(&id, &Version::parse(version).unwrap(), new, ENABLE)
            .unwrap();
    }

    /// A checkpoint whose rows name no keys and keys, a rollback target or none, a disabled
    /// and a removed current version, a version the quick version check does not read and a
    /// taint (a row that only the cursor reads).
    fn varied_checkpoint() -> String {
        let key = |n: &str| Sha256Digest::of(n.as_bytes());
        let mut state = StoreState::new();
        let s = &mut state;
        publish(s, "a.plain", "1.0.0", Vec::new());
        publish(s, "b.signed", "1.0.0", vec![key("k1")]);
        publish(s, "b.signed", "2.0.0", vec![key("k1"), key("k2")]);
        publish(s, "c.pre", "1.0.0-rc.1+build.5", vec![key("k2")]);
        publish(s, "d.disabled", "3.1.4", vec![key("k1")]);
        publish(s, "e.removed", "1.0.0", vec![key("k1")]);
        publish(s, "f.tainted", "1.0.0", vec![key("k1")]);
        let id = |s: &str| PackageId::new(s).unwrap();
        state.disable(&id("d.disabled")).unwrap();
        state.disable(&id("e.removed")).unwrap();
        state
            .remove(&id("e.removed"), &Version::parse("1.0.0").unwrap())
            .unwrap();
        let taint = Taint {
            reason: "a \"quoted\" reason".to_owned(),
            file: Some("lib/x.so".to_owned()),
        };
        state
            .taint(&id("f.tainted"), &Version::parse("1.0.0").unwrap(), taint)
            .unwrap();
        String::from_utf8(state.successor().to_checkpoint_json()).unwrap()
    }

    /// The whole checkpoint read in parts, `batch` bytes of records at a time.
    fn read_in_parts(bytes: &[u8], batch: usize) -> Option<StoreState> {
        StoreState::from_checkpoint_parts_in(
            CheckpointParts::whole(bytes),
            batch,
            |range, buffer| {
                buffer.extend_from_slice(bytes.get(range)?);
                Some(())
            },
        )
        .map(|(state, _)| state)
    }

    /// Read in parts, in batches of any size, a written checkpoint is the state the reader of
    /// the whole document reads; and of every damaged copy (each byte changed to each of a
    /// dozen bytes that matter to JSON, deleted, or preceded by a space), what the reader in
    /// parts accepts, the reader of the whole document accepts too, as the same state.
    #[test]
    fn the_reader_in_parts_reads_only_what_the_whole_reader_reads() {
        let written = varied_checkpoint();
        let bytes = written.as_bytes();
        let (whole, _) = StoreState::from_any_json(bytes).unwrap();
        for batch in [0, 1, 100, 300, 600, bytes.len()] {
            assert_eq!(
                read_in_parts(bytes, batch).as_ref(),
                Some(&whole),
                "{batch}"
            );
        }
        let mut damaged = Vec::new();
        for at in 0..bytes.len() {
            for b in *b" ,\"{}[]019a\\:" {
                if bytes[at] != b {
                    let mut copy = bytes.to_vec();
                    copy[at] = b;
                    damaged.push(copy);
                }
            }
            let mut copy = bytes.to_vec();
            copy.remove(at);
            damaged.push(copy);
            let mut copy = bytes.to_vec();
            copy.insert(at, b' ');
            damaged.push(copy);
        }
        let mut accepted = 0;
        for copy in &damaged {
            for batch in [1, RECORDS_BATCH] {
                if let Some(state) = read_in_parts(copy, batch) {
                    let whole = StoreState::from_any_json(copy).map(|(s, _)| s);
                    assert_eq!(
                        whole.as_ref(),
                        Ok(&state),
                        "{}",
                        String::from_utf8_lossy(copy)
                    );
                    accepted += 1;
                }
            }
        }
        // Some damage is harmless (a digit of a digest, a letter of a reason): those copies
        // are read, by both.
        assert!(
            accepted > 0 && damaged.len() > 40_000,
            "{accepted} of {}",
            damaged.len()
        );
    }

    /// A head whose members are out of the writer's order (the trust anchor before the
    /// generation) is refused by the reader in parts, the listing and the reader of one
    /// package (of a package the index has a row for, and of one it has not), as the reader of
    /// the whole document refuses it.
    #[test]
    fn a_head_out_of_order_is_refused_by_every_reader() {
        let mut state = StoreState::new();
        publish(
            &mut state,
            "a.plain",
            "1.0.0",
            vec![Sha256Digest::of(b"k1")],
        );
        let plain = PackageId::new("a.plain").unwrap();
        state.set_trust_anchor(crate::trust::TrustAnchor {
            binding: crate::trust::TrustBinding {
                store_id: "6758ca18a3a85849ffbe8103a43c0185".to_owned(),
                generation: 1,
            },
            file_digest: Sha256Digest::of(b"trust"),
            revoked_keys: Default::default(),
            revoked_digests: Default::default(),
        });
        let written = String::from_utf8(state.successor().to_checkpoint_json()).unwrap();
        assert!(read_in_parts(written.as_bytes(), RECORDS_BATCH).is_some());
        let generation = written.find("\"generation\":").unwrap();
        let trust = written.find(",\"trust\":").unwrap();
        let index = written.find(",\"index\":").unwrap();
        // `"generation":N` and `"trust":{...}` swapped: the same length, every offset kept.
        let swapped = format!(
            "{}{},{}{}",
            &written[..generation],
            &written[trust + 1..index],
            &written[generation..trust],
            &written[index..]
        );
        assert_eq!(swapped.len(), written.len());
        assert!(StoreState::from_any_json(swapped.as_bytes()).is_err());
        assert!(read_in_parts(swapped.as_bytes(), RECORDS_BATCH).is_none());
        assert!(matches!(
            Listing::from_checkpoint(swapped.as_bytes()),
            Err(_) | Ok(None)
        ));
        for only in [plain, PackageId::new("b.absent").unwrap()] {
            assert!(
                StoreState::from_any_json_only(written.as_bytes(), &only).is_ok(),
                "{only}"
            );
            assert!(
                StoreState::from_any_json_only(swapped.as_bytes(), &only).is_err(),
                "{only}"
            );
        }
    }

    /// Reads the row at byte `at` of `text` through [`read_row`] (the quick reader first) and
    /// through the cursor alone, keeping the rows `keep` keeps: both answers, each with where
    /// the cursor stands after it.
    fn both(
        text: &str,
        at: usize,
        keys: &[Sha256Digest],
        keep: fn(&str) -> bool,
    ) -> [(String, Option<usize>); 2] {
        let read = |generic: bool| {
            let mut c = Cursor::of_str(text);
            c.pass_to(at).unwrap();
            let mut lists = KeyLists::new(keys.to_vec());
            let mut keep = keep;
            let row = if generic {
                read_row_generic(&mut c, &mut lists, &mut keep)
            } else {
                read_row(&mut c, &mut lists, &mut keep)
            };
            let seen = row.as_ref().map(|row| match row {
                Ok((row, range)) => format!("{:?} {range:?}", row.view(text)),
                Err(range) => format!("passed over {range:?}"),
            });
            (format!("{seen:?}"), row.map(|_| c.position()))
        };
        [read(false), read(true)]
    }

    /// The quick reader reads every untainted row a writer writes, and every row it reads,
    /// written or damaged, it reads as the cursor does: the same row, the same refusal, the
    /// cursor left at the same place.
    #[test]
    fn the_quick_row_reader_answers_as_the_cursor_on_written_and_damaged_rows() {
        let checkpoint = varied_checkpoint();
        let read = read_to_rows(&checkpoint).unwrap();
        let rows = &checkpoint[read.rows_start..read.index_end - 2];
        // Each row's byte range, as the cursor reads them.
        let mut starts = Vec::new();
        let all = format!("[{rows}]");
        let mut c = Cursor::of_str(&all);
        c.array(|c| {
            let start = c.offset() - 1;
            c.skip()?;
            starts.push((start, c.position() - 1));
            Some(())
        })
        .unwrap();
        assert_eq!(starts.len(), 6, "{rows}");
        let keeps: [fn(&str) -> bool; 3] = [|_| true, |_| false, |id| id == "b.signed"];
        let mut quick = 0;
        for &(start, end) in &starts {
            let row = &rows[start..end];
            if quick_row(row, 0, &mut KeyLists::new(read.keys.clone()), &mut |_| true).is_some() {
                quick += 1;
            }
            let mut cases = vec![row.to_owned()];
            for (i, _) in row.char_indices() {
                for with in [
                    "\"", "\\", " ", "0", "9", "a", "A", ".", "-", "[", "]", ",", "\u{1}", "é", "",
                ] {
                    cases.push(format!("{}{with}{}", &row[..i], &row[i + 1..]));
                }
                cases.push(format!("{} {}", &row[..i], &row[i..]));
            }
            for case in &cases {
                // The row followed by what follows a row in an index.
                let text = format!("{case},[]");
                for keep in keeps {
                    let [quick, generic] = both(&text, 0, &read.keys, keep);
                    assert_eq!(quick, generic, "{case}");
                }
            }
        }
        // Every row but the tainted one.
        assert_eq!(quick, 5);
    }

    /// The layout gathered row by row accepts exactly the ranges that a walk over all of them,
    /// kept, accepts: every sequence of up to three ranges over small offsets, and offsets at
    /// the end of the address space.
    #[test]
    fn the_layout_gathered_row_by_row_is_the_walk_over_every_range() {
        fn walk(ranges: &[Range<usize>], at: usize) -> Option<usize> {
            let mut at = at;
            for (i, range) in ranges.iter().enumerate() {
                let start = at.checked_add(usize::from(i > 0))?;
                if range.start != start || range.end <= range.start {
                    return None;
                }
                at = range.end;
            }
            Some(at)
        }
        fn gathered(ranges: &[Range<usize>], at: usize) -> Option<usize> {
            match ranges.iter().fold(Layout::Empty, |l, r| l.add(r)) {
                Layout::Empty => Some(at),
                Layout::Adjoining { first, end } if first == at => Some(end),
                _ => None,
            }
        }
        let mut all: Vec<Range<usize>> = Vec::new();
        for start in 0..6 {
            for end in 0..7 {
                all.push(start..end);
            }
        }
        all.push(usize::MAX - 1..usize::MAX);
        all.push(usize::MAX..usize::MAX);
        let mut checked = 0;
        for a in &all {
            for b in &all {
                for c in &all {
                    for n in 0..=3 {
                        let ranges = [a.clone(), b.clone(), c.clone()];
                        for at in [0, 1, 2, usize::MAX - 1] {
                            assert_eq!(
                                gathered(&ranges[..n], at),
                                walk(&ranges[..n], at),
                                "{:?} from {at}",
                                &ranges[..n]
                            );
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert!(checked > 100_000);
    }

    /// The comparison without formatting answers as the formatted one, for plain and other
    /// versions against texts that are, are nearly, and are not what they display as.
    #[test]
    fn a_version_is_its_text_exactly_as_it_displays() {
        let versions = [
            "0.0.0",
            "1.2.3",
            "10.20.30",
            "1.2.3-rc.1",
            "1.2.3+build.5",
            "1.2.3-alpha+b",
            "18446744073709551615.0.1",
        ];
        let others = [
            "01.2.3",
            "1.02.3",
            "1.2",
            "1.2.3.4",
            "1.2.3 ",
            " 1.2.3",
            "1.2.30",
            "1.2.",
            "",
            "99999999999999999999.0.1",
            "1.2.3-rc.2",
        ];
        let mut compared = 0;
        for v in versions {
            let version = Version::parse(v).unwrap();
            for text in versions.iter().chain(&others) {
                assert_eq!(
                    version_is(&version, text),
                    displays_as(&version, text),
                    "{v} against {text:?}"
                );
                compared += 1;
            }
            assert!(version_is(&version, v), "{v}");
        }
        assert_eq!(compared, versions.len() * (versions.len() + others.len()));
    }

    /// The quick version check admits exactly what the version parser admits, of the texts it
    /// admits at all, and reads the same three numbers.
    #[test]
    fn a_plain_version_is_one_the_parser_reads() {
        for text in [
            "1.0.0",
            "0.0.0",
            "10.20.30",
            "18446744073709551615.0.0",
            "1.0",
            "1.0.0.0",
            "01.0.0",
            "1.00.0",
            "1..0",
            "",
            "1.0.0-alpha",
            "1.0.0+b",
            "a.b.c",
            "1.0.x",
            " 1.0.0",
            "0.1.0",
            "0.0.1",
            "1.0.0.",
            ".1.0",
            "1.0.",
            "1.02.3",
            "1.0.00",
            "9999999999999999999.0.0",
            "10000000000000000000.0.0",
        ] {
            if let Some(numbers) = plain_numbers(text) {
                let v = Version::parse(text).unwrap();
                assert_eq!(numbers, [v.major, v.minor, v.patch], "{text}");
            }
            // As the check was first written, part by part.
            let mut parts = 0;
            let by_parts = text.split('.').all(|n| {
                parts += 1;
                !n.is_empty()
                    && n.len() <= 19
                    && n.bytes().all(|b| b.is_ascii_digit())
                    && (n == "0" || !n.starts_with('0'))
            }) && parts == 3;
            assert_eq!(is_plain_version(text), by_parts, "{text}");
        }
        assert!(is_plain_version("1.0.0"));
        assert!(!is_plain_version("01.0.0"));
        assert!(!is_plain_version("1.0"));
    }
}
