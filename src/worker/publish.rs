//! Publishing a finished build: the result snapshot, the irreversible commit (`Publishing`), the
//! promotion outbox, and Ready.
//!
//! 1. The result (and, after finalization, the pre-finalization stack for `fromTemplate`) is
//!    recorded on fresh `snapshot-{id}` streams, each append guarded by the open attempt.
//! 2. One append: the build enters Publishing with that result and the promotion intent is
//!    staged on `promotion-{build}:{epoch}` (the plan: layers, template, tags).
//! 3. [`PromotionDriver::drive`] takes the outbox from there to `done` (layers committed,
//!    visible with the template's tags, build Ready, done): the same function the promotion
//!    reconciler runs when this node dies mid-way.
//!
//! Until step 2 commits, a lost lease fences every write. From step 2 on, the build converges
//! forward: each step is idempotent, so the promotion reconciler can finish what a dead node
//! started. Every step is retried within the lease while the store is unavailable; a template
//! deleted before step 3's flip ends the build in `error` instead of Ready.

use std::sync::Arc;

use super::attempt::Attempt;
use super::build_log::BuildLog;
use super::error::WorkerError;
use super::executor::BuildOutput;
use crate::app::publish::{Ending, PromotionDriver};
use crate::app::CommandContext;
use crate::domain::build::BuildResult;
use crate::domain::build_spec::Tag;
use crate::domain::ids::{self, SnapshotId, TemplateId};
use crate::domain::promotion::PromotionPlan;
use crate::domain::snapshot::{Purpose, SnapshotRecord};
use crate::vmm::BlobStore;

/// What a published build is: its result snapshot, and the pre-finalization stack recorded for
/// `fromTemplate` builds, as the build's `BeginPublishing` recorded them.
#[derive(Debug, Clone, Copy)]
pub struct Published {
    pub snapshot: SnapshotId,
    pub build_base_checkpoint: Option<SnapshotId>,
}

/// Takes a built result to Ready.
pub async fn publish(
    attempt: &Attempt,
    backend: &dyn crate::vmm::SandboxBackend,
    blobs: Arc<dyn BlobStore>,
    template: &TemplateId,
    tags: &[Tag],
    output: &BuildOutput,
    log: &BuildLog,
) -> Result<Published, WorkerError> {
    let record = |purpose, layers: &[ids::Digest]| SnapshotRecord {
        purpose,
        layers: layers.to_vec(),
        base_image_digest: output.base_image_digest,
        context: output.context.clone(),
        start_cmd: output.start_cmd.clone(),
        ready_cmd: output.ready_cmd.clone(),
        build: attempt.build,
        epoch: attempt.epoch,
    };
    let candidate = SnapshotId::from_uuid(uuid::Uuid::now_v7());
    let candidate_record = record(Purpose::Template, &output.layers);
    super::layer_hold::record_recreating(
        attempt,
        backend,
        candidate,
        &candidate_record,
        None,
        None,
    )
    .await?;
    let build_base = match &output.build_base_layers {
        Some(layers) => {
            let id = SnapshotId::from_uuid(uuid::Uuid::now_v7());
            let base_record = record(Purpose::BuildCache, layers);
            super::layer_hold::record_recreating(attempt, backend, id, &base_record, None, None)
                .await?;
            Some(id)
        }
        None => None,
    };
    let plan = PromotionPlan {
        build: attempt.build,
        epoch: attempt.epoch,
        template: template.clone(),
        source: candidate,
        target: candidate,
        build_base_checkpoint: build_base,
        layers: output.layers.clone(),
        tags: tags.to_vec(),
    };
    crate::fault::stop_point("worker:before-publishing");
    // One command id across the retries: a try whose reply was lost is recognised.
    let ctx = attempt.context();
    attempt
        .retrying("entering publishing", || {
            begin_publishing(attempt, &ctx, &plan)
        })
        .await?;
    crate::fault::crash_point("worker:after-publishing");
    log.info(None, "Template created");
    log.flush().await;
    let driver = PromotionDriver {
        store: &attempt.store,
        blobs,
        metadata: attempt.metadata(),
    };
    let driven = attempt
        .retrying("promoting", || async {
            Ok(driver.drive(attempt.build, attempt.epoch).await?)
        })
        .await?;
    match driven.ending {
        Ending::Ready => Ok(Published {
            snapshot: candidate,
            build_base_checkpoint: build_base,
        }),
        Ending::TemplateDeleted { template } => Err(WorkerError::TemplateDeleted {
            build: attempt.build,
            template,
        }),
        Ending::LayerDeleted { layer } => Err(WorkerError::LayerDeleted {
            build: attempt.build,
            layer,
        }),
    }
}

/// The irreversible commit: Publishing on the build and the staged plan, in one append.
async fn begin_publishing(
    attempt: &Attempt,
    ctx: &CommandContext,
    plan: &PromotionPlan,
) -> Result<(), WorkerError> {
    let result = BuildResult {
        candidate: plan.source,
        build_base_checkpoint: plan.build_base_checkpoint,
    };
    crate::app::publish::begin_publishing(&attempt.store, ctx, &result, plan)
        .await
        .map(drop)
        .map_err(|e| WorkerError::from_command(attempt.build, attempt.epoch, e))
}
