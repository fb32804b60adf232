//! Sandbox expiry: a launched sandbox past its deadline (by the database clock) ends
//! `expired`, and one whose node stopped reporting that it lives ends `lost` (its processes
//! died with the node: every sandbox holds a lifeline to the process that started it).
//!
//! The node expires its own sandboxes as their deadline passes; this pass is for the node that
//! cannot (killed, cut off). Both decide on the stream, so whoever comes second writes nothing.

use super::{Pass, ReconcileEnv, ReconcileError, BATCH};
use crate::app::{self, CommandError};
use crate::domain::ids::Epoch;
use crate::domain::sandbox::SandboxId;
use crate::events::{Actor, ActorRole, CommandContext, Metadata};
use crate::streams::database_now;

fn context(env: &ReconcileEnv) -> CommandContext {
    CommandContext::new(Metadata::new(Actor::new(ActorRole::Reconciler, &env.node)))
        .with_max_attempts(16)
}

/// Whether the sandbox is ended now; a refusal (another writer got there first) is nothing to
/// do, not a failure.
fn settled<E>(
    outcome: Result<crate::domain::sandbox::State, CommandError<E>>,
) -> Result<bool, CommandError<E>> {
    match outcome {
        Ok(state) => Ok(state.is_ended()),
        Err(CommandError::Rejected(_)) => Ok(false),
        Err(e) => Err(e),
    }
}

pub async fn pass(env: &ReconcileEnv) -> Result<Pass, ReconcileError> {
    let pool = env.store.pool();
    let now = database_now(pool).await?;
    let expired = crate::projections::sandboxes::past_deadline(pool, now, BATCH).await?;
    let lost = crate::projections::sandboxes::on_lost_nodes(pool, BATCH).await?;
    let mut pass = Pass {
        candidates: expired.len() + lost.len(),
        ..Pass::default()
    };
    for raw in expired {
        let Ok(id) = SandboxId::parse(&raw) else {
            continue;
        };
        let outcome = app::sandbox::expire(&env.store, &context(env), &id, now).await;
        pass.add(settled(outcome), "sandbox expiry", &id);
    }
    for (raw, epoch, node) in lost {
        let Ok(id) = SandboxId::parse(&raw) else {
            continue;
        };
        let reason = format!("its node {node} stopped reporting that it lives");
        let outcome = app::sandbox::lose(
            &env.store,
            &context(env),
            &id,
            Epoch(epoch as u64),
            &reason,
            now,
        )
        .await;
        if matches!(outcome, Ok(ref s) if s.is_ended()) {
            tracing::info!(sandbox = %id, %node, "sandbox lost with its node");
        }
        pass.add(settled(outcome), "sandbox loss", &id);
    }
    Ok(pass)
}
