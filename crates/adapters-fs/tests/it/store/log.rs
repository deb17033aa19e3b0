//! Damage to `registry.log`: a reader either reads the whole committed state or fails closed
//! naming the file and the byte offset, and a writer's recovery cuts off only a torn append that
//! a journal record accounts for, and deletes nothing while the log cannot be read in full.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use guild_adapters_fs::store::{
    reads_in_parts, Fault, FaultMode, FsStore, LogCorruption, LogProblem, StoreLayout, StoreOptions,
};
use guild_domain::store_state::listing::Listing;
use guild_domain::store_state::StoreState;
use guild_ports::store::{PackageStore, StoreError, StoreErrorKind};

use super::{id, publish, v, ENABLED};

/// The log's header: magic, base generation, checksum.
const HEADER: usize = 48;
/// A frame's length field, then its checksum, then its payload.
const LEN: usize = 4;
const SUM: usize = 32;

/// A closed store holding a@1.0.0, b@1.0.0 and c@1.0.0, each published by its own commit: a
/// log of three frames after the header.
fn store_with_three_frames() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let (store, _) = FsStore::open(&root).unwrap();
    for pkg in ["a", "b", "c"] {
        publish(&store, pkg, "1.0.0", ENABLED).unwrap();
    }
    (dir, root)
}

/// Where each frame of `log` starts, and where the last one ends.
fn frame_starts(log: &[u8]) -> Vec<usize> {
    let mut starts = vec![HEADER];
    let mut at = HEADER;
    while at < log.len() {
        let len = u32::from_le_bytes(log[at..at + LEN].try_into().unwrap()) as usize;
        at += LEN + SUM + len;
        starts.push(at);
    }
    assert_eq!(at, log.len());
    starts
}

/// The error's typed cause: where in the log, and what is wrong there.
fn log_corruption(err: &StoreError) -> &LogCorruption {
    std::error::Error::source(err)
        .and_then(|s| s.downcast_ref::<LogCorruption>())
        .unwrap_or_else(|| panic!("not a log corruption: {err}"))
}

fn open_as(root: &Path, reader: bool) -> Result<FsStore, StoreError> {
    let options = if reader {
        StoreOptions::new().reader()
    } else {
        StoreOptions::new()
    };
    FsStore::open_with(root, options).map(|(s, _)| s)
}

/// G27: one flipped bit in the length of a frame in the middle of the log made readers take it
/// for a torn append at the end (two of three packages gone from `list`), and the next writer cut
/// the log there and deleted the trees of the packages it no longer saw.
#[test]
fn store_log_flipped_length_in_a_middle_frame_fails_closed_and_deletes_nothing() {
    let (_dir, root) = store_with_three_frames();
    let layout = StoreLayout::new(&root);
    let good = fs::read(&layout.log).unwrap();
    let starts = frame_starts(&good);
    assert_eq!(starts.len(), 4, "three frames");
    let middle = starts[1];
    let mut bad = good.clone();
    // Bit 20 of the length: the frame now claims a megabyte, far past the end of the file.
    bad[middle + 2] ^= 0x10;
    fs::write(&layout.log, &bad).unwrap();
    let before = files_under(&root);

    for reader in [true, false] {
        let err = open_as(&root, reader).map(|_| ()).unwrap_err();
        assert_eq!(err.kind, StoreErrorKind::Corrupt, "{err}");
        assert_eq!(err.path.as_deref(), Some(layout.log.as_path()), "{err}");
        assert_eq!(
            *log_corruption(&err),
            LogCorruption {
                offset: middle as u64,
                problem: LogProblem::DamagedBeforeFrame {
                    next: starts[2] as u64
                },
            },
            "{err}"
        );
    }
    let err = guild_adapters_fs::store::read_registry(&root).unwrap_err();
    assert_eq!(log_corruption(&err).offset, middle as u64, "{err}");
    assert!(
        files_under(&root) == before,
        "failing closed changed nothing"
    );

    // Putting the good log back gives back everything: records and files.
    fs::write(&layout.log, &good).unwrap();
    let (store, report) = FsStore::open(&root).unwrap();
    assert!(report.is_clean(), "{report:?}");
    for pkg in ["a", "b", "c"] {
        assert!(store
            .registry()
            .unwrap()
            .is_installed(&id(pkg), &v("1.0.0")));
        assert!(layout.package_dir(&id(pkg), &v("1.0.0")).is_dir(), "{pkg}");
    }
}

/// Every entry under `dir` (a directory as `None`, a file with its bytes): a store's whole
/// disk, for checking that failing closed wrote and deleted nothing.
fn files_under(dir: &Path) -> BTreeMap<String, Option<Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                out.insert(p.display().to_string(), None);
                stack.push(p);
            } else {
                out.insert(p.display().to_string(), Some(fs::read(&p).unwrap()));
            }
        }
    }
    out
}

fn committed(root: &Path) -> StoreState {
    guild_adapters_fs::store::read_registry(root)
        .unwrap()
        .unwrap()
}

/// One way to damage the log: its name and the bytes it leaves.
struct Damage {
    name: String,
    log: Vec<u8>,
}

/// Every field of every frame (length, checksum, payload) damaged, in the first, the middle and
/// the last frame of a log of three, and in the last frame of a log cut back to one and to two
/// frames (so a damaged frame both with and without frames after it); every field of the header;
/// and the log cut at every byte.
fn damages(good: &[u8]) -> Vec<Damage> {
    let starts = frame_starts(good);
    let mut out = Vec::new();
    for byte in 0..HEADER {
        let mut log = good.to_vec();
        log[byte] ^= 0x01;
        out.push(Damage {
            name: format!("header byte {byte} flipped"),
            log,
        });
    }
    // (description, the log up to the end of the damaged frame's neighbourhood, frame start)
    let mut targets = Vec::new();
    for (k, pair) in starts.windows(2).enumerate() {
        let (start, end) = (pair[0], pair[1]);
        let later = if end == good.len() {
            "the last frame".to_owned()
        } else {
            format!("frame {k} of {}, frames after it", starts.len() - 1)
        };
        targets.push((later, good.to_vec(), start, end));
        if end != good.len() {
            targets.push((
                format!("frame {k}, the last of a log cut after it"),
                good[..end].to_vec(),
                start,
                end,
            ));
        }
    }
    for (which, base, start, end) in targets {
        let mut edit = |what: String, f: &dyn Fn(&mut [u8])| {
            let mut log = base.clone();
            f(&mut log[start..end]);
            out.push(Damage {
                name: format!("{which}: {what}"),
                log,
            });
        };
        for bit in 0..32 {
            edit(format!("length bit {bit} flipped"), &|f| {
                f[bit / 8] ^= 1 << (bit % 8)
            });
        }
        edit("length 0".to_owned(), &|f| f[..LEN].fill(0));
        edit("length u32::MAX".to_owned(), &|f| f[..LEN].fill(0xff));
        for byte in 0..SUM {
            edit(format!("checksum byte {byte} flipped"), &|f| {
                f[LEN + byte] ^= 0x80
            });
        }
        let n = end - start - LEN - SUM;
        for byte in [0, n / 2, n - 1] {
            edit(format!("payload byte {byte} flipped"), &|f| {
                f[LEN + SUM + byte] ^= 0x01
            });
        }
        edit("payload byte zeroed".to_owned(), &|f| {
            f[LEN + SUM + n / 2] = 0
        });
        edit("whole frame zeroed".to_owned(), &|f| f.fill(0));
    }
    // Cut inside the header, and inside each frame at and around the boundaries of its fields
    // (the torn-append test below cuts a frame at every byte): a torn append, but with no commit
    // in flight.
    let mut cuts: Vec<usize> = (0..HEADER).collect();
    for pair in starts.windows(2) {
        let (start, end) = (pair[0], pair[1]);
        for field_end in [
            start,
            start + LEN,
            start + LEN + SUM,
            (start + end) / 2,
            end,
        ] {
            cuts.extend([field_end.saturating_sub(1), field_end, field_end + 1]);
        }
    }
    cuts.sort_unstable();
    cuts.dedup();
    for cut in cuts {
        if cut < good.len() && !starts.contains(&cut) {
            out.push(Damage {
                name: format!("cut at byte {cut}"),
                log: good[..cut].to_vec(),
            });
        }
    }
    out
}

/// The corruption matrix. Each case must fail closed, as a reader and as a writer, naming the
/// log and an offset no later than the damage, and leave every byte of the store as it was; then
/// the good log put back reads the whole committed state again.
#[test]
fn store_log_corruption_matrix_fails_closed_and_deletes_nothing() {
    let (_dir, root) = store_with_three_frames();
    let layout = StoreLayout::new(&root);
    let good = fs::read(&layout.log).unwrap();
    let full = committed(&root);
    let cases = damages(&good);
    for case in &cases {
        fs::write(&layout.log, &case.log).unwrap();
        let before = files_under(&root);
        let what = &case.name;
        let errors = [
            guild_adapters_fs::store::read_registry(&root).map(|_| ()),
            open_as(&root, true).map(|_| ()),
            open_as(&root, false).map(|_| ()),
            // A reader of one package checks every frame as a full reader does.
            FsStore::open_package_reader(&root, &id("a")).map(|_| ()),
            FsStore::open_package_reader(&root, &id("c")).map(|_| ()),
        ];
        let full_error = open_as(&root, true).map(|_| ()).unwrap_err().to_string();
        for (k, err) in errors.into_iter().enumerate() {
            if k >= 3 {
                let err = err.as_ref().map_err(ToString::to_string);
                assert_eq!(err, Err(full_error.clone()), "{what}");
            }
            let err = err.expect_err(what);
            assert_eq!(err.kind, StoreErrorKind::Corrupt, "{what}: {err}");
            assert_eq!(err.path.as_deref(), Some(layout.log.as_path()), "{what}");
            let at = log_corruption(&err).offset as usize;
            assert!(at < case.log.len().max(1), "{what}: {err}");
        }
        assert!(
            files_under(&root) == before,
            "{what}: failing closed changed the disk"
        );
    }
    fs::write(&layout.log, &good).unwrap();
    let (store, report) = FsStore::open(&root).unwrap();
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(store.registry().unwrap(), full);
    println!(
        "log corruption matrix: {} cases, all failed closed",
        cases.len()
    );
}

/// A log cut back exactly at a frame boundary is a well-formed shorter log: a reader sees the
/// earlier generation it holds, consistently, never a mix.
#[test]
fn store_log_cut_at_a_frame_boundary_reads_an_earlier_generation() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let (store, _) = FsStore::open(&root).unwrap();
    let mut states = vec![store.registry().unwrap()];
    for pkg in ["a", "b", "c"] {
        publish(&store, pkg, "1.0.0", ENABLED).unwrap();
        states.push(store.registry().unwrap());
    }
    drop(store);
    let layout = StoreLayout::new(&root);
    let good = fs::read(&layout.log).unwrap();
    for (k, start) in frame_starts(&good).into_iter().enumerate() {
        fs::write(&layout.log, &good[..start]).unwrap();
        assert_eq!(committed(&root), states[k], "{k} frames");
    }
}

/// A writer that opens a store whose log was cut back at a frame boundary (or whose older log
/// was put back) deletes nothing it cannot account for: the trees of the versions the lost
/// frames installed stay, reported, and putting the full log back gives the whole store again.
#[test]
fn store_log_cut_at_a_frame_boundary_loses_no_tree_to_a_writer() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let (store, _) = FsStore::open(&root).unwrap();
    for pkg in ["a", "b", "c"] {
        publish(&store, pkg, "1.0.0", ENABLED).unwrap();
    }
    let full = store.registry().unwrap();
    drop(store);
    let layout = StoreLayout::new(&root);
    let good = fs::read(&layout.log).unwrap();
    let starts = frame_starts(&good);
    // Keep a's frame only: b's and c's are gone.
    fs::write(&layout.log, &good[..starts[1]]).unwrap();
    let before = files_under(&root.join("packages"));

    let (store, report) = FsStore::open(&root).unwrap();
    assert_eq!(
        files_under(&root.join("packages")),
        before,
        "a writer deleted trees no record accounts for: {report:?}"
    );
    // Nothing said a change was in flight, so opening did not list the trees; the operator's
    // recovery does, and keeps them.
    assert!(!report.swept, "{report:?}");
    let report = store.recover().unwrap();
    drop(store);
    assert_eq!(files_under(&root.join("packages")), before, "{report:?}");
    let kept: Vec<String> = report
        .unaccounted_trees
        .iter()
        .map(|p| p.strip_prefix(&root).unwrap().display().to_string())
        .collect();
    assert_eq!(kept, ["packages/b/1.0.0", "packages/c/1.0.0"], "{report:?}");
    assert!(report.removed_trees.is_empty(), "{report:?}");

    fs::write(&layout.log, &good).unwrap();
    let (store, report) = FsStore::open(&root).unwrap();
    assert_eq!(store.registry().unwrap(), full);
    // The kept trees left the marker: this opening swept, found them all installed again and
    // removed it.
    assert!(report.swept && report.is_clean(), "{report:?}");
    assert!(!layout.sweep_marker.exists());
}

/// The crash side: a commit's append torn after every byte of its frame (length, checksum and
/// payload), alone or followed by the zeros a power loss can leave, with the commit's journal
/// record in place as it always is while the append is in flight. Readers read the state before
/// the commit; a writer cuts the log back to it and rolls the commit back.
#[test]
fn store_log_torn_append_at_every_byte_is_cut_back_when_its_commit_was_in_flight() {
    // The frame the crashed commit was appending, taken from the same commit made in full.
    let (_other_dir, other) = store_with_three_frames();
    let len3 = fs::read(StoreLayout::new(&other).log).unwrap().len();
    {
        let (store, _) = FsStore::open(&other).unwrap();
        publish(&store, "d", "1.0.0", ENABLED).unwrap();
    }
    let frame = fs::read(StoreLayout::new(&other).log).unwrap()[len3..].to_vec();

    let (_dir, root) = store_with_three_frames();
    let layout = StoreLayout::new(&root);
    let good = fs::read(&layout.log).unwrap();
    assert_eq!(good.len(), len3);
    let before = committed(&root);
    // The commit of d crashes once its journal record is durable.
    let fault = Some(Fault {
        step: 5,
        mode: FaultMode::Crash,
    });
    let (store, _) = FsStore::open_with(&root, StoreOptions::new().with_fault(fault)).unwrap();
    let err = publish(&store, "d", "1.0.0", ENABLED).unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::SimulatedCrash);
    drop(store);
    let record_path = layout.journal.join("00000000000000000004.intent");
    let record = fs::read(&record_path).unwrap();

    let n = frame.len() - LEN - SUM;
    let mut tails: Vec<(String, Vec<u8>)> = (1..frame.len())
        .map(|p| (format!("torn after {p} bytes"), frame[..p].to_vec()))
        .collect();
    for p in [0, 2, LEN, LEN + SUM / 2, LEN + SUM, LEN + SUM + n / 2] {
        let mut tail = frame[..p].to_vec();
        tail.resize(frame.len(), 0);
        tails.push((
            format!("torn after {p} bytes, zeros to the frame's end"),
            tail,
        ));
    }
    for (what, tail) in &tails {
        let mut log = good.clone();
        log.extend_from_slice(tail);
        fs::write(&layout.log, &log).unwrap();
        fs::write(&record_path, &record).unwrap();
        assert_eq!(committed(&root), before, "{what}: reader");
        assert_eq!(
            fs::read(&layout.log).unwrap(),
            log,
            "{what}: a reader cuts nothing"
        );
        let (store, report) = FsStore::open(&root).unwrap();
        assert_eq!(store.registry().unwrap(), before, "{what}: writer");
        assert_eq!(report.rolled_back.len(), 1, "{what}: {report:?}");
        assert_eq!(fs::read(&layout.log).unwrap(), good, "{what}: cut back");
        assert!(!record_path.exists(), "{what}");
        for pkg in ["a", "b", "c"] {
            assert!(layout.package_dir(&id(pkg), &v("1.0.0")).is_dir(), "{what}");
        }
    }
    // Without the record, the same torn bytes are damage: the store fails closed.
    let mut log = good.clone();
    log.extend_from_slice(&frame[..frame.len() / 2]);
    fs::write(&layout.log, &log).unwrap();
    let err = open_as(&root, false).map(|_| ()).unwrap_err();
    assert_eq!(
        log_corruption(&err).problem,
        LogProblem::DamagedWithoutCommitInFlight { generation: 4 },
        "{err}"
    );
    assert_eq!(fs::read(&layout.log).unwrap(), log);
    println!("torn appends: {} cases, all cut back", tails.len());
}

/// Lengths crafted so that a frame would fit at nearly every offset after a bad frame would make
/// the search for later frames quadratic (here, gigabytes hashed); it gives up at a bound linear
/// in the log and fails closed.
#[test]
fn store_log_crafted_lengths_after_a_bad_frame_fail_closed_at_a_bounded_cost() {
    let (_dir, root) = store_with_three_frames();
    let layout = StoreLayout::new(&root);
    let good = fs::read(&layout.log).unwrap();
    let starts = frame_starts(&good);
    let tail = 1 << 20;
    let mut log = good[..starts[2]].to_vec();
    let half = u32::try_from(tail / 2).unwrap().to_le_bytes();
    while log.len() < starts[2] + tail {
        log.extend_from_slice(&half);
    }
    fs::write(&layout.log, &log).unwrap();
    let started = std::time::Instant::now();
    let err = guild_adapters_fs::store::read_registry(&root).unwrap_err();
    assert_eq!(
        *log_corruption(&err),
        LogCorruption {
            offset: starts[2] as u64,
            problem: LogProblem::DamagedBeforeUnchecked { len: tail as u64 },
        },
        "{err}"
    );
    assert!(started.elapsed().as_secs() < 10, "{:?}", started.elapsed());
    assert_eq!(fs::read(&layout.log).unwrap(), log);
}

/// A reader of one package holds that package's record, read through the checkpoint and every
/// frame, and the store-wide facts, and refuses to write; a damaged checkpoint is refused as the
/// full reader refuses it, naming the file.
#[test]
fn store_package_reader_reads_one_package_and_refuses_to_write() {
    let (_dir, root) = store_with_three_frames();
    let layout = StoreLayout::new(&root);
    let full = committed(&root);
    for name in ["a", "b", "c", "absent"] {
        let (store, report) = FsStore::open_package_reader(&root, &id(name)).unwrap();
        assert!(report.is_clean(), "{report:?}");
        let registry = store.registry().unwrap();
        assert_eq!(registry.generation(), full.generation(), "{name}");
        assert_eq!(
            registry.package(&id(name)),
            full.package(&id(name)),
            "{name}"
        );
        let others = registry.packages().filter(|(k, _)| k.as_str() != name);
        assert_eq!(others.count(), 0, "{name}");
        assert_eq!(store.refresh().unwrap(), full.generation());
        assert_eq!(store.registry().unwrap(), registry);
        let err = store.begin_write().unwrap_err();
        assert_eq!(err.kind, StoreErrorKind::InvalidTransaction, "{err}");
        let err = publish(&store, "d", "1.0.0", ENABLED).unwrap_err();
        assert_eq!(err.kind, StoreErrorKind::InvalidTransaction, "{err}");
        assert_eq!(
            store.recover().unwrap_err().kind,
            StoreErrorKind::InvalidTransaction
        );
    }
    assert_eq!(committed(&root), full, "nothing was written");
    // The checkpoint compacted, so that it holds all three, then damaged in b's record.
    {
        let (store, _) =
            FsStore::open_with(&root, StoreOptions::new().compact_log_over(0)).unwrap();
        publish(&store, "d", "1.0.0", ENABLED).unwrap();
    }
    let good = fs::read_to_string(&layout.registry).unwrap();
    assert!(good.contains("\"id\":\"b\""), "{good}");
    // Damage inside b's record that keeps its length: a reader of b refuses it as the full
    // reader does; a reader of a reads a's row and record through the index and answers a.
    // Damage that moves what follows, or cuts the file, every reader refuses.
    let in_b = good.replace("\"id\":\"b\",", "\"id\":\"b\" ");
    let damaged = [
        in_b.clone(),
        good.replace("\"id\":\"b\",", "\"id\":\"b\",\"x\":nul,"),
        good[..good.len() - 2].to_owned(),
    ];
    for bad in &damaged {
        fs::write(&layout.registry, bad).unwrap();
        let full = open_as(&root, true).unwrap_err();
        assert_eq!(full.kind, StoreErrorKind::Corrupt, "{full}");
        for name in ["a", "b"] {
            let read = FsStore::open_package_reader(&root, &id(name));
            if name == "a" && *bad == in_b {
                let (one, _) = read.unwrap();
                assert!(one.registry().unwrap().package(&id("a")).is_some());
                continue;
            }
            let Err(one) = read else {
                panic!("a reader of {name} read the damaged checkpoint {bad}")
            };
            assert_eq!(one.to_string(), full.to_string());
            assert_eq!(one.path.as_deref(), Some(layout.registry.as_path()));
        }
    }
}

/// A reader of the listing lists every package as the whole state lists it, from the
/// checkpoint's index and every frame of the log after it; its registry holds the store-wide
/// facts and no package; it refuses to write and follows the store at refresh. A checkpoint
/// without an index (formats 1 and 2) is listed from the whole state.
#[test]
fn store_listing_reader_lists_the_index_and_the_log_and_refuses_to_write() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let layout = StoreLayout::new(&root);
    {
        // a, b and c in the checkpoint's index; then d, and b's new version, in log frames.
        let (store, _) =
            FsStore::open_with(&root, StoreOptions::new().compact_log_over(0)).unwrap();
        for pkg in ["a", "b", "c"] {
            publish(&store, pkg, "1.0.0", ENABLED).unwrap();
        }
    }
    {
        let (store, _) = FsStore::open(&root).unwrap();
        publish(&store, "d", "1.0.0", ENABLED).unwrap();
        publish(&store, "b", "2.0.0", ENABLED).unwrap();
    }
    let checkpoint = fs::read_to_string(&layout.registry).unwrap();
    assert!(checkpoint.contains("\"guild_registry\":3"), "{checkpoint}");
    assert!(!checkpoint.contains("\"id\":\"d\""), "{checkpoint}");
    assert_eq!(frame_starts(&fs::read(&layout.log).unwrap()).len(), 3);
    let full = committed(&root);
    let (store, report) = FsStore::open_listing_reader(&root).unwrap();
    assert!(report.is_clean(), "{report:?}");
    let listing = store.listing().unwrap();
    assert_eq!(listing, Listing::of(&full));
    let ids: Vec<&str> = listing.rows().map(|r| r.id).collect();
    assert_eq!(ids, ["a", "b", "c", "d"]);
    let b = listing.rows().nth(1).unwrap();
    assert_eq!(b.current.unwrap().version, "2.0.0");
    assert_eq!(b.previous.as_deref(), Some("1.0.0"));
    let registry = store.registry().unwrap();
    assert_eq!(registry.generation(), full.generation());
    assert_eq!(registry.packages().count(), 0);
    assert!(store.records_packages().unwrap());
    let err = store.begin_write().unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::InvalidTransaction, "{err}");
    let err = publish(&store, "e", "1.0.0", ENABLED).unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::InvalidTransaction, "{err}");
    assert_eq!(
        store.recover().unwrap_err().kind,
        StoreErrorKind::InvalidTransaction
    );
    // Another handle commits: the listing follows at refresh.
    {
        let (writer, _) = FsStore::open(&root).unwrap();
        publish(&writer, "e", "1.0.0", ENABLED).unwrap();
    }
    store.refresh().unwrap();
    assert_eq!(store.listing().unwrap(), Listing::of(&committed(&root)));
    assert_eq!(store.listing().unwrap().len(), 5);
    drop(store);
    // The same store with a format-2 checkpoint (the index cut out), then in format 1.
    let text = fs::read_to_string(&layout.registry).unwrap();
    let start = text.find(",\"index\":").unwrap();
    let end = text.rfind(",\"packages\":").unwrap();
    let format_2 = format!("{}{}", &text[..start], &text[end..]).replacen(
        "\"guild_registry\":3",
        "\"guild_registry\":2",
        1,
    );
    fs::write(&layout.registry, format_2).unwrap();
    let want = Listing::of(&committed(&root));
    let (store, _) = FsStore::open_listing_reader(&root).unwrap();
    assert_eq!(store.listing().unwrap(), want);
    drop(store);
    // A format-2 checkpoint's next rewrite is format 3.
    {
        let (writer, _) =
            FsStore::open_with(&root, StoreOptions::new().compact_log_over(0)).unwrap();
        publish(&writer, "f", "1.0.0", ENABLED).unwrap();
    }
    let text = fs::read_to_string(&layout.registry).unwrap();
    assert!(text.contains("\"guild_registry\":3"), "{text}");
    let want = Listing::of(&committed(&root));
    let (store, _) = FsStore::open_listing_reader(&root).unwrap();
    assert_eq!(store.listing().unwrap(), want);
    drop(store);
    guild_adapters_fs::store::testing::as_format_1(&root).unwrap();
    let (store, _) = FsStore::open_listing_reader(&root).unwrap();
    assert_eq!(store.listing().unwrap(), want);
}

/// On a checkpoint large enough to be read in parts (its head and index, its end, one record),
/// a listing and a reader of one package answer what the whole state says; damage that moves or
/// cuts the records is refused by both, and damage confined to another package's record (the
/// file keeping its length) is left to the full reader.
#[test]
fn store_large_checkpoint_is_listed_and_read_for_one_package_in_parts() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let layout = StoreLayout::new(&root);
    let names: Vec<String> = (0..1500).map(|i| format!("pkg{i:04}")).collect();
    let versions: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "1.0.0")).collect();
    {
        let (store, _) =
            FsStore::open_with(&root, StoreOptions::new().compact_log_over(0)).unwrap();
        super::publish_many(&store, &versions, |_, tx| tx).unwrap();
    }
    {
        let (store, _) = FsStore::open(&root).unwrap();
        publish(&store, "zz", "1.0.0", ENABLED).unwrap();
    }
    let good = fs::read(&layout.registry).unwrap();
    // Past the size from which the readers read a checkpoint in parts (128 KiB), with a head
    // longer than the first part they read (64 KiB).
    assert!(good.len() > 256 << 10, "{}", good.len());
    let full = committed(&root);
    // The committed state is read through the same reader in parts as the state under test:
    // hold it to the reader of the whole document, which reads every byte of the file (and to
    // the one package the log adds after it).
    let (whole, _) = StoreState::from_any_json(&good).unwrap();
    assert_eq!(whole.packages().count(), 1500);
    for (id, package) in whole.packages() {
        assert_eq!(full.package(id), Some(package), "{id}");
    }
    assert_eq!(full.packages().count(), 1501);
    assert!(full.package(&id("zz")).is_some());
    let before = reads_in_parts();
    let (store, _) = FsStore::open_listing_reader(&root).unwrap();
    assert_eq!(store.listing().unwrap(), Listing::of(&full));
    assert_eq!(store.listing().unwrap().len(), 1501);
    drop(store);
    for name in ["pkg0000", "pkg0400", "pkg1499", "zz", "absent"] {
        let (store, _) = FsStore::open_package_reader(&root, &id(name)).unwrap();
        assert_eq!(
            store.registry().unwrap().package(&id(name)),
            full.package(&id(name)),
            "{name}"
        );
    }
    // Every one of those read the checkpoint in parts (other tests running at once may add
    // to the count, never take from it).
    assert!(
        reads_in_parts() >= before + 6,
        "{}",
        reads_in_parts() - before
    );
    // A record damaged without moving anything: the readers of other packages, and the
    // listing, answer as before; the full reader and a reader of that package refuse it.
    let text = String::from_utf8(good.clone()).unwrap();
    let in_record = text.replacen("{\"id\":\"pkg0400\",", "{\"id\":\"pkg0400\" ", 1);
    assert_ne!(in_record, text);
    fs::write(&layout.registry, &in_record).unwrap();
    let err = open_as(&root, true).unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::Corrupt, "{err}");
    assert_eq!(
        FsStore::open_package_reader(&root, &id("pkg0400"))
            .unwrap_err()
            .to_string(),
        err.to_string()
    );
    let (store, _) = FsStore::open_package_reader(&root, &id("pkg0399")).unwrap();
    assert!(store.registry().unwrap().package(&id("pkg0399")).is_some());
    let (store, _) = FsStore::open_listing_reader(&root).unwrap();
    assert_eq!(store.listing().unwrap(), Listing::of(&full));
    drop(store);
    // Cut short, or grown: every reader refuses it with the full reader's error.
    for bad in [
        &good[..good.len() - 1],
        &good[..good.len() / 2],
        &[&good[..], b"{}"].concat(),
    ] {
        fs::write(&layout.registry, bad).unwrap();
        let err = open_as(&root, true).unwrap_err();
        assert_eq!(err.kind, StoreErrorKind::Corrupt, "{err}");
        let listing = FsStore::open_listing_reader(&root).map(|_| ());
        assert_eq!(listing.unwrap_err().to_string(), err.to_string());
        let one = FsStore::open_package_reader(&root, &id("pkg0001")).map(|_| ());
        assert_eq!(one.unwrap_err().to_string(), err.to_string());
    }
}
