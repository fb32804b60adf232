//! The stored-object lifecycle: the `object-{digest}` aggregate (RFC §Lifecycle and bounded
//! storage), the per-object Deleting barrier that garbage collection passes through.
//!
//! Layout: [`Lifecycle`], [`Deletion`], [`State`], [`Command`], [`Event`], [`Error`], [`decide`],
//! [`evolve`].
//!
//! An object (a layer tar, an upload archive) is `Live` from the moment a writer registers it.
//! Readers that boot on it hold an exact-object lease until a time they renew. Garbage collection
//! never deletes a Live object directly: a pass first marks it `Deleting` (refused while any lease
//! is unexpired), which from then on admits no new lease and no new registration, then deletes
//! the bytes and records `Deleted`. A writer that meets `Deleting` waits for `Deleted` and writes
//! the object again (a new generation) instead of linking to doomed bytes. Every mark records
//! which pass, which retention tier and what referenced the object last, so the history answers
//! "why was this deleted".
//!
//! A pass that cannot finish (the store refused the delete, the pass lost its roots) returns the
//! object to `Live` with `AbortDeletion`: failing closed means keeping the bytes.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

/// A use of a Live object recorded this recently is not recorded again: the write is a guard on
/// the stream's version instead (it still loses to a pass's mark), so an object every build
/// uses (a common base layer) gains an event per window, not one per build. The recorded last
/// use may therefore trail the real one by up to this much; grace periods are judged against the
/// recorded time.
pub const USE_REFRESH: Duration = Duration::minutes(5);

/// Where an object is in its life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Lifecycle {
    /// Never registered.
    #[default]
    Absent,
    Live,
    /// A GC pass is removing it: no new lease, no new registration.
    Deleting,
    /// Removed; registering it again starts the next generation.
    Deleted,
}

/// The pass that marked the object and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deletion {
    /// The GC pass (one id per pass, so two concurrent passes never both own an object).
    pub pass: String,
    /// The retention tier that chose it (e.g. `superseded-checkpoint`).
    pub tier: String,
    /// Human-readable reason (e.g. `build 3f… was superseded by 9a…; kept 24h`).
    pub reason: String,
    /// What referenced the object last, if anything did.
    pub last_referenced_by: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    pub lifecycle: Lifecycle,
    /// 0 before the first registration; each registration after a deletion takes the next.
    pub generation: u64,
    /// The last registration, reference or lease.
    pub last_used: Option<DateTime<Utc>>,
    /// Who wrote the current generation.
    pub registered_by: Option<String>,
    /// Reader leases by holder, with the time each lapses (expired ones linger until released;
    /// [`State::leased_at`] ignores them).
    pub leases: BTreeMap<String, DateTime<Utc>>,
    /// Set while Deleting, and kept once Deleted, for the audit answer.
    pub deletion: Option<Deletion>,
    /// When the current deletion mark was made.
    pub marked_at: Option<DateTime<Utc>>,
}

impl State {
    /// The holders whose leases are unexpired at `now`, with their expiry.
    pub fn leased_at(&self, now: DateTime<Utc>) -> Vec<(&str, DateTime<Utc>)> {
        self.leases
            .iter()
            .filter(|(_, until)| **until > now)
            .map(|(h, u)| (h.as_str(), *u))
            .collect()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// A writer stored the bytes (or found them stored), or a reader is about to use them:
    /// registers the object when it is not live, and records the use when it is.
    Register { by: String, now: DateTime<Utc> },
    /// A reader pins the object until `until`; renewing moves `until`.
    Lease {
        holder: String,
        until: DateTime<Utc>,
        now: DateTime<Utc>,
    },
    /// Ends `holder`'s lease before it lapses. No worker releases today: a lease may be shared
    /// by later readers (see `decide`), who would lose their pin with it.
    Release { holder: String, now: DateTime<Utc> },
    /// A GC pass claims the object for deletion.
    MarkDeleting {
        deletion: Deletion,
        /// The object must not have been registered, referenced or leased after this (the
        /// pass's clock minus the grace period): a use the pass's roots did not see yet.
        unused_since: DateTime<Utc>,
        now: DateTime<Utc>,
    },
    /// The pass removed the bytes.
    ConfirmDeleted { pass: String, now: DateTime<Utc> },
    /// The pass could not remove the bytes: the object stays.
    AbortDeletion {
        pass: String,
        reason: String,
        now: DateTime<Utc>,
    },
    /// The pass `owner` that marked the object lost its lease and was fenced in the same
    /// append (`domain/gc_pass.rs`): the object goes back to Live, keeping its bytes.
    ReleaseMarkOfStoppedPass {
        owner: String,
        by: String,
        now: DateTime<Utc>,
    },
    /// Another pass found a mark made before `marked_before` by a pass that kept no lease (one
    /// of a strata from before pass leases): the object goes back to Live, keeping its bytes,
    /// and a later pass decides again.
    AbandonStaleMark {
        pass: String,
        marked_before: DateTime<Utc>,
        now: DateTime<Utc>,
    },
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "type")]
pub enum Event {
    #[serde(rename = "ObjectRegistered.v1")]
    Registered {
        generation: u64,
        by: String,
        at: DateTime<Utc>,
    },
    /// A writer or reader used the live object: a pass may not mark it within the grace period
    /// after this.
    #[serde(rename = "ObjectReferenced.v1")]
    Referenced { by: String, at: DateTime<Utc> },
    #[serde(rename = "ObjectLeased.v1")]
    Leased {
        holder: String,
        until: DateTime<Utc>,
        at: DateTime<Utc>,
    },
    #[serde(rename = "ObjectLeaseReleased.v1")]
    LeaseReleased { holder: String, at: DateTime<Utc> },
    #[serde(rename = "ObjectDeleting.v1")]
    Deleting {
        generation: u64,
        deletion: Deletion,
        at: DateTime<Utc>,
    },
    #[serde(rename = "ObjectDeleted.v1")]
    Deleted {
        generation: u64,
        pass: String,
        at: DateTime<Utc>,
    },
    #[serde(rename = "ObjectDeletionAborted.v1")]
    DeletionAborted {
        pass: String,
        reason: String,
        at: DateTime<Utc>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("the object is being deleted by GC pass {pass}; wait until it is deleted, then write it again")]
    Deleting { pass: String },
    #[error("the object is {lifecycle:?}; only a live object can be leased")]
    NotLive { lifecycle: Lifecycle },
    #[error("{holder} holds a lease on the object until {until}; GC skips it")]
    Leased {
        holder: String,
        until: DateTime<Utc>,
    },
    #[error("GC pass {owner} owns this deletion, not {pass}")]
    OtherPass { owner: String, pass: String },
    #[error("the object was used at {at}, after {unused_since}; a later pass may take it")]
    RecentlyUsed {
        at: DateTime<Utc>,
        unused_since: DateTime<Utc>,
    },
    #[error("the object is not being deleted")]
    NotDeleting,
    #[error("the deletion mark of pass {owner} was made at {marked_at}, not before {marked_before}; its pass may still be running")]
    MarkNotStale {
        owner: String,
        marked_at: DateTime<Utc>,
        marked_before: DateTime<Utc>,
    },
    #[error("a lease must end after it starts (until {until} is not after {now})")]
    EmptyLease {
        until: DateTime<Utc>,
        now: DateTime<Utc>,
    },
}

pub fn decide(state: &State, command: &Command) -> Result<Vec<Event>, Error> {
    let deleting_pass = || {
        state
            .deletion
            .as_ref()
            .map(|d| d.pass.clone())
            .unwrap_or_default()
    };
    match command {
        Command::Register { by, now } => match state.lifecycle {
            Lifecycle::Live if state.last_used.is_some_and(|at| *now - at < USE_REFRESH) => {
                Ok(vec![])
            }
            Lifecycle::Live => Ok(vec![Event::Referenced {
                by: by.clone(),
                at: *now,
            }]),
            Lifecycle::Deleting => Err(Error::Deleting {
                pass: deleting_pass(),
            }),
            Lifecycle::Absent | Lifecycle::Deleted => Ok(vec![Event::Registered {
                generation: state.generation + 1,
                by: by.clone(),
                at: *now,
            }]),
        },
        Command::Lease { holder, until, now } => {
            if until <= now {
                return Err(Error::EmptyLease {
                    until: *until,
                    now: *now,
                });
            }
            match state.lifecycle {
                Lifecycle::Live if state.leases.get(holder) == Some(until) => Ok(vec![]),
                // Another holder's unexpired lease already pins the object for at least two
                // thirds of what this one asks: sharing it keeps a common layer's stream from
                // growing by one lease per build. Sound because leases lapse and no caller
                // releases one early; a caller of `Release` would unpin its sharers too.
                Lifecycle::Live
                    if state
                        .leased_at(*now)
                        .iter()
                        .any(|(_, other)| *other - *now >= (*until - *now) * 2 / 3) =>
                {
                    Ok(vec![])
                }
                Lifecycle::Live => Ok(vec![Event::Leased {
                    holder: holder.clone(),
                    until: *until,
                    at: *now,
                }]),
                Lifecycle::Deleting => Err(Error::Deleting {
                    pass: deleting_pass(),
                }),
                lifecycle => Err(Error::NotLive { lifecycle }),
            }
        }
        Command::Release { holder, now } => Ok(if state.leases.contains_key(holder) {
            vec![Event::LeaseReleased {
                holder: holder.clone(),
                at: *now,
            }]
        } else {
            vec![]
        }),
        Command::MarkDeleting {
            deletion,
            unused_since,
            now,
        } => match state.lifecycle {
            // Absent: bytes in the store that no writer registered (a crashed writer, or
            // stored before objects had streams); the pass weighs them by their store age.
            Lifecycle::Live | Lifecycle::Absent => {
                if let Some(at) = state.last_used.filter(|at| at > unused_since) {
                    return Err(Error::RecentlyUsed {
                        at,
                        unused_since: *unused_since,
                    });
                }
                if let Some((holder, until)) = state.leased_at(*now).into_iter().next() {
                    return Err(Error::Leased {
                        holder: holder.to_owned(),
                        until,
                    });
                }
                Ok(vec![Event::Deleting {
                    generation: state.generation,
                    deletion: deletion.clone(),
                    at: *now,
                }])
            }
            Lifecycle::Deleting if deleting_pass() == deletion.pass => Ok(vec![]),
            Lifecycle::Deleting => Err(Error::OtherPass {
                owner: deleting_pass(),
                pass: deletion.pass.clone(),
            }),
            lifecycle => Err(Error::NotLive { lifecycle }),
        },
        Command::ConfirmDeleted { pass, now } => match state.lifecycle {
            Lifecycle::Deleting if deleting_pass() == *pass => Ok(vec![Event::Deleted {
                generation: state.generation,
                pass: pass.clone(),
                at: *now,
            }]),
            Lifecycle::Deleting => Err(Error::OtherPass {
                owner: deleting_pass(),
                pass: pass.clone(),
            }),
            // A pass retrying after a lost reply converges.
            Lifecycle::Deleted if deleting_pass() == *pass => Ok(vec![]),
            _ => Err(Error::NotDeleting),
        },
        Command::AbortDeletion { pass, reason, now } => match state.lifecycle {
            Lifecycle::Deleting if deleting_pass() == *pass => Ok(vec![Event::DeletionAborted {
                pass: pass.clone(),
                reason: reason.clone(),
                at: *now,
            }]),
            Lifecycle::Deleting => Err(Error::OtherPass {
                owner: deleting_pass(),
                pass: pass.clone(),
            }),
            _ => Err(Error::NotDeleting),
        },
        Command::ReleaseMarkOfStoppedPass { owner, by, now } => match state.lifecycle {
            Lifecycle::Deleting if deleting_pass() == *owner => Ok(vec![Event::DeletionAborted {
                pass: owner.clone(),
                reason: format!("pass {owner} stopped renewing its lease ({by} released its mark)"),
                at: *now,
            }]),
            Lifecycle::Deleting => Err(Error::OtherPass {
                owner: deleting_pass(),
                pass: owner.clone(),
            }),
            _ => Err(Error::NotDeleting),
        },
        Command::AbandonStaleMark {
            pass,
            marked_before,
            now,
        } => match (state.lifecycle, state.marked_at) {
            (Lifecycle::Deleting, Some(at)) if at < *marked_before => {
                Ok(vec![Event::DeletionAborted {
                    pass: deleting_pass(),
                    reason: format!("pass {pass} found the mark stale (made at {at})"),
                    at: *now,
                }])
            }
            (Lifecycle::Deleting, marked_at) => Err(Error::MarkNotStale {
                owner: deleting_pass(),
                marked_at: marked_at.unwrap_or(*now),
                marked_before: *marked_before,
            }),
            _ => Err(Error::NotDeleting),
        },
    }
}

pub fn evolve(mut state: State, event: &Event) -> State {
    match event {
        Event::Registered { generation, by, at } => {
            state.lifecycle = Lifecycle::Live;
            state.generation = *generation;
            state.last_used = Some(*at);
            state.registered_by = Some(by.clone());
            state.deletion = None;
            state.leases.clear();
        }
        Event::Referenced { at, .. } => {
            state.last_used = Some(*at);
        }
        Event::Leased { holder, until, at } => {
            state.leases.insert(holder.clone(), *until);
            state.last_used = Some(*at);
        }
        Event::LeaseReleased { holder, .. } => {
            state.leases.remove(holder);
        }
        Event::Deleting { deletion, at, .. } => {
            state.lifecycle = Lifecycle::Deleting;
            state.deletion = Some(deletion.clone());
            state.marked_at = Some(*at);
        }
        Event::Deleted { .. } => {
            state.lifecycle = Lifecycle::Deleted;
            state.leases.clear();
        }
        Event::DeletionAborted { .. } => {
            state.lifecycle = Lifecycle::Live;
            state.deletion = None;
            state.marked_at = None;
        }
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Duration;
    use proptest::prelude::*;

    fn t(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
    }

    fn apply(state: State, command: &Command) -> Result<State, Error> {
        let events = decide(&state, command)?;
        Ok(events.iter().fold(state, evolve))
    }

    fn deletion(pass: &str) -> Deletion {
        Deletion {
            pass: pass.into(),
            tier: "superseded-checkpoint".into(),
            reason: "test".into(),
            last_referenced_by: Some("build b1".into()),
        }
    }

    /// A live object that pass `p1` marked at t(5).
    fn marked_by_p1_at_5() -> State {
        apply(
            live(),
            &Command::MarkDeleting {
                deletion: deletion("p1"),
                unused_since: t(5),
                now: t(5),
            },
        )
        .unwrap()
    }

    fn live() -> State {
        apply(
            State::default(),
            &Command::Register {
                by: "build b1 step 1".into(),
                now: t(0),
            },
        )
        .unwrap()
    }

    /// A common base layer is used by every build: its stream gains one reference per
    /// [`USE_REFRESH`] window and shares leases, instead of growing by one event per build.
    #[test]
    fn recent_uses_and_covering_leases_add_no_event() {
        let s = live();
        let register = |by: &str, now| Command::Register { by: by.into(), now };
        let within = t(0) + USE_REFRESH - Duration::seconds(1);
        assert_eq!(decide(&s, &register("build b2", within)), Ok(vec![]));
        assert_eq!(
            decide(&s, &register("build b2", t(0) + USE_REFRESH)),
            Ok(vec![Event::Referenced {
                by: "build b2".into(),
                at: t(0) + USE_REFRESH,
            }])
        );

        let lease = |holder: &str, now: DateTime<Utc>, minutes| Command::Lease {
            holder: holder.into(),
            until: now + Duration::minutes(minutes),
            now,
        };
        let s = apply(s, &lease("attempt a1", t(1), 15)).unwrap();
        // a1's lease runs 15 min from t(1): at t(1) + 5 min it still covers 10 of 15 asked.
        let later = t(1) + Duration::minutes(5);
        assert_eq!(decide(&s, &lease("attempt a2", later, 15)), Ok(vec![]));
        // Past that, the remaining cover is under two thirds of the ask: a2 takes its own.
        let much_later = t(1) + Duration::minutes(6);
        assert!(matches!(
            decide(&s, &lease("attempt a2", much_later, 15)).unwrap().as_slice(),
            [Event::Leased { holder, .. }] if holder == "attempt a2"
        ));
        // A shared lease still holds the object against a pass until it lapses.
        let mark = Command::MarkDeleting {
            deletion: deletion("p1"),
            unused_since: later,
            now: later,
        };
        assert!(matches!(decide(&s, &mark), Err(Error::Leased { .. })));
    }

    #[test]
    fn a_leased_object_is_not_marked_until_the_lease_lapses_or_is_released() {
        let s = apply(
            live(),
            &Command::Lease {
                holder: "sandbox s1".into(),
                until: t(60),
                now: t(1),
            },
        )
        .unwrap();
        let mark = |now| Command::MarkDeleting {
            deletion: deletion("p1"),
            unused_since: now,
            now,
        };
        assert!(matches!(
            decide(&s, &mark(t(59))),
            Err(Error::Leased { ref holder, .. }) if holder == "sandbox s1"
        ));
        // A lapsed lease does not hold the object: its holder stopped renewing.
        assert_eq!(
            apply(s.clone(), &mark(t(60))).unwrap().lifecycle,
            Lifecycle::Deleting
        );
        let released = apply(
            s,
            &Command::Release {
                holder: "sandbox s1".into(),
                now: t(2),
            },
        )
        .unwrap();
        assert_eq!(
            apply(released, &mark(t(3))).unwrap().lifecycle,
            Lifecycle::Deleting
        );
    }

    #[test]
    fn deleting_admits_no_lease_and_no_registration_and_a_writer_recreates_after() {
        let s = marked_by_p1_at_5();
        let lease = Command::Lease {
            holder: "sandbox s2".into(),
            until: t(100),
            now: t(6),
        };
        let register = Command::Register {
            by: "build b2 step 1".into(),
            now: t(6),
        };
        assert_eq!(
            decide(&s, &lease),
            Err(Error::Deleting { pass: "p1".into() })
        );
        assert_eq!(
            decide(&s, &register),
            Err(Error::Deleting { pass: "p1".into() })
        );
        let deleted = apply(
            s,
            &Command::ConfirmDeleted {
                pass: "p1".into(),
                now: t(7),
            },
        )
        .unwrap();
        assert_eq!(deleted.lifecycle, Lifecycle::Deleted);
        assert_eq!(
            deleted.deletion.as_ref().unwrap().tier,
            "superseded-checkpoint"
        );
        assert!(matches!(
            decide(&deleted, &lease),
            Err(Error::NotLive { .. })
        ));
        let again = apply(deleted, &register).unwrap();
        assert_eq!((again.lifecycle, again.generation), (Lifecycle::Live, 2));
        assert_eq!(again.deletion, None);
    }

    #[test]
    fn a_mark_refuses_an_object_used_within_the_grace_period() {
        // Past the refresh window of the registration at t(0), so the use is recorded.
        let used = t(40) + USE_REFRESH;
        let s = apply(
            live(),
            &Command::Register {
                by: "build b2 step 3".into(),
                now: used,
            },
        )
        .unwrap();
        assert_eq!(
            s.generation, 1,
            "a live object's use is a reference, not a generation"
        );
        assert_eq!(s.last_used, Some(used));
        let mark = |unused_since| Command::MarkDeleting {
            deletion: deletion("p1"),
            unused_since,
            now: used + Duration::seconds(10),
        };
        assert!(matches!(
            decide(&s, &mark(used - Duration::seconds(1))),
            Err(Error::RecentlyUsed { at, .. }) if at == used
        ));
        assert_eq!(
            apply(s, &mark(used)).unwrap().lifecycle,
            Lifecycle::Deleting
        );
        // Bytes no writer registered are marked on their store age alone.
        assert_eq!(
            apply(State::default(), &mark(used - Duration::seconds(1)))
                .unwrap()
                .lifecycle,
            Lifecycle::Deleting
        );
    }

    #[test]
    fn only_a_stale_mark_is_abandoned_by_another_pass_and_the_bytes_stay() {
        let s = marked_by_p1_at_5();
        let abandon = |marked_before| Command::AbandonStaleMark {
            pass: "p2".into(),
            marked_before,
            now: t(100),
        };
        assert!(matches!(
            decide(&s, &abandon(t(5))),
            Err(Error::MarkNotStale { .. })
        ));
        let back = apply(s, &abandon(t(6))).unwrap();
        assert_eq!(back.lifecycle, Lifecycle::Live);
        assert_eq!(back.marked_at, None);
        assert!(matches!(
            decide(&back, &abandon(t(6))),
            Err(Error::NotDeleting)
        ));
    }

    #[test]
    fn only_the_marking_pass_confirms_or_aborts_and_replays_converge() {
        let s = marked_by_p1_at_5();
        let mark_p2 = Command::MarkDeleting {
            deletion: deletion("p2"),
            unused_since: t(6),
            now: t(6),
        };
        assert!(matches!(decide(&s, &mark_p2), Err(Error::OtherPass { .. })));
        let mark_p1 = Command::MarkDeleting {
            deletion: deletion("p1"),
            unused_since: t(6),
            now: t(6),
        };
        assert_eq!(decide(&s, &mark_p1), Ok(vec![]));
        let confirm = |pass: &str| Command::ConfirmDeleted {
            pass: pass.into(),
            now: t(7),
        };
        assert!(matches!(
            decide(&s, &confirm("p2")),
            Err(Error::OtherPass { .. })
        ));
        let deleted = apply(s.clone(), &confirm("p1")).unwrap();
        assert_eq!(decide(&deleted, &confirm("p1")), Ok(vec![]));
        assert_eq!(decide(&deleted, &confirm("p2")), Err(Error::NotDeleting));
        // A pass that cannot delete keeps the object.
        let kept = apply(
            s,
            &Command::AbortDeletion {
                pass: "p1".into(),
                reason: "store refused the delete".into(),
                now: t(7),
            },
        )
        .unwrap();
        assert_eq!(kept.lifecycle, Lifecycle::Live);
        assert_eq!(kept.generation, 1);
    }

    #[test]
    fn events_round_trip_through_their_versioned_names() {
        let e = Event::Deleting {
            generation: 3,
            deletion: deletion("p9"),
            at: t(0),
        };
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json["type"], "ObjectDeleting.v1");
        assert_eq!(serde_json::from_value::<Event>(json).unwrap(), e);
    }

    #[derive(Clone, Debug)]
    enum Step {
        Register,
        Lease(u8, i64),
        Release(u8),
        Mark(u8),
        Confirm(u8),
        Abort(u8),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            Just(Step::Register),
            (0u8..3, 1i64..50).prop_map(|(h, d)| Step::Lease(h, d)),
            (0u8..3).prop_map(Step::Release),
            (0u8..2).prop_map(Step::Mark),
            (0u8..2).prop_map(Step::Confirm),
            (0u8..2).prop_map(Step::Abort),
        ]
    }

    proptest! {
        /// Whatever the interleaving of writers, readers and two GC passes: no object is marked
        /// while a lease is unexpired, nothing is leased or registered while Deleting, only the
        /// marking pass deletes, and generations only grow.
        #[test]
        fn the_barrier_holds_under_any_interleaving(steps in proptest::collection::vec(step(), 1..60)) {
            let mut state = State::default();
            for (i, s) in steps.iter().enumerate() {
                let now = t(i as i64 * 5);
                let command = match s {
                    Step::Register => Command::Register { by: "w".into(), now },
                    Step::Lease(h, d) => Command::Lease {
                        holder: format!("h{h}"),
                        until: now + Duration::seconds(*d),
                        now,
                    },
                    Step::Release(h) => Command::Release { holder: format!("h{h}"), now },
                    Step::Mark(p) => Command::MarkDeleting { deletion: deletion(&format!("p{p}")), unused_since: now, now },
                    Step::Confirm(p) => Command::ConfirmDeleted { pass: format!("p{p}"), now },
                    Step::Abort(p) => Command::AbortDeletion { pass: format!("p{p}"), reason: "x".into(), now },
                };
                let before = state.clone();
                let Ok(events) = decide(&state, &command) else { continue };
                for e in &events {
                    match e {
                        Event::Deleting { .. } => {
                            prop_assert!(matches!(before.lifecycle, Lifecycle::Live | Lifecycle::Absent));
                            prop_assert!(before.leased_at(now).is_empty());
                            prop_assert!(before.last_used.is_none_or(|at| at <= now));
                        }
                        Event::Referenced { .. } => prop_assert_eq!(before.lifecycle, Lifecycle::Live),
                        Event::Leased { .. } => prop_assert_eq!(before.lifecycle, Lifecycle::Live),
                        Event::Registered { generation, .. } => {
                            prop_assert!(before.lifecycle != Lifecycle::Deleting);
                            prop_assert!(*generation > before.generation);
                        }
                        Event::Deleted { pass, .. } => {
                            prop_assert_eq!(before.lifecycle, Lifecycle::Deleting);
                            prop_assert_eq!(&before.deletion.as_ref().unwrap().pass, pass);
                        }
                        _ => {}
                    }
                    state = evolve(state, e);
                }
                prop_assert!(state.generation >= before.generation);
            }
        }
    }
}
