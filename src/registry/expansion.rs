//! What one pull may expand to on the node's disk, counted across its layers as they stream.
//!
//! A layer's own expansion is capped by the archive policy (and, on a build node, by
//! `STRATA_BUILD_DISK_MAX`), but an image is many layers: 30 layers of 19 GiB of zeros, about
//! 19 MB compressed each, would fill the disk that also holds Postgres (issue 46), and 30
//! layers of 4 million empty files would take every inode it has. Every byte and every entry
//! of every layer's tar is charged here as it is read: past the image's ceilings
//! (`STRATA_PULL_MAX_EXPANDED_BYTES`, `STRATA_PULL_MAX_ENTRIES`), or once the disk's free
//! space or free inodes fall to the node's reserve (`STRATA_NODE_DISK_RESERVE`, and the same
//! share of the disk's inodes; looked at every [`CHECK_EVERY`] bytes or
//! [`CHECK_EVERY_ENTRIES`] entries), the layer being read fails and with it the pull.

use std::io::{self, Read};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes charged between two looks at the disk's free space.
pub const CHECK_EVERY: u64 = 16 << 20;
/// Entries charged between two looks at the disk's free inodes.
pub const CHECK_EVERY_ENTRIES: u64 = 1 << 16;
/// The fewest inodes a pull leaves free, however small the byte reserve is.
const MIN_INODE_RESERVE: u64 = 10_000;

/// One pull's expansion so far, and its bounds.
#[derive(Debug)]
pub struct ExpansionBudget {
    used: AtomicU64,
    next_check: AtomicU64,
    entries: AtomicU64,
    max: Option<u64>,
    max_entries: Option<u64>,
    /// A directory on the disk layers are written to, and the free space a pull must leave.
    reserve: Option<(PathBuf, u64)>,
}

impl ExpansionBudget {
    /// `max` bytes and `max_entries` entries for the whole pull; `reserve`, the free space the
    /// disk of a directory must keep (and the same share of its inodes).
    pub fn new(
        max: Option<u64>,
        max_entries: Option<u64>,
        reserve: Option<(PathBuf, u64)>,
    ) -> Arc<ExpansionBudget> {
        Arc::new(ExpansionBudget {
            used: AtomicU64::new(0),
            next_check: AtomicU64::new(0),
            entries: AtomicU64::new(0),
            max,
            max_entries,
            reserve,
        })
    }

    /// Charges one more entry (a file, directory, link: an inode at most); an error once the
    /// pull's ceiling is passed or, at every [`CHECK_EVERY_ENTRIES`]th, the disk is at its
    /// inode reserve.
    pub fn charge_entry(&self) -> io::Result<()> {
        let entries = self.entries.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some(max) = self.max_entries.filter(|max| entries > *max) {
            return Err(io::Error::other(format!(
                "the image holds more than {max} files, directories and links, the most one \
                 pull may write (STRATA_PULL_MAX_ENTRIES)"
            )));
        }
        if entries % CHECK_EVERY_ENTRIES == 0 {
            self.look(self.used.load(Ordering::Relaxed))?;
        }
        Ok(())
    }

    /// Charges `n` more bytes; an error (naming the bound and its setting) once one is passed.
    pub fn charge(&self, n: u64) -> io::Result<()> {
        let used = self.used.fetch_add(n, Ordering::Relaxed) + n;
        if let Some(max) = self.max.filter(|max| used > *max) {
            return Err(io::Error::other(format!(
                "the image expands to more than {max} bytes, the most one pull may write \
                 (STRATA_PULL_MAX_EXPANDED_BYTES)"
            )));
        }
        if self.reserve.is_none() {
            return Ok(());
        }
        let due = self.next_check.load(Ordering::Relaxed);
        if used < due
            || self
                .next_check
                .compare_exchange(
                    due,
                    used + CHECK_EVERY,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return Ok(());
        }
        self.look(used)
    }

    /// Looks at the disk: an error when its free space or free inodes are at the reserve.
    fn look(&self, used: u64) -> io::Result<()> {
        let Some((dir, reserve)) = &self.reserve else {
            return Ok(());
        };
        let stat = rustix::fs::statvfs(dir).map_err(io::Error::from)?;
        let free = stat.f_bavail.saturating_mul(stat.f_frsize);
        if free <= *reserve {
            return Err(io::Error::other(format!(
                "the node's disk has {free} bytes free, at or below its reserve of {reserve} \
                 (STRATA_NODE_DISK_RESERVE); the pull stopped after expanding {used} bytes"
            )));
        }
        let disk = stat.f_blocks.saturating_mul(stat.f_frsize);
        let inodes = inode_reserve(stat.f_files, disk, *reserve);
        // Filesystems that make inodes as they need them (btrfs, XFS on some kernels) say 0.
        if stat.f_files > 0 && stat.f_favail <= inodes {
            return Err(io::Error::other(format!(
                "the node's disk has {} inodes free, at or below its reserve of {inodes} (the \
                 share of its {} inodes that STRATA_NODE_DISK_RESERVE is of its bytes); the \
                 pull stopped after {} entries",
                stat.f_favail,
                stat.f_files,
                self.entries.load(Ordering::Relaxed)
            )));
        }
        Ok(())
    }
}

/// The inodes a disk of `disk` bytes and `inodes` inodes keeps free: the share of them its byte
/// reserve is of its bytes, and never fewer than [`MIN_INODE_RESERVE`].
fn inode_reserve(inodes: u64, disk: u64, reserve: u64) -> u64 {
    let share = if disk == 0 {
        0
    } else {
        (u128::from(inodes) * u128::from(reserve.min(disk)) / u128::from(disk)) as u64
    };
    share.max(MIN_INODE_RESERVE.min(inodes))
}

/// A layer's tar as it is read, each byte charged to the pull's [`ExpansionBudget`].
pub struct Charged<'a, R> {
    pub inner: R,
    pub budget: &'a ExpansionBudget,
}

impl<R: Read> Read for Charged<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.budget.charge(n as u64)?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ceiling_counts_every_layer_of_the_pull() {
        let budget = ExpansionBudget::new(Some(3 << 20), None, None);
        for _ in 0..3 {
            budget.charge(1 << 20).unwrap();
        }
        let err = budget.charge(1).unwrap_err();
        assert!(
            err.to_string().contains("STRATA_PULL_MAX_EXPANDED_BYTES"),
            "{err}"
        );
    }

    #[test]
    fn a_reserve_beyond_the_free_space_stops_the_pull_at_its_first_look() {
        let dir = tempfile::tempdir().unwrap();
        let budget = ExpansionBudget::new(None, None, Some((dir.path().to_path_buf(), u64::MAX)));
        let err = budget.charge(1).unwrap_err();
        assert!(
            err.to_string().contains("STRATA_NODE_DISK_RESERVE"),
            "{err}"
        );
        let roomy = ExpansionBudget::new(None, None, Some((dir.path().to_path_buf(), 0)));
        roomy.charge(CHECK_EVERY * 2).unwrap();
        for _ in 0..CHECK_EVERY_ENTRIES * 2 {
            roomy.charge_entry().unwrap();
        }
    }

    #[test]
    fn the_entries_of_every_layer_count_against_one_ceiling() {
        let budget = ExpansionBudget::new(None, Some(5), None);
        for _ in 0..5 {
            budget.charge_entry().unwrap();
        }
        let err = budget.charge_entry().unwrap_err();
        assert!(err.to_string().contains("STRATA_PULL_MAX_ENTRIES"), "{err}");
    }

    #[test]
    fn a_disk_keeps_the_share_of_its_inodes_its_byte_reserve_is_of_its_bytes() {
        // 16.7 M inodes on 252 GiB with a 4 GiB reserve: 1/63 of them.
        assert_eq!(inode_reserve(16_777_216, 252 << 30, 4 << 30), 266_305);
        // A tiny reserve still keeps a floor; a disk with fewer inodes than the floor keeps all.
        assert_eq!(inode_reserve(16_777_216, 252 << 30, 0), MIN_INODE_RESERVE);
        assert_eq!(inode_reserve(5_000, 1 << 30, 0), 5_000);
        // A reserve larger than the disk keeps every inode.
        assert_eq!(inode_reserve(1_000_000, 1 << 30, 1 << 40), 1_000_000);
    }
}
