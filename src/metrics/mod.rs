//! Prometheus metrics: the process-wide families, one-line recording functions the rest of the
//! code calls, and the text exposition served on `GET /metrics` (ADR 0015).
//!
//! Layout: the families (one `LazyLock` each, registered in the default registry on first use);
//! the recording functions, grouped by the part of strata that calls them; [`render`].
//! Gauges that describe shared state (builds by phase, queue depth, bytes on disk) are not kept
//! by any one process: [`scrape`] reads them from the read models and the data dir when the
//! endpoint is scraped; [`storage`] measures the data dir for them and for the operator page.
//!
//! Names follow the Prometheus conventions: `strata_` prefix, base units (`_seconds`,
//! `_bytes`), `_total` for counters. Labels have small, fixed value sets (phase, kind, outcome,
//! reconciler name); never a build, team or template id.

pub mod scrape;
pub mod server;
pub mod storage;
pub mod storage_cache;

use std::sync::LazyLock;
use std::time::Duration;

use prometheus::{
    register_histogram_vec, register_int_counter, register_int_counter_vec, HistogramVec,
    IntCounter, IntCounterVec,
};

use crate::domain::build::CacheFound;

/// Buckets for operations from milliseconds to an hour (steps, builds, queue waits).
const LONG_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
    3600.0,
];
/// Buckets for operations that should take milliseconds (appends, boots).
const SHORT_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

// ---------------------------------------------------------------------------------------------
// Families
// ---------------------------------------------------------------------------------------------

static BUILDS_FINISHED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "strata_worker_builds_finished_total",
        "Builds this worker ran to an end, by outcome (ready, failed, abandoned).",
        &["outcome"]
    )
    .expect("metric registers once")
});
static BUILD_DURATION: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        "strata_worker_build_duration_seconds",
        "Time from acquiring a build to its end on this worker, by outcome.",
        &["outcome"],
        LONG_BUCKETS.to_vec()
    )
    .expect("metric registers once")
});
static QUEUE_WAIT: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        "strata_build_queue_wait_seconds",
        "Time a started build waited in the queue until a worker acquired it.",
        &[],
        LONG_BUCKETS.to_vec()
    )
    .expect("metric registers once")
});
static STEP_DURATION: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        "strata_build_step_duration_seconds",
        "Time one executed build step took, by kind (RUN, COPY, ENV, WORKDIR, USER) and outcome.",
        &["kind", "outcome"],
        LONG_BUCKETS.to_vec()
    )
    .expect("metric registers once")
});
static PLACEMENTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "strata_placement_claims_total",
        "Builds this worker claimed while another node was live, by cache-aware placement's \
         verdict: hit (this node held at least as much of the build's layers as any live node), \
         miss (another node held more; taken once the placement wait passed), none (no live \
         node held any, or the layers could not be told).",
        &["verdict"]
    )
    .expect("metric registers once")
});
static PLACEMENT_DEFERRALS: LazyLock<IntCounter> = LazyLock::new(|| {
    register_int_counter!(
        "strata_placement_deferrals_total",
        "Queued builds this worker left to a node holding more of their layers (once per build)."
    )
    .expect("metric registers once")
});
static CACHE_LOOKUPS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "strata_cache_lookups_total",
        "Step-cache probes by outcome: hit, miss, unapplied (found but not usable here), \
         bypass (the index could not be read; the build ran without the cache).",
        &["outcome"]
    )
    .expect("metric registers once")
});
static UPLOAD_BYTES: LazyLock<IntCounter> = LazyLock::new(|| {
    register_int_counter!(
        "strata_upload_bytes_total",
        "Bytes of context archives received and stored."
    )
    .expect("metric registers once")
});
static UPLOADS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "strata_uploads_total",
        "Context archive uploads by outcome (stored, rejected).",
        &["outcome"]
    )
    .expect("metric registers once")
});
static UPLOAD_DURATION: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        "strata_upload_duration_seconds",
        "Time to receive, hash and store one context archive.",
        &[],
        LONG_BUCKETS.to_vec()
    )
    .expect("metric registers once")
});
static SANDBOX_BOOTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "strata_sandbox_boots_total",
        "Build sandboxes booted, by outcome (ok, error).",
        &["outcome"]
    )
    .expect("metric registers once")
});
static SANDBOX_BOOT_DURATION: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        "strata_sandbox_boot_duration_seconds",
        "Time to boot one build sandbox on its layer stack.",
        &[],
        SHORT_BUCKETS.to_vec()
    )
    .expect("metric registers once")
});
static SANDBOX_CREATES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "strata_sandbox_creates_total",
        "Sandbox.create calls by outcome (running, failed, refused).",
        &["outcome"]
    )
    .expect("metric registers once")
});
static SANDBOX_CREATE_DURATION: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        "strata_sandbox_create_duration_seconds",
        "From a Sandbox.create call to its answer that the sandbox runs (placement, boot, start and ready commands).",
        &[],
        SHORT_BUCKETS.to_vec()
    )
    .expect("metric registers once")
});
static RECONCILER_PASSES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "strata_reconciler_passes_total",
        "Reconciler passes by reconciler and outcome (ok, error).",
        &["reconciler", "outcome"]
    )
    .expect("metric registers once")
});
static RECONCILER_PASS_DURATION: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        "strata_reconciler_pass_duration_seconds",
        "Time one reconciler pass took.",
        &["reconciler"],
        SHORT_BUCKETS.to_vec()
    )
    .expect("metric registers once")
});
static RECONCILER_CANDIDATES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "strata_reconciler_candidates_total",
        "Due candidates reconcilers handled, by result (applied, skipped, failed).",
        &["reconciler", "result"]
    )
    .expect("metric registers once")
});
static RECONCILER_LAG: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        "strata_reconciler_lag_seconds",
        "How long after it was due (lease expiry, deadline) a reconciler applied a transition, \
         by the database clock.",
        &["reconciler"],
        LONG_BUCKETS.to_vec()
    )
    .expect("metric registers once")
});
static EVENT_APPENDS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "strata_event_appends_total",
        "Event store appends by outcome (appended, replay, version_conflict, event_ids_reused, \
         invalid, retries_exhausted, database_error).",
        &["outcome"]
    )
    .expect("metric registers once")
});
static EVENTS_APPENDED: LazyLock<IntCounter> = LazyLock::new(|| {
    register_int_counter!(
        "strata_events_appended_total",
        "Events written by successful appends (replays not counted)."
    )
    .expect("metric registers once")
});
static APPEND_RETRIES: LazyLock<IntCounter> = LazyLock::new(|| {
    register_int_counter!(
        "strata_event_append_serialization_retries_total",
        "Append transactions re-run after a serialization failure."
    )
    .expect("metric registers once")
});
static APPEND_DURATION: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        "strata_event_append_duration_seconds",
        "Time one append took, retries included.",
        &[],
        SHORT_BUCKETS.to_vec()
    )
    .expect("metric registers once")
});

// ---------------------------------------------------------------------------------------------
// Recording: worker
// ---------------------------------------------------------------------------------------------

/// A build ended on this worker: `ready`, `failed` or `abandoned` (fenced out, lease lost).
pub fn build_finished(outcome: &str, took: Duration) {
    BUILDS_FINISHED.with_label_values(&[outcome]).inc();
    BUILD_DURATION
        .with_label_values(&[outcome])
        .observe(took.as_secs_f64());
}

pub fn queue_wait(seconds: f64) {
    QUEUE_WAIT
        .with_label_values(&[] as &[&str])
        .observe(seconds.max(0.0));
}

/// One executed step: `ok` or `failed` (abandoned steps are not counted).
pub fn step_finished(kind: &str, ok: bool, took: Duration) {
    STEP_DURATION
        .with_label_values(&[kind, if ok { "ok" } else { "failed" }])
        .observe(took.as_secs_f64());
}

/// A build claimed with placement's `verdict` (`hit`, `miss`, `none`).
pub fn placement_claim(verdict: &str) {
    PLACEMENTS.with_label_values(&[verdict]).inc();
}

/// A queued build left to another node.
pub fn placement_deferred() {
    PLACEMENT_DEFERRALS.inc();
}

/// One cache probe's verdict: `hit`, `miss` or `unapplied`.
pub fn cache_probe(outcome: &str) {
    CACHE_LOOKUPS.with_label_values(&[outcome]).inc();
}

/// The lookup as a whole: only a bypass is counted here (probes count themselves).
pub fn cache_lookup(found: &CacheFound) {
    if let CacheFound::Bypassed { .. } = found {
        CACHE_LOOKUPS.with_label_values(&["bypass"]).inc();
    }
}

pub fn sandbox_boot(ok: bool, took: Duration) {
    SANDBOX_BOOTS
        .with_label_values(&[if ok { "ok" } else { "error" }])
        .inc();
    if ok {
        SANDBOX_BOOT_DURATION
            .with_label_values(&[] as &[&str])
            .observe(took.as_secs_f64());
    }
}

// ---------------------------------------------------------------------------------------------
// Recording: API
// ---------------------------------------------------------------------------------------------

/// A `Sandbox.create` call's outcome, and how long it took when the sandbox runs.
pub fn sandbox_create(outcome: &str, took: Duration) {
    SANDBOX_CREATES.with_label_values(&[outcome]).inc();
    if outcome == "running" {
        SANDBOX_CREATE_DURATION
            .with_label_values(&[] as &[&str])
            .observe(took.as_secs_f64());
    }
}

/// A context archive upload: its size when stored, `None` when rejected.
pub fn upload(stored: Option<u64>, took: Duration) {
    match stored {
        Some(bytes) => {
            UPLOADS.with_label_values(&["stored"]).inc();
            UPLOAD_BYTES.inc_by(bytes);
            UPLOAD_DURATION
                .with_label_values(&[] as &[&str])
                .observe(took.as_secs_f64());
        }
        None => UPLOADS.with_label_values(&["rejected"]).inc(),
    }
}

// ---------------------------------------------------------------------------------------------
// Recording: reconcilers
// ---------------------------------------------------------------------------------------------

/// One pass: `None` when it failed as a whole.
pub fn reconciler_pass(reconciler: &str, took: Duration, counts: Option<(usize, usize, usize)>) {
    RECONCILER_PASS_DURATION
        .with_label_values(&[reconciler])
        .observe(took.as_secs_f64());
    match counts {
        Some((applied, skipped, failed)) => {
            RECONCILER_PASSES
                .with_label_values(&[reconciler, "ok"])
                .inc();
            for (result, n) in [
                ("applied", applied),
                ("skipped", skipped),
                ("failed", failed),
            ] {
                RECONCILER_CANDIDATES
                    .with_label_values(&[reconciler, result])
                    .inc_by(n as u64);
            }
        }
        None => RECONCILER_PASSES
            .with_label_values(&[reconciler, "error"])
            .inc(),
    }
}

/// A transition applied `lag` after it was due.
pub fn reconciler_lag(reconciler: &str, lag: chrono::Duration) {
    RECONCILER_LAG
        .with_label_values(&[reconciler])
        .observe((lag.num_milliseconds().max(0) as f64) / 1000.0);
}

// ---------------------------------------------------------------------------------------------
// Recording: event store
// ---------------------------------------------------------------------------------------------

/// One append call: its outcome label, events written, transactions it took.
pub fn event_append(outcome: &str, events: usize, attempts: u32, took: Duration) {
    EVENT_APPENDS.with_label_values(&[outcome]).inc();
    if outcome == "appended" {
        EVENTS_APPENDED.inc_by(events as u64);
    }
    if attempts > 1 {
        APPEND_RETRIES.inc_by(u64::from(attempts - 1));
    }
    APPEND_DURATION
        .with_label_values(&[] as &[&str])
        .observe(took.as_secs_f64());
}

// ---------------------------------------------------------------------------------------------
// Exposition
// ---------------------------------------------------------------------------------------------

/// Touches every family so a scrape lists them all from the start (a counter that has never
/// moved is exported as 0 rather than missing, so `rate()` works from the first sample).
fn touch_all() {
    for outcome in ["ready", "failed", "abandoned"] {
        BUILDS_FINISHED.with_label_values(&[outcome]);
    }
    for outcome in ["hit", "miss", "unapplied", "bypass"] {
        CACHE_LOOKUPS.with_label_values(&[outcome]);
    }
    LazyLock::force(&BUILD_DURATION);
    LazyLock::force(&QUEUE_WAIT);
    LazyLock::force(&STEP_DURATION);
    LazyLock::force(&UPLOAD_BYTES);
    for outcome in ["stored", "rejected"] {
        UPLOADS.with_label_values(&[outcome]);
    }
    LazyLock::force(&UPLOAD_DURATION);
    for outcome in ["ok", "error"] {
        SANDBOX_BOOTS.with_label_values(&[outcome]);
    }
    LazyLock::force(&SANDBOX_BOOT_DURATION);
    for outcome in ["running", "failed", "refused"] {
        SANDBOX_CREATES.with_label_values(&[outcome]);
    }
    LazyLock::force(&SANDBOX_CREATE_DURATION);
    LazyLock::force(&RECONCILER_PASSES);
    LazyLock::force(&RECONCILER_PASS_DURATION);
    LazyLock::force(&RECONCILER_CANDIDATES);
    LazyLock::force(&RECONCILER_LAG);
    for outcome in ["appended", "version_conflict"] {
        EVENT_APPENDS.with_label_values(&[outcome]);
    }
    LazyLock::force(&EVENTS_APPENDED);
    LazyLock::force(&APPEND_RETRIES);
    LazyLock::force(&APPEND_DURATION);
}

/// The default registry in the Prometheus text format.
pub fn render() -> String {
    touch_all();
    let families = prometheus::gather();
    prometheus::TextEncoder::new()
        .encode_to_string(&families)
        .unwrap_or_else(|e| format!("# encoding metrics failed: {e}\n"))
}

/// The content type of [`render`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

// ---------------------------------------------------------------------------------------------
// Worker helpers that read what they record
// ---------------------------------------------------------------------------------------------

/// Observes how long `build` waited between its start (`BuildFrozen`) and its acquisition
/// (`AttemptAcquired`), by the recorded times. Best effort: a failed read records nothing.
pub async fn queue_wait_of(store: &crate::events::EventStore, build: crate::domain::ids::BuildId) {
    let stream = crate::streams::build_stream(&build);
    let waited: Result<Option<f64>, sqlx::Error> = sqlx::query_scalar(
        "SELECT extract(epoch FROM max(recorded_at) FILTER (WHERE type LIKE 'AttemptAcquired.%')
                              - max(recorded_at) FILTER (WHERE type LIKE 'BuildFrozen.%'))::float8
         FROM events WHERE stream_id = $1",
    )
    .bind(stream.as_str())
    .fetch_one(store.pool())
    .await;
    if let Ok(Some(seconds)) = waited {
        queue_wait(seconds);
    }
}

/// Records a build's end on this worker: `abandoned` when the attempt stopped without a terminal
/// write, otherwise the phase the build reached (`ready`, or `failed` for error), as the builds
/// read model (`phase`, read by the caller) shows it.
pub fn build_finished_in(phase: Option<&str>, completed: bool, started: std::time::Instant) {
    let outcome = match (completed, phase) {
        (true, Some("ready")) => "ready",
        (true, Some("error")) => "failed",
        _ => "abandoned",
    };
    build_finished(outcome, started.elapsed());
}
