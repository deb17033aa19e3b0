//! The lifecycle of one installed package version: its states, the events the package manager
//! applies to it, and which transitions are legal.
//!
//! This is a pure state machine. The app decides when an event happens (after the store write
//! succeeded, after the graph and lease checks passed) and asks [`transition`] whether it is legal;
//! a refused transition changes nothing.

use std::fmt;

/// Where a package version stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum State {
    /// Unpacked and verified but not yet published; invisible to loading.
    Staged,
    /// Published, current and enabled: it is loaded.
    Enabled,
    /// Published and current, but switched off by the operator: it is not loaded.
    Disabled,
    /// A newer version was published; this one stays installed as a rollback target.
    Superseded,
    /// Removed from the store. Terminal.
    Removed,
    /// Staging failed or was abandoned before publication; nothing was published. Terminal.
    Discarded,
}

impl State {
    /// Every state, in declaration order.
    pub const ALL: [State; 6] = [
        State::Staged,
        State::Enabled,
        State::Disabled,
        State::Superseded,
        State::Removed,
        State::Discarded,
    ];

    /// Whether the version is the published, current version of its package (enabled or not).
    pub fn is_current(self) -> bool {
        matches!(self, State::Enabled | State::Disabled)
    }

    /// Whether the version is loaded.
    pub fn is_enabled(self) -> bool {
        self == State::Enabled
    }

    /// Whether the version is still installed in the store (and may be a rollback target, loaded or
    /// removed).
    pub fn is_installed(self) -> bool {
        matches!(self, State::Enabled | State::Disabled | State::Superseded)
    }

    /// Whether no event can move the version out of this state.
    pub fn is_terminal(self) -> bool {
        matches!(self, State::Removed | State::Discarded)
    }

    /// The lowercase name used in messages and persisted records.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Staged => "staged",
            State::Enabled => "enabled",
            State::Disabled => "disabled",
            State::Superseded => "superseded",
            State::Removed => "removed",
            State::Discarded => "discarded",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Something the package manager does to a package version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    /// Publication of a staged version committed; `enable` says whether it starts enabled.
    Commit {
        /// Whether the version starts enabled.
        enable: bool,
    },
    /// The operator enabled the current version.
    Enable,
    /// The operator disabled the current version.
    Disable,
    /// A newer version of the same package was published and became current.
    Supersede,
    /// A rollback made this older version current (and enabled) again.
    Restore,
    /// The version was deleted from the store.
    Remove,
    /// A staged version was abandoned, for instance because verification or the commit failed.
    Discard,
}

impl Event {
    /// Every event, with both values of `Commit`.
    pub const ALL: [Event; 8] = [
        Event::Commit { enable: true },
        Event::Commit { enable: false },
        Event::Enable,
        Event::Disable,
        Event::Supersede,
        Event::Restore,
        Event::Remove,
        Event::Discard,
    ];
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Event::Commit { enable: true } => "commit (enabled)",
            Event::Commit { enable: false } => "commit (disabled)",
            Event::Enable => "enable",
            Event::Disable => "disable",
            Event::Supersede => "supersede",
            Event::Restore => "restore",
            Event::Remove => "remove",
            Event::Discard => "discard",
        })
    }
}

/// An event that is not legal in the version's current state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("cannot {event} a package version that is {from}")]
pub struct IllegalTransition {
    /// The version's state.
    pub from: State,
    /// The event that is not legal in it.
    pub event: Event,
}

/// The state `event` moves a version in state `from` to, or why it may not happen.
///
/// Legal moves:
/// - `Staged`: `Commit` publishes it as `Enabled` or `Disabled`; `Discard` abandons it.
/// - `Enabled` ⇄ `Disabled` by `Disable` / `Enable`.
/// - `Enabled` or `Disabled`: `Supersede` when a newer version becomes current.
/// - `Superseded`: `Restore` makes it current and enabled again (rollback, or installing the
///   same version again).
/// - `Enabled`, `Disabled` or `Superseded`: `Remove`. Whether dependents or leases allow it is
///   decided elsewhere (the graph's `check_remove`, the lease ledger).
///
/// Everything else is refused, including repeating an event that already took effect (enabling an
/// enabled version), so that a confused caller is noticed rather than silently ignored.
pub fn transition(from: State, event: Event) -> Result<State, IllegalTransition> {
    use Event as E;
    use State as S;
    let to = match (from, event) {
        (S::Staged, E::Commit { enable: true }) => S::Enabled,
        (S::Staged, E::Commit { enable: false }) => S::Disabled,
        (S::Staged, E::Discard) => S::Discarded,
        (S::Enabled, E::Disable) => S::Disabled,
        (S::Disabled, E::Enable) => S::Enabled,
        (S::Enabled | S::Disabled, E::Supersede) => S::Superseded,
        (S::Superseded, E::Restore) => S::Enabled,
        (S::Enabled | S::Disabled | S::Superseded, E::Remove) => S::Removed,
        _ => return Err(IllegalTransition { from, event }),
    };
    Ok(to)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The expected outcome of every (state, event) pair, one row per state in `State::ALL` order
    /// and one column per event in `Event::ALL` order. `None` means refused.
    #[test]
    fn lifecycle_every_state_event_pair_has_the_exact_outcome() {
        use State::*;
        const X: Option<State> = None;
        #[rustfmt::skip]
        let table: [(State, [Option<State>; 8]); 6] = [
            //            commit+          commit-          enable         disable         supersede         restore        remove         discard
            (Staged,     [Some(Enabled),   Some(Disabled),  X,             X,              X,                X,             X,             Some(Discarded)]),
            (Enabled,    [X,               X,               X,             Some(Disabled), Some(Superseded), X,             Some(Removed), X]),
            (Disabled,   [X,               X,               Some(Enabled), X,              Some(Superseded), X,             Some(Removed), X]),
            (Superseded, [X,               X,               X,             X,              X,                Some(Enabled), Some(Removed), X]),
            (Removed,    [X,               X,               X,             X,              X,                X,             X,             X]),
            (Discarded,  [X,               X,               X,             X,              X,                X,             X,             X]),
        ];
        assert_eq!(table.map(|(s, _)| s), State::ALL);
        let mut checked = 0;
        for (from, row) in table {
            for (event, expected) in Event::ALL.into_iter().zip(row) {
                let got = transition(from, event);
                match expected {
                    Some(to) => assert_eq!(got, Ok(to), "{from} + {event}"),
                    None => assert_eq!(
                        got,
                        Err(IllegalTransition { from, event }),
                        "{from} + {event}"
                    ),
                }
                checked += 1;
            }
        }
        assert_eq!(checked, State::ALL.len() * Event::ALL.len());
    }

    #[test]
    fn lifecycle_terminal_states_accept_nothing_and_predicates_agree() {
        for s in State::ALL {
            let any_legal = Event::ALL.iter().any(|&e| transition(s, e).is_ok());
            assert_eq!(s.is_terminal(), !any_legal, "{s}");
            assert_eq!(
                s.is_current(),
                matches!(s, State::Enabled | State::Disabled),
                "{s}"
            );
        }
        assert!(State::Superseded.is_installed() && !State::Superseded.is_current());
        assert!(!State::Staged.is_installed() && !State::Removed.is_installed());
    }

    #[test]
    fn lifecycle_refusal_reads_well() {
        let err = transition(State::Removed, Event::Enable).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot enable a package version that is removed"
        );
        let err = transition(State::Enabled, Event::Commit { enable: true }).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot commit (enabled) a package version that is enabled"
        );
    }

    #[test]
    fn lifecycle_publish_then_roll_back_walks_the_expected_path() {
        // Version 1 is published, version 2 supersedes it, then a rollback restores version 1.
        let v1 = transition(State::Staged, Event::Commit { enable: true }).unwrap();
        let v1 = transition(v1, Event::Supersede).unwrap();
        let v2 = transition(State::Staged, Event::Commit { enable: true }).unwrap();
        let v2 = transition(v2, Event::Supersede).unwrap();
        let v1 = transition(v1, Event::Restore).unwrap();
        assert_eq!((v1, v2), (State::Enabled, State::Superseded));
        assert_eq!(transition(v2, Event::Remove), Ok(State::Removed));
    }
}
