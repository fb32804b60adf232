//! Fault injection for crash tests: a process that reaches a named crash point while
//! `STRATA_FAULT_CRASH_AT` names it kills itself with SIGKILL, exactly as `kill -9` would, so the
//! crash matrix can stop a worker between two promotion steps that no outside signal could hit
//! reliably.
//!
//! Off by default: with the variable unset (every deployment), a crash point is one environment
//! lookup and nothing else. Never set it outside tests.
//!
//! Points: `worker:before-first-step`, `worker:mid-copy` (archive extracted, checkpoint not yet
//! sealed), `worker:after-last-step`, `worker:after-publishing`,
//! `promotion:after-layers-committed`, `promotion:after-visible`.

/// The environment variable naming the one crash point that fires.
pub const CRASH_AT_ENV: &str = "STRATA_FAULT_CRASH_AT";

/// Kills this process with SIGKILL when `STRATA_FAULT_CRASH_AT` is `point`.
pub fn crash_point(point: &str) {
    if std::env::var(CRASH_AT_ENV).is_ok_and(|p| p == point) {
        eprintln!("fault injection: crashing at {point} ({CRASH_AT_ENV})");
        // SAFETY: kill(2) on our own pid; SIGKILL cannot be caught, nothing runs after it.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}
