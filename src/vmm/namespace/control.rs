//! The control socket: how the host asks a running sandbox for an agent.
//!
//! Starting an agent used to mean forking the (large, multi-threaded) strata process, joining
//! the sandbox's cgroups, entering five namespaces and exec'ing the strata binary again: about
//! as much work as booting the sandbox. Instead, `sandbox-init` (the process outside the pid
//! namespace, already inside every other namespace, the cgroup and the sandbox's root) keeps
//! one end of a socket pair on [`CONTROL_FD`] and forks the agent itself when the host sends
//! a request: no exec, no cgroup write, no setns.
//!
//! A request is one `sendmsg`: a little-endian `u32` length, that many bytes of JSON (an
//! [`AgentRequest`](super::agent::AgentRequest)), and four descriptors as `SCM_RIGHTS`: the
//! agent's stdin, stdout, stderr and status pipe ([`STATUS_FD`](super::agent::STATUS_FD)).
//! Nothing comes back on the socket: the agent reports on its status pipe, as before.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The descriptor number sandbox-init finds its end of the control socket on.
pub const CONTROL_FD: RawFd = 6;

/// Descriptors per request: stdin, stdout, stderr, status.
pub const REQUEST_FDS: usize = 4;

/// Requests larger than this are refused (an argv and environment fit many times over).
const MAX_REQUEST: usize = 64 << 20;

/// Space for the `SCM_RIGHTS` message, as `u64`s so the buffer is aligned for `cmsghdr`.
fn control_space(fds: usize) -> Vec<u64> {
    // SAFETY: CMSG_SPACE only computes a size.
    let bytes = unsafe { libc::CMSG_SPACE((fds * std::mem::size_of::<RawFd>()) as u32) } as usize;
    vec![0u64; bytes.div_ceil(8)]
}

/// Host side: sends `request` (JSON) with the agent's descriptors. The socket is blocking; a
/// request is small and sandbox-init reads it at once.
pub fn send_request(
    socket: &std::os::unix::net::UnixStream,
    request: &[u8],
    fds: &[RawFd; REQUEST_FDS],
) -> io::Result<()> {
    let mut message = Vec::with_capacity(4 + request.len());
    message.extend_from_slice(&(request.len() as u32).to_le_bytes());
    message.extend_from_slice(request);
    let mut control = control_space(REQUEST_FDS);
    let mut iov = libc::iovec {
        iov_base: message.as_ptr() as *mut libc::c_void,
        iov_len: message.len(),
    };
    // SAFETY: a msghdr over buffers that outlive the call; the control buffer is sized by
    // CMSG_SPACE for exactly the descriptors written into it.
    let sent = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = control.len() * 8;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN((REQUEST_FDS * std::mem::size_of::<RawFd>()) as u32) as _;
        std::ptr::copy_nonoverlapping(
            fds.as_ptr(),
            libc::CMSG_DATA(cmsg).cast::<RawFd>(),
            REQUEST_FDS,
        );
        libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    // The descriptors went with the first byte; the rest of a long request follows plainly.
    io::Write::write_all(&mut &*socket, &message[sent as usize..])
}

/// One request as sandbox-init received it.
pub struct Received {
    pub request: Vec<u8>,
    /// stdin, stdout, stderr, status.
    pub fds: Vec<OwnedFd>,
}

/// Sandbox-init side: reads one request from `socket`. `Ok(None)`: the host closed its end.
pub fn receive_request(socket: RawFd) -> io::Result<Option<Received>> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut control = control_space(REQUEST_FDS);
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut fds = Vec::new();
    // SAFETY: recvmsg into buffers that outlive the call; the descriptors it passes are taken
    // into OwnedFds at once, so none leaks.
    let got = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = control.len() * 8;
        let got = loop {
            let got = libc::recvmsg(socket, &mut msg, libc::MSG_CMSG_CLOEXEC);
            if got >= 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                break got;
            }
        };
        if got < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                let n = ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<RawFd>();
                for i in 0..n {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(io::Error::other(
                "a request carried more descriptors than expected",
            ));
        }
        got as usize
    };
    if got == 0 {
        return Ok(None);
    }
    let mut have = buf[..got].to_vec();
    while have.len() < 4 {
        read_more(socket, &mut have, &mut buf)?;
    }
    let len = u32::from_le_bytes(have[..4].try_into().expect("four bytes")) as usize;
    if len > MAX_REQUEST {
        return Err(io::Error::other(format!(
            "a request of {len} bytes is too large"
        )));
    }
    while have.len() < 4 + len {
        read_more(socket, &mut have, &mut buf)?;
    }
    if have.len() != 4 + len || fds.len() != REQUEST_FDS {
        return Err(io::Error::other(format!(
            "a malformed request ({} bytes for {len}, {} descriptors)",
            have.len() - 4,
            fds.len()
        )));
    }
    have.drain(..4);
    Ok(Some(Received { request: have, fds }))
}

fn read_more(socket: RawFd, have: &mut Vec<u8>, buf: &mut [u8]) -> io::Result<()> {
    // SAFETY: read(2) into a buffer we own.
    let n = unsafe { libc::read(socket, buf.as_mut_ptr().cast(), buf.len()) };
    match n {
        0 => Err(io::ErrorKind::UnexpectedEof.into()),
        n if n < 0 => {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                Ok(())
            } else {
                Err(e)
            }
        }
        n => {
            have.extend_from_slice(&buf[..n as usize]);
            Ok(())
        }
    }
}
