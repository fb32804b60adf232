//! Tags: names for builds of a template (`name:tag`). `POST /templates/tags` points tags at the
//! build a `name:tag` target names; `DELETE /templates/tags` removes them; `GET
//! /templates/{id}/tags` lists them.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{json, Value};

use super::auth::Team;
use super::templates::template_by_name;
use super::{
    api_metadata, check_team_template, command_error, load_team_template, parse_template_id,
};
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::app::template::assign_tags as assign;
use crate::app::CommandContext;
use crate::domain::build_spec::{parse_name_and_tag, Tag};
use crate::domain::ids::TemplateId;
use crate::domain::template::{self, Event};
use crate::streams::template_stream;

#[derive(Deserialize)]
struct AssignRequest {
    target: String,
    tags: Vec<String>,
}

#[derive(Deserialize)]
struct RemoveRequest {
    name: String,
    tags: Vec<String>,
}

fn parse_tags(raw: &[String]) -> Result<Vec<Tag>, ApiError> {
    if raw.is_empty() {
        return Err(ApiError::bad_request("tags must not be empty"));
    }
    raw.iter()
        .map(|t| Tag::parse(t).map_err(|e| ApiError::bad_request(e.to_string())))
        .collect()
}

async fn resolve(state: &AppState, team: &Team, name: &str) -> Result<TemplateId, ApiError> {
    template_by_name(state, &team.0, name)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("template {name:?} not found")))
}

fn tag_error(err: template::Error) -> ApiError {
    match err {
        template::Error::UnknownTag { .. } | template::Error::UnknownBuild { .. } => {
            ApiError::not_found(err.to_string())
        }
        other => ApiError::bad_request(other.to_string()),
    }
}

/// `POST /templates/tags` → 201 `{"buildID", "tags"}`.
pub async fn assign_tags(
    State(state): State<AppState>,
    team: Team,
    body: Bytes,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let request: AssignRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid tag request: {e}")))?;
    let tags = parse_tags(&request.tags)?;
    let (_, source_tag) =
        parse_name_and_tag(&request.target).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let source_tag = source_tag.unwrap_or_else(Tag::default_tag);
    let template_id = resolve(&state, &team, &request.target).await?;
    let loaded = load_team_template(&state, &team.0, &template_id).await?;
    let build = *loaded.state.tags.get(&source_tag).ok_or_else(|| {
        ApiError::not_found(format!(
            "{} has no build tagged {:?}",
            request.target,
            source_tag.as_str()
        ))
    })?;
    let ctx = CommandContext::new(api_metadata(&state));
    let now = crate::streams::database_now(&state.pool).await?;
    assign(&state.events, &ctx, &template_id, build, tags.clone(), now)
        .await
        .map_err(|e| command_error(e, tag_error))?;
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "buildID": build.to_string(),
            "tags": tags.iter().map(|t| t.as_str()).collect::<Vec<_>>(),
        })),
    ))
}

/// `DELETE /templates/tags` with `{"name", "tags"}` → 204.
pub async fn remove_tags(
    State(state): State<AppState>,
    team: Team,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let request: RemoveRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid tag request: {e}")))?;
    let tags = parse_tags(&request.tags)?;
    let template_id = resolve(&state, &team, &request.name).await?;
    remove(&state, &template_id, tags).await
}

/// `DELETE /templates/{templateID}/tags/{tag}` → 204.
pub async fn remove_one_tag(
    State(state): State<AppState>,
    team: Team,
    Path((template_id, tag)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let template_id = parse_template_id(&template_id)?;
    check_team_template(&state, &team.0, &template_id).await?;
    remove(&state, &template_id, parse_tags(&[tag])?).await
}

async fn remove(
    state: &AppState,
    template_id: &TemplateId,
    tags: Vec<Tag>,
) -> Result<StatusCode, ApiError> {
    let ctx = CommandContext::new(api_metadata(state));
    let now = crate::streams::database_now(&state.pool).await?;
    crate::app::template::remove_tags(&state.events, &ctx, template_id, tags, now)
        .await
        .map_err(|e| command_error(e, tag_error))?;
    Ok(StatusCode::NO_CONTENT)
}

/// A template of the caller's team named by its ID or by a name (`name[:tag]`, the tag ignored,
/// as E2B does): the SDKs' `get_tags` documents "template ID or name". Another team's
/// template is reported exactly like a missing one.
async fn resolve_id_or_name(
    state: &AppState,
    team: &Team,
    raw: &str,
) -> Result<TemplateId, ApiError> {
    if let Ok(id) = TemplateId::parse(raw) {
        if check_team_template(state, &team.0, &id).await.is_ok() {
            return Ok(id);
        }
    }
    resolve(state, team, raw).await
}

/// `GET /templates/{templateID}/tags` → `[{"tag", "buildID", "createdAt"}]`, with the time each
/// tag was last pointed at its build. The path takes a template ID or name.
pub async fn list_tags(
    State(state): State<AppState>,
    team: Team,
    Path(template_ref): Path<String>,
) -> Result<Json<Vec<Value>>, ApiError> {
    let template_id = resolve_id_or_name(&state, &team, &template_ref).await?;
    let loaded = load_team_template(&state, &team.0, &template_id).await?;
    let history = state
        .events
        .read_stream_all(&template_stream(&template_id))
        .await
        .map_err(|e| ApiError::internal("reading the template", &e))?;
    let mut assigned_at: BTreeMap<Tag, DateTime<Utc>> = BTreeMap::new();
    for recorded in &history {
        if let Ok(Event::TagsAssigned {
            tags,
            assigned_at: at,
            ..
        }) = recorded.decode::<Event>()
        {
            for tag in tags {
                assigned_at.insert(tag, at);
            }
        }
    }
    Ok(Json(
        loaded
            .state
            .tags
            .iter()
            .map(|(tag, build)| {
                json!({
                    "tag": tag.as_str(),
                    "buildID": build.to_string(),
                    "createdAt": assigned_at.get(tag).copied().unwrap_or_else(crate::clock::local_now),
                })
            })
            .collect(),
    ))
}
