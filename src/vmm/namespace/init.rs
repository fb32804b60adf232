//! `strata sandbox-init`: the first process of a sandbox.
//!
//! The host starts it already inside fresh mount, ipc, uts (and optionally net) namespaces and
//! with a fresh pid namespace for its children. It forks once: the child is pid 1 of the
//! sandbox. Pid 1 makes every mount private, mounts the overlay (new mount API: one
//! `lowerdir+` per layer, so all 500 fit), pivots into it and detaches the host's tree, builds
//! a minimal `/dev`, `/proc`, optionally a tmpfs `/tmp` and a read-only bind of the host's
//! resolv.conf, prints `ready`, and then only reaps zombies and turns SIGTERM/SIGINT/SIGHUP
//! into "kill everything and exit". Every mount lives in the sandbox's own mount namespace and
//! disappears with it. The parent stays outside the pid namespace, reports pid 1's host pid
//! (`init-pid N`) and waits for it, or for the [`lifeline`](super::lifeline) to break, on which
//! it kills pid 1 (and with it the sandbox): a sandbox never outlives the strata process that
//! started it.

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
    pub network_none: bool,
    pub tmpfs_tmp: bool,
}

/// Entry point of the hidden subcommand; returns the exit code.
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
        return match super::lifeline::wait_child_or_lifeline(pid) {
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

fn mount_overlay(spec: &InitSpec) -> Result<(), String> {
    let err = |what: &str| {
        let what = what.to_string();
        move |e: rustix::io::Errno| format!("overlay {what}: {e}")
    };
    let fs = fsopen("overlay", FsOpenFlags::FSOPEN_CLOEXEC).map_err(err("fsopen"))?;
    for lower in &spec.lowers {
        fsconfig_set_string(&fs, "lowerdir+", lower.as_path())
            .map_err(|e| format!("overlay lowerdir+ {}: {e}", lower.display()))?;
    }
    fsconfig_set_string(&fs, "upperdir", spec.upper.as_path()).map_err(err("upperdir"))?;
    fsconfig_set_string(&fs, "workdir", spec.work.as_path()).map_err(err("workdir"))?;
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
    let mnt = fsmount(&fs, FsMountFlags::FSMOUNT_CLOEXEC, MountAttrFlags::empty())
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

fn build_dev() -> Result<(), String> {
    mount(
        "tmpfs",
        "/dev",
        "tmpfs",
        libc::MS_NOSUID | libc::MS_STRICTATIME,
        "mode=755,size=65536k",
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
    }
    ensure_dir("/dev/pts", 0o755)?;
    mount(
        "devpts",
        "/dev/pts",
        "devpts",
        libc::MS_NOSUID | libc::MS_NOEXEC,
        "newinstance,ptmxmode=0666,mode=0620",
    )?;
    ensure_dir("/dev/shm", 0o1777)?;
    mount(
        "shm",
        "/dev/shm",
        "tmpfs",
        libc::MS_NOSUID | libc::MS_NODEV,
        "mode=1777,size=65536k",
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

fn loopback_up() -> Result<(), String> {
    // SAFETY: plain socket + ioctl on the loopback interface.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        check(fd, "socket")?;
        let mut req: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo\0".iter().enumerate() {
            req.ifr_name[i] = *b as libc::c_char;
        }
        check(
            libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req),
            "SIOCGIFFLAGS lo",
        )?;
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        check(libc::ioctl(fd, libc::SIOCSIFFLAGS, &req), "SIOCSIFFLAGS lo")?;
        libc::close(fd);
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
    }
    mount("none", "/", "", libc::MS_REC | libc::MS_PRIVATE, "")?;
    let resolv = if spec.network_none {
        None
    } else {
        open_tree(
            rustix::fs::CWD,
            "/etc/resolv.conf",
            OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
        )
        .ok()
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
    build_dev()?;
    if spec.tmpfs_tmp {
        mount(
            "tmpfs",
            "/tmp",
            "tmpfs",
            libc::MS_NOSUID | libc::MS_NODEV,
            "mode=1777",
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
    if spec.network_none {
        loopback_up()?;
    }
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
