//! `GET /templates/{templateID}/builds/{buildID}/status?logsOffset=&limit=&level=`: the build's
//! status and one page of its logs. `logsOffset` indexes an append-only list, so the SDK's
//! drain loop ends; past the end the page is empty.

use axum::extract::{Path, Query, State};
use axum::Json;
use serde::Deserialize;

use super::auth::Team;
use super::parse_template_id;
use super::start::{check_build_of, parse_build_id};
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::domain::build::status::{LogLevel, StatusResponse};
use crate::projections::build_logs;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusQuery {
    logs_offset: Option<i64>,
    limit: Option<i64>,
    /// Minimum level to include.
    level: Option<LogLevel>,
}

pub async fn build_status(
    State(state): State<AppState>,
    team: Team,
    Path((template_id, build_id)): Path<(String, String)>,
    query: Result<Query<StatusQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<StatusResponse>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(format!("invalid query: {e}")))?;
    let template_id = parse_template_id(&template_id)?;
    let build_id = parse_build_id(&build_id)?;
    // The build's own registration names its team and template: one stream read per poll.
    // State first, logs second: a terminal state read here has all its logs written already.
    let build = check_build_of(&state, &team.0, &template_id, &build_id).await?;
    let offset = query.logs_offset.unwrap_or(0).max(0);
    let limit = query.limit.unwrap_or(100).clamp(0, 100);
    let min_level = query.level.unwrap_or(LogLevel::Debug);
    let page = build_logs::page_of(&state.pool, build_id, min_level, offset, limit).await?;
    StatusResponse::of(&build, &build_id, page)
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("build {build_id} not found")))
}
