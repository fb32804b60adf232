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
        pass.count(&id, "sandbox expiry", outcome.map(|s| s.is_ended()));
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
        pass.count(&id, "sandbox loss", outcome.map(|s| s.is_ended()));
    }
    Ok(pass)
}

impl Pass {
    fn count<E: std::fmt::Display>(
        &mut self,
        id: &SandboxId,
        what: &str,
        outcome: Result<bool, CommandError<E>>,
    ) {
        match outcome {
            Ok(true) => self.applied += 1,
            Ok(false) | Err(CommandError::Rejected(_)) => self.skipped += 1,
            Err(e) => {
                self.failed += 1;
                tracing::warn!(sandbox = %id, error = %e, "{what} failed; retrying next pass");
            }
        }
    }
}
