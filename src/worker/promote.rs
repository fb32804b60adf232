//! Driving a staged promotion to the end, from wherever it stands: the one implementation the
//! worker (right after entering Publishing) and the promotion reconciler (after the worker's
//! lease lapsed mid-promotion) both run.
//!
//! Steps, each a compare-and-set that emits nothing when already taken, so running this twice,
//! concurrently, or after a crash anywhere in it is harmless:
//! 1. `staged -> layers_committed`: every plan layer is a blob in the store (content addressing
//!    proves a predecessor's upload is these bytes, so it is adopted as is);
//! 2. `layers_committed -> visible`: one append of `PromotionVisible`, the template's
//!    `TagsAssigned`, and a guard that the build is still Publishing in this epoch;
//! 3. `visible -> done` and the build's `MarkReady` (epoch-checked: Publishing in this epoch, or
//!    already Ready in it), in one append.
//!
//! The build never leaves Publishing except forward: nothing here can demote Ready, and a
//! promotion of another epoch is another stream, refused by the build's epoch check.

use std::sync::Arc;

use super::base;
use super::error::WorkerError;
use crate::domain::build::{self, Phase};
use crate::domain::ids::{BuildId, Epoch};
use crate::domain::promotion::{self, Stage};
use crate::domain::template;
use crate::events::command::load;
use crate::events::{
    execute, execute_writes, CommandContext, CommandError, EventStore, Metadata, StreamWrite,
};
use crate::fault::crash_point;
use crate::streams::{
    build_stream, database_now, promotion_stream, template_stream, Build, Promotion, Template,
};
use crate::vmm::BlobStore;

const MAX_ROUNDS: u32 = 32;

fn rejected<E: std::fmt::Display>(e: E) -> CommandError<String> {
    CommandError::Rejected(e.to_string())
}

/// Decides `commands(now)` (a build command and a promotion command, at the database's clock)
/// on fresh state of the build and its `(build, epoch)` outbox, and appends both in one
/// transaction, deciding again on a version conflict. A refusal from either decision comes back
/// as `Rejected` with its message, for the caller to turn into its fencing error. Entering
/// Publishing (with the staged plan) and finishing (Ready with the outbox done) are both this.
pub(crate) async fn decide_build_and_promotion(
    store: &EventStore,
    ctx: &CommandContext,
    build: BuildId,
    epoch: Epoch,
    commands: impl Fn(chrono::DateTime<chrono::Utc>) -> (build::Command, promotion::Command),
) -> Result<usize, CommandError<String>> {
    let (bstream, pstream) = (build_stream(&build), promotion_stream(&build, epoch));
    let (bstream, pstream, commands) = (&bstream, &pstream, &commands);
    let outcome = execute_writes(store, MAX_ROUNDS, move || async move {
        let now = database_now(store.pool()).await.map_err(rejected)?;
        let (build_command, promotion_command) = commands(now);
        let b = load::<Build>(store, bstream).await.map_err(rejected)?;
        let b_events = build::decide(&b.state, &build_command).map_err(rejected)?;
        let p = load::<Promotion>(store, pstream).await.map_err(rejected)?;
        let p_events = promotion::decide(&p.state, &promotion_command).map_err(rejected)?;
        Ok(vec![
            StreamWrite::new(
                bstream.clone(),
                b.expected(),
                ctx.encode(bstream, &b_events)?,
            ),
            StreamWrite::new(
                pstream.clone(),
                p.expected(),
                ctx.encode(pstream, &p_events)?,
            ),
        ])
    })
    .await?;
    Ok(outcome.events.len())
}

/// Who drives, and where the layers are.
pub struct PromotionDriver<'a> {
    pub store: &'a EventStore,
    pub blobs: Arc<dyn BlobStore>,
    /// Recorded on every event the driver appends (worker or reconciler, node, epoch).
    pub metadata: Metadata,
}

/// What one drive did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Driven {
    /// The outbox stage found before driving.
    pub from: Stage,
    /// Events this drive appended (0 when everything was already done).
    pub appended: usize,
}

impl PromotionDriver<'_> {
    fn context(&self) -> CommandContext {
        CommandContext::new(self.metadata.clone()).with_max_attempts(MAX_ROUNDS)
    }

    fn fenced(build: BuildId, epoch: Epoch, reason: impl std::fmt::Display) -> WorkerError {
        WorkerError::Fenced {
            build,
            epoch,
            reason: reason.to_string(),
        }
    }

    /// Takes the promotion of `build` in `epoch` from its current stage to `done`, with the build
    /// Ready. A refusal by the build stream (another epoch, a terminal Error) is
    /// [`WorkerError::Fenced`]; a layer missing from the blob store (or torn) is [`WorkerError::Store`]
    /// and leaves the outbox where it was, to be retried.
    pub async fn drive(&self, build: BuildId, epoch: Epoch) -> Result<Driven, WorkerError> {
        let pstream = promotion_stream(&build, epoch);
        let loaded = load::<Promotion>(self.store, &pstream)
            .await
            .map_err(WorkerError::store)?;
        let from = loaded.state.stage;
        let Some(plan) = loaded.state.plan else {
            return Err(WorkerError::Corrupt {
                build,
                message: format!(
                    "no promotion is staged on {pstream}; Publishing and the staged plan are one append"
                ),
            });
        };
        let mut appended = 0;

        if from <= Stage::Staged {
            let layers = plan.layers.clone();
            let blobs = self.blobs.clone();
            let committed = tokio::task::spawn_blocking(move || {
                layers
                    .iter()
                    .filter(|d| matches!(blobs.intact_size(&base::to_vmm(d)), Ok(Some(_))))
                    .copied()
                    .collect::<Vec<_>>()
            })
            .await
            .map_err(|e| WorkerError::Store(format!("layer check task: {e}")))?;
            let now = database_now(self.store.pool()).await?;
            match execute::<Promotion>(
                self.store,
                &pstream,
                &promotion::Command::CommitLayers { committed, now },
                &self.context(),
            )
            .await
            {
                Ok(done) => appended += done.events.len(),
                Err(CommandError::Rejected(e)) => {
                    return Err(WorkerError::Store(format!(
                        "promotion of build {build} (epoch {epoch}) cannot commit its layers: {e}; \
                         it stays staged and is retried (is this node's blob store the one the build wrote to?)"
                    )))
                }
                Err(e) => return Err(WorkerError::store(e)),
            }
            crash_point("promotion:after-layers-committed");
        }

        if from <= Stage::LayersCommitted {
            appended += self.make_visible(build, epoch, &plan).await?;
            crash_point("promotion:after-visible");
        }

        appended += self.finish(build, epoch).await?;
        Ok(Driven { from, appended })
    }

    /// The build's `MarkReady` and the outbox's `done`, in one append: there is no moment where
    /// the build is Ready and its outbox is not done, so nothing needs to find and finish those.
    async fn finish(&self, build: BuildId, epoch: Epoch) -> Result<usize, WorkerError> {
        decide_build_and_promotion(self.store, &self.context(), build, epoch, |now| {
            (
                build::Command::MarkReady { epoch, now },
                promotion::Command::Finish { now },
            )
        })
        .await
        .map_err(|e| match e {
            CommandError::Rejected(reason) => Self::fenced(build, epoch, reason),
            e => WorkerError::store(e),
        })
    }

    /// `visible` on the outbox and the tags on the template, in one append guarded by the build
    /// still publishing (or ready) in this epoch.
    async fn make_visible(
        &self,
        build: BuildId,
        epoch: Epoch,
        plan: &promotion::PromotionPlan,
    ) -> Result<usize, WorkerError> {
        let ctx = self.context();
        let (pstream, tstream, bstream) = (
            promotion_stream(&build, epoch),
            template_stream(&plan.template),
            build_stream(&build),
        );
        let outcome = execute_writes(self.store, MAX_ROUNDS, || {
            let (store, ctx, plan) = (self.store.clone(), ctx.clone(), plan.clone());
            let (pstream, tstream, bstream) = (pstream.clone(), tstream.clone(), bstream.clone());
            async move {
                let now = database_now(store.pool()).await.map_err(rejected)?;
                let b = load::<Build>(&store, &bstream).await.map_err(rejected)?;
                match &b.state.phase {
                    Phase::Publishing { epoch: e, .. } | Phase::Ready { epoch: e }
                        if *e == epoch => {}
                    other => {
                        return Err(CommandError::Rejected(format!(
                            "the build is not publishing in epoch {epoch} ({other:?})"
                        )))
                    }
                }
                let p = load::<Promotion>(&store, &pstream)
                    .await
                    .map_err(rejected)?;
                let p_events =
                    promotion::decide(&p.state, &promotion::Command::MakeVisible { now })
                        .map_err(rejected)?;
                if p_events.is_empty() {
                    // Already visible: a guard alone, so the append is valid and writes nothing.
                    return Ok(vec![StreamWrite::guard(pstream.clone(), p.expected())]);
                }
                let t = load::<Template>(&store, &tstream).await.map_err(rejected)?;
                let t_events = template::decide(
                    &t.state,
                    &template::Command::PromoteBuild {
                        build: plan.build,
                        tags: plan.tags.clone(),
                        now,
                    },
                )
                .map_err(rejected)?;
                Ok(vec![
                    StreamWrite::guard(bstream.clone(), b.expected()),
                    StreamWrite::new(
                        pstream.clone(),
                        p.expected(),
                        ctx.encode(&pstream, &p_events)?,
                    ),
                    StreamWrite::new(
                        tstream.clone(),
                        t.expected(),
                        ctx.encode(&tstream, &t_events)?,
                    ),
                ])
            }
        })
        .await;
        match outcome {
            Ok(outcome) => Ok(outcome.events.len()),
            Err(CommandError::Rejected(reason)) => Err(Self::fenced(build, epoch, reason)),
            Err(e) => Err(WorkerError::store(e)),
        }
    }
}
