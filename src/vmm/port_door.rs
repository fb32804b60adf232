//! How the node reaches a port a process in a sandbox listens on: a TCP connection to the
//! sandbox's own loopback, opened from inside its network namespace.
//!
//! A socket belongs to the network namespace it was made in, so a thread that has joined the
//! sandbox's namespace makes it and connects, and the stream then works from any thread. The
//! thread is a fresh one that ends right after: a pooled thread left in a sandbox's namespace
//! would make the next caller's sockets there. The sandbox reaches nothing of the node this
//! way; only the node opens these connections.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::Duration;

/// A sandbox's network namespace, held to open connections into it.
pub struct PortDoor {
    netns: OwnedFd,
}

impl PortDoor {
    pub fn new(netns: OwnedFd) -> PortDoor {
        PortDoor { netns }
    }

    /// A connection to `port` on the sandbox's loopback; `ConnectionRefused` when nothing
    /// listens there.
    pub fn connect(&self, port: u16, timeout: Duration) -> io::Result<TcpStream> {
        in_network_namespace(self.netns.as_fd(), || {
            TcpStream::connect_timeout(&SocketAddr::from((Ipv4Addr::LOCALHOST, port)), timeout)
        })?
    }
}

/// Runs `f` on a fresh thread that has joined the network namespace `netns`: the sockets it
/// makes are that namespace's. The thread ends with `f`, so no pooled thread is ever left
/// inside a namespace for the next caller.
pub fn in_network_namespace<T: Send>(
    netns: BorrowedFd<'_>,
    f: impl FnOnce() -> T + Send,
) -> io::Result<T> {
    let fd = netns.as_raw_fd();
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("strata-netns".into())
            .spawn_scoped(s, move || {
                // SAFETY: setns on this scoped thread only, which ends with the closure; `fd`
                // is borrowed for the scope.
                if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(f())
            })?
            .join()
            .map_err(|_| io::Error::other("a thread inside a network namespace panicked"))?
    })
}
