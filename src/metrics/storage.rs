//! Bytes on this node's disk, by kind of node state: blobs (uploaded archives, layer tars) and
//! extracted layers under the data dir, measured by walking it. What those bytes are for (roots
//! and retention tiers) is the GC pass's to say (`strata storage`).

use std::path::{Path, PathBuf};

use serde::Serialize;

/// One kind of node state and its size.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct StorageUsage {
    /// `blobs` (content-addressed archives and layer tars) or `layers` (extracted copies).
    pub kind: &'static str,
    pub path: PathBuf,
    pub bytes: u64,
    pub files: u64,
}

/// The node's usage under `data_dir`; a missing directory counts as empty.
pub fn usage(data_dir: &Path) -> Vec<StorageUsage> {
    ["blobs", "layers"]
        .into_iter()
        .map(|kind| {
            let path = data_dir.join(kind);
            let (bytes, files) = walk(&path);
            StorageUsage {
                kind,
                path,
                bytes,
                files,
            }
        })
        .collect()
}

pub use crate::domain::byte_size::human_bytes;

/// Sums regular file sizes below `dir` without following symlinks. Unreadable entries (a
/// sandbox removing its files meanwhile) are skipped: this is a gauge, not an inventory.
fn walk(dir: &Path) -> (u64, u64) {
    let mut bytes = 0;
    let mut files = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.is_file() {
                bytes += meta.len();
                files += 1;
            }
        }
    }
    (bytes, files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_regular_files_of_each_kind() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("blobs/sha256")).unwrap();
        std::fs::write(dir.path().join("blobs/sha256/a"), b"12345").unwrap();
        std::fs::create_dir_all(dir.path().join("layers/x/etc")).unwrap();
        std::fs::write(dir.path().join("layers/x/etc/f"), b"12").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("layers/x/link")).unwrap();
        let u = usage(dir.path());
        assert_eq!((u[0].kind, u[0].bytes, u[0].files), ("blobs", 5, 1));
        assert_eq!((u[1].kind, u[1].bytes, u[1].files), ("layers", 2, 1));
    }
}
