//! The template stream's use cases: deleting a template, assigning and removing tags.
//!
//! Rules and events: `domain/template.rs` (`DeleteTemplate` → `TemplateDeleted`, `AssignTags`,
//! `RemoveTags`), the name claims' `NameReleased`; read model: `templates` (inline,
//! `projections/templates.rs`).
//!
//! What deleting a template does to its builds that are not yet publishing: they end in `error`
//! saying the template was deleted, in the same append as the deletion
//! ([`build::end_for_deleted_template`]). A waiting or queued build is never claimed afterwards,
//! and a running one is fenced: its node's next write or lease renewal is refused, so it stops and
//! destroys its sandbox. A publishing build is left to its promotion, which ends it the same way
//! when the template refuses its tags (ADR 0010).

use chrono::{DateTime, Utc};

use super::{CommandContext, Error};
use crate::domain::build;
use crate::domain::build_spec::Tag;
use crate::domain::ids::{BuildId, TeamId, TemplateId};
use crate::domain::template::{self, NameEvent};
use crate::events::command::{execute, execute_writes, load};
use crate::events::{CommandError, EventStore, StreamWrite};
use crate::streams::{
    build_stream, template_name_stream, template_stream, Build, Template, TemplateName,
};

/// Decide-and-append rounds before a contended deletion gives up.
const MAX_ROUNDS: u32 = 16;

/// Deletes `template_id` of `team`: the template rejects new builds, its names are released,
/// and its builds not yet publishing end in `error`, in one transaction. A template already
/// deleted is refused with [`template::Error::Deleted`].
pub async fn delete_template(
    store: &EventStore,
    ctx: &CommandContext,
    team: &TeamId,
    template_id: &TemplateId,
    now: DateTime<Utc>,
) -> Result<(), Error<template::Error>> {
    execute_writes(store, MAX_ROUNDS, move || async move {
        let t_stream = template_stream(template_id);
        let tpl = load::<Template>(store, &t_stream)
            .await
            .map_err(CommandError::into_other)?;
        let events = template::decide(&tpl.state, &template::Command::DeleteTemplate { now })
            .map_err(CommandError::Rejected)?;
        let mut writes = vec![ctx.write(&t_stream, tpl.expected(), &events)?];
        let deleted = events.iter().fold(tpl.state.clone(), template::evolve);
        writes.extend(end_builds(store, ctx, template_id, &deleted, now).await?);
        for name in &tpl.state.names {
            let n_stream = template_name_stream(team, name);
            let claim = load::<TemplateName>(store, &n_stream)
                .await
                .map_err(CommandError::into_other)?;
            let released = vec![NameEvent::NameReleased {
                template: template_id.clone(),
            }];
            writes.push(ctx.write(&n_stream, claim.expected(), &released)?);
        }
        Ok(writes)
    })
    .await
    .map(drop)
}

/// Points `tags` of the template at `build`.
pub async fn assign_tags(
    store: &EventStore,
    ctx: &CommandContext,
    template_id: &TemplateId,
    build: BuildId,
    tags: Vec<Tag>,
    now: DateTime<Utc>,
) -> Result<(), Error<template::Error>> {
    let command = template::Command::AssignTags { build, tags, now };
    execute::<Template>(store, &template_stream(template_id), &command, ctx)
        .await
        .map(drop)
}

/// Removes `tags` from the template.
pub async fn remove_tags(
    store: &EventStore,
    ctx: &CommandContext,
    template_id: &TemplateId,
    tags: Vec<Tag>,
    now: DateTime<Utc>,
) -> Result<(), Error<template::Error>> {
    let command = template::Command::RemoveTags { tags, now };
    execute::<Template>(store, &template_stream(template_id), &command, ctx)
        .await
        .map(drop)
}

/// The writes that end every waiting, queued or running build of `template_id`, given the
/// template's state with the deletion applied. The `builds` read model (maintained in every
/// append) lists the candidates; each is decided on its stream, appended at the version read, so
/// a build that moved meanwhile makes the whole deletion decide again. A build that reached
/// Publishing is not listed; nothing moves a build back out of Publishing or a terminal state.
async fn end_builds(
    store: &EventStore,
    ctx: &CommandContext,
    template_id: &TemplateId,
    deleted: &template::State,
    now: DateTime<Utc>,
) -> Result<Vec<StreamWrite>, CommandError<template::Error>> {
    let candidates =
        crate::projections::builds::unpublished_builds_of(store.pool(), template_id).await?;
    let mut writes = Vec::with_capacity(candidates.len());
    for build in candidates {
        let stream = build_stream(&build);
        let loaded = load::<Build>(store, &stream)
            .await
            .map_err(CommandError::into_other)?;
        match build::end_for_deleted_template(&loaded.state, deleted, now) {
            Ok(events) if events.is_empty() => {}
            Ok(events) => writes.push(ctx.write(&stream, loaded.expected(), &events)?),
            // Only a build of another template could be refused here (the read model names the
            // template), and then it is not this deletion's to end.
            Err(e) => {
                tracing::warn!(%build, template = %template_id, error = %e, "not ending a build listed for a deleted template")
            }
        }
    }
    Ok(writes)
}
