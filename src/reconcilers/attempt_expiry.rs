//! Attempt expiry: an Active build whose lease passed (by the database clock) is closed with
//! `ExpireAttempt`: Error(NodeLost), its bindings and intents released, its epoch fenced.
//!
//! A Publishing build with a lapsed lease is not failed: `ExpireAttempt` refuses it, and the
//! promotion reconciler drives it forward instead.

use super::{Pass, ReconcileEnv, ReconcileError};
use crate::app::build::expire_attempt;
use crate::app::CommandError;
use crate::domain::build::Phase;
use crate::domain::ids::BuildId;
use crate::events::command::load;
use crate::projections::builds::Due;
use crate::streams::{build_stream, database_now, Build};

pub async fn pass(env: &ReconcileEnv) -> Result<Pass, ReconcileError> {
    Pass::over_due_builds(env, Due::LapsedAttempt, "attempt expiry", |build| {
        expire(env, build)
    })
    .await
}

/// Closes the build's attempt if, on the stream, it is Active with a lease that passed. `false`
/// when there was nothing to close.
pub async fn expire(env: &ReconcileEnv, build: BuildId) -> Result<bool, ReconcileError> {
    let stream = build_stream(&build);
    let loaded = load::<Build>(&env.store, &stream)
        .await
        .map_err(ReconcileError::store)?;
    let Phase::Active { epoch, .. } = loaded.state.phase else {
        return Ok(false);
    };
    let now = database_now(env.store.pool()).await?;
    match expire_attempt(&env.store, &env.context(build, Some(epoch.0)), &build, now).await {
        Ok(done) => {
            if !done.events.is_empty() {
                tracing::info!(%build, %epoch, "attempt expired: the node stopped renewing its lease");
            }
            Ok(!done.events.is_empty())
        }
        // Renewed meanwhile, or another reconciler closed it first: nothing to do.
        Err(CommandError::Rejected(reason)) => {
            tracing::debug!(%build, %reason, "attempt not expired");
            Ok(false)
        }
        Err(e) => Err(ReconcileError::store(e)),
    }
}
