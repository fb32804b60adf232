//! The processes a launched sandbox's agent started, by pid: what `List`, `SendSignal`,
//! `SendInput` and `Connect` address.
//!
//! Each process has one pump task: it reads stdout and stderr (in chunks of at most 32 KiB, as
//! envd sends them) and, once the process ended, its end; everything goes out on a broadcast
//! channel to the streams that watch it. A stream that closes (the client went away) stops
//! watching; the process runs on, as envd's do. The end is also kept, so a late `Connect` sees
//! it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::sync::{broadcast, watch};

use super::messages::{EndEvent, ProcessConfig, ProcessEvent};
use crate::vmm::process::{AgentEnd, AgentIo};

/// Output chunks a slow watcher may fall behind by before it misses some (8 MiB at most).
const WATCH_BUFFER: usize = 256;
const CHUNK: usize = 32 * 1024;
/// How long output still in the pipes is read after the process ended: a command that left a
/// background child holding its stdout must still end.
const DRAIN_AFTER_END: Duration = Duration::from_millis(200);

pub struct Process {
    pub pid: u32,
    pub config: ProcessConfig,
    /// On a terminal: output is `pty` data, input and resizes go framed to the relay.
    pub pty: bool,
    stdin: tokio::sync::Mutex<Option<tokio::net::unix::pipe::Sender>>,
    events: broadcast::Sender<ProcessEvent>,
    end: watch::Sender<Option<EndEvent>>,
}

impl Process {
    /// Output and the end from now on.
    pub fn watch(
        &self,
    ) -> (
        broadcast::Receiver<ProcessEvent>,
        watch::Receiver<Option<EndEvent>>,
    ) {
        (self.events.subscribe(), self.end.subscribe())
    }

    pub fn has_ended(&self) -> bool {
        self.end.borrow().is_some()
    }

    /// Writes to the process's stdin; `false` when it has none (started without, or closed,
    /// or on a terminal: see [`write_terminal`](Self::write_terminal)).
    pub async fn write_stdin(&self, bytes: &[u8]) -> std::io::Result<bool> {
        if self.pty {
            return Ok(false);
        }
        self.write_raw(bytes).await
    }

    /// Types `bytes` on the process's terminal; `false` when it has none.
    pub async fn write_terminal(&self, bytes: &[u8]) -> std::io::Result<bool> {
        use crate::vmm::namespace::pty::{frame, INPUT};
        if !self.pty {
            return Ok(false);
        }
        self.write_raw(&frame(INPUT, bytes)).await
    }

    /// Resizes the process's terminal; `false` when it has none.
    pub async fn resize(&self, cols: u16, rows: u16) -> std::io::Result<bool> {
        use crate::vmm::namespace::pty::{frame, size_payload, RESIZE};
        if !self.pty {
            return Ok(false);
        }
        self.write_raw(&frame(RESIZE, &size_payload(cols, rows)))
            .await
    }

    async fn write_raw(&self, bytes: &[u8]) -> std::io::Result<bool> {
        use tokio::io::AsyncWriteExt;
        let mut stdin = self.stdin.lock().await;
        match stdin.as_mut() {
            Some(pipe) => {
                pipe.write_all(bytes).await?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    pub async fn close_stdin(&self) {
        self.stdin.lock().await.take();
    }
}

#[derive(Default)]
pub struct Table {
    processes: Mutex<HashMap<u32, Arc<Process>>>,
}

impl Table {
    pub fn get(&self, pid: u32) -> Option<Arc<Process>> {
        self.processes
            .lock()
            .expect("process table")
            .get(&pid)
            .cloned()
    }

    /// The running ones, by pid.
    pub fn list(&self) -> Vec<Arc<Process>> {
        let mut all: Vec<_> = self
            .processes
            .lock()
            .expect("process table")
            .values()
            .filter(|p| !p.has_ended())
            .cloned()
            .collect();
        all.sort_by_key(|p| p.pid);
        all
    }

    /// Registers a started process and starts its pump. Watchers subscribe through the
    /// returned handle before any output is read, so a caller that watches at once misses
    /// nothing.
    pub fn adopt(
        self: &Arc<Self>,
        pid: u32,
        config: ProcessConfig,
        pty: bool,
        mut io: AgentIo,
    ) -> (Arc<Process>, broadcast::Receiver<ProcessEvent>) {
        let (events, first) = broadcast::channel(WATCH_BUFFER);
        let (end, _) = watch::channel(None);
        let process = Arc::new(Process {
            pid,
            config,
            pty,
            stdin: tokio::sync::Mutex::new(io.stdin.take()),
            events,
            end,
        });
        self.processes
            .lock()
            .expect("process table")
            .insert(pid, process.clone());
        let table = Arc::downgrade(self);
        let pumped = process.clone();
        tokio::spawn(async move {
            let AgentIo {
                stdout,
                stderr,
                mut status,
                ..
            } = io;
            let as_output = if pty {
                ProcessEvent::pty
            } else {
                ProcessEvent::stdout
            };
            let out = tokio::spawn(pump(stdout, pumped.events.clone(), as_output));
            let err = tokio::spawn(pump(stderr, pumped.events.clone(), ProcessEvent::stderr));
            let ended = status.ended().await;
            let (out_abort, err_abort) = (out.abort_handle(), err.abort_handle());
            if tokio::time::timeout(DRAIN_AFTER_END, async {
                let _ = out.await;
                let _ = err.await;
            })
            .await
            .is_err()
            {
                out_abort.abort();
                err_abort.abort();
            }
            let end = end_event(&ended);
            let _ = pumped.events.send(ProcessEvent::end(end.clone()));
            pumped.end.send_replace(Some(end));
            pumped.stdin.lock().await.take();
            if let Some(table) = table.upgrade() {
                table
                    .processes
                    .lock()
                    .expect("process table")
                    .remove(&pumped.pid);
            }
        });
        (process, first)
    }
}

async fn pump(
    mut pipe: tokio::net::unix::pipe::Receiver,
    events: broadcast::Sender<ProcessEvent>,
    event: fn(Vec<u8>) -> ProcessEvent,
) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let _ = events.send(event(buf[..n].to_vec()));
            }
        }
    }
}

/// envd's end event for how the agent said the process ended (Go's `ProcessState` texts).
pub fn end_event(ended: &AgentEnd) -> EndEvent {
    match ended {
        AgentEnd::Exited(code) => EndEvent::exited(*code),
        AgentEnd::Signaled(signal) => EndEvent::signaled(signal_name(*signal)),
        AgentEnd::Failed(message) => EndEvent::failed(message.clone()),
        AgentEnd::Lost => EndEvent::signaled("killed"),
    }
}

/// Go's names for the signals a sandbox's commands usually die of.
fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGKILL => "killed",
        libc::SIGTERM => "terminated",
        libc::SIGINT => "interrupt",
        libc::SIGHUP => "hangup",
        libc::SIGSEGV => "segmentation fault",
        libc::SIGABRT => "aborted",
        libc::SIGPIPE => "broken pipe",
        _ => "signal",
    }
}
