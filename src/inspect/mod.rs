//! Read-only operator queries: answers derived from the event store, `build_logs` and the read
//! models, shared by the CLI (`strata why`) and the operator page (`/ui`). Nothing here writes.
//!
//! * [`facts`]: one build's decoded events and logs, and its earlier siblings.
//! * [`why`]: why a build failed and why each step was or was not a cache hit.
//! * [`timeline`]: one build's phases, attempts, steps and reconciler actions, for `/ui`.

pub mod facts;
pub mod timeline;
pub mod why;

use crate::domain::ids::BuildId;
use crate::events::EventStore;

/// How many earlier builds of the template `why` considers for the comparison.
pub const EARLIER_BUILDS: i64 = 20;

/// Loads `build` and its earlier siblings and answers `why`.
pub async fn why_build(store: &EventStore, build: BuildId) -> Result<why::Why, facts::FactsError> {
    let target = facts::load(store, build).await?;
    let earlier = facts::earlier_builds(store, &target, EARLIER_BUILDS).await?;
    Ok(why::why(&target, &earlier))
}
