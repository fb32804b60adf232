//! HTTP surface: the E2B-compatible API and the operator API.

pub mod admin;
pub mod error;
pub mod upload_ingest;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use sqlx::PgPool;

use crate::config::ServeArgs;
use crate::events::EventStore;

/// Shared by every handler; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub pool: PgPool,
    /// The event store on `pool`, shared so that the process has one post-commit notifier.
    pub events: EventStore,
    /// Bearer token for `/admin/*`; `None` closes the operator API.
    pub admin_token: Option<String>,
    /// Base URL handed out in links (upload URLs).
    pub public_url: String,
    /// Actor id recorded on events this process appends.
    pub node_id: String,
}

impl AppState {
    pub fn new(pool: PgPool, serve: &ServeArgs, node_id: String) -> Self {
        Self {
            events: EventStore::new(pool.clone()),
            pool,
            admin_token: serve.admin_token.clone(),
            public_url: serve.public_url(),
            node_id,
        }
    }
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/health", get(health))
        .merge(admin::routes(state.clone()))
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(state)
}

/// Liveness plus a round trip to Postgres: 503 when the database is unreachable.
async fn health(State(state): State<AppState>) -> (StatusCode, Json<serde_json::Value>) {
    match sqlx::query("SELECT 1").execute(&state.pool).await {
        Ok(_) => (StatusCode::OK, Json(serde_json::json!({"status": "ok"}))),
        Err(err) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({"status": "unavailable", "error": err.to_string()})),
        ),
    }
}
