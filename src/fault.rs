//! Fault injection for crash tests: a process that reaches a named crash point while
//! `STRATA_FAULT_CRASH_AT` names it kills itself with SIGKILL, exactly as `kill -9` would, so the
//! crash matrix can stop a worker between two promotion steps that no outside signal could hit
//! reliably.
//!
//! Off by default: with the variable unset (every deployment), a crash point is one environment
//! lookup and nothing else. Never set it outside tests.
//!
//! Points: `worker:before-first-step`, `worker:mid-copy` (archive extracted, checkpoint not yet
//! sealed), `worker:after-checkpoint-record` (a step's snapshot, progress and cache entry
//! appended, nothing after), `worker:after-last-step`, `worker:after-publishing`,
//! `promotion:after-layers-committed`, `promotion:before-visible`, `promotion:after-visible`,
//! `sandbox:placed` (a launched sandbox placed on this node, not booted yet).
//!
//! Stop points: a process that reaches the point named by `STRATA_FAULT_STOP_AT` stops itself
//! with SIGSTOP, once, so a test can change the world at exactly that moment (take the database
//! away, delete a template) and then resume it with SIGCONT.
//!
//! Stop points: `worker:before-checkpoint-record` (a step's checkpoint sealed, its snapshot and
//! step record not yet written), `worker:before-publishing` (the result recorded, Publishing
//! not yet entered), `promotion:before-visible` (layers committed, the template's flip not yet
//! made; in the worker's drive and the promotion reconciler's alike), `layers:staged` (a layer's
//! locked staging directory created, nothing extracted into it yet).

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

/// The environment variable naming the one stop point that fires (once per process).
pub const STOP_AT_ENV: &str = "STRATA_FAULT_STOP_AT";

/// Stops this process with SIGSTOP the first time it reaches `point` while
/// `STRATA_FAULT_STOP_AT` is `point`; it runs on when it receives SIGCONT.
pub fn stop_point(point: &str) {
    static STOPPED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if std::env::var(STOP_AT_ENV).is_ok_and(|p| p == point)
        && !STOPPED.swap(true, std::sync::atomic::Ordering::SeqCst)
    {
        eprintln!("fault injection: stopping at {point} ({STOP_AT_ENV})");
        // SAFETY: kill(2) on our own pid; the process resumes on SIGCONT.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGSTOP);
        }
    }
}
