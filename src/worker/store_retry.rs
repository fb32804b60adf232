//! Riding out a brief store outage inside the lease.
//!
//! A worker write that fails because the database could not be reached (a restart, a dropped
//! connection, an overloaded server) is not a verdict on the attempt: the attempt still holds
//! the build until its lease passes. So the write is tried again, with backoff, for at most the
//! lease's duration, each failure logged as an error; only then is the attempt given up, and the
//! attempt-expiry or promotion reconciler takes over as for a lost node. Refusals, fencing and
//! defects are returned at once: retrying cannot change them.

use std::future::Future;
use std::time::{Duration, Instant};

use super::error::WorkerError;
use crate::domain::ids::BuildId;

const FIRST_DELAY: Duration = Duration::from_millis(100);
const MAX_DELAY: Duration = Duration::from_secs(2);

/// Runs `op` until it succeeds, fails with anything but [`WorkerError::is_unavailable`], or
/// `budget` would pass before the next try.
pub async fn retrying<T, F, Fut>(
    what: &str,
    build: BuildId,
    budget: Duration,
    op: F,
) -> Result<T, WorkerError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, WorkerError>>,
{
    retrying_when(what, build, budget, WorkerError::is_unavailable, op).await
}

/// [`retrying`] for any error type, with `unavailable` telling which errors are the store's.
pub async fn retrying_when<T, E, F, Fut>(
    what: &str,
    build: BuildId,
    budget: Duration,
    unavailable: impl Fn(&E) -> bool,
    mut op: F,
) -> Result<T, E>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let started = Instant::now();
    let mut delay = FIRST_DELAY;
    let mut tries = 1u32;
    loop {
        match op().await {
            Err(e) if unavailable(&e) && started.elapsed() + delay < budget => {
                tracing::error!(
                    %build, what, tries, error = %e, retry_in_ms = delay.as_millis() as u64,
                    "the store is unavailable; retrying within the lease"
                );
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_DELAY);
                tries += 1;
            }
            Err(e) if unavailable(&e) => {
                tracing::error!(%build, what, tries, error = %e, "the store stayed unavailable for the whole lease; giving up");
                return Err(e);
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn build() -> BuildId {
        BuildId::from_uuid(uuid::Uuid::now_v7())
    }

    #[tokio::test]
    async fn an_outage_shorter_than_the_budget_is_ridden_out() {
        let calls = AtomicU32::new(0);
        let out = retrying("test", build(), Duration::from_secs(2), || async {
            match calls.fetch_add(1, Ordering::SeqCst) {
                0..=2 => Err(WorkerError::Unavailable("connection refused".into())),
                _ => Ok(7),
            }
        })
        .await;
        assert_eq!(out.unwrap(), 7);
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn an_outage_longer_than_the_budget_gives_up_with_the_store_error() {
        let calls = AtomicU32::new(0);
        let out: Result<(), _> = retrying("test", build(), Duration::from_millis(1000), || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(WorkerError::Unavailable("connection refused".into()))
        })
        .await;
        assert!(matches!(out, Err(WorkerError::Unavailable(_))));
        // 0.1 + 0.2 + 0.4 = 0.7 s of waiting; the next 0.8 s would pass the budget.
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn fencing_and_defects_are_not_retried() {
        let calls = AtomicU32::new(0);
        let b = build();
        let out: Result<(), _> = retrying("test", b, Duration::from_secs(10), || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(WorkerError::Fenced {
                build: b,
                epoch: crate::domain::ids::Epoch(1),
                reason: super::super::error::Fence::Stopped,
            })
        })
        .await;
        assert!(matches!(out, Err(WorkerError::Fenced { .. })));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
