//! The API's door to sandboxes: a request carrying `E2b-Sandbox-Id` (every envd call of an SDK
//! told `E2B_SANDBOX_URL=<this server>`), or whose `Host` is `<port>-<id>.<domain>` (what
//! `sandbox.get_host(port)` gives, `domain` being `STRATA_SANDBOX_DOMAIN`), goes to the node
//! running that sandbox, streaming both ways without buffering (a `Start` stream lasts as long
//! as its command). envd's port goes to the node's agent; any other port is relayed through
//! the agent into the sandbox, WebSocket upgrades included ([`crate::envd::ports`]).
//!
//! The agent checks the sandbox's access token itself; this door only finds the node. An
//! unknown or ended sandbox answers 502 "The sandbox was not found", the words the SDK maps to
//! "not running".

use std::sync::OnceLock;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::TryStreamExt;

use super::AppState;
use crate::domain::sandbox_address::{self, SandboxAddress};
use crate::envd::ports::{PORT_HEADER, TRAFFIC_TOKEN_HEADER};
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

/// The sandbox and port `request` is for, if any: by its headers, else by its `Host`.
/// `Err` names a sandbox header that is not a sandbox's id.
fn addressed(request: &Request, domain: &str) -> Result<Option<SandboxAddress>, String> {
    let headers = request.headers();
    if let Some(id) = headers.get(SANDBOX_HEADER) {
        let id = id.to_str().unwrap_or_default();
        let port = headers.get(PORT_HEADER).and_then(|p| p.to_str().ok());
        return sandbox_address::from_headers(id, port)
            .map(Some)
            .ok_or_else(|| id.to_string());
    }
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()));
    Ok(host.and_then(|h| sandbox_address::from_host(h, domain)))
}

pub async fn forward_to_sandbox(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let address = match addressed(&request, &state.protocol.sandbox_domain) {
        Ok(Some(address)) => address,
        Ok(None) => return next.run(request).await,
        Err(id) => return not_found_response(&id),
    };
    let id = address.id.clone();
    let Ok(sandbox) = crate::domain::sandbox::SandboxId::parse(&id) else {
        return not_found_response(&id);
    };
    let route = match state
        .sandbox_routes
        .route(&state.pool, &state.stream_news, &sandbox)
        .await
    {
        Ok(route) => route,
        Err(e) => return super::error::ApiError::from(e).into_response(),
    };
    let Some(route) = route else {
        return not_found_response(&id);
    };
    let agent = route.agent_url.clone();
    if !address.is_envd() {
        if let Some(refused) = traffic_refused(&route, &address, request.headers()) {
            return refused;
        }
    }
    // The agent finds the sandbox by these, whichever way this request named it.
    let headers = request.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&id) {
        headers.insert(SANDBOX_HEADER, v);
    }
    headers.insert(PORT_HEADER, HeaderValue::from(address.port));
    if !address.is_envd() {
        return relay_to_node(&agent, &id, request).await;
    }
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
            return node_did_not_answer(&id);
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

/// The refusal of a request for a port of a sandbox created with `allowPublicTraffic: false`
/// that does not carry its traffic token; `None` lets it through (the node's agent checks it
/// again and does not pass it on to the sandbox's server).
fn traffic_refused(
    route: &super::sandbox_routes::Route,
    address: &SandboxAddress,
    headers: &axum::http::HeaderMap,
) -> Option<Response> {
    let expected = route.traffic_token.as_deref()?;
    let matches = headers
        .get(TRAFFIC_TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| crate::domain::token::tokens_equal(t, expected));
    (!matches).then(|| crate::envd::ports::traffic_refused(address))
}

/// The answer when the node running sandbox `id` cannot be reached.
fn node_did_not_answer(id: &str) -> Response {
    let body = serde_json::json!({
        "code": 502,
        "message": format!("the node running sandbox {id} did not answer; retry, or create the sandbox again"),
        "sandboxId": id,
    });
    (StatusCode::BAD_GATEWAY, axum::Json(body)).into_response()
}

/// Relays a request for one of sandbox `id`'s ports to the agent at `agent`, over a connection
/// of its own (an upgrade keeps it).
async fn relay_to_node(agent: &str, id: &str, request: Request) -> Response {
    let Some((host, port)) = reqwest::Url::parse(agent)
        .ok()
        .and_then(|u| Some((u.host_str()?.to_string(), u.port_or_known_default()?)))
    else {
        tracing::warn!(sandbox = %id, agent, "a node's agent URL is not http://host:port");
        return node_did_not_answer(id);
    };
    let stream = match tokio::net::TcpStream::connect((host.as_str(), port)).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(sandbox = %id, error = %e, "the sandbox's node did not answer");
            return node_did_not_answer(id);
        }
    };
    let _ = stream.set_nodelay(true);
    match crate::http_relay::relay(stream, request).await {
        Ok(response) => response,
        Err(e) => {
            tracing::warn!(sandbox = %id, error = %e, "the sandbox's node did not answer");
            node_did_not_answer(id)
        }
    }
}
