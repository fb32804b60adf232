//! Gauges read at scrape time: they describe state shared by every process (the `builds` read
//! model) or owned by the node (its data dir), so no process keeps them in memory.

use std::path::PathBuf;
use std::sync::{Arc, LazyLock};

use futures::future::BoxFuture;
use prometheus::{register_gauge, register_int_gauge_vec, Gauge, IntGaugeVec};

static BUILDS: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        "strata_builds",
        "Builds by phase (waiting, queued, active, publishing, ready, error), from the builds \
         read model; ready and error are cumulative outcomes.",
        &["phase"]
    )
    .expect("metric registers once")
});
static SANDBOXES: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        "strata_sandboxes",
        "Launched sandboxes by state (requested, placed, running, pausing, paused, ended), from \
         the sandboxes read model; ended is cumulative.",
        &["state"]
    )
    .expect("metric registers once")
});
const SANDBOX_STATES: [&str; 6] = [
    "requested",
    "placed",
    "running",
    "pausing",
    "paused",
    "ended",
];

static QUEUE_OLDEST: LazyLock<Gauge> = LazyLock::new(|| {
    register_gauge!(
        "strata_build_queue_oldest_age_seconds",
        "Age of the oldest queued build (0 when the queue is empty)."
    )
    .expect("metric registers once")
});
static STORAGE: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        "strata_node_storage_bytes",
        "Bytes on this node's disk by kind (blobs, layers); `strata storage` shows them by GC tier.",
        &["kind"]
    )
    .expect("metric registers once")
});

static TEAM_LIMITS: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        "strata_team_limit",
        "The limit every team is held to, by setting (STRATA_TEAM_MAX_RUNNING_BUILDS, \
         STRATA_TEAM_MAX_QUEUED_BUILDS, STRATA_TEAM_MAX_PENDING_UPLOADS, STRATA_BUILD_MAX_STEPS, \
         and STRATA_TEAM_MAX_STORED_UPLOADS in bytes), as this process was configured; a \
         setting of none is not reported.",
        &["setting"]
    )
    .expect("metric registers once")
});

const PHASES: [&str; 6] = [
    "waiting",
    "queued",
    "active",
    "publishing",
    "ready",
    "error",
];

/// What the build and sandbox gauges show, read from the `builds` and `sandboxes` read models
/// at scrape time.
#[derive(Clone, Debug, Default)]
pub struct ReadModelCounts {
    /// Builds per read-model phase; phases without builds may be left out.
    pub by_phase: Vec<(String, i64)>,
    /// Sandboxes per read-model state; states without sandboxes may be left out.
    pub sandboxes_by_state: Vec<(String, i64)>,
    /// Age of the oldest queued build, `None` when nothing is queued.
    pub oldest_queued_seconds: Option<f64>,
}

/// Reads [`ReadModelCounts`]. The API supplies one over `projections::builds`: telemetry sits
/// beside the event store, below the read models, so it is handed the query rather than
/// importing it.
pub type ReadModelCountsReader =
    Arc<dyn Fn() -> BoxFuture<'static, Result<ReadModelCounts, sqlx::Error>> + Send + Sync>;

/// What this process reports at scrape time besides its own counters.
#[derive(Clone, Default)]
pub struct ScrapeSources {
    /// The build gauges' reader (the API reports them; workers need not).
    pub builds: Option<ReadModelCountsReader>,
    /// The node's data dir, for storage bytes.
    pub data_dir: Option<PathBuf>,
    /// The per-team limits this process holds teams to.
    pub team_limits: Option<crate::domain::team_limits::TeamLimits>,
    /// A scrape must present `Authorization: Bearer <token>` (`STRATA_METRICS_TOKEN`).
    pub token: Option<std::sync::Arc<str>>,
}

impl ScrapeSources {
    /// Refreshes the gauges, then renders everything. A failed query leaves the gauges at their
    /// last value and says so in a comment line rather than failing the scrape.
    pub async fn render(&self) -> String {
        let mut notes = String::new();
        if let Some(read) = &self.builds {
            match read().await {
                Ok(counts) => set_builds(&counts),
                Err(e) => notes.push_str(&format!("# reading the builds read model failed: {e}\n")),
            }
        }
        if let Some(dir) = &self.data_dir {
            for u in super::storage_cache::cached_usage(dir).await {
                STORAGE.with_label_values(&[u.kind]).set(u.bytes as i64);
            }
        }
        if let Some(limits) = &self.team_limits {
            for (setting, value) in limits.rows() {
                match value {
                    Some(v) => TEAM_LIMITS
                        .with_label_values(&[setting])
                        .set(i64::try_from(v).unwrap_or(i64::MAX)),
                    None => {
                        let _ = TEAM_LIMITS.remove_label_values(&[setting]);
                    }
                }
            }
        }
        let mut text = super::render();
        text.push_str(&notes);
        text
    }
}

fn set_builds(counts: &ReadModelCounts) {
    set_each(&BUILDS, &PHASES, &counts.by_phase);
    QUEUE_OLDEST.set(counts.oldest_queued_seconds.unwrap_or(0.0).max(0.0));
    set_each(&SANDBOXES, &SANDBOX_STATES, &counts.sandboxes_by_state);
}

/// Sets `gauge` for every one of `labels` from `counts`, 0 for a label it leaves out.
fn set_each(gauge: &IntGaugeVec, labels: &[&str], counts: &[(String, i64)]) {
    for label in labels {
        let n = counts.iter().find(|(l, _)| l == label).map_or(0, |r| r.1);
        gauge.with_label_values(&[label]).set(n);
    }
}
