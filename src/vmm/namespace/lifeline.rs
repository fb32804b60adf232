//! The lifeline: how a sandbox learns that the process that started it is gone.
//!
//! Every `sandbox-init` inherits, as [`LIFELINE_FD`], the read end of one pipe whose write end
//! only the strata process holds (close-on-exec, so no other child keeps it). When that process
//! dies, however it dies (`kill -9` included), the kernel closes the write end and every
//! sandbox-init sees end-of-file, kills its pid 1, and so takes the whole sandbox down: pid 1's
//! death kills every process of its pid namespace, and its mounts go with its mount namespace.
//!
//! Why not `PR_SET_PDEATHSIG` on sandbox-init: the signal fires when the *thread* that forked
//! the child exits, not the process, and under tokio that thread is whichever runtime or
//! blocking-pool thread polled the spawn; blocking-pool threads exit after idling. A pipe is
//! owned by the process, so it is immune to that. (Pid 1 does use PDEATHSIG on sandbox-init,
//! which is single-threaded.)

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;

/// The descriptor number sandbox-init finds the lifeline's read end on.
pub const LIFELINE_FD: RawFd = 5;

/// Both ends, created on first use and held for the life of the process.
static LIFELINE: OnceLock<(OwnedFd, OwnedFd)> = OnceLock::new();

/// The read end to hand to a new sandbox-init (via `dup2` onto [`LIFELINE_FD`] between fork
/// and exec). Both ends are close-on-exec here.
pub fn read_end() -> std::io::Result<RawFd> {
    if let Some((read, _)) = LIFELINE.get() {
        return Ok(read.as_raw_fd());
    }
    let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    // A lost race leaves the other thread's pipe in place; ours is closed on drop.
    let (read, _) = LIFELINE.get_or_init(|| (read, write));
    Ok(read.as_raw_fd())
}

/// In sandbox-init: whether the lifeline was handed over (an older or foreign parent may not).
pub fn inherited() -> bool {
    // SAFETY: fcntl(F_GETFD) only queries the descriptor table.
    unsafe { libc::fcntl(LIFELINE_FD, libc::F_GETFD) >= 0 }
}

/// In sandbox-init: waits until `child` exits (returns its wait status) or the lifeline breaks
/// (kills `child` with SIGKILL, reaps it, and returns `None`).
pub fn wait_child_or_lifeline(child: libc::pid_t) -> Option<libc::c_int> {
    // SAFETY: pidfd_open on our own child, which is not yet reaped.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, child, 0) } as libc::c_int;
    let mut fds = [
        libc::pollfd {
            fd: LIFELINE_FD,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: pidfd,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let watched = if pidfd >= 0 { 2 } else { 1 };
    loop {
        // SAFETY: poll over descriptors we own for the duration of the call.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), watched, if pidfd >= 0 { -1 } else { 100 }) };
        if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break;
        }
        if fds[0].revents != 0 {
            // Nothing is ever written: readable means end-of-file, the holder is gone.
            // SAFETY: killing and reaping our own child.
            unsafe {
                libc::kill(child, libc::SIGKILL);
                let mut status = 0;
                libc::waitpid(child, &mut status, 0);
            }
            return None;
        }
        let mut status = 0;
        // SAFETY: a non-blocking wait for our own child.
        let done = unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) };
        if done == child {
            return Some(status);
        }
        if done < 0 {
            break;
        }
    }
    // Polling failed: fall back to a plain wait.
    let mut status = 0;
    // SAFETY: waiting for our own child.
    while unsafe { libc::waitpid(child, &mut status, 0) } < 0 {
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return Some(0);
        }
    }
    Some(status)
}
