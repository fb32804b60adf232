//! The template calls besides building: get, list, delete, and the alias (name) check that
//! `Template.exists` uses.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use uuid::Uuid;

use super::auth::Team;
use super::{api_metadata, check_team_template, command_error, load_team_template};
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::domain::build_spec::parse_name_and_tag;
use crate::domain::ids::{TeamId, TemplateId};
use crate::domain::template::{self, NameEvent};
use crate::events::command::{execute_writes, load, CommandContext};
use crate::events::{CommandError, StreamWrite};
use crate::streams::{database_now, template_name_stream, template_stream, Template, TemplateName};

/// Whether `template_id` is `team`'s template and deleted (read from the exact `templates` read
/// model); another team's template is `false`, exactly like a missing one.
async fn team_template_deleted(
    state: &AppState,
    team: &TeamId,
    template_id: &TemplateId,
) -> Result<bool, ApiError> {
    let deleted: Option<bool> =
        sqlx::query_scalar("SELECT deleted FROM templates WHERE template_id = $1 AND team_id = $2")
            .bind(template_id.as_str())
            .bind(team.as_str())
            .fetch_optional(&state.pool)
            .await?;
    Ok(deleted == Some(true))
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

#[derive(sqlx::FromRow)]
struct TemplateRow {
    template_id: String,
    names: Vec<String>,
    build_count: i64,
    latest_build: Option<Uuid>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl TemplateRow {
    fn to_json(&self) -> Value {
        json!({
            "templateID": self.template_id,
            "buildID": self.latest_build.map(|b| b.to_string()).unwrap_or_default(),
            "cpuCount": 2,
            "memoryMB": 512,
            "diskSizeMB": 0,
            "public": false,
            "aliases": self.names,
            "names": self.names,
            "createdAt": self.created_at,
            "updatedAt": self.updated_at,
            "createdBy": null,
            "lastSpawnedAt": null,
            "spawnCount": 0,
            "buildCount": self.build_count,
            "envdVersion": "",
        })
    }
}

/// `GET /templates`: the team's templates.
pub async fn list_templates(
    State(state): State<AppState>,
    team: Team,
) -> Result<Json<Vec<Value>>, ApiError> {
    let rows: Vec<TemplateRow> = sqlx::query_as(
        "SELECT template_id, names, build_count, latest_build, created_at, updated_at
         FROM templates WHERE team_id = $1 AND NOT deleted ORDER BY created_at",
    )
    .bind(team.0.as_str())
    .fetch_all(&state.pool)
    .await?;
    Ok(Json(rows.iter().map(TemplateRow::to_json).collect()))
}

/// `GET /templates/{templateID}`: one template with its builds.
pub async fn get_template(
    State(state): State<AppState>,
    team: Team,
    Path(template_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let template_id = team_template_by_ref(&state, &team.0, &template_id).await?;
    let loaded = load_team_template(&state, &team.0, &template_id).await?;
    let rows: Vec<(Uuid, String, DateTime<Utc>, DateTime<Utc>)> = sqlx::query_as(
        "SELECT build_id, phase, registered_at, updated_at FROM builds
         WHERE template_id = $1 ORDER BY registered_at",
    )
    .bind(template_id.as_str())
    .fetch_all(&state.pool)
    .await?;
    let builds: Vec<Value> = rows
        .iter()
        .map(|(id, phase, created, updated)| {
            json!({
                "buildID": id.to_string(),
                "status": e2b_status(phase),
                "createdAt": created,
                "updatedAt": updated,
                "cpuCount": 2,
                "memoryMB": 512,
            })
        })
        .collect();
    let names: Vec<&String> = loaded.state.names.iter().collect();
    Ok(Json(json!({
        "templateID": template_id.as_str(),
        "public": false,
        "aliases": names,
        "names": names,
        "createdAt": rows.first().map(|r| r.2),
        "updatedAt": rows.last().map(|r| r.3),
        "lastSpawnedAt": null,
        "spawnCount": 0,
        "builds": builds,
    })))
}

fn e2b_status(phase: &str) -> &'static str {
    match phase {
        "waiting" => "waiting",
        "queued" | "active" | "publishing" => "building",
        "ready" => "ready",
        _ => "error",
    }
}

/// `DELETE /templates/{templateID}`: the template rejects new builds and its names are released
/// for reuse, in one transaction. Deleting the team's already deleted template answers 204 as
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
    let (st, ctx, tid, team_id) = (&state, &ctx, &template_id, &team.0);
    let deleted = execute_writes(&state.events, 16, move || async move {
        let t_stream = template_stream(tid);
        let tpl = load::<Template>(&st.events, &t_stream)
            .await
            .map_err(CommandError::into_other)?;
        let events = template::decide(&tpl.state, &template::Command::DeleteTemplate { now })
            .map_err(CommandError::Rejected)?;
        let mut writes = vec![StreamWrite::new(
            t_stream.clone(),
            tpl.expected(),
            ctx.encode(&t_stream, &events)?,
        )];
        for name in &tpl.state.names {
            let n_stream = template_name_stream(team_id, name);
            let claim = load::<TemplateName>(&st.events, &n_stream)
                .await
                .map_err(CommandError::into_other)?;
            let released = vec![NameEvent::NameReleased {
                template: tid.clone(),
            }];
            writes.push(StreamWrite::new(
                n_stream.clone(),
                claim.expected(),
                ctx.encode(&n_stream, &released)?,
            ));
        }
        Ok(writes)
    })
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
