//! How often and how patiently an append re-runs after a serialization failure.

use std::time::Duration;

use rand::Rng;

/// Bounded retries with jittered exponential backoff. SERIALIZABLE transactions fail each other
/// at page granularity even on unrelated streams, so a few retries are normal under load; an
/// unbounded loop would turn an overloaded database into a hang.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Attempts in total, including the first. At least 1.
    pub max_attempts: u32,
    pub base_delay: Duration,
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 12,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(100),
        }
    }
}

impl RetryPolicy {
    /// Delay before attempt `attempt + 1` (attempt counts from 1): uniformly random in
    /// `[0, min(max_delay, base_delay * 2^attempt))`, so retrying writers spread out.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let ceiling = self
            .base_delay
            .saturating_mul(1u32.checked_shl(attempt.min(20)).unwrap_or(u32::MAX))
            .min(self.max_delay);
        let micros = ceiling.as_micros().max(1) as u64;
        Duration::from_micros(rand::thread_rng().gen_range(0..micros))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_stays_under_the_ceiling() {
        let p = RetryPolicy::default();
        for attempt in 1..40 {
            assert!(p.backoff(attempt) < p.max_delay);
        }
        assert!(p.backoff(1) < Duration::from_millis(2));
    }
}
