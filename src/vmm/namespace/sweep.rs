//! The start-up sweep: everything left of sandboxes whose owner died is removed before a
//! backend boots its first sandbox (kill their cgroups, unmount, remove their directories).
//!
//! The lifeline already kills a dead owner's sandbox processes; the sweep is what removes the
//! rest (directories, cgroups) and catches what the lifeline cannot: processes that moved out of
//! the pid namespace's reach (an agent mid-request), or a host that lost power. It only ever
//! touches sandboxes in its own data directory whose owner lock is free
//! ([`owner`](super::owner)), so two workers on one node never sweep each other.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::cgroup::CgroupDriver;
use super::owner::{classify, DeadOwner, Entry};

/// What a sweep removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Swept {
    pub sandboxes: Vec<String>,
    pub owners: usize,
}

/// Removes the sandboxes of every dead owner (and of no owner) under `sandboxes`, except
/// `own`'s.
pub fn sweep_dead_owners(sandboxes: &Path, cgroups: &CgroupDriver, own: &str) -> Swept {
    let mut swept = Swept::default();
    let names: Vec<String> = match std::fs::read_dir(sandboxes) {
        Ok(entries) => entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .collect(),
        Err(e) => {
            tracing::warn!(dir = %sandboxes.display(), error = %e, "cannot list sandboxes to sweep");
            return swept;
        }
    };
    let mut by_owner: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut unowned = Vec::new();
    for name in &names {
        match classify(name) {
            Entry::Sandbox { owner } if owner != own => {
                by_owner.entry(owner).or_default().push(name)
            }
            Entry::Lock { owner } if owner != own => {
                by_owner.entry(owner).or_default();
            }
            Entry::UnownedSandbox => unowned.push(name.as_str()),
            Entry::StagedLock => remove_staged_lock(&sandboxes.join(name)),
            _ => {}
        }
    }
    for name in unowned {
        remove_sandbox(sandboxes, name, cgroups);
        swept.sandboxes.push(name.to_owned());
    }
    for (owner, ids) in by_owner {
        let dead = match DeadOwner::try_claim(sandboxes, owner) {
            Ok(Some(dead)) => dead,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!(owner, error = %e, "cannot tell whether a sandbox owner is alive; leaving its sandboxes");
                continue;
            }
        };
        for id in ids {
            remove_sandbox(sandboxes, id, cgroups);
            swept.sandboxes.push(id.to_owned());
        }
        dead.release();
        swept.owners += 1;
    }
    if !swept.sandboxes.is_empty() {
        tracing::warn!(sandboxes = ?swept.sandboxes, "removed sandboxes left by a strata process that died");
    }
    swept
}

/// Removes a staged owner lock nobody holds. A young one is left: its owner may be between
/// creating it and locking it.
fn remove_staged_lock(path: &Path) {
    let Ok(file) = std::fs::File::open(path) else {
        return;
    };
    let young = file
        .metadata()
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_none_or(|age| age < std::time::Duration::from_secs(60));
    if young {
        return;
    }
    if rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_ok() {
        let _ = std::fs::remove_file(path);
    }
}

/// Kills and removes the sandbox's cgroups, unmounts anything under its directory, removes it.
fn remove_sandbox(sandboxes: &Path, id: &str, cgroups: &CgroupDriver) {
    cgroups.existing(id).remove();
    let dir = sandboxes.join(id);
    for mount in mounts_under(&dir) {
        let target = std::ffi::CString::new(mount.as_os_str().as_encoded_bytes())
            .expect("mountinfo paths have no NUL");
        // SAFETY: umount2 on a path string we own.
        if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } != 0 {
            tracing::warn!(mount = %mount.display(), error = %std::io::Error::last_os_error(), "cannot unmount a leftover sandbox mount");
        }
    }
    if let Err(e) = std::fs::remove_dir_all(&dir) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot remove a leftover sandbox directory");
        }
    }
}

/// What is still on the host of owner `owner`'s sandboxes under `sandboxes`: mount points and
/// loop devices whose backing files are there. A process checks it is empty before it exits
/// (benches do); the kernel detaches an unmounted disk's loop device a moment later, so a check
/// right after an unmount may retry.
pub fn traces_of(sandboxes: &Path, owner: &str) -> Vec<String> {
    let mark = format!("sbx-{owner}-");
    let mut found: Vec<String> = mounts_under(sandboxes)
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(&mark))
        .map(|p| format!("mount {}", p.display()))
        .collect();
    for dev in std::fs::read_dir("/sys/block")
        .into_iter()
        .flatten()
        .flatten()
    {
        let Ok(backing) = std::fs::read_to_string(dev.path().join("loop/backing_file")) else {
            continue;
        };
        let backing = backing.trim();
        if Path::new(backing).starts_with(sandboxes) && backing.contains(&mark) {
            found.push(format!(
                "loop device {} on {backing}",
                dev.file_name().to_string_lossy()
            ));
        }
    }
    found
}

/// Mount points at or under `dir` in this process's mount namespace, deepest first.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut found: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape(p)))
        .filter(|p| p.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape(r"/a\040b\134c"), r"/a b\c");
        assert_eq!(unescape("/plain"), "/plain");
    }
}
