//! The operator (audit) API under `/admin`: the authoritative history of a stream, the global
//! feed in commit-safe order, and the stream catalog.
//!
//! * `GET /admin/streams/{stream}/events?from_version=&limit=` — a stream's events, oldest first;
//!   `next` is the `from_version` of the following page, or null at the end.
//! * `GET /admin/events?after=<tx_id>:<position>&limit=` — the global feed; `next` is the cursor
//!   to pass as `after` for the following page (the same one when nothing new is visible yet).
//! * `GET /admin/streams?category=&after=&limit=` — the catalog (a projection, may lag); `next`
//!   is the `after` of the following page, or null at the end.
//!
//! * `/admin/settings`: pins of a team or template ([`super::admin_settings`]).
//!
//! Every route needs `Authorization: Bearer <STRATA_ADMIN_TOKEN>`: 401 without it or with a wrong
//! one, 503 when the server has no token (the operator API is never open).

use axum::extract::{Path, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use super::AppState;
use crate::events::{FeedPosition, ReadError, RecordedEvent, StreamId};
use crate::projections::stream_catalog::{self, CatalogEntry};

const DEFAULT_LIMIT: u32 = 100;
const MAX_LIMIT: u32 = 1000;

pub fn routes(state: AppState) -> Router<AppState> {
    Router::new()
        .route("/admin/streams", get(list_streams))
        .route("/admin/streams/{stream}/events", get(read_stream_events))
        .route("/admin/events", get(read_feed_events))
        .route(
            "/admin/settings",
            get(super::admin_settings::show).put(super::admin_settings::pin),
        )
        .route(
            "/admin/settings/{key}",
            axum::routing::delete(super::admin_settings::unpin),
        )
        .route_layer(middleware::from_fn_with_state(state, require_admin_token))
}

/// Errors of the operator API, as JSON `{"error": "..."}`.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("writing to the event store: {0}")]
    Store(String),
    #[error("missing or wrong bearer token; send `Authorization: Bearer <STRATA_ADMIN_TOKEN>`")]
    Unauthorized,
    #[error("the operator API is closed: start the server with STRATA_ADMIN_TOKEN set")]
    Closed,
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let status = match &self {
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Closed => StatusCode::SERVICE_UNAVAILABLE,
            Self::Read(ReadError::Database(
                sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed,
            ))
            | Self::Database(sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::Read(_) | Self::Database(_) | Self::Store(_) => {
                tracing::error!(error = %self, "admin request failed");
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        let mut response =
            (status, Json(serde_json::json!({"error": self.to_string()}))).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}

async fn require_admin_token(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Result<Response, AdminError> {
    let Some(expected) = state.admin_token.as_deref().filter(|t| !t.is_empty()) else {
        return Err(AdminError::Closed);
    };
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or(AdminError::Unauthorized)?;
    if !tokens_equal(presented.trim(), expected) {
        return Err(AdminError::Unauthorized);
    }
    Ok(next.run(request).await)
}

pub(crate) use crate::domain::token::tokens_equal;

fn limit(requested: Option<u32>) -> u32 {
    requested.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT)
}

/// An event with its feed cursor, as the API shows it.
#[derive(Debug, Serialize)]
pub struct EventView {
    #[serde(flatten)]
    pub event: RecordedEvent,
    /// This event's place in the global feed (`tx_id:position`).
    pub cursor: FeedPosition,
}

impl From<RecordedEvent> for EventView {
    fn from(event: RecordedEvent) -> Self {
        let cursor = event.feed_position();
        Self { event, cursor }
    }
}

#[derive(Debug, Deserialize)]
pub struct StreamEventsQuery {
    from_version: Option<u64>,
    limit: Option<u32>,
}

#[derive(Debug, Serialize)]
pub struct StreamEventsPage {
    stream: StreamId,
    /// The stream's current version.
    version: u64,
    events: Vec<EventView>,
    /// `from_version` of the next page; null when this page reaches the end.
    next: Option<u64>,
}

#[tracing::instrument(skip(state))]
async fn read_stream_events(
    State(state): State<AppState>,
    Path(stream): Path<String>,
    Query(query): Query<StreamEventsQuery>,
) -> Result<Json<StreamEventsPage>, AdminError> {
    let stream = StreamId::parse(stream).map_err(|e| AdminError::BadRequest(e.to_string()))?;
    let store = &state.events;
    let limit = limit(query.limit);
    let events = store
        .read_stream(&stream, query.from_version.unwrap_or(1).max(1), limit)
        .await?;
    let version = store.stream_version(&stream).await?;
    let next = events
        .last()
        .map(|e| e.version + 1)
        .filter(|&n| n <= version);
    Ok(Json(StreamEventsPage {
        stream,
        version,
        events: events.into_iter().map(EventView::from).collect(),
        next,
    }))
}

#[derive(Debug, Deserialize)]
pub struct FeedQuery {
    after: Option<String>,
    limit: Option<u32>,
}

#[derive(Debug, Serialize)]
pub struct FeedPage {
    events: Vec<EventView>,
    /// Pass as `after` to continue; unchanged when no new event is visible yet.
    next: FeedPosition,
}

#[tracing::instrument(skip(state))]
async fn read_feed_events(
    State(state): State<AppState>,
    Query(query): Query<FeedQuery>,
) -> Result<Json<FeedPage>, AdminError> {
    let after = match query.after.as_deref().filter(|a| !a.is_empty()) {
        Some(a) => a
            .parse::<FeedPosition>()
            .map_err(|e| AdminError::BadRequest(e.to_string()))?,
        None => FeedPosition::START,
    };
    let events = state.events.read_feed(after, limit(query.limit)).await?;
    let next = events.last().map_or(after, |e| e.feed_position());
    Ok(Json(FeedPage {
        events: events.into_iter().map(EventView::from).collect(),
        next,
    }))
}

#[derive(Debug, Deserialize)]
pub struct StreamsQuery {
    category: Option<String>,
    after: Option<String>,
    limit: Option<u32>,
}

#[derive(Debug, Serialize)]
pub struct StreamsPage {
    streams: Vec<CatalogEntry>,
    /// `after` of the next page; null at the end.
    next: Option<String>,
}

#[tracing::instrument(skip(state))]
async fn list_streams(
    State(state): State<AppState>,
    Query(query): Query<StreamsQuery>,
) -> Result<Json<StreamsPage>, AdminError> {
    let limit = limit(query.limit);
    let streams = stream_catalog::list_streams(
        &state.pool,
        query.category.as_deref().filter(|c| !c.is_empty()),
        query.after.as_deref().filter(|a| !a.is_empty()),
        limit,
    )
    .await?;
    let next = (streams.len() == limit as usize)
        .then(|| streams.last().map(|s| s.stream_id.clone()))
        .flatten();
    Ok(Json(StreamsPage { streams, next }))
}

#[cfg(test)]
mod tests {
    use super::tokens_equal;

    #[test]
    fn token_comparison() {
        assert!(tokens_equal("s3cret", "s3cret"));
        assert!(!tokens_equal("s3cret", "s3cres"));
        assert!(!tokens_equal("s3cret", "s3cret-longer"));
        assert!(!tokens_equal("", "s3cret"));
    }
}
