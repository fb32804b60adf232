//! An attempt's writes to its build: acquiring it, every command it runs under its epoch
//! (lease renewal, step progress, failure), and recording a snapshot guarded by it.
//!
//! Rules and events: `domain/build/decide.rs` (`AcquireAttempt` → `AttemptAcquired`,
//! `RenewLease` → `LeaseRenewed`, `RecordStepProgress` and `RecordStepsCached` → `StepCompleted`,
//! `RecordCacheConsultation` → `CacheConsulted`, `PinBaseImage` → `BaseImageResolved`,
//! `FailBuild` → `BuildFailed`), `domain/snapshot.rs` (`Record`); read model: `builds`
//! (inline).
//!
//! The worker's retry within the lease and the command ids that make a retry a replay stay
//! with the worker (`worker/attempt.rs`); these functions are one decide-and-append each. Each
//! build write takes the state the attempt carried forward from its previous write (`carried`),
//! so a write that follows the attempt's own does not read and fold the stream again.

use chrono::{DateTime, Utc};

use super::{CommandContext, Error, Executed, Refusal};
use crate::domain::build::{
    self, AttemptGrant, BasePin, CacheConsultation, FailedStep, StepOutcome,
};
use crate::domain::ids::{self, BuildId, Epoch, SnapshotId};
use crate::domain::snapshot::{self, SnapshotRecord};
use crate::events::command::{execute_writes_with, load, Loaded};
use crate::events::{AppendOutcome, CommandError, EventStore};
use crate::streams::{build_stream, database_now, snapshot_stream, Build, Snapshot};

/// Decide-and-append rounds before a contended snapshot write gives up.
const MAX_ROUNDS: u32 = 32;

/// Claims a queued build for `grant.node`, opening the next epoch.
pub async fn acquire_attempt(
    store: &EventStore,
    ctx: &CommandContext,
    build: BuildId,
    carried: Option<Loaded<build::State>>,
    grant: AttemptGrant,
    now: DateTime<Utc>,
) -> Result<Executed<build::State>, Error<build::Error>> {
    let command = build::Command::AcquireAttempt { grant, now };
    super::build::run_from(store, ctx, &build, carried, &command).await
}

/// Extends attempt `epoch`'s lease to `lease_expires_at`.
pub async fn renew_lease(
    store: &EventStore,
    ctx: &CommandContext,
    build: BuildId,
    carried: Option<Loaded<build::State>>,
    epoch: Epoch,
    now: DateTime<Utc>,
    lease_expires_at: DateTime<Utc>,
) -> Result<Executed<build::State>, Error<build::Error>> {
    let command = build::Command::RenewLease {
        epoch,
        now,
        lease_expires_at,
    };
    super::build::run_from(store, ctx, &build, carried, &command).await
}

/// Records `step`'s outcome in attempt `epoch`.
#[allow(clippy::too_many_arguments)]
pub async fn record_step(
    store: &EventStore,
    ctx: &CommandContext,
    build: BuildId,
    carried: Option<Loaded<build::State>>,
    epoch: Epoch,
    step: u32,
    outcome: StepOutcome,
    now: DateTime<Utc>,
) -> Result<Executed<build::State>, Error<build::Error>> {
    let command = build::Command::RecordStepProgress {
        epoch,
        step,
        outcome,
        now,
    };
    super::build::run_from(store, ctx, &build, carried, &command).await
}

/// Records steps `1..=upto` as answered from the cache by `snapshot`, in one append.
#[allow(clippy::too_many_arguments)]
pub async fn record_steps_cached(
    store: &EventStore,
    ctx: &CommandContext,
    build: BuildId,
    carried: Option<Loaded<build::State>>,
    epoch: Epoch,
    upto: u32,
    snapshot: SnapshotId,
    now: DateTime<Utc>,
) -> Result<Executed<build::State>, Error<build::Error>> {
    let command = build::Command::RecordStepsCached {
        epoch,
        upto,
        snapshot,
        now,
    };
    super::build::run_from(store, ctx, &build, carried, &command).await
}

/// Records what attempt `epoch`'s cache lookup found.
pub async fn record_cache_consultation(
    store: &EventStore,
    ctx: &CommandContext,
    build: BuildId,
    carried: Option<Loaded<build::State>>,
    epoch: Epoch,
    consultation: CacheConsultation,
    now: DateTime<Utc>,
) -> Result<Executed<build::State>, Error<build::Error>> {
    let command = build::Command::RecordCacheConsultation {
        epoch,
        consultation,
        now,
    };
    super::build::run_from(store, ctx, &build, carried, &command).await
}

/// Pins the base image's tag to the digest it resolved to, for this and later attempts.
pub async fn pin_base_image(
    store: &EventStore,
    ctx: &CommandContext,
    build: BuildId,
    carried: Option<Loaded<build::State>>,
    epoch: Epoch,
    pin: &BasePin,
    now: DateTime<Utc>,
) -> Result<Executed<build::State>, Error<build::Error>> {
    let command = build::Command::PinBaseImage {
        epoch,
        reference: pin.reference.clone(),
        digest: pin.digest,
        now,
    };
    super::build::run_from(store, ctx, &build, carried, &command).await
}

/// Ends the build in `error` at `step` with the message the user sees.
#[allow(clippy::too_many_arguments)]
pub async fn fail_build(
    store: &EventStore,
    ctx: &CommandContext,
    build: BuildId,
    carried: Option<Loaded<build::State>>,
    epoch: Epoch,
    step: FailedStep,
    message: &str,
    now: DateTime<Utc>,
) -> Result<Executed<build::State>, Error<build::Error>> {
    let command = build::Command::FailBuild {
        epoch,
        message: message.to_owned(),
        step: Some(step),
        now,
    };
    super::build::run_from(store, ctx, &build, carried, &command).await
}

/// Records a snapshot and, in the same transaction, the step it checkpoints (when `step` is
/// given): the snapshot becomes reachable only if attempt `epoch` still holds the build.
/// Without a step the build stream is only guarded, after the same fencing check. Every layer
/// of the record is referenced on its `object-…` stream in the same append (the Deleting
/// barrier): a layer a GC pass is deleting refuses the write with
/// [`Refusal::ObjectBarrier`], as does one a pass deleted unless it is in `restored` (the
/// caller stored it again). Times are the database's, read again on every round. A retry of a
/// try that committed (its reply lost) decides on the state that try made: the step and the
/// record are already there and the layers were used moments ago (`object::USE_REFRESH`), so
/// every write is a guard and nothing is appended twice.
///
/// With `entry`, the step's cache entry is published in the same append (issue: a crash
/// between the record and a separate entry write left a committed checkpoint no later build
/// could find). The entry never decides the record: if the cache refuses it (another build's
/// entry won the key), the record is appended without it and the refusal is answered.
#[allow(clippy::too_many_arguments)]
pub async fn record_snapshot(
    store: &EventStore,
    ctx: &CommandContext,
    build: BuildId,
    epoch: Epoch,
    id: SnapshotId,
    record: &SnapshotRecord,
    step: Option<u32>,
    restored: &[ids::Digest],
    entry: Option<&super::cache::PublishEntry>,
) -> Result<(AppendOutcome, Option<EntryVerdict>), Error<Refusal>> {
    let build_id = build;
    let (build_stream, snap_stream) = (build_stream(&build), snapshot_stream(&id));
    let (build_stream, snap_stream) = (&build_stream, &snap_stream);
    execute_writes_with(store, MAX_ROUNDS, move || async move {
        let now = database_now(store.pool()).await?;
        let build = load::<Build>(store, build_stream)
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
                build::check_open_attempt(&build.state, epoch, now)
                    .map_err(|e| CommandError::Rejected(e.into()))?;
                Vec::new()
            }
        };
        let snap = load::<Snapshot>(store, snap_stream)
            .await
            .map_err(CommandError::into_other)?;
        let snap_events = snapshot::decide(
            &snap.state,
            &snapshot::Command::Record {
                record: record.clone(),
                now,
            },
        )
        .map_err(|e| CommandError::Rejected(e.into()))?;
        let mut writes = vec![
            ctx.write(build_stream, build.expected(), &build_events)?,
            ctx.write(snap_stream, snap.expected(), &snap_events)?,
        ];
        let by = format!("build {build_id} attempt {epoch} snapshot {id}");
        writes.extend(
            super::object::reference_writes(store, ctx, &record.layers, &by, now, restored).await?,
        );
        let verdict = match entry {
            None => None,
            Some(publish) => match super::cache::entry_write(store, ctx, publish, now).await {
                Ok(write) => {
                    writes.push(write);
                    Some(EntryVerdict::Published)
                }
                Err(CommandError::Rejected(refusal)) => Some(EntryVerdict::Refused(refusal)),
                Err(other) => return Err(other),
            },
        };
        Ok((writes, verdict))
    })
    .await
}

/// What became of a cache entry published with a snapshot record.
#[derive(Debug)]
pub enum EntryVerdict {
    /// Appended with the record (or already there).
    Published,
    /// The cache refused it; the record was appended without it.
    Refused(Refusal),
}
