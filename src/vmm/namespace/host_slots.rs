//! Numbered slots every process on the host shares: one lock file per slot in a directory
//! under `/run/strata`, held (`flock(2)`) for as long as the slot's user lives. The kernel drops
//! a lock when its process dies, however it dies, so a slot is never leaked by a crash, and two
//! strata processes on one host (a server and a worker, two test fixtures) never hold the same
//! slot. Slots are taken round-robin from a random start, so a freed slot is not reused at once.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// `count` slots numbered `first..first + count`; slot `n` is locked by `<dir>/<prefix><n>.lock`.
#[derive(Debug)]
pub struct HostSlots {
    dir: PathBuf,
    prefix: &'static str,
    first: u32,
    count: u32,
    next: AtomicU32,
}

/// A slot this process holds until it is dropped.
#[derive(Debug)]
pub struct HeldSlot {
    number: u32,
    _lock: File,
}

impl HeldSlot {
    /// The slot's number, `first..first + count`.
    pub fn number(&self) -> u32 {
        self.number
    }
}

impl HostSlots {
    /// Slots `first..first + count` in `dir` (made if missing). `count` must not be 0.
    pub fn new(
        dir: impl Into<PathBuf>,
        prefix: &'static str,
        first: u32,
        count: u32,
    ) -> std::io::Result<HostSlots> {
        assert!(count > 0, "a slot pool needs at least one slot");
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        Ok(HostSlots {
            dir,
            prefix,
            first,
            count,
            next: AtomicU32::new(rand::random::<u32>() % count),
        })
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A free slot, or `Ok(None)` when every slot is held.
    pub fn take(&self) -> std::io::Result<Option<HeldSlot>> {
        for _ in 0..self.count {
            let number = self.first + self.next.fetch_add(1, Ordering::Relaxed) % self.count;
            let path = self.dir.join(format!("{}{number}.lock", self.prefix));
            let lock = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)?;
            // SAFETY: flock on a descriptor we own.
            if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Ok(Some(HeldSlot {
                    number,
                    _lock: lock,
                }));
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_slot_is_held_once_until_dropped_then_free_again() {
        let dir = tempfile::tempdir().unwrap();
        let slots = HostSlots::new(dir.path(), "s", 10, 3).unwrap();
        // A second pool on the same directory stands for another process: flock locks belong
        // to the open file description, so the pools exclude each other as processes do.
        let other = HostSlots::new(dir.path(), "s", 10, 3).unwrap();
        let a = slots.take().unwrap().unwrap();
        let b = other.take().unwrap().unwrap();
        let c = slots.take().unwrap().unwrap();
        let mut numbers = [a.number(), b.number(), c.number()];
        numbers.sort();
        assert_eq!(numbers, [10, 11, 12]);
        assert!(slots.take().unwrap().is_none(), "all three are held");
        assert!(other.take().unwrap().is_none());
        let freed = b.number();
        drop(b);
        assert_eq!(slots.take().unwrap().unwrap().number(), freed);
    }
}
