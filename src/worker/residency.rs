//! Layer residency (ADR 0020): which extracted layers each build node's local cache holds, as
//! the nodes report it, for cache-aware placement ([`super::placement`]).
//!
//! * Tables `cache_nodes` and `layer_residency` (migration 0017), plain rows, not events: a
//!   row describes one node's disk, only that node writes it, and nothing decides from it
//!   that must be right. Being wrong costs a fetch from the blob store or a bounded wait.
//! * [`Reporter`]: the node's own rows. At start it replaces its whole set; then it rescans its
//!   cache whenever this process completed or evicted a layer (checked every
//!   [`CHANGE_CHECK`]) and at every heartbeat anyway (a cache wiped from outside, a layer an
//!   other cache handle extracted), and writes the difference together with its heartbeat in
//!   one transaction. What it believes it reported changes only when that commits.
//! * Liveness: each heartbeat sets `expires_at` to now + the node's own time to live, by the
//!   database clock; readers count a node's rows only before it. A node that dies, stops or
//!   loses the database stops attracting builds when that passes; a node that stops cleanly
//!   expires itself at once.
//! * [`live_nodes`], [`holdings`]: what placement reads.

use std::collections::HashMap;
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::domain::ids;
use crate::vmm::layer::LayerCache;

/// How often the reporter looks at the cache's change counter.
pub const CHANGE_CHECK: Duration = Duration::from_millis(250);

/// A node's residency report: what it last committed, and how to make the next one.
pub struct Reporter {
    pool: PgPool,
    node: String,
    layers: LayerCache,
    /// How long a heartbeat keeps this node's rows counting.
    ttl: Duration,
    /// The set the database holds for this node, as of the last commit; `None` until the first
    /// report, which replaces whatever an earlier run of this node left.
    reported: Option<HashMap<String, u64>>,
    /// The cache's change counter at the last scan.
    seen_changes: u64,
}

impl Reporter {
    pub fn new(pool: PgPool, node: &str, layers: LayerCache, ttl: Duration) -> Reporter {
        Reporter {
            pool,
            node: node.to_owned(),
            layers,
            ttl,
            reported: None,
            seen_changes: 0,
        }
    }

    /// Rescans the cache and writes the difference and a heartbeat, in one transaction.
    pub async fn report(&mut self) -> Result<(), sqlx::Error> {
        self.seen_changes = self.layers.changes();
        let layers = self.layers.clone();
        let now: HashMap<String, u64> = tokio::task::spawn_blocking(move || {
            layers
                .resident()
                .into_iter()
                .map(|r| (r.digest.to_string(), r.bytes))
                .collect()
        })
        .await
        .unwrap_or_default();
        let (gone, fresh): (Vec<String>, Vec<(String, u64)>) = match &self.reported {
            None => (
                Vec::new(),
                now.iter().map(|(d, b)| (d.clone(), *b)).collect(),
            ),
            Some(before) => (
                before
                    .keys()
                    .filter(|d| !now.contains_key(*d))
                    .cloned()
                    .collect(),
                now.iter()
                    .filter(|(d, b)| before.get(*d) != Some(b))
                    .map(|(d, b)| (d.clone(), *b))
                    .collect(),
            ),
        };
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO cache_nodes (node_id, seen_at, expires_at)
             VALUES ($1, now(), now() + make_interval(secs => $2))
             ON CONFLICT (node_id) DO UPDATE SET seen_at = EXCLUDED.seen_at, expires_at = EXCLUDED.expires_at",
        )
        .bind(&self.node)
        .bind(self.ttl.as_secs_f64())
        .execute(&mut *tx)
        .await?;
        if self.reported.is_none() {
            sqlx::query("DELETE FROM layer_residency WHERE node_id = $1")
                .bind(&self.node)
                .execute(&mut *tx)
                .await?;
        }
        if !gone.is_empty() {
            sqlx::query("DELETE FROM layer_residency WHERE node_id = $1 AND digest = ANY($2)")
                .bind(&self.node)
                .bind(&gone)
                .execute(&mut *tx)
                .await?;
        }
        if !fresh.is_empty() {
            let (digests, bytes): (Vec<String>, Vec<i64>) = fresh
                .iter()
                .map(|(d, b)| (d.clone(), i64::try_from(*b).unwrap_or(i64::MAX)))
                .unzip();
            sqlx::query(
                "INSERT INTO layer_residency (node_id, digest, bytes)
                 SELECT $1, d, b FROM unnest($2::text[], $3::bigint[]) AS t(d, b)
                 ON CONFLICT (node_id, digest) DO UPDATE SET bytes = EXCLUDED.bytes",
            )
            .bind(&self.node)
            .bind(&digests)
            .bind(&bytes)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        if !gone.is_empty() || !fresh.is_empty() {
            tracing::debug!(
                node = %self.node,
                layers = now.len(),
                added = fresh.len(),
                removed = gone.len(),
                "layer residency reported"
            );
        }
        self.reported = Some(now);
        Ok(())
    }

    /// Reports until `shutdown`: at once, on every change of the cache, and every `heartbeat`;
    /// then expires this node's rows so they stop counting.
    pub async fn run(mut self, heartbeat: Duration, shutdown: CancellationToken) {
        let mut last = tokio::time::Instant::now();
        let mut first = true;
        loop {
            let due =
                first || last.elapsed() >= heartbeat || self.layers.changes() != self.seen_changes;
            if due {
                match self.report().await {
                    Ok(()) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "reporting this node's layer residency failed; retrying")
                    }
                }
                last = tokio::time::Instant::now();
                first = false;
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(CHANGE_CHECK) => {}
            }
        }
        if let Err(e) = expire(&self.pool, &self.node).await {
            tracing::warn!(error = %e, "could not expire this node's layer residency; it stops counting when its heartbeat passes");
        }
    }
}

/// Makes `node`'s residency stop counting now (a clean stop).
pub async fn expire(pool: &PgPool, node: &str) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE cache_nodes SET expires_at = now() WHERE node_id = $1")
        .bind(node)
        .execute(pool)
        .await
        .map(drop)
}

/// The nodes whose residency counts now.
pub async fn live_nodes(pool: &PgPool) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT node_id FROM cache_nodes WHERE expires_at > now() ORDER BY node_id")
        .fetch_all(pool)
        .await
}

/// Which live nodes hold which of `digests`, with the bytes of each.
pub async fn holdings(
    pool: &PgPool,
    digests: &[ids::Digest],
) -> Result<Vec<(String, ids::Digest, u64)>, sqlx::Error> {
    let wanted: Vec<String> = digests.iter().map(|d| d.to_string()).collect();
    let rows: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT r.node_id, r.digest, r.bytes FROM layer_residency r
         JOIN cache_nodes n USING (node_id)
         WHERE n.expires_at > now() AND r.digest = ANY($1)",
    )
    .bind(&wanted)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .filter_map(|(node, digest, bytes)| {
            Some((node, ids::Digest::parse(&digest).ok()?, bytes.max(0) as u64))
        })
        .collect())
}
