//! What deleting a template does to its builds that are not yet publishing: they end in `error`
//! saying the template was deleted, in the same append as the deletion
//! ([`build::end_for_deleted_template`]). A waiting or queued build is never claimed afterwards,
//! and a running one is fenced: its node's next write or lease renewal is refused, so it stops and
//! destroys its sandbox. A publishing build is left to its promotion, which ends it the same way
//! when the template refuses its tags (ADR 0010).

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::domain::build;
use crate::domain::ids::{BuildId, TemplateId};
use crate::domain::template;
use crate::events::command::{load, CommandContext};
use crate::events::{CommandError, EventStore, StreamWrite};
use crate::streams::{build_stream, Build};

/// The writes that end every waiting, queued or running build of `template_id`, given the
/// template's state with the deletion applied. The `builds` read model (maintained in every
/// append) lists the candidates; each is decided on its stream, appended at the version read, so
/// a build that moved meanwhile makes the whole deletion decide again. A build that reached
/// Publishing is not listed; nothing moves a build back out of Publishing or a terminal state.
pub(crate) async fn end_builds(
    store: &EventStore,
    ctx: &CommandContext,
    template_id: &TemplateId,
    deleted: &template::State,
    now: DateTime<Utc>,
) -> Result<Vec<StreamWrite>, CommandError<template::Error>> {
    let candidates: Vec<Uuid> = sqlx::query_scalar(
        "SELECT build_id FROM builds
         WHERE template_id = $1 AND phase IN ('waiting', 'queued', 'active')
         ORDER BY registered_at, build_id",
    )
    .bind(template_id.as_str())
    .fetch_all(store.pool())
    .await?;
    let mut writes = Vec::with_capacity(candidates.len());
    for id in candidates {
        let build = BuildId::from_uuid(id);
        let stream = build_stream(&build);
        let loaded = load::<Build>(store, &stream)
            .await
            .map_err(CommandError::into_other)?;
        match build::end_for_deleted_template(&loaded.state, deleted, now) {
            Ok(events) if events.is_empty() => {}
            Ok(events) => writes.push(StreamWrite::new(
                stream.clone(),
                loaded.expected(),
                ctx.encode(&stream, &events)?,
            )),
            // Only a build of another template could be refused here (the read model names the
            // template), and then it is not this deletion's to end.
            Err(e) => {
                tracing::warn!(%build, template = %template_id, error = %e, "not ending a build listed for a deleted template")
            }
        }
    }
    Ok(writes)
}
