//! Overlay depth budget.
//!
//! Overlay accepts at most 500 lower directories (measured: 501 fails with EINVAL). A sandbox
//! mounts its whole layer stack as lowers, and every checkpoint adds one. The budget is that
//! limit minus a reserve the caller keeps for the layers a build will still add; a boot over
//! budget is refused before anything is mounted, so the error names the fix (compact) instead
//! of surfacing as EINVAL from the kernel.

use super::error::{Result, VmmError};

/// Overlay's lower-directory limit on the kernels strata runs on.
pub const OVERLAY_MAX_LOWERS: usize = 500;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DepthBudget {
    pub overlay_max: usize,
    /// Lowers kept free for checkpoints taken after boot.
    pub reserved: usize,
}

impl Default for DepthBudget {
    fn default() -> Self {
        DepthBudget {
            overlay_max: OVERLAY_MAX_LOWERS,
            reserved: 0,
        }
    }
}

impl DepthBudget {
    /// How many layers a stack may have at boot.
    pub fn budget(&self) -> usize {
        self.overlay_max.saturating_sub(self.reserved)
    }

    /// Refuses a stack that does not fit.
    pub fn check(&self, depth: usize) -> Result<()> {
        if depth == 0 {
            return Err(VmmError::EmptyStack);
        }
        if depth > self.budget() {
            return Err(VmmError::StackTooDeep {
                depth,
                budget: self.budget(),
                overlay_max: self.overlay_max,
                reserved: self.reserved,
            });
        }
        Ok(())
    }

    /// How many of `mutating_steps` can take a checkpoint on a stack of `depth` layers; the
    /// steps past that run without checkpoints (the RFC's depth rule).
    pub fn checkpoints_allowed(&self, depth: usize, mutating_steps: usize) -> usize {
        self.overlay_max.saturating_sub(depth).min(mutating_steps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_refuses_what_overlay_cannot_mount() {
        let b = DepthBudget::default();
        assert!(b.check(500).is_ok());
        let err = b.check(501).unwrap_err();
        assert!(err.to_string().contains("compact"), "{err}");
        assert!(matches!(
            DepthBudget::default().check(0),
            Err(VmmError::EmptyStack)
        ));
        let r = DepthBudget {
            overlay_max: 500,
            reserved: 10,
        };
        assert!(r.check(491).is_err() && r.check(490).is_ok());
        assert_eq!(b.checkpoints_allowed(498, 5), 2);
    }
}
