//! A garbage-collection pass's lease: the `gcpass-{id}` aggregate.
//!
//! A pass marks objects `Deleting` and later deletes their bytes. If it dies in between, its
//! marks block every writer of those objects until another pass (or a writer) returns them to
//! `Live`; if it is only slow, returning its marks to `Live` while it still deletes loses the
//! bytes of a live object. Time since the mark cannot tell the two apart; a lease can. The
//! pass renews its lease while it works and deletes bytes only while the lease provably holds;
//! anyone may release the marks of a pass whose lease expired, and does so by first *fencing*
//! the pass (an event on this stream, compare-and-set like every append), after which the
//! pass's own renewal is refused and it stops. So a mark is released only when its pass can
//! delete nothing more.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

/// How long one renewal holds by default (`GcPolicy::pass_lease`). A pass renews every third of
/// it; its marks are released within this much after it stops renewing.
pub const LEASE: Duration = Duration::seconds(60);

/// A pass deletes bytes only while at least a third of its lease is left, so a delete that
/// starts under the lease also ends under it unless the store stalls that long.
pub fn delete_margin(lease: Duration) -> Duration {
    lease / 3
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    pub started: bool,
    pub node: Option<String>,
    pub lease_until: Option<DateTime<Utc>>,
    pub ended: bool,
    /// Who fenced the pass after its lease expired.
    pub fenced_by: Option<String>,
}

impl State {
    /// Whether the pass can still delete anything at `now`: started, not ended or fenced, and
    /// its lease unexpired.
    pub fn holds_at(&self, now: DateTime<Utc>) -> bool {
        self.started
            && !self.ended
            && self.fenced_by.is_none()
            && self.lease_until.is_some_and(|until| now < until)
    }

    /// Whether a delete may start at `now`: the lease holds for at least `margin` more.
    pub fn may_delete_at(&self, now: DateTime<Utc>, margin: Duration) -> bool {
        self.holds_at(now + margin)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    Start {
        node: String,
        lease: Duration,
        now: DateTime<Utc>,
    },
    Renew {
        lease: Duration,
        now: DateTime<Utc>,
    },
    /// The pass is done; `measure` is what it found and did, when it got that far.
    End {
        measure: Option<Measure>,
        now: DateTime<Utc>,
    },
    /// Someone found a mark of this pass: allowed only once the lease expired.
    Fence {
        by: String,
        now: DateTime<Utc>,
    },
}

/// Objects and bytes in one class of the store.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassSize {
    pub objects: u64,
    pub bytes: u64,
}

/// What a pass found and did, kept on its stream so the store's size can be drawn over time
/// from the passes alone, without listing the store again.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Measure {
    /// The store before the pass deleted, by class: `rooted` or a retention tier's name.
    pub classes: BTreeMap<String, ClassSize>,
    pub total_bytes: u64,
    /// `STRATA_STORAGE_BUDGET` as the pass applied it; `None` when there is none.
    pub budget_bytes: Option<u64>,
    pub deleted_objects: u64,
    pub deleted_bytes: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "type")]
pub enum Event {
    #[serde(rename = "GcPassStarted.v1")]
    Started {
        node: String,
        lease_until: DateTime<Utc>,
        at: DateTime<Utc>,
    },
    #[serde(rename = "GcPassRenewed.v1")]
    Renewed {
        lease_until: DateTime<Utc>,
        at: DateTime<Utc>,
    },
    /// Appended with `Ended` by a pass that finished its work.
    #[serde(rename = "GcPassMeasured.v1")]
    Measured { measure: Measure, at: DateTime<Utc> },
    #[serde(rename = "GcPassEnded.v1")]
    Ended { at: DateTime<Utc> },
    #[serde(rename = "GcPassFenced.v1")]
    Fenced { by: String, at: DateTime<Utc> },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("the GC pass was started already")]
    AlreadyStarted,
    #[error("the GC pass lost its lease ({why}); it must stop without deleting anything more")]
    Lost { why: String },
    #[error("the GC pass holds its lease until {until}; its marks are not stale")]
    StillLeased { until: DateTime<Utc> },
}

pub fn decide(state: &State, command: &Command) -> Result<Vec<Event>, Error> {
    match command {
        Command::Start { node, lease, now } => {
            if state.started {
                return Err(Error::AlreadyStarted);
            }
            Ok(vec![Event::Started {
                node: node.clone(),
                lease_until: *now + *lease,
                at: *now,
            }])
        }
        Command::Renew { lease, now } => {
            if let Some(by) = &state.fenced_by {
                return Err(Error::Lost {
                    why: format!("{by} fenced it after its lease expired"),
                });
            }
            if state.ended || !state.holds_at(*now) {
                return Err(Error::Lost {
                    why: format!(
                        "its lease ended at {}",
                        state
                            .lease_until
                            .map_or("its start".into(), |u| u.to_string())
                    ),
                });
            }
            Ok(vec![Event::Renewed {
                lease_until: *now + *lease,
                at: *now,
            }])
        }
        Command::End { measure, now } => {
            if state.ended || state.fenced_by.is_some() {
                return Ok(vec![]);
            }
            let measured = measure.iter().map(|m| Event::Measured {
                measure: m.clone(),
                at: *now,
            });
            Ok(measured.chain([Event::Ended { at: *now }]).collect())
        }
        Command::Fence { by, now } => {
            if state.ended || state.fenced_by.is_some() {
                return Ok(vec![]);
            }
            match state.lease_until {
                Some(until) if state.started && *now < until => Err(Error::StillLeased { until }),
                _ => Ok(vec![Event::Fenced {
                    by: by.clone(),
                    at: *now,
                }]),
            }
        }
    }
}

pub fn evolve(mut state: State, event: &Event) -> State {
    match event {
        Event::Started {
            node, lease_until, ..
        } => {
            state.started = true;
            state.node = Some(node.clone());
            state.lease_until = Some(*lease_until);
        }
        Event::Renewed { lease_until, .. } => state.lease_until = Some(*lease_until),
        Event::Measured { .. } => {}
        Event::Ended { .. } => state.ended = true,
        Event::Fenced { by, .. } => state.fenced_by = Some(by.clone()),
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + secs, 0).unwrap()
    }

    fn run(events: &[Event]) -> State {
        events.iter().fold(State::default(), evolve)
    }

    fn started_at(secs: i64) -> Vec<Event> {
        decide(
            &State::default(),
            &Command::Start {
                node: "n1".into(),
                lease: LEASE,
                now: t(secs),
            },
        )
        .unwrap()
    }

    #[test]
    fn a_renewed_pass_holds_and_cannot_be_fenced() {
        let mut events = started_at(0);
        events.extend(
            decide(
                &run(&events),
                &Command::Renew {
                    lease: LEASE,
                    now: t(20),
                },
            )
            .unwrap(),
        );
        let s = run(&events);
        assert!(s.holds_at(t(79)) && !s.holds_at(t(80)));
        let margin = delete_margin(LEASE);
        assert!(s.may_delete_at(t(59), margin) && !s.may_delete_at(t(60), margin));
        let fence = Command::Fence {
            by: "gc-other".into(),
            now: t(79),
        };
        assert_eq!(decide(&s, &fence), Err(Error::StillLeased { until: t(80) }));
    }

    #[test]
    fn an_expired_pass_is_fenced_and_then_cannot_renew() {
        let mut events = started_at(0);
        let s = run(&events);
        assert!(
            decide(
                &s,
                &Command::Renew {
                    lease: LEASE,
                    now: t(60)
                }
            )
            .is_err(),
            "expired"
        );
        let fenced = decide(
            &s,
            &Command::Fence {
                by: "gc-other".into(),
                now: t(61),
            },
        )
        .unwrap();
        events.extend(fenced);
        let s = run(&events);
        assert!(!s.holds_at(t(62)));
        let err = decide(
            &s,
            &Command::Renew {
                lease: LEASE,
                now: t(62),
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("fenced"), "{err}");
        // Fencing again, or ending, changes nothing.
        let again = Command::Fence {
            by: "gc-third".into(),
            now: t(63),
        };
        assert_eq!(decide(&s, &again), Ok(vec![]));
        assert_eq!(
            decide(
                &s,
                &Command::End {
                    measure: None,
                    now: t(63)
                }
            ),
            Ok(vec![])
        );
    }

    #[test]
    fn an_ended_pass_holds_nothing_and_a_pass_starts_once() {
        let mut events = started_at(0);
        assert_eq!(
            decide(
                &run(&events),
                &Command::Start {
                    node: "n1".into(),
                    lease: LEASE,
                    now: t(1)
                }
            ),
            Err(Error::AlreadyStarted)
        );
        events.extend(
            decide(
                &run(&events),
                &Command::End {
                    measure: None,
                    now: t(5),
                },
            )
            .unwrap(),
        );
        let s = run(&events);
        assert!(!s.holds_at(t(6)));
        assert!(decide(
            &s,
            &Command::Renew {
                lease: LEASE,
                now: t(6)
            }
        )
        .is_err());
    }

    #[test]
    fn a_pass_that_never_started_is_fenced_at_once() {
        let fence = Command::Fence {
            by: "gc-other".into(),
            now: t(0),
        };
        assert!(matches!(
            decide(&State::default(), &fence).unwrap()[..],
            [Event::Fenced { .. }]
        ));
    }

    #[test]
    fn a_finished_pass_keeps_its_measure_and_a_fenced_one_records_none() {
        let events = started_at(0);
        let measure = Measure {
            classes: [(
                "rooted".to_string(),
                ClassSize {
                    objects: 2,
                    bytes: 300,
                },
            )]
            .into(),
            total_bytes: 300,
            budget_bytes: Some(1000),
            deleted_objects: 1,
            deleted_bytes: 40,
        };
        let end = Command::End {
            measure: Some(measure.clone()),
            now: t(5),
        };
        assert_eq!(
            decide(&run(&events), &end),
            Ok(vec![
                Event::Measured { measure, at: t(5) },
                Event::Ended { at: t(5) }
            ])
        );
        let mut fenced = events.clone();
        fenced.push(Event::Fenced {
            by: "gc-other".into(),
            at: t(61),
        });
        assert_eq!(decide(&run(&fenced), &end), Ok(vec![]));
    }
}
