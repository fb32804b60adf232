//! An attempt's writes to its build: acquiring it, every command it runs under its epoch
//! (lease renewal, step progress, failure), and recording a snapshot guarded by it.
//!
//! Rules and events: `domain/build/decide.rs` (`AcquireAttempt` → `AttemptAcquired`,
//! `RenewLease` → `LeaseRenewed`, `RecordStepProgress` → `StepCompleted`, `FailBuild` →
//! `BuildFailed`), `domain/snapshot.rs` (`Record`); read model: `builds` (inline).
//!
//! The worker's retry within the lease and the command ids that make a retry a replay stay
//! with the worker (`worker/attempt.rs`); these functions are one decide-and-append each.

use chrono::{DateTime, Utc};

use super::{CommandContext, Error, Executed, Refusal};
use crate::domain::build::{self, AttemptGrant, StepOutcome};
use crate::domain::ids::{BuildId, Epoch, SnapshotId};
use crate::domain::snapshot::{self, SnapshotRecord};
use crate::events::command::{execute_writes, load};
use crate::events::{AppendOutcome, CommandError, EventStore, StreamWrite};
use crate::streams::{build_stream, database_now, snapshot_stream, Build, Snapshot};

/// Decide-and-append rounds before a contended snapshot write gives up.
const MAX_ROUNDS: u32 = 32;

/// Claims a queued build for `grant.node`, opening the next epoch.
pub async fn acquire_attempt(
    store: &EventStore,
    ctx: &CommandContext,
    build: BuildId,
    grant: AttemptGrant,
    now: DateTime<Utc>,
) -> Result<Executed<build::State>, Error<build::Error>> {
    super::build::run(
        store,
        ctx,
        &build,
        &build::Command::AcquireAttempt { grant, now },
    )
    .await
}

/// Runs one of an attempt's build commands (each names its epoch, which the build checks).
pub async fn record(
    store: &EventStore,
    ctx: &CommandContext,
    build: BuildId,
    command: &build::Command,
) -> Result<Executed<build::State>, Error<build::Error>> {
    super::build::run(store, ctx, &build, command).await
}

/// Records a snapshot and, in the same transaction, the step it checkpoints (when `step` is
/// given): the snapshot becomes reachable only if attempt `epoch` still holds the build.
/// Without a step the build stream is only guarded, after the same fencing check. Times are the
/// database's, read again on every round.
pub async fn record_snapshot(
    store: &EventStore,
    ctx: &CommandContext,
    build: BuildId,
    epoch: Epoch,
    id: SnapshotId,
    record: &SnapshotRecord,
    step: Option<u32>,
) -> Result<AppendOutcome, Error<Refusal>> {
    let (build_stream, snap_stream) = (build_stream(&build), snapshot_stream(&id));
    let (build_stream, snap_stream) = (&build_stream, &snap_stream);
    execute_writes(store, MAX_ROUNDS, move || async move {
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
        Ok(vec![
            StreamWrite::new(
                build_stream.clone(),
                build.expected(),
                ctx.encode(build_stream, &build_events)?,
            ),
            StreamWrite::new(
                snap_stream.clone(),
                snap.expected(),
                ctx.encode(snap_stream, &snap_events)?,
            ),
        ])
    })
    .await
}
