//! Reconcilers: processes that drive every build to a terminal state when the actor that should
//! have moved it is gone (a dead node, a client that never started, an upload never made).
//!
//! Each reconciler is one pass ([`Reconciler::pass`]): find candidates in the `builds` read model
//! with the database clock, re-read each build's authoritative stream, decide there, and append
//! by compare-and-set. The read model is only a hint; the stream decides. A pass that loses a
//! race (the worker renewed, another reconciler got there first) decides again on fresh state
//! and finds nothing to do, so any number of copies may run at once and no transition is ever
//! applied twice. Passes run on a cron schedule ([`schedule`]).
//!
//! * [`attempt_expiry`]: Active with an expired lease -> Error(NodeLost).
//! * [`promotion`]: Publishing with an expired lease -> the outbox driven to Ready.
//! * [`waiting_deadline`]: Waiting or Queued past the deadline -> Error.
//! * [`intent_expiry`]: pending upload intents past `expires_at` on waiting builds -> expired.
//! * [`sandbox_expiry`]: launched sandboxes past their deadline -> expired; on a node that
//!   stopped reporting -> lost.
//! * [`gc`]: stored objects no root reaches -> deleted through the Deleting barrier, as the
//!   retention policy allows (on its own, slower schedule).
//!
//! Design: docs/adr/0007-reconcilers.md.

pub mod attempt_expiry;
pub mod error;
pub mod gc;
pub mod intent_expiry;
pub mod promotion;
pub mod sandbox_expiry;
pub mod schedule;
pub mod waiting_deadline;

use std::sync::Arc;

use tracing::Instrument;

use crate::domain::ids::BuildId;
use crate::events::{Actor, ActorRole, CommandContext, EventStore, Metadata};
use crate::vmm::BlobStore;

pub use error::ReconcileError;
pub use schedule::{run_scheduled, Schedule};

/// Candidates one pass takes at most; the next pass takes the rest.
pub const BATCH: i64 = 500;

/// The reconcilers, by the name `strata reconcile --only NAME` takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Reconciler {
    /// Active builds whose lease passed -> Error(NodeLost), bindings released.
    AttemptExpiry,
    /// Publishing builds whose lease passed -> promotion driven to Ready.
    Promotion,
    /// Waiting or queued builds past their deadline -> Error.
    WaitingDeadline,
    /// Pending upload intents past their expiry on waiting builds -> expired.
    IntentExpiry,
    /// Stored objects no root reaches -> deleted as the retention policy allows.
    Gc,
    /// Launched sandboxes past their deadline -> expired; on a lost node -> lost.
    SandboxExpiry,
}

impl Reconciler {
    pub const ALL: [Reconciler; 6] = [
        Reconciler::AttemptExpiry,
        Reconciler::Promotion,
        Reconciler::WaitingDeadline,
        Reconciler::IntentExpiry,
        Reconciler::Gc,
        Reconciler::SandboxExpiry,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Reconciler::AttemptExpiry => "attempt-expiry",
            Reconciler::Promotion => "promotion",
            Reconciler::WaitingDeadline => "waiting-deadline",
            Reconciler::IntentExpiry => "intent-expiry",
            Reconciler::Gc => "gc",
            Reconciler::SandboxExpiry => "sandbox-expiry",
        }
    }

    /// One pass over what is due now.
    pub async fn pass(self, env: &ReconcileEnv) -> Result<Pass, ReconcileError> {
        let started = std::time::Instant::now();
        let pass = self.pass_inner(env).await;
        crate::metrics::reconciler_pass(
            self.name(),
            started.elapsed(),
            pass.as_ref().ok().map(|p| (p.applied, p.skipped, p.failed)),
        );
        pass
    }

    async fn pass_inner(self, env: &ReconcileEnv) -> Result<Pass, ReconcileError> {
        match self {
            Reconciler::AttemptExpiry => attempt_expiry::pass(env).await,
            Reconciler::Promotion => promotion::pass(env).await,
            Reconciler::WaitingDeadline => waiting_deadline::pass(env).await,
            Reconciler::IntentExpiry => intent_expiry::pass(env).await,
            Reconciler::SandboxExpiry => sandbox_expiry::pass(env).await,
            Reconciler::Gc => {
                let report = gc::pass(env, &env.gc, &gc::PassOptions::default()).await?;
                Ok(Pass {
                    candidates: report.planned.len(),
                    applied: report.deleted.len(),
                    skipped: report.kept.len(),
                    failed: 0,
                })
            }
        }
    }
}

impl std::fmt::Display for Reconciler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What reconcilers share: the store, this process's node id, the blob store promotion checks
/// layers in and GC deletes from, and the retention policy.
#[derive(Clone)]
pub struct ReconcileEnv {
    pub store: EventStore,
    pub node: String,
    pub blobs: Arc<dyn BlobStore>,
    pub gc: gc::GcPolicy,
    /// The data directory whose image catalog (`<dir>/images/*.json`) GC keeps: built-in and
    /// imported base images cannot be fetched again. `None`: no catalog is rooted.
    pub catalog: Option<std::path::PathBuf>,
}

impl ReconcileEnv {
    /// Metadata of a reconciler's event about `build`: role Reconciler, this node, the epoch the
    /// transition concerns.
    pub fn metadata(&self, build: BuildId, epoch: Option<u64>) -> Metadata {
        let m = Metadata::new(Actor::new(ActorRole::Reconciler, &self.node))
            .with_correlation(build.as_uuid());
        match epoch {
            Some(e) => m.with_epoch(e),
            None => m,
        }
    }

    pub fn context(&self, build: BuildId, epoch: Option<u64>) -> CommandContext {
        CommandContext::new(self.metadata(build, epoch)).with_max_attempts(16)
    }
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pass {
    /// Candidates the read model listed.
    pub candidates: usize,
    /// Transitions this pass appended.
    pub applied: usize,
    /// Candidates with nothing to do on fresh state (a lost race, a renewed lease).
    pub skipped: usize,
    /// Candidates that failed and are retried next pass.
    pub failed: usize,
}

impl Pass {
    /// One pass over the builds that `due_sql` lists (its only parameter, `$1`, is the batch
    /// size): each is handed to `act`, which re-reads the build's stream and decides there, so
    /// a stale row costs a skip, never a wrong transition.
    async fn over_due_builds<F, Fut>(
        env: &ReconcileEnv,
        due: crate::projections::builds::Due,
        what: &str,
        mut act: F,
    ) -> Result<Pass, ReconcileError>
    where
        F: FnMut(BuildId) -> Fut,
        Fut: std::future::Future<Output = Result<bool, ReconcileError>>,
    {
        use crate::projections::builds::{due_builds, Due};
        let reconciler = match due {
            Due::LapsedAttempt => "attempt-expiry",
            Due::LapsedPromotion => "promotion",
            Due::PastDeadline => "waiting-deadline",
        };
        let listed = due_builds(env.store.pool(), due, BATCH).await?;
        let mut pass = Pass {
            candidates: listed.len(),
            ..Pass::default()
        };
        for due in listed {
            let span = crate::trace::build_span(&env.store, due.build, what).await;
            let outcome = act(due.build).instrument(span).await;
            if matches!(outcome, Ok(true)) {
                // How long past due the transition was when this pass found it.
                crate::metrics::reconciler_lag(reconciler, due.overdue);
            }
            pass.add(outcome, what, due.build);
        }
        Ok(pass)
    }

    /// Counts one candidate's outcome (`Ok(false)`: nothing to do on fresh state); a failure
    /// is logged with the candidate it concerns and retried next pass.
    fn add<E: std::fmt::Display>(
        &mut self,
        outcome: Result<bool, E>,
        what: &str,
        candidate: impl std::fmt::Display,
    ) {
        match outcome {
            Ok(true) => self.applied += 1,
            Ok(false) => self.skipped += 1,
            Err(e) => {
                self.failed += 1;
                tracing::warn!(%candidate, error = %e, "{what} failed; retrying next pass");
            }
        }
    }
}
