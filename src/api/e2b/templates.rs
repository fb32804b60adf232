//! The template calls besides building: get, list, delete, and the alias (name) check that
//! `Template.exists` uses.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

use super::auth::Team;
use super::{api_metadata, check_team_template, command_error};
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::app::{CommandContext, CommandError};
use crate::domain::build_spec::{parse_name_and_tag, Resources, Tag};
use crate::domain::ids::{BuildId, TeamId, TemplateId};
use crate::domain::template;
use crate::events::command::load;
use crate::projections::builds::{self, BuildSummary};
use crate::projections::templates::{self, TemplateRow};
use crate::streams::{database_now, template_name_stream, template_stream, Template, TemplateName};

/// Whether `template_id` is `team`'s template and deleted (read from the exact `templates` read
/// model); another team's template is `false`, exactly like a missing one.
async fn team_template_deleted(
    state: &AppState,
    team: &TeamId,
    template_id: &TemplateId,
) -> Result<bool, ApiError> {
    Ok(templates::is_deleted_template_of(&state.pool, team, template_id).await?)
}

/// Resolves `name` (optionally `name:tag`, optionally namespaced to the caller's team) to the
/// team's template holding it.
pub(crate) async fn template_by_name(
    state: &AppState,
    team: &TeamId,
    raw: &str,
) -> Result<Option<TemplateId>, ApiError> {
    let Ok((name, _tag)) = parse_name_and_tag(raw) else {
        return Ok(None);
    };
    if name
        .namespace
        .as_deref()
        .is_some_and(|ns| ns != team.as_str())
    {
        return Ok(None);
    }
    let claim = load::<TemplateName>(&state.events, &template_name_stream(team, &name.name))
        .await
        .map_err(|e| command_error(e, |e: std::convert::Infallible| match e {}))?;
    let Some(holder) = claim.state.holder else {
        return Ok(None);
    };
    // The claim stream is the team's own, so its holder is the team's template; checked again
    // because a name that resolves across teams leaks another team's template (issue 9).
    match check_team_template(state, team, &holder).await {
        Ok(()) => Ok(Some(holder)),
        Err(e) if e.status == StatusCode::NOT_FOUND => Ok(None),
        Err(e) => Err(e),
    }
}

/// A template path parameter: the team's template with that id, else the team's template of
/// that name (as E2B accepts either). Another team's template is reported as missing.
pub(crate) async fn team_template_by_ref(
    state: &AppState,
    team: &TeamId,
    raw: &str,
) -> Result<TemplateId, ApiError> {
    if let Ok(id) = TemplateId::parse(raw) {
        match check_team_template(state, team, &id).await {
            Ok(()) => return Ok(id),
            Err(e) if e.status == StatusCode::NOT_FOUND => {}
            Err(e) => return Err(e),
        }
    }
    template_by_name(state, team, raw)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("template {raw:?} not found for this team")))
}

/// `GET /templates/aliases/{alias}`: 200 when the team has a template of that name, else 404.
pub async fn alias_exists(
    State(state): State<AppState>,
    team: Team,
    Path(alias): Path<String>,
) -> Result<Json<Value>, ApiError> {
    match template_by_name(&state, &team.0, &alias).await? {
        Some(id) => Ok(Json(json!({"templateID": id.as_str(), "public": false}))),
        None => Err(ApiError::not_found(format!("template {alias:?} not found"))),
    }
}

/// `buildID` of a template with no successful build, as E2B answers it.
const NO_BUILD: &str = "00000000-0000-0000-0000-000000000000";

/// The requested resources of `build`.
fn resources(build: &BuildSummary) -> Resources {
    Resources {
        cpu_count: build.cpu_count.map(|c| c as u32),
        memory_mb: build.memory_mb.map(|m| m as u32),
        min_free_disk_mb: None,
    }
}

/// A `TemplateBuild` of the upstream schema. strata keeps no disk size or envd version per
/// build, so the two optional fields are left out.
fn build_json(build: &BuildSummary) -> Value {
    let resources = resources(build);
    let mut out = json!({
        "buildID": build.build.to_string(),
        "status": e2b_status(&build.phase),
        "createdAt": build.registered_at,
        "updatedAt": build.updated_at,
        "cpuCount": resources.effective_cpu_count(),
        "memoryMB": resources.effective_memory_mb(),
    });
    if let Some(at) = build.finished_at {
        out["finishedAt"] = json!(at);
    }
    out
}

/// The build a template's `buildID` names: the one its `default` tag points at (what using the
/// template gets), else its newest successful build.
async fn current_build(
    state: &AppState,
    template_id: &TemplateId,
) -> Result<Option<BuildId>, ApiError> {
    let loaded = load::<Template>(&state.events, &template_stream(template_id))
        .await
        .map_err(|e| command_error(e, |e: template::Error| ApiError::internal("template", &e)))?;
    if let Some(build) = loaded.state.tags.get(&Tag::default_tag()) {
        return Ok(Some(*build));
    }
    Ok(builds::newest_ready_build(&state.pool, template_id).await?)
}

/// A `Template` of the upstream schema. `buildID` and the resources are those of the
/// template's current build (see [`current_build`]); `buildStatus` is the status of its newest
/// build, so a failed rebuild shows as `error` while `buildID` still names the build in use.
/// strata records no creator, spawns, disk size or envd version: `createdBy` and
/// `lastSpawnedAt` are null, `spawnCount` and `diskSizeMB` 0, `envdVersion` empty, as E2B
/// answers when it has none.
async fn template_json(state: &AppState, row: &TemplateRow) -> Result<Value, ApiError> {
    let current = current_build(state, &row.template).await?;
    let ids: Vec<BuildId> = current
        .iter()
        .chain(row.latest_build.iter())
        .copied()
        .collect();
    let summaries = builds::summaries_of(&state.pool, &ids).await?;
    let find = |id: Option<BuildId>| id.and_then(|id| summaries.iter().find(|b| b.build == id));
    let latest = find(row.latest_build);
    let resources = find(current).or(latest).map(resources).unwrap_or_default();
    Ok(json!({
        "templateID": row.template.as_str(),
        "buildID": current.map(|b| b.to_string()).unwrap_or_else(|| NO_BUILD.to_owned()),
        "buildStatus": latest.map_or("waiting", |b| e2b_status(&b.phase)),
        "cpuCount": resources.effective_cpu_count(),
        "memoryMB": resources.effective_memory_mb(),
        "diskSizeMB": 0,
        "public": false,
        "aliases": row.names,
        "names": row.names,
        "createdAt": row.created_at,
        "updatedAt": row.updated_at,
        "createdBy": null,
        "lastSpawnedAt": null,
        "spawnCount": 0,
        "buildCount": row.build_count,
        "envdVersion": "",
    }))
}

/// `GET /templates`: the team's templates, oldest first.
pub async fn list_templates(
    State(state): State<AppState>,
    team: Team,
) -> Result<Json<Vec<Value>>, ApiError> {
    let rows = templates::live_templates_of(&state.pool, &team.0).await?;
    let mut templates = Vec::with_capacity(rows.len());
    for row in &rows {
        templates.push(template_json(&state, row).await?);
    }
    Ok(Json(templates))
}

/// `GET /templates/{templateID}`: one template with its builds, newest first. The upstream
/// schema is `TemplateWithBuilds`; the Python SDK's generated model of it also requires every
/// field of `Template`, so the answer carries both.
pub async fn get_template(
    State(state): State<AppState>,
    team: Team,
    Path(template_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let template_id = team_template_by_ref(&state, &team.0, &template_id).await?;
    // The team's template, just checked: its row is written in the same transaction as its
    // registration, so a missing one is a broken read model.
    let row = templates::template_row_of(&state.pool, &template_id)
        .await?
        .ok_or(sqlx::Error::RowNotFound)?;
    let builds = builds::summaries_of_template(&state.pool, &template_id).await?;
    let mut template = template_json(&state, &row).await?;
    template["builds"] = builds.iter().map(build_json).collect();
    Ok(Json(template))
}

fn e2b_status(phase: &str) -> &'static str {
    match phase {
        "waiting" => "waiting",
        "queued" | "active" | "publishing" => "building",
        "ready" => "ready",
        _ => "error",
    }
}

/// `DELETE /templates/{templateID}`: the template rejects new builds, its names are released for
/// reuse, and its builds that are not yet publishing end in `error` saying the template was
/// deleted, in one transaction. Deleting the team's already deleted template answers 204 as
/// well: a client that lost the first reply and retries must see success, not 404.
pub async fn delete_template(
    State(state): State<AppState>,
    team: Team,
    Path(template_ref): Path<String>,
) -> Result<StatusCode, ApiError> {
    if let Ok(id) = TemplateId::parse(&template_ref) {
        if team_template_deleted(&state, &team.0, &id).await? {
            return Ok(StatusCode::NO_CONTENT);
        }
    }
    let template_id = team_template_by_ref(&state, &team.0, &template_ref).await?;
    let ctx = CommandContext::new(api_metadata(&state));
    let now = database_now(&state.pool).await?;
    let deleted =
        crate::app::template::delete_template(&state.events, &ctx, &team.0, &template_id, now)
            .await;
    match deleted {
        // Deleted by a concurrent request (or an earlier try of this one): the outcome asked for
        // holds.
        Ok(_) | Err(CommandError::Rejected(template::Error::Deleted)) => {}
        Err(e) => return Err(command_error(e, |e| ApiError::bad_request(e.to_string()))),
    }
    tracing::info!(template = %template_id, "template deleted");
    Ok(StatusCode::NO_CONTENT)
}
