//! Relaying one HTTP/1.1 request over a connection the caller opened, and, when the far side
//! switches protocols (a WebSocket), the bytes of both directions after it.
//!
//! The API relays a sandbox's port requests to the node that runs it, and the node relays them
//! into the sandbox (`vmm::port_door`). Neither side buffers: bodies stream as they come, and
//! an upgraded connection is copied both ways until either end closes. A relay opens one
//! connection per request; the far side's keep-alive is not reused.

use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Why a relay got no answer.
#[derive(Debug, thiserror::Error)]
#[error("relaying a request: {0}")]
pub struct RelayError(#[from] hyper::Error);

/// Sends `request` over `stream` and answers what came back; a `101 Switching Protocols`
/// joins the caller's upgraded connection to the far side's.
pub async fn relay(
    stream: TcpStream,
    mut request: Request<Body>,
) -> Result<Response<Body>, RelayError> {
    let asks_upgrade = request.headers().contains_key(axum::http::header::UPGRADE);
    let caller_upgrade = asks_upgrade.then(|| hyper::upgrade::on(&mut request));
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.with_upgrades().await {
            tracing::debug!(error = %e, "a relayed connection ended with an error");
        }
    });
    let mut response = sender.send_request(request).await?;
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(caller) = caller_upgrade {
            let far = hyper::upgrade::on(&mut response);
            tokio::spawn(async move {
                let (Ok(caller), Ok(far)) = (caller.await, far.await) else {
                    return;
                };
                let (mut caller, mut far) = (TokioIo::new(caller), TokioIo::new(far));
                let _ = tokio::io::copy_bidirectional(&mut caller, &mut far).await;
            });
        }
    }
    Ok(response.map(Body::new))
}
