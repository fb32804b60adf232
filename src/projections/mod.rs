//! Read models, fed inline (same transaction as the append, see
//! [`crate::events::InlineProjection`]) or asynchronously from the global feed.
//!
//! Layout:
//! * [`Projection`]: the contract of an async read model.
//! * [`ProjectionRunner`]: feed → batch → checkpoint, one transaction per batch, one runner at a
//!   time per projection (`FOR UPDATE SKIP LOCKED` on its checkpoint row); `rebuild` replays.
//! * [`stream_catalog`]: the operators' catalog of streams.
//! * [`builds`], [`templates`], [`api_keys`]: the inline read models, each with its typed reads;
//!   [`build_logs`]: the reads of the worker's log lines; [`team_usage`]: what a team holds,
//!   and the admission check that holds it to its limits; [`sandboxes`]: launched sandboxes
//!   and their running and paused spans (inline); [`gc_passes`]: what each GC pass measured
//!   (inline); [`stored_uploads`]: what each team's uploads take in the blob store (inline,
//!   for its stored-bytes limit); [`activity`]: all of these over time, in a fixed number of
//!   buckets.
//! * [`registry`] / [`run_all`]: the projections this version ships, and running them.

pub mod activity;
pub mod api_keys;
pub mod build_logs;
pub mod builds;
pub mod gc_passes;
mod projection;
mod runner;
pub mod sandboxes;
pub mod stored_uploads;
pub mod stream_catalog;
pub mod team_usage;
pub mod templates;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

pub use projection::{Projection, ProjectionError};
pub use runner::{status, ProjectionRunner, ProjectionStatus, RoundOutcome};

use crate::events::EventStore;

/// The events of `category` among `events`, decoded, each with the stream id's part after the
/// category (the aggregate's id). An event of that category that does not decode is an error:
/// a standing projection must never silently skip what it exists to follow.
pub(crate) fn events_of<'a, E: crate::events::DomainEvent>(
    events: &'a [crate::events::RecordedEvent],
    category: &'a str,
) -> impl Iterator<Item = Result<(&'a str, &'a crate::events::RecordedEvent, E), sqlx::Error>> + 'a
{
    events
        .iter()
        .filter(move |e| e.stream_id.category() == category)
        .map(move |recorded| {
            let id = &recorded.stream_id.as_str()[category.len() + 1..];
            let event = recorded
                .decode::<E>()
                .map_err(|err| sqlx::Error::Decode(Box::new(err)))?;
            Ok((id, recorded, event))
        })
}

/// Inline projections strata's event store applies to every append (wired in by
/// [`crate::app::event_store`]): read models that must be exact.
pub fn standing_inline() -> Vec<Arc<dyn crate::events::InlineProjection>> {
    vec![
        Arc::new(builds::BuildsProjection),
        Arc::new(api_keys::ApiKeysProjection),
        Arc::new(templates::TemplatesProjection),
        Arc::new(sandboxes::SandboxesProjection),
        Arc::new(gc_passes::GcPassesProjection),
        Arc::new(stored_uploads::StoredUploadsProjection),
    ]
}

/// Every async projection of this version.
pub fn registry() -> Vec<Arc<dyn Projection>> {
    vec![Arc::new(stream_catalog::StreamCatalog)]
}

/// The projection called `name`.
pub fn by_name(name: &str) -> Result<Arc<dyn Projection>, ProjectionError> {
    registry()
        .into_iter()
        .find(|p| p.name() == name)
        .ok_or_else(|| ProjectionError::Unknown(name.to_string()))
}

/// Empties the projection called `name` and replays the whole feed into it. Returns the number
/// of events this call replayed.
pub async fn rebuild(store: EventStore, name: &str) -> Result<usize, ProjectionError> {
    ProjectionRunner::new(store, by_name(name)?).rebuild().await
}

/// Runs every registered projection until `shutdown`. Safe to run in several processes: each
/// batch of each projection is applied by exactly one of them.
pub async fn run_all(store: EventStore, poll_interval: Duration, shutdown: CancellationToken) {
    let tasks: Vec<_> = registry()
        .into_iter()
        .map(|p| {
            let runner = ProjectionRunner::new(store.clone(), p);
            tokio::spawn(runner.run_until(poll_interval, shutdown.clone()))
        })
        .collect();
    for task in tasks {
        if let Err(err) = task.await {
            tracing::error!(error = %err, "projection task panicked");
        }
    }
}
