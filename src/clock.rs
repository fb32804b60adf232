//! The two clocks strata reads, and which decides what.
//!
//! Every lease, deadline and expiry (waiting and queue deadlines, upload-link and intent expiry,
//! attempt leases) is judged by the database's clock ([`crate::streams::database_now`]), the one
//! clock all API nodes, workers and reconcilers share; a node whose own clock drifts then
//! still agrees with the others. The local clock ([`local_now`]) is only for what decides
//! nothing: log line times, benchmark and CLI timestamps, and when the next reconciler pass is
//! due.
//!
//! Fault injection: [`skew_local_clock`] shifts [`local_now`] for the whole process, so a test
//! can show that a drifting local clock changes no decision. Nothing calls it outside tests.

use std::sync::atomic::{AtomicI64, Ordering};

use chrono::{DateTime, Utc};

/// The fault-injected offset of [`local_now`], in milliseconds; zero unless a test sets it.
static LOCAL_SKEW_MS: AtomicI64 = AtomicI64::new(0);

/// This machine's clock (plus any injected skew). Never for a lease, deadline or expiry.
pub fn local_now() -> DateTime<Utc> {
    Utc::now() + chrono::Duration::milliseconds(LOCAL_SKEW_MS.load(Ordering::Relaxed))
}

/// Fault injection, for tests only: makes [`local_now`] run `skew` ahead (or behind, when
/// negative) of the real clock, for the whole process.
pub fn skew_local_clock(skew: chrono::Duration) {
    LOCAL_SKEW_MS.store(skew.num_milliseconds(), Ordering::Relaxed);
}
