//! Runs an async projection: read the feed from its checkpoint, apply a batch and advance the
//! checkpoint in the same transaction.
//!
//! The checkpoint row is taken `FOR UPDATE SKIP LOCKED`: while one runner holds it, any other
//! runner of the same projection (another process, another replica) skips the round instead of
//! applying the same events again. Each round is a short transaction, so the runner never holds
//! back feed readers for long.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool, Row};
use tokio_util::sync::CancellationToken;

use super::{Projection, ProjectionError};
use crate::events::{
    feed_horizon, held_back, read_feed, EventStore, FeedPosition, FeedWakeups, HeldBackBackoff,
};

/// What one round did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoundOutcome {
    /// Applied this many events (0: caught up).
    Applied(usize),
    /// Another runner holds the checkpoint; nothing was done.
    Busy,
    /// Nothing applied, but committed events wait behind a transaction still in flight: try
    /// again shortly.
    HeldBack,
}

/// A projection's checkpoint and how far behind the feed it is.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProjectionStatus {
    pub name: String,
    pub checkpoint: FeedPosition,
    pub updated_at: Option<DateTime<Utc>>,
    /// Events committed after the checkpoint (visible in the feed or not yet).
    pub lag: u64,
}

pub struct ProjectionRunner {
    store: EventStore,
    projection: Arc<dyn Projection>,
    batch_size: u32,
    /// Set once the checkpoint row is known to exist, to skip that insert on later rounds.
    checkpoint_exists: AtomicBool,
}

impl ProjectionRunner {
    pub fn new(store: EventStore, projection: Arc<dyn Projection>) -> Self {
        Self {
            store,
            projection,
            batch_size: 500,
            checkpoint_exists: AtomicBool::new(false),
        }
    }

    pub fn with_batch_size(mut self, batch_size: u32) -> Self {
        self.batch_size = batch_size.max(1);
        self
    }

    pub fn name(&self) -> &str {
        self.projection.name()
    }

    fn pool(&self) -> &PgPool {
        self.store.pool()
    }

    /// Creates the checkpoint row at the start of the feed if it is missing.
    pub async fn ensure_checkpoint(&self) -> Result<(), ProjectionError> {
        if self.checkpoint_exists.load(Ordering::Relaxed) {
            return Ok(());
        }
        sqlx::query("INSERT INTO projection_checkpoints (name) VALUES ($1) ON CONFLICT DO NOTHING")
            .bind(self.name())
            .execute(self.pool())
            .await?;
        self.checkpoint_exists.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// One round: at most one batch, applied with its checkpoint in one transaction.
    #[tracing::instrument(name = "projection.round", skip_all, fields(projection = %self.name()))]
    pub async fn run_once(&self) -> Result<RoundOutcome, ProjectionError> {
        self.ensure_checkpoint().await?;
        let mut tx = self.pool().begin().await?;
        // Before this transaction takes an id (the row lock below gives it one), so its own id
        // does not hold the feed back.
        let horizon = feed_horizon(&mut *tx).await?;
        let Some(checkpoint) = lock_checkpoint(&mut tx, self.name(), true).await? else {
            return Ok(RoundOutcome::Busy);
        };
        let events = read_feed(&mut *tx, checkpoint, Some(horizon), self.batch_size).await?;
        let Some(last) = events.last() else {
            let waiting = held_back(&mut *tx, checkpoint).await?;
            tx.rollback().await?;
            return Ok(if waiting {
                RoundOutcome::HeldBack
            } else {
                RoundOutcome::Applied(0)
            });
        };
        let next = last.feed_position();
        self.projection.apply_batch(&mut tx, &events).await?;
        sqlx::query(
            "UPDATE projection_checkpoints SET tx_id = $2::text::xid8, position = $3, updated_at = now() \
             WHERE name = $1",
        )
        .bind(self.name())
        .bind(next.tx_id.to_string())
        .bind(next.position as i64)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        tracing::debug!(applied = events.len(), checkpoint = %next, "projection advanced");
        Ok(RoundOutcome::Applied(events.len()))
    }

    /// Rounds until every event committed so far is applied (or another runner holds the
    /// checkpoint). Returns the number of events applied.
    pub async fn catch_up(&self) -> Result<usize, ProjectionError> {
        let mut total = 0;
        let mut backoff = HeldBackBackoff::new();
        loop {
            match self.run_once().await? {
                RoundOutcome::Applied(0) | RoundOutcome::Busy => return Ok(total),
                RoundOutcome::Applied(n) => total += n,
                RoundOutcome::HeldBack => backoff.sleep().await,
            }
        }
    }

    /// Empties the read model and rewinds the checkpoint to the start, in one transaction
    /// (waiting for a running round to finish), then replays the whole feed in batches.
    pub async fn rebuild(&self) -> Result<usize, ProjectionError> {
        self.ensure_checkpoint().await?;
        let mut tx = self.pool().begin().await?;
        lock_checkpoint(&mut tx, self.name(), false).await?;
        self.projection.reset(&mut tx).await?;
        sqlx::query(
            "UPDATE projection_checkpoints SET tx_id = '0', position = 0, updated_at = now() \
             WHERE name = $1",
        )
        .bind(self.name())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        tracing::info!(projection = %self.name(), "projection reset; replaying the feed");
        let mut total = 0;
        loop {
            match self.run_once().await? {
                RoundOutcome::Applied(0) => return Ok(total),
                RoundOutcome::Applied(n) => total += n,
                // Another runner took over the replay; it continues from our checkpoint.
                RoundOutcome::Busy => tokio::time::sleep(Duration::from_millis(50)).await,
                RoundOutcome::HeldBack => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// Runs until `shutdown`: catch up, then wait for NOTIFY (or `poll_interval`). Errors are
    /// logged and retried after the poll interval: a projection must not take its process down.
    pub async fn run_until(self, poll_interval: Duration, shutdown: CancellationToken) {
        let mut wakeups = match FeedWakeups::listen(self.pool(), poll_interval).await {
            Ok(w) => w,
            Err(err) => {
                tracing::warn!(projection = %self.name(), error = %err, "cannot LISTEN; polling");
                FeedWakeups::polling(poll_interval)
            }
        };
        let mut backoff = HeldBackBackoff::new();
        while !shutdown.is_cancelled() {
            let more = match self.run_once().await {
                Ok(RoundOutcome::Applied(n)) => n == self.batch_size as usize,
                Ok(RoundOutcome::HeldBack) => {
                    tokio::select! {
                        _ = backoff.sleep() => {}
                        _ = shutdown.cancelled() => {}
                    }
                    continue;
                }
                Ok(RoundOutcome::Busy) => false,
                Err(err) => {
                    tracing::error!(projection = %self.name(), error = %err, "projection round failed");
                    false
                }
            };
            backoff = HeldBackBackoff::new();
            if !more {
                tokio::select! {
                    _ = wakeups.wait() => {}
                    _ = shutdown.cancelled() => {}
                }
            }
        }
    }
}

async fn lock_checkpoint(
    conn: &mut PgConnection,
    name: &str,
    skip_locked: bool,
) -> Result<Option<FeedPosition>, ProjectionError> {
    let sql = if skip_locked {
        "SELECT tx_id::text AS tx_id, position FROM projection_checkpoints WHERE name = $1 FOR UPDATE SKIP LOCKED"
    } else {
        "SELECT tx_id::text AS tx_id, position FROM projection_checkpoints WHERE name = $1 FOR UPDATE"
    };
    let row = sqlx::query(sql).bind(name).fetch_optional(conn).await?;
    row.map(|r| {
        let tx_id: String = r.try_get("tx_id")?;
        Ok(FeedPosition {
            tx_id: tx_id.parse().expect("xid8 renders as an unsigned integer"),
            position: r.try_get::<i64, _>("position")? as u64,
        })
    })
    .transpose()
}

/// Checkpoint and lag of each projection named in `names` (missing rows: never run).
pub async fn status(
    pool: &PgPool,
    names: &[&str],
) -> Result<Vec<ProjectionStatus>, ProjectionError> {
    let mut out = Vec::new();
    for &name in names {
        let row = sqlx::query(
            "SELECT c.tx_id::text AS tx_id, c.position, c.updated_at, \
                    (SELECT count(*) FROM events e WHERE (e.tx_id, e.position) > (c.tx_id, c.position)) AS lag \
             FROM projection_checkpoints c WHERE c.name = $1",
        )
        .bind(name)
        .fetch_optional(pool)
        .await?;
        let status = match row {
            Some(r) => ProjectionStatus {
                name: name.to_string(),
                checkpoint: FeedPosition {
                    tx_id: r.try_get::<String, _>("tx_id")?.parse().unwrap_or(0),
                    position: r.try_get::<i64, _>("position")? as u64,
                },
                updated_at: r.try_get("updated_at")?,
                lag: r.try_get::<i64, _>("lag")? as u64,
            },
            None => ProjectionStatus {
                name: name.to_string(),
                checkpoint: FeedPosition::START,
                updated_at: None,
                lag: sqlx::query_scalar::<_, i64>("SELECT count(*) FROM events")
                    .fetch_one(pool)
                    .await? as u64,
            },
        };
        out.push(status);
    }
    Ok(out)
}
