//! The processes a launched sandbox's agent started, by pid: what `List`, `SendSignal`,
//! `SendInput` and `Connect` address.
//!
//! Each process has one pump task: it reads stdout and stderr (in chunks of at most 32 KiB, as
//! envd sends them) and hands each chunk to the streams that follow it ([`Fanout`]), each
//! through a queue of [`STREAM_QUEUE`] chunks. A stream whose client keeps up holds its process
//! back (the process waits in its write, as on a terminal); one whose client has not taken a
//! chunk for [`SLOW_READER`] misses output until its queue has room again, so a client that
//! never reads costs the node its queue and no more (issue 46: each process kept 8 MiB for such
//! a client). A stream that closes (the client went away) stops following; the process runs
//! on, as envd's do. The end is kept, so every stream, and a late `Connect`, sees it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, watch};

use super::budget::STREAM_QUEUE;
use super::messages::{EndEvent, ProcessConfig, ProcessEvent};
use crate::vmm::process::{AgentEnd, AgentIo};

const CHUNK: usize = 32 * 1024;
/// How long a stream's full queue holds its process back before the stream misses output.
pub const SLOW_READER: Duration = Duration::from_secs(2);
/// How long output still in the pipes is read after the process ended: a command that left a
/// background child holding its stdout must still end.
const DRAIN_AFTER_END: Duration = Duration::from_millis(200);

pub struct Process {
    pub pid: u32,
    pub config: ProcessConfig,
    /// On a terminal: output is `pty` data, input and resizes go framed to the relay.
    pub pty: bool,
    stdin: tokio::sync::Mutex<Option<tokio::net::unix::pipe::Sender>>,
    output: Fanout,
    end: watch::Sender<Option<EndEvent>>,
}

/// A stream's view of its process: output from when it began to follow, then the end.
pub struct Following {
    output: mpsc::Receiver<ProcessEvent>,
    end: watch::Receiver<Option<EndEvent>>,
}

impl Following {
    /// The next output chunk, or the end once every chunk queued for this stream is taken.
    /// `None` only if the process was dropped without an end (its sandbox went).
    pub async fn next(&mut self) -> Option<ProcessEvent> {
        if let Some(chunk) = self.output.recv().await {
            return Some(chunk);
        }
        let end = self.end.borrow().clone();
        end.map(ProcessEvent::end)
    }
}

impl Process {
    /// Output and the end from now on.
    pub fn follow(&self) -> Following {
        Following {
            output: self.output.subscribe(),
            end: self.end.subscribe(),
        }
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

    /// How many are running.
    pub fn running(&self) -> usize {
        self.processes
            .lock()
            .expect("process table")
            .values()
            .filter(|p| !p.has_ended())
            .count()
    }

    /// Registers a started process and starts its pump. The caller follows it through the
    /// returned [`Following`], made before any output is read, so it misses nothing.
    pub fn adopt(
        self: &Arc<Self>,
        pid: u32,
        config: ProcessConfig,
        pty: bool,
        mut io: AgentIo,
    ) -> (Arc<Process>, Following) {
        let (end, _) = watch::channel(None);
        let process = Arc::new(Process {
            pid,
            config,
            pty,
            stdin: tokio::sync::Mutex::new(io.stdin.take()),
            output: Fanout::default(),
            end,
        });
        let first = process.follow();
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
            let out = tokio::spawn(pump(stdout, pumped.clone(), as_output));
            let err = tokio::spawn(pump(stderr, pumped.clone(), ProcessEvent::stderr));
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
            // The end first: a stream whose queue then runs dry finds it there.
            pumped.end.send_replace(Some(end_event(&ended)));
            pumped.output.close();
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
    process: Arc<Process>,
    event: fn(Vec<u8>) -> ProcessEvent,
) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => process.output.send(event(buf[..n].to_vec())).await,
        }
    }
}

/// A process's output on its way to the streams that follow it, one bounded queue each.
struct Fanout {
    /// `None` once the process ended: a stream that begins then finds only the end.
    streams: Mutex<Option<Vec<Stream>>>,
}

impl Default for Fanout {
    fn default() -> Self {
        Fanout {
            streams: Mutex::new(Some(Vec::new())),
        }
    }
}

struct Stream {
    queue: mpsc::Sender<ProcessEvent>,
    /// Its client took nothing for [`SLOW_READER`]: it misses chunks (instead of holding the
    /// process back) until its queue has room again.
    behind: bool,
}

impl Fanout {
    fn subscribe(&self) -> mpsc::Receiver<ProcessEvent> {
        let (queue, rx) = mpsc::channel(STREAM_QUEUE);
        if let Some(streams) = self.streams.lock().expect("fanout").as_mut() {
            streams.push(Stream {
                queue,
                behind: false,
            });
        }
        rx
    }

    /// Hands `chunk` to every stream: at once to each with room (one lock, no allocation, as a
    /// chunk usually finds), then waits for room in the queue of each that keeps up, for
    /// [`SLOW_READER`] at most; one that is behind and still full gets none.
    async fn send(&self, chunk: ProcessEvent) {
        let mut waiting = Vec::new();
        {
            let mut streams = self.streams.lock().expect("fanout");
            let Some(streams) = streams.as_mut() else {
                return;
            };
            streams.retain_mut(|s| match s.queue.try_send(chunk.clone()) {
                Ok(()) => {
                    s.behind = false;
                    true
                }
                // The client went: it follows no more.
                Err(mpsc::error::TrySendError::Closed(_)) => false,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    if !s.behind {
                        waiting.push(s.queue.clone());
                    }
                    true
                }
            });
        }
        for queue in waiting {
            if let Err(_elapsed) =
                tokio::time::timeout(SLOW_READER, queue.send(chunk.clone())).await
            {
                let mut streams = self.streams.lock().expect("fanout");
                if let Some(s) = streams
                    .iter_mut()
                    .flatten()
                    .find(|s| s.queue.same_channel(&queue))
                {
                    s.behind = true;
                }
            }
            // A send that failed because the client went: the next chunk's `try_send` drops it.
        }
    }

    /// No more output: each stream takes what is queued, then the end.
    fn close(&self) {
        self.streams.lock().expect("fanout").take();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(n: u8) -> ProcessEvent {
        ProcessEvent::stdout(vec![n])
    }

    #[tokio::test]
    async fn a_stream_that_reads_gets_every_chunk_and_holds_the_process_back_meanwhile() {
        let fanout = Arc::new(Fanout::default());
        let mut rx = fanout.subscribe();
        let sender = {
            let fanout = fanout.clone();
            tokio::spawn(async move {
                for n in 0..20u8 {
                    fanout.send(chunk(n)).await;
                }
                fanout.close();
            })
        };
        let mut got = Vec::new();
        while let Some(event) = rx.recv().await {
            got.push(event);
            // A slow reader, but never SLOW_READER slow.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        sender.await.unwrap();
        let want: Vec<_> = (0..20u8).map(chunk).collect();
        assert_eq!(format!("{got:?}"), format!("{want:?}"));
    }

    #[tokio::test]
    async fn a_stream_whose_client_does_not_read_misses_output_and_costs_only_its_queue() {
        let fanout = Fanout::default();
        let mut idle = fanout.subscribe();
        let mut reading = fanout.subscribe();
        let started = tokio::time::Instant::now();
        let reader = tokio::spawn(async move {
            let mut n = 0;
            while reading.recv().await.is_some() {
                n += 1;
            }
            n
        });
        for n in 0..100u8 {
            fanout.send(chunk(n)).await;
        }
        fanout.close();
        // The idle stream held the process back once, for SLOW_READER, then fell behind.
        assert!(
            started.elapsed() < SLOW_READER * 2,
            "{:?}",
            started.elapsed()
        );
        assert_eq!(
            reader.await.unwrap(),
            100,
            "the reading stream missed output"
        );
        let mut kept = Vec::new();
        while let Some(event) = idle.recv().await {
            kept.push(event);
        }
        assert_eq!(
            kept.len(),
            STREAM_QUEUE,
            "the idle stream's queue is all it held"
        );
        // A stream that begins after the end finds only the end.
        assert!(fanout.subscribe().recv().await.is_none());
    }
}
