//! The open-file limit: a node holds descriptors for what its tenants do (four pipes for every
//! process the API follows, sockets for every stream and proxied request, one per extracted
//! layer being written), and systemd starts services with a soft limit of 1024 under a hard
//! limit of 524288. strata raises its soft limit to the hard one when it starts, as Go's
//! runtime does for its programs, and gives sandboxes the limit it was started with, so what a
//! tenant sees does not change with it.

use std::sync::OnceLock;

/// The limit this process started with, once [`raise`] raised it.
static STARTED_WITH: OnceLock<libc::rlimit> = OnceLock::new();

/// Raises the soft open-file limit to the hard one. Returns the limit now in force.
pub fn raise() -> std::io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if limit.rlim_cur >= limit.rlim_max {
        return Ok(limit.rlim_cur);
    }
    let raised = libc::rlimit {
        rlim_cur: limit.rlim_max,
        rlim_max: limit.rlim_max,
    };
    // SAFETY: setrlimit reads one rlimit.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let _ = STARTED_WITH.set(limit);
    Ok(raised.rlim_cur)
}

/// The limit this process started with, if [`raise`] changed it: what its sandboxes get.
pub fn started_with() -> Option<libc::rlimit> {
    STARTED_WITH.get().copied()
}
