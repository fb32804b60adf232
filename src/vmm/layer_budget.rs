//! The size budget of a node's extracted-layer cache.
//!
//! On a node that shares nothing but Postgres and the object store, the layer cache is only a
//! cache: any layer can be extracted again from its blob. So it is bounded: after each
//! extraction, while the cache holds more than its budget, the least recently used layer goes.
//! A layer that a running sandbox of this process mounts is pinned ([`LayerPins`]) and never
//! goes; nor does the layer just extracted. Use is the mtime of the layer's `.complete` mark
//! (touched on every hit), and its size is written in the mark at extraction.
//!
//! Eviction removes the mark first (the tree is then incomplete, so nothing mounts it again),
//! then the tree, under the cache's publish lock.

use std::collections::HashMap;
use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use super::layer::LayerCache;
use crate::domain::ids::Digest;

/// The budget in bytes (0: unbounded) and the pins, shared by every clone of one cache.
#[derive(Debug, Clone, Default)]
pub struct Budget {
    bytes: Arc<AtomicU64>,
    pins: Arc<Mutex<HashMap<String, usize>>>,
}

/// Layers a sandbox mounts; they stay in the cache until this is dropped.
#[derive(Debug)]
pub struct LayerPins {
    pins: Arc<Mutex<HashMap<String, usize>>>,
    hexes: Vec<String>,
}

impl Drop for LayerPins {
    fn drop(&mut self) {
        let mut pins = self.pins.lock().expect("the layer pins are never poisoned");
        for hex in &self.hexes {
            if let Some(n) = pins.get_mut(hex) {
                *n -= 1;
                if *n == 0 {
                    pins.remove(hex);
                }
            }
        }
    }
}

/// One extracted layer as the budget sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resident {
    pub digest: Digest,
    pub bytes: u64,
    last_used: SystemTime,
}

impl LayerCache {
    /// Bounds the cache to `bytes` (None: unbounded), evicting at once if it holds more.
    pub fn set_budget(&self, bytes: Option<u64>) {
        self.budget
            .bytes
            .store(bytes.unwrap_or(0), Ordering::Relaxed);
        self.enforce_budget();
    }

    /// Keeps `stack` in the cache while the returned pins live.
    pub fn pin(&self, stack: &[Digest]) -> LayerPins {
        let mut pins = self
            .budget
            .pins
            .lock()
            .expect("the layer pins are never poisoned");
        let hexes: Vec<String> = stack.iter().map(|d| d.hex()).collect();
        for hex in &hexes {
            *pins.entry(hex.clone()).or_default() += 1;
        }
        LayerPins {
            pins: self.budget.pins.clone(),
            hexes,
        }
    }

    /// Records a use of `digest` (its mark's mtime), for least-recently-used eviction.
    pub(super) fn touch(&self, digest: &Digest) {
        if let Ok(f) = fs::File::options().write(true).open(self.mark(digest)) {
            let _ = f.set_modified(SystemTime::now());
        }
    }

    /// The complete layers in the cache, least recently used first.
    pub fn resident(&self) -> Vec<Resident> {
        let Ok(entries) = fs::read_dir(&self.root) else {
            return Vec::new();
        };
        let mut resident: Vec<Resident> = entries
            .flatten()
            .filter_map(|entry| {
                let name = entry.file_name().to_string_lossy().into_owned();
                let digest = Digest::from_hex(name.strip_suffix(".complete")?).ok()?;
                let meta = entry.metadata().ok()?;
                let bytes = fs::read_to_string(entry.path())
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .unwrap_or_else(|| tree_bytes(&self.path(&digest)));
                Some(Resident {
                    digest,
                    bytes,
                    last_used: meta.modified().ok()?,
                })
            })
            .collect();
        resident.sort_by_key(|r| r.last_used);
        resident
    }

    /// Evicts least recently used, unpinned layers until the cache fits its budget. Best
    /// effort: a failure is logged and leaves the cache larger, never broken.
    pub(super) fn enforce_budget(&self) {
        let budget = self.budget.bytes.load(Ordering::Relaxed);
        if budget == 0 {
            return;
        }
        let resident = self.resident();
        let mut total: u64 = resident.iter().map(|r| r.bytes).sum();
        if total <= budget {
            return;
        }
        let Ok(_publishing) = self.publish_lock() else {
            return;
        };
        let newest = resident.last().map(|r| r.digest);
        for layer in &resident {
            if total <= budget {
                break;
            }
            let pinned = self
                .budget
                .pins
                .lock()
                .expect("the layer pins are never poisoned")
                .contains_key(&layer.digest.hex());
            if pinned || Some(&layer.digest) == newest.as_ref() {
                continue;
            }
            if fs::remove_file(self.mark(&layer.digest)).is_err() {
                continue;
            }
            let aside = self.root.join(format!(
                ".evicted-{}-{}",
                layer.digest.hex(),
                uuid::Uuid::new_v4().simple()
            ));
            if fs::rename(self.path(&layer.digest), &aside).is_ok() {
                let _ = fs::remove_dir_all(&aside);
            }
            total = total.saturating_sub(layer.bytes);
            self.changed();
            tracing::info!(digest = %layer.digest, bytes = layer.bytes, "evicted a least recently used layer from the node's cache to keep it within its budget");
        }
        if total > budget {
            tracing::warn!(
                total,
                budget,
                "the layer cache is over its budget: every remaining layer is in use"
            );
        }
    }
}

/// Bytes of the files under `dir` (allocated blocks, as `du` counts them).
pub fn tree_bytes(dir: &Path) -> u64 {
    tree_bytes_bounded(dir, usize::MAX)
}

/// [`tree_bytes`], reading at most `entries` directory entries: a lower bound when the tree is
/// larger, for trees a tenant controls. By descriptor, never through a link, at any depth
/// ([`super::tree_walk`]); a tree changed under the walk stops it where it was.
pub fn tree_bytes_bounded(dir: &Path, entries: usize) -> u64 {
    use super::tree_walk::{walk, Component, Visit, Visitor};
    use std::os::fd::OwnedFd;

    struct Usage {
        bytes: u64,
        seen: usize,
        limit: usize,
    }
    impl Visitor for Usage {
        fn entry(
            &mut self,
            dir: &OwnedFd,
            name: &Component,
            _kind: rustix::fs::FileType,
        ) -> std::io::Result<Visit> {
            self.seen += 1;
            if let Ok(st) =
                rustix::fs::statat(dir, name.as_os_str(), rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
            {
                self.bytes += st.st_blocks as u64 * 512;
            }
            Ok(Visit::Descend)
        }
        fn done(&self) -> bool {
            self.seen >= self.limit
        }
    }
    let flags = rustix::fs::OFlags::RDONLY
        | rustix::fs::OFlags::DIRECTORY
        | rustix::fs::OFlags::NOFOLLOW
        | rustix::fs::OFlags::CLOEXEC;
    let Ok(root) = rustix::fs::open(dir, flags, rustix::fs::Mode::empty()) else {
        return 0;
    };
    let mut usage = Usage {
        bytes: 0,
        seen: 0,
        limit: entries,
    };
    if let Err(e) = walk(&root, &mut usage) {
        tracing::debug!(dir = %dir.display(), error = %e, "a usage walk stopped early; its count is a lower bound");
    }
    usage.bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bounded_walk_stops_after_its_entries_and_never_follows_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..50 {
            std::fs::write(dir.path().join(format!("f{i}")), vec![1u8; 8192]).unwrap();
        }
        std::os::unix::fs::symlink("/", dir.path().join("root")).unwrap();
        let whole = tree_bytes(dir.path());
        assert!(whole >= 50 * 8192, "{whole}");
        let bounded = tree_bytes_bounded(dir.path(), 10);
        assert!(bounded <= 10 * 16384 && bounded > 0, "{bounded}");
        assert!(
            whole < 1 << 30,
            "the symlink to / was not followed: {whole}"
        );
    }

    #[test]
    fn a_file_below_any_path_the_kernel_takes_is_counted() {
        // 3,000 levels of `d/`: a path to the bottom is 6,000 bytes, past PATH_MAX, where a
        // walk by path stopped counting (a tenant's hiding place).
        let dir = tempfile::tempdir().unwrap();
        let at = crate::vmm::tree_walk::deep_chain(dir.path(), 3_000);
        let mode = rustix::fs::Mode::from_raw_mode(0o644);
        let without = tree_bytes(dir.path());
        let file = rustix::fs::openat(
            &at,
            "bottom",
            rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CREATE,
            mode,
        )
        .unwrap();
        rustix::io::write(&file, &vec![7u8; 4 << 20]).unwrap();
        rustix::fs::fsync(&file).unwrap();
        let with = tree_bytes(dir.path());
        assert!(
            with >= without + (4 << 20),
            "{without} bytes without the file at the bottom, {with} with it"
        );
        // Removed by descriptor too: the temporary directory's own removal goes by path.
        let root = rustix::fs::open(
            dir.path(),
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
            mode,
        )
        .unwrap();
        crate::vmm::tree_walk::empty(&root).unwrap();
    }
    use crate::vmm::blob_store::{BlobStore, LocalBlobStore};
    use crate::vmm::layer::seal_dir;

    /// A layer holding one file of `len` incompressible bytes.
    fn layer(blobs: &dyn BlobStore, name: &str, len: usize) -> Digest {
        let dir = tempfile::tempdir().unwrap();
        let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + name.len()) as u8).collect();
        std::fs::write(dir.path().join(name), bytes).unwrap();
        seal_dir(dir.path(), blobs, crate::vmm::id_range::Owners::AsSandbox)
            .unwrap()
            .digest
    }

    fn setup() -> (tempfile::TempDir, LocalBlobStore, LayerCache) {
        let dir = tempfile::tempdir().unwrap();
        let blobs = LocalBlobStore::open(dir.path().join("blobs")).unwrap();
        let cache = LayerCache::open(dir.path().join("layers"), Default::default()).unwrap();
        (dir, blobs, cache)
    }

    fn resident(cache: &LayerCache) -> Vec<Digest> {
        cache.resident().into_iter().map(|r| r.digest).collect()
    }

    #[test]
    fn least_recently_used_layers_go_first_and_the_budget_holds() {
        let (_dir, blobs, cache) = setup();
        let [a, b, c] = ["a", "b", "c"].map(|n| layer(&blobs, n, 300_000));
        cache.set_budget(Some(700_000));
        cache.ensure(&blobs, &a).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        cache.ensure(&blobs, &b).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        cache.ensure(&blobs, &a).unwrap(); // a is now more recent than b
        std::thread::sleep(std::time::Duration::from_millis(20));
        cache.ensure(&blobs, &c).unwrap();
        assert_eq!(resident(&cache), vec![a, c]);
        assert!(!cache.path(&b).exists(), "the evicted tree is gone");
        let total: u64 = cache.resident().iter().map(|r| r.bytes).sum();
        assert!(total <= 700_000, "{total}");
        // An evicted layer is extracted again on its next use.
        assert!(cache.ensure(&blobs, &b).unwrap().join("b").is_file());
    }

    #[test]
    fn a_pinned_layer_is_never_evicted() {
        let (_dir, blobs, cache) = setup();
        let [a, b, c] = ["a", "b", "c"].map(|n| layer(&blobs, n, 300_000));
        cache.set_budget(Some(400_000));
        let pins = cache.pin(std::slice::from_ref(&a));
        for d in [&a, &b, &c] {
            cache.ensure(&blobs, d).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        // a is pinned, c is the newest: over budget, and b (unpinned, older) went.
        assert_eq!(resident(&cache), vec![a, c]);
        drop(pins);
        cache.set_budget(Some(400_000));
        assert_eq!(resident(&cache), vec![c]);
    }

    #[test]
    fn a_wiped_cache_is_extracted_again_from_the_blobs() {
        let (_dir, blobs, cache) = setup();
        let a = layer(&blobs, "a", 10_000);
        cache.ensure(&blobs, &a).unwrap();
        std::fs::remove_dir_all(&cache.root).unwrap();
        assert!(!cache.contains(&a));
        assert!(cache.ensure(&blobs, &a).unwrap().join("a").is_file());
        assert!(cache.contains(&a));
    }
}
