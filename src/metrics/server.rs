//! `GET /metrics` as an axum route, and a listener of its own for roles without the API
//! (`strata worker --metrics-listen`, `strata reconcile --metrics-listen`).

use std::net::SocketAddr;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio_util::sync::CancellationToken;

use super::scrape::ScrapeSources;

/// The route, for merging into a router with any state.
pub fn routes<S>(sources: ScrapeSources) -> Router<S> {
    Router::new()
        .route("/metrics", get(get_metrics))
        .with_state(sources)
}

async fn get_metrics(
    State(sources): State<ScrapeSources>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    if let Some(token) = &sources.token {
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let ok = presented.is_some_and(|p| crate::domain::token::tokens_equal(p.trim(), token));
        if !ok {
            return (
                axum::http::StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                "/metrics needs `Authorization: Bearer <STRATA_METRICS_TOKEN>`\n",
            )
                .into_response();
        }
    }
    (
        [(header::CONTENT_TYPE, super::CONTENT_TYPE)],
        sources.render().await,
    )
        .into_response()
}

/// Serves `/metrics` on `addr` until `shutdown`; returns the bound address (port 0 picks one).
pub async fn serve(
    addr: SocketAddr,
    sources: ScrapeSources,
    shutdown: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app: Router = routes(sources);
    let task = tokio::spawn(async move {
        let result = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(e) = result {
            tracing::error!(error = %e, "the metrics listener stopped");
        }
    });
    tracing::info!(%bound, "serving /metrics");
    Ok((bound, task))
}
