//! The namespace backend: sandboxes are processes in fresh mount, pid, ipc, uts (and
//! optionally net) namespaces over an overlay of the layer stack, limited by cgroups.
//!
//! * [`init`]: pid 1 of a sandbox (mounts, pivot, reaper).
//! * [`agent`]: runs inside a sandbox for each exec, COPY and user creation.
//! * [`control`]: the socket on which the host asks sandbox-init to fork an agent.
//! * [`cgroup`]: v1/v2 limits and teardown.
//! * [`lifeline`]: sandboxes die with the strata process that started them.
//! * [`owner`], [`sweep`]: which live process owns which sandbox directory, and the removal of
//!   every sandbox whose owner is dead, when a backend starts.
//! * this file: the host side ([`NamespaceBackend`], [`NamespaceSandbox`]).
//!
//! Host layout under the data directory: `sandboxes/<id>/{upper-N,work-N,root}`, with
//! `id = sbx-<owner>-<random>` and the owner's lock `sandboxes/.owner-<owner>.lock`. The overlay
//! is only ever mounted inside the sandbox's mount namespace, so nothing stays mounted on the
//! host once its processes are gone; the processes die with the strata process that started
//! them, and what is left on disk is swept by the next backend started on the data directory
//! (with what their extractions left in `layers/`, [`crate::vmm::layer_staging`]).
//! A checkpoint stops the sandbox, seals `upper-N`, and boots it again on the longer stack with
//! a fresh `upper-N+1`.

pub mod agent;
pub mod cgroup;
pub mod confine;
pub mod control;
pub mod firewall;
pub mod firewall_keeper;
pub mod fs_archive;
pub mod fs_ops;
pub mod fs_watch;
pub mod host_slots;
pub mod init;
pub mod lifeline;
pub mod netlink;
pub mod network;
pub mod outside;
pub mod owner;
pub mod pty;
pub mod scratch;
pub mod seccomp;
pub mod sweep;
pub mod userns;

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use self::agent::AgentRequest;
use self::cgroup::{CgroupDriver, SandboxCgroup};
use self::init::InitSpec;
use self::owner::SandboxOwner;
use super::backend::*;
use super::blob_store::{BlobStore, LocalBlobStore};
use super::copy::CopySpec;
use super::depth::DepthBudget;
use super::error::{Result, VmmError};
use super::id_range::{IdRange, Owners};
use super::layer::{self, LayerCache, LayerRef};
use super::layer_budget::LayerPins;
use super::process::{AgentIo, AgentStatus as SpawnStatus, FsRequest, SpawnRequest};
use crate::domain::ids::Digest;

#[derive(Debug, Clone)]
pub struct NamespaceConfig {
    /// Node data directory: `blobs/`, `layers/`, `sandboxes/`.
    pub data_dir: PathBuf,
    /// The strata binary. Sandboxes start the small [`init::SMALL_BINARY`] beside it when that
    /// was built from the same sources, else this binary as `strata sandbox-init`.
    pub agent_binary: PathBuf,
    pub depth: DepthBudget,
    /// The host ids sandbox users are (ADR 0021).
    pub ids: IdRange,
    /// What sandboxes' networks may reach (ADR 0022).
    pub network: network::NetworkConfig,
    /// How much each sandbox may write, and what the node keeps free (ADR 0023).
    pub disk: scratch::DiskConfig,
}

impl NamespaceConfig {
    /// A node at `data_dir` starting sandboxes with `agent_binary`, with the default depth
    /// budget and sandbox id range.
    pub fn new(data_dir: impl Into<PathBuf>, agent_binary: impl Into<PathBuf>) -> Self {
        NamespaceConfig {
            data_dir: data_dir.into(),
            agent_binary: agent_binary.into(),
            depth: Default::default(),
            ids: Default::default(),
            network: Default::default(),
            disk: Default::default(),
        }
    }
}

struct Shared {
    config: NamespaceConfig,
    /// What a sandbox's first process runs: see [`init_program`].
    init_program: PathBuf,
    blobs: Arc<dyn BlobStore>,
    layers: LayerCache,
    cgroups: CgroupDriver,
    owner: SandboxOwner,
    /// Makes each sandbox's user namespace (ids mapped onto `config.ids`, its own owner).
    userns: userns::UserNamespaces,
    /// The system-call filter every sandbox process installs, as a BPF program.
    seccomp: Arc<Vec<u8>>,
    /// Sandbox network namespaces, links and the firewall's policy.
    networks: network::Networks,
    /// Each sandbox's bounded filesystem for its writes.
    scratch: scratch::ScratchDisks,
}

#[derive(Clone)]
pub struct NamespaceBackend {
    shared: Arc<Shared>,
}

impl NamespaceBackend {
    /// A backend whose blobs are in the node-local store, `<data-dir>/blobs`.
    pub fn new(config: NamespaceConfig) -> Result<NamespaceBackend> {
        let blobs = Arc::new(LocalBlobStore::open(config.data_dir.join("blobs"))?);
        Self::with_blobs(config, blobs)
    }

    /// A backend reading and writing blobs in `blobs` (a shared object store, on a node that
    /// shares nothing else); extracted layers stay node-local under the data directory.
    pub fn with_blobs(
        config: NamespaceConfig,
        blobs: Arc<dyn BlobStore>,
    ) -> Result<NamespaceBackend> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(VmmError::NotRoot);
        }
        private_dirs(&config.data_dir)?;
        ensure_pty_pool();
        let layers = LayerCache::open(config.data_dir.join("layers"), config.ids)?;
        let sandboxes = config.data_dir.join("sandboxes");
        let owner = SandboxOwner::register(&sandboxes)?;
        let cgroups = CgroupDriver::detect();
        sweep::sweep_dead_owners(&sandboxes, &cgroups, owner.id());
        // Extractions of dead processes, beside their sandboxes; a live one's are locked.
        layers.sweep_leftovers();
        let init_program = init_program(&config.agent_binary);
        let userns = userns::UserNamespaces::new(&init_program, config.ids)?;
        let seccomp = Arc::new(seccomp::build()?);
        let networks = network::Networks::start(config.network.clone())?;
        let scratch = scratch::ScratchDisks::open(config.disk, &sandboxes, {
            let owner = owner.id().to_owned();
            Arc::new(move || owner::new_sandbox_id(&owner))
        })?;
        Ok(NamespaceBackend {
            shared: Arc::new(Shared {
                userns,
                seccomp,
                networks,
                scratch,
                init_program,
                config,
                blobs,
                layers,
                cgroups,
                owner,
            }),
        })
    }

    /// The owner id in this backend's sandbox ids (`sbx-<owner>-…`) and lock file.
    pub fn owner_id(&self) -> &str {
        self.shared.owner.id()
    }

    /// The program each sandbox's first process runs (`… sandbox-init < SPEC`).
    pub fn init_program(&self) -> &Path {
        &self.shared.init_program
    }

    /// Where sandbox `id`'s directories live on the host.
    pub fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.shared.config.data_dir.join("sandboxes").join(id)
    }

    pub fn blobs(&self) -> Arc<dyn BlobStore> {
        self.shared.blobs.clone()
    }

    pub fn layers(&self) -> &LayerCache {
        &self.shared.layers
    }

    pub fn cgroup_driver(&self) -> &CgroupDriver {
        &self.shared.cgroups
    }

    /// The lower directories of `stack` (top first), extracted if needed, and pinned in the
    /// layer cache for as long as the sandbox that mounts them holds the pins.
    async fn lowers(&self, stack: &[Digest]) -> Result<(Vec<PathBuf>, LayerPins)> {
        let shared = self.shared.clone();
        let stack = stack.to_vec();
        let pins = self.shared.layers.pin(&stack);
        tokio::task::spawn_blocking(move || {
            let mut dirs = stack
                .iter()
                .map(|d| shared.layers.ensure(shared.blobs.as_ref(), d))
                .collect::<Result<Vec<_>>>()?;
            dirs.reverse();
            Ok((topmost_occurrences(dirs), pins))
        })
        .await
        .expect("layer extraction task")
    }
}

/// The program a sandbox starts as: [`init::SMALL_BINARY`] beside `strata` when it reports the
/// sources this process was built from (asked once, when the backend starts), else `strata`
/// itself. Exec'ing strata relocates the whole service at every boot (in a release build 34k
/// relocations and 257 page faults in the dynamic loader, against 1.2k and 77 for the small
/// binary, which links only the sandbox side; ADR 0018). A `cargo build --bin strata` leaves an older small binary in place: its
/// fingerprint differs, and strata is used.
fn init_program(strata: &Path) -> PathBuf {
    let small = strata.with_file_name(init::SMALL_BINARY);
    let reported = std::process::Command::new(&small)
        .arg("source-id")
        .env_clear()
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output();
    match reported {
        Ok(out)
            if out.status.success() && out.stdout.trim_ascii() == init::SOURCE_ID.as_bytes() =>
        {
            small
        }
        Ok(_) => {
            tracing::warn!(
                path = %small.display(),
                "{} was built from other sources than this strata; sandboxes start strata itself (run `cargo build`)",
                init::SMALL_BINARY
            );
            strata.to_path_buf()
        }
        Err(_) => strata.to_path_buf(),
    }
}

/// The node's terminal pool (`kernel.pty.max`), raised to hold [`PTY_POOL_SANDBOXES`]
/// sandboxes' worth of terminals ([`init::MAX_PTYS`] each) beside the host's reserve: each
/// sandbox's devpts caps its own share, and the pool must not run out before the shares do.
/// A pool an operator set larger is kept; a pty costs memory only while it is open.
fn ensure_pty_pool() {
    let path = "/proc/sys/kernel/pty/max";
    let read = |p: &str| std::fs::read_to_string(p).ok()?.trim().parse::<u64>().ok();
    let (Some(max), Some(reserve)) = (read(path), read("/proc/sys/kernel/pty/reserve")) else {
        return;
    };
    let want = (reserve + PTY_POOL_SANDBOXES * init::MAX_PTYS as u64).min(1 << 20);
    if max >= want {
        return;
    }
    match std::fs::write(path, want.to_string()) {
        Ok(()) => tracing::info!(from = max, to = want, "raised kernel.pty.max so that each sandbox's terminal limit, not the node's, is what a sandbox meets"),
        Err(e) => tracing::warn!(error = %e, max, want, "cannot raise kernel.pty.max; sandboxes together may run the node out of terminals"),
    }
}

/// How many sandboxes' full terminal allowance the node's pool holds.
const PTY_POOL_SANDBOXES: u64 = 1024;

/// The node directories that hold what sandboxes made (setuid files, device-less trees owned
/// by the sandbox id range), made `0700 root` so that no other host account reaches into
/// them; the layer trees and uppers inside are only ever mounted in sandboxes' own mount
/// namespaces.
fn private_dirs(data_dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for name in ["blobs", "layers", "sandboxes", "images"] {
        let dir = data_dir.join(name);
        std::fs::create_dir_all(&dir)
            .and_then(|()| std::os::unix::fs::chown(&dir, Some(0), Some(0)))
            .and_then(|()| std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)))
            .map_err(VmmError::io(format!("making {} private", dir.display())))?;
    }
    Ok(())
}

/// Keeps only the topmost occurrence of each lower directory (`lowers` is top first). Two
/// steps with byte-identical diffs put one layer twice in a stack, and overlayfs refuses a
/// lower directory that appears twice (ELOOP). Dropping the lower occurrence changes nothing
/// visible: every path the layer holds is decided by its upper occurrence, and the lower one
/// holds no other path.
fn topmost_occurrences(lowers: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut seen = std::collections::HashSet::new();
    lowers
        .into_iter()
        .filter(|d| seen.insert(d.clone()))
        .collect()
}

#[async_trait]
impl SandboxBackend for NamespaceBackend {
    /// Unmounts and removes the spare scratch disks and waits for destroyed sandboxes' disks
    /// to be gone: a process calls it before it exits (on a signal or an error too), so it
    /// leaves no mount or loop device behind. Sandboxes still running keep theirs; boots after
    /// it make their disks on demand.
    async fn shutdown(&self) {
        let shared = self.shared.clone();
        let _ = tokio::task::spawn_blocking(move || shared.scratch.close()).await;
    }

    fn name(&self) -> &'static str {
        "namespace-v1"
    }

    fn network_note(&self) -> Option<&'static str> {
        (self.shared.networks.config().policy.mode
            == crate::domain::egress_policy::EgressMode::None)
            .then_some(
                "this node gives build steps no network (STRATA_SANDBOX_EGRESS=none): \
                 package installs and downloads cannot work here",
            )
    }

    /// Seals the cached tree again: sealing is deterministic, so the same tree gives the same
    /// bytes and digest (`layer::tests::sealing_is_deterministic_and_survives_a_round_trip`).
    fn republish(&self, digest: &Digest) -> Result<bool> {
        if self.shared.blobs.intact_size(digest)?.is_some() {
            return Ok(true);
        }
        if !self.shared.layers.contains(digest) {
            return Ok(false);
        }
        let sealed = layer::seal_dir(
            &self.shared.layers.path(digest),
            self.shared.blobs.as_ref(),
            Owners::Mapped(self.shared.layers.ids()),
        )?;
        Ok(&sealed.digest == digest)
    }

    async fn boot(&self, spec: BootSpec) -> Result<Box<dyn Sandbox>> {
        self.shared.config.depth.check(spec.layers.len())?;
        let (lowers, pins) = self.lowers(&spec.layers).await?;
        // The sandbox's id and directory come with its disk (made ahead, when there are spares).
        let (id, dir, disk) = self
            .shared
            .scratch
            .create(spec.limits.disk_min_free, spec.limits.disk_max)?;
        let undo = |disk: Option<scratch::ScratchDisk>| {
            if let Some(d) = disk {
                self.shared.scratch.remove(&id, d);
            }
            let _ = std::fs::remove_dir_all(&dir);
        };
        if let Err(e) = std::fs::create_dir_all(dir.join("root")) {
            undo(disk);
            return Err(VmmError::io("creating the sandbox directory")(e));
        }
        let net = match self
            .shared
            .networks
            .create(spec.limits.network == Network::Egress)
        {
            Ok(n) => n,
            Err(e) => {
                undo(disk);
                return Err(e);
            }
        };
        let backend = self.clone();
        let userns = match tokio::task::spawn_blocking(move || backend.shared.userns.take())
            .await
            .expect("user namespace task")
        {
            Ok(u) => u,
            Err(e) => {
                undo(disk);
                return Err(e);
            }
        };
        let cgroup = match self.shared.cgroups.create(&id, &spec.limits) {
            Ok(c) => c,
            Err(e) => {
                undo(disk);
                return Err(e);
            }
        };
        let mut sandbox = NamespaceSandbox {
            backend: self.clone(),
            id,
            dir,
            layers: spec.layers.clone(),
            context: spec.context.clone(),
            limits: spec.limits.clone(),
            tmpfs_tmp: spec.tmpfs_tmp,
            generation: 0,
            cgroup: Some(cgroup),
            net: Some(net),
            userns: Some(userns),
            disk,
            running: None,
            pins: Some(pins),
        };
        if let Err(e) = sandbox.start(lowers).await {
            sandbox.teardown().await;
            return Err(e);
        }
        let backend = self.clone();
        drop(tokio::task::spawn_blocking(move || {
            backend.shared.userns.refill()
        }));
        Ok(Box::new(sandbox))
    }
}

/// A `sandbox-init` started and waiting on stdin for its spec (see [`NamespaceSandbox::launch`]).
struct Launched {
    child: Child,
    control: std::os::unix::net::UnixStream,
}

/// The init process of a running sandbox.
struct Running {
    child: Child,
    /// The host's end of the control socket: agent requests go to sandbox-init here.
    control: std::os::unix::net::UnixStream,
    /// Host pid of `sandbox-init` (outside the pid namespace).
    outer: i32,
    /// Host pid of the sandbox's pid 1.
    pid1: i32,
}

/// Output a host-side step (a COPY, a user's creation) keeps for its error message.
const ERROR_OUTPUT_BYTES: usize = 64 << 10;

/// Entries a usage walk of a writable layer reads at most.
const USAGE_WALK_ENTRIES: usize = 100_000;

pub struct NamespaceSandbox {
    backend: NamespaceBackend,
    id: String,
    dir: PathBuf,
    layers: Vec<Digest>,
    context: ExecDefaults,
    limits: Limits,
    tmpfs_tmp: bool,
    /// Bumped at each checkpoint: names the current upper and work directories.
    generation: u32,
    cgroup: Option<SandboxCgroup>,
    /// Its network namespace, kept across checkpoints.
    net: Option<network::SandboxNet>,
    /// Its user namespace and the owner uid it holds, kept across checkpoints.
    userns: Option<userns::UserNamespace>,
    /// Where its uppers live, when the node bounds what a sandbox writes.
    disk: Option<scratch::ScratchDisk>,
    running: Option<Running>,
    /// Keeps the mounted layers in the node's cache while the sandbox lives.
    pins: Option<LayerPins>,
}

fn open_fds(paths: &[PathBuf], write: bool) -> Result<Vec<OwnedFd>> {
    paths
        .iter()
        .map(|p| {
            std::fs::OpenOptions::new()
                .read(!write)
                .write(write)
                .open(p)
                .map(OwnedFd::from)
                .map_err(VmmError::io(format!("opening {}", p.display())))
        })
        .collect()
}

/// Makes the upper directory's root, which is the sandbox's `/`, owned by the sandbox's root
/// with the mode of the stack's top layer root (overlay shows the upper's root attributes).
fn upper_root_like(upper: &Path, top: Option<&PathBuf>, ids: IdRange) -> Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let mode = top
        .and_then(|t| std::fs::metadata(t).ok())
        .map(|m| m.mode() & 0o7777)
        .unwrap_or(0o755);
    std::os::unix::fs::chown(upper, Some(ids.base()), Some(ids.base()))
        .and_then(|()| std::fs::set_permissions(upper, std::fs::Permissions::from_mode(mode)))
        .map_err(VmmError::io(format!("preparing {}", upper.display())))
}

/// Kills every process of a sandbox and waits for them to exit: pid 1 and the rest first, then
/// sandbox-init (`outer`), their parent. Killed together, pid 1 could outlive sandbox-init and
/// be left for the host's init to reap, which can be slow (seconds on the machine of ADR 0018),
/// and a v1 cgroup lists it until then; sandbox-init reaps it at once and exits by itself.
fn kill_sandbox(cgroup: &SandboxCgroup, outer: i32) {
    cgroup.kill_all_except(&[outer]);
    cgroup.kill_all();
}

/// Splits a stream into lines (at most 64 KiB each) and sends them with a timestamp. Waits for
/// room in `sink` before it reads on, so a command writes no faster than its output is taken;
/// once nobody reads, the rest is read and dropped (the command is never stuck on its pipe).
async fn pump(mut reader: impl AsyncRead + Unpin, stream: OutputStream, sink: OutputSink) {
    const MAX: usize = 64 * 1024;
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    let mut reading = true;
    let send = |bytes: &[u8]| {
        sink.send(OutputLine {
            stream,
            at: crate::clock::local_now(),
            line: String::from_utf8_lossy(bytes).into_owned(),
        })
    };
    loop {
        let n = match reader.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !reading {
            continue;
        }
        pending.extend_from_slice(&buf[..n]);
        let mut start = 0;
        while let Some(pos) = pending[start..].iter().position(|b| *b == b'\n') {
            reading = reading && send(&pending[start..start + pos]).await;
            start += pos + 1;
        }
        while pending.len() - start >= MAX {
            reading = reading && send(&pending[start..start + MAX]).await;
            start += MAX;
        }
        pending.drain(..start);
    }
    if reading && !pending.is_empty() {
        send(&pending).await;
    }
}

/// The host's ends of an agent's pipes.
struct AgentPipes {
    stdin: Option<tokio::net::unix::pipe::Sender>,
    stdout: tokio::net::unix::pipe::Receiver,
    stderr: tokio::net::unix::pipe::Receiver,
    status: tokio::net::unix::pipe::Receiver,
}

impl AgentPipes {
    fn into_io(self) -> AgentIo {
        AgentIo {
            stdin: self.stdin,
            stdout: self.stdout,
            stderr: self.stderr,
            status: SpawnStatus::new(self.status),
        }
    }
}

enum AgentStatus {
    Exit(i32),
    Signal(i32),
    Error(String),
    Lost,
}

fn parse_status(text: &str) -> AgentStatus {
    let mut status = AgentStatus::Lost;
    for line in text.lines() {
        if let Some(msg) = line.strip_prefix("error ") {
            return AgentStatus::Error(msg.to_string());
        } else if let Some(n) = line.strip_prefix("exit ") {
            status = AgentStatus::Exit(n.trim().parse().unwrap_or(-1));
        } else if let Some(n) = line.strip_prefix("signal ") {
            status = AgentStatus::Signal(n.trim().parse().unwrap_or(-1));
        }
    }
    status
}

impl NamespaceSandbox {
    fn shared(&self) -> &Shared {
        &self.backend.shared
    }

    /// The uppers' filesystem: the scratch disk, else the sandbox's directory.
    fn writable(&self) -> &Path {
        self.disk.as_ref().map_or(&self.dir, |d| d.path())
    }

    fn upper(&self) -> PathBuf {
        self.writable().join(format!("upper-{}", self.generation))
    }

    fn work(&self) -> PathBuf {
        self.writable().join(format!("work-{}", self.generation))
    }

    fn cgroup(&self) -> &SandboxCgroup {
        self.cgroup.as_ref().expect("a live sandbox has a cgroup")
    }

    /// Starts `sandbox-init` on `lowers` (top first) and waits for `ready`.
    async fn start(&mut self, lowers: Vec<PathBuf>) -> Result<()> {
        let launched = self.launch()?;
        self.handshake(launched, lowers).await
    }

    /// Starts `sandbox-init` in the sandbox's cgroup and namespaces, where it waits for its spec.
    /// Returns once it runs: joining a v1 cgroup can wait a whole RCU grace period (ADR 0018),
    /// which a checkpoint spends sealing instead.
    fn launch(&self) -> Result<Launched> {
        let raw_netns = self
            .net
            .as_ref()
            .expect("a live sandbox has a network namespace")
            .netns()
            .as_raw_fd();
        let cgroup_fds = open_fds(&self.cgroup().procs_files(), true)?;
        let raw_cgroup: Vec<i32> = cgroup_fds.iter().map(|f| f.as_raw_fd()).collect();
        let lifeline = lifeline::read_end().map_err(VmmError::io("creating the lifeline pipe"))?;
        let (control, init_control) = std::os::unix::net::UnixStream::pair()
            .map_err(VmmError::io("creating the control socket"))?;
        let raw_control = init_control.as_raw_fd();
        let raw_userns = self
            .userns
            .as_ref()
            .expect("a live sandbox has a user namespace")
            .as_raw_fd();
        // After the cgroup join: the new cgroup namespace is rooted at the sandbox's cgroup, so
        // `/proc/self/cgroup` inside reads `/` and names nothing of the host.
        let flags = libc::CLONE_NEWNS
            | libc::CLONE_NEWPID
            | libc::CLONE_NEWIPC
            | libc::CLONE_NEWUTS
            | libc::CLONE_NEWCGROUP;
        let mut cmd = Command::new(&self.shared().init_program);
        cmd.arg("sandbox-init")
            // The host's root: pid 1's pivot moves sandbox-init's working directory with it.
            .current_dir("/")
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // The open-file limit strata started with, not the one it raised itself to.
        let open_files = crate::open_files::started_with();
        // SAFETY: the hook only makes async-signal-safe syscalls on pre-opened descriptors.
        unsafe {
            cmd.pre_exec(move || {
                if let Some(limit) = &open_files {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                for fd in &raw_cgroup {
                    if libc::write(*fd, b"0".as_ptr().cast(), 1) != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                if libc::setns(raw_netns, libc::CLONE_NEWNET) != 0 || libc::unshare(flags) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // After the cgroup writes: their descriptors may have the target numbers. Each
                // descriptor goes above every target first (close-on-exec), then onto its
                // target (dup2 clears close-on-exec there).
                for (fd, target) in [
                    (lifeline, lifeline::LIFELINE_FD),
                    (raw_control, control::CONTROL_FD),
                    (raw_userns, confine::USERNS_FD),
                ]
                .map(|(fd, target)| (libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 16), target))
                {
                    if fd < 0 || libc::dup2(fd, target) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .map_err(|e| VmmError::Boot(format!("starting sandbox-init: {e}")))?;
        drop((cgroup_fds, init_control));
        Ok(Launched { child, control })
    }

    /// Sends a launched `sandbox-init` its spec on `lowers` (top first) and waits for `ready`.
    async fn handshake(&mut self, launched: Launched, lowers: Vec<PathBuf>) -> Result<()> {
        let Launched { mut child, control } = launched;
        for d in [self.upper(), self.work()] {
            std::fs::create_dir_all(&d)
                .map_err(VmmError::io(format!("creating {}", d.display())))?;
        }
        upper_root_like(&self.upper(), lowers.first(), self.shared().layers.ids())?;
        let spec = InitSpec {
            lowers,
            upper: self.upper(),
            work: self.work(),
            root: self.dir.join("root"),
            hostname: "sandbox".into(),
            resolv_conf: self.net.as_ref().and_then(|n| n.resolv_conf()),
            tmpfs_tmp: self.tmpfs_tmp,
            ids: self.shared().layers.ids(),
            seccomp: self.shared().seccomp.as_ref().clone(),
        };
        let spec_json = serde_json::to_vec(&spec).expect("init spec serializes");
        let mut spec_in = child.stdin.take().expect("piped stdin");
        // A write error means sandbox-init is gone; its stderr says why, below.
        let _ = spec_in.write_all(&spec_json).await;
        drop(spec_in);
        let mut stdout = child.stdout.take().expect("piped stdout");
        let mut stderr = child.stderr.take().expect("piped stderr");
        let handshake = async {
            let mut text = String::new();
            let mut buf = [0u8; 256];
            let (mut pid1, mut ready) = (None, false);
            while !(ready && pid1.is_some()) {
                let n = stdout.read(&mut buf).await.unwrap_or(0);
                if n == 0 {
                    break;
                }
                text.push_str(&String::from_utf8_lossy(&buf[..n]));
                for line in text.lines() {
                    if let Some(p) = line.strip_prefix("init-pid ") {
                        pid1 = p.trim().parse::<i32>().ok();
                    }
                    ready |= line == "ready";
                }
            }
            (pid1, ready)
        };
        let (pid1, ready) = tokio::time::timeout(Duration::from_secs(60), handshake)
            .await
            .unwrap_or_default();
        let outer = child.id().map(|p| p as i32).unwrap_or(0);
        match (pid1, ready) {
            (Some(pid1), true) => {
                tokio::spawn(async move {
                    let mut rest = String::new();
                    let _ = stderr.read_to_string(&mut rest).await;
                    if !rest.trim().is_empty() {
                        tracing::warn!(output = %rest.trim(), "sandbox-init stderr");
                    }
                });
                tokio::spawn(async move {
                    let mut sink = Vec::new();
                    let _ = stdout.read_to_end(&mut sink).await;
                });
                self.running = Some(Running {
                    child,
                    control,
                    outer,
                    pid1,
                });
                Ok(())
            }
            _ => {
                let _ = child.start_kill();
                let mut message = String::new();
                let _ = tokio::time::timeout(
                    Duration::from_secs(5),
                    stderr.read_to_string(&mut message),
                )
                .await;
                let _ = child.wait().await;
                Err(VmmError::Boot(if message.trim().is_empty() {
                    "sandbox-init exited before it was ready".into()
                } else {
                    message.trim().to_string()
                }))
            }
        }
    }

    /// Has sandbox-init fork an agent for `request` (see [`control`]), with fresh pipes for
    /// its output and status and, when `piped_stdin`, for its input.
    fn spawn_agent(&self, request: &AgentRequest, piped_stdin: bool) -> Result<AgentPipes> {
        let running = self
            .running
            .as_ref()
            .ok_or_else(|| VmmError::Exec("the sandbox is not running".into()))?;
        let pipe = || {
            rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
                .map_err(|e| VmmError::io("creating an agent pipe")(e.into()))
        };
        let (stdin_r, stdin_w) = if piped_stdin {
            let (r, w) = pipe()?;
            (r, Some(w))
        } else {
            let null =
                std::fs::File::open("/dev/null").map_err(VmmError::io("opening /dev/null"))?;
            (OwnedFd::from(null), None)
        };
        let (stdout_r, stdout_w) = pipe()?;
        let (stderr_r, stderr_w) = pipe()?;
        let (status_r, status_w) = pipe()?;
        let json = serde_json::to_vec(request).expect("agent request serializes");
        control::send_request(
            &running.control,
            &json,
            &[
                stdin_r.as_raw_fd(),
                stdout_w.as_raw_fd(),
                stderr_w.as_raw_fd(),
                status_w.as_raw_fd(),
            ],
        )
        .map_err(|e| VmmError::Exec(format!("the sandbox is not running (control socket: {e})")))?;
        // The agent holds the other ends now; ours close here, so each pipe ends with it.
        drop((stdin_r, stdout_w, stderr_w, status_w));
        let receiver = |fd: OwnedFd| {
            tokio::net::unix::pipe::Receiver::from_owned_fd(fd)
                .map_err(VmmError::io("reading from the agent"))
        };
        Ok(AgentPipes {
            stdin: stdin_w
                .map(|fd| {
                    tokio::net::unix::pipe::Sender::from_owned_fd(fd)
                        .map_err(VmmError::io("writing to the agent"))
                })
                .transpose()?,
            stdout: receiver(stdout_r)?,
            stderr: receiver(stderr_r)?,
            status: receiver(status_r)?,
        })
    }

    /// Runs an agent request; returns the worker's status and everything it wrote.
    async fn run_agent(
        &mut self,
        request: AgentRequest,
        stdin_file: Option<&Path>,
        timeout: Duration,
        sink: OutputSink,
    ) -> Result<(AgentStatus, bool)> {
        let AgentPipes {
            stdin,
            stdout,
            stderr,
            mut status,
        } = self.spawn_agent(&request, stdin_file.is_some())?;
        let feeder = match (stdin_file, stdin) {
            (Some(path), Some(mut pipe)) => {
                let mut file = tokio::fs::File::open(path)
                    .await
                    .map_err(VmmError::io(format!("opening {}", path.display())))?;
                Some(tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut file, &mut pipe).await;
                    let _ = pipe.shutdown().await;
                }))
            }
            _ => None,
        };
        let out = tokio::spawn(pump(stdout, OutputStream::Stdout, sink.clone()));
        let err = tokio::spawn(pump(stderr, OutputStream::Stderr, sink));
        let mut text = String::new();
        let timed_out = tokio::time::timeout(timeout, status.read_to_string(&mut text))
            .await
            .is_err();
        // The command's leftovers (and, after a timeout, the command itself) do not outlive it.
        let keep = self
            .running
            .as_ref()
            .map(|r| vec![r.outer, r.pid1])
            .unwrap_or_default();
        if let Some(cgroup) = &self.cgroup {
            // Usually the only one listed is the agent of the command that just ended, on its
            // way out (its status pipe closes before it leaves the cgroup).
            cgroup.kill_all_except_async(&keep).await;
        }
        // The agent is sandbox-init's child and reaped there; its status pipe closed as it
        // exited, and the kill above waited for every other process of the command.
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            let _ = out.await;
            let _ = err.await;
        })
        .await;
        if let Some(f) = feeder {
            f.abort();
        }
        Ok((parse_status(&text), timed_out))
    }

    /// Stops every process; the overlay and every other mount go with the mount namespace.
    async fn stop(&mut self) {
        if let Some(mut running) = self.running.take() {
            let cgroup = self.cgroup.take();
            let outer = running.outer;
            let cgroup = tokio::task::spawn_blocking(move || {
                if let Some(c) = &cgroup {
                    kill_sandbox(c, outer);
                }
                cgroup
            })
            .await
            .expect("kill task");
            self.cgroup = cgroup;
            let _ = running.child.start_kill();
            let _ = running.child.wait().await;
        }
    }

    /// Stops every process and removes the cgroup and the directories, in one trip to a
    /// blocking thread: the removal kills every member of the cgroup (sandbox-init included)
    /// and waits for them to exit; sandbox-init is reaped after.
    async fn teardown(&mut self) {
        let running = self.running.take();
        let cgroup = self.cgroup.take();
        let net = self.net.take();
        let userns = self.userns.take();
        let disk = self.disk.take();
        let dir = self.dir.clone();
        let outer = running.as_ref().map(|r| r.outer);
        let backend = self.backend.clone();
        let id = self.id.clone();
        let runtime = tokio::runtime::Handle::current();
        let _ = tokio::task::spawn_blocking(move || {
            if let Some(mut c) = cgroup {
                if let Some(outer) = outer {
                    kill_sandbox(&c, outer);
                }
                c.remove();
            }
            // After its processes: its link is freed once the namespace is gone, and its user
            // namespace's owner once nothing can count against it any more.
            drop(net);
            drop(userns);
            match disk {
                // Unmounting and unlinking the image take about 8 ms, which the destroy does
                // not wait for: nothing runs in the sandbox any more, and its grant counts until
                // the disk is gone. Unmounted before the directory is removed: removing the
                // disk's files one by one would be wasted work.
                Some(d) => {
                    // Its processes are gone: its grant is free now, its disk goes after.
                    backend.shared.scratch.forget(&id);
                    let removal = backend.shared.scratch.removal();
                    drop(runtime.spawn_blocking(move || {
                        backend.shared.scratch.remove(&id, d);
                        let _ = std::fs::remove_dir_all(&dir);
                        drop(removal);
                    }))
                }
                None => {
                    let _ = std::fs::remove_dir_all(&dir);
                }
            }
        })
        .await;
        if let Some(mut running) = running {
            let _ = running.child.start_kill();
            let _ = running.child.wait().await;
        }
    }
}

#[async_trait]
impl Sandbox for NamespaceSandbox {
    fn id(&self) -> &str {
        &self.id
    }

    fn layers(&self) -> &[Digest] {
        &self.layers
    }

    fn context_mut(&mut self) -> &mut ExecDefaults {
        &mut self.context
    }

    fn disk_note(&self) -> Option<String> {
        let disk = self.disk.as_ref().filter(|d| d.is_full())?;
        Some(format!(
            "the build used up its disk: it may write {} in all (STRATA_BUILD_DISK_MAX{})",
            crate::metrics::storage::human_bytes(disk.limit()),
            if disk.trimmed() {
                ", less what this node had free beyond STRATA_NODE_DISK_RESERVE"
            } else {
                ""
            }
        ))
    }

    fn port_door(&self) -> Result<crate::vmm::port_door::PortDoor> {
        let net = self.net.as_ref().ok_or_else(|| {
            VmmError::Exec(format!("sandbox {} has no network namespace", self.id))
        })?;
        let netns = net
            .netns()
            .try_clone_to_owned()
            .map_err(VmmError::io("holding a sandbox's network namespace"))?;
        Ok(crate::vmm::port_door::PortDoor::new(netns))
    }

    fn usage(&self) -> Option<crate::vmm::backend::Usage> {
        let cgroup = self.cgroup.as_ref()?.usage();
        let cores = std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64);
        let disk_limit = self
            .disk
            .as_ref()
            .map(|d| d.limit())
            .or(self.limits.disk_max)
            .unwrap_or(0);
        Some(crate::vmm::backend::Usage {
            cpu_usec: cgroup.cpu_usec.unwrap_or(0),
            cpu_count: self.limits.cpus.unwrap_or(cores),
            memory_bytes: cgroup.memory_bytes.unwrap_or(0),
            memory_cache_bytes: cgroup.cache_bytes.unwrap_or(0),
            memory_limit_bytes: self.limits.memory_bytes.unwrap_or(0),
            // A walk of the writable layer that stops after a bounded number of entries: a
            // tenant's million files must not make every metrics call a full scan on the host.
            disk_bytes: crate::vmm::layer_budget::tree_bytes_bounded(
                &self.upper(),
                USAGE_WALK_ENTRIES,
            ),
            disk_limit_bytes: disk_limit,
        })
    }

    async fn exec(&mut self, request: ExecRequest, output: OutputSink) -> Result<ExecOutcome> {
        let argv = match request.command {
            CommandLine::Shell(cmd) => vec!["/bin/sh".into(), "-c".into(), cmd],
            CommandLine::Argv(a) => a,
        };
        let mut env = self.context.env.clone();
        env.extend(request.env);
        let user = request.user.unwrap_or_else(|| self.context.user.clone());
        let cwd = request.cwd.or_else(|| self.context.workdir.clone());
        let timeout = request.timeout.unwrap_or(self.limits.timeout);
        let (status, timed_out) = self
            .run_agent(
                AgentRequest::Exec {
                    argv,
                    user,
                    env,
                    cwd,
                    report_pid: false,
                    pty: None,
                },
                None,
                timeout,
                output,
            )
            .await?;
        if timed_out {
            return Ok(ExecOutcome::TimedOut);
        }
        match status {
            AgentStatus::Exit(c) => Ok(ExecOutcome::Exited(c)),
            AgentStatus::Signal(s) => Ok(ExecOutcome::Signaled(s)),
            AgentStatus::Error(m) => {
                Err(match crate::vmm::start_failure::StartFailure::decode(&m) {
                    Some(failure) => VmmError::CommandStart(failure),
                    None => VmmError::Exec(m),
                })
            }
            // The agent itself was killed: by the OOM killer or the pids limit, most likely.
            AgentStatus::Lost => Ok(ExecOutcome::Signaled(libc::SIGKILL)),
        }
    }

    fn spawn(&self, request: SpawnRequest) -> Result<AgentIo> {
        let mut env = self.context.env.clone();
        env.extend(request.env);
        let exec = AgentRequest::Exec {
            argv: request.argv,
            user: request.user.unwrap_or_else(|| self.context.user.clone()),
            env,
            cwd: request.cwd.or_else(|| self.context.workdir.clone()),
            report_pid: true,
            pty: request.pty,
        };
        self.spawn_agent(&exec, request.stdin || request.pty.is_some())
            .map(AgentPipes::into_io)
    }

    fn file_op(&self, request: FsRequest, user: Option<String>) -> Result<AgentIo> {
        let fs = AgentRequest::Fs {
            request,
            user: user.unwrap_or_else(|| self.context.user.clone()),
        };
        self.spawn_agent(&fs, true).map(AgentPipes::into_io)
    }

    fn signal(&self, pid: u32, signal: i32) -> Result<AgentIo> {
        self.spawn_agent(&AgentRequest::Signal { pid, signal }, false)
            .map(AgentPipes::into_io)
    }

    async fn copy_in(&mut self, archive: &Path, request: CopyRequest) -> Result<()> {
        let spec = CopySpec {
            src: request.src,
            dest: request.dest,
            owner: request.owner,
            mode: request.mode,
            workdir: self.context.workdir.clone(),
            user: if self.context.user.is_empty() {
                "root".into()
            } else {
                self.context.user.clone()
            },
            policy: request.policy,
            owns_created_dest: request.owns_created_dest,
        };
        let (sink, collecting) = OutputSink::collect(ERROR_OUTPUT_BYTES);
        let (status, timed_out) = self
            .run_agent(
                AgentRequest::Copy(spec),
                Some(archive),
                self.limits.timeout,
                sink,
            )
            .await?;
        let log = collecting.finish().await;
        match (status, timed_out) {
            (_, true) => Err(VmmError::Copy("timed out".into())),
            (AgentStatus::Exit(0), _) => Ok(()),
            (AgentStatus::Error(m), _) => Err(VmmError::Copy(m)),
            (other, _) => Err(VmmError::Copy(format!(
                "the copy process ended abnormally ({}): {}",
                match other {
                    AgentStatus::Exit(c) => format!("exit {c}"),
                    AgentStatus::Signal(s) => format!("signal {s}"),
                    _ => "killed".into(),
                },
                log.joined()
            ))),
        }
    }

    async fn ensure_user(&mut self, name: &str, sudo: bool) -> Result<()> {
        let (sink, collecting) = OutputSink::collect(ERROR_OUTPUT_BYTES);
        let (status, _) = self
            .run_agent(
                AgentRequest::EnsureUser {
                    name: name.to_string(),
                    sudo,
                },
                None,
                self.limits.timeout,
                sink,
            )
            .await?;
        let log = collecting.finish().await;
        match status {
            AgentStatus::Exit(0) => Ok(()),
            AgentStatus::Error(m) => Err(VmmError::User(m)),
            _ => Err(VmmError::User(log.joined())),
        }
    }

    async fn checkpoint(&mut self) -> Result<Option<LayerRef>> {
        let depth = &self.shared().config.depth;
        if self.layers.len() + 1 > depth.overlay_max {
            return Err(VmmError::StackTooDeep {
                depth: self.layers.len() + 1,
                budget: depth.budget(),
                overlay_max: depth.overlay_max,
                reserved: depth.reserved,
            });
        }
        let started = std::time::Instant::now();
        self.stop().await;
        let stopped = started.elapsed();
        let upper = self.upper();
        let work = self.work();
        let shared = self.backend.shared.clone();
        let on_scratch = self.disk.is_some();
        let seal = tokio::task::spawn_blocking(move || {
            let layer = if layer::is_empty_dir(&upper)? {
                let _ = std::fs::remove_dir_all(&upper);
                None
            } else if on_scratch {
                // The sealed upper stays on the scratch disk, counted against the build's limit;
                // the cache's tree (another filesystem) is extracted from the tar as it is
                // written.
                Some(layer::seal_beside_cache(
                    &upper,
                    shared.blobs.as_ref(),
                    &shared.layers,
                )?)
            } else {
                // The sealed upper directory becomes the layer's tree: nothing is extracted.
                Some(layer::seal_into_cache(
                    &upper,
                    shared.blobs.as_ref(),
                    &shared.layers,
                )?)
            };
            let _ = std::fs::remove_dir_all(&work);
            Ok::<_, VmmError>(layer)
        });
        // The next sandbox-init starts while the layer is sealed; a failed seal drops (kills) it.
        let next = self.launch();
        let sealed = seal.await.expect("seal task")?;
        let next = next?;
        if let Some(layer) = &sealed {
            self.layers.push(layer.digest);
        }
        self.generation += 1;
        let sealing = started.elapsed() - stopped;
        let (lowers, pins) = self.backend.lowers(&self.layers).await?;
        self.pins = Some(pins);
        self.handshake(next, lowers).await?;
        tracing::debug!(
            stop_ms = stopped.as_secs_f64() * 1e3,
            seal_ms = sealing.as_secs_f64() * 1e3,
            restart_ms = (started.elapsed() - stopped - sealing).as_secs_f64() * 1e3,
            "checkpoint"
        );
        Ok(sealed)
    }

    async fn destroy(mut self: Box<Self>) -> Result<()> {
        self.teardown().await;
        Ok(())
    }
}

impl Drop for NamespaceSandbox {
    fn drop(&mut self) {
        // Best effort for a sandbox that was never destroyed: the cgroup's own drop kills
        // every member and removes its directories.
        if let Some(mut c) = self.cgroup.take() {
            c.remove();
        }
        if let Some(d) = self.disk.take() {
            self.backend.shared.scratch.remove(&self.id, d);
        }
        if self.dir.exists() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
