//! Records an attempt's cache keys and lookup verdict on the build stream
//! ([`crate::domain::build::CacheConsultation`]), so `strata why` can say which key part changed
//! between two builds without re-resolving anything.

use super::attempt::Attempt;
use super::base::ResolvedBase;
use super::cache::{Found, Plan};
use super::error::WorkerError;
use crate::domain::build::{CacheConsultation, CacheFound};

/// What the lookup let the build do, as recorded.
pub fn found_of(found: &Found) -> CacheFound {
    match found {
        Found::Final { .. } => CacheFound::Final,
        Found::Checkpoint { step, .. } => CacheFound::Checkpoint { step: *step as u32 },
        Found::Nothing => CacheFound::Nothing,
    }
}

/// Appends `CacheConsulted` for this attempt. A rejection is fencing: the caller stops.
pub async fn record(
    attempt: &Attempt,
    plan: &Plan,
    resolved: &ResolvedBase,
    found: CacheFound,
) -> Result<(), WorkerError> {
    crate::metrics::cache_lookup(&found);
    attempt
        .record_cache_consultation(CacheConsultation {
            base_image_digest: resolved.image_digest,
            base_key: plan.chain.base,
            step_keys: plan.chain.steps.clone(),
            final_key: plan.chain.final_key,
            force_from: plan.force_from.map(|s| s as u32),
            found,
        })
        .await
}
