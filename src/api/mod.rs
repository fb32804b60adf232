//! HTTP surface: the E2B-compatible API and the operator API.

pub mod admin;
pub mod admin_settings;
pub mod e2b;
pub mod error;
pub mod sandbox_proxy;
pub mod sandbox_routes;
pub mod state;
pub mod stream_news;
pub mod ui;
pub mod upload_ingest;

pub use state::{AppState, ProtocolSettings, StateError};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};

/// The build gauges' reader: the builds read model, queried at each scrape.
fn build_counts_reader(pool: sqlx::PgPool) -> crate::metrics::scrape::ReadModelCountsReader {
    std::sync::Arc::new(move || {
        let pool = pool.clone();
        Box::pin(async move { crate::projections::builds::build_counts(&pool).await })
    })
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/health", get(health))
        .merge(admin::routes(state.clone()))
        .merge(ui::routes(state.clone()))
        .merge(crate::metrics::server::routes(
            crate::metrics::scrape::ScrapeSources {
                builds: Some(build_counts_reader(state.pool.clone())),
                data_dir: Some(state.data_dir.clone()),
                team_limits: Some(state.protocol.team_limits),
                token: state.metrics_token.clone(),
            },
        ))
        .merge(e2b::routes())
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            sandbox_proxy::forward_to_sandbox,
        ))
        // Spans name the path only: upload URLs carry their signature in the query.
        .layer(
            tower_http::trace::TraceLayer::new_for_http().make_span_with(
                |request: &axum::http::Request<axum::body::Body>| {
                    let span = tracing::info_span!(
                        "request",
                        method = %request.method(),
                        path = %request.uri().path(),
                        team = tracing::field::Empty,
                    );
                    // A client's W3C trace context makes this request part of its trace.
                    if let Some(parent) = request
                        .headers()
                        .get("traceparent")
                        .and_then(|v| v.to_str().ok())
                        .and_then(crate::trace::parse_traceparent)
                    {
                        crate::trace::set_parent(&span, &parent);
                    }
                    span
                },
            ),
        )
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
