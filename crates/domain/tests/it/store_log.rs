//! The registry delta: the change one commit makes, its strict encoding, and applying it with
//! the invariants checked only where it changes something.

use std::collections::BTreeMap;
use std::sync::Arc;

use guild_domain::ids::{PackageId, PackageKind, PublisherId, Sha256Digest};
use guild_domain::store_log::{DeltaError, Retrust, RetrustScope, StoreStateDelta};
use guild_domain::store_state::{
    ApplyError, NewVersion, PackageRecord, PublishOptions, StoreState, StoreStateDecodeError,
    StoreStateInvariantError, Taint,
};
use guild_domain::trust::{TrustAnchor, TrustBinding};
use guild_domain::version::Version;

const ENABLE: PublishOptions = PublishOptions {
    enable: true,
    allow_downgrade: false,
};

fn id(s: &str) -> PackageId {
    PackageId::new(s).unwrap()
}

fn v(s: &str) -> Version {
    Version::parse(s).unwrap()
}

fn new_version(tag: &str) -> NewVersion {
    NewVersion {
        payload_digest: Sha256Digest::of(tag.as_bytes()),
        kind: PackageKind::Module,
        publisher: PublisherId::new("org.example").unwrap(),
        signed_by: Vec::new(),
        facts: None,
    }
}

fn anchor(generation: u64) -> TrustAnchor {
    TrustAnchor {
        binding: TrustBinding {
            store_id: "0123456789abcdef0123456789abcdef".to_owned(),
            generation,
        },
        file_digest: Sha256Digest::of(format!("trust {generation}").as_bytes()),
        revoked_keys: BTreeMap::from([(Sha256Digest::of(b"k"), "lost".to_owned())]),
        revoked_digests: BTreeMap::new(),
    }
}

/// `n` packages `p0`, `p1`, ... each with one enabled version.
fn store_of(n: usize) -> StoreState {
    let mut r = StoreState::new();
    for i in 0..n {
        let name = format!("p{i}");
        r.publish(&id(&name), &v("1.0.0"), new_version(&name), ENABLE)
            .unwrap();
    }
    r.successor()
}

/// Applies the delta between `old` and `new` to `old`, through its JSON encoding.
fn replay(old: &StoreState, new: &StoreState) -> (StoreStateDelta, StoreState) {
    let delta = StoreStateDelta::between(old, new).unwrap();
    let decoded = StoreStateDelta::from_json(&delta.to_json()).unwrap();
    assert_eq!(decoded, delta, "the encoding round-trips");
    let mut state = old.clone();
    state.apply(&decoded).unwrap();
    (delta, state)
}

#[test]
fn store_state_delta_names_only_what_changed_and_replays_to_the_new_state() {
    let old = store_of(100);
    let mut new = old.successor();
    new.publish(&id("p7"), &v("2.0.0"), new_version("p7-2"), ENABLE)
        .unwrap();
    new.disable(&id("p42")).unwrap();
    new.publish(&id("fresh"), &v("0.1.0"), new_version("fresh"), ENABLE)
        .unwrap();
    let (delta, replayed) = replay(&old, &new);
    let changed: Vec<&str> = delta.changed_ids().map(PackageId::as_str).collect();
    assert_eq!(changed, ["fresh", "p42", "p7"]);
    assert_eq!(delta.generation, old.generation() + 1);
    assert_eq!(delta.trust, None);
    assert_eq!(replayed, new);
    assert_eq!(replayed.to_json(), new.to_json());
}

#[test]
fn store_state_delta_carries_taint_trusted_under_and_the_trust_anchor() {
    let mut old = store_of(3);
    old.set_trust_anchor(anchor(1));
    let mut new = old.successor();
    new.taint(
        &id("p1"),
        &v("1.0.0"),
        Taint {
            reason: "a library changed".to_owned(),
            file: Some("lib/x.so".to_owned()),
        },
    )
    .unwrap();
    assert!(new.set_trusted_under(&id("p2"), &v("1.0.0"), Sha256Digest::of(b"t")));
    new.set_trust_anchor(anchor(2));
    let (delta, replayed) = replay(&old, &new);
    assert_eq!(delta.trust, Some(anchor(2)));
    assert_eq!(delta.packages.len(), 2);
    assert_eq!(replayed, new);
}

#[test]
fn store_state_delta_records_a_deletion() {
    let old = store_of(3);
    // A state without p1: the store refuses such a commit, but the delta can say it.
    let mut json = String::from_utf8(old.successor().to_json()).unwrap();
    let start = json.find("    {\n      \"id\": \"p1\"").unwrap();
    let end = json[start..].find("    },\n").unwrap() + start + "    },\n".len();
    json.replace_range(start..end, "");
    let new = StoreState::from_json(json.as_bytes()).unwrap();
    let (delta, replayed) = replay(&old, &new);
    assert_eq!(delta.packages, BTreeMap::from([(id("p1"), None)]));
    assert_eq!(replayed, new);
}

#[test]
fn store_state_delta_refuses_to_drop_the_trust_anchor() {
    let mut old = store_of(1);
    old.set_trust_anchor(anchor(1));
    let new = StoreState::from_json(&store_of(1).successor().to_json()).unwrap();
    assert_eq!(
        StoreStateDelta::between(&old, &new),
        Err(DeltaError::DropsTrust)
    );
}

#[test]
fn registry_apply_refuses_another_generation_and_changes_nothing() {
    let old = store_of(2);
    let mut new = old.successor();
    new.disable(&id("p0")).unwrap();
    let mut delta = StoreStateDelta::between(&old, &new).unwrap();
    for generation in [old.generation(), old.generation() + 2, 0] {
        delta.generation = generation;
        let mut state = old.clone();
        assert_eq!(
            state.apply(&delta),
            Err(ApplyError::Generation {
                current: old.generation(),
                delta: generation
            })
        );
        assert_eq!(state, old);
    }
}

#[test]
fn registry_apply_checks_the_changed_packages_and_undoes_a_refused_delta() {
    let old = store_of(3);
    let mut delta = StoreStateDelta {
        generation: old.generation() + 1,
        trust: Some(anchor(5)),
        fleet: None,
        retrust: None,
        packages: BTreeMap::new(),
    };
    // One good change, then a package without versions, which no registry may hold.
    let mut changed = old.successor();
    changed.disable(&id("p0")).unwrap();
    delta.packages.insert(
        id("p0"),
        Some(Arc::new(changed.package(&id("p0")).unwrap().clone())),
    );
    delta
        .packages
        .insert(id("p2"), Some(Arc::new(PackageRecord::default())));
    let mut state = old.clone();
    assert_eq!(
        state.apply(&delta),
        Err(ApplyError::Invariant(
            StoreStateInvariantError::EmptyPackage { id: id("p2") }
        ))
    );
    assert_eq!(state, old, "nothing of the refused delta stays");
}

#[test]
fn store_state_delta_decoding_is_strict() {
    let old = store_of(1);
    let mut new = old.successor();
    new.disable(&id("p0")).unwrap();
    // Indented, so that the cases below can name members with their spacing; the reader
    // accepts any whitespace.
    let good = guild_domain::json::parse(&StoreStateDelta::between(&old, &new).unwrap().to_json())
        .unwrap()
        .to_pretty_string();
    let cases = [
        (
            good.replace("\"deleted\": []", "\"deleted\": [], \"extra\": 1"),
            "unknown field at $.extra",
        ),
        (
            good.replace("\"guild_registry_delta\": 1", "\"guild_registry_delta\": 9"),
            "9",
        ),
        (
            good.replace("\"deleted\": []", "\"deleted\": [\"p0\"]"),
            "package p0 appears more than once at $.deleted[0]",
        ),
        (
            good.replace("\"deleted\": []", "\"deleted\": [7]"),
            "expected string, found integer at $.deleted[0]",
        ),
        (
            good.replace(",\n  \"deleted\": []", ""),
            "required field is missing at $.deleted",
        ),
        (
            good.replace("\"generation\"", "\"generatio\""),
            "unknown field at $.generatio",
        ),
        (good[..good.len() / 2].to_owned(), "not strict JSON"),
    ];
    for (bytes, says) in cases {
        let err = StoreStateDelta::from_json(bytes.as_bytes())
            .expect_err(&bytes)
            .to_string();
        assert!(err.contains(says), "{err} does not say {says}");
    }
}

#[test]
fn registry_checkpoint_format_is_refused_by_the_format_1_reader() {
    let state = store_of(2);
    let checkpoint = state.to_checkpoint_json();
    assert_eq!(
        StoreState::from_json(&checkpoint),
        Err(StoreStateDecodeError::UnsupportedFormat {
            found: "3".to_owned()
        })
    );
    assert_eq!(
        StoreState::from_any_json(&checkpoint),
        Ok((state.clone(), 3))
    );
    // A format-2 checkpoint (what earlier builds wrote) still reads.
    assert_eq!(
        StoreState::from_any_json(&without_index(&checkpoint)),
        Ok((state.clone(), 2))
    );
    assert_eq!(StoreState::from_any_json(&state.to_json()), Ok((state, 1)));
}

/// What a reader of one package makes of `bytes`: the package, the store-wide facts and how
/// many packages it kept.
fn read_one(bytes: &[u8], only: &str) -> (Option<PackageRecord>, u64, Option<TrustAnchor>, usize) {
    let (state, _) = StoreState::from_any_json_only(bytes, &id(only)).unwrap();
    (
        state.package(&id(only)).cloned(),
        state.generation(),
        state.trust_anchor().cloned(),
        state.packages().count(),
    )
}

#[test]
fn registry_reader_of_one_package_keeps_it_and_the_store_wide_facts() {
    let mut state = store_of(5);
    state.set_trust_anchor(anchor(1));
    state
        .publish(&id("p3"), &v("2.0.0"), new_version("p3-2"), ENABLE)
        .unwrap();
    let indented = state.to_json();
    let checkpoint = state.to_checkpoint_json();
    // A package whose id is not its first member is read the slow way, with the same answer.
    let reordered = String::from_utf8(indented.clone()).unwrap().replace(
        "\"id\": \"p3\",\n      \"previous\": \"1.0.0\",",
        "\"previous\": \"1.0.0\", \"id\": \"p3\",",
    );
    assert_ne!(reordered.as_bytes(), indented);
    for bytes in [&indented, &checkpoint, &reordered.into_bytes()] {
        for name in ["p0", "p3", "p4"] {
            assert_eq!(
                read_one(bytes, name),
                (
                    state.package(&id(name)).cloned(),
                    state.generation(),
                    Some(anchor(1)),
                    1
                ),
                "{name}"
            );
        }
        assert_eq!(
            read_one(bytes, "absent"),
            (None, state.generation(), Some(anchor(1)), 0)
        );
    }
}

/// A format-3 checkpoint made format 2: its index cut out, its marker changed.
fn without_index(checkpoint: &[u8]) -> Vec<u8> {
    let text = String::from_utf8(checkpoint.to_vec()).unwrap();
    let start = text.find(",\"index\":").unwrap();
    let end = text.rfind(",\"packages\":").unwrap();
    format!("{}{}", &text[..start], &text[end..])
        .replacen("\"guild_registry\":3", "\"guild_registry\":2", 1)
        .into_bytes()
}

#[test]
fn registry_reader_of_one_package_refuses_a_damaged_file_as_the_full_reader_does() {
    let mut state = store_of(5);
    state.set_trust_anchor(anchor(1));
    let indexed = state.to_checkpoint_json();
    // Read through the index (format 3), and by passing over the other records (format 2).
    for checkpoint in [indexed.clone(), without_index(&indexed)] {
        refused_as_the_full_reader_does(String::from_utf8(checkpoint).unwrap());
    }
}

fn refused_as_the_full_reader_does(good: String) {
    let indexed = good.contains("\"index\":");
    let digest = Sha256Digest::of(b"p3").to_hex();
    let mut zeroed = good.clone().into_bytes();
    let at = good.find("\"p3\"").unwrap();
    zeroed[at..at + 40].fill(0);
    // Damage confined to package p3: its record, or (in an indexed checkpoint) its row.
    let in_p3 = [
        good.replace(&digest, &format!("{}\u{1}", &digest[1..]))
            .into_bytes(),
        good.replace(&digest, &format!("{}\\x", &digest[2..]))
            .into_bytes(),
        zeroed,
    ];
    let damaged = [
        good.replace("\"p3\"", "\"p3\" 7").into_bytes(),
        good.as_bytes()[..good.len() / 2].to_vec(),
        good.as_bytes()[..good.len() - 1].to_vec(),
        good.replace("\"state\":\"enabled\"", "\"state\":null")
            .into_bytes(),
        format!("{good}{{}}").into_bytes(),
        format!("{good} ,").into_bytes(),
    ];
    for bytes in damaged.iter().chain(&in_p3) {
        let full = StoreState::from_any_json(bytes).unwrap_err();
        for name in ["p1", "p3"] {
            let read = StoreState::from_any_json_only(bytes, &id(name));
            if indexed && name == "p1" && in_p3.contains(bytes) {
                // Through the index, a reader of p1 reads p1's row and record alone: damage
                // confined to another package is the full reader's to find.
                assert_eq!(read.unwrap().0.package(&id("p1")), state_p1(&good).as_ref());
                continue;
            }
            assert_eq!(
                read,
                Err(full.clone()),
                "{}",
                String::from_utf8_lossy(bytes)
            );
        }
    }
    // What it does not check in a package it passes over: that package's fields (here a
    // version that does not parse). Read for that package, the file is refused.
    let bad_version = good.replacen("\"version\":\"1.0.0\"", "\"version\":\"1.0.x\"", 1);
    let full = StoreState::from_any_json(bad_version.as_bytes()).unwrap_err();
    assert_eq!(
        StoreState::from_any_json_only(bad_version.as_bytes(), &id("p0")),
        Err(full)
    );
    assert!(StoreState::from_any_json_only(bad_version.as_bytes(), &id("p1")).is_ok());
}

/// Package p1's record in checkpoint `good`.
fn state_p1(good: &str) -> Option<PackageRecord> {
    let (state, _) = StoreState::from_any_json(good.as_bytes()).unwrap();
    state.package(&id("p1")).cloned()
}

#[test]
fn store_state_delta_reader_of_one_package_keeps_its_change() {
    let mut old = store_of(5);
    old.publish(&id("gone"), &v("1.0.0"), new_version("gone"), ENABLE)
        .unwrap();
    let old = old.successor();
    let mut draft = old.successor();
    draft.set_trust_anchor(anchor(2));
    draft
        .publish(&id("p2"), &v("2.0.0"), new_version("p2-2"), ENABLE)
        .unwrap();
    draft.disable(&id("p4")).unwrap();
    // A state without `gone`: the store refuses such a commit, but the delta can say it.
    let mut text = String::from_utf8(draft.to_json()).unwrap();
    let start = text.find("    {\n      \"id\": \"gone\"").unwrap();
    let end = text[start..].find("    },\n").unwrap() + start + "    },\n".len();
    text.replace_range(start..end, "");
    let new = StoreState::from_json(text.as_bytes()).unwrap();
    let delta = StoreStateDelta::between(&old, &new).unwrap();
    let bytes = delta.to_json();
    for name in ["p2", "p4", "gone", "p0", "absent"] {
        let one = StoreStateDelta::from_json_only(&bytes, &id(name)).unwrap();
        let mut expected = delta.clone();
        expected.packages.retain(|k, _| k.as_str() == name);
        assert_eq!(one, expected, "{name}");
        // Applied to the state a reader of that package holds, it gives what the full state
        // holds of it.
        let (mut state, _) =
            StoreState::from_any_json_only(&old.to_checkpoint_json(), &id(name)).unwrap();
        state.apply(&one).unwrap();
        assert_eq!(state.package(&id(name)), new.package(&id(name)), "{name}");
        assert_eq!(state.trust_anchor(), Some(&anchor(2)));
    }
    let damaged = String::from_utf8(bytes.clone())
        .unwrap()
        .replace("\"p4\"", "\"p4\",");
    assert_eq!(
        StoreStateDelta::from_json_only(damaged.as_bytes(), &id("p2")),
        Err(StoreStateDelta::from_json(damaged.as_bytes()).unwrap_err())
    );
}

/// A store of `n` packages each with an enabled version authenticated under trust file
/// `anchor(1)`, right after a trust change recorded `anchor(2)`; and the draft the next writer
/// commits once every enabled version's signatures passed under the new file.
fn after_a_trust_change(n: usize) -> (StoreState, StoreState) {
    let mut state = store_of(n);
    state.set_trust_anchor(anchor(1));
    for i in 0..n {
        state.set_trusted_under(&id(&format!("p{i}")), &v("1.0.0"), anchor(1).file_digest);
    }
    let mut old = state.successor();
    old.set_trust_anchor(anchor(2));
    let mut new = old.successor();
    for i in 0..n {
        assert!(new.set_trusted_under(&id(&format!("p{i}")), &v("1.0.0"), anchor(2).file_digest));
    }
    (old, new)
}

#[test]
fn store_state_delta_of_a_trust_change_is_the_same_size_at_any_store_size() {
    for n in [1, 10, 1_000] {
        let (old, new) = after_a_trust_change(n);
        let (delta, replayed) = replay(&old, &new);
        let bytes = delta.to_json().len();
        assert!(bytes < 400, "{n} packages: a frame of {bytes} bytes");
        assert_eq!(replayed, new);
    }
}

#[test]
fn store_state_delta_retrusts_beside_other_changes_and_names_what_it_cannot_say() {
    let (old, mut new) = after_a_trust_change(6);
    let digest = anchor(2).file_digest;
    // Beside the re-records: a version that failed is disabled, another package gets a new
    // version, a third is deleted, a new package arrives.
    new.disable(&id("p1")).unwrap();
    new.publish(&id("p2"), &v("2.0.0"), new_version("p2-2"), ENABLE)
        .unwrap();
    new.set_trusted_under(&id("p2"), &v("2.0.0"), digest);
    new.publish(&id("fresh"), &v("1.0.0"), new_version("fresh"), ENABLE)
        .unwrap();
    let (delta, replayed) = replay(&old, &new);
    assert_eq!(replayed, new);
    assert_eq!(
        delta.retrust,
        Some(Retrust {
            trusted_under: digest,
            versions: RetrustScope::Enabled
        })
    );
    let named: Vec<&str> = delta.changed_ids().map(PackageId::as_str).collect();
    assert_eq!(named, ["fresh", "p1", "p2"]);
    let json = String::from_utf8(delta.to_json()).unwrap();
    assert!(json.starts_with("{\"guild_registry_delta\":2,"), "{json}");

    // A package that the rule would change but the commit did not (its enabled version still
    // under the old file): no retrust, every re-recorded package named.
    let (old, mut new) = after_a_trust_change(4);
    let mut stale = old.successor();
    for i in 0..3 {
        stale.set_trusted_under(&id(&format!("p{i}")), &v("1.0.0"), digest);
    }
    let (delta, replayed) = replay(&old, &stale);
    assert_eq!((delta.retrust, delta.packages.len()), (None, 3));
    assert_eq!(replayed, stale);
    let json = String::from_utf8(delta.to_json()).unwrap();
    assert!(json.starts_with("{\"guild_registry_delta\":1,"), "{json}");

    // Superseded versions re-recorded too (the full check): the installed scope.
    new.publish(&id("p3"), &v("2.0.0"), new_version("p3-2"), ENABLE)
        .unwrap();
    let mut old = new.successor();
    old.set_trust_anchor(anchor(3));
    let mut full = old.successor();
    let all: Vec<(PackageId, Version)> = full
        .installed()
        .map(|(i, v, _)| (i.clone(), v.clone()))
        .collect();
    for (i, ver) in &all {
        full.set_trusted_under(i, ver, anchor(3).file_digest);
    }
    let (delta, replayed) = replay(&old, &full);
    assert_eq!(replayed, full);
    assert_eq!(
        (delta.retrust.map(|r| r.versions), delta.packages.len()),
        (Some(RetrustScope::Installed), 0)
    );
}

#[test]
fn store_state_delta_retrust_applies_only_under_the_trust_file_it_names() {
    let (old, new) = after_a_trust_change(3);
    let delta = StoreStateDelta::between(&old, &new).unwrap();
    assert!(delta.retrust.is_some());
    // The trust anchor is not the file the retrust names: refused, nothing changed.
    let mut other = delta.clone();
    other.trust = Some(anchor(7));
    let mut state = old.clone();
    let err = state.apply(&other).unwrap_err();
    assert_eq!(
        err,
        ApplyError::Retrust {
            retrust: anchor(2).file_digest,
            anchor: Some(anchor(7).file_digest)
        }
    );
    assert!(
        err.to_string().contains(&anchor(7).file_digest.to_hex()),
        "{err}"
    );
    assert_eq!(state, old);
    // A state without a trust file at all.
    let bare = store_of(3);
    let mut state = bare.clone();
    let mut at_bare = delta.clone();
    at_bare.generation = bare.generation() + 1;
    assert_eq!(
        state.apply(&at_bare),
        Err(ApplyError::Retrust {
            retrust: anchor(2).file_digest,
            anchor: None
        })
    );
    assert_eq!(state, bare);
    // The generation is still checked.
    let mut late = delta.clone();
    late.generation += 1;
    let mut state = old.clone();
    assert!(matches!(
        state.apply(&late),
        Err(ApplyError::Generation { .. })
    ));
    assert_eq!(state, old);
}

#[test]
fn store_state_delta_retrust_decoding_is_strict() {
    let (old, mut new) = after_a_trust_change(2);
    new.disable(&id("p0")).unwrap();
    let good = guild_domain::json::parse(&StoreStateDelta::between(&old, &new).unwrap().to_json())
        .unwrap()
        .to_pretty_string();
    assert!(good.contains("\"retrust\""), "{good}");
    let digest = anchor(2).file_digest.to_hex();
    let cases = [
        (
            good.replace("\"guild_registry_delta\": 2", "\"guild_registry_delta\": 1"),
            "a retrust needs \"guild_registry_delta\": 2, not 1 at $.retrust",
        ),
        (good.replace(&digest, &digest[1..]), "at $.retrust.sha256"),
        (
            good.replace("\"enabled\"\n", "\"all\"\n"),
            "\"all\" is not a set of versions (\"enabled\" or \"installed\") at $.retrust.versions",
        ),
        (
            good.replace(
                "\"versions\": \"enabled\"",
                "\"versions\": \"enabled\", \"x\": 1",
            ),
            "unknown field at $.retrust.x",
        ),
        (
            good.replace(",\n    \"versions\": \"enabled\"", ""),
            "required field is missing at $.retrust.versions",
        ),
        (
            good.replace("\"guild_registry_delta\": 2", "\"guild_registry_delta\": 3"),
            "format 3 is not supported",
        ),
    ];
    for (bytes, says) in cases {
        assert_ne!(bytes, good, "{says}");
        for only in [None, Some(id("p0")), Some(id("p1"))] {
            let err = match &only {
                None => StoreStateDelta::from_json(bytes.as_bytes()),
                Some(only) => StoreStateDelta::from_json_only(bytes.as_bytes(), only),
            }
            .expect_err(&bytes)
            .to_string();
            assert!(err.contains(says), "{err} does not say {says}");
        }
    }
}

#[test]
fn store_state_delta_reader_of_one_package_applies_the_retrust_to_it() {
    let (old, mut new) = after_a_trust_change(4);
    new.disable(&id("p2")).unwrap();
    let delta = StoreStateDelta::between(&old, &new).unwrap();
    assert!(delta.retrust.is_some());
    let bytes = delta.to_json();
    for name in ["p0", "p2", "p3", "absent"] {
        let one = StoreStateDelta::from_json_only(&bytes, &id(name)).unwrap();
        assert_eq!(one.retrust, delta.retrust, "{name}");
        let (mut state, _) =
            StoreState::from_any_json_only(&old.to_checkpoint_json(), &id(name)).unwrap();
        state.apply(&one).unwrap();
        assert_eq!(state.package(&id(name)), new.package(&id(name)), "{name}");
        assert_eq!(state.packages().count(), usize::from(name != "absent"));
    }
}

/// A checkpoint whose index says something else than its records (a row's column, a record's
/// byte range, where the packages end) is refused by the full reader, which names the row; a
/// reader of the package whose row disagrees refuses it too.
#[test]
fn registry_index_that_disagrees_with_its_records_is_refused() {
    let state = store_of(3);
    let good = String::from_utf8(state.to_checkpoint_json()).unwrap();
    assert!(StoreState::from_any_json(good.as_bytes()).is_ok());
    let row = good.find("[\"p1\",").unwrap();
    let row_end = row + good[row..].find("]]").unwrap();
    let in_row = |from: &str, to: &str| {
        let fixed = good[row..row_end].replacen(from, to, 1);
        assert_ne!(fixed, good[row..row_end], "{from}");
        format!("{}{fixed}{}", &good[..row], &good[row_end..])
    };
    // The row's offset field: ten characters after its id.
    let offset_at = row + "[\"p1\",".len();
    let offset: u64 = good[offset_at..offset_at + 10].trim().parse().unwrap();
    let moved = format!(
        "{}{:>10}{}",
        &good[..offset_at],
        offset + 1,
        &good[offset_at + 10..]
    );
    let end_at = good.find("\"packages_end\":").unwrap() + "\"packages_end\":".len();
    let end = good[end_at..end_at + 10].trim().to_owned();
    let wrong_end = (end.parse::<u64>().unwrap() - 1).to_string();
    let cases = [
        // Same length, so that every byte range still holds: only the column is wrong.
        (in_row("\"enabled\"", "\"removed\""), "$.index.packages[1]"),
        (moved, "$.index.packages[1]"),
        (
            format!(
                "{}{:>10}{}",
                &good[..end_at],
                wrong_end,
                &good[end_at + 10..]
            ),
            "$.index.packages_end",
        ),
    ];
    for (bad, path) in &cases {
        assert_eq!(bad.len(), good.len(), "{bad}");
        let err = StoreState::from_any_json(bad.as_bytes()).unwrap_err();
        assert!(
            err.to_string().ends_with(&format!("at {path}")),
            "{err} ({path})"
        );
    }
    // The row of p1 disagrees with p1's record: a reader of p1 refuses it as the full reader.
    let (bad, _) = &cases[0];
    assert_eq!(
        StoreState::from_any_json_only(bad.as_bytes(), &id("p1")),
        Err(StoreState::from_any_json(bad.as_bytes()).unwrap_err())
    );
}

/// The index lists what the records say, taints (with and without a file), rollback targets
/// and signing keys (recorded and added later) included, and a listing follows a delta that
/// adds a package in the middle of the order and deletes another, as the state does.
#[test]
fn registry_index_lists_every_column_and_a_listing_follows_deltas() {
    use guild_domain::manifest::{SignatureAlgorithm, SignatureEntry};
    use guild_domain::store_state::listing::Listing;
    let mut state = store_of(4);
    let keys = [Sha256Digest::of(b"k1"), Sha256Digest::of(b"k2")];
    let signed = NewVersion {
        signed_by: keys.to_vec(),
        ..new_version("p2-2")
    };
    state
        .publish(&id("p2"), &v("2.0.0"), signed, ENABLE)
        .unwrap();
    let later = SignatureEntry {
        key_id: Sha256Digest::of(b"k3"),
        algorithm: SignatureAlgorithm::EcdsaP256Sha256,
        signature: vec![1, 2, 3],
    };
    assert_eq!(
        state.add_signatures(&id("p2"), &v("2.0.0"), &keys, &[later]),
        1
    );
    for (pkg, file) in [("p1", Some("")), ("p3", Some("lib/x.so")), ("p0", None)] {
        let taint = Taint {
            reason: "a \"quoted\" reason".to_owned(),
            file: file.map(str::to_owned),
        };
        state.taint(&id(pkg), &v("1.0.0"), taint).unwrap();
    }
    state.set_trust_anchor(anchor(1));
    let state = state.successor();
    let checkpoint = state.to_checkpoint_json();
    assert_eq!(
        StoreState::from_any_json(&checkpoint),
        Ok((state.clone(), 3))
    );
    let listing = Listing::from_checkpoint(&checkpoint).unwrap().unwrap();
    assert_eq!(listing, Listing::of(&state));
    let p2 = listing.rows().nth(2).unwrap();
    assert_eq!(p2.previous.as_deref(), Some("1.0.0"));
    let current = p2.current.unwrap();
    assert_eq!(current.version, "2.0.0");
    assert_eq!(current.keys.unwrap().len(), 3);
    let p1 = listing.rows().nth(1).unwrap();
    assert!(p1.current.unwrap().tainted);
    assert_eq!(p1.tainted[0].1.file.as_deref(), Some(""));
    assert_eq!(listing.rows().next().unwrap().tainted[0].1.file, None);
    // A delta that deletes p0 and adds p1a (between p1 and p2) and p9 (last).
    let mut delta = StoreStateDelta {
        generation: state.generation() + 1,
        ..StoreStateDelta::default()
    };
    let other = store_of(1);
    let record = Arc::new(other.package(&id("p0")).unwrap().clone());
    delta.packages.insert(id("p0"), None);
    delta.packages.insert(id("p1a"), Some(Arc::clone(&record)));
    delta.packages.insert(id("p9"), Some(record));
    let mut next = state.clone();
    next.apply(&delta).unwrap();
    let mut followed = listing.clone();
    followed.apply(&delta).unwrap();
    assert_eq!(followed, Listing::of(&next));
    let ids: Vec<&str> = followed.rows().map(|r| r.id).collect();
    assert_eq!(ids, ["p1", "p1a", "p2", "p3", "p9"]);
    // A delta for another generation changes nothing.
    assert!(followed.clone().apply(&delta).is_err());
}

/// A format-3 checkpoint holds its members in the order every writer writes them (the readers
/// of the index alone rely on it): one out of order is refused, naming it.
#[test]
fn registry_checkpoint_members_out_of_order_are_refused() {
    let mut state = store_of(2);
    state.set_trust_anchor(anchor(1));
    let good = String::from_utf8(state.to_checkpoint_json()).unwrap();
    let trust_at = good.find(",\"trust\":").unwrap();
    let index_at = good.find(",\"index\":").unwrap();
    let trust = &good[trust_at..index_at];
    let records_at = good.rfind(",\"packages\":").unwrap();
    // The trust record moved after the index, where the readers of the index alone would not
    // see it.
    let moved = format!(
        "{}{}{}{}",
        &good[..trust_at],
        &good[index_at..records_at],
        trust,
        &good[records_at..]
    );
    let err = StoreState::from_any_json(moved.as_bytes()).unwrap_err();
    assert!(err.to_string().contains("out of order"), "{err}");
    assert!(err.to_string().ends_with("at $.trust"), "{err}");
    assert_eq!(
        StoreState::from_any_json_only(moved.as_bytes(), &id("p1")),
        Err(err)
    );
}
