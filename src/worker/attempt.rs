//! One attempt on one build, seen from the node that holds it: acquiring it, renewing its lease,
//! and every write it makes to the build stream. Each write names the epoch (in the command and
//! in the event metadata); the build refusing it means the attempt is closed or its lease passed,
//! and is reported as [`WorkerError::Fenced`]: the caller stops and writes nothing more. A store
//! that cannot be reached is not that: the write is retried within the lease
//! ([`store_retry`](super::store_retry)), under one command id so a lost reply is a replay.
//!
//! Time is the database's (`SELECT now()`), so every node judges leases by one clock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::error::{Fence, WorkerError};
use super::store_retry::retrying;
use crate::app::{self, CommandContext, CommandError, Executed};
use crate::domain::build::{
    self, AttemptGrant, BasePin, CacheConsultation, FailedStep, StepOutcome,
};
use crate::domain::ids::{BuildId, Epoch, NodeId, SnapshotId};
use crate::domain::snapshot::SnapshotRecord;
use crate::events::command::{load, Loaded};
use crate::events::{Actor, ActorRole, AppendError, EventStore, Metadata, ReadError, StreamId};
use crate::streams::{build_stream, Build};

/// Decide-and-append rounds before a contended write gives up.
const MAX_ROUNDS: u32 = 32;

pub use crate::streams::database_now as db_now;

fn worker_metadata(node: &str, build: BuildId) -> Metadata {
    Metadata::new(Actor::new(ActorRole::Worker, node)).with_correlation(build.as_uuid())
}

/// Tries to claim a queued build for `node`. `Ok(None)` when it is not claimable any more
/// (another node took it, it expired, it was never queued).
///
/// The command id is derived from the build, the node and the epoch it would open, and a store
/// error is retried with that same id: if the first try committed and only its reply was lost,
/// the retry is recognised as a replay and the node keeps the claim instead of leaving the build
/// Active with nobody running it.
///
/// `max_running`: the build's team may have at most this many builds running; the acquire is
/// refused inside its own transaction past it (`Ok(None)`), so nodes claiming at once cannot
/// together run more.
pub async fn acquire(
    store: &EventStore,
    build: BuildId,
    node: &str,
    lease: Duration,
    max_running: Option<u32>,
) -> Result<Option<Attempt>, WorkerError> {
    let node_id = NodeId::parse(node).map_err(|e| WorkerError::Store(format!("node id: {e}")))?;
    let stream = build_stream(&build);
    let observed = load::<Build>(store, &stream)
        .await
        .map_err(WorkerError::store)?;
    let epoch = observed.state.last_epoch.map_or(Epoch::FIRST, Epoch::next);
    let ctx = CommandContext::with_id(
        command_id(build, &["acquire", node, &epoch.to_string()]),
        worker_metadata(node, build),
    )
    .with_admission(observed.state.registration.as_ref().and_then(|r| {
        crate::projections::team_usage::cap(
            &r.team,
            crate::domain::team_limits::Held::RunningBuilds,
            max_running.map(u64::from),
        )
    }));
    let executed = retry_store_errors(build, "acquiring", || async {
        let now = db_now(store.pool()).await?;
        let grant = AttemptGrant {
            node: node_id.clone(),
            lease_expires_at: now + lease,
        };
        let carried = Some(observed.clone());
        Ok(app::attempt::acquire_attempt(store, &ctx, build, carried, grant, now).await)
    })
    .await?;
    match executed {
        Ok(done) => match done.state.phase {
            // Appended now: the state after our event is ours. Replayed: only the epoch this
            // command opened is ours (the id names it).
            build::Phase::Active {
                epoch: held,
                node: ref n,
                ..
            } if n.as_str() == node && (!done.replay || held == epoch) => {
                if done.replay {
                    tracing::info!(%build, epoch = %held, "acquire replayed after a lost reply; keeping the claim");
                }
                let carried = Loaded {
                    state: done.state.clone(),
                    version: done.version,
                };
                Ok(Some(Attempt {
                    store: store.clone(),
                    build,
                    epoch: held,
                    node: node.to_owned(),
                    lease,
                    carried: Arc::new(Mutex::new(Some(carried))),
                }))
            }
            _ => Ok(None),
        },
        Err(CommandError::Rejected(reason)) => {
            tracing::debug!(%build, %reason, "build not acquired");
            Ok(None)
        }
        Err(CommandError::Append(AppendError::Refused(reason))) => {
            tracing::info!(%build, %reason, "build left queued: its team is at its running-build limit");
            Ok(None)
        }
        Err(err) => Err(WorkerError::store(err)),
    }
}

/// A command id derived from the build and `parts`: the same logical command gets the same id
/// on every try, so a retry after a lost reply is a replay (ADR 0009).
fn command_id(build: BuildId, parts: &[&str]) -> Uuid {
    use sha2::Digest as _;
    let mut hasher = sha2::Sha256::new();
    hasher.update(b"strata.worker-command-id.v1\0");
    hasher.update(build.as_uuid().as_bytes());
    for part in parts {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&hasher.finalize()[..16]);
    uuid::Builder::from_custom_bytes(bytes).into_uuid()
}

/// Tries of a worker write whose store call failed (a lost connection, a lost reply) before it
/// gives up; with the backoff below they span about six seconds, well inside a lease.
const STORE_TRIES: u32 = 5;

/// Runs `op` until it gives an answer from the store; an error of the store itself (the
/// database, a lost reply) is retried with backoff. `op` must reuse one command id across tries.
async fn retry_store_errors<T, E, F, Fut>(
    build: BuildId,
    what: &str,
    mut op: F,
) -> Result<Result<T, CommandError<E>>, WorkerError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Result<T, CommandError<E>>, WorkerError>>,
    E: std::fmt::Display,
{
    let mut tries = 0;
    loop {
        tries += 1;
        let outcome = op().await;
        let retryable = matches!(
            &outcome,
            Err(WorkerError::Database(_))
                | Ok(Err(CommandError::Append(AppendError::Database(_))))
                | Ok(Err(CommandError::Append(
                    AppendError::SerializationRetriesExhausted { .. }
                )))
                | Ok(Err(CommandError::Read(ReadError::Database(_))))
        );
        if !retryable || tries >= STORE_TRIES {
            return outcome;
        }
        let error = match &outcome {
            Err(e) => e.to_string(),
            Ok(Err(e)) => e.to_string(),
            Ok(Ok(_)) => unreachable!("success is not retried"),
        };
        tracing::warn!(%build, tries, %error, "{what} failed in the store; retrying with the same command id");
        tokio::time::sleep(Duration::from_millis(200) * 2u32.pow(tries - 1)).await;
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
    /// The build as this attempt's last write left it (shared with the lease renewer, which
    /// writes the same stream): the next write decides on it instead of reading and folding the
    /// stream again. A write by anyone else makes it stale, which the next append's version
    /// check catches; that write then decides on the stream as it is.
    carried: Arc<Mutex<Option<Loaded<build::State>>>>,
}

impl Attempt {
    /// Metadata of every event this attempt appends: worker, node, epoch, build.
    pub fn metadata(&self) -> Metadata {
        worker_metadata(&self.node, self.build).with_epoch(self.epoch.0)
    }

    pub fn context(&self) -> CommandContext {
        CommandContext::new(self.metadata()).with_max_attempts(MAX_ROUNDS)
    }

    /// The context of recording `outcome` for `step` in this attempt. The outcome is part of
    /// the id, so a different outcome for the same step is a new command (which the domain
    /// refuses as a conflict), never mistaken for a replay.
    fn step_context(&self, step: u32, outcome: &StepOutcome) -> CommandContext {
        let outcome = serde_json::to_string(outcome).expect("a step outcome serializes");
        CommandContext::with_id(
            command_id(
                self.build,
                &["step", &self.epoch.to_string(), &step.to_string(), &outcome],
            ),
            self.metadata(),
        )
        .with_max_attempts(MAX_ROUNDS)
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

    /// One of this attempt's writes, as the worker sees it: a refusal by the build is
    /// [`WorkerError::Fenced`]; anything else is the store's.
    fn settle(
        &self,
        written: Result<Executed<build::State>, CommandError<build::Error>>,
    ) -> Result<build::State, WorkerError> {
        match written {
            Ok(done) => {
                self.carry(&done);
                Ok(done.state)
            }
            Err(CommandError::Rejected(reason)) => Err(WorkerError::Fenced {
                build: self.build,
                epoch: self.epoch,
                reason: Fence::Refused(reason),
            }),
            Err(err) => Err(WorkerError::store(err)),
        }
    }

    /// Runs one of this attempt's writes, retrying while the store is unavailable
    /// (within the lease, under the same command id, so a reply lost after commit is a replay).
    /// Each try reads the database's clock afresh: a retry late in the lease is judged by the
    /// time it is made, never by the time of the first try.
    async fn write<F, Fut>(&self, write: F) -> Result<(), WorkerError>
    where
        F: Fn(Option<Loaded<build::State>>, DateTime<Utc>) -> Fut,
        Fut: std::future::Future<
            Output = Result<Executed<build::State>, CommandError<build::Error>>,
        >,
    {
        self.retrying("recording progress", || async {
            let now = self.now().await?;
            self.settle(write(self.carried(), now).await)
        })
        .await
        .map(drop)
    }

    /// Keeps `done`'s state for the next write, unless a later one is already kept.
    fn carry(&self, done: &Executed<build::State>) {
        let mut carried = self.carried.lock().unwrap_or_else(|e| e.into_inner());
        if carried.as_ref().is_none_or(|c| c.version < done.version) {
            *carried = Some(Loaded {
                state: done.state.clone(),
                version: done.version,
            });
        }
    }

    /// The state the next write decides on first (see [`Attempt::carried`]).
    pub fn carried(&self) -> Option<Loaded<build::State>> {
        self.carried
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Forgets the carried state: a multi-stream write moved the build in a way this attempt
    /// did not fold, so the next write reads the stream.
    fn forget(&self) {
        *self.carried.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Extends the lease to `lease` from now. Tried once: the renewal loop is the retry.
    pub async fn renew(&self, lease: Duration) -> Result<(), WorkerError> {
        let now = self.now().await?;
        let renewed = app::attempt::renew_lease(
            &self.store,
            &self.context(),
            self.build,
            self.carried(),
            self.epoch,
            now,
            now + lease,
        )
        .await;
        self.settle(renewed).map(drop)
    }

    /// Records that `step` ran without a checkpoint.
    pub async fn record_step(&self, step: u32) -> Result<(), WorkerError> {
        self.record_outcome(step, StepOutcome::Executed).await
    }

    /// Records a step's outcome that references no new snapshot (executed, or cached). An
    /// unavailable store is retried within the lease under the step's command id, so a reply
    /// lost after commit is a replay.
    pub async fn record_outcome(&self, step: u32, outcome: StepOutcome) -> Result<(), WorkerError> {
        let (store, build, epoch) = (&self.store, self.build, self.epoch);
        let ctx = self.step_context(step, &outcome);
        self.write(|carried, now| {
            app::attempt::record_step(
                store,
                &ctx,
                build,
                carried,
                epoch,
                step,
                outcome.clone(),
                now,
            )
        })
        .await
    }

    /// Records steps `1..=upto` as served from the cache by `snapshot`, in one append.
    pub async fn record_cached_prefix(
        &self,
        upto: u32,
        snapshot: SnapshotId,
    ) -> Result<(), WorkerError> {
        let (store, build, epoch) = (&self.store, self.build, self.epoch);
        let ctx = CommandContext::with_id(
            command_id(
                self.build,
                &[
                    "steps-cached",
                    &self.epoch.to_string(),
                    &upto.to_string(),
                    &snapshot.to_string(),
                ],
            ),
            self.metadata(),
        )
        .with_max_attempts(MAX_ROUNDS);
        self.write(|carried, now| {
            app::attempt::record_steps_cached(
                store, &ctx, build, carried, epoch, upto, snapshot, now,
            )
        })
        .await
    }

    /// Records what the cache lookup found (`CacheConsulted`), retried like progress.
    pub async fn record_cache_consultation(
        &self,
        consultation: CacheConsultation,
    ) -> Result<(), WorkerError> {
        let (store, build, epoch) = (&self.store, self.build, self.epoch);
        let ctx = self.context();
        self.write(|carried, now| {
            app::attempt::record_cache_consultation(
                store,
                &ctx,
                build,
                carried,
                epoch,
                consultation.clone(),
                now,
            )
        })
        .await
    }

    /// Records the digest the base image's tag resolved to, so a later attempt uses the same.
    pub async fn pin_base_image(&self, pin: &BasePin) -> Result<(), WorkerError> {
        let (store, build, epoch) = (&self.store, self.build, self.epoch);
        let ctx = self.context();
        self.write(|carried, now| {
            app::attempt::pin_base_image(store, &ctx, build, carried, epoch, pin, now)
        })
        .await
    }

    /// Records a snapshot and, in the same transaction, the step it checkpoints (when `step` is
    /// given): the snapshot becomes reachable only if the attempt still holds the build.
    pub async fn record_snapshot(
        &self,
        id: SnapshotId,
        record: &SnapshotRecord,
        step: Option<u32>,
    ) -> Result<(), WorkerError> {
        self.record_snapshot_restoring(id, record, step, &[], None)
            .await
            .map(drop)
    }

    /// [`Self::record_snapshot`] after storing `restored` layers again (a GC pass deleted them),
    /// with the step's cache `entry` in the same append when given.
    pub async fn record_snapshot_restoring(
        &self,
        id: SnapshotId,
        record: &SnapshotRecord,
        step: Option<u32>,
        restored: &[crate::domain::ids::Digest],
        entry: Option<&app::cache::PublishEntry>,
    ) -> Result<Option<app::attempt::EntryVerdict>, WorkerError> {
        // Named by its step, like [`Self::record_outcome`]: a retry is a replay.
        let ctx = match step {
            Some(step) => self.step_context(step, &StepOutcome::Checkpointed { snapshot: id }),
            None => self.context(),
        };
        let verdict = self
            .retrying("recording a snapshot", || async {
                app::attempt::record_snapshot(
                    &self.store,
                    &ctx,
                    self.build,
                    self.epoch,
                    id,
                    record,
                    step,
                    restored,
                    entry,
                )
                .await
                .map(|(_, verdict)| verdict)
                .map_err(|e| WorkerError::from_command(self.build, self.epoch, e))
            })
            .await?;
        if step.is_some() {
            // The step was recorded on the build in the same append.
            self.forget();
        }
        Ok(verdict)
    }

    /// Ends the build in `error` with the reason the user sees.
    pub async fn fail(&self, step: FailedStep, message: &str) -> Result<(), WorkerError> {
        let (store, build, epoch) = (&self.store, self.build, self.epoch);
        let ctx = self.context();
        self.write(|carried, now| {
            app::attempt::fail_build(store, &ctx, build, carried, epoch, step, message, now)
        })
        .await
    }
}
