//! Processes of a launched sandbox: started by the sandbox's agent, outliving the request that
//! started them, addressed by their pid inside the sandbox.
//!
//! A build step is `exec`: one command, its leftovers killed when it ends. A user's sandbox is
//! different: `commands.run(..., background=True)` leaves a server running while later calls
//! come and go, so [`Sandbox::spawn`](super::Sandbox::spawn) hands back the process's pipes
//! and its status, and nothing is killed when a call ends. The same pipes carry the agent's
//! file operations ([`FsRequest`]) and signals, each one short-lived agent.

use tokio::io::{AsyncBufReadExt, AsyncReadExt};
use tokio::net::unix::pipe::{Receiver, Sender};

pub use super::namespace::fs_ops::{FsError, FsErrorKind, FsRequest};

/// A process to start in a launched sandbox.
#[derive(Debug, Clone, Default)]
pub struct SpawnRequest {
    pub argv: Vec<String>,
    /// A user name or `uid[:gid]`; `None` is the sandbox's default user.
    pub user: Option<String>,
    /// Added over the sandbox's environment (later wins).
    pub env: Vec<(String, String)>,
    /// `None` is the sandbox's working directory, else the user's home.
    pub cwd: Option<String>,
    /// Give the process a pipe on stdin (else `/dev/null`).
    pub stdin: bool,
    /// Run it on a terminal of (columns, rows): its output comes as one stream, its input and
    /// resizes as [`pty`](super::namespace::pty) frames.
    pub pty: Option<(u16, u16)>,
}

/// The host's ends of one agent's pipes.
pub struct AgentIo {
    pub stdin: Option<Sender>,
    pub stdout: Receiver,
    pub stderr: Receiver,
    pub status: AgentStatus,
}

/// The agent's status pipe: `pid N` once a spawned process runs, then its end.
pub struct AgentStatus(tokio::io::BufReader<Receiver>);

impl AgentStatus {
    pub fn new(pipe: Receiver) -> AgentStatus {
        AgentStatus(tokio::io::BufReader::new(pipe))
    }
}

/// How an agent's work ended, from its status pipe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentEnd {
    Exited(i32),
    Signaled(i32),
    /// The request itself failed (unknown user, missing directory, a file operation refused);
    /// the agent's own words.
    Failed(String),
    /// The agent vanished without a word (killed with its sandbox, or by the OOM killer).
    Lost,
}

impl AgentEnd {
    /// The file operation's refusal, when that is what this is.
    pub fn fs_error(&self) -> Option<FsError> {
        match self {
            AgentEnd::Failed(m) => FsError::decode(m),
            _ => None,
        }
    }
}

impl AgentStatus {
    /// The next line on the status pipe, `None` once it closed.
    async fn line(&mut self) -> Option<String> {
        let mut line = String::new();
        match self.0.read_line(&mut line).await {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(line.trim_end().to_owned()),
        }
    }

    /// Waits for a spawned process to report its pid: `Ok(pid)`, or how it ended before it ran
    /// (it could not start).
    pub async fn started(&mut self) -> Result<u32, AgentEnd> {
        match self.line().await {
            Some(l) => match l.strip_prefix("pid ").and_then(|p| p.trim().parse().ok()) {
                Some(pid) => Ok(pid),
                None => Err(end_of(&l).unwrap_or(AgentEnd::Lost)),
            },
            None => Err(AgentEnd::Lost),
        }
    }

    /// Waits for the agent's last word.
    pub async fn ended(&mut self) -> AgentEnd {
        let mut end = AgentEnd::Lost;
        while let Some(l) = self.line().await {
            if let Some(e) = end_of(&l) {
                end = e;
                if matches!(end, AgentEnd::Failed(_)) {
                    break;
                }
            }
        }
        end
    }
}

impl AgentIo {
    /// The first `limit` bytes the agent writes to stdout, then its end (for file operations
    /// and the ready command, whose answers are small; file contents are streamed from `stdout`
    /// instead). What comes past `limit` is read and dropped: an agent left writing into a full
    /// pipe would never end.
    pub async fn output(mut self, limit: usize) -> (Vec<u8>, AgentEnd) {
        drop(self.stdin.take());
        let mut out = Vec::new();
        let mut reader = (&mut self.stdout).take(limit as u64);
        let _ = reader.read_to_end(&mut out).await;
        let _ = tokio::io::copy(&mut self.stdout, &mut tokio::io::sink()).await;
        let end = self.status.ended().await;
        (out, end)
    }
}

fn end_of(line: &str) -> Option<AgentEnd> {
    if let Some(m) = line.strip_prefix("error ") {
        Some(AgentEnd::Failed(m.to_owned()))
    } else if let Some(n) = line.strip_prefix("exit ") {
        Some(AgentEnd::Exited(n.trim().parse().unwrap_or(-1)))
    } else {
        line.strip_prefix("signal ")
            .map(|n| AgentEnd::Signaled(n.trim().parse().unwrap_or(-1)))
    }
}
