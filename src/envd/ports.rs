//! A sandbox's own ports, served through the node: what `sandbox.get_host(port)` reaches.
//!
//! The API finds the node and relays a port request here with `E2b-Sandbox-Id` and
//! `E2b-Sandbox-Port` (any port but envd's, which the agent's own routes serve); this connects
//! to that port on the sandbox's loopback from inside its network namespace and relays the
//! request, upgrades included. Like E2B's, a sandbox's ports are public (whoever has the host
//! name reaches them, with no envd token) unless it was created with `allowPublicTraffic:
//! false`: then a request must carry its traffic token, checked here as well as by the API,
//! and not passed on. A port nothing listens on answers 502 with the words the SDK maps ("port
//! is not open").

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::agent::Agents;
use super::server::{not_found_response, SANDBOX_HEADER};
use crate::domain::sandbox_address::{self, SandboxAddress};

/// The header naming the port a request is for (E2B's).
pub const PORT_HEADER: &str = "e2b-sandbox-port";
/// How long a connection to a sandbox's port may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The port a request names when it is not envd's.
fn addressed_port(request: &Request) -> Option<SandboxAddress> {
    let headers = request.headers();
    let id = headers.get(SANDBOX_HEADER)?.to_str().ok()?;
    let port = headers.get(PORT_HEADER)?.to_str().ok()?;
    sandbox_address::from_headers(id, Some(port)).filter(|a| !a.is_envd())
}

/// Serves a request for one of a sandbox's ports; hands any other to the agent's routes.
pub async fn serve_port(
    State(agents): State<Arc<Agents>>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(address) = addressed_port(&request) else {
        return next.run(request).await;
    };
    let Some(sandbox) = agents.get(&address.id) else {
        return not_found_response(&address.id);
    };
    let presented = request.headers_mut().remove(TRAFFIC_TOKEN_HEADER);
    if !sandbox.traffic_allowed(presented.as_ref().and_then(|v| v.to_str().ok())) {
        return traffic_refused(&address);
    }
    let door = match sandbox.with(|s| s.port_door()) {
        Ok(door) => door,
        Err(_) => return not_found_response(&address.id),
    };
    let port = address.port;
    let connected = tokio::task::spawn_blocking(move || door.connect(port, CONNECT_TIMEOUT)).await;
    let stream = match connected {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => return port_not_open(&address, &e.to_string()),
        Err(e) => return port_not_open(&address, &e.to_string()),
    };
    let stream = match stream
        .set_nonblocking(true)
        .and_then(|()| tokio::net::TcpStream::from_std(stream))
    {
        Ok(s) => s,
        Err(e) => return port_not_open(&address, &e.to_string()),
    };
    match crate::http_relay::relay(stream, request).await {
        Ok(response) => response,
        Err(e) => {
            tracing::debug!(sandbox = %address.id, port, error = %e, "a sandbox's port gave no answer");
            port_not_open(&address, &e.to_string())
        }
    }
}

/// The header a request for a non-public sandbox's port carries its traffic token in (E2B's).
pub const TRAFFIC_TOKEN_HEADER: &str = "e2b-traffic-access-token";

/// The refusal of a port request without the traffic token of a sandbox created with
/// `allowPublicTraffic: false`.
pub fn traffic_refused(address: &SandboxAddress) -> Response {
    let body = serde_json::json!({
        "code": 403,
        "message": format!(
            "sandbox {} was created with allowPublicTraffic false: a request for its port {} must \
             carry the sandbox's traffic access token in the {TRAFFIC_TOKEN_HEADER} header",
            address.id, address.port
        ),
        "sandboxId": address.id,
    });
    (StatusCode::FORBIDDEN, Json(body)).into_response()
}

/// The answer for a port nothing listens on (or that closed without answering): E2B's words,
/// which the SDK maps to "sandbox unreachable".
pub fn port_not_open(address: &SandboxAddress, why: &str) -> Response {
    let body = serde_json::json!({
        "code": 502,
        "message": format!(
            "The sandbox is running but port is not open: nothing in sandbox {} answered on port {} ({why})",
            address.id, address.port
        ),
        "sandboxId": address.id,
        "port": address.port,
    });
    (StatusCode::BAD_GATEWAY, Json(body)).into_response()
}
