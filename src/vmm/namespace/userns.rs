//! The user namespace of a backend's sandboxes: ids 0–65535 inside are the node's sandbox id
//! range outside ([`IdRange`]).
//!
//! One namespace serves every sandbox of a backend, as Docker's `userns-remap` serves every
//! container: sandboxes are kept apart by their own mount, pid, ipc, uts and cgroup namespaces
//! (which belong to the host's user namespace, so no sandbox holds a capability over them),
//! and nested user namespaces are refused by the seccomp filter. Making it costs a process
//! start, once per backend instead of once per boot.

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::vmm::error::{Result, VmmError};
use crate::vmm::id_range::IdRange;

/// An open user namespace; sandbox-init inherits it on
/// [`USERNS_FD`](super::confine::USERNS_FD).
#[derive(Debug)]
pub struct UserNamespace {
    fd: OwnedFd,
}

impl UserNamespace {
    /// Starts `init_program hold-user-namespace` in a new user namespace, writes its id maps
    /// from here (host root may map any range), keeps a descriptor of the namespace and lets the
    /// holder exit.
    pub fn create(init_program: &Path, ids: IdRange) -> Result<UserNamespace> {
        let fail = |what: &str| {
            let what = what.to_string();
            move |e: std::io::Error| {
                VmmError::Boot(format!("making the sandbox user namespace ({what}): {e}"))
            }
        };
        let mut cmd = Command::new(init_program);
        cmd.arg(super::init::HOLD_USER_NAMESPACE)
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        // SAFETY: unshare(2) only, between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::unshare(libc::CLONE_NEWUSER) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut holder = cmd.spawn().map_err(fail("starting the holder"))?;
        let proc_dir = Path::new("/proc").join(holder.id().to_string());
        let result = (|| {
            for map in ["uid_map", "gid_map"] {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(proc_dir.join(map))
                    .and_then(|mut f| f.write_all(ids.map_line().as_bytes()))
                    .map_err(fail(map))?;
            }
            std::fs::File::open(proc_dir.join("ns/user"))
                .map(OwnedFd::from)
                .map_err(fail("opening it"))
        })();
        drop(holder.stdin.take());
        let _ = holder.wait();
        Ok(UserNamespace { fd: result? })
    }

    pub fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}
