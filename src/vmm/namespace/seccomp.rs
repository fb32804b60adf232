//! The system-call filter of every sandbox process.
//!
//! A deny list with Docker's default profile as its reference: everything a container without
//! extra capabilities is refused there is refused here, with `EPERM` (never a kill, so a tool
//! that probes a call sees an ordinary error). The filter is built once per backend on the host
//! with libseccomp (which also refuses the x32 ABI and checks the architecture, the classic
//! ways around a filter written by hand), exported as a BPF program, and installed by each
//! sandbox process itself ([`install`]) before it runs anything of the tenant's. The user
//! namespace and the reduced capabilities already refuse most of these calls; the filter is
//! the layer that holds when a kernel bug makes one of those checks wrong.
//!
//! The list and the reason for each group are in ADR 0021.

use libseccomp::{
    ScmpAction, ScmpArch, ScmpArgCompare, ScmpCompareOp, ScmpFilterContext, ScmpSyscall,
};

use crate::vmm::error::{Result, VmmError};

/// Refused outright.
const DENIED: &[&str] = &[
    // Kernel keyrings are not namespaced: the host root's user keyring is reachable.
    "keyctl",
    "add_key",
    "request_key",
    // Mounting, in either API: the sandbox's mounts are the host's to make.
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    // Other namespaces: entering one (setns); creating one is refused below by flag.
    "setns",
    // Kernel attack surface with a history of escapes and no use in a build.
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "open_by_handle_at",
    "name_to_handle_at",
    "lookup_dcookie",
    "kcmp",
    "process_vm_readv",
    "process_vm_writev",
    // The machine itself: modules, kexec, reboot, swap, clocks, quotas, accounting, I/O ports.
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "query_module",
    "get_kernel_syms",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "stime",
    "quotactl",
    "quotactl_fd",
    "acct",
    "ioperm",
    "iopl",
    "syslog",
    "vhangup",
    "nfsservctl",
    "uselib",
    "ustat",
    "sysfs",
    "_sysctl",
    "vm86",
    "vm86old",
    // NUMA placement (Docker grants these only with CAP_SYS_NICE).
    "mbind",
    "set_mempolicy",
    "get_mempolicy",
    "move_pages",
    "migrate_pages",
    // fanotify watches whole filesystems (Docker: CAP_SYS_ADMIN only).
    "fanotify_init",
];

/// Every namespace flag `unshare` takes; `clone` takes the same but `CLONE_NEWTIME`, whose bit
/// is part of `clone`'s exit signal.
const NAMESPACE_FLAGS: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
];
const CLONE_NEWTIME: u64 = 0x80;

/// The personalities a sandbox may set, Docker's allow-list: Linux, 32-bit Linux
/// (`PER_LINUX32`), `UNAME26`, both, and the query `0xffffffff`. Every other value is refused:
/// the flags change the memory layout or its protections (`ADDR_NO_RANDOMIZE` turns ASLR off,
/// `READ_IMPLIES_EXEC` makes readable memory executable), whatever else is set beside them.
pub const PERSONALITIES: &[u32] = &[0x0, 0x8, 0x2_0000, 0x2_0008, 0xffff_ffff];

/// The query: the only allowed value with bit 31 set.
const PERSONALITY_QUERY: u32 = 0xffff_ffff;

/// The `personality` rules as `(mask, value)` pairs: the call is refused when the argument's
/// low 32 bits (all the kernel reads) masked by `mask` equal `value` for any pair.
///
/// libseccomp takes one comparison per argument per rule, so "not in the list" is spelled as
/// bits: with bit 31 clear, any bit outside the allowed values' union (the non-query values
/// are every combination of their bits, which a test checks); with bit 31 set, any bit clear
/// (the query sets them all).
pub fn personality_refusals() -> Vec<(u64, u64)> {
    let allowed_bits = PERSONALITIES
        .iter()
        .filter(|p| **p != PERSONALITY_QUERY)
        .fold(0u32, |bits, p| bits | p);
    let top = 1u64 << 31;
    let mut rules = Vec::new();
    for bit in (0..31).map(|b| 1u64 << b) {
        if allowed_bits as u64 & bit == 0 {
            rules.push((bit | top, bit));
        }
        rules.push((bit | top, top));
    }
    rules
}

fn err(what: String) -> impl FnOnce(libseccomp::error::SeccompError) -> VmmError {
    move |e| {
        VmmError::Boot(format!(
            "building the sandbox's seccomp filter ({what}): {e}"
        ))
    }
}

fn has_flag(arg: u32, flag: u64) -> ScmpArgCompare {
    ScmpArgCompare::new(arg, ScmpCompareOp::MaskedEqual(flag), flag)
}

/// Builds the filter and returns it as a BPF program (`struct sock_filter` array, native
/// byte order), ready for [`install`].
pub fn build() -> Result<Vec<u8>> {
    let eperm = ScmpAction::Errno(libc::EPERM);
    let mut ctx = ScmpFilterContext::new(ScmpAction::Allow).map_err(err("init".into()))?;
    // 32-bit programs run (as under Docker); the x32 ABI and foreign architectures get EPERM.
    #[cfg(target_arch = "x86_64")]
    ctx.add_arch(ScmpArch::X86).map_err(err("i386".into()))?;
    ctx.set_act_badarch(eperm)
        .map_err(err("bad-arch action".into()))?;
    for name in DENIED {
        // A name this libseccomp does not know is a call this architecture does not have.
        let Ok(call) = ScmpSyscall::from_name(name) else {
            continue;
        };
        ctx.add_rule(eperm, call).map_err(err((*name).into()))?;
    }
    for (name, flags) in [
        ("unshare", [NAMESPACE_FLAGS, &[CLONE_NEWTIME]].concat()),
        ("clone", NAMESPACE_FLAGS.to_vec()),
    ] {
        let call = ScmpSyscall::from_name(name).map_err(err(name.into()))?;
        for flag in flags {
            ctx.add_rule_conditional(eperm, call, &[has_flag(0, flag)])
                .map_err(err(format!("{name} flag {flag:#x}")))?;
        }
    }
    // clone3 passes its flags in memory, where a filter cannot look: ENOSYS makes the C
    // libraries fall back to clone, whose flags are checked above.
    let clone3 = ScmpSyscall::from_name("clone3").map_err(err("clone3".into()))?;
    ctx.add_rule(ScmpAction::Errno(libc::ENOSYS), clone3)
        .map_err(err("clone3".into()))?;
    let personality = ScmpSyscall::from_name("personality").map_err(err("personality".into()))?;
    for (mask, value) in personality_refusals() {
        let cmp = ScmpArgCompare::new(0, ScmpCompareOp::MaskedEqual(mask), value);
        ctx.add_rule_conditional(eperm, personality, &[cmp])
            .map_err(err(format!("personality {value:#x} under {mask:#x}")))?;
    }
    let mut out = tempfile::tempfile().map_err(VmmError::io("creating the seccomp export file"))?;
    ctx.export_bpf(&mut out).map_err(err("export".into()))?;
    use std::io::{Read, Seek};
    let mut program = Vec::new();
    out.rewind()
        .and_then(|_| out.read_to_end(&mut program))
        .map_err(VmmError::io("reading the exported seccomp filter"))?;
    if program.is_empty() || program.len() % std::mem::size_of::<libc::sock_filter>() != 0 {
        return Err(VmmError::Boot(format!(
            "the exported seccomp filter is {} bytes, not a whole number of instructions",
            program.len()
        )));
    }
    Ok(program)
}

/// Installs `program` (from [`build`]) on the calling thread. Needs `CAP_SYS_ADMIN` in the
/// caller's user namespace, which sandbox processes have until they drop their capabilities
/// right after this; `no_new_privs` is not set, so `sudo` and other setuid programs inside the
/// sandbox keep working (within the capability bounding set).
pub fn install(program: &[u8]) -> std::result::Result<(), String> {
    let size = std::mem::size_of::<libc::sock_filter>();
    let filters: Vec<libc::sock_filter> = program
        .chunks_exact(size)
        .map(|c| libc::sock_filter {
            code: u16::from_ne_bytes([c[0], c[1]]),
            jt: c[2],
            jf: c[3],
            k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect();
    if filters.is_empty() {
        return Err("the seccomp filter is empty".into());
    }
    let prog = libc::sock_fprog {
        len: filters.len() as u16,
        filter: filters.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `prog` points at `filters`, alive for the call; the kernel copies the program.
    let r = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            &prog as *const libc::sock_fprog,
        )
    };
    if r != 0 {
        return Err(format!(
            "installing the seccomp filter: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(arg: u32) -> bool {
        personality_refusals()
            .iter()
            .any(|(mask, value)| arg as u64 & mask == *value)
    }

    #[test]
    fn exactly_dockers_personalities_pass() {
        let mut values: Vec<u32> = PERSONALITIES.to_vec();
        // Every bit alone, with bit 31, and with each allowed value; the trick that passed the
        // old rule (`0x80040000`: ADDR_NO_RANDOMIZE under bit 31); a spread of others.
        for bit in 0..32 {
            let b = 1u32 << bit;
            values.extend([b, b | 1 << 31, !b]);
            values.extend(PERSONALITIES.iter().map(|p| p | b));
        }
        values.extend([
            0x8004_0000,
            0x0040_0000,
            0x0004_0008,
            0x7fff_ffff,
            0xfffe_ffff,
        ]);
        let mut x = 0x9e37_79b9u32;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            values.push(x);
        }
        for v in values {
            assert_eq!(refused(v), !PERSONALITIES.contains(&v), "{v:#x}");
        }
    }
}
