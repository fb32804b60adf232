//! Publishing a build: entering Publishing with the staged promotion ([`begin_publishing`]),
//! then driving that promotion to the end, from wherever it stands ([`PromotionDriver`]): the
//! one implementation the worker (right after entering Publishing) and the promotion reconciler
//! (after the worker's lease lapsed mid-promotion) both run.
//!
//! Rules and events: `domain/promotion.rs` (the outbox: `Stage`, `CommitLayers`, `MakeVisible`,
//! `Finish`, `Abandon`), the build's `BeginPublishing`/`MarkReady` and the template's
//! `PromoteBuild` (`TagsAssigned`); read models: `builds` and `templates` (inline).
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
//! promotion of another epoch is another stream, refused by the build's epoch check. The one
//! exit that is not Ready: the template was deleted before the flip to visible, so the template
//! refuses the tags; then the outbox is abandoned and the build ends in `error` saying so, in one
//! append ([`build::end_for_deleted_template`]).
//!
//! Errors are typed ([`PromoteError`]): the build refusing this epoch is fencing; a failed clock read
//! or load is the store's, which the reconciler counts as a failed pass and the worker retries.

use std::sync::Arc;

use super::Refusal;
use crate::domain::build::{self, BuildResult};
use crate::domain::ids::{BuildId, Digest, Epoch, TemplateId};
use crate::domain::object::{self, Lifecycle};
use crate::domain::promotion::{self, PromotionPlan, Stage};
use crate::domain::template;
use crate::events::command::load;
use crate::events::{
    execute, execute_writes, CommandContext, CommandError, EventStore, Metadata, ReadError,
    StreamWrite,
};
use crate::events::{Aggregate, StreamId};
use crate::fault::crash_point;
use crate::streams::{
    build_stream, database_now, object_stream, promotion_stream, template_stream, Build, Object,
    Promotion, Template,
};
use crate::vmm::BlobStore;

const MAX_ROUNDS: u32 = 32;

/// What can stop a promotion. Policy (see [`crate::app`]): the build refusing this epoch is
/// [`PromoteError::Fenced`], another stream refusing is a broken invariant
/// ([`PromoteError::Corrupt`]), and the store's failures are [`PromoteError::is_unavailable`]
/// (retry) or [`PromoteError::Store`] (log, retry at the next pass).
#[derive(Debug, thiserror::Error)]
pub enum PromoteError {
    #[error(
        "attempt {epoch} of build {build} is closed ({reason}); stopping without further writes"
    )]
    Fenced {
        build: BuildId,
        epoch: Epoch,
        reason: build::Error,
    },
    #[error("build {build}: {message}")]
    Corrupt { build: BuildId, message: String },
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Read(ReadError),
    /// The event store could not be reached or was overloaded: retryable.
    #[error("event store unavailable: {0}")]
    Unavailable(String),
    #[error("event store: {0}")]
    Store(String),
}

impl PromoteError {
    /// A store failure that is not the domain refusing the command.
    fn store<E: std::fmt::Display>(err: CommandError<E>) -> PromoteError {
        match err {
            CommandError::Read(e @ ReadError::Database(_)) => PromoteError::Read(e),
            e if e.is_unavailable() => PromoteError::Unavailable(e.to_string()),
            e => PromoteError::Store(e.to_string()),
        }
    }

    /// The build refusing the epoch is fencing; another stream refusing is a broken invariant
    /// of this build; everything else is the store's.
    fn from_command(build: BuildId, epoch: Epoch, err: CommandError<Refusal>) -> PromoteError {
        match err {
            CommandError::Rejected(Refusal::Build(reason)) => PromoteError::Fenced {
                build,
                epoch,
                reason,
            },
            CommandError::Rejected(other) => PromoteError::Corrupt {
                build,
                message: format!("attempt {epoch}: {other}"),
            },
            e => PromoteError::store(e),
        }
    }

    /// The database or event store could not be reached (or was overloaded).
    pub fn is_unavailable(&self) -> bool {
        match self {
            PromoteError::Database(e) => !matches!(e, sqlx::Error::RowNotFound),
            PromoteError::Read(ReadError::Database(_)) | PromoteError::Unavailable(_) => true,
            _ => false,
        }
    }
}

/// The irreversible commit: Publishing on the build (with its `result`) and the staged `plan`
/// on the `(build, epoch)` outbox, in one append. Returns the events appended.
pub async fn begin_publishing(
    store: &EventStore,
    ctx: &CommandContext,
    result: &BuildResult,
    plan: &PromotionPlan,
) -> Result<usize, CommandError<Refusal>> {
    let epoch = plan.epoch;
    decide_build_and_promotion(store, ctx, plan.build, epoch, |now| {
        (
            build::Command::BeginPublishing {
                epoch,
                result: result.clone(),
                now,
            },
            promotion::Command::Stage {
                plan: plan.clone(),
                now,
            },
        )
    })
    .await
}

fn refused<E: Into<Refusal>>(e: E) -> CommandError<Refusal> {
    CommandError::Rejected(e.into())
}

/// Decides `commands(now)` (a build command and a promotion command, at the database's clock)
/// on fresh state of the build and its `(build, epoch)` outbox, and appends both in one
/// transaction, deciding again on a version conflict. A refusal from either decision comes back
/// as `Rejected` with the domain's error ([`PromoteError::from_command`] makes the build's
/// refusal fencing); a store failure stays a store error. Entering
/// Publishing (with the staged plan) and finishing (Ready with the outbox done) are both this.
async fn decide_build_and_promotion(
    store: &EventStore,
    ctx: &CommandContext,
    build: BuildId,
    epoch: Epoch,
    commands: impl Fn(chrono::DateTime<chrono::Utc>) -> (build::Command, promotion::Command),
) -> Result<usize, CommandError<Refusal>> {
    let (bstream, pstream) = (build_stream(&build), promotion_stream(&build, epoch));
    let (bstream, pstream, commands) = (&bstream, &pstream, &commands);
    let outcome = execute_writes(store, MAX_ROUNDS, move || async move {
        let now = database_now(store.pool()).await?;
        let (build_command, promotion_command) = commands(now);
        let b = load::<Build>(store, bstream)
            .await
            .map_err(CommandError::into_other)?;
        let b_events = build::decide(&b.state, &build_command).map_err(refused)?;
        let p = load::<Promotion>(store, pstream)
            .await
            .map_err(CommandError::into_other)?;
        let p_events = promotion::decide(&p.state, &promotion_command).map_err(refused)?;
        Ok(vec![
            ctx.write(bstream, b.expected(), &b_events)?,
            ctx.write(pstream, p.expected(), &p_events)?,
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Driven {
    /// The outbox stage found before driving.
    pub from: Stage,
    /// Events this drive appended (0 when everything was already done).
    pub appended: usize,
    pub ending: Ending,
}

/// Where a driven promotion ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// Visible, done, and the build Ready.
    Ready,
    /// The template was deleted before the flip: the outbox is abandoned and the build is in
    /// `error` with a reason that says so.
    TemplateDeleted { template: TemplateId },
    /// A layer of the result was deleted by garbage collection before the layers were
    /// committed: the outbox is abandoned and the build is in `error` (`PromotionFailed`) with a
    /// reason that names the layer.
    LayerDeleted { layer: Digest },
}

impl PromotionDriver<'_> {
    fn context(&self) -> CommandContext {
        CommandContext::new(self.metadata.clone()).with_max_attempts(MAX_ROUNDS)
    }

    /// Takes the promotion of `build` in `epoch` from its current stage to `done`, with the build
    /// Ready, or to abandoned with the build in `error` when its template was deleted first. A
    /// refusal by the build stream (another epoch, a terminal Error) is [`PromoteError::Fenced`];
    /// a layer missing from the blob store (or torn) is [`PromoteError::Store`] and leaves the
    /// outbox where it was, to be retried; a store that cannot be reached is
    /// [`PromoteError::is_unavailable`].
    pub async fn drive(&self, build: BuildId, epoch: Epoch) -> Result<Driven, PromoteError> {
        let pstream = promotion_stream(&build, epoch);
        let loaded = load::<Promotion>(self.store, &pstream)
            .await
            .map_err(PromoteError::store)?;
        let from = loaded.state.stage;
        if loaded.state.abandoned {
            let template = loaded.state.plan.map(|p| p.template);
            return match template {
                Some(template) => Ok(Driven {
                    from,
                    appended: 0,
                    ending: Ending::TemplateDeleted { template },
                }),
                None => Err(PromoteError::Corrupt {
                    build,
                    message: format!("{pstream} is abandoned but was never staged"),
                }),
            };
        }
        let Some(plan) = loaded.state.plan else {
            return Err(PromoteError::Corrupt {
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
                    .filter(|d| matches!(blobs.intact_size(d), Ok(Some(_))))
                    .copied()
                    .collect::<Vec<_>>()
            })
            .await
            .map_err(|e| PromoteError::Store(format!("layer check task: {e}")))?;
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
                    if let Some(layer) = self.deleted_layer(&plan).await? {
                        appended += self.fail_for_deleted_layer(build, epoch, layer).await?;
                        return Ok(Driven {
                            from,
                            appended,
                            ending: Ending::LayerDeleted { layer },
                        });
                    }
                    return Err(PromoteError::Store(format!(
                        "promotion of build {build} (epoch {epoch}) cannot commit its layers: {e}; \
                         it stays staged and is retried (is this node's blob store the one the build wrote to?)"
                    )));
                }
                Err(e) => return Err(PromoteError::store(e)),
            }
            crash_point("promotion:after-layers-committed");
        }

        if from <= Stage::LayersCommitted {
            crate::fault::stop_point("promotion:before-visible");
            match self.make_visible(build, epoch, &plan).await? {
                Visibility::Visible(n) => appended += n,
                Visibility::TemplateDeleted => {
                    appended += self.abandon(build, epoch, &plan.template).await?;
                    return Ok(Driven {
                        from,
                        appended,
                        ending: Ending::TemplateDeleted {
                            template: plan.template,
                        },
                    });
                }
            }
            crash_point("promotion:after-visible");
        }

        appended += self.finish(build, epoch).await?;
        Ok(Driven {
            from,
            appended,
            ending: Ending::Ready,
        })
    }

    /// The outbox abandoned and the build in `error` (template deleted), in one append guarded
    /// by the template stream at the version that says deleted.
    async fn abandon(
        &self,
        build: BuildId,
        epoch: Epoch,
        template: &TemplateId,
    ) -> Result<usize, PromoteError> {
        let appended = self
            .end_and_abandon::<Template>(build, epoch, template_stream(template), |t, b, now| {
                build::end_for_deleted_template(b, t, now).map_err(refused)
            })
            .await?;
        tracing::info!(%build, %epoch, %template, "the template was deleted before the build was published; the build ended in error");
        Ok(appended)
    }

    /// The build's events `end` decides (from the state of `guard`'s stream and the build's)
    /// and the outbox's `Abandon`, in one append guarded by `guard` at the version read: a
    /// change of that stream meanwhile makes the whole decision again.
    async fn end_and_abandon<G: Aggregate>(
        &self,
        build: BuildId,
        epoch: Epoch,
        guard: StreamId,
        end: impl Fn(
            &G::State,
            &build::State,
            chrono::DateTime<chrono::Utc>,
        ) -> Result<Vec<build::Event>, CommandError<Refusal>>,
    ) -> Result<usize, PromoteError>
    where
        G::Error: Into<Refusal>,
    {
        let ctx = self.context();
        let (pstream, bstream) = (promotion_stream(&build, epoch), build_stream(&build));
        let (store, ctx, pstream, gstream, bstream, end) =
            (self.store, &ctx, &pstream, &guard, &bstream, &end);
        let outcome = execute_writes(store, MAX_ROUNDS, move || async move {
            let now = database_now(store.pool()).await?;
            let g = load::<G>(store, gstream)
                .await
                .map_err(CommandError::into_other)?;
            let b = load::<Build>(store, bstream)
                .await
                .map_err(CommandError::into_other)?;
            let b_events = end(&g.state, &b.state, now)?;
            let p = load::<Promotion>(store, pstream)
                .await
                .map_err(CommandError::into_other)?;
            let p_events = promotion::decide(&p.state, &promotion::Command::Abandon { now })
                .map_err(refused)?;
            Ok(vec![
                StreamWrite::guard(gstream.clone(), g.expected()),
                ctx.write(bstream, b.expected(), &b_events)?,
                ctx.write(pstream, p.expected(), &p_events)?,
            ])
        })
        .await
        .map_err(|e| PromoteError::from_command(build, epoch, e))?;
        Ok(outcome.events.len())
    }

    /// A layer of `plan` that garbage collection deleted (its object `Deleted`), whose bytes
    /// the layer check just found missing: an authoritative absence, which no retry repairs. A
    /// layer missing from this blob store but Live is not one (this may be the wrong store, or
    /// a node may still store it again), and its promotion is retried.
    async fn deleted_layer(&self, plan: &PromotionPlan) -> Result<Option<Digest>, PromoteError> {
        for layer in &plan.layers {
            let object = load::<Object>(self.store, &object_stream(layer))
                .await
                .map_err(PromoteError::store)?;
            if object.state.lifecycle != Lifecycle::Deleted {
                continue;
            }
            let (blobs, digest) = (self.blobs.clone(), *layer);
            let intact = tokio::task::spawn_blocking(move || blobs.intact_size(&digest))
                .await
                .map_err(|e| PromoteError::Store(format!("layer check task: {e}")))?;
            if matches!(intact, Ok(None)) {
                return Ok(Some(*layer));
            }
        }
        Ok(None)
    }

    /// The build in `error` (`PromotionFailed`, naming `layer`) and the outbox abandoned, in one
    /// append guarded by the layer's object stream at the version that says `Deleted` (a node
    /// storing it again meanwhile makes this decide again, and the promotion go on).
    async fn fail_for_deleted_layer(
        &self,
        build: BuildId,
        epoch: Epoch,
        layer: Digest,
    ) -> Result<usize, PromoteError> {
        let appended = self
            .end_and_abandon::<Object>(build, epoch, object_stream(&layer), |o, b, now| {
                if o.lifecycle != Lifecycle::Deleted {
                    return Err(CommandError::Rejected(Refusal::Object(
                        object::Error::NotLive {
                            lifecycle: o.lifecycle,
                        },
                    )));
                }
                let pass = o
                    .deletion
                    .as_ref()
                    .map(|d| format!(" (pass {}, {})", d.pass, d.reason))
                    .unwrap_or_default();
                let message = format!(
                    "layer {layer} of the result was deleted by garbage collection{pass} before the build was published; the result cannot be promoted, build again"
                );
                build::decide(
                    b,
                    &build::Command::FailBuild {
                        epoch,
                        message,
                        step: None,
                        now,
                    },
                )
                .map_err(refused)
            })
            .await?;
        tracing::warn!(%build, %epoch, %layer, "a layer of the result was deleted before the build was published; the build ended in error");
        Ok(appended)
    }

    /// The build's `MarkReady` and the outbox's `done`, in one append: there is no moment where
    /// the build is Ready and its outbox is not done, so nothing needs to find and finish those.
    async fn finish(&self, build: BuildId, epoch: Epoch) -> Result<usize, PromoteError> {
        decide_build_and_promotion(self.store, &self.context(), build, epoch, |now| {
            (
                build::Command::MarkReady { epoch, now },
                promotion::Command::Finish { now },
            )
        })
        .await
        .map_err(|e| PromoteError::from_command(build, epoch, e))
    }

    /// `visible` on the outbox and the tags on the template, in one append guarded by the build
    /// still publishing (or ready) in this epoch. [`Visibility::TemplateDeleted`] when the
    /// template refuses the tags because it was deleted: nothing is written then.
    async fn make_visible(
        &self,
        build: BuildId,
        epoch: Epoch,
        plan: &promotion::PromotionPlan,
    ) -> Result<Visibility, PromoteError> {
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
                let now = database_now(store.pool()).await?;
                let b = load::<Build>(&store, &bstream)
                    .await
                    .map_err(CommandError::into_other)?;
                build::check_publishing(&b.state, epoch).map_err(refused)?;
                let p = load::<Promotion>(&store, &pstream)
                    .await
                    .map_err(CommandError::into_other)?;
                let p_events =
                    promotion::decide(&p.state, &promotion::Command::MakeVisible { now })
                        .map_err(refused)?;
                if p_events.is_empty() {
                    // Already visible: a guard alone, so the append is valid and writes nothing.
                    return Ok(vec![StreamWrite::guard(pstream.clone(), p.expected())]);
                }
                let t = load::<Template>(&store, &tstream)
                    .await
                    .map_err(CommandError::into_other)?;
                let t_events = template::decide(
                    &t.state,
                    &template::Command::PromoteBuild {
                        build: plan.build,
                        tags: plan.tags.clone(),
                        now,
                    },
                )
                .map_err(refused)?;
                Ok(vec![
                    StreamWrite::guard(bstream.clone(), b.expected()),
                    ctx.write(&pstream, p.expected(), &p_events)?,
                    ctx.write(&tstream, t.expected(), &t_events)?,
                ])
            }
        })
        .await;
        match outcome {
            Ok(outcome) => Ok(Visibility::Visible(outcome.events.len())),
            Err(CommandError::Rejected(Refusal::Template(template::Error::Deleted))) => {
                Ok(Visibility::TemplateDeleted)
            }
            Err(e) => Err(PromoteError::from_command(build, epoch, e)),
        }
    }
}

/// What the flip to visible found.
enum Visibility {
    /// Visible now (this many events appended; 0 when it already was).
    Visible(usize),
    /// The template was deleted: the promotion can never become visible.
    TemplateDeleted,
}
