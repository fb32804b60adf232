//! What one pull may expand to on the node's disk, counted across its layers as they stream.
//!
//! A layer's own expansion is capped by the archive policy (and, on a build node, by
//! `STRATA_BUILD_DISK_MAX`), but an image is many layers: 30 layers of 19 GiB of zeros, about
//! 19 MB compressed each, would fill the disk that also holds Postgres (issue 46). Every byte
//! of every layer's tar is charged here as it is read: past the image's ceiling
//! (`STRATA_PULL_MAX_EXPANDED_BYTES`), or once the disk's free space falls to the node's
//! reserve (`STRATA_NODE_DISK_RESERVE`, checked every [`CHECK_EVERY`] bytes), the layer being
//! read fails and with it the pull.

use std::io::{self, Read};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes charged between two looks at the disk's free space.
pub const CHECK_EVERY: u64 = 16 << 20;

/// One pull's expansion so far, and its bounds.
#[derive(Debug)]
pub struct ExpansionBudget {
    used: AtomicU64,
    next_check: AtomicU64,
    max: Option<u64>,
    /// A directory on the disk layers are written to, and the free space a pull must leave.
    reserve: Option<(PathBuf, u64)>,
}

impl ExpansionBudget {
    pub fn new(max: Option<u64>, reserve: Option<(PathBuf, u64)>) -> Arc<ExpansionBudget> {
        Arc::new(ExpansionBudget {
            used: AtomicU64::new(0),
            next_check: AtomicU64::new(0),
            max,
            reserve,
        })
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
        let Some((dir, reserve)) = &self.reserve else {
            return Ok(());
        };
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
        let stat = rustix::fs::statvfs(dir).map_err(io::Error::from)?;
        let free = stat.f_bavail.saturating_mul(stat.f_frsize);
        if free <= *reserve {
            return Err(io::Error::other(format!(
                "the node's disk has {free} bytes free, at or below its reserve of {reserve} \
                 (STRATA_NODE_DISK_RESERVE); the pull stopped after expanding {used} bytes"
            )));
        }
        Ok(())
    }
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
        let budget = ExpansionBudget::new(Some(3 << 20), None);
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
        let budget = ExpansionBudget::new(None, Some((dir.path().to_path_buf(), u64::MAX)));
        let err = budget.charge(1).unwrap_err();
        assert!(
            err.to_string().contains("STRATA_NODE_DISK_RESERVE"),
            "{err}"
        );
        let roomy = ExpansionBudget::new(None, Some((dir.path().to_path_buf(), 0)));
        roomy.charge(CHECK_EVERY * 2).unwrap();
    }
}
