//! Each sandbox's own user namespace: ids 0–65535 inside are the node's sandbox id range
//! outside ([`IdRange`]), and the namespace is owned by a host uid of its own (ADR 0034).
//!
//! Every sandbox maps the same range, so the layer trees the node keeps hold one set of host
//! ids and overlay shows each sandbox its files as their in-sandbox owners. What the namespace
//! per sandbox adds is its owner: the kernel charges inotify instances and watches, processes
//! (`RLIMIT_NPROC`) and nested namespaces to the namespace's uid at each level, and at the
//! host's level to the uid that owns the namespace. With one namespace owned by host root,
//! every sandbox drew on one pool, host root's own services' pool, and one sandbox could take
//! all of it. Owned by a uid of its own (one of [`NAMESPACE_OWNERS`] above the range, held
//! host-wide through [`HostSlots`]), each sandbox has the node's per-user limits to itself.
//!
//! Sandboxes are still kept apart by their own mount, pid, ipc, uts and cgroup namespaces,
//! which belong to the host's user namespace, so no sandbox holds a capability over them;
//! nested user namespaces are refused by the seccomp filter.

use std::io::{BufRead, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use super::host_slots::{HeldSlot, HostSlots};
use crate::vmm::error::{Result, VmmError};
use crate::vmm::id_range::{IdRange, NAMESPACE_OWNERS};

/// Where the host-wide locks of namespace owners live: one per uid, `uid-<uid>.lock`.
const OWNERS_DIR: &str = "/run/strata/userns";

/// What the holder prints once it is in its new namespace, before the host writes the maps.
const UNSHARED: &str = "unshared";

/// Namespaces kept made ahead: making one starts a process (about 2 ms of a boot's 6 here),
/// which a boot that takes a spare does not wait for.
const SPARES: usize = 2;

/// Makes sandbox user namespaces, each owned by a free owner uid of `ids`.
#[derive(Debug)]
pub struct UserNamespaces {
    init_program: PathBuf,
    ids: IdRange,
    owners: HostSlots,
    spares: Mutex<Vec<UserNamespace>>,
    refilling: AtomicBool,
}

/// An open user namespace and the owner uid it holds; sandbox-init inherits it on
/// [`USERNS_FD`](super::confine::USERNS_FD). Dropped once no process of the sandbox is left,
/// so the owner is free only when nothing of its namespace can still count against it.
#[derive(Debug)]
pub struct UserNamespace {
    fd: OwnedFd,
    /// Held, not read: the owner uid is free for another namespace once this one is gone.
    _owner: HeldSlot,
}

impl UserNamespace {
    pub fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl UserNamespaces {
    pub fn new(init_program: &Path, ids: IdRange) -> Result<UserNamespaces> {
        let owners = HostSlots::new(OWNERS_DIR, "uid-", ids.first_owner(), NAMESPACE_OWNERS)
            .map_err(VmmError::io(format!("creating {OWNERS_DIR}")))?;
        Ok(UserNamespaces {
            init_program: init_program.to_path_buf(),
            ids,
            owners,
            spares: Mutex::new(Vec::new()),
            refilling: AtomicBool::new(false),
        })
    }

    /// A namespace for a new sandbox: a spare when there is one, else one made now. Blocks
    /// (call it off the async threads); [`refill`](Self::refill) after.
    pub fn take(&self) -> Result<UserNamespace> {
        match self.spares.lock().expect("userns spares").pop() {
            Some(spare) => Ok(spare),
            None => self.create(),
        }
    }

    /// Makes spares up to [`SPARES`]; one caller at a time, the others return at once. Blocks.
    pub fn refill(&self) {
        if self.refilling.swap(true, Ordering::AcqRel) {
            return;
        }
        while self.spares.lock().expect("userns spares").len() < SPARES {
            match self.create() {
                Ok(spare) => self.spares.lock().expect("userns spares").push(spare),
                Err(e) => {
                    // The next boot makes its own and says why if it fails too.
                    tracing::debug!(error = %e, "making a spare user namespace");
                    break;
                }
            }
        }
        self.refilling.store(false, Ordering::Release);
    }

    /// A new namespace owned by a free owner uid: starts `init_program hold-user-namespace
    /// <uid>` (see [`hold`]), writes its id maps from here once it has unshared (host root may
    /// map any range), keeps a descriptor of the namespace and lets the holder exit.
    pub fn create(&self) -> Result<UserNamespace> {
        let fail = |what: &str| {
            let what = what.to_string();
            move |e: std::io::Error| {
                VmmError::Boot(format!("making the sandbox's user namespace ({what}): {e}"))
            }
        };
        let owner = self
            .owners
            .take()
            .map_err(fail("locking an owner uid"))?
            .ok_or_else(|| {
                VmmError::Boot(format!(
                    "all {NAMESPACE_OWNERS} user namespace owners of this node are in use; \
                     destroy sandboxes or run fewer at once"
                ))
            })?;
        let mut holder = Command::new(&self.init_program)
            .arg(super::init::HOLD_USER_NAMESPACE)
            .arg(owner.number().to_string())
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(fail("starting the holder"))?;
        let proc_dir = Path::new("/proc").join(holder.id().to_string());
        let result = (|| {
            let mut said = String::new();
            std::io::BufReader::new(holder.stdout.take().expect("piped stdout"))
                .read_line(&mut said)
                .map_err(fail("waiting for the holder"))?;
            if said.trim_end() != UNSHARED {
                return Err(VmmError::Boot(
                    "making the sandbox's user namespace: the holder exited before unsharing \
                     (its error is in the log above)"
                        .into(),
                ));
            }
            for map in ["uid_map", "gid_map"] {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(proc_dir.join(map))
                    .and_then(|mut f| f.write_all(self.ids.map_line().as_bytes()))
                    .map_err(fail(map))?;
            }
            std::fs::File::open(proc_dir.join("ns/user"))
                .map(OwnedFd::from)
                .map_err(fail("opening it"))
        })();
        drop(holder.stdin.take());
        let _ = holder.wait();
        Ok(UserNamespace {
            fd: result?,
            _owner: owner,
        })
    }
}

/// The holder's side (`hold-user-namespace <uid>`, single-threaded, as host root): becomes a
/// new user namespace owned by `uid`, says so on stdout, and waits for stdin to close while the
/// host writes its maps and opens it. Returns the exit code.
///
/// The owner is the effective uid at `unshare(2)`; the holder keeps its capabilities through
/// the switch (`SECBIT_NO_SETUID_FIXUP`) so a kernel that lets only privileged callers make user
/// namespaces still lets it.
pub fn hold(owner: Option<&str>) -> u8 {
    let Some(owner) = owner.and_then(|o| o.parse::<u32>().ok()) else {
        eprintln!("usage: hold-user-namespace UID (started by the strata worker)");
        return 2;
    };
    // SAFETY: prctl, setresuid and unshare on this single-threaded process.
    let unshared = unsafe {
        libc::prctl(libc::PR_SET_SECUREBITS, SECBIT_NO_SETUID_FIXUP, 0, 0, 0) == 0
            && libc::setresuid(u32::MAX, owner, u32::MAX) == 0
            && libc::unshare(libc::CLONE_NEWUSER) == 0
    };
    if !unshared {
        eprintln!(
            "hold-user-namespace: becoming a user namespace owned by uid {owner}: {}",
            std::io::Error::last_os_error()
        );
        return 1;
    }
    let mut out = std::io::stdout();
    if writeln!(out, "{UNSHARED}")
        .and_then(|_| out.flush())
        .is_err()
    {
        return 1;
    }
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
    0
}

/// `<linux/securebits.h>`: a change of uid leaves the capability sets alone.
const SECBIT_NO_SETUID_FIXUP: libc::c_ulong = 1 << 2;
