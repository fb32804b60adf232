//! The promotion outbox: `promotion-{build}:{epoch}`.
//!
//! Layout: [`PromotionPlan`] (what is promoted, with its deterministic [`ownership_nonce`]);
//! [`Stage`] and [`State`]; [`Command`], [`Event`], [`Error`], [`decide`], [`evolve`].
//!
//! Entering Publishing on the build writes the plan here (`staged`); from then on any actor (the
//! worker, or the promotion reconciler after the lease lapsed) drives it forward, one step at a
//! time and only in order: `staged -> layers_committed -> visible -> done`. Each step is
//! idempotent: repeating a step already taken emits nothing; jumping ahead is refused. `visible`
//! is the pointer flip that makes the target snapshot and tags resolvable; the build's
//! `MarkReady` follows it; `done` records that the build stream says Ready.
//!
//! A promotion that can never become visible (its template was deleted before the flip) is
//! `abandoned` instead, in one append with the build's `error`: the outbox is closed and no step
//! is taken after it. Once visible, a promotion always finishes.
//!
//! Writes outside the event store (layer objects, the target snapshot record) happen at
//! immutable, intent-qualified places. A crashed predecessor may have written some of them; a
//! successor adopts a layer because content addressing proves it identical, and adopts a target
//! record only when its ownership nonce proves it is this intent's own. Anything else is left
//! alone as an orphan.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::build_spec::Tag;
use super::canonical::Encoder;
use super::ids::{BuildId, Digest, Epoch, SnapshotId, TemplateId};

/// Everything promotion writes, fixed when the intent is staged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromotionPlan {
    pub build: BuildId,
    pub epoch: Epoch,
    pub template: TemplateId,
    /// The complete candidate snapshot (a cache checkpoint or this build's own result).
    pub source: SnapshotId,
    /// The user-visible snapshot id this promotion creates.
    pub target: SnapshotId,
    pub build_base_checkpoint: Option<SnapshotId>,
    /// Layer digests of the target, bottom first; each must be a committed object.
    pub layers: Vec<Digest>,
    pub tags: Vec<Tag>,
}

/// Identifies this intent's own writes. Deterministic, so every executor of the same intent
/// writes identical bytes, and another intent can never produce the same nonce.
pub fn ownership_nonce(plan: &PromotionPlan) -> Digest {
    let mut e = Encoder::new("strata.promotion-nonce.v1");
    e.str(&plan.build.to_string())
        .u64(plan.epoch.0)
        .str(&plan.source.to_string())
        .str(&plan.target.to_string());
    e.digest()
}

/// Outbox steps, in the only order they may be taken.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    #[default]
    Unstaged,
    Staged,
    LayersCommitted,
    Visible,
    Done,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct State {
    pub stage: Stage,
    pub plan: Option<PromotionPlan>,
    /// Closed without becoming visible; `stage` is where it stopped.
    pub abandoned: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    Stage {
        plan: PromotionPlan,
        now: DateTime<Utc>,
    },
    /// Every plan layer is a live object (uploaded or adopted).
    CommitLayers {
        committed: Vec<Digest>,
        now: DateTime<Utc>,
    },
    /// The target record is written (or adopted) and the visibility pointer flips to it.
    MakeVisible { now: DateTime<Utc> },
    /// The build stream records Ready.
    Finish { now: DateTime<Utc> },
    /// The target can never become visible (its template was deleted): close the outbox; the
    /// build ends in error in the same append.
    Abandon { now: DateTime<Utc> },
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "type")]
pub enum Event {
    #[serde(rename = "PromotionStaged.v1")]
    PromotionStaged {
        plan: PromotionPlan,
        nonce: Digest,
        staged_at: DateTime<Utc>,
    },
    #[serde(rename = "PromotionLayersCommitted.v1")]
    PromotionLayersCommitted { committed_at: DateTime<Utc> },
    #[serde(rename = "PromotionVisible.v1")]
    PromotionVisible {
        target: SnapshotId,
        visible_at: DateTime<Utc>,
    },
    #[serde(rename = "PromotionDone.v1")]
    PromotionDone { done_at: DateTime<Utc> },
    #[serde(rename = "PromotionAbandoned.v1")]
    PromotionAbandoned { abandoned_at: DateTime<Utc> },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("the promotion is already staged with another plan; a promotion intent is fixed once written")]
    PlanConflict,
    #[error("the promotion is {at:?}; step {step:?} comes only after {needs:?}")]
    OutOfOrder {
        step: Stage,
        at: Stage,
        needs: Stage,
    },
    #[error(
        "layer {missing} of the plan is not committed; upload or adopt it before committing layers"
    )]
    LayerMissing { missing: Digest },
    #[error("the promotion was abandoned (its template was deleted); no step follows")]
    Abandoned,
    #[error(
        "the promotion is already {at:?}: a visible promotion finishes, it is never abandoned"
    )]
    AlreadyVisible { at: Stage },
    #[error("nothing is staged; only a staged promotion can be abandoned")]
    NothingStaged,
}

fn step(state: &State, step: Stage, now_emit: impl FnOnce() -> Event) -> Result<Vec<Event>, Error> {
    let needs = match step {
        Stage::LayersCommitted => Stage::Staged,
        Stage::Visible => Stage::LayersCommitted,
        _ => Stage::Visible,
    };
    if state.stage >= step {
        Ok(vec![])
    } else if state.stage == needs {
        Ok(vec![now_emit()])
    } else {
        Err(Error::OutOfOrder {
            step,
            at: state.stage,
            needs,
        })
    }
}

pub fn decide(state: &State, command: &Command) -> Result<Vec<Event>, Error> {
    if state.abandoned {
        return match command {
            Command::Abandon { .. } => Ok(vec![]),
            _ => Err(Error::Abandoned),
        };
    }
    match command {
        Command::Abandon { now } => match state.stage {
            Stage::Unstaged => Err(Error::NothingStaged),
            Stage::Staged | Stage::LayersCommitted => {
                Ok(vec![Event::PromotionAbandoned { abandoned_at: *now }])
            }
            at => Err(Error::AlreadyVisible { at }),
        },
        Command::Stage { plan, now } => match &state.plan {
            Some(existing) if existing == plan => Ok(vec![]),
            Some(_) => Err(Error::PlanConflict),
            None => Ok(vec![Event::PromotionStaged {
                plan: plan.clone(),
                nonce: ownership_nonce(plan),
                staged_at: *now,
            }]),
        },
        Command::CommitLayers { committed, now } => {
            if state.stage == Stage::Staged {
                if let Some(plan) = &state.plan {
                    if let Some(missing) = plan.layers.iter().find(|l| !committed.contains(l)) {
                        return Err(Error::LayerMissing { missing: *missing });
                    }
                }
            }
            step(state, Stage::LayersCommitted, || {
                Event::PromotionLayersCommitted { committed_at: *now }
            })
        }
        Command::MakeVisible { now } => {
            let target = state.plan.as_ref().map(|p| p.target);
            step(state, Stage::Visible, || Event::PromotionVisible {
                target: target.expect("a staged promotion has a plan"),
                visible_at: *now,
            })
        }
        Command::Finish { now } => step(state, Stage::Done, || Event::PromotionDone {
            done_at: *now,
        }),
    }
}

pub fn evolve(mut state: State, event: &Event) -> State {
    match event {
        Event::PromotionStaged { plan, .. } => {
            state.plan = Some(plan.clone());
            state.stage = Stage::Staged;
        }
        Event::PromotionLayersCommitted { .. } => state.stage = Stage::LayersCommitted,
        Event::PromotionVisible { .. } => state.stage = Stage::Visible,
        Event::PromotionDone { .. } => state.stage = Stage::Done,
        Event::PromotionAbandoned { .. } => state.abandoned = true,
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;
    use uuid::Uuid;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 29, 12, 0, 0).unwrap()
    }
    fn plan(epoch: u64) -> PromotionPlan {
        PromotionPlan {
            build: BuildId::from_uuid(Uuid::from_u128(1)),
            epoch: Epoch(epoch),
            template: TemplateId::parse("tpl").unwrap(),
            source: SnapshotId::from_uuid(Uuid::from_u128(2)),
            target: SnapshotId::from_uuid(Uuid::from_u128(3)),
            build_base_checkpoint: None,
            layers: vec![Digest::of(b"l1"), Digest::of(b"l2")],
            tags: vec![Tag::default_tag()],
        }
    }
    fn commands() -> Vec<Command> {
        vec![
            Command::Stage {
                plan: plan(1),
                now: now(),
            },
            Command::CommitLayers {
                committed: plan(1).layers,
                now: now(),
            },
            Command::MakeVisible { now: now() },
            Command::Finish { now: now() },
        ]
    }

    #[test]
    fn steps_run_in_order_and_repeat_idempotently() {
        let mut s = State::default();
        for (i, cmd) in commands().iter().enumerate() {
            for later in &commands()[i + 1..] {
                if !matches!(later, Command::Stage { .. }) {
                    assert!(
                        matches!(decide(&s, later), Err(Error::OutOfOrder { .. })),
                        "{later:?} at {:?}",
                        s.stage
                    );
                }
            }
            s = decide(&s, cmd).unwrap().iter().fold(s, evolve);
            assert!(decide(&s, cmd).unwrap().is_empty(), "{cmd:?} repeated");
        }
        assert_eq!(s.stage, Stage::Done);
        assert_eq!(
            decide(
                &s,
                &Command::Stage {
                    plan: plan(2),
                    now: now()
                }
            ),
            Err(Error::PlanConflict)
        );
    }

    #[test]
    fn only_a_promotion_not_yet_visible_is_abandoned_and_nothing_follows_it() {
        let abandon = Command::Abandon { now: now() };
        let mut s = State::default();
        assert_eq!(decide(&s, &abandon), Err(Error::NothingStaged));
        for (i, cmd) in commands().iter().enumerate() {
            s = decide(&s, cmd).unwrap().iter().fold(s, evolve);
            let closed = decide(&s, &abandon).map(|e| e.iter().fold(s.clone(), evolve));
            if i < 2 {
                let closed = closed.unwrap();
                assert!(closed.abandoned, "abandoned at {:?}", s.stage);
                assert!(decide(&closed, &abandon).unwrap().is_empty());
                for later in &commands()[i + 1..] {
                    assert_eq!(decide(&closed, later), Err(Error::Abandoned));
                }
            } else {
                assert!(
                    matches!(closed, Err(Error::AlreadyVisible { .. })),
                    "{:?}",
                    s.stage
                );
            }
        }
    }

    #[test]
    fn layers_must_all_be_committed() {
        let s = decide(&State::default(), &commands()[0])
            .unwrap()
            .iter()
            .fold(State::default(), evolve);
        let partial = Command::CommitLayers {
            committed: vec![Digest::of(b"l1")],
            now: now(),
        };
        assert_eq!(
            decide(&s, &partial),
            Err(Error::LayerMissing {
                missing: Digest::of(b"l2")
            })
        );
    }

    proptest! {
        /// Whatever order commands arrive in (duplicates, reorderings, crashes mid-way), the
        /// recorded stages only ever advance one step at a time.
        #[test]
        fn stages_advance_one_at_a_time(order in proptest::collection::vec(0usize..4, 0..30)) {
            let cmds = commands();
            let mut s = State::default();
            for i in order {
                let before = s.stage;
                if let Ok(events) = decide(&s, &cmds[i]) {
                    s = events.iter().fold(s, evolve);
                }
                let advanced = s.stage as u8 - before as u8;
                prop_assert!(advanced <= 1);
            }
        }
    }
}
