//! `strata sandbox-init`: the first process of a sandbox.
//!
//! The host starts it already inside fresh mount, ipc, uts (and optionally net) namespaces and
//! with a fresh pid namespace for its children. It forks once: the child is pid 1 of the
//! sandbox. Pid 1 makes every mount private, mounts the overlay (new mount API: one
//! `lowerdir+` per layer, so all 500 fit), pivots into it and detaches the host's tree, builds
//! a minimal `/dev`, `/proc`, optionally a tmpfs `/tmp` and a read-only bind of the host's
//! resolv.conf, prints `ready`, and then only reaps zombies and turns SIGTERM/SIGINT/SIGHUP
//! into "kill everything and exit". Every mount lives in the sandbox's own mount namespace and
//! disappears with it. The parent stays outside the pid namespace (but inside every other
//! namespace, the cgroup, and, after pid 1's pivot, the sandbox's root), reports pid 1's host
//! pid (`init-pid N`), forks an [`agent`](super::agent) for each request on the
//! [`control`](super::control) socket, and waits for pid 1, or for the
//! [`lifeline`](super::lifeline) to break, on which it kills pid 1 (and with it the sandbox): a
//! sandbox never outlives the strata process that started it.

use std::ffi::CString;
use std::io::Write;
use std::path::{Path, PathBuf};

use rustix::mount::{
    fsconfig_create, fsconfig_set_flag, fsconfig_set_string, fsmount, fsopen, move_mount,
    open_tree, FsMountFlags, FsOpenFlags, MountAttrFlags, MoveMountFlags, OpenTreeFlags,
};

/// What pid 1 mounts. Paths are host paths, resolved before the pivot.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct InitSpec {
    /// Extracted layer directories, TOP FIRST (overlay's order).
    pub lowers: Vec<PathBuf>,
    pub upper: PathBuf,
    pub work: PathBuf,
    /// The empty directory the overlay is mounted on.
    pub root: PathBuf,
    pub hostname: String,
    /// The text of the `resolv.conf` bound over the image's (the sandbox network's
    /// resolvers); `None` without a network.
    pub resolv_conf: Option<String>,
    pub tmpfs_tmp: bool,
    /// The host ids of the sandbox's users: `/dev` and the tmpfs mounts belong to its root.
    pub ids: crate::vmm::id_range::IdRange,
    /// The system-call filter pid 1 and every agent install ([`super::seccomp`]).
    pub seccomp: Vec<u8>,
}

/// The command that keeps a new user namespace alive until its maps are written and it is
/// opened ([`super::userns`]): it reads standard input to its end and exits.
pub const HOLD_USER_NAMESPACE: &str = "hold-user-namespace";

/// The sources this code was built from (see `build.rs`): the host starts a sandbox with the
/// small [`SMALL_BINARY`] only when it reports the host's own fingerprint.
pub const SOURCE_ID: &str = env!("STRATA_SOURCE_ID");

/// The binary installed beside `strata` that runs only this side of the library.
pub const SMALL_BINARY: &str = "strata-sandbox-init";

/// `… sandbox-init` (run a sandbox, its spec read from stdin) or `… source-id` (print
/// [`SOURCE_ID`]), as both `strata` and [`SMALL_BINARY`] take them; `args` is the whole command
/// line. Returns the exit code.
///
/// The spec comes on stdin, not as an argument, so that the host can start sandbox-init before
/// it knows the spec: a checkpoint starts the next one while it seals the layer that will be
/// one of its lowers (joining the cgroup can wait a whole RCU grace period, ADR 0018).
pub fn main(mut args: impl Iterator<Item = std::ffi::OsString>) -> u8 {
    let command = args.nth(1);
    match command.as_ref().and_then(|c| c.to_str()) {
        Some("sandbox-init") => {
            let mut spec = String::new();
            match std::io::Read::read_to_string(&mut std::io::stdin(), &mut spec) {
                Ok(_) if !spec.is_empty() => run(&spec) as u8,
                // The host went away before it sent a spec (or this was started by hand).
                _ => {
                    eprintln!(
                        "usage: sandbox-init < SPEC-JSON (started by the strata worker, not by hand)"
                    );
                    2
                }
            }
        }
        Some(HOLD_USER_NAMESPACE) => {
            super::userns::hold(args.next().as_ref().and_then(|a| a.to_str()))
        }
        Some("source-id") => {
            println!("{SOURCE_ID}");
            0
        }
        _ => {
            eprintln!("usage: {SMALL_BINARY} sandbox-init < SPEC-JSON | source-id (started by the strata worker)");
            2
        }
    }
}

/// Runs sandbox-init on `spec_json`; returns the exit code.
pub fn run(spec_json: &str) -> i32 {
    let spec: InitSpec = match serde_json::from_str(spec_json) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("sandbox-init: bad spec: {e}");
            return 2;
        }
    };
    // SAFETY: this process is single-threaded (the hidden subcommand runs before any runtime).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        eprintln!("sandbox-init: fork: {}", std::io::Error::last_os_error());
        return 1;
    }
    if pid == 0 {
        let code = match pid1(&spec) {
            Ok(never) => match never {},
            Err(e) => {
                eprintln!("sandbox-init: {e}");
                1
            }
        };
        // SAFETY: leaving the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut out = std::io::stdout();
    let _ = writeln!(out, "init-pid {pid}");
    let _ = out.flush();
    if super::lifeline::inherited() {
        return match supervise(pid, &spec.seccomp) {
            Some(status) if libc::WIFEXITED(status) => libc::WEXITSTATUS(status),
            Some(status) => 128 + libc::WTERMSIG(status),
            // The strata process that started this sandbox is gone; so is the sandbox now.
            None => 128 + libc::SIGKILL,
        };
    }
    loop {
        let mut status = 0;
        // SAFETY: waiting for our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                128 + libc::WTERMSIG(status)
            };
        }
        if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return 1;
        }
    }
}

/// Sandbox-init once pid 1 runs: forks an agent for each request on the control socket and
/// reaps it, until pid 1 exits (returns its wait status) or the lifeline breaks (kills pid 1,
/// reaps it, returns `None`).
/// Terminals one sandbox may hold at once (its devpts instance's `max=`). Without it every
/// sandbox draws on the node's `kernel.pty.max` less the host's reserve, one pool: a sandbox
/// that opened them all left others none (ADR 0034).
pub const MAX_PTYS: u32 = 256;

fn supervise(pid1: libc::pid_t, seccomp: &[u8]) -> Option<libc::c_int> {
    use super::control::{self, CONTROL_FD};
    use super::lifeline::LIFELINE_FD;
    let pidfd_of = |pid: libc::pid_t| {
        // SAFETY: pidfd_open on our own child, which is not yet reaped.
        unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) as libc::c_int }
    };
    let pid1fd = pidfd_of(pid1);
    // SAFETY: fcntl(F_GETFD) only queries the descriptor table.
    let mut control_open = unsafe { libc::fcntl(CONTROL_FD, libc::F_GETFD) } >= 0;
    // Agents still running: host pid and pidfd (-1 if none could be had).
    let mut agents: Vec<(libc::pid_t, libc::c_int)> = Vec::new();
    let watch = |fd: libc::c_int| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        let mut fds = vec![
            watch(LIFELINE_FD),
            watch(pid1fd),
            watch(if control_open { CONTROL_FD } else { -1 }),
        ];
        fds.extend(agents.iter().map(|(_, fd)| watch(*fd)));
        // Without a pidfd, a child's exit is noticed by polling.
        let blind = pid1fd < 0 || agents.iter().any(|(_, fd)| *fd < 0);
        // SAFETY: poll over descriptors we own for the duration of the call (negative ones are
        // ignored).
        let r = unsafe {
            libc::poll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                if blind { 100 } else { -1 },
            )
        };
        if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return super::lifeline::wait_child_or_lifeline(pid1);
        }
        let mut status = 0;
        if fds[0].revents != 0 {
            // Nothing is ever written: readable means end-of-file, the holder is gone. Pid 1's
            // exit waits until every process of its namespace is reaped, and the agents are
            // ours to reap: waiting for pid 1 alone would wait for ever.
            // SAFETY: killing our own child and reaping our own children.
            unsafe {
                libc::kill(pid1, libc::SIGKILL);
                loop {
                    let r = libc::waitpid(-1, &mut status, 0);
                    if r == pid1
                        || (r < 0
                            && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR))
                    {
                        break;
                    }
                }
            }
            return None;
        }
        // SAFETY: non-blocking waits for our own children; closing their pidfds once reaped.
        unsafe {
            if libc::waitpid(pid1, &mut status, libc::WNOHANG) == pid1 {
                return Some(status);
            }
            agents.retain(|&(pid, fd)| {
                let mut s = 0;
                if libc::waitpid(pid, &mut s, libc::WNOHANG) == pid {
                    if fd >= 0 {
                        libc::close(fd);
                    }
                    false
                } else {
                    true
                }
            });
        }
        if control_open && fds[2].revents != 0 {
            match control::receive_request(CONTROL_FD) {
                Ok(Some(request)) => {
                    let mut inherited = vec![LIFELINE_FD, CONTROL_FD, pid1fd];
                    inherited.extend(agents.iter().map(|(_, fd)| *fd));
                    if let Some(pid) = fork_agent(request, &inherited, seccomp) {
                        agents.push((pid, pidfd_of(pid)));
                    }
                }
                Ok(None) => {
                    control_open = false;
                    // SAFETY: closing our end of the control socket; the host closed its end.
                    unsafe { libc::close(CONTROL_FD) };
                }
                Err(e) => {
                    eprintln!("sandbox-init: dropping a control request: {e}");
                    // A malformed request was read whole; any other failure would wake the
                    // poll again at once, so the socket is given up.
                    if e.kind() != std::io::ErrorKind::Other {
                        control_open = false;
                        // SAFETY: as above.
                        unsafe { libc::close(CONTROL_FD) };
                    }
                }
            }
        }
    }
}

/// Forks the agent for one request: its stdin, stdout, stderr and status pipe become its
/// descriptors 0–3, the descriptors in `inherited` (sandbox-init's own) are closed in it.
/// Returns the agent's pid, or `None` when it could not fork (reported on the status pipe).
fn fork_agent(
    request: super::control::Received,
    inherited: &[libc::c_int],
    seccomp: &[u8],
) -> Option<libc::pid_t> {
    use std::os::fd::AsRawFd;
    // SAFETY: sandbox-init is single-threaded.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        let msg = format!("error fork: {}\n", std::io::Error::last_os_error());
        // SAFETY: writing to the request's status pipe, which we hold.
        unsafe { libc::write(request.fds[3].as_raw_fd(), msg.as_ptr().cast(), msg.len()) };
        return None;
    }
    if pid > 0 {
        // The agent holds its copies; ours close here.
        return Some(pid);
    }
    // SAFETY: the child of a single-threaded process, arranging its own descriptors.
    unsafe {
        for &fd in inherited {
            if fd >= 0 {
                libc::close(fd);
            }
        }
        // First above every target number (a received descriptor may sit on 0–3), then onto
        // 0–3; dup2 clears close-on-exec on the targets, the copies above keep it.
        let lifted: Vec<libc::c_int> = request
            .fds
            .iter()
            .map(|fd| libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 16))
            .collect();
        drop(request.fds);
        for (target, &fd) in lifted.iter().enumerate() {
            if fd < 0 || libc::dup2(fd, target as libc::c_int) < 0 {
                libc::_exit(126);
            }
            libc::close(fd);
        }
    }
    std::env::set_var("PATH", "/usr/bin:/bin");
    let code = super::agent::serve(&String::from_utf8_lossy(&request.request), seccomp);
    // SAFETY: ending the agent without running sandbox-init's destructors.
    unsafe { libc::_exit(code) }
}

fn cstr(s: impl AsRef<[u8]>) -> CString {
    CString::new(s.as_ref()).expect("no NUL in sandbox paths")
}

fn check(r: libc::c_int, what: &str) -> Result<(), String> {
    if r < 0 {
        Err(format!("{what}: {}", std::io::Error::last_os_error()))
    } else {
        Ok(())
    }
}

fn mount(
    src: &str,
    target: &str,
    fstype: &str,
    flags: libc::c_ulong,
    data: &str,
) -> Result<(), String> {
    let (s, t, f, d) = (cstr(src), cstr(target), cstr(fstype), cstr(data));
    // SAFETY: valid NUL-terminated strings for mount(2).
    let r = unsafe {
        libc::mount(
            s.as_ptr(),
            t.as_ptr(),
            f.as_ptr(),
            flags,
            if data.is_empty() {
                std::ptr::null()
            } else {
                d.as_ptr().cast()
            },
        )
    };
    check(r, &format!("mounting {fstype} on {target}"))
}

fn ensure_dir(path: &str, mode: u32) -> Result<(), String> {
    if std::fs::symlink_metadata(path).is_err() {
        std::fs::create_dir(path).map_err(|e| format!("creating {path}: {e}"))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| format!("chmod {path}: {e}"))?;
    }
    Ok(())
}

/// A detached mount of one file, `resolv.conf` with `text`, owned by the sandbox's root, on a
/// tmpfs of its own: bound over the image's, it shows no host path in `/proc/self/mountinfo`.
fn resolv_conf_tree(text: &str, root: u32) -> Result<std::os::fd::OwnedFd, String> {
    let err = |what: &'static str| move |e: rustix::io::Errno| format!("resolv.conf {what}: {e}");
    let fs = fsopen("tmpfs", FsOpenFlags::FSOPEN_CLOEXEC).map_err(err("fsopen"))?;
    fsconfig_set_string(&fs, "size", "64k").map_err(err("size"))?;
    fsconfig_create(&fs).map_err(err("create"))?;
    let mnt = fsmount(
        &fs,
        FsMountFlags::FSMOUNT_CLOEXEC,
        MountAttrFlags::MOUNT_ATTR_NOSUID
            | MountAttrFlags::MOUNT_ATTR_NODEV
            | MountAttrFlags::MOUNT_ATTR_NOEXEC,
    )
    .map_err(err("fsmount"))?;
    let file = rustix::fs::openat(
        &mnt,
        "resolv.conf",
        rustix::fs::OFlags::CREATE | rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::from_raw_mode(0o644),
    )
    .map_err(err("create the file"))?;
    let owner = Some(rustix::process::Uid::from_raw(root));
    rustix::fs::fchown(&file, owner, Some(rustix::process::Gid::from_raw(root)))
        .map_err(err("chown"))?;
    std::fs::File::from(file)
        .write_all(text.as_bytes())
        .map_err(|e| format!("resolv.conf write: {e}"))?;
    open_tree(
        &mnt,
        "resolv.conf",
        OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
    )
    .map_err(err("open_tree"))
}

fn mount_overlay(spec: &InitSpec) -> Result<(), String> {
    let err = |what: &str| {
        let what = what.to_string();
        move |e: rustix::io::Errno| format!("overlay {what}: {e}")
    };
    // Each directory goes by a descriptor (`/proc/self/fd/N`), which is what overlay records
    // and `/proc/self/mountinfo` shows: no host path, no sandbox id, the same text for the same
    // stack on every node and in every build.
    let open_dir = |p: &Path| {
        rustix::fs::open(
            p,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| format!("opening {}: {e}", p.display()))
    };
    let by_fd = |fd: &std::os::fd::OwnedFd| {
        use std::os::fd::AsRawFd;
        format!("/proc/self/fd/{}", fd.as_raw_fd())
    };
    let fs = fsopen("overlay", FsOpenFlags::FSOPEN_CLOEXEC).map_err(err("fsopen"))?;
    let mut held = Vec::with_capacity(spec.lowers.len() + 2);
    for lower in &spec.lowers {
        let fd = open_dir(lower)?;
        fsconfig_set_string(&fs, "lowerdir+", by_fd(&fd))
            .map_err(|e| format!("overlay lowerdir+ {}: {e}", lower.display()))?;
        held.push(fd);
    }
    let upper = open_dir(&spec.upper)?;
    fsconfig_set_string(&fs, "upperdir", by_fd(&upper)).map_err(err("upperdir"))?;
    let work = open_dir(&spec.work)?;
    fsconfig_set_string(&fs, "workdir", by_fd(&work)).map_err(err("workdir"))?;
    held.extend([upper, work]);
    // Sealing reads the upper directory as plain files: renamed directories must be copied,
    // not recorded as redirects, and no metadata-only copy-ups.
    for (k, v) in [
        ("redirect_dir", "off"),
        ("index", "off"),
        ("metacopy", "off"),
    ] {
        fsconfig_set_string(&fs, k, v).map_err(err(k))?;
    }
    // No sync of the upper filesystem when the overlay goes: by default unmounting an overlay
    // syncs its whole upper filesystem (the node's data disk, every writer's dirty pages),
    // which made every sandbox teardown and every checkpoint's stop wait for the disk. An
    // upper directory never outlives a crash (the sweep removes it), and a checkpoint syncs
    // the sealed tree itself before the layer cache marks it complete.
    fsconfig_set_flag(&fs, "volatile").map_err(err("volatile"))?;
    fsconfig_create(&fs).map_err(err("create"))?;
    drop(held);
    // No device node of a layer opens (sandbox devices live in the separate `/dev`).
    let mnt = fsmount(
        &fs,
        FsMountFlags::FSMOUNT_CLOEXEC,
        MountAttrFlags::MOUNT_ATTR_NODEV,
    )
    .map_err(err("fsmount"))?;
    move_mount(
        &mnt,
        "",
        rustix::fs::CWD,
        spec.root.as_path(),
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
    .map_err(err("move_mount"))
}

fn pivot(root: &Path) -> Result<(), String> {
    std::env::set_current_dir(root).map_err(|e| format!("chdir to the new root: {e}"))?;
    let dot = cstr(".");
    // SAFETY: pivot_root(".", ".") stacks the old root under the new one; we detach it next.
    let r =
        unsafe { libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) } as libc::c_int;
    check(r, "pivot_root")?;
    // SAFETY: detaching the old root, which sits on top of "." after the pivot.
    check(
        unsafe { libc::umount2(dot.as_ptr(), libc::MNT_DETACH) },
        "detaching the host root",
    )?;
    std::env::set_current_dir("/").map_err(|e| format!("chdir /: {e}"))
}

fn build_dev(root: u32) -> Result<(), String> {
    mount(
        "tmpfs",
        "/dev",
        "tmpfs",
        libc::MS_NOSUID | libc::MS_STRICTATIME,
        &format!("mode=755,size=65536k,uid={root},gid={root}"),
    )?;
    for (name, major, minor) in [
        ("null", 1, 3),
        ("zero", 1, 5),
        ("full", 1, 7),
        ("random", 1, 8),
        ("urandom", 1, 9),
        ("tty", 5, 0),
    ] {
        let p = cstr(format!("/dev/{name}"));
        // SAFETY: mknod(2) on a path in our fresh tmpfs.
        let r = unsafe {
            libc::mknod(
                p.as_ptr(),
                libc::S_IFCHR | 0o666,
                libc::makedev(major, minor),
            )
        };
        check(r, &format!("mknod /dev/{name}"))?;
        // SAFETY: as above; mknod's mode is filtered by the umask.
        check(
            unsafe { libc::chmod(p.as_ptr(), 0o666) },
            &format!("chmod /dev/{name}"),
        )?;
        // SAFETY: as above; the sandbox's root owns its devices, as a container's does.
        check(
            unsafe { libc::chown(p.as_ptr(), root, root) },
            &format!("chown /dev/{name}"),
        )?;
    }
    ensure_dir("/dev/pts", 0o755)?;
    mount(
        "devpts",
        "/dev/pts",
        "devpts",
        libc::MS_NOSUID | libc::MS_NOEXEC,
        &format!(
            "newinstance,ptmxmode=0666,mode=0620,gid={},max={MAX_PTYS}",
            root + 5
        ),
    )?;
    ensure_dir("/dev/shm", 0o1777)?;
    mount(
        "shm",
        "/dev/shm",
        "tmpfs",
        libc::MS_NOSUID | libc::MS_NODEV,
        &format!("mode=1777,size=65536k,uid={root},gid={root}"),
    )?;
    for (link, target) in [
        ("/dev/ptmx", "pts/ptmx"),
        ("/dev/fd", "/proc/self/fd"),
        ("/dev/stdin", "/proc/self/fd/0"),
        ("/dev/stdout", "/proc/self/fd/1"),
        ("/dev/stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(target, link).map_err(|e| format!("symlink {link}: {e}"))?;
    }
    Ok(())
}

/// Kernel interfaces a sandbox may read but not write, and ones it may not read at all (the
/// lists Docker and containerd use). These mounts belong to the host's user namespace: nothing
/// in the sandbox can remove them.
const PROC_READ_ONLY: &[&str] = &[
    "/proc/sys",
    "/proc/sysrq-trigger",
    "/proc/irq",
    "/proc/bus",
    "/proc/fs",
];
const PROC_MASKED: &[&str] = &[
    "/proc/kcore",
    "/proc/keys",
    "/proc/key-users",
    "/proc/timer_list",
    "/proc/sched_debug",
    "/proc/latency_stats",
    "/proc/acpi",
    "/proc/scsi",
];

fn harden_proc() -> Result<(), String> {
    for path in PROC_READ_ONLY {
        if std::fs::symlink_metadata(path).is_err() {
            continue;
        }
        mount(path, path, "", libc::MS_BIND | libc::MS_REC, "")?;
        mount(
            path,
            path,
            "",
            libc::MS_BIND
                | libc::MS_REMOUNT
                | libc::MS_RDONLY
                | libc::MS_NOSUID
                | libc::MS_NODEV
                | libc::MS_NOEXEC,
            "",
        )?;
    }
    for path in PROC_MASKED {
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.is_dir() => mount(
                "tmpfs",
                path,
                "tmpfs",
                libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                "size=0",
            )?,
            Ok(_) => mount("/dev/null", path, "", libc::MS_BIND, "")?,
            Err(_) => {}
        }
    }
    Ok(())
}

fn pid1(spec: &InitSpec) -> Result<std::convert::Infallible, String> {
    // SAFETY: prctl/umask/close on ourselves. sandbox-init is single-threaded, so its death
    // (the lifeline broke, or it was killed) is what the parent-death signal reports.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        libc::umask(0o022);
        libc::close(super::lifeline::LIFELINE_FD);
        libc::close(super::control::CONTROL_FD);
    }
    mount("none", "/", "", libc::MS_REC | libc::MS_PRIVATE, "")?;
    let resolv = match &spec.resolv_conf {
        None => None,
        Some(text) => Some(resolv_conf_tree(text, spec.ids.base())?),
    };
    mount_overlay(spec)?;
    pivot(&spec.root)?;
    let host = cstr(&spec.hostname);
    // SAFETY: sethostname in our own uts namespace.
    check(
        unsafe { libc::sethostname(host.as_ptr(), spec.hostname.len()) },
        "sethostname",
    )?;
    ensure_dir("/proc", 0o555)?;
    ensure_dir("/dev", 0o755)?;
    ensure_dir("/tmp", 0o1777)?;
    mount(
        "proc",
        "/proc",
        "proc",
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        "",
    )?;
    build_dev(spec.ids.base())?;
    harden_proc()?;
    if spec.tmpfs_tmp {
        mount(
            "tmpfs",
            "/tmp",
            "tmpfs",
            libc::MS_NOSUID | libc::MS_NODEV,
            &format!("mode=1777,uid={0},gid={0}", spec.ids.base()),
        )?;
    }
    if let Some(tree) = resolv {
        let is_file = std::fs::symlink_metadata("/etc/resolv.conf")
            .map(|m| m.is_file())
            .unwrap_or(false);
        if is_file {
            move_mount(
                &tree,
                "",
                rustix::fs::CWD,
                "/etc/resolv.conf",
                MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
            )
            .map_err(|e| format!("binding resolv.conf: {e}"))?;
            mount(
                "none",
                "/etc/resolv.conf",
                "",
                libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
                "",
            )?;
        }
    }
    super::confine::enter(&spec.seccomp)?;
    // A change of credentials clears the parent-death signal: set it again.
    // SAFETY: prctl on ourselves.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    let mut out = std::io::stdout();
    writeln!(out, "ready").map_err(|e| e.to_string())?;
    out.flush().map_err(|e| e.to_string())?;
    // SAFETY: replacing our stdio with /dev/null so the host's pipes close.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        for fd in 0..3 {
            libc::dup2(null, fd);
        }
        if null > 2 {
            libc::close(null);
        }
    }
    reap_forever()
}

fn reap_forever() -> ! {
    // SAFETY: signal mask manipulation and waits in a single-threaded pid 1.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGCHLD, libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        loop {
            let sig = libc::sigwaitinfo(&set, std::ptr::null_mut());
            if sig == libc::SIGCHLD || sig < 0 {
                let mut status = 0;
                while libc::waitpid(-1, &mut status, libc::WNOHANG) > 0 {}
            } else {
                libc::kill(-1, libc::SIGKILL);
                libc::_exit(0);
            }
        }
    }
}
