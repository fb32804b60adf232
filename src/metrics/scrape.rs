//! Gauges read at scrape time: they describe state shared by every process (the `builds` read
//! model) or owned by the node (its data dir), so no process keeps them in memory.

use std::path::PathBuf;
use std::sync::LazyLock;

use prometheus::{register_gauge, register_int_gauge_vec, Gauge, IntGaugeVec};
use sqlx::PgPool;

static BUILDS: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        "strata_builds",
        "Builds by phase (waiting, queued, active, publishing, ready, error), from the builds \
         read model; ready and error are cumulative outcomes.",
        &["phase"]
    )
    .expect("metric registers once")
});
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

const PHASES: [&str; 6] = [
    "waiting",
    "queued",
    "active",
    "publishing",
    "ready",
    "error",
];

/// What this process reports at scrape time besides its own counters.
#[derive(Clone, Default)]
pub struct ScrapeSources {
    /// The database, for the build gauges (the API reports them; workers need not).
    pub pool: Option<PgPool>,
    /// The node's data dir, for storage bytes.
    pub data_dir: Option<PathBuf>,
}

impl ScrapeSources {
    /// Refreshes the gauges, then renders everything. A failed query leaves the gauges at their
    /// last value and says so in a comment line rather than failing the scrape.
    pub async fn render(&self) -> String {
        let mut notes = String::new();
        if let Some(pool) = &self.pool {
            if let Err(e) = refresh_builds(pool).await {
                notes.push_str(&format!("# reading the builds read model failed: {e}\n"));
            }
        }
        if let Some(dir) = self.data_dir.clone() {
            let usage = tokio::task::spawn_blocking(move || super::storage::usage(&dir))
                .await
                .unwrap_or_default();
            for u in usage {
                STORAGE.with_label_values(&[u.kind]).set(u.bytes as i64);
            }
        }
        let mut text = super::render();
        text.push_str(&notes);
        text
    }
}

async fn refresh_builds(pool: &PgPool) -> Result<(), sqlx::Error> {
    let rows = crate::projections::builds::totals_by_phase(pool).await?;
    for phase in PHASES {
        let n = rows.iter().find(|(p, _)| p == phase).map_or(0, |r| r.1);
        BUILDS.with_label_values(&[phase]).set(n);
    }
    let oldest = crate::projections::builds::oldest_queued_age_seconds(pool).await?;
    QUEUE_OLDEST.set(oldest.unwrap_or(0.0).max(0.0));
    Ok(())
}
