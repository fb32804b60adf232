//! The template calls besides building: get, list, delete, and the alias (name) check that
//! `Template.exists` uses.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use uuid::Uuid;

use super::auth::Team;
use super::{
    api_metadata, check_team_template, command_error, load_team_template, parse_template_id,
};
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::domain::build_spec::parse_name_and_tag;
use crate::domain::ids::{TeamId, TemplateId};
use crate::domain::template::{self, NameEvent};
use crate::events::command::{execute_writes, load, CommandContext};
use crate::events::{CommandError, StreamWrite};
use crate::streams::{template_name_stream, template_stream, Template, TemplateName};

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
    Ok(claim.state.holder)
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
    let template_id = parse_template_id(&template_id)?;
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
/// for reuse, in one transaction.
pub async fn delete_template(
    State(state): State<AppState>,
    team: Team,
    Path(template_id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let template_id = parse_template_id(&template_id)?;
    check_team_template(&state, &team.0, &template_id).await?;
    let ctx = CommandContext::new(api_metadata(&state));
    let now = Utc::now();
    let (st, ctx, tid, team_id) = (&state, &ctx, &template_id, &team.0);
    execute_writes(&state.events, 16, move || async move {
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
    .await
    .map_err(|e| {
        command_error(e, |e: template::Error| match e {
            template::Error::Deleted => {
                ApiError::not_found(format!("template {template_id} not found"))
            }
            other => ApiError::bad_request(other.to_string()),
        })
    })?;
    tracing::info!(template = %template_id, "template deleted");
    Ok(StatusCode::NO_CONTENT)
}
