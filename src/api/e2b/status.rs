//! `GET /templates/{templateID}/builds/{buildID}/status?logsOffset=&limit=&level=`: the build's
//! status and one page of its logs. `logsOffset` indexes an append-only list, so the SDK's
//! drain loop ends; past the end the page is empty.
//!
//! While the build is in flight and nothing exists past `logsOffset`, the request is held until
//! there is news (a log line, another status) or `STRATA_STATUS_HOLD_MS` passes, then answers
//! exactly what it would answer at that moment (ADR 0027). The SDKs poll in a loop with a sleep
//! between calls, so an answer that waits for the news instead of returning "nothing yet" takes
//! the poll timer out of every build's round trip. Once there is news the request lingers
//! briefly for more ([`LINGER_QUIET`], [`LINGER_MAX`]) unless the build ends or the page fills. A held request holds no
//! database connection: it waits on [`StreamNews`](crate::api::stream_news), woken by NOTIFY.

use axum::extract::{Path, Query, State};
use axum::Json;
use serde::Deserialize;

use super::auth::Team;
use super::parse_template_id;
use super::start::{check_build_of, parse_build_id};
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::domain::build::status::{LogLevel, StatusResponse};
use crate::domain::ids::{BuildId, TeamId, TemplateId};
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
    let page = Page {
        team: &team.0,
        template_id: &template_id,
        build_id: &build_id,
        offset: query.logs_offset.unwrap_or(0).max(0),
        limit: query.limit.unwrap_or(100).clamp(0, 100),
        min_level: query.level.unwrap_or(LogLevel::Debug),
    };
    let hold = state.protocol.status_hold;
    // The watch comes before the read: news written after the read wakes it.
    let mut watch = (!hold.is_zero())
        .then(|| state.stream_news.watch(build_id))
        .flatten();
    let first = page.answer(&state).await?;
    let Some(watch) = watch.as_mut().filter(|_| first.nothing_new()) else {
        return Ok(Json(first));
    };
    let Some(_held) = watch.hold() else {
        return Ok(Json(first));
    };
    let held_until = tokio::time::Instant::now() + hold;
    let mut deadline = held_until;
    let mut first_news = None;
    let mut latest = first;
    while tokio::time::timeout_at(deadline, watch.news())
        .await
        .is_ok()
    {
        let now = page.answer(&state).await?;
        if now == latest {
            continue;
        }
        if now.is_complete(page.limit) {
            return Ok(Json(now));
        }
        let at = tokio::time::Instant::now();
        let since = *first_news.get_or_insert(at);
        deadline = held_until.min(since + LINGER_MAX).min(at + LINGER_QUIET);
        latest = now;
    }
    page.answer(&state).await.map(Json)
}

/// Once a held request has news (lines, another status) it waits for more while more keeps
/// coming: it answers when the build ends or the page fills, after [`LINGER_QUIET`] without
/// news, or [`LINGER_MAX`] after the first news, whichever comes first. The SDKs sleep 0.2 s
/// after every answer that is not terminal, so a build whose lines and end come close together
/// (a one-step build: lines at 3, 22, 25 and 48 ms, ready at 56 ms, measured) is seen ended in
/// one answer instead of two answers and a sleep. A line waits at most `LINGER_MAX`, no longer
/// than the poll interval it replaces.
const LINGER_QUIET: std::time::Duration = std::time::Duration::from_millis(40);
const LINGER_MAX: std::time::Duration = std::time::Duration::from_millis(200);

/// One status request's page of one build.
struct Page<'a> {
    team: &'a TeamId,
    template_id: &'a TemplateId,
    build_id: &'a BuildId,
    offset: i64,
    limit: i64,
    min_level: LogLevel,
}

impl Page<'_> {
    /// The answer now: the build's own registration names its team and template (one stream
    /// read), then its logs. State first, logs second: a terminal state read here has all its
    /// logs written already.
    async fn answer(&self, state: &AppState) -> Result<StatusResponse, ApiError> {
        let build = check_build_of(state, self.team, self.template_id, self.build_id).await?;
        let page = build_logs::page_of(
            &state.pool,
            *self.build_id,
            self.min_level,
            self.offset,
            self.limit,
        )
        .await?;
        StatusResponse::of(&build, self.build_id, page)
            .ok_or_else(|| ApiError::not_found(format!("build {} not found", self.build_id)))
    }
}
