//! The API's door to sandbox agents: a request carrying `E2b-Sandbox-Id` (every envd call of
//! an SDK told `E2B_SANDBOX_URL=<this server>`) goes to the node running that sandbox,
//! streaming both ways without buffering (a `Start` stream lasts as long as its command).
//!
//! The agent checks the sandbox's access token itself; this door only finds the node. An
//! unknown or ended sandbox answers 502 "The sandbox was not found", the words the SDK maps to
//! "not running".

use std::sync::OnceLock;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderName, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::TryStreamExt;

use super::AppState;
use crate::envd::server::{not_found_response, SANDBOX_HEADER};

fn client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .pool_idle_timeout(std::time::Duration::from_secs(60))
            .build()
            .expect("an HTTP client for sandbox agents")
    })
}

/// What the sandbox uses now, from its node's agent (`GET /metrics`, envd's body); `None`
/// when it runs nowhere now (paused, or its node is gone) or the agent does not answer.
pub async fn agent_metrics(
    row: &crate::projections::sandboxes::SandboxRow,
) -> Option<crate::envd::metrics::Metrics> {
    let url = row.agent_url.as_deref()?;
    let resp = client()
        .get(format!("{}/metrics", url.trim_end_matches('/')))
        .header(SANDBOX_HEADER, &row.sandbox_id)
        .header(crate::envd::server::TOKEN_HEADER, &row.envd_token)
        .timeout(std::time::Duration::from_secs(10))
        .send()
        .await
        .ok()?;
    if !resp.status().is_success() {
        return None;
    }
    serde_json::from_slice(&resp.bytes().await.ok()?).ok()
}

/// Headers that belong to one hop, not to the request.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "transfer-encoding"
            | "upgrade"
            | "te"
            | "trailer"
            | "host"
    )
}

pub async fn forward_to_sandbox(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let Some(id) = request
        .headers()
        .get(SANDBOX_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
    else {
        return next.run(request).await;
    };
    let row = match crate::projections::sandboxes::get(&state.pool, &id).await {
        Ok(row) => row,
        Err(e) => return super::error::ApiError::from(e).into_response(),
    };
    let Some(agent) = row
        .filter(|r| r.state == "running")
        .and_then(|r| r.agent_url)
    else {
        return not_found_response(&id);
    };
    let (parts, body) = request.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let mut outgoing = client().request(parts.method.clone(), format!("{agent}{path}"));
    for (name, value) in &parts.headers {
        if !hop_by_hop(name) {
            outgoing = outgoing.header(name, value);
        }
    }
    let outgoing = outgoing.body(reqwest::Body::wrap_stream(body.into_data_stream()));
    let answer = match outgoing.send().await {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(sandbox = %id, error = %e, "the sandbox's node did not answer");
            let body = serde_json::json!({
                "code": 502,
                "message": format!("the node running sandbox {id} did not answer; retry, or create the sandbox again"),
                "sandboxId": id,
            });
            return (StatusCode::BAD_GATEWAY, axum::Json(body)).into_response();
        }
    };
    let mut response = Response::builder().status(answer.status().as_u16());
    for (name, value) in answer.headers() {
        if !hop_by_hop(name) {
            response = response.header(name, value);
        }
    }
    let stream = answer.bytes_stream().map_err(std::io::Error::other);
    response
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response())
}
