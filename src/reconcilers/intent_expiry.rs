//! Intent expiry: a pending upload intent (a signed link handed out, its upload never completed)
//! past `expires_at` on a build that is still Waiting is marked expired with `ExpireIntent`, so
//! its reserved generation no longer counts as in flight.
//!
//! The pass finds the builds with an intent due in `upload_intents` (pending intents of waiting
//! builds by expiry, kept by the `builds` projection), paged by id, and decides on each build's
//! stream: its cost follows the intents due, not the waiting builds in the store. Intents of
//! builds past Waiting cannot complete any more (completion requires Waiting) and are released
//! with the build's terminal state.

use uuid::Uuid;

use super::{Pass, ReconcileEnv, ReconcileError, BATCH};
use crate::app::build::expire_intent;
use crate::app::CommandError;
use crate::domain::build::{IntentState, Phase};
use crate::domain::ids::{BuildId, IntentId};
use crate::events::command::load;
use crate::streams::{build_stream, database_now, Build};

pub async fn pass(env: &ReconcileEnv) -> Result<Pass, ReconcileError> {
    let mut pass = Pass::default();
    let mut after = Uuid::nil();
    loop {
        let page = crate::projections::builds::builds_with_intents_due_after(
            env.store.pool(),
            after,
            BATCH,
        )
        .await?;
        let Some(last) = page.last() else { break };
        after = *last;
        for id in page {
            let build = BuildId::from_uuid(id);
            let due = match due_intents(env, build).await {
                Ok(due) => due,
                Err(e) => {
                    pass.add(Err(e), "reading intents", build);
                    continue;
                }
            };
            for (intent, overdue) in due {
                pass.candidates += 1;
                let outcome = expire(env, build, intent).await;
                if matches!(outcome, Ok(true)) {
                    crate::metrics::reconciler_lag("intent-expiry", overdue);
                }
                pass.add(outcome, "intent expiry", build);
            }
        }
    }
    Ok(pass)
}

/// The build's pending intents whose expiry passed, if it is still Waiting, with how long ago.
async fn due_intents(
    env: &ReconcileEnv,
    build: BuildId,
) -> Result<Vec<(IntentId, chrono::Duration)>, ReconcileError> {
    let loaded = load::<Build>(&env.store, &build_stream(&build))
        .await
        .map_err(ReconcileError::store)?;
    if !matches!(loaded.state.phase, Phase::Waiting { .. }) {
        return Ok(vec![]);
    }
    let now = database_now(env.store.pool()).await?;
    Ok(loaded
        .state
        .intents
        .iter()
        .filter(|(_, i)| i.state == IntentState::Pending && i.expires_at <= now)
        .map(|(id, i)| (*id, now - i.expires_at))
        .collect())
}

/// Expires `intent` if it is still pending and past its expiry.
pub async fn expire(
    env: &ReconcileEnv,
    build: BuildId,
    intent: IntentId,
) -> Result<bool, ReconcileError> {
    let now = database_now(env.store.pool()).await?;
    match expire_intent(&env.store, &env.context(build, None), &build, intent, now).await {
        Ok(done) => Ok(!done.events.is_empty()),
        // Completed or expired meanwhile: nothing to do.
        Err(CommandError::Rejected(reason)) => {
            tracing::debug!(%build, %intent, %reason, "intent not expired");
            Ok(false)
        }
        Err(e) => Err(ReconcileError::store(e)),
    }
}
