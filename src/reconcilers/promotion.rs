//! Promotion: a build in Publishing whose lease passed lost its node mid-promotion. Publishing is
//! the irreversible commit, so it is not failed: the promotion outbox is driven forward from
//! wherever the node left it, with the very function the worker runs
//! ([`PromotionDriver::drive`]), adopting the layers and records the node already wrote, and
//! ends with the build Ready, or in `error` when its template was deleted before the flip to
//! visible.

use super::{Pass, ReconcileEnv, ReconcileError};
use crate::app::publish::{Ending, PromoteError, PromotionDriver};
use crate::domain::build::Phase;
use crate::domain::ids::BuildId;
use crate::events::command::load;
use crate::projections::builds::Due;
use crate::streams::{build_stream, Build};

pub async fn pass(env: &ReconcileEnv) -> Result<Pass, ReconcileError> {
    Pass::over_due_builds(env, Due::LapsedPromotion, "promotion", |build| {
        finish(env, build)
    })
    .await
}

/// Drives the build's promotion to Ready if, on the stream, it is Publishing. `false` when there
/// was nothing left to do (another copy or the worker finished it).
pub async fn finish(env: &ReconcileEnv, build: BuildId) -> Result<bool, ReconcileError> {
    let loaded = load::<Build>(&env.store, &build_stream(&build))
        .await
        .map_err(ReconcileError::store)?;
    let Phase::Publishing { epoch, .. } = loaded.state.phase else {
        return Ok(false);
    };
    let driver = PromotionDriver {
        store: &env.store,
        blobs: env.blobs.clone(),
        metadata: env.metadata(build, Some(epoch.0)),
    };
    match driver.drive(build, epoch).await {
        Ok(driven) => {
            if driven.appended > 0 {
                match &driven.ending {
                    Ending::Ready => {
                        tracing::info!(%build, %epoch, from = ?driven.from, "promotion finished for a lost node")
                    }
                    Ending::TemplateDeleted { template } => {
                        tracing::info!(%build, %epoch, %template, "the template was deleted before the build was published; the build ended in error")
                    }
                    Ending::LayerDeleted { layer } => {
                        tracing::info!(%build, %epoch, %layer, "a layer of the result was deleted before the build was published; the build ended in error")
                    }
                }
            }
            Ok(driven.appended > 0)
        }
        // Only the build refusing this epoch is nothing to do; a store error fails the pass.
        Err(PromoteError::Fenced { reason, .. }) => {
            tracing::debug!(%build, %reason, "promotion not driven");
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}
