//! One attempt on one build, seen from the node that holds it: acquiring it, renewing its lease,
//! and every write it makes to the build stream. Each write names the epoch (in the command and
//! in the event metadata); the build refusing it means the attempt is closed or its lease passed,
//! and is reported as [`WorkerError::Fenced`]: the caller stops and writes nothing more. A store
//! that cannot be reached is not that: the write is retried within the lease
//! ([`store_retry`](super::store_retry)).
//!
//! Time is the database's (`SELECT now()`), so every node judges leases by one clock.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::error::{Fence, Refusal, WorkerError};
use super::store_retry::retrying;
use crate::domain::build::{self, AttemptGrant, FailedStep, StepOutcome};
use crate::domain::ids::{BuildId, Epoch, NodeId, SnapshotId};
use crate::domain::snapshot::{self, SnapshotRecord};
use crate::events::command::load;
use crate::events::{
    execute, execute_writes, Actor, ActorRole, CommandContext, CommandError, EventStore, Metadata,
    StreamId, StreamWrite,
};
use crate::streams::{build_stream, snapshot_stream, Build, Snapshot};

/// Decide-and-append rounds before a contended write gives up.
const MAX_ROUNDS: u32 = 32;

pub use crate::streams::database_now as db_now;

fn worker_metadata(node: &str, build: BuildId) -> Metadata {
    Metadata::new(Actor::new(ActorRole::Worker, node)).with_correlation(build.as_uuid())
}

/// Tries to claim a queued build for `node`. `Ok(None)` when it is not claimable any more
/// (another node took it, it expired, it was never queued).
pub async fn acquire(
    store: &EventStore,
    build: BuildId,
    node: &str,
    lease: Duration,
) -> Result<Option<Attempt>, WorkerError> {
    let node_id = NodeId::parse(node).map_err(|e| WorkerError::Store(format!("node id: {e}")))?;
    let now = db_now(store.pool()).await?;
    let command = build::Command::AcquireAttempt {
        grant: AttemptGrant {
            node: node_id,
            lease_expires_at: now + lease,
        },
        now,
    };
    let ctx = CommandContext::new(worker_metadata(node, build));
    match execute::<Build>(store, &build_stream(&build), &command, &ctx).await {
        Ok(done) => match done.state.phase {
            build::Phase::Active {
                epoch, node: ref n, ..
            } if n.as_str() == node => Ok(Some(Attempt {
                store: store.clone(),
                build,
                epoch,
                node: node.to_owned(),
                lease,
            })),
            _ => Ok(None),
        },
        Err(CommandError::Rejected(reason)) => {
            tracing::debug!(%build, %reason, "build not acquired");
            Ok(None)
        }
        Err(err) => Err(WorkerError::store(err)),
    }
}

/// An acquired attempt.
#[derive(Clone, Debug)]
pub struct Attempt {
    pub store: EventStore,
    pub build: BuildId,
    pub epoch: Epoch,
    pub node: String,
    /// The lease duration: how long a write is retried while the store is unavailable.
    pub lease: Duration,
}

impl Attempt {
    /// Metadata of every event this attempt appends: worker, node, epoch, build.
    pub fn metadata(&self) -> Metadata {
        worker_metadata(&self.node, self.build).with_epoch(self.epoch.0)
    }

    pub fn context(&self) -> CommandContext {
        CommandContext::new(self.metadata()).with_max_attempts(MAX_ROUNDS)
    }

    pub fn stream(&self) -> StreamId {
        build_stream(&self.build)
    }

    pub async fn now(&self) -> Result<DateTime<Utc>, WorkerError> {
        Ok(db_now(self.store.pool()).await?)
    }

    /// Runs `op`, retrying while the store is unavailable, for at most the lease.
    pub async fn retrying<T, F, Fut>(&self, what: &str, op: F) -> Result<T, WorkerError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, WorkerError>>,
    {
        retrying(what, self.build, self.lease, op).await
    }

    /// Runs a build command of this attempt once; a refusal is [`WorkerError::Fenced`].
    async fn command_once(&self, command: &build::Command) -> Result<build::State, WorkerError> {
        match execute::<Build>(&self.store, &self.stream(), command, &self.context()).await {
            Ok(done) => Ok(done.state),
            Err(CommandError::Rejected(reason)) => Err(WorkerError::Fenced {
                build: self.build,
                epoch: self.epoch,
                reason: Fence::Refused(reason),
            }),
            Err(err) => Err(WorkerError::store(err)),
        }
    }

    /// Runs a build command of this attempt; a refusal is [`WorkerError::Fenced`], an
    /// unavailable store is retried within the lease.
    pub async fn command(&self, command: build::Command) -> Result<build::State, WorkerError> {
        self.retrying("build command", || self.command_once(&command))
            .await
    }

    /// Runs the command that `make(now)` builds at the database's clock, retrying while the
    /// store is unavailable (each try reads the clock again).
    async fn command_at(
        &self,
        what: &str,
        make: impl Fn(DateTime<Utc>) -> build::Command,
    ) -> Result<build::State, WorkerError> {
        self.retrying(what, || async {
            let now = self.now().await?;
            self.command_once(&make(now)).await
        })
        .await
    }

    /// Extends the lease to `lease` from now. Tried once: the renewal loop is the retry.
    pub async fn renew(&self, lease: Duration) -> Result<(), WorkerError> {
        let now = self.now().await?;
        self.command_once(&build::Command::RenewLease {
            epoch: self.epoch,
            now,
            lease_expires_at: now + lease,
        })
        .await
        .map(drop)
    }

    /// Records that `step` ran without a checkpoint.
    pub async fn record_step(&self, step: u32) -> Result<(), WorkerError> {
        self.record_outcome(step, StepOutcome::Executed).await
    }

    /// Records a step's outcome that references no new snapshot (executed, or cached).
    pub async fn record_outcome(&self, step: u32, outcome: StepOutcome) -> Result<(), WorkerError> {
        let epoch = self.epoch;
        self.command_at("recording a step", |now| {
            build::Command::RecordStepProgress {
                epoch,
                step,
                outcome: outcome.clone(),
                now,
            }
        })
        .await
        .map(drop)
    }

    /// Records a snapshot and, in the same transaction, the step it checkpoints (when `step` is
    /// given): the snapshot becomes reachable only if the attempt still holds the build.
    pub async fn record_snapshot(
        &self,
        id: SnapshotId,
        record: &SnapshotRecord,
        step: Option<u32>,
    ) -> Result<(), WorkerError> {
        // One command id across the retries: a try whose reply was lost is recognised.
        let ctx = self.context();
        self.retrying("recording a snapshot", || {
            self.record_snapshot_once(&ctx, id, record, step)
        })
        .await
    }

    async fn record_snapshot_once(
        &self,
        ctx: &CommandContext,
        id: SnapshotId,
        record: &SnapshotRecord,
        step: Option<u32>,
    ) -> Result<(), WorkerError> {
        let result = execute_writes::<Refusal, _, _>(&self.store, MAX_ROUNDS, || {
            let (store, ctx, record) = (self.store.clone(), ctx.clone(), record.clone());
            let (build_stream, snap_stream, epoch) =
                (self.stream(), snapshot_stream(&id), self.epoch);
            async move {
                let now = db_now(store.pool()).await?;
                let build = load::<Build>(&store, &build_stream)
                    .await
                    .map_err(CommandError::into_other)?;
                let build_events = match step {
                    Some(step) => build::decide(
                        &build.state,
                        &build::Command::RecordStepProgress {
                            epoch,
                            step,
                            outcome: StepOutcome::Checkpointed { snapshot: id },
                            now,
                        },
                    )
                    .map_err(|e| CommandError::Rejected(e.into()))?,
                    None => {
                        // No step to record: the build stream is only guarded, after the same
                        // fencing check.
                        build::check_open_attempt(&build.state, epoch, now)
                            .map_err(|e| CommandError::Rejected(e.into()))?;
                        Vec::new()
                    }
                };
                let snap = load::<Snapshot>(&store, &snap_stream)
                    .await
                    .map_err(CommandError::into_other)?;
                let snap_events =
                    snapshot::decide(&snap.state, &snapshot::Command::Record { record, now })
                        .map_err(|e| CommandError::Rejected(e.into()))?;
                Ok(vec![
                    StreamWrite::new(
                        build_stream.clone(),
                        build.expected(),
                        ctx.encode(&build_stream, &build_events)?,
                    ),
                    StreamWrite::new(
                        snap_stream.clone(),
                        snap.expected(),
                        ctx.encode(&snap_stream, &snap_events)?,
                    ),
                ])
            }
        })
        .await;
        result
            .map(drop)
            .map_err(|e| WorkerError::from_command(self.build, self.epoch, e))
    }

    /// Ends the build in `error` with the reason the user sees.
    pub async fn fail(&self, step: FailedStep, message: &str) -> Result<(), WorkerError> {
        let epoch = self.epoch;
        self.command_at("failing the build", |now| build::Command::FailBuild {
            epoch,
            message: message.to_owned(),
            step: Some(step),
            now,
        })
        .await
        .map(drop)
    }
}
