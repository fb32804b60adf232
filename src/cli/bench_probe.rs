//! The floor under `boot+exec(true)+destroy`: the same kernel work done directly, with no
//! strata process in between. A cgroup, a fork into fresh mount, pid, ipc and uts namespaces, an
//! overlay of the same lower directories with a fresh upper, a chroot into it, `/bin/sh -c true`
//! exec'd there, a wait, the cgroup and directories removed. The overlay goes with the mount
//! namespace when the shell exits.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use strata::vmm::{Limits, NamespaceBackend};

/// One probe run: boot, exec `true`, destroy, done with direct syscalls. `volatile` mounts the
/// overlay as strata does (no sync of the upper filesystem at unmount); without it, the
/// unmount syncs the whole upper filesystem, as strata's mounts did before.
pub fn probe_once(
    backend: &NamespaceBackend,
    lowers: &[PathBuf],
    scratch: &Path,
    volatile: bool,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let id = format!("probe-{}", uuid::Uuid::new_v4().simple());
    let dir = scratch.join(&id);
    let (upper, work, root) = (dir.join("upper"), dir.join("work"), dir.join("root"));
    for d in [&upper, &work, &root] {
        std::fs::create_dir_all(d)?;
    }
    let mut cgroup = backend
        .cgroup_driver()
        .create(&id, &Limits::default())
        .context("creating the probe's cgroup")?;
    let procs: Vec<std::fs::File> = cgroup
        .procs_files()
        .iter()
        .map(|p| std::fs::OpenOptions::new().write(true).open(p))
        .collect::<std::io::Result<_>>()?;
    let raw_procs: Vec<i32> = procs.iter().map(std::os::fd::AsRawFd::as_raw_fd).collect();
    let lowerdir = lowers
        .iter()
        .map(|l| l.display().to_string())
        .collect::<Vec<_>>()
        .join(":");
    let options = CString::new(format!(
        "lowerdir={lowerdir},upperdir={},workdir={},redirect_dir=off,index=off,metacopy=off{}",
        upper.display(),
        work.display(),
        if volatile { ",volatile" } else { "" }
    ))?;
    let root_c = CString::new(root.as_os_str().as_bytes())?;
    let (overlay, none, slash) = (c"overlay", c"none", c"/");
    let mut cmd = std::process::Command::new("/bin/sh");
    cmd.args(["-c", "true"]).env_clear();
    // SAFETY: only async-signal-safe syscalls on memory prepared before fork.
    unsafe {
        cmd.pre_exec(move || {
            let check = |r: i32| {
                if r != 0 {
                    Err(std::io::Error::last_os_error())
                } else {
                    Ok(())
                }
            };
            for fd in &raw_procs {
                if libc::write(*fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            check(libc::unshare(
                libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS,
            ))?;
            check(libc::mount(
                none.as_ptr(),
                slash.as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            check(libc::mount(
                overlay.as_ptr(),
                root_c.as_ptr(),
                overlay.as_ptr(),
                0,
                options.as_ptr().cast(),
            ))?;
            check(libc::chroot(root_c.as_ptr()))?;
            check(libc::chdir(slash.as_ptr()))
        });
    }
    let status = cmd.status().context("running the probe")?;
    drop(procs);
    cgroup.remove();
    std::fs::remove_dir_all(&dir)?;
    anyhow::ensure!(status.success(), "the probe's `true` failed: {status}");
    Ok(started.elapsed())
}
