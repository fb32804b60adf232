//! Terminals for a launched sandbox's commands (the SDK's `sandbox.pty`).
//!
//! The agent's worker, already the command's user, opens a pseudo-terminal in the sandbox's own
//! `devpts`, forks the command onto its slave side (a session of its own, the terminal as its
//! controlling tty) and stays as the relay: what the command writes to the terminal goes to the
//! agent's stdout pipe as it is; what comes on the agent's stdin pipe is framed ([`frame`]), so
//! keystrokes and window-size changes share the one pipe. When the command ends, the relay ends
//! the same way (its exit code, or the same signal), so the agent reports what the command did.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Frame kinds on the relay's stdin: bytes for the terminal, or a new size.
pub const INPUT: u8 = 0;
pub const RESIZE: u8 = 1;

/// One frame: kind, big-endian `u32` length, payload.
pub fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + payload.len());
    out.push(kind);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A resize frame's payload: columns, then rows, big-endian `u16`s.
pub fn size_payload(cols: u16, rows: u16) -> [u8; 4] {
    let [c0, c1] = cols.to_be_bytes();
    let [r0, r1] = rows.to_be_bytes();
    [c0, c1, r0, r1]
}

fn set_size(fd: i32, cols: u16, rows: u16) {
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ on a terminal descriptor with a valid winsize.
    unsafe { libc::ioctl(fd, libc::TIOCSWINSZ, &size) };
}

fn os_err(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

/// Opens a terminal of `cols` x `rows`, forks: the child (returned `Ok(None)`) is on the
/// terminal and goes on to exec the command; the parent (`Ok(Some(master))`) relays.
pub fn open_and_fork(cols: u16, rows: u16) -> Result<Option<(OwnedFd, libc::pid_t)>, String> {
    // SAFETY: plain libc calls on descriptors this function owns.
    unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        if master < 0 {
            return Err(os_err("opening a terminal (/dev/ptmx)"));
        }
        let master = OwnedFd::from_raw_fd(master);
        if libc::grantpt(master.as_raw_fd()) != 0 || libc::unlockpt(master.as_raw_fd()) != 0 {
            return Err(os_err("unlocking the terminal"));
        }
        let mut name = [0 as libc::c_char; 128];
        if libc::ptsname_r(master.as_raw_fd(), name.as_mut_ptr(), name.len()) != 0 {
            return Err(os_err("naming the terminal"));
        }
        set_size(master.as_raw_fd(), cols, rows);
        let pid = libc::fork();
        if pid < 0 {
            return Err(os_err("fork"));
        }
        if pid > 0 {
            return Ok(Some((master, pid)));
        }
        drop(master);
        if libc::setsid() < 0 {
            return Err(os_err("a session for the terminal"));
        }
        let slave = libc::open(name.as_ptr(), libc::O_RDWR);
        if slave < 0 {
            return Err(os_err("opening the terminal's slave side"));
        }
        libc::ioctl(slave, libc::TIOCSCTTY, 0);
        for fd in 0..3 {
            if libc::dup2(slave, fd) < 0 {
                return Err(os_err("putting the terminal on stdin, stdout and stderr"));
            }
        }
        if slave > 2 {
            libc::close(slave);
        }
        Ok(None)
    }
}

/// The relay, until the command `child` ends; then ends as it did. Never returns.
pub fn relay(master: OwnedFd, child: libc::pid_t) -> ! {
    let fd = master.as_raw_fd();
    let mut stdout = std::io::stdout().lock();
    let mut stdin = std::io::stdin().lock();
    let mut pending: Vec<u8> = Vec::new();
    let mut input_open = true;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let mut fds = [
            libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: if input_open { 0 } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: poll over two pollfds this function owns.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            break;
        }
        if fds[0].revents != 0 {
            // SAFETY: reading the master into a buffer of its length.
            let got = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
            if got <= 0 {
                // EIO: the command and everything on its terminal closed it.
                break;
            }
            if stdout.write_all(&buf[..got as usize]).is_err() || stdout.flush().is_err() {
                break;
            }
        }
        if input_open && fds[1].revents != 0 {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => input_open = false,
                Ok(got) => {
                    pending.extend_from_slice(&buf[..got]);
                    apply_frames(&mut pending, fd);
                }
            }
        }
    }
    drop(master);
    finish_like(child)
}

/// Applies every whole frame at the front of `pending` to the terminal `fd`.
fn apply_frames(pending: &mut Vec<u8>, fd: i32) {
    while pending.len() >= 5 {
        let len = u32::from_be_bytes([pending[1], pending[2], pending[3], pending[4]]) as usize;
        if pending.len() < 5 + len {
            return;
        }
        let payload = &pending[5..5 + len];
        match pending[0] {
            INPUT => {
                let mut rest = payload;
                while !rest.is_empty() {
                    // SAFETY: writing a slice to the master.
                    let n = unsafe { libc::write(fd, rest.as_ptr().cast(), rest.len()) };
                    if n <= 0 {
                        break;
                    }
                    rest = &rest[n as usize..];
                }
            }
            RESIZE if len == 4 => set_size(
                fd,
                u16::from_be_bytes([payload[0], payload[1]]),
                u16::from_be_bytes([payload[2], payload[3]]),
            ),
            _ => {}
        }
        pending.drain(..5 + len);
    }
}

/// Waits for `child` and ends this process the same way.
fn finish_like(child: libc::pid_t) -> ! {
    let mut status = 0;
    loop {
        // SAFETY: waiting for our own child.
        let r = unsafe { libc::waitpid(child, &mut status, 0) };
        if r == child
            || (r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR))
        {
            break;
        }
    }
    // SAFETY: ending this process, re-raising the command's signal with its default action.
    unsafe {
        if libc::WIFSIGNALED(status) {
            let sig = libc::WTERMSIG(status);
            libc::signal(sig, libc::SIG_DFL);
            libc::kill(libc::getpid(), sig);
        }
        libc::_exit(if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else {
            1
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_carry_input_and_sizes_in_order() {
        let mut wire = frame(INPUT, b"ls\n");
        wire.extend(frame(RESIZE, &size_payload(120, 40)));
        assert_eq!(&wire[..5], &[0, 0, 0, 0, 3]);
        assert_eq!(&wire[8..13], &[1, 0, 0, 0, 4]);
        assert_eq!(&wire[13..], &[0, 120, 0, 40]);
    }
}
