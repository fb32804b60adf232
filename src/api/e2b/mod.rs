//! The E2B template-build protocol, as the stock SDK speaks it (PROTOCOL.md).
//!
//! Layout: [`auth`] (API key -> team); one file per call the SDK makes during a build, in call
//! order: [`register`] (`POST /v3/templates`), [`files_link`] (`GET /templates/{id}/files/{hash}`),
//! [`upload`] (`PUT /upload/...`), [`start`] (`POST /v2/templates/{id}/builds/{bid}`),
//! [`status`] (`GET .../status`); then the other template calls: [`templates`] (get, list,
//! delete, aliases) and [`tags`].
//!
//! Every handler loads the authoritative streams, calls the domain's `decide`, and appends with
//! compare-and-set; the helpers below map the outcome to the SDK's error shape.

pub mod auth;
pub mod files_link;
pub mod register;
pub mod sandboxes;
pub mod start;
pub mod status;
pub mod tags;
pub mod templates;
pub mod upload;

use axum::routing::{delete, get, post, put};
use axum::Router;

use crate::api::error::ApiError;
use crate::api::AppState;
use crate::domain::ids::{TeamId, TemplateId};
use crate::domain::template;
use crate::events::command::{load, Loaded};
use crate::events::{Actor, ActorRole, CommandError, Metadata};
use crate::streams::{template_stream, Template};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v3/templates", post(register::register_build))
        .route(
            "/templates/{template_id}/files/{hash}",
            get(files_link::upload_link),
        )
        .route("/upload/{*rest}", put(upload::upload_context))
        .route(
            "/v2/templates/{template_id}/builds/{build_id}",
            post(start::start_build),
        )
        .route(
            "/templates/{template_id}/builds/{build_id}/status",
            get(status::build_status),
        )
        .route("/templates", get(templates::list_templates))
        .route(
            "/templates/{template_id}",
            get(templates::get_template).delete(templates::delete_template),
        )
        .route("/templates/aliases/{alias}", get(templates::alias_exists))
        .route(
            "/templates/tags",
            post(tags::assign_tags).delete(tags::remove_tags),
        )
        .route("/templates/{template_id}/tags", get(tags::list_tags))
        .route(
            "/v2/sandboxes",
            post(sandboxes::create).get(sandboxes::list),
        )
        .route("/sandboxes", post(sandboxes::create).get(sandboxes::list))
        .route(
            "/sandboxes/{sandbox_id}",
            get(sandboxes::info).delete(sandboxes::kill),
        )
        .route(
            "/sandboxes/{sandbox_id}/timeout",
            post(sandboxes::set_timeout),
        )
        .route("/sandboxes/{sandbox_id}/pause", post(sandboxes::pause))
        .route("/sandboxes/{sandbox_id}/metrics", get(sandboxes::metrics))
        .route(
            "/v2/sandboxes/{sandbox_id}/connect",
            post(sandboxes::connect),
        )
        .route("/sandboxes/{sandbox_id}/connect", post(sandboxes::connect))
        .route("/sandboxes/{sandbox_id}/resume", post(sandboxes::connect))
        .route(
            "/templates/{template_id}/tags/{tag}",
            delete(tags::remove_one_tag),
        )
}

/// Metadata of events the API appends.
pub(crate) fn api_metadata(state: &AppState) -> Metadata {
    Metadata::new(Actor::new(ActorRole::Api, state.node_id.clone()))
}

/// Maps a failed command: the domain's refusal through `rejected`, contention to 409 with a
/// retry hint, the rest to 500/503.
pub(crate) fn command_error<E>(
    err: CommandError<E>,
    rejected: impl FnOnce(E) -> ApiError,
) -> ApiError
where
    E: std::fmt::Display,
{
    match err {
        CommandError::Rejected(e) => rejected(e),
        CommandError::Contended { stream, .. } => ApiError::conflict(format!(
            "{stream} is being changed concurrently; retry the request"
        )),
        CommandError::Read(crate::events::ReadError::Database(db)) => ApiError::from(db),
        CommandError::Append(crate::events::AppendError::Refused(limit)) => {
            ApiError::too_many_requests(limit.0)
        }
        other => ApiError::internal("event store", &other),
    }
}

/// Parses a template id from a path, as 404 when it cannot exist.
pub(crate) fn parse_template_id(raw: &str) -> Result<TemplateId, ApiError> {
    TemplateId::parse(raw).map_err(|_| ApiError::not_found(format!("template {raw:?} not found")))
}

/// Checks that `template_id` is a live template of `team`, from the `templates` read model (a
/// standing inline projection, so exact) instead of folding the template stream, which grows
/// with every build. Another team's template is reported exactly like a missing one.
pub(crate) async fn check_team_template(
    state: &AppState,
    team: &TeamId,
    template_id: &TemplateId,
) -> Result<(), ApiError> {
    if crate::projections::templates::is_live_template_of(&state.pool, team, template_id).await? {
        Ok(())
    } else {
        Err(ApiError::not_found(format!(
            "template {template_id} not found for this team"
        )))
    }
}

/// Loads a template of `team`, for calls that need its state (names, tags). Another team's template is reported exactly like a missing one.
pub(crate) async fn load_team_template(
    state: &AppState,
    team: &TeamId,
    template_id: &TemplateId,
) -> Result<Loaded<template::State>, ApiError> {
    let loaded = load::<Template>(&state.events, &template_stream(template_id))
        .await
        .map_err(|e| command_error(e, |e: template::Error| ApiError::internal("template", &e)))?;
    match &loaded.state.team {
        Some(owner) if owner == team && !loaded.state.deleted => Ok(loaded),
        _ => Err(ApiError::not_found(format!(
            "template {template_id} not found for this team"
        ))),
    }
}
