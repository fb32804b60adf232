//! cgroup limits for one sandbox: cgroup v2 when the unified hierarchy has the cpu, memory and
//! pids controllers, else v1 (per-controller hierarchies, as on hybrid hosts).
//!
//! Every sandbox gets `strata/<id>` in each hierarchy used. Teardown kills every member
//! (`cgroup.kill` on v2, repeated SIGKILL rounds on v1) and then removes the directories.

use std::fs;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::vmm::backend::Limits;
use crate::vmm::error::{Result, VmmError};

const V2_ROOT: &str = "/sys/fs/cgroup";

#[derive(Debug, Clone)]
pub enum CgroupDriver {
    V2 {
        root: PathBuf,
    },
    V1 {
        memory: Option<PathBuf>,
        pids: Option<PathBuf>,
        cpu: Option<PathBuf>,
        /// The v1 device controller: deny by default (ADR 0021).
        devices: Option<PathBuf>,
    },
}

/// What a sandbox may do with device nodes (v1 `devices.allow` lines after `a` is denied), as
/// Docker's default: make any node (`m`; overlay's whiteouts are 0/0 character devices), open
/// only null, zero, full, random, urandom, tty, ptmx and its own pseudo-terminals.
const DEVICE_ALLOW: &[&str] = &[
    "c *:* m",
    "b *:* m",
    "c 1:3 rwm",
    "c 1:5 rwm",
    "c 1:7 rwm",
    "c 1:8 rwm",
    "c 1:9 rwm",
    "c 5:0 rwm",
    "c 5:2 rwm",
    "c 136:* rwm",
];

fn has_v2_controllers(dir: &Path) -> bool {
    fs::read_to_string(dir.join("cgroup.controllers"))
        .map(|c| {
            let c: Vec<&str> = c.split_whitespace().collect();
            ["cpu", "memory", "pids"].iter().all(|k| c.contains(k))
        })
        .unwrap_or(false)
}

impl CgroupDriver {
    pub fn detect() -> CgroupDriver {
        let root = PathBuf::from(V2_ROOT);
        if has_v2_controllers(&root) {
            return CgroupDriver::V2 { root };
        }
        let v1 = |names: &[&str], probe: &str| {
            names
                .iter()
                .map(|n| root.join(n))
                .find(|p| p.join(probe).exists())
        };
        CgroupDriver::V1 {
            memory: v1(&["memory"], "cgroup.procs"),
            pids: v1(&["pids"], "cgroup.procs"),
            cpu: v1(&["cpu", "cpu,cpuacct"], "cgroup.procs"),
            devices: v1(&["devices"], "devices.deny"),
        }
    }

    /// The cgroup directories of sandbox `id` that exist, as [`create`](Self::create) made
    /// them: for sweeping a sandbox whose owner died.
    pub fn existing(&self, id: &str) -> SandboxCgroup {
        let candidates: Vec<PathBuf> = match self {
            CgroupDriver::V2 { root } => vec![root.join("strata").join(id)],
            // The pids hierarchy first: it is how members are listed.
            CgroupDriver::V1 {
                memory,
                pids,
                cpu,
                devices,
            } => [pids, memory, cpu, devices]
                .into_iter()
                .flatten()
                .map(|h| h.join("strata").join(id))
                .collect(),
        };
        SandboxCgroup {
            dirs: candidates.into_iter().filter(|d| d.is_dir()).collect(),
            v2: matches!(self, CgroupDriver::V2 { .. }),
        }
    }

    /// Creates the sandbox's cgroups and writes its limits.
    pub fn create(&self, id: &str, limits: &Limits) -> Result<SandboxCgroup> {
        let mut cg = SandboxCgroup {
            dirs: Vec::new(),
            v2: matches!(self, CgroupDriver::V2 { .. }),
        };
        let result = self.create_into(&mut cg, id, limits);
        if let Err(e) = result {
            cg.remove();
            return Err(e);
        }
        Ok(cg)
    }

    fn create_into(&self, cg: &mut SandboxCgroup, id: &str, limits: &Limits) -> Result<()> {
        match self {
            CgroupDriver::V2 { root } => {
                let parent = root.join("strata");
                mkdir(&parent)?;
                write(&root.join("cgroup.subtree_control"), "+cpu +memory +pids")?;
                write(&parent.join("cgroup.subtree_control"), "+cpu +memory +pids")?;
                let dir = parent.join(id);
                mkdir(&dir)?;
                cg.dirs.push(dir.clone());
                if let Some(cpus) = limits.cpus {
                    write(
                        &dir.join("cpu.max"),
                        &format!("{} 100000", (cpus * 100000.0) as u64),
                    )?;
                }
                if let Some(m) = limits.memory_bytes {
                    write(&dir.join("memory.max"), &m.to_string())?;
                    let _ = write(&dir.join("memory.swap.max"), "0");
                }
                if let Some(p) = limits.pids {
                    write(&dir.join("pids.max"), &p.to_string())?;
                }
            }
            CgroupDriver::V1 {
                memory,
                pids,
                cpu,
                devices,
            } => {
                let need = |c: &Option<PathBuf>,
                            what: &str,
                            wanted: bool|
                 -> Result<Option<PathBuf>> {
                    match (c, wanted) {
                        (Some(p), _) => Ok(Some(p.join("strata").join(id))),
                        (None, true) => Err(VmmError::Cgroup {
                            path: PathBuf::from(V2_ROOT),
                            message: format!("no {what} controller on cgroup v1 or v2; cannot enforce the {what} limit"),
                        }),
                        (None, false) => Ok(None),
                    }
                };
                // The pids hierarchy is always used when present: it is how members are listed.
                let pids_dir = need(pids, "pids", limits.pids.is_some())?;
                let mem_dir = need(memory, "memory", limits.memory_bytes.is_some())?;
                let cpu_dir = need(cpu, "cpu", limits.cpus.is_some())?;
                let devices_dir = devices.as_ref().map(|p| p.join("strata").join(id));
                for d in [&pids_dir, &mem_dir, &cpu_dir, &devices_dir]
                    .into_iter()
                    .flatten()
                {
                    mkdir(d.parent().unwrap())?;
                    mkdir(d)?;
                    cg.dirs.push(d.clone());
                }
                if let Some(d) = &devices_dir {
                    write(&d.join("devices.deny"), "a")?;
                    for rule in DEVICE_ALLOW {
                        write(&d.join("devices.allow"), rule)?;
                    }
                }
                if let (Some(d), Some(p)) = (&pids_dir, limits.pids) {
                    write(&d.join("pids.max"), &p.to_string())?;
                }
                if let (Some(d), Some(m)) = (&mem_dir, limits.memory_bytes) {
                    write(&d.join("memory.limit_in_bytes"), &m.to_string())?;
                    if d.join("memory.memsw.limit_in_bytes").exists() {
                        let _ = write(&d.join("memory.memsw.limit_in_bytes"), &m.to_string());
                    }
                }
                if let (Some(d), Some(c)) = (&cpu_dir, limits.cpus) {
                    write(&d.join("cpu.cfs_period_us"), "100000")?;
                    write(
                        &d.join("cpu.cfs_quota_us"),
                        &((c * 100000.0) as u64).to_string(),
                    )?;
                }
            }
        }
        Ok(())
    }
}

fn mkdir(p: &Path) -> Result<()> {
    match fs::create_dir(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(VmmError::Cgroup {
            path: p.to_path_buf(),
            message: format!("cannot create: {e} (is strata running as root?)"),
        }),
    }
}

fn write(p: &Path, value: &str) -> Result<()> {
    fs::write(p, value).map_err(|e| VmmError::Cgroup {
        path: p.to_path_buf(),
        message: format!("cannot write {value:?}: {e}"),
    })
}

/// One sandbox's cgroup directories (one on v2, one per controller on v1).
#[derive(Debug)]
pub struct SandboxCgroup {
    dirs: Vec<PathBuf>,
    v2: bool,
}

/// CPU time (µs) `pids` and the children they reaped have used (`/proc/<pid>/stat` fields 14
/// to 17), for a cgroup v1 node whose cpu hierarchy keeps no account.
fn processes_cpu_usec(pids: &[i32]) -> u64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    pids.iter()
        .filter_map(|pid| fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .filter_map(|stat| {
            // The command may hold spaces and parentheses: fields start after the last ')'.
            let rest = &stat[stat.rfind(')')? + 1..];
            let fields: Vec<&str> = rest.split_whitespace().collect();
            // rest starts at field 3 (state); utime is field 14.
            let times = fields.get(11..15)?;
            Some(
                times
                    .iter()
                    .filter_map(|t| t.parse::<u64>().ok())
                    .sum::<u64>(),
            )
        })
        .sum::<u64>()
        * 1_000_000
        / ticks
}

/// What a sandbox's cgroup has used; `None` where the controller is not there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupUsage {
    pub cpu_usec: Option<u64>,
    pub memory_bytes: Option<u64>,
    pub cache_bytes: Option<u64>,
}

impl SandboxCgroup {
    /// The `cgroup.procs` files a new member writes itself into.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.join("cgroup.procs")).collect()
    }

    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// CPU time used so far (µs), memory charged now and the part of it that is page cache,
    /// from whichever controller files this cgroup has (v2 `cpu.stat`, `memory.current`,
    /// `memory.stat`; v1 `cpuacct.usage`, `memory.usage_in_bytes`, `memory.stat`).
    pub fn usage(&self) -> CgroupUsage {
        let read = |name: &str| {
            self.dirs
                .iter()
                .find_map(|d| fs::read_to_string(d.join(name)).ok())
        };
        let field = |text: &str, key: &str| {
            text.lines().find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == key).then(|| v.trim().parse::<u64>().ok()).flatten()
            })
        };
        let number = |name: &str| read(name).and_then(|t| t.trim().parse::<u64>().ok());
        let stat = read("memory.stat").unwrap_or_default();
        if self.v2 {
            CgroupUsage {
                cpu_usec: read("cpu.stat").and_then(|t| field(&t, "usage_usec")),
                memory_bytes: number("memory.current"),
                cache_bytes: field(&stat, "file"),
            }
        } else {
            CgroupUsage {
                // Without a cpuacct hierarchy of its own: what its processes used.
                cpu_usec: number("cpuacct.usage")
                    .map(|ns| ns / 1000)
                    .or_else(|| Some(processes_cpu_usec(&self.members()))),
                memory_bytes: number("memory.usage_in_bytes"),
                cache_bytes: field(&stat, "cache"),
            }
        }
    }

    /// Host pids of every member.
    pub fn members(&self) -> Vec<i32> {
        let Some(dir) = self.dirs.first() else {
            return Vec::new();
        };
        fs::read_to_string(dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// SIGKILLs every member except `keep` and returns once they have exited, waiting on this
    /// thread ([`kill_rounds`]).
    pub fn kill_all_except(&self, keep: &[i32]) {
        futures::executor::block_on(kill_rounds(self, keep, Blocking));
    }

    /// [`Self::kill_all_except`] on the async runtime: each exit is awaited on the runtime's
    /// reactor, and reading the member list of a cgroup does not block.
    pub async fn kill_all_except_async(&self, keep: &[i32]) {
        kill_rounds(self, keep, OnRuntime).await
    }

    /// Kills every member.
    pub fn kill_all(&self) {
        if self.v2 {
            if let Some(d) = self.dirs.first() {
                let _ = fs::write(d.join("cgroup.kill"), "1");
            }
        }
        self.kill_all_except(&[]);
    }

    /// Kills everything and removes the directories; waits for the kernel to release them.
    pub fn remove(&mut self) {
        self.kill_all();
        for d in self.dirs.drain(..) {
            for attempt in 0..2000 {
                match fs::remove_dir(&d) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(e) => {
                        if attempt == 1999 {
                            tracing::error!(path = %d.display(), error = %e, "cannot remove a sandbox cgroup");
                        }
                        // Members may still be exiting; kill again and retry.
                        if let Ok(procs) = fs::read_to_string(d.join("cgroup.procs")) {
                            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                                // SAFETY: as above.
                                unsafe { libc::kill(pid, libc::SIGKILL) };
                            }
                        }
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
            }
        }
    }
}

/// How [`kill_rounds`] waits: blocking its thread (teardown and sweeps, on a blocking thread)
/// or on the async runtime (the cleanup after each command). The rounds are written once; a
/// blocking wait returns a future that is ready when first polled, so running them through
/// `block_on` costs no thread and no runtime.
trait ExitWaits {
    /// Waits until the process behind `pidfd` has exited (true), or `deadline` passes.
    fn exited(
        &self,
        pidfd: OwnedFd,
        deadline: std::time::Instant,
    ) -> impl std::future::Future<Output = bool> + Send;
    fn pause(&self, pause: Duration) -> impl std::future::Future<Output = ()> + Send;
}

struct Blocking;

impl ExitWaits for Blocking {
    async fn exited(&self, pidfd: OwnedFd, deadline: std::time::Instant) -> bool {
        wait_readable(&pidfd, deadline)
    }

    async fn pause(&self, pause: Duration) {
        std::thread::sleep(pause)
    }
}

struct OnRuntime;

impl ExitWaits for OnRuntime {
    async fn exited(&self, pidfd: OwnedFd, deadline: std::time::Instant) -> bool {
        // SAFETY: the AsyncFd owns the pidfd, which stays open and unchanged until it drops.
        let exit = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE)
        };
        match exit {
            Ok(exit) => tokio::time::timeout_at(deadline.into(), exit.readable())
                .await
                .is_ok(),
            Err(_) => {
                // Not registered with the reactor: look at the listing again shortly.
                tokio::time::sleep(Duration::from_micros(100)).await;
                false
            }
        }
    }

    async fn pause(&self, pause: Duration) {
        tokio::time::sleep(pause).await
    }
}

/// SIGKILLs every member of `cgroup` except `keep` and returns once they have exited (a
/// forking process may add members between rounds, so the members are listed again until none
/// is left). A process that survives SIGKILL for 2 s (stuck in the kernel) is logged and left
/// to the cgroup's removal.
///
/// Each victim's exit is awaited on a pidfd, not by listing the cgroup again after a sleep: a
/// sleep of 20 µs returned after hundreds on a busy 2-core machine, and the backoff it needed
/// made the wait a multiple of the exits themselves (ADR 0018). A pid 1's pidfd becomes
/// readable only once every process of its pid namespace is gone. A process that has exited
/// may still be listed for a while (on v1, an orphaned pid 1 until the host's init reaps it):
/// once every victim listed is known to have exited, the listing is looked at again after a
/// pause, instead of in a busy loop. Every victim of a round is signalled before the first
/// exit is awaited, so they die together.
async fn kill_rounds(cgroup: &SandboxCgroup, keep: &[i32], waits: impl ExitWaits) {
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    let mut exited: Vec<i32> = Vec::new();
    let mut pause = Duration::from_micros(20);
    loop {
        let victims: Vec<i32> = cgroup
            .members()
            .into_iter()
            .filter(|p| !keep.contains(p))
            .collect();
        if victims.is_empty() {
            return;
        }
        if std::time::Instant::now() >= deadline {
            tracing::warn!(dirs = ?cgroup.dirs, ?victims, "processes of a sandbox cgroup outlived SIGKILL");
            return;
        }
        if victims.iter().all(|p| exited.contains(p)) {
            waits.pause(pause).await;
            pause = (pause * 2).min(Duration::from_millis(1));
            continue;
        }
        let exits: Vec<(i32, Option<OwnedFd>)> = victims
            .iter()
            .filter(|p| !exited.contains(p))
            .map(|&pid| (pid, kill(pid)))
            .collect();
        for (pid, exit) in exits {
            match exit {
                Some(fd) => {
                    if waits.exited(fd, deadline).await {
                        exited.push(pid);
                    }
                }
                // No pidfd (already reaped, or an old kernel): look again shortly.
                None => waits.pause(Duration::from_micros(50)).await,
            }
        }
    }
}

/// SIGKILLs `pid` (through a pidfd when one can be had, so the process signalled is the one
/// then awaited); returns that pidfd, which becomes readable when the process has exited.
fn kill(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open returns a new descriptor (owned below) or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    if fd < 0 {
        // SAFETY: kill(2) with a pid read from our own cgroup.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        return None;
    }
    // SAFETY: fd was just returned by pidfd_open and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: pidfd_send_signal on the pidfd we hold, without siginfo.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    Some(fd)
}

/// Waits until the process behind `pidfd` has exited (returns true), or `deadline` passes.
fn wait_readable(pidfd: &OwnedFd, deadline: std::time::Instant) -> bool {
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let mut fds = [libc::pollfd {
            fd: pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        // SAFETY: poll over one descriptor we own for the duration of the call.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 1, left.as_millis().min(100) as i32) };
        if r > 0 {
            return true;
        }
        let interrupted =
            r < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted;
        if (r < 0 && !interrupted) || left.is_zero() {
            return false;
        }
    }
}

impl Drop for SandboxCgroup {
    fn drop(&mut self) {
        if !self.dirs.is_empty() {
            self.remove();
        }
    }
}
