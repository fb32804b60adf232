//! The agent's HTTP routes: envd's `process.Process` service, `/health` and `/envs`, and the
//! sandbox lookup and token check every route shares. Files: [`files`](super::files).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::StreamExt;

use super::agent::{Agents, LiveSandbox};
use super::connect::{self, Code, ConnectError};
use super::messages::{
    CloseStdinRequest, ConnectRequest, ListResponse, ProcessEvent, ProcessInfo, ProcessInput,
    ProcessSelector, PtySize, SendInputRequest, SendSignalRequest, Signal, StartRequest,
    StreamInputRequest, UpdateRequest,
};
use crate::vmm::process::{AgentEnd, SpawnRequest};
use crate::vmm::start_failure::StartFailure;

pub const SANDBOX_HEADER: &str = "e2b-sandbox-id";
pub const TOKEN_HEADER: &str = "x-access-token";

pub fn router(agents: Arc<Agents>) -> Router {
    // Every request meets the port relay first, whatever its path and method: a sandbox's own
    // server may serve `/health` or `/files` too.
    Router::new()
        .fallback_service(envd_routes(agents.clone()))
        .layer(axum::middleware::from_fn_with_state(
            agents,
            super::ports::serve_port,
        ))
}

/// envd's own routes.
fn envd_routes(agents: Arc<Agents>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/envs", get(envs))
        .route("/metrics", get(super::metrics::serve))
        .route("/process.Process/Start", post(start))
        .route("/process.Process/List", post(list))
        .route("/process.Process/SendSignal", post(send_signal))
        .route("/process.Process/SendInput", post(send_input))
        .route("/process.Process/CloseStdin", post(close_stdin))
        .route("/process.Process/Connect", post(connect_process))
        .route("/process.Process/StreamInput", post(stream_input))
        .route("/process.Process/Update", post(update))
        .merge(super::files::routes())
        .fallback(unserved)
        .with_state(agents)
}

/// The answer for a sandbox this node does not run: the words the SDK maps to "not running".
pub fn not_found_response(id: &str) -> Response {
    let body = serde_json::json!({
        "code": 502,
        "message": "The sandbox was not found",
        "sandboxId": id,
    });
    (StatusCode::BAD_GATEWAY, Json(body)).into_response()
}

/// The sandbox a request names, found on this node. Its token is checked by [`Authorized`].
pub struct Addressed(pub Arc<LiveSandbox>);

impl FromRequestParts<Arc<Agents>> for Addressed {
    type Rejection = Response;
    async fn from_request_parts(
        parts: &mut Parts,
        agents: &Arc<Agents>,
    ) -> Result<Self, Self::Rejection> {
        let id = parts
            .headers
            .get(SANDBOX_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        agents
            .get(id)
            .map(Addressed)
            .ok_or_else(|| not_found_response(id))
    }
}

/// A sandbox whose access token the request carries (RPCs; `/files` may sign instead).
pub struct Authorized(pub Arc<LiveSandbox>);

impl FromRequestParts<Arc<Agents>> for Authorized {
    type Rejection = Response;
    async fn from_request_parts(
        parts: &mut Parts,
        agents: &Arc<Agents>,
    ) -> Result<Self, Self::Rejection> {
        let Addressed(sandbox) = Addressed::from_request_parts(parts, agents).await?;
        if has_token(&parts.headers, &sandbox) {
            Ok(Authorized(sandbox))
        } else {
            Err(unauthorized())
        }
    }
}

pub fn has_token(headers: &HeaderMap, sandbox: &LiveSandbox) -> bool {
    headers
        .get(TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| sandbox.token_matches(t))
}

/// envd's own words for a missing or wrong token (the SDK maps 401 to its auth error).
pub fn unauthorized() -> Response {
    let body = serde_json::json!({
        "code": 401,
        "message": "unauthorized access, please provide a valid access token or method signing if supported",
    });
    (StatusCode::UNAUTHORIZED, Json(body)).into_response()
}

/// A method strata's agent does not serve: Connect's
/// `unimplemented`, naming it, so the SDK raises an error that says what is missing.
async fn unserved(uri: axum::http::Uri) -> Response {
    ConnectError::new(
        Code::Unimplemented,
        format!(
            "{} is not served by strata's sandbox agent yet (ADR 0028 lists what is)",
            uri.path()
        ),
    )
    .into_response()
}

async fn health(Addressed(_): Addressed) -> StatusCode {
    StatusCode::NO_CONTENT
}

async fn envs(Authorized(sandbox): Authorized) -> Json<serde_json::Value> {
    Json(serde_json::json!(sandbox.env_vars))
}

/// The user a request acts as: `Authorization: Basic <user>:` or the template's user.
pub fn user_of(headers: &HeaderMap, sandbox: &LiveSandbox) -> Result<String, ConnectError> {
    Ok(connect::basic_user(headers)?.unwrap_or_else(|| sandbox.default_user.clone()))
}

/// A command that could not start, as envd says it.
pub fn start_error(end: &AgentEnd) -> ConnectError {
    match end {
        AgentEnd::Failed(message) => match StartFailure::decode(message) {
            Some(StartFailure::Workdir { dir, missing, .. }) if missing => ConnectError::new(
                Code::InvalidArgument,
                format!("cwd '{dir}' does not exist"),
            ),
            Some(StartFailure::User { user, .. }) => {
                ConnectError::new(Code::Unauthenticated, format!("invalid username: '{user}'"))
            }
            Some(other) => ConnectError::new(Code::InvalidArgument, other.to_string()),
            None => ConnectError::new(Code::Internal, message.clone()),
        },
        AgentEnd::Lost => ConnectError::new(
            Code::Unavailable,
            "the sandbox's agent went away before the command started; the sandbox may be out of memory or ending",
        ),
        other => ConnectError::new(
            Code::Internal,
            format!("the command ended before it started: {other:?}"),
        ),
    }
}

fn vmm_error(e: crate::vmm::VmmError) -> ConnectError {
    ConnectError::new(
        Code::Unavailable,
        format!("the sandbox is not running: {e}"),
    )
}

/// A stream of one error: how a server stream fails (HTTP 200, end-stream envelope).
pub(super) fn stream_error(e: ConnectError) -> Response {
    connect::stream_response(Body::from(connect::end_stream_error(&e)))
}

/// How often an idle stream says it is alive: `Keepalive-Ping-Interval` seconds, else 90.
pub(super) fn keepalive_interval(headers: &HeaderMap) -> Duration {
    let secs = headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| *s > 0)
        .unwrap_or(90);
    Duration::from_secs(secs)
}

async fn start(Authorized(sandbox): Authorized, headers: HeaderMap, body: Body) -> Response {
    match start_process(sandbox, &headers, body).await {
        Ok(response) => response,
        Err(e) => stream_error(e),
    }
}

async fn start_process(
    sandbox: Arc<LiveSandbox>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ConnectError> {
    let request: StartRequest = connect::read_single_message(body).await?;
    let pty = request.pty.as_ref().map(|p| {
        let size = p.size.unwrap_or(PtySize { cols: 80, rows: 24 });
        (terminal_side(size.cols), terminal_side(size.rows))
    });
    let user = user_of(headers, &sandbox)?;
    let stream = sandbox.streams.open()?;
    if sandbox.processes.running() >= super::budget::MAX_PROCESSES {
        return Err(super::budget::too_many_processes());
    }
    let config = request.process.clone();
    let mut argv = vec![config.cmd.clone()];
    argv.extend(config.args.iter().cloned());
    let spawn = SpawnRequest {
        argv,
        user: Some(user),
        env: config.envs.clone().into_iter().collect(),
        cwd: config.cwd.clone(),
        stdin: request.stdin.unwrap_or(false),
        pty,
    };
    let mut io = sandbox.with(|s| s.spawn(spawn)).map_err(vmm_error)?;
    let pid = io.status.started().await.map_err(|end| start_error(&end))?;
    let (process, following) = sandbox.processes.adopt(pid, config, pty.is_some(), io);
    if let Some(lifetime) = connect::timeout_of(headers) {
        // envd: the request's timeout is the process's lifetime.
        // Weak: a sandbox that ends first is not kept for the rest of the lifetime.
        let (sandbox, process) = (Arc::downgrade(&sandbox), Arc::downgrade(&process));
        tokio::spawn(async move {
            tokio::time::sleep(lifetime).await;
            let (Some(sandbox), Some(process)) = (sandbox.upgrade(), process.upgrade()) else {
                return;
            };
            if !process.has_ended() {
                if let Ok(mut io) = sandbox.with(|s| s.signal(process.pid, libc::SIGKILL)) {
                    let _ = io.status.ended().await;
                }
            }
        });
    }
    let keepalive = keepalive_interval(headers);
    Ok(connect::stream_response(Body::from_stream(process_stream(
        pid, keepalive, following, stream,
    ))))
}

/// The Start stream: `start`, then output and keepalives as they come, then `end` and the
/// end-stream envelope. A stretch the client was too slow for is missed, not fatal. `place`
/// is the stream's place in its sandbox's budget, given back when the stream ends or its
/// client goes.
fn process_stream(
    pid: u32,
    keepalive: Duration,
    following: super::processes::Following,
    place: tokio::sync::OwnedSemaphorePermit,
) -> impl futures::Stream<Item = Result<bytes::Bytes, std::convert::Infallible>> {
    let first = futures::stream::once(async move { connect::message(&ProcessEvent::start(pid)) });
    let rest = futures::stream::unfold(Some((following, place)), move |state| async move {
        let (mut following, place) = state?;
        match tokio::time::timeout(keepalive, following.next()).await {
            Err(_) => Some((
                connect::message(&ProcessEvent::keepalive()),
                Some((following, place)),
            )),
            Ok(Some(event)) if !event.is_end() => {
                Some((connect::message(&event), Some((following, place))))
            }
            Ok(Some(end)) => {
                let mut bytes = connect::message(&end).to_vec();
                bytes.extend_from_slice(&connect::end_stream_ok());
                Some((bytes::Bytes::from(bytes), None))
            }
            Ok(None) => Some((connect::end_stream_ok(), None)),
        }
    });
    first.chain(rest).map(Ok)
}

/// `commands.connect(pid)`: the running process's output from now on, then its end.
async fn connect_process(
    Authorized(sandbox): Authorized,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let result = async {
        let request: ConnectRequest = connect::read_single_message(body).await?;
        let process = process_of(&sandbox, &request.process)?;
        let place = sandbox.streams.open()?;
        Ok(connect::stream_response(Body::from_stream(process_stream(
            process.pid,
            keepalive_interval(&headers),
            process.follow(),
            place,
        ))))
    }
    .await;
    result.unwrap_or_else(stream_error)
}

/// `commands.stream_input`: a client stream of `start{process}`, then stdin chunks, written to
/// the process as they arrive.
async fn stream_input(Authorized(sandbox): Authorized, body: Body) -> Response {
    let result = async {
        let mut decoder = connect::EnvelopeDecoder::new();
        let mut chunks = body.into_data_stream();
        let mut process = None;
        loop {
            while let Some((flag, payload)) = decoder.next()? {
                if flag == connect::FLAG_END_STREAM {
                    continue;
                }
                let event: StreamInputRequest = connect::decode_unary(&payload)?;
                match (event, &process) {
                    (StreamInputRequest::Start { process: selector }, None) => {
                        process = Some(process_of(&sandbox, &selector)?);
                    }
                    (StreamInputRequest::Data { input }, Some(p)) => {
                        let ProcessInput::Stdin(bytes) = input else {
                            return Err(ConnectError::new(
                                Code::InvalidArgument,
                                "this process has no PTY; send stdin",
                            ));
                        };
                        let p: &Arc<super::processes::Process> = p;
                        if !p.write_stdin(&bytes).await.map_err(|e| {
                            ConnectError::new(
                                Code::Internal,
                                format!("writing to process {}: {e}", p.pid),
                            )
                        })? {
                            return Err(ConnectError::new(
                                Code::FailedPrecondition,
                                format!("process {} has no stdin; start it with stdin=True", p.pid),
                            ));
                        }
                    }
                    (StreamInputRequest::Keepalive, _) => {}
                    (StreamInputRequest::Start { .. }, Some(_)) => {
                        return Err(ConnectError::new(
                            Code::InvalidArgument,
                            "the stream has two starts",
                        ))
                    }
                    (StreamInputRequest::Data { .. }, None) => {
                        return Err(ConnectError::new(
                            Code::InvalidArgument,
                            "the stream must begin with start{process}",
                        ))
                    }
                }
            }
            match chunks.next().await {
                Some(Ok(chunk)) => decoder.push(&chunk),
                Some(Err(e)) => {
                    return Err(ConnectError::new(
                        Code::Canceled,
                        format!("reading the stream: {e}"),
                    ))
                }
                None => break,
            }
        }
        decoder.finish()?;
        let mut body = connect::message(&serde_json::json!({})).to_vec();
        body.extend_from_slice(&connect::end_stream_ok());
        Ok(connect::stream_response(Body::from(body)))
    }
    .await;
    result.unwrap_or_else(stream_error)
}

/// A terminal dimension as the kernel takes it (a zero or absurd size is clamped, not refused).
fn terminal_side(n: u32) -> u16 {
    n.clamp(1, 10_000) as u16
}

/// `pty.resize`: the terminal's new size.
async fn update(Authorized(sandbox): Authorized, body: bytes::Bytes) -> Response {
    let result = async {
        let request: UpdateRequest = connect::decode_unary(&body)?;
        let process = process_of(&sandbox, &request.process)?;
        let Some(size) = request.pty.and_then(|p| p.size) else {
            return Ok(serde_json::json!({}));
        };
        match process
            .resize(terminal_side(size.cols), terminal_side(size.rows))
            .await
        {
            Ok(true) => Ok(serde_json::json!({})),
            Ok(false) => Err(ConnectError::new(
                Code::FailedPrecondition,
                format!("process {} has no terminal to resize", process.pid),
            )),
            Err(e) => Err(ConnectError::new(
                Code::Internal,
                format!("resizing the terminal of process {}: {e}", process.pid),
            )),
        }
    }
    .await;
    reply(result)
}

fn pid_of(selector: &ProcessSelector) -> Result<u32, ConnectError> {
    match selector {
        ProcessSelector::Pid(pid) => Ok(*pid),
        ProcessSelector::Tag(tag) => Err(ConnectError::new(
            Code::NotFound,
            format!("no process tagged {tag:?}; address processes by pid"),
        )),
    }
}

fn process_of(
    sandbox: &LiveSandbox,
    selector: &ProcessSelector,
) -> Result<Arc<super::processes::Process>, ConnectError> {
    let pid = pid_of(selector)?;
    sandbox
        .processes
        .get(pid)
        .filter(|p| !p.has_ended())
        .ok_or_else(|| {
            ConnectError::new(Code::NotFound, format!("process with pid {pid} not found"))
        })
}

async fn list(Authorized(sandbox): Authorized) -> Response {
    let processes = sandbox
        .processes
        .list()
        .into_iter()
        .map(|p| ProcessInfo {
            config: p.config.clone(),
            pid: p.pid,
            tag: None,
        })
        .collect();
    connect::unary_response(&ListResponse { processes })
}

async fn send_signal(Authorized(sandbox): Authorized, body: bytes::Bytes) -> Response {
    let result = async {
        let request: SendSignalRequest = connect::decode_unary(&body)?;
        let process = process_of(&sandbox, &request.process)?;
        let signal = match request.signal {
            Signal::Sigkill => libc::SIGKILL,
            Signal::Sigterm => libc::SIGTERM,
            Signal::Unspecified => {
                return Err(ConnectError::new(
                    Code::InvalidArgument,
                    "signal must be SIGNAL_SIGKILL or SIGNAL_SIGTERM",
                ))
            }
        };
        let mut io = sandbox
            .with(|s| s.signal(process.pid, signal))
            .map_err(vmm_error)?;
        match io.status.ended().await {
            AgentEnd::Exited(0) => Ok(serde_json::json!({})),
            other => Err(ConnectError::new(
                Code::Internal,
                format!("signalling process {}: {other:?}", process.pid),
            )),
        }
    }
    .await;
    reply(result)
}

async fn send_input(Authorized(sandbox): Authorized, body: bytes::Bytes) -> Response {
    let result = async {
        let request: SendInputRequest = connect::decode_unary(&body)?;
        let process = process_of(&sandbox, &request.process)?;
        let written = match &request.input {
            ProcessInput::Stdin(b) => process.write_stdin(b).await,
            ProcessInput::Pty(b) => process.write_terminal(b).await,
        };
        match written {
            Ok(true) => Ok(serde_json::json!({})),
            Ok(false) => Err(ConnectError::new(
                Code::FailedPrecondition,
                format!(
                    "process {} takes no such input: start it with stdin=True for stdin, as a \
                     PTY for terminal input (or its stdin was closed)",
                    process.pid
                ),
            )),
            Err(e) => Err(ConnectError::new(
                Code::Internal,
                format!("writing to process {}: {e}", process.pid),
            )),
        }
    }
    .await;
    reply(result)
}

async fn close_stdin(Authorized(sandbox): Authorized, body: bytes::Bytes) -> Response {
    let result = async {
        let request: CloseStdinRequest = connect::decode_unary(&body)?;
        let process = process_of(&sandbox, &request.process)?;
        process.close_stdin().await;
        Ok(serde_json::json!({}))
    }
    .await;
    reply(result)
}

pub fn reply(result: Result<serde_json::Value, ConnectError>) -> Response {
    match result {
        Ok(v) => connect::unary_response(&v),
        Err(e) => e.into_response(),
    }
}
