//! The snapshot aggregate: `snapshot-{id}`, an immutable record of what a sandbox can boot on.
//!
//! Layout: [`Purpose`] and [`SnapshotRecord`] (the layer list and the command context); [`State`],
//! [`Command`], [`Event`], [`Error`], [`decide`], [`evolve`].
//!
//! A snapshot is written once and never changes: recording it again with the same facts is a
//! no-op (a worker retrying after a lost reply converges), recording different facts under the
//! same id is refused. Only a tombstone (garbage collection) follows. Who wrote it is part of the
//! record (build and epoch), so an operator can trace a layer stack back to the attempt that made
//! it; the record is reachable only through events that reference its id (a step's
//! `StepCompleted`, a build's `PublishingStarted`), so a fenced-out writer's snapshot stays an
//! unreferenced orphan.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::build_spec::StepContext;
use super::ids::{BuildId, Digest, Epoch};

/// What a snapshot is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Purpose {
    /// A build's complete result, promoted to a template.
    Template,
    /// A checkpoint after one step, for resuming later builds.
    BuildCache,
}

/// Everything needed to boot on a snapshot and to keep building on it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    pub purpose: Purpose,
    /// Layer digests, bottom first: the base image's layers, then the build's checkpoints.
    pub layers: Vec<Digest>,
    /// The base image's manifest digest (for `fromTemplate` chains, the root image's).
    pub base_image_digest: Option<Digest>,
    /// User, workdir and the evaluated environment in force at this point.
    pub context: StepContext,
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
    /// The build and attempt that produced the layers.
    pub build: BuildId,
    pub epoch: Epoch,
}

impl SnapshotRecord {
    /// What a sandbox on this template runs with: the final user and workdir, and none of the
    /// build's environment. ENV (and the base image's env) is build-time only, as on E2B: it
    /// reaches later steps, the start and ready commands and templates built `fromTemplate`
    /// on this one, never a sandbox's commands (ADR 0012).
    pub fn runtime_context(&self) -> StepContext {
        StepContext {
            env: Default::default(),
            ..self.context.clone()
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct State {
    pub record: Option<SnapshotRecord>,
    pub tombstoned: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    Record {
        record: SnapshotRecord,
        now: DateTime<Utc>,
    },
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "type")]
pub enum Event {
    #[serde(rename = "SnapshotRecorded.v1")]
    SnapshotRecorded {
        record: SnapshotRecord,
        recorded_at: DateTime<Utc>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("the snapshot is already recorded with other facts; snapshots are immutable, record a new id")]
    AlreadyRecorded,
    #[error("a snapshot needs at least one layer")]
    NoLayers,
}

pub fn decide(state: &State, command: &Command) -> Result<Vec<Event>, Error> {
    match command {
        Command::Record { record, now } => {
            if record.layers.is_empty() {
                return Err(Error::NoLayers);
            }
            match &state.record {
                Some(existing) if existing == record => Ok(vec![]),
                Some(_) => Err(Error::AlreadyRecorded),
                None => Ok(vec![Event::SnapshotRecorded {
                    record: record.clone(),
                    recorded_at: *now,
                }]),
            }
        }
    }
}

pub fn evolve(mut state: State, event: &Event) -> State {
    match event {
        Event::SnapshotRecorded { record, .. } => state.record = Some(record.clone()),
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use uuid::Uuid;

    fn record(layers: &[&[u8]]) -> SnapshotRecord {
        SnapshotRecord {
            purpose: Purpose::Template,
            layers: layers.iter().map(|l| Digest::of(l)).collect(),
            base_image_digest: None,
            context: StepContext::after_default_user(),
            start_cmd: None,
            ready_cmd: None,
            build: BuildId::from_uuid(Uuid::from_u128(1)),
            epoch: Epoch::FIRST,
        }
    }

    #[test]
    fn a_snapshot_is_recorded_once_and_never_changes() {
        let now = Utc.with_ymd_and_hms(2026, 11, 29, 12, 0, 0).unwrap();
        let first = Command::Record {
            record: record(&[b"a"]),
            now,
        };
        let events = decide(&State::default(), &first).unwrap();
        assert_eq!(events.len(), 1);
        let state = events.iter().fold(State::default(), evolve);
        assert_eq!(
            decide(&state, &first).unwrap(),
            vec![],
            "a replay is a no-op"
        );
        let other = Command::Record {
            record: record(&[b"a", b"b"]),
            now,
        };
        assert_eq!(decide(&state, &other), Err(Error::AlreadyRecorded));
        let empty = Command::Record {
            record: record(&[]),
            now,
        };
        assert_eq!(decide(&State::default(), &empty), Err(Error::NoLayers));
    }
}
