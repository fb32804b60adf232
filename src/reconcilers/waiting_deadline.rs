//! Waiting-deadline expiry: a build still Waiting (never started) or Queued (no node claimed it)
//! past its deadline, by the database clock, ends with `ExpireWaiting`: Error(WaitingExpired or
//! QueueExpired), its bindings and pending intents released.

use super::{Pass, ReconcileEnv, ReconcileError};
use crate::app::build::expire_waiting;
use crate::app::CommandError;
use crate::domain::ids::BuildId;
use crate::projections::builds::Due;
use crate::streams::database_now;

pub async fn pass(env: &ReconcileEnv) -> Result<Pass, ReconcileError> {
    Pass::over_due_builds(env, Due::PastDeadline, "waiting-deadline expiry", |build| {
        expire(env, build)
    })
    .await
}

/// Fails the build if, on the stream, it is Waiting or Queued past its deadline.
pub async fn expire(env: &ReconcileEnv, build: BuildId) -> Result<bool, ReconcileError> {
    let now = database_now(env.store.pool()).await?;
    match expire_waiting(&env.store, &env.context(build, None), &build, now).await {
        Ok(done) => {
            if !done.events.is_empty() {
                tracing::info!(%build, "build expired before it started or was claimed");
            }
            Ok(!done.events.is_empty())
        }
        // Started, claimed or already expired by another copy: nothing to do.
        Err(CommandError::Rejected(reason)) => {
            tracing::debug!(%build, %reason, "build not expired");
            Ok(false)
        }
        Err(e) => Err(ReconcileError::store(e)),
    }
}
