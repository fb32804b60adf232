//! Staging directories of the layer cache, and the sweep of those a dead process left behind.
//!
//! An extraction (or an adopted upper directory) is built in `layers/.staging-<id>-<hex>/`
//! and renamed into place once synced ([`super::layer`]). Its owner holds an exclusive
//! `flock(2)` on the directory itself from before it gets that name until it is renamed into
//! place or removed. The kernel drops the lock when the owner dies, however it dies, so a
//! staging directory whose lock can be taken belongs to no live process (this one included:
//! a second descriptor of the same directory does not share the owner's lock) and may be
//! removed. A pid would not do: it may belong to another process by the time it is checked.
//!
//! Layout of `layers/` as the sweep sees it:
//! * `.staging-new-<id>/`: created and about to be locked and renamed; a creator that finds it
//!   taken by a sweeper (or gone) starts again under a new id, so the sweeper wins every race;
//! * `.staging-<id>-<hex>/`: locked while its owner lives;
//! * `.torn-<hex>-<uuid>/`: an unmarked tree moved aside before a fresh extraction took its
//!   place; never used again, so always removable;
//! * `<hex>.syncing`: the lock of an adopted tree being synced in the background
//!   ([`super::layer_sync`]), made and locked under the publish lock and removed once the tree
//!   is marked; one whose lock can be taken (looked at under the publish lock, so never between
//!   its creation and its lock) is a dead syncer's, and goes;
//! * `.tmp-<hex>-<uuid>/`: staging of a strata from before these locks. It cannot tell whether
//!   its writer lives, so it is left (and reported) for an operator to remove.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use super::error::{Result, VmmError};
use crate::domain::ids::Digest;

const STAGING_PREFIX: &str = ".staging-";
const NEW_PREFIX: &str = ".staging-new-";
const TORN_PREFIX: &str = ".torn-";
const LEGACY_PREFIX: &str = ".tmp-";
/// Suffix of an adopted tree's sync lock, `<hex>.syncing` ([`super::layer_sync`]).
pub(super) const SYNCING_SUFFIX: &str = ".syncing";

/// A staging directory this process owns: locked until dropped, and removed on drop unless it
/// was renamed into place first.
#[derive(Debug)]
pub struct Staging {
    path: PathBuf,
    /// The directory itself, flocked: what tells a sweeper its owner lives.
    _lock: File,
}

impl Staging {
    /// A new empty staging directory for `digest` under `root`.
    pub(super) fn create(root: &Path, digest: &Digest) -> Result<Staging> {
        Self::create_labelled(root, &digest.hex())
    }

    /// A new empty staging directory under `root` whose name ends in `label` (the digest's hex
    /// where it is known).
    pub(super) fn create_labelled(root: &Path, label: &str) -> Result<Staging> {
        let io_err = |what: String| VmmError::io(what);
        // A sweeper may take a `.staging-new-*` between its creation and its lock; it then
        // removes it, and this starts again under another id.
        for _ in 0..8 {
            let id = uuid::Uuid::new_v4().simple().to_string();
            let new = root.join(format!("{NEW_PREFIX}{id}"));
            fs::create_dir(&new).map_err(io_err(format!("creating {}", new.display())))?;
            let dir = match File::open(&new) {
                Ok(dir) => dir,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_err(format!("opening {}", new.display()))(e)),
            };
            match try_lock(&dir) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    let _ = fs::remove_dir(&new);
                    return Err(io_err(format!("locking {}", new.display()))(e));
                }
            }
            let path = root.join(format!("{STAGING_PREFIX}{id}-{label}"));
            match fs::rename(&new, &path) {
                Ok(()) => return Ok(Staging { path, _lock: dir }),
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => {
                    let _ = fs::remove_dir(&new);
                    return Err(io_err(format!("naming {}", path.display()))(e));
                }
            }
        }
        Err(VmmError::io(format!(
            "creating a staging directory in {}: swept from under this process every time",
            root.display()
        ))(io::ErrorKind::Interrupted.into()))
    }

    /// Moves `tree` under `root` as a staging directory for `digest`, locked before it gets
    /// the staging name. `Ok(None)`: `tree` is on another filesystem and was left as it is.
    pub(super) fn adopt(root: &Path, tree: &Path, digest: &Digest) -> io::Result<Option<Staging>> {
        let dir = File::open(tree)?;
        if !try_lock(&dir)? {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "another process holds a lock on the tree",
            ));
        }
        let id = uuid::Uuid::new_v4().simple().to_string();
        let path = root.join(format!("{STAGING_PREFIX}{id}-{}", digest.hex()));
        match fs::rename(tree, &path) {
            Ok(()) => Ok(Some(Staging { path, _lock: dir })),
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // Renamed into place: the name is gone and this removes nothing. Else it is what a
        // failed or abandoned extraction left. The lock is released only after, when the
        // descriptor closes.
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Takes an exclusive lock on `file` if nobody holds one.
fn try_lock(file: &File) -> io::Result<bool> {
    match rustix::fs::flock(file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// What [`sweep`] found in a layer cache.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Staging directories of dead owners, removed.
    pub staging: Vec<String>,
    /// Torn trees moved aside, removed.
    pub torn: Vec<String>,
    /// Sync locks of adopted trees whose syncer died, removed.
    pub sync_locks: Vec<String>,
    /// Staging directories a live process holds (this one included), kept.
    pub live: Vec<String>,
    /// Staging directories of an older strata, which cannot say whether their writer lives;
    /// kept.
    pub legacy: Vec<String>,
}

/// Removes what crashed extractions left under `root`: staging directories and sync locks
/// whose lock can be taken, and torn trees. Best effort: what cannot be removed is logged and
/// left for the next sweep.
pub fn sweep(root: &Path) -> Swept {
    let mut swept = Swept::default();
    let names: Vec<String> = match fs::read_dir(root) {
        Ok(entries) => entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return swept,
        Err(e) => {
            tracing::warn!(dir = %root.display(), error = %e, "cannot list the layer cache to sweep it");
            return swept;
        }
    };
    for name in names.iter().cloned() {
        let path = root.join(&name);
        if name.starts_with(STAGING_PREFIX) {
            let dir = match File::open(&path) {
                Ok(dir) => dir,
                // Renamed into place or removed by its owner since the listing.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot open a staging directory to sweep it");
                    continue;
                }
            };
            match try_lock(&dir) {
                Ok(true) => {
                    if remove(&path) {
                        swept.staging.push(name);
                    }
                }
                Ok(false) => swept.live.push(name),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot tell whether a staging directory's owner lives; leaving it")
                }
            }
        } else if name.starts_with(TORN_PREFIX) {
            if remove(&path) {
                swept.torn.push(name);
            }
        } else if name.starts_with(LEGACY_PREFIX) {
            swept.legacy.push(name);
        }
    }
    swept.sync_locks = sweep_sync_locks(root, &names);
    if !swept.staging.is_empty() || !swept.torn.is_empty() || !swept.sync_locks.is_empty() {
        tracing::warn!(dir = %root.display(), staging = ?swept.staging, torn = ?swept.torn, sync_locks = ?swept.sync_locks, "removed layer extractions left by a strata process that died");
    }
    if !swept.legacy.is_empty() {
        tracing::info!(dir = %root.display(), left = ?swept.legacy, "left staging directories of an older strata (remove them once no older strata runs on this node)");
    }
    swept
}

/// Removes the `<hex>.syncing` files among `names` whose lock is free, under the cache's publish
/// lock: a syncer creates and locks its file while holding that lock, so a free one seen under
/// it belongs to a process that died before marking its tree (the tree, unmarked, is extracted
/// again on its next use).
fn sweep_sync_locks(root: &Path, names: &[String]) -> Vec<String> {
    let candidates: Vec<&String> = names
        .iter()
        .filter(|n| {
            n.strip_suffix(SYNCING_SUFFIX)
                .is_some_and(|hex| Digest::from_hex(hex).is_ok())
        })
        .collect();
    if candidates.is_empty() {
        return Vec::new();
    }
    let publishing = super::layer::publish_lock(root);
    let _publishing = match publishing {
        Ok(lock) => lock,
        Err(e) => {
            tracing::warn!(dir = %root.display(), error = %e, "cannot take the layer cache's publish lock to sweep sync locks");
            return Vec::new();
        }
    };
    let mut removed = Vec::new();
    for name in candidates {
        let path = root.join(name);
        let Ok(file) = File::open(&path) else {
            continue;
        };
        if try_lock(&file).unwrap_or(false) && fs::remove_file(&path).is_ok() {
            removed.push(name.clone());
        }
    }
    removed
}

/// Removes a leftover tree; true if it is gone (by this call or a concurrent one).
fn remove(path: &Path) -> bool {
    match fs::remove_dir_all(path) {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::NotFound => true,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove a leftover layer extraction");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest() -> Digest {
        Digest::of(b"a layer")
    }

    /// A live owner's staging directory (a real lock held on it, here by this process) is
    /// kept; once its owner is gone (the kernel released the lock) the sweep removes it.
    #[test]
    fn a_staging_directory_is_swept_only_once_its_lock_is_free() {
        let root = tempfile::tempdir().unwrap();
        let live = Staging::create(root.path(), &digest()).unwrap();
        fs::write(live.path().join("file"), "being extracted").unwrap();
        let name = live
            .path()
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned();
        assert!(name.starts_with(".staging-"), "{name}");

        let swept = sweep(root.path());
        assert_eq!(swept.live, vec![name.clone()]);
        assert!(swept.staging.is_empty());
        assert!(live.path().join("file").is_file(), "a live staging is kept");

        // What a process killed mid-extraction leaves: the directory, its lock released as the
        // kernel releases it, by closing the descriptor.
        let path = live.path().to_path_buf();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&live._lock);
        std::mem::forget(live);
        // SAFETY: the descriptor leaked with `live` is closed once and never used again.
        unsafe { libc::close(fd) };
        assert!(path.is_dir());
        let swept = sweep(root.path());
        assert_eq!(swept.staging, vec![name]);
        assert!(!path.exists());
    }

    /// Torn trees and a `.staging-new-*` abandoned before its lock go; the cache's layers and
    /// an older strata's `.tmp-*` staging stay.
    #[test]
    fn torn_trees_and_unlocked_new_stagings_go_and_the_rest_stays() {
        let root = tempfile::tempdir().unwrap();
        let hex = digest().hex();
        let torn = format!(".torn-{hex}-0123456789abcdef0123456789abcdef");
        let new = ".staging-new-0123456789abcdef0123456789abcdef".to_owned();
        let legacy = format!(".tmp-{hex}-0123456789abcdef0123456789abcdef");
        for dir in [&torn, &new, &legacy, &hex] {
            fs::create_dir_all(root.path().join(dir).join("etc")).unwrap();
            fs::write(root.path().join(dir).join("etc/file"), "x").unwrap();
        }
        fs::write(root.path().join(format!("{hex}.complete")), "1").unwrap();
        let swept = sweep(root.path());
        assert_eq!(
            swept,
            Swept {
                staging: vec![new],
                torn: vec![torn],
                sync_locks: vec![],
                live: vec![],
                legacy: vec![legacy.clone()],
            }
        );
        let mut left: Vec<String> = fs::read_dir(root.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        let mut expected = vec![legacy, hex.clone(), format!("{hex}.complete")];
        expected.sort();
        assert_eq!(left, expected);
    }

    /// A sync lock whose syncer died goes; one a live syncer holds (a real lock, held here)
    /// stays.
    #[test]
    fn a_sync_lock_is_swept_only_once_it_is_free() {
        let root = tempfile::tempdir().unwrap();
        let dead = format!("{}.syncing", Digest::of(b"dead").hex());
        let live = format!("{}.syncing", Digest::of(b"live").hex());
        File::create(root.path().join(&dead)).unwrap();
        let held = File::create(root.path().join(&live)).unwrap();
        assert!(try_lock(&held).unwrap());
        let swept = sweep(root.path());
        assert_eq!(swept.sync_locks, vec![dead.clone()]);
        assert!(!root.path().join(&dead).exists());
        assert!(root.path().join(&live).exists());
        drop(held);
        assert_eq!(sweep(root.path()).sync_locks, vec![live]);
    }
}
