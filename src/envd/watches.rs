//! envd's directory watches, host side: `WatchDir` streams one watch's changes as they come;
//! `CreateWatcher` keeps a watch whose changes `GetWatcherEvents` drains and `RemoveWatcher`
//! stops.
//!
//! Each watch is one file agent inside the sandbox, as the request's user
//! ([`fs_watch`](crate::vmm::namespace::fs_watch)); its stdin is held here and dropping it
//! ends the agent. A streamed watch ends when its client goes (the response body is dropped), a
//! kept one when it is removed or its sandbox ends.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::HeaderMap;
use axum::response::Response;
use futures::StreamExt;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::net::unix::pipe::{Receiver, Sender};

use super::agent::LiveSandbox;
use super::connect::{self, Code, ConnectError};
use super::messages::{
    CreateWatcherResponse, Empty, FilesystemEvent, GetWatcherEventsResponse, WatchDirRequest,
    WatchDirResponse, WatcherIdRequest,
};
use super::server::{user_of, Authorized};
use crate::vmm::namespace::fs_watch::READY;
use crate::vmm::process::{AgentEnd, FsRequest};

/// Changes a kept watch holds between two `GetWatcherEvents`; older ones are dropped past it
/// (a client that never asks must not grow the node's memory).
const MAX_KEPT_EVENTS: usize = 4096;
/// Kept watches per sandbox.
const MAX_WATCHERS: usize = 64;

/// A watch in place: the agent's stdin (its stop) and its lines.
struct Running {
    _stop: Option<Sender>,
    lines: Lines<BufReader<Receiver>>,
}

impl Running {
    /// The next change, `None` when the watch ended (its directory went, its sandbox ended).
    async fn next(&mut self) -> Option<FilesystemEvent> {
        loop {
            let line = self.lines.next_line().await.ok()??;
            match serde_json::from_str::<FilesystemEvent>(&line) {
                Ok(event) => return Some(event),
                Err(e) => tracing::debug!(error = %e, "an unreadable watch line"),
            }
        }
    }
}

/// Starts a watch and waits until it is in place; a path that is missing or no directory is
/// the agent's refusal, with envd's code.
async fn start(
    sandbox: &LiveSandbox,
    headers: &HeaderMap,
    request: WatchDirRequest,
) -> Result<Running, ConnectError> {
    if request.include_entry {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            "includeEntry needs envd 0.6.3; strata's agent reports names and types only",
        ));
    }
    let user = user_of(headers, sandbox)?;
    let op = FsRequest::Watch {
        path: request.path,
        recursive: request.recursive,
    };
    let io = sandbox.with(|s| s.file_op(op, Some(user))).map_err(|e| {
        ConnectError::new(
            Code::Unavailable,
            format!("the sandbox is not running: {e}"),
        )
    })?;
    let crate::vmm::process::AgentIo {
        stdin,
        stdout,
        stderr: _,
        mut status,
    } = io;
    let mut lines = BufReader::new(stdout).lines();
    match lines.next_line().await {
        Ok(Some(first)) if first == READY => {
            // The status pipe is read to its end so the agent's last word never blocks it.
            tokio::spawn(async move {
                let _ = status.ended().await;
            });
            Ok(Running {
                _stop: stdin,
                lines,
            })
        }
        _ => {
            drop(stdin);
            let end = status.ended().await;
            Err(match end {
                AgentEnd::Exited(0) => {
                    ConnectError::new(Code::Internal, "the watch ended before it started")
                }
                other => super::files::op_error(&other),
            })
        }
    }
}

/// `files.watch_dir` (async SDK): `start`, then each change and keepalives, until the client
/// closes the stream or the watched directory goes.
pub async fn watch_dir(
    Authorized(sandbox): Authorized,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let opened = async {
        let request: WatchDirRequest = connect::read_single_message(body).await?;
        // The stream's place in the sandbox's budget, held for as long as it is open.
        let place = sandbox.streams.open()?;
        Ok::<_, ConnectError>((start(&sandbox, &headers, request).await?, place))
    }
    .await;
    let running = match opened {
        Ok(r) => r,
        Err(e) => return super::server::stream_error(e),
    };
    let keepalive = super::server::keepalive_interval(&headers);
    let first =
        futures::stream::once(async { connect::message(&WatchDirResponse::Start(Empty {})) });
    let rest = futures::stream::unfold(Some(running), move |running| async move {
        let (mut running, place) = running?;
        match tokio::time::timeout(keepalive, running.next()).await {
            Err(_) => Some((
                connect::message(&WatchDirResponse::Keepalive(Empty {})),
                Some((running, place)),
            )),
            Ok(Some(event)) => Some((
                connect::message(&WatchDirResponse::Filesystem(event)),
                Some((running, place)),
            )),
            Ok(None) => Some((connect::end_stream_ok(), None)),
        }
    });
    connect::stream_response(Body::from_stream(
        first.chain(rest).map(Ok::<_, std::convert::Infallible>),
    ))
}

/// A kept watch: its changes since the last drain, filled by a task that owns the agent.
struct Kept {
    events: Arc<Mutex<VecDeque<FilesystemEvent>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Kept {
    fn drop(&mut self) {
        // Ends the task, which drops the agent's stdin: the agent stops.
        self.task.abort();
    }
}

/// One sandbox's kept watches (dropped, and their agents with them, with the sandbox).
#[derive(Default)]
pub struct Watchers {
    next: AtomicU64,
    kept: Mutex<HashMap<String, Arc<Kept>>>,
}

impl Watchers {
    fn get(&self, id: &str) -> Result<Arc<Kept>, ConnectError> {
        self.kept
            .lock()
            .expect("watchers lock")
            .get(id)
            .cloned()
            .ok_or_else(|| {
                ConnectError::new(Code::NotFound, format!("watcher with id {id} not found"))
            })
    }
}

/// `files.watch_dir` (sync SDK): starts a kept watch and answers its id.
pub async fn create_watcher(
    Authorized(sandbox): Authorized,
    headers: HeaderMap,
    body: bytes::Bytes,
) -> Response {
    let result = async {
        let request: WatchDirRequest = connect::decode_unary(&body)?;
        if sandbox.watchers.kept.lock().expect("watchers lock").len() >= MAX_WATCHERS {
            return Err(ConnectError::new(
                Code::ResourceExhausted,
                format!("this sandbox already has {MAX_WATCHERS} watchers; stop one first"),
            ));
        }
        let mut running = start(&sandbox, &headers, request).await?;
        let id = format!(
            "w-{}",
            sandbox.watchers.next.fetch_add(1, Ordering::Relaxed) + 1
        );
        let events = Arc::new(Mutex::new(VecDeque::new()));
        let task = tokio::spawn({
            let events = events.clone();
            async move {
                while let Some(event) = running.next().await {
                    let mut events = events.lock().expect("watch events lock");
                    if events.len() >= MAX_KEPT_EVENTS {
                        events.pop_front();
                    }
                    events.push_back(event);
                }
            }
        });
        let kept = Arc::new(Kept { events, task });
        sandbox
            .watchers
            .kept
            .lock()
            .expect("watchers lock")
            .insert(id.clone(), kept);
        serde_json::to_value(CreateWatcherResponse { watcher_id: id })
            .map_err(|e| ConnectError::new(Code::Internal, e.to_string()))
    }
    .await;
    super::server::reply(result)
}

/// `watch.get_new_events()`: the changes since the last call, then cleared.
pub async fn get_watcher_events(Authorized(sandbox): Authorized, body: bytes::Bytes) -> Response {
    let result = async {
        let request: WatcherIdRequest = connect::decode_unary(&body)?;
        let kept = sandbox.watchers.get(&request.watcher_id)?;
        let events: Vec<_> = kept
            .events
            .lock()
            .expect("watch events lock")
            .drain(..)
            .collect();
        serde_json::to_value(GetWatcherEventsResponse { events })
            .map_err(|e| ConnectError::new(Code::Internal, e.to_string()))
    }
    .await;
    super::server::reply(result)
}

/// `watch.stop()`: stops the watch; its agent ends.
pub async fn remove_watcher(Authorized(sandbox): Authorized, body: bytes::Bytes) -> Response {
    let result = async {
        let request: WatcherIdRequest = connect::decode_unary(&body)?;
        sandbox.watchers.get(&request.watcher_id)?;
        sandbox
            .watchers
            .kept
            .lock()
            .expect("watchers lock")
            .remove(&request.watcher_id);
        Ok(serde_json::json!({}))
    }
    .await;
    super::server::reply(result)
}
