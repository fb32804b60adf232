//! The sandbox backend contract. A backend boots sandboxes on layer stacks; a sandbox runs
//! commands, takes COPY archives, seals checkpoints and is destroyed. The namespace backend
//! implements it today; a VM backend can implement it later without the builder noticing.

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::archive_policy::ArchivePolicy;
use super::error::Result;
use super::layer::LayerRef;
use super::process::{AgentIo, FsRequest, SpawnRequest};
use crate::domain::ids::Digest;

/// Defaults every command inherits unless it overrides them.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct ExecDefaults {
    pub env: Vec<(String, String)>,
    /// A user name or `uid[:gid]`; empty means root.
    pub user: String,
    /// Absolute working directory; `None` means the user's home.
    pub workdir: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum Network {
    /// The node's egress policy: the public internet and its exceptions, DNS, through the
    /// sandbox's own link (ADR 0022). Package installs need it.
    #[default]
    #[serde(alias = "Host")]
    Egress,
    /// Only loopback.
    None,
}

/// Resource limits, enforced by cgroups (CPU, memory, pids) and by the host (timeout).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Limits {
    /// CPU quota in cores (`1.5` = 150 % of one core).
    pub cpus: Option<f64>,
    pub memory_bytes: Option<u64>,
    pub pids: Option<u64>,
    /// Free disk the sandbox must have when it boots (a build's `minFreeDiskMb`); the node's
    /// `STRATA_BUILD_DISK_MAX` bounds what it may write.
    pub disk_min_free: Option<u64>,
    /// The most this sandbox may write, under the node's `STRATA_BUILD_DISK_MAX` (a launched
    /// sandbox's smaller share, so one node runs many); `None`: the node's limit.
    pub disk_max: Option<u64>,
    /// Default per-command timeout.
    pub timeout: Duration,
    pub network: Network,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            cpus: None,
            memory_bytes: None,
            pids: Some(4096),
            disk_min_free: None,
            disk_max: None,
            timeout: Duration::from_secs(3600),
            network: Network::Egress,
        }
    }
}

/// What a sandbox boots on.
#[derive(Debug, Clone)]
pub struct BootSpec {
    /// Layer digests, bottom first.
    pub layers: Vec<Digest>,
    pub context: ExecDefaults,
    pub limits: Limits,
    /// Mount a tmpfs on `/tmp`. Off by default: builds expect `/tmp` to persist across steps
    /// and into checkpoints, as it does under Docker and E2B (see ADR 0003).
    pub tmpfs_tmp: bool,
}

impl BootSpec {
    pub fn new(layers: Vec<Digest>) -> BootSpec {
        BootSpec {
            layers,
            context: ExecDefaults::default(),
            limits: Limits::default(),
            tmpfs_tmp: false,
        }
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub enum CommandLine {
    /// Run through `/bin/sh -c`.
    Shell(String),
    /// Run directly (looked up in the command's PATH).
    Argv(Vec<String>),
}

#[derive(Debug, Clone)]
pub struct ExecRequest {
    pub command: CommandLine,
    /// Overrides the context's user.
    pub user: Option<String>,
    /// Added over the context's env (later wins).
    pub env: Vec<(String, String)>,
    /// Overrides the context's workdir.
    pub cwd: Option<String>,
    /// Overrides the limits' timeout.
    pub timeout: Option<Duration>,
}

impl ExecRequest {
    pub fn shell(cmd: impl Into<String>) -> ExecRequest {
        ExecRequest {
            command: CommandLine::Shell(cmd.into()),
            user: None,
            env: Vec::new(),
            cwd: None,
            timeout: None,
        }
    }
    pub fn user(mut self, user: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self
    }
    pub fn cwd(mut self, cwd: impl Into<String>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }
    pub fn env(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = Some(t);
        self
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum OutputStream {
    Stdout,
    Stderr,
}

/// One line of output (a very long line arrives in chunks of at most 64 KiB).
#[derive(Debug, Clone)]
pub struct OutputLine {
    pub stream: OutputStream,
    pub at: DateTime<Utc>,
    pub line: String,
}

pub use super::output::OutputSink;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecOutcome {
    Exited(i32),
    Signaled(i32),
    /// Killed by the host after the timeout.
    TimedOut,
}

impl ExecOutcome {
    pub fn success(&self) -> bool {
        *self == ExecOutcome::Exited(0)
    }
}

/// A COPY step's arguments (PROTOCOL.md §3.5/§3.7).
#[derive(Debug, Clone)]
pub struct CopyRequest {
    pub src: String,
    pub dest: String,
    pub owner: Option<String>,
    pub mode: Option<String>,
    pub policy: ArchivePolicy,
    /// A directory source whose destination did not exist gives that destination to `owner`
    /// (Docker's `COPY --chown`), not to root (E2B's COPY).
    pub owns_created_dest: bool,
}

impl CopyRequest {
    pub fn new(src: impl Into<String>, dest: impl Into<String>) -> CopyRequest {
        CopyRequest {
            src: src.into(),
            dest: dest.into(),
            owner: None,
            mode: None,
            policy: ArchivePolicy::upload(),
            owns_created_dest: false,
        }
    }
}

#[async_trait]
pub trait SandboxBackend: Send + Sync {
    /// A name and version for the cache fingerprint.
    fn name(&self) -> &'static str;
    /// Why a failed command may have failed for want of a network, when this node gives
    /// sandboxes none (said beside the failure, so a build's author knows where to look).
    fn network_note(&self) -> Option<&'static str> {
        None
    }
    async fn boot(&self, spec: BootSpec) -> Result<Box<dyn Sandbox>>;
    /// Stores layer `digest` in the blob store again from this node's extracted copy, when it
    /// has one (garbage collection deleted the blob while this node still used the layer).
    /// Answers whether the blob is stored now.
    fn republish(&self, digest: &Digest) -> Result<bool> {
        let _ = digest;
        Ok(false)
    }
    /// Releases what the backend holds ahead of need (mounted spare disks), once its process
    /// is done with it: called before the process exits, so nothing is left on the host.
    async fn shutdown(&self) {}
}

#[async_trait]
pub trait Sandbox: Send {
    fn id(&self) -> &str;
    /// The current stack, bottom first (grows with each checkpoint).
    fn layers(&self) -> &[Digest];
    /// The context commands inherit; builders update it on ENV, USER and WORKDIR.
    fn context_mut(&mut self) -> &mut ExecDefaults;
    /// Why a failed command may have failed for want of disk, when the sandbox has used up
    /// what it may write (said beside the failure).
    fn disk_note(&self) -> Option<String> {
        None
    }
    /// Runs a command; every line of output goes to `output` as it arrives. Processes the
    /// command leaves behind are killed when it ends.
    async fn exec(&mut self, request: ExecRequest, output: OutputSink) -> Result<ExecOutcome>;
    /// Copies from a tar (plain or gzip) archive on the host, with COPY semantics.
    async fn copy_in(&mut self, archive: &Path, request: CopyRequest) -> Result<()>;
    /// Creates a user if missing (with passwordless sudo when `sudo` and the image has sudo).
    async fn ensure_user(&mut self, name: &str, sudo: bool) -> Result<()>;
    /// Seals the writable layer into an immutable layer and continues on a fresh one. `None`
    /// when the writable layer holds no change: no layer is added and the stack stays as it was.
    async fn checkpoint(&mut self) -> Result<Option<LayerRef>>;
    /// Starts a process that outlives this call and everything after it but the sandbox's end
    /// (a launched sandbox's commands, [`process`](super::process)). Its status pipe says
    /// `pid N` (inside the sandbox) once it runs, then how it ended.
    fn spawn(&self, request: SpawnRequest) -> Result<AgentIo> {
        let _ = request;
        Err(super::VmmError::Exec(format!(
            "the {} backend cannot start lasting processes",
            "sandbox"
        )))
    }
    /// Runs one file operation inside the sandbox as `user` (`None`: the default user).
    fn file_op(&self, request: FsRequest, user: Option<String>) -> Result<AgentIo> {
        let _ = (request, user);
        Err(super::VmmError::Exec(
            "this sandbox backend serves no file operations".into(),
        ))
    }
    /// Sends `signal` to the process group of `pid` (a pid [`spawn`](Self::spawn) reported).
    fn signal(&self, pid: u32, signal: i32) -> Result<AgentIo> {
        let _ = (pid, signal);
        Err(super::VmmError::Exec(
            "this sandbox backend cannot signal processes".into(),
        ))
    }
    /// What the sandbox uses now (`Sandbox.get_metrics`); `None` when the backend cannot say.
    fn usage(&self) -> Option<Usage> {
        None
    }
    /// A way into the ports the sandbox's processes listen on (host routing).
    fn port_door(&self) -> Result<super::port_door::PortDoor> {
        Err(super::VmmError::Exec(
            "this sandbox backend cannot serve a sandbox's ports".into(),
        ))
    }
    /// Kills everything and removes every trace on the host.
    async fn destroy(self: Box<Self>) -> Result<()>;
}

/// One sample of what a sandbox uses. CPU is cumulative (two samples give a rate); the rest
/// are levels now. A total of 0 means the sandbox has no limit of its own there.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Usage {
    pub cpu_usec: u64,
    /// Its CPU quota in cores (the node's cores when it has none).
    pub cpu_count: f64,
    pub memory_bytes: u64,
    pub memory_cache_bytes: u64,
    pub memory_limit_bytes: u64,
    pub disk_bytes: u64,
    pub disk_limit_bytes: u64,
}
