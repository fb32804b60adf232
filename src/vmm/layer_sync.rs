//! Adopted checkpoint trees, made durable in the background.
//!
//! A checkpoint adopts the sandbox's sealed upper directory as its layer's tree
//! (`layer::seal_into_cache`). The layer's blob is durable before the checkpoint returns: the
//! build's record points at it. The tree is only a cache of that blob, and syncing it means
//! waiting for everything the sandbox wrote to reach the disk (about 30 ms for 50 MiB on the
//! machine of ADR 0018), which need not hold the build. So the tree goes into place at once and a
//! background thread syncs it and then writes its completion mark. Until the mark:
//!
//! * this process uses the tree: the page cache holds it whole ([`Syncing`]);
//! * another process sharing the data directory finds it unmarked beside a locked
//!   `<hex>.syncing`; it waits for that lock, then finds the mark. If this process died before
//!   the mark, the lock is free and the tree unmarked: torn, extracted again like any other;
//! * a host crash leaves it unmarked: extracted again.

use std::collections::HashSet;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};

use super::blob_store::sync_dir;
use super::error::Result;
use super::layer::LayerCache;
use super::VmmError;
use crate::domain::ids::Digest;

/// The trees this process put in place and is still syncing, shared by every clone of a cache.
#[derive(Debug, Clone, Default)]
pub struct Syncing(Arc<(Mutex<HashSet<Digest>>, Condvar)>);

impl Syncing {
    fn set(&self) -> std::sync::MutexGuard<'_, HashSet<Digest>> {
        self.0 .0.lock().expect("the syncing set is never poisoned")
    }

    fn contains(&self, digest: &Digest) -> bool {
        self.set().contains(digest)
    }

    fn done(&self, digest: &Digest) {
        self.set().remove(digest);
        self.0 .1.notify_all();
    }
}

impl LayerCache {
    fn sync_lock_path(&self, digest: &Digest) -> PathBuf {
        self.root.join(format!(
            "{}{}",
            digest.hex(),
            super::layer_staging::SYNCING_SUFFIX
        ))
    }

    /// Whether this process put `digest`'s tree in place and is still syncing it: usable here.
    pub(super) fn is_syncing_here(&self, digest: &Digest) -> bool {
        self.syncing.contains(digest)
    }

    /// Waits while another process syncs `digest`'s tree (holds its `.syncing` lock). Returns at
    /// once when nobody does; afterwards the tree is marked, or unmarked and torn.
    pub(super) fn wait_for_other_sync(&self, digest: &Digest) {
        if self.is_syncing_here(digest) {
            return;
        }
        if let Ok(lock) = fs::File::open(self.sync_lock_path(digest)) {
            let _ = rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockShared);
        }
    }

    /// Waits until every tree this process is syncing is marked complete (or failed to be).
    pub fn wait_for_syncs(&self) {
        let (set, cond) = &*self.syncing.0;
        let mut pending = set.lock().expect("the syncing set is never poisoned");
        while !pending.is_empty() {
            pending = cond
                .wait(pending)
                .expect("the syncing set is never poisoned");
        }
    }

    /// Puts `staged`, a whole tree not yet synced, in place as `digest`'s tree and returns; a
    /// background thread syncs it and marks it complete (see the module doc). `staged` is gone
    /// afterwards either way.
    pub(super) fn publish_syncing_later(&self, staged: &Path, digest: &Digest) -> Result<()> {
        let publishing = self.publish_lock()?;
        if self.published_meanwhile(staged, digest) {
            return Ok(());
        }
        let torn = self.move_aside_unmarked(digest)?;
        let lock_path = self.sync_lock_path(digest);
        let lock = super::layer::lock_exclusive(&lock_path, "a layer tree being synced")?;
        let dest = self.path(digest);
        fs::rename(staged, &dest).map_err(VmmError::io(format!("publishing layer {digest}")))?;
        self.syncing.set().insert(*digest);
        drop(publishing);

        let (cache, digest) = (self.clone(), *digest);
        std::thread::spawn(move || {
            let started = std::time::Instant::now();
            let synced = super::layer::sync_tree(&dest).and_then(|()| cache.write_mark(&digest));
            match synced {
                Ok(()) => tracing::debug!(
                    %digest,
                    sync_ms = started.elapsed().as_secs_f64() * 1e3,
                    "adopted layer synced and marked complete"
                ),
                // Unmarked, the tree is extracted again on its next use outside this process.
                Err(e) => {
                    tracing::error!(%digest, error = %e, "an adopted layer could not be made durable; it will be extracted again")
                }
            }
            let _ = fs::remove_file(&lock_path);
            drop(lock);
            cache.syncing.done(&digest);
            cache.changed();
            cache.enforce_budget();
            if let Some(aside) = torn {
                let _ = fs::remove_dir_all(aside);
            }
        });
        Ok(())
    }

    /// Writes `digest`'s completion mark, holding its tree's size (for the budget), durably.
    pub(super) fn write_mark(&self, digest: &Digest) -> Result<()> {
        sync_dir(&self.root)?;
        let size = super::layer_budget::tree_bytes(&self.path(digest));
        fs::File::create(self.mark(digest))
            .and_then(|mut f| {
                f.write_all(size.to_string().as_bytes())?;
                f.sync_all()
            })
            .map_err(VmmError::io(format!("marking layer {digest} complete")))?;
        sync_dir(&self.root)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;
    use std::time::Duration;

    use super::*;
    use crate::vmm::blob_store::LocalBlobStore;
    use crate::vmm::layer::{seal_dir, seal_into_cache};

    struct Node {
        _dir: tempfile::TempDir,
        root: PathBuf,
        blobs: LocalBlobStore,
    }

    fn node() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let blobs = LocalBlobStore::open(root.join("blobs")).unwrap();
        Node {
            _dir: dir,
            root,
            blobs,
        }
    }

    fn upper(root: &Path, content: &str) -> PathBuf {
        let upper = root.join("upper");
        fs::create_dir_all(upper.join("etc")).unwrap();
        fs::write(upper.join("etc/app.conf"), content).unwrap();
        // Written by a sandbox: its root's host ids.
        let root_id = crate::vmm::id_range::IdRange::default().base();
        for p in [upper.join("etc"), upper.join("etc/app.conf")] {
            std::os::unix::fs::lchown(p, Some(root_id), Some(root_id)).unwrap();
        }
        upper
    }

    fn inode(path: &Path) -> u64 {
        fs::metadata(path).unwrap().ino()
    }

    #[test]
    fn an_adopted_tree_is_used_at_once_and_marked_complete_once_synced() {
        let node = node();
        let cache = LayerCache::open(node.root.join("layers"), Default::default()).unwrap();
        let upper = upper(&node.root, "v1");
        let adopted = inode(&upper);
        let layer = seal_into_cache(&upper, &node.blobs, &cache).unwrap();

        // Usable here before (or whether or not) its sync has finished: the same directory.
        assert!(cache.contains(&layer.digest));
        let tree = cache.ensure(&node.blobs, &layer.digest).unwrap();
        assert_eq!(
            inode(&tree),
            adopted,
            "the sealed directory itself, not an extraction"
        );

        cache.wait_for_syncs();
        assert!(cache.mark(&layer.digest).is_file(), "marked once synced");
        assert!(
            !cache.sync_lock_path(&layer.digest).exists(),
            "the sync lock is removed with the mark written"
        );
        // Another process (a cache of its own) sees a complete tree and uses it as it is.
        let other = LayerCache::open(node.root.join("layers"), Default::default()).unwrap();
        assert_eq!(
            inode(&other.ensure(&node.blobs, &layer.digest).unwrap()),
            adopted
        );
    }

    /// A process syncing a tree, as another process sees it: the tree in place, no mark, and its
    /// `.syncing` lock held. The lock is taken here on a descriptor of its own, which conflicts with
    /// any other descriptor's flock exactly as another process's would.
    fn tree_being_synced_elsewhere(node: &Node, content: &str) -> (LayerCache, Digest, fs::File) {
        let src = upper(&node.root, "v1");
        let layer = seal_dir(
            &src,
            &node.blobs,
            crate::vmm::id_range::Owners::Mapped(Default::default()),
        )
        .unwrap();
        let syncer = LayerCache::open(node.root.join("layers"), Default::default()).unwrap();
        let dest = syncer.path(&layer.digest);
        fs::create_dir_all(dest.join("etc")).unwrap();
        fs::write(dest.join("etc/app.conf"), content).unwrap();
        let lock = fs::File::create(syncer.sync_lock_path(&layer.digest)).unwrap();
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).unwrap();
        (syncer, layer.digest, lock)
    }

    /// Runs `ensure` in a fresh cache on a thread; returns its result once it ends.
    fn ensure_elsewhere(node: &Node, digest: Digest) -> std::sync::mpsc::Receiver<Result<PathBuf>> {
        let (tx, rx) = std::sync::mpsc::channel();
        let (root, blobs) = (node.root.clone(), node.blobs.clone());
        std::thread::spawn(move || {
            let cache = LayerCache::open(root.join("layers"), Default::default()).unwrap();
            let _ = tx.send(cache.ensure(&blobs, &digest));
        });
        rx
    }

    #[test]
    fn a_tree_another_process_is_syncing_is_waited_for_and_then_used() {
        let node = node();
        let (syncer, digest, lock) = tree_being_synced_elsewhere(&node, "v1");
        let dest = syncer.path(&digest);
        let before = inode(&dest);

        let ensured = ensure_elsewhere(&node, digest);
        assert!(
            ensured.recv_timeout(Duration::from_millis(300)).is_err(),
            "ensure returned while the tree was still being synced"
        );
        syncer.write_mark(&digest).unwrap();
        fs::remove_file(syncer.sync_lock_path(&digest)).unwrap();
        drop(lock);
        let tree = ensured
            .recv_timeout(Duration::from_secs(10))
            .unwrap()
            .unwrap();
        assert_eq!(
            inode(&tree),
            before,
            "the synced tree is used, not replaced"
        );
    }

    #[test]
    fn a_tree_whose_syncer_died_before_marking_it_is_extracted_again() {
        let node = node();
        // What the page cache held when the syncing process died, cut short on disk.
        let (syncer, digest, lock) = tree_being_synced_elsewhere(&node, "v");
        let ensured = ensure_elsewhere(&node, digest);
        assert!(ensured.recv_timeout(Duration::from_millis(300)).is_err());
        drop(lock); // the process is gone: its lock with it, no mark written
        let tree = ensured
            .recv_timeout(Duration::from_secs(10))
            .unwrap()
            .unwrap();
        assert_eq!(fs::read_to_string(tree.join("etc/app.conf")).unwrap(), "v1");
        assert!(syncer.mark(&digest).is_file());
    }
}
