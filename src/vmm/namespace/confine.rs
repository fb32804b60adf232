//! How a sandbox process becomes an unprivileged guest: the last thing pid 1 and every agent
//! do before anything of the tenant's runs (ADR 0021).
//!
//! [`enter`] moves the calling process from host root into the sandbox's user namespace (its
//! ids 0–65535 are an unprivileged host range, [`crate::vmm::id_range`]), as that namespace's
//! root, installs the [`seccomp`](super::seccomp) filter while it still may, and leaves it with
//! [`CAPABILITIES`] and nothing else:
//!
//! * bounding set, permitted and effective: [`CAPABILITIES`];
//! * inheritable and ambient: empty, as under Docker (an ambient set would hand root's
//!   capabilities to every non-root step).
//!
//! Switching to a non-root user afterwards clears permitted and effective, as it always does;
//! `sudo` (setuid root inside the namespace) gets them back, never more than the bounding set.
//! The mount, pid, ipc, uts and cgroup namespaces belong to the host's user namespace, so even
//! these capabilities reach none of their settings: a sandbox cannot unmount the read-only
//! `/proc/sys` pid 1 left it, nor change its hostname.

use std::os::fd::RawFd;

/// The descriptor on which sandbox-init and its children find the sandbox's user namespace.
pub const USERNS_FD: RawFd = 7;

/// Docker's default capability set without `CAP_NET_RAW` (raw and packet sockets read other
/// tenants' traffic on a shared network): CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, SETGID,
/// SETUID, SETPCAP, NET_BIND_SERVICE, SYS_CHROOT, MKNOD, AUDIT_WRITE, SETFCAP. `CAP_MKNOD`
/// only makes device nodes the kernel refuses to a user namespace anyway (and the device
/// cgroup refuses to open), as Docker keeps it.
pub const CAPABILITIES: &[u32] = &[0, 1, 3, 4, 5, 6, 7, 8, 10, 18, 27, 29, 31];

/// [`CAPABILITIES`] as the bit mask `/proc/<pid>/status` prints (`CapEff: 00000000a80405fb`).
pub const fn capability_mask() -> u64 {
    let mut mask = 0u64;
    let mut i = 0;
    while i < CAPABILITIES.len() {
        mask |= 1 << CAPABILITIES[i];
        i += 1;
    }
    mask
}

fn check(r: libc::c_long, what: &str) -> Result<(), String> {
    if r < 0 {
        Err(format!("{what}: {}", std::io::Error::last_os_error()))
    } else {
        Ok(())
    }
}

/// Enters the sandbox's user namespace (on [`USERNS_FD`], closed here) as its root, installs
/// `seccomp`, and reduces the capability sets. The caller must be single-threaded.
pub fn enter(seccomp: &[u8]) -> Result<(), String> {
    // SAFETY: plain syscalls on ourselves and our own descriptor.
    unsafe {
        check(
            libc::setns(USERNS_FD, libc::CLONE_NEWUSER) as _,
            "entering the sandbox's user namespace",
        )?;
        libc::close(USERNS_FD);
        // Root of the namespace: host ids `base`, never host root.
        check(libc::setgroups(0, std::ptr::null()) as _, "setgroups")?;
        check(libc::setresgid(0, 0, 0) as _, "setresgid 0")?;
        check(libc::setresuid(0, 0, 0) as _, "setresuid 0")?;
    }
    super::seccomp::install(seccomp)?;
    let keep = capability_mask();
    for cap in 0..64u32 {
        if keep & (1 << cap) == 0 {
            // SAFETY: prctl on ourselves. EINVAL is a capability this kernel does not have:
            // the loop ends there.
            if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) } != 0 {
                break;
            }
        }
    }
    // SAFETY: prctl on ourselves.
    check(
        unsafe {
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
                0,
                0,
                0,
            )
        } as _,
        "clearing the ambient capabilities",
    )?;
    set_capabilities(keep, keep, 0)?;
    // Not dumpable: no process of the tenant's may ptrace this one or read its memory and
    // /proc files. Leaving host root made it so already (a credential change resets the flag to
    // `fs.suid_dumpable`), which a node with `suid_dumpable=1` would undo; said here instead.
    // SAFETY: prctl on ourselves.
    check(
        unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } as _,
        "making the process not dumpable",
    )
}

/// capset(2) with the version 3 (64-bit) layout.
fn set_capabilities(permitted: u64, effective: u64, inheritable: u64) -> Result<(), String> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let half = |v: u64, i: usize| (v >> (32 * i)) as u32;
    let data = [0, 1].map(|i| Data {
        effective: half(effective, i),
        permitted: half(permitted, i),
        inheritable: half(inheritable, i),
    });
    // SAFETY: capset with a version 3 header and its two data words.
    check(
        unsafe { libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr()) },
        "setting the capability sets",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mask_is_dockers_default_without_net_raw() {
        // Docker's default set prints as a80425fb; NET_RAW is bit 13 (0x2000).
        assert_eq!(capability_mask(), 0xa804_25fb & !(1 << 13));
        assert_eq!(capability_mask(), 0xa804_05fb);
    }
}
