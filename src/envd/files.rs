//! Files in a launched sandbox: envd's `/files` routes (download, upload) and its
//! `filesystem.Filesystem` RPCs. Each operation is one agent inside the sandbox, as the
//! request's user ([`fs_ops`](crate::vmm::namespace::fs_ops)): paths resolve in the sandbox's
//! root, permissions are the sandbox's, and a symlink can never lead onto the host.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Query, Request};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use futures::StreamExt;
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::agent::{Agents, LiveSandbox};
use super::connect::{self, Code, ConnectError};
use super::messages::{ListDirRequest, MoveRequest, PathRequest};
use super::server::{has_token, reply, unauthorized, user_of, Addressed, Authorized};
use crate::vmm::process::{AgentEnd, FsError, FsErrorKind, FsRequest};

/// Most bytes of a file-operation answer (a listing) read back from the agent.
const MAX_ANSWER: usize = 64 << 20;

pub fn routes() -> Router<Arc<Agents>> {
    Router::new()
        .route("/files", axum::routing::get(download).post(upload))
        .route("/filesystem.Filesystem/Stat", post(stat))
        .route("/filesystem.Filesystem/ListDir", post(list_dir))
        .route("/filesystem.Filesystem/MakeDir", post(make_dir))
        .route("/filesystem.Filesystem/Remove", post(remove))
        .route("/filesystem.Filesystem/Move", post(move_entry))
        .route(
            "/filesystem.Filesystem/WatchDir",
            post(super::watches::watch_dir),
        )
        .route(
            "/filesystem.Filesystem/CreateWatcher",
            post(super::watches::create_watcher),
        )
        .route(
            "/filesystem.Filesystem/GetWatcherEvents",
            post(super::watches::get_watcher_events),
        )
        .route(
            "/filesystem.Filesystem/RemoveWatcher",
            post(super::watches::remove_watcher),
        )
}

fn fs_code(kind: FsErrorKind) -> Code {
    match kind {
        FsErrorKind::NotFound => Code::NotFound,
        FsErrorKind::InvalidArgument => Code::InvalidArgument,
        FsErrorKind::AlreadyExists => Code::AlreadyExists,
        FsErrorKind::PermissionDenied => Code::PermissionDenied,
        FsErrorKind::NoSpace => Code::ResourceExhausted,
        FsErrorKind::Internal => Code::Internal,
    }
}

pub(super) fn op_error(end: &AgentEnd) -> ConnectError {
    match end.fs_error() {
        Some(FsError { kind, message }) => ConnectError::new(fs_code(kind), message),
        None => super::server::start_error(end),
    }
}

/// Runs one file operation and answers its JSON.
async fn run_op(
    sandbox: &LiveSandbox,
    request: FsRequest,
    user: String,
) -> Result<serde_json::Value, ConnectError> {
    let io = sandbox
        .with(|s| s.file_op(request, Some(user)))
        .map_err(|e| {
            ConnectError::new(
                Code::Unavailable,
                format!("the sandbox is not running: {e}"),
            )
        })?;
    let (out, end) = io.output(MAX_ANSWER).await;
    match end {
        AgentEnd::Exited(0) => serde_json::from_slice(&out)
            .map_err(|e| ConnectError::new(Code::Internal, format!("the agent's answer: {e}"))),
        other => Err(op_error(&other)),
    }
}

async fn rpc(
    sandbox: Arc<LiveSandbox>,
    headers: HeaderMap,
    request: Result<FsRequest, ConnectError>,
) -> Response {
    let result = async {
        let user = user_of(&headers, &sandbox)?;
        run_op(&sandbox, request?, user).await
    }
    .await;
    reply(result)
}

async fn stat(Authorized(s): Authorized, headers: HeaderMap, body: bytes::Bytes) -> Response {
    let request =
        connect::decode_unary::<PathRequest>(&body).map(|r| FsRequest::Stat { path: r.path });
    rpc(s, headers, request).await
}

async fn list_dir(Authorized(s): Authorized, headers: HeaderMap, body: bytes::Bytes) -> Response {
    let request = connect::decode_unary::<ListDirRequest>(&body).map(|r| FsRequest::List {
        path: r.path,
        depth: r.depth.max(1),
    });
    rpc(s, headers, request).await
}

async fn make_dir(Authorized(s): Authorized, headers: HeaderMap, body: bytes::Bytes) -> Response {
    let request =
        connect::decode_unary::<PathRequest>(&body).map(|r| FsRequest::MakeDir { path: r.path });
    rpc(s, headers, request).await
}

async fn remove(Authorized(s): Authorized, headers: HeaderMap, body: bytes::Bytes) -> Response {
    let request =
        connect::decode_unary::<PathRequest>(&body).map(|r| FsRequest::Remove { path: r.path });
    rpc(s, headers, request).await
}

async fn move_entry(Authorized(s): Authorized, headers: HeaderMap, body: bytes::Bytes) -> Response {
    let request = connect::decode_unary::<MoveRequest>(&body).map(|r| FsRequest::Move {
        source: r.source,
        destination: r.destination,
    });
    rpc(s, headers, request).await
}

/// `/files` errors: JSON with an integer code, as envd's plain routes answer.
fn http_error(status: StatusCode, message: impl Into<String>) -> Response {
    let body = serde_json::json!({"code": status.as_u16(), "message": message.into()});
    (status, Json(body)).into_response()
}

fn http_error_of(e: ConnectError) -> Response {
    let status = match e.code {
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::ResourceExhausted => StatusCode::INSUFFICIENT_STORAGE,
        Code::AlreadyExists => StatusCode::CONFLICT,
        Code::Unavailable => StatusCode::BAD_GATEWAY,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    http_error(status, e.message)
}

#[derive(Debug, Deserialize)]
struct FilesQuery {
    path: Option<String>,
    username: Option<String>,
    signature: Option<String>,
    signature_expiration: Option<i64>,
}

/// The SDK's signed-URL signature: `v1_` + unpadded base64 of
/// `sha256("path:op:user:token[:expiration]")`.
pub fn signature(path: &str, op: &str, user: &str, token: &str, expiration: Option<i64>) -> String {
    use base64::Engine as _;
    let mut text = format!("{path}:{op}:{user}:{token}");
    if let Some(exp) = expiration {
        text.push_str(&format!(":{exp}"));
    }
    let digest = Sha256::digest(text.as_bytes());
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

/// How a files request is authorized: by the sandbox's token (any path), or by a signed URL,
/// which covers the one path it was signed for and nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Token,
    Signed,
}

fn files_access(
    headers: &HeaderMap,
    sandbox: &LiveSandbox,
    query: &FilesQuery,
    op: &str,
    now_unix: i64,
) -> Option<Access> {
    if has_token(headers, sandbox) {
        return Some(Access::Token);
    }
    let (Some(sig), Some(path)) = (&query.signature, &query.path) else {
        return None;
    };
    if query.signature_expiration.is_some_and(|exp| exp < now_unix) {
        return None;
    }
    let user = query.username.as_deref().unwrap_or("");
    let expected = signature(path, op, user, sandbox.token(), query.signature_expiration);
    crate::domain::token::tokens_equal(sig, &expected).then_some(Access::Signed)
}

fn files_user(query: &FilesQuery, sandbox: &LiveSandbox) -> String {
    query
        .username
        .clone()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| sandbox.default_user.clone())
}

async fn download(
    Addressed(sandbox): Addressed,
    headers: HeaderMap,
    Query(q): Query<FilesQuery>,
) -> Response {
    if files_access(
        &headers,
        &sandbox,
        &q,
        "read",
        chrono::Utc::now().timestamp(),
    )
    .is_none()
    {
        return unauthorized();
    }
    let Some(path) = q.path.clone().filter(|p| !p.is_empty()) else {
        return http_error(
            StatusCode::BAD_REQUEST,
            "the path query parameter is required",
        );
    };
    let user = files_user(&q, &sandbox);
    let io = match sandbox.with(|s| s.file_op(FsRequest::Read { path }, Some(user))) {
        Ok(io) => io,
        Err(e) => {
            return http_error(
                StatusCode::BAD_GATEWAY,
                format!("the sandbox is not running: {e}"),
            )
        }
    };
    let crate::vmm::process::AgentIo {
        stdin,
        mut stdout,
        mut status,
        ..
    } = io;
    drop(stdin);
    // The first bytes, or the end: a refusal is known before anything is sent.
    let mut first = vec![0u8; 64 * 1024];
    let n = stdout.read(&mut first).await.unwrap_or(0);
    if n == 0 {
        return match status.ended().await {
            AgentEnd::Exited(0) => (
                StatusCode::OK,
                [("content-type", "application/octet-stream")],
                Body::empty(),
            )
                .into_response(),
            other => http_error_of(op_error(&other)),
        };
    }
    first.truncate(n);
    let head =
        futures::stream::once(async move { Ok::<_, std::io::Error>(bytes::Bytes::from(first)) });
    let tail = tokio_util::io::ReaderStream::new(stdout);
    // The status is read to its end so the agent is reaped; a failure mid-file truncates.
    tokio::spawn(async move {
        let _ = status.ended().await;
    });
    (
        StatusCode::OK,
        [("content-type", "application/octet-stream")],
        Body::from_stream(head.chain(tail)),
    )
        .into_response()
}

/// Streams `data` into one Write agent; answers the entry it wrote.
async fn write_one(
    sandbox: &LiveSandbox,
    path: String,
    user: String,
    mut data: impl futures::Stream<Item = Result<bytes::Bytes, String>> + Unpin,
) -> Result<serde_json::Value, ConnectError> {
    let mut io = sandbox
        .with(|s| s.file_op(FsRequest::Write { path }, Some(user)))
        .map_err(|e| {
            ConnectError::new(
                Code::Unavailable,
                format!("the sandbox is not running: {e}"),
            )
        })?;
    let mut stdin = io.stdin.take().expect("a write agent has stdin");
    use crate::vmm::namespace::fs_ops::upload_frames::frame;
    // Framed, so the agent tells a finished upload from one cut off: a client that goes away
    // mid-body leaves the old file, not a truncated one (the pipe closes without the end frame).
    let mut refused = false;
    while let Some(chunk) = data.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                drop(stdin);
                let _ = io.output(MAX_ANSWER).await;
                return Err(ConnectError::new(
                    Code::InvalidArgument,
                    format!("reading the upload: {e}"),
                ));
            }
        };
        if chunk.is_empty() {
            continue;
        }
        if stdin.write_all(&frame(&chunk)).await.is_err() {
            // The agent stopped reading (it refused the path); its status says why.
            refused = true;
            break;
        }
    }
    if !refused {
        let _ = stdin.write_all(&frame(&[])).await;
    }
    drop(stdin);
    let (out, end) = io.output(MAX_ANSWER).await;
    match end {
        AgentEnd::Exited(0) => serde_json::from_slice(&out)
            .map_err(|e| ConnectError::new(Code::Internal, format!("the agent's answer: {e}"))),
        other => Err(op_error(&other)),
    }
}

async fn upload(
    Addressed(sandbox): Addressed,
    Query(q): Query<FilesQuery>,
    request: Request,
) -> Response {
    let headers = request.headers().clone();
    let Some(access) = files_access(
        &headers,
        &sandbox,
        &q,
        "write",
        chrono::Utc::now().timestamp(),
    ) else {
        return unauthorized();
    };
    let user = files_user(&q, &sandbox);
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let gzip = headers
        .get("content-encoding")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("gzip"));
    let result = if content_type.starts_with("multipart/form-data") {
        upload_multipart(
            &sandbox,
            &q,
            access,
            user,
            &content_type,
            request.into_body(),
        )
        .await
    } else {
        let Some(path) = q.path.clone().filter(|p| !p.is_empty()) else {
            return http_error(
                StatusCode::BAD_REQUEST,
                "an octet-stream upload needs the path query parameter",
            );
        };
        let body = request
            .into_body()
            .into_data_stream()
            .map(|c| c.map_err(|e| e.to_string()));
        let written = if gzip {
            let reader =
                tokio_util::io::StreamReader::new(body.map(|c| c.map_err(std::io::Error::other)));
            let decoded = async_gunzip(reader);
            write_one(&sandbox, path, user, Box::pin(decoded)).await
        } else {
            write_one(&sandbox, path, user, Box::pin(body)).await
        };
        written.map(|entry| vec![entry])
    };
    match result {
        Ok(entries) if entries.is_empty() => http_error(
            StatusCode::BAD_REQUEST,
            "the upload held no file part named \"file\"",
        ),
        Ok(entries) => (StatusCode::OK, Json(entries)).into_response(),
        Err(e) => http_error_of(e),
    }
}

/// A gzip-encoded request body, decoded on a blocking thread as it streams.
fn async_gunzip(
    reader: impl tokio::io::AsyncRead + Unpin + Send + 'static,
) -> impl futures::Stream<Item = Result<bytes::Bytes, String>> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, String>>(4);
    let sync_reader = tokio_util::io::SyncIoBridge::new(reader);
    tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let mut decoder = flate2::read::GzDecoder::new(sync_reader);
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match decoder.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if tx
                        .blocking_send(Ok(bytes::Bytes::copy_from_slice(&buf[..n])))
                        .is_err()
                    {
                        break;
                    }
                }
                Err(e) => {
                    let _ = tx.blocking_send(Err(format!("the gzip body does not decode: {e}")));
                    break;
                }
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// Writes each part named `file`. With the token, one part goes to `?path=` and several to
/// their file names; through a signed URL, the one part goes to the signed path whatever its
/// file name says, and a second part is refused: the signature covers one path.
async fn upload_multipart(
    sandbox: &LiveSandbox,
    q: &FilesQuery,
    access: Access,
    user: String,
    content_type: &str,
    body: Body,
) -> Result<Vec<serde_json::Value>, ConnectError> {
    let boundary = multer::parse_boundary(content_type)
        .map_err(|e| ConnectError::new(Code::InvalidArgument, format!("multipart body: {e}")))?;
    let mut multipart = multer::Multipart::new(body.into_data_stream(), boundary);
    let mut entries = Vec::new();
    let mut parts = 0;
    while let Some(field) = multipart
        .next_field()
        .await
        .map_err(|e| ConnectError::new(Code::InvalidArgument, format!("multipart body: {e}")))?
    {
        if field.name() != Some("file") {
            continue;
        }
        parts += 1;
        if access == Access::Signed && parts > 1 {
            return Err(ConnectError::new(
                Code::PermissionDenied,
                format!(
                    "a signed upload URL writes one file, to the path it was signed for ({}); \
                     the body holds more than one file part, and the rest were not written",
                    q.path.as_deref().unwrap_or_default()
                ),
            ));
        }
        // With one file, `?path=` names it; otherwise each part's file name is its path.
        let path = match (&q.path, field.file_name()) {
            (Some(p), _) if access == Access::Signed => p.clone(),
            (Some(p), _) if !p.is_empty() && parts == 1 => p.clone(),
            (_, Some(name)) if !name.is_empty() => name.to_owned(),
            _ => {
                return Err(ConnectError::new(
                    Code::InvalidArgument,
                    "a file part needs a file name (its path) or the path query parameter",
                ))
            }
        };
        let data = field.map(|c| c.map_err(|e| e.to_string()));
        entries.push(write_one(sandbox, path, user.clone(), Box::pin(data)).await?);
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_match_the_sdks() {
        // SANDBOX-PROTOCOL.md §7.3, checked against captures of the real SDK.
        assert_eq!(
            signature("/home/user/hello.txt", "read", "", "envd-tok-123", None),
            "v1_U8pYTTW4pjsRuV0zVgkl5kUR2DiWkMj2WISIMqC8Tdo"
        );
    }
}
