//! The cache index entry: the `cachekey-{scope}:{key}` aggregate (RFC §Index records, lineage,
//! and validation), and the validation a lookup runs before it trusts a hit.
//!
//! Layout: versions ([`CACHE_FORMAT_VERSION`], [`MIN_CACHE_FORMAT_VERSION`]); the record
//! ([`Target`], [`ParentEdge`], [`Entry`]); the aggregate ([`State`], [`Command`], [`Event`],
//! [`Error`], [`decide`], [`evolve`]); [`validate`] and its [`Validity`].
//!
//! An entry points a key at a snapshot: a checkpoint after a mutating step, or a build's final
//! result. It is written only after everything it references is stored, and the first writer
//! wins (create-if-absent): identical concurrent builds do not produce identical bytes, so a
//! second writer's snapshot is left unreferenced instead of overwriting a pointer someone may be
//! reading. A forced build replaces the pointer by compare-and-set on its `pointer_generation`;
//! every entry records the generation of the parent it was built on, so descendants of a replaced
//! entry fail lineage instead of gluing generations together. Retiring (repair, GC) empties the
//! key; the next publication takes the next generation, so a generation never names two targets.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::build_spec::StepContext;
use super::cache_key::{CacheKey, HASHING_VERSION};
use super::ids::{BuildId, Epoch, SnapshotId};

/// The format of what entries point at (snapshot records, layer stacks). Bumped when a new
/// strata can no longer resume what an older one cached.
pub const CACHE_FORMAT_VERSION: u64 = 1;
/// Entries older than this are misses: the format-scoped invalidation lever.
pub const MIN_CACHE_FORMAT_VERSION: u64 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    Checkpoint,
    FinalResult,
}

/// What a key points at.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Target {
    /// The `build_cache` snapshot sealed after a mutating step, with the context after it.
    Checkpoint {
        snapshot: SnapshotId,
        context: StepContext,
    },
    /// A complete build result; a hit promotes it under the new build's identity.
    FinalResult {
        candidate: SnapshotId,
        build_base_checkpoint: Option<SnapshotId>,
    },
}

impl Target {
    pub fn kind(&self) -> EntryKind {
        match self {
            Target::Checkpoint { .. } => EntryKind::Checkpoint,
            Target::FinalResult { .. } => EntryKind::FinalResult,
        }
    }
    pub fn snapshot(&self) -> SnapshotId {
        match self {
            Target::Checkpoint { snapshot, .. } => *snapshot,
            Target::FinalResult { candidate, .. } => *candidate,
        }
    }
}

/// What the entry was built on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ParentEdge {
    /// The nearest resumable ancestor's entry, exactly as it was when this entry was built.
    Checkpoint {
        key: CacheKey,
        snapshot: SnapshotId,
        pointer_generation: u64,
    },
    /// No checkpoint before this one: the build's base (fingerprint and base identity).
    Root { base_key: CacheKey },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub target: Target,
    pub parent: ParentEdge,
    pub hashing_version: u64,
    pub cache_format_version: u64,
    /// Who built the target (traceability; never part of identity).
    pub build: BuildId,
    pub epoch: Epoch,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    pub entry: Option<Entry>,
    /// 0 until the first publication; every publication and replacement takes the next one.
    pub pointer_generation: u64,
    pub retired: bool,
}

impl State {
    /// The entry a lookup may use, with its generation.
    pub fn live(&self) -> Option<(&Entry, u64)> {
        match (&self.entry, self.retired) {
            (Some(e), false) => Some((e, self.pointer_generation)),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Create-if-absent: the first writer wins; replaying the same entry is a no-op.
    Publish { entry: Entry, now: DateTime<Utc> },
    /// Forced results and repairs: replace the pointer only if it is still at `expected`.
    Replace {
        entry: Entry,
        expected_generation: u64,
        now: DateTime<Utc>,
    },
    /// Empties the key (repair of an invalid entry, GC of its target).
    Retire {
        expected_generation: u64,
        reason: String,
        now: DateTime<Utc>,
    },
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "type")]
pub enum Event {
    #[serde(rename = "CacheEntryPublished.v1")]
    Published {
        entry: Entry,
        pointer_generation: u64,
        at: DateTime<Utc>,
    },
    #[serde(rename = "CacheEntryReplaced.v1")]
    Replaced {
        entry: Entry,
        pointer_generation: u64,
        /// The target it displaced: an orphan for delayed GC.
        displaced: Option<SnapshotId>,
        at: DateTime<Utc>,
    },
    #[serde(rename = "CacheEntryRetired.v1")]
    Retired {
        pointer_generation: u64,
        reason: String,
        at: DateTime<Utc>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("the key already points at snapshot {snapshot} (generation {pointer_generation}); the first writer wins, this build's snapshot stays unreferenced")]
    Occupied {
        snapshot: SnapshotId,
        pointer_generation: u64,
    },
    #[error(
        "the entry moved to generation {actual} (expected {expected}); reload it and decide again"
    )]
    GenerationMismatch { expected: u64, actual: u64 },
    #[error("an entry must be written with the current hashing version {current} and cache format {format} (got {got_hashing}/{got_format})")]
    StaleVersions {
        current: u64,
        format: u64,
        got_hashing: u64,
        got_format: u64,
    },
}

fn check_versions(entry: &Entry) -> Result<(), Error> {
    if entry.hashing_version != HASHING_VERSION
        || entry.cache_format_version != CACHE_FORMAT_VERSION
    {
        return Err(Error::StaleVersions {
            current: HASHING_VERSION,
            format: CACHE_FORMAT_VERSION,
            got_hashing: entry.hashing_version,
            got_format: entry.cache_format_version,
        });
    }
    Ok(())
}

pub fn decide(state: &State, command: &Command) -> Result<Vec<Event>, Error> {
    match command {
        Command::Publish { entry, now } => {
            check_versions(entry)?;
            match state.live() {
                Some((existing, _)) if existing == entry => Ok(vec![]),
                Some((existing, generation)) => Err(Error::Occupied {
                    snapshot: existing.target.snapshot(),
                    pointer_generation: generation,
                }),
                None => Ok(vec![Event::Published {
                    entry: entry.clone(),
                    pointer_generation: state.pointer_generation + 1,
                    at: *now,
                }]),
            }
        }
        Command::Replace {
            entry,
            expected_generation,
            now,
        } => {
            check_versions(entry)?;
            if state.pointer_generation != *expected_generation {
                return Err(Error::GenerationMismatch {
                    expected: *expected_generation,
                    actual: state.pointer_generation,
                });
            }
            Ok(vec![Event::Replaced {
                entry: entry.clone(),
                pointer_generation: state.pointer_generation + 1,
                displaced: state.live().map(|(e, _)| e.target.snapshot()),
                at: *now,
            }])
        }
        Command::Retire {
            expected_generation,
            reason,
            now,
        } => {
            if state.pointer_generation != *expected_generation {
                return Err(Error::GenerationMismatch {
                    expected: *expected_generation,
                    actual: state.pointer_generation,
                });
            }
            if state.live().is_none() {
                return Ok(vec![]);
            }
            Ok(vec![Event::Retired {
                pointer_generation: state.pointer_generation,
                reason: reason.clone(),
                at: *now,
            }])
        }
    }
}

pub fn evolve(mut state: State, event: &Event) -> State {
    match event {
        Event::Published {
            entry,
            pointer_generation,
            ..
        }
        | Event::Replaced {
            entry,
            pointer_generation,
            ..
        } => {
            state.entry = Some(entry.clone());
            state.pointer_generation = *pointer_generation;
            state.retired = false;
        }
        Event::Retired { .. } => state.retired = true,
    }
    state
}

/// The verdict of a lookup on one entry. A transient failure to *load* states is not a verdict:
/// the caller bypasses the cache for the build and changes nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Validity {
    Valid,
    /// Authoritative: a miss for the build, and a repair for the cache.
    Invalid(Invalid),
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("no entry")]
    Absent,
    #[error("the entry was retired")]
    Retired,
    #[error("the entry is a {found:?}, the lookup wanted a {wanted:?}")]
    WrongKind { wanted: EntryKind, found: EntryKind },
    #[error("hashing version {found} is not the current {current}")]
    HashingVersion { found: u64, current: u64 },
    #[error("cache format {found} is outside {minimum}..={current}")]
    FormatVersion {
        found: u64,
        minimum: u64,
        current: u64,
    },
    #[error("the root edge names base {found:?}, this build's base is {expected:?}")]
    RootMismatch { expected: CacheKey, found: CacheKey },
    #[error("parent {key:?} is not a checkpoint of this build's key chain")]
    ParentUnknown { key: CacheKey },
    #[error("the entry names {found} as its parent, not the nearest checkpoint below it ({expected}): it skips a step whose rebuild would not break it")]
    NotNearestParent { expected: String, found: String },
    #[error("parent {key:?} no longer points where this entry was built (lineage broken: expected snapshot {snapshot} at generation {generation})")]
    LineageBroken {
        key: CacheKey,
        snapshot: SnapshotId,
        generation: u64,
    },
}

fn check_one(entry: &Entry) -> Result<(), Invalid> {
    if entry.hashing_version != HASHING_VERSION {
        return Err(Invalid::HashingVersion {
            found: entry.hashing_version,
            current: HASHING_VERSION,
        });
    }
    if !(MIN_CACHE_FORMAT_VERSION..=CACHE_FORMAT_VERSION).contains(&entry.cache_format_version) {
        return Err(Invalid::FormatVersion {
            found: entry.cache_format_version,
            minimum: MIN_CACHE_FORMAT_VERSION,
            current: CACHE_FORMAT_VERSION,
        });
    }
    Ok(())
}

/// Validates `state`, the entry under `key`, as a `wanted` entry of a build whose base key is
/// `base_key`: kind, versions, and lineage back to the root. `chain` holds the build's
/// checkpoint keys with their loaded states, in step order (shallowest first); a parent outside
/// it cannot be part of this build's lineage. Artifacts (are the layers still stored?) are the
/// caller's check: that is I/O, and its failure is "unapplied", not invalid.
///
/// A checkpoint entry must name the nearest checkpoint below it (the root for the first): a
/// build writes its checkpoints in order and stops at the first it cannot write, so an entry
/// naming an older ancestor skipped one, and a forced rebuild of the skipped step would
/// replace that entry without breaking this one. A final result may name any checkpoint of
/// the chain: past the depth budget a build runs its last steps without checkpoints.
pub fn validate(
    state: &State,
    wanted: EntryKind,
    key: &CacheKey,
    base_key: &CacheKey,
    chain: &[(CacheKey, State)],
) -> Validity {
    match walk(state, wanted, key, base_key, chain) {
        Ok(()) => Validity::Valid,
        Err(i) => Validity::Invalid(i),
    }
}

fn walk(
    state: &State,
    wanted: EntryKind,
    key: &CacheKey,
    base_key: &CacheKey,
    chain: &[(CacheKey, State)],
) -> Result<(), Invalid> {
    let mut entry = match (&state.entry, state.retired) {
        (None, _) => return Err(Invalid::Absent),
        (Some(_), true) => return Err(Invalid::Retired),
        (Some(e), false) => e,
    };
    if entry.target.kind() != wanted {
        return Err(Invalid::WrongKind {
            wanted,
            found: entry.target.kind(),
        });
    }
    // Where the current entry sits in the chain: a checkpoint's parent must be the one just
    // below it; a final result's may be any of the chain.
    let mut at = match wanted {
        EntryKind::Checkpoint => Some(
            chain
                .iter()
                .position(|(k, _)| k == key)
                .ok_or(Invalid::ParentUnknown { key: *key })?,
        ),
        EntryKind::FinalResult => None,
    };
    // Each step moves strictly down the chain, so this ends within its length.
    loop {
        check_one(entry)?;
        let below = at.unwrap_or(chain.len());
        let nearest = below.checked_sub(1).map(|i| chain[i].0);
        match &entry.parent {
            ParentEdge::Root { base_key: found } => {
                if let (Some(expected), Some(_)) = (nearest, at) {
                    return Err(Invalid::NotNearestParent {
                        expected: format!("{expected:?}"),
                        found: "the root".to_owned(),
                    });
                }
                return if found == base_key {
                    Ok(())
                } else {
                    Err(Invalid::RootMismatch {
                        expected: *base_key,
                        found: *found,
                    })
                };
            }
            ParentEdge::Checkpoint {
                key: parent_key,
                snapshot,
                pointer_generation,
            } => {
                let index = chain[..below]
                    .iter()
                    .position(|(k, _)| k == parent_key)
                    .ok_or(Invalid::ParentUnknown { key: *parent_key })?;
                if at.is_some() && index + 1 != below {
                    return Err(Invalid::NotNearestParent {
                        expected: format!("{:?}", chain[below - 1].0),
                        found: format!("{parent_key:?}"),
                    });
                }
                let broken = Invalid::LineageBroken {
                    key: *parent_key,
                    snapshot: *snapshot,
                    generation: *pointer_generation,
                };
                match chain[index].1.live() {
                    Some((p, generation))
                        if generation == *pointer_generation
                            && p.target.snapshot() == *snapshot
                            && p.target.kind() == EntryKind::Checkpoint =>
                    {
                        entry = p;
                        at = Some(index);
                    }
                    _ => return Err(broken),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ids::Digest;
    use chrono::TimeZone;
    use proptest::prelude::*;
    use std::collections::BTreeMap;
    use uuid::Uuid;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 29, 12, 0, 0).unwrap()
    }
    fn key(n: u8) -> CacheKey {
        CacheKey(Digest::of(&[n]))
    }
    fn snap(n: u128) -> SnapshotId {
        SnapshotId::from_uuid(Uuid::from_u128(n))
    }
    fn checkpoint(snapshot: SnapshotId, parent: ParentEdge) -> Entry {
        Entry {
            target: Target::Checkpoint {
                snapshot,
                context: StepContext::after_default_user(),
            },
            parent,
            hashing_version: HASHING_VERSION,
            cache_format_version: CACHE_FORMAT_VERSION,
            build: BuildId::from_uuid(Uuid::from_u128(9)),
            epoch: Epoch::FIRST,
        }
    }
    fn apply(state: State, command: Command) -> Result<State, Error> {
        Ok(decide(&state, &command)?.iter().fold(state, evolve))
    }
    fn root() -> ParentEdge {
        ParentEdge::Root { base_key: key(0) }
    }
    fn edge(k: u8, state: &State) -> ParentEdge {
        let (e, g) = state.live().unwrap();
        ParentEdge::Checkpoint {
            key: key(k),
            snapshot: e.target.snapshot(),
            pointer_generation: g,
        }
    }

    #[test]
    fn the_first_writer_wins_and_a_replay_is_a_no_op() {
        let a = checkpoint(snap(1), root());
        let s = apply(
            State::default(),
            Command::Publish {
                entry: a.clone(),
                now: now(),
            },
        )
        .unwrap();
        assert_eq!(s.live().unwrap().1, 1);
        assert_eq!(
            decide(
                &s,
                &Command::Publish {
                    entry: a,
                    now: now()
                }
            )
            .unwrap(),
            vec![]
        );
        let b = checkpoint(snap(2), root());
        assert_eq!(
            decide(
                &s,
                &Command::Publish {
                    entry: b,
                    now: now()
                }
            ),
            Err(Error::Occupied {
                snapshot: snap(1),
                pointer_generation: 1
            })
        );
    }

    #[test]
    fn replace_is_a_compare_and_set_on_the_generation() {
        let s = apply(
            State::default(),
            Command::Publish {
                entry: checkpoint(snap(1), root()),
                now: now(),
            },
        )
        .unwrap();
        let forced = checkpoint(snap(2), root());
        assert_eq!(
            decide(
                &s,
                &Command::Replace {
                    entry: forced.clone(),
                    expected_generation: 0,
                    now: now()
                }
            ),
            Err(Error::GenerationMismatch {
                expected: 0,
                actual: 1
            })
        );
        let events = decide(
            &s,
            &Command::Replace {
                entry: forced.clone(),
                expected_generation: 1,
                now: now(),
            },
        )
        .unwrap();
        assert!(matches!(
            &events[0],
            Event::Replaced { displaced: Some(d), pointer_generation: 2, .. } if *d == snap(1)
        ));
        let s = events.iter().fold(s, evolve);
        assert_eq!(s.live().unwrap(), (&forced, 2));
    }

    #[test]
    fn retire_empties_the_key_and_republication_takes_the_next_generation() {
        let s = apply(
            State::default(),
            Command::Publish {
                entry: checkpoint(snap(1), root()),
                now: now(),
            },
        )
        .unwrap();
        let retire = Command::Retire {
            expected_generation: 1,
            reason: "layer missing".into(),
            now: now(),
        };
        let s = apply(s, retire.clone()).unwrap();
        assert!(s.live().is_none());
        assert_eq!(decide(&s, &retire).unwrap(), vec![], "retire is idempotent");
        let s = apply(
            s,
            Command::Publish {
                entry: checkpoint(snap(3), root()),
                now: now(),
            },
        )
        .unwrap();
        assert_eq!(s.live().unwrap().1, 2);
        assert_eq!(s.live().unwrap().0.target.snapshot(), snap(3));
    }

    #[test]
    fn entries_are_written_with_current_versions_only() {
        let mut e = checkpoint(snap(1), root());
        e.cache_format_version = CACHE_FORMAT_VERSION + 1;
        assert!(matches!(
            decide(
                &State::default(),
                &Command::Publish {
                    entry: e,
                    now: now()
                }
            ),
            Err(Error::StaleVersions { .. })
        ));
    }

    /// A chain base -> k1 -> k2 -> final, as a build publishes it.
    fn chain() -> (Vec<(CacheKey, State)>, State) {
        let s1 = apply(
            State::default(),
            Command::Publish {
                entry: checkpoint(snap(1), root()),
                now: now(),
            },
        )
        .unwrap();
        let s2 = apply(
            State::default(),
            Command::Publish {
                entry: checkpoint(snap(2), edge(1, &s1)),
                now: now(),
            },
        )
        .unwrap();
        let mut fin = checkpoint(snap(3), edge(2, &s2));
        fin.target = Target::FinalResult {
            candidate: snap(3),
            build_base_checkpoint: None,
        };
        let f = apply(
            State::default(),
            Command::Publish {
                entry: fin,
                now: now(),
            },
        )
        .unwrap();
        (vec![(key(1), s1), (key(2), s2)], f)
    }

    #[test]
    fn a_published_chain_validates_back_to_the_root() {
        let (map, fin) = chain();
        assert_eq!(
            validate(&fin, EntryKind::FinalResult, &key(9), &key(0), &map),
            Validity::Valid
        );
        assert_eq!(
            validate(&map[1].1, EntryKind::Checkpoint, &key(2), &key(0), &map),
            Validity::Valid
        );
        assert_eq!(
            validate(&fin, EntryKind::Checkpoint, &key(9), &key(0), &map),
            Validity::Invalid(Invalid::WrongKind {
                wanted: EntryKind::Checkpoint,
                found: EntryKind::FinalResult
            })
        );
        assert!(matches!(
            validate(&fin, EntryKind::FinalResult, &key(9), &key(7), &map),
            Validity::Invalid(Invalid::RootMismatch { .. })
        ));
        assert_eq!(
            validate(
                &State::default(),
                EntryKind::Checkpoint,
                &key(1),
                &key(0),
                &map
            ),
            Validity::Invalid(Invalid::Absent)
        );
        let mut partial = map.clone();
        partial.remove(0);
        assert!(matches!(
            validate(&fin, EntryKind::FinalResult, &key(9), &key(0), &partial),
            Validity::Invalid(Invalid::ParentUnknown { .. })
        ));
    }

    #[test]
    fn replacing_an_ancestor_breaks_every_descendant_but_not_the_ancestor() {
        let (mut map, fin) = chain();
        let forced = checkpoint(snap(10), root());
        let s1 = apply(
            map[0].1.clone(),
            Command::Replace {
                entry: forced,
                expected_generation: 1,
                now: now(),
            },
        )
        .unwrap();
        map[0].1 = s1;
        assert_eq!(
            validate(&map[0].1, EntryKind::Checkpoint, &key(1), &key(0), &map),
            Validity::Valid
        );
        for (state, kind, at) in [
            (&map[1].1, EntryKind::Checkpoint, key(2)),
            (&fin, EntryKind::FinalResult, key(9)),
        ] {
            assert!(matches!(
                validate(state, kind, &at, &key(0), &map),
                Validity::Invalid(Invalid::LineageBroken { .. })
            ));
        }
    }

    /// Found in review: an entry built on a grandparent (what a writer that lost track of the
    /// entry between them wrote) is invalid, so a forced rebuild of the step it skipped still
    /// invalidates it; a final result may name any checkpoint (the depth budget).
    #[test]
    fn a_checkpoint_entry_must_name_the_nearest_checkpoint_below_it() {
        let s1 = apply(
            State::default(),
            Command::Publish {
                entry: checkpoint(snap(1), root()),
                now: now(),
            },
        )
        .unwrap();
        let s2 = apply(
            State::default(),
            Command::Publish {
                entry: checkpoint(snap(2), root()),
                now: now(),
            },
        )
        .unwrap();
        let s3 = apply(
            State::default(),
            Command::Publish {
                entry: checkpoint(snap(3), edge(1, &s1)),
                now: now(),
            },
        )
        .unwrap();
        let map = vec![(key(1), s1.clone()), (key(2), s2), (key(3), s3.clone())];
        for (state, at) in [(&map[1].1, key(2)), (&s3, key(3))] {
            assert!(matches!(
                validate(state, EntryKind::Checkpoint, &at, &key(0), &map),
                Validity::Invalid(Invalid::NotNearestParent { .. })
            ));
        }
        let mut fin = checkpoint(snap(4), edge(1, &s1));
        fin.target = Target::FinalResult {
            candidate: snap(4),
            build_base_checkpoint: None,
        };
        let fin = apply(
            State::default(),
            Command::Publish {
                entry: fin,
                now: now(),
            },
        )
        .unwrap();
        assert_eq!(
            validate(&fin, EntryKind::FinalResult, &key(9), &key(0), &map),
            Validity::Valid
        );
    }

    #[test]
    fn old_formats_are_invalid_at_lookup() {
        let mut e = checkpoint(snap(1), root());
        e.cache_format_version = 0;
        let s = evolve(
            State::default(),
            &Event::Published {
                entry: e,
                pointer_generation: 1,
                at: now(),
            },
        );
        assert!(matches!(
            validate(
                &s,
                EntryKind::Checkpoint,
                &key(1),
                &key(0),
                &[(key(1), s.clone())]
            ),
            Validity::Invalid(Invalid::FormatVersion { found: 0, .. })
        ));
    }

    #[test]
    fn a_cycle_of_parents_is_invalid_not_a_hang() {
        let e1 = checkpoint(
            snap(1),
            ParentEdge::Checkpoint {
                key: key(2),
                snapshot: snap(2),
                pointer_generation: 1,
            },
        );
        let e2 = checkpoint(
            snap(2),
            ParentEdge::Checkpoint {
                key: key(1),
                snapshot: snap(1),
                pointer_generation: 1,
            },
        );
        let s1 = apply(
            State::default(),
            Command::Publish {
                entry: e1,
                now: now(),
            },
        )
        .unwrap();
        let s2 = apply(
            State::default(),
            Command::Publish {
                entry: e2,
                now: now(),
            },
        )
        .unwrap();
        let map = vec![(key(1), s1.clone()), (key(2), s2)];
        assert!(matches!(
            validate(&s1, EntryKind::Checkpoint, &key(1), &key(0), &map),
            Validity::Invalid(_)
        ));
    }

    #[derive(Clone, Debug)]
    enum Op {
        Publish(u8),
        Replace(u8, u64),
        Retire(u64),
    }

    fn arb_op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..4).prop_map(Op::Publish),
            (0u8..4, 0u64..6).prop_map(|(s, g)| Op::Replace(s, g)),
            (0u64..6).prop_map(Op::Retire),
        ]
    }

    #[derive(Clone, Debug)]
    enum ChainOp {
        /// A forced build rebuilds key i on the current entry below it.
        Rebuild(usize),
        /// Repair or GC retires key i.
        Retire(usize),
    }

    fn arb_chain_op() -> impl Strategy<Value = ChainOp> {
        prop_oneof![
            (1usize..6).prop_map(ChainOp::Rebuild),
            (1usize..6).prop_map(ChainOp::Retire),
        ]
    }

    proptest! {
        /// Over any history of forced rebuilds and retirements of a five-checkpoint chain, an
        /// entry validates exactly when it and every ancestor are live and each was built on the
        /// generation its parent has now.
        #[test]
        fn lineage_matches_a_model_of_who_was_built_on_what(ops in proptest::collection::vec(arb_chain_op(), 0..16)) {
            const N: usize = 5;
            let mut states: Vec<State> = vec![State::default(); N + 1];
            // built_on[i]: the generation key i-1 had when key i's current entry was built.
            let mut built_on = [0u64; N + 1];
            let mut next_snapshot = 100u128;
            let build = |i: usize, states: &mut Vec<State>, built_on: &mut [u64; N + 1], next: &mut u128| {
                let parent = if i == 1 { root() } else {
                    match states[i - 1].live() {
                        Some(_) => edge(i as u8 - 1, &states[i - 1]),
                        None => return, // nothing to build on: the forced build would rebuild i-1 first
                    }
                };
                *next += 1;
                let entry = checkpoint(snap(*next), parent);
                let command = match states[i].live() {
                    Some((_, g)) => Command::Replace { entry, expected_generation: g, now: now() },
                    None => Command::Publish { entry, now: now() },
                };
                states[i] = apply(states[i].clone(), command).unwrap();
                built_on[i] = if i == 1 { 0 } else { states[i - 1].pointer_generation };
            };
            for i in 1..=N {
                build(i, &mut states, &mut built_on, &mut next_snapshot);
            }
            for op in ops {
                match op {
                    ChainOp::Rebuild(i) => build(i, &mut states, &mut built_on, &mut next_snapshot),
                    ChainOp::Retire(i) => {
                        let g = states[i].pointer_generation;
                        states[i] = apply(states[i].clone(), Command::Retire { expected_generation: g, reason: "gc".into(), now: now() }).unwrap();
                    }
                }
            }
            let map: Vec<(CacheKey, State)> = (1..=N).map(|i| (key(i as u8), states[i].clone())).collect();
            for j in 1..=N {
                let model = (1..=j).all(|i| {
                    states[i].live().is_some()
                        && (i == 1 || (states[i - 1].live().is_some() && built_on[i] == states[i - 1].pointer_generation))
                });
                let verdict = validate(&states[j], EntryKind::Checkpoint, &key(j as u8), &key(0), &map);
                prop_assert_eq!(verdict == Validity::Valid, model, "key {}: {:?}", j, verdict);
            }
        }

        /// Generations only grow, each names one target, and a CAS with a stale generation never
        /// changes the pointer.
        #[test]
        fn generations_name_one_target_each(ops in proptest::collection::vec(arb_op(), 0..24)) {
            let mut state = State::default();
            let mut named: BTreeMap<u64, SnapshotId> = BTreeMap::new();
            for op in ops {
                let before = state.clone();
                let command = match op {
                    Op::Publish(s) => Command::Publish { entry: checkpoint(snap(s.into()), root()), now: now() },
                    Op::Replace(s, g) => Command::Replace { entry: checkpoint(snap(s.into()), root()), expected_generation: g, now: now() },
                    Op::Retire(g) => Command::Retire { expected_generation: g, reason: "gc".into(), now: now() },
                };
                match decide(&state, &command) {
                    Ok(events) => state = events.iter().fold(state, evolve),
                    Err(_) => { prop_assert_eq!(&state, &before); continue; }
                }
                prop_assert!(state.pointer_generation >= before.pointer_generation);
                if let Command::Replace { expected_generation, .. } = command {
                    prop_assert_eq!(expected_generation, before.pointer_generation);
                }
                if let Some((e, g)) = state.live() {
                    let first = *named.entry(g).or_insert(e.target.snapshot());
                    prop_assert_eq!(first, e.target.snapshot());
                }
            }
        }
    }
}
