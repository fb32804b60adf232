//! The global feed: every event of every stream, in an order subscribers can checkpoint safely.
//!
//! A `bigserial` position is taken at INSERT but becomes visible at COMMIT, so "position > N"
//! skips events of transactions that commit late. Instead each event records its transaction id
//! (`tx_id`), and the feed returns only events of transactions older than the oldest one still
//! running (`pg_snapshot_xmin(pg_current_snapshot())`), ordered by `(tx_id, position)`. Every
//! transaction that could still add events then sorts after everything already returned, so a
//! checkpoint `(tx_id, position)` never skips one. See docs/adr/0002-global-feed.md.
//!
//! The price: a transaction left open stalls every reader at its id. Keep transactions short.

use std::time::Duration;

use sqlx::postgres::PgListener;
use sqlx::{PgExecutor, PgPool};

use super::store::{event_from_row, to_i64, EVENT_COLUMNS};
use super::{EventStore, FeedPosition, ReadError, RecordedEvent};

/// The LISTEN/NOTIFY channel the store notifies after appends commit (see `notifier.rs`).
pub const EVENTS_CHANNEL: &str = "strata_events";

impl EventStore {
    /// Up to `limit` events strictly after `after`, in `(tx_id, position)` order, from committed
    /// transactions only, never past a transaction still in flight.
    pub async fn read_feed(
        &self,
        after: FeedPosition,
        limit: u32,
    ) -> Result<Vec<RecordedEvent>, ReadError> {
        read_feed(&self.pool, after, None, limit).await
    }

    /// A subscription to the feed from `after`, woken by NOTIFY and polling every
    /// `poll_interval` as a fallback (a notification can be lost with its connection, and a
    /// long transaction that holds readers back sends none when it ends).
    pub async fn subscribe(
        &self,
        after: FeedPosition,
        poll_interval: Duration,
    ) -> Result<FeedSubscription, ReadError> {
        Ok(FeedSubscription {
            store: self.clone(),
            after,
            wakeups: FeedWakeups::listen(&self.pool, poll_interval).await?,
            batch_size: 500,
        })
    }
}

/// Reads the feed. `bound`, when given, is an upper limit on `tx_id` computed earlier in the
/// same transaction (see the projection runner); the statement's own snapshot limit always
/// applies too.
pub(crate) async fn read_feed<'e>(
    executor: impl PgExecutor<'e>,
    after: FeedPosition,
    bound: Option<u64>,
    limit: u32,
) -> Result<Vec<RecordedEvent>, ReadError> {
    let rows = sqlx::query(&format!(
        "SELECT {EVENT_COLUMNS} FROM events \
         WHERE (tx_id, position) > ($1::text::xid8, $2) \
           AND tx_id < pg_snapshot_xmin(pg_current_snapshot()) \
           AND ($3::text IS NULL OR tx_id < $3::text::xid8) \
         ORDER BY tx_id, position \
         LIMIT $4"
    ))
    .bind(after.tx_id.to_string())
    .bind(to_i64(after.position))
    .bind(bound.map(|b| b.to_string()))
    .bind(i64::from(limit))
    .fetch_all(executor)
    .await?;
    rows.iter().map(event_from_row).collect()
}

/// The statement behind [`held_back`]. Not `EXISTS (…)`: planned generically (a prepared
/// statement after a few runs) the row comparison was estimated to match a third of the table,
/// so the planner took a sequential scan, expecting a match at once; at the head of the feed
/// nothing matches and the scan read every event. Every projection round that found nothing to
/// apply paid that (ADR 0018). A subquery ordered by the `(tx_id, position)` index with
/// `LIMIT 1` is planned as one index probe (Postgres drops an `ORDER BY … LIMIT` inside
/// `EXISTS`, hence the `count`). Public so that a test can check its plan.
pub const HELD_BACK_SQL: &str = "SELECT count(*) > 0 FROM (SELECT 1 FROM events \
     WHERE (tx_id, position) > ($1::text::xid8, $2) ORDER BY tx_id, position LIMIT 1) AS next";

/// Whether committed events exist after `after` that the feed still holds back, because a
/// transaction older than theirs is in flight (anywhere in the cluster: transaction ids are
/// cluster-wide). No notification announces the horizon moving, so a reader that sees this
/// retries soon instead of sleeping until the next append or poll.
pub(crate) async fn held_back<'e>(
    executor: impl PgExecutor<'e>,
    after: FeedPosition,
) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(HELD_BACK_SQL)
        .bind(after.tx_id.to_string())
        .bind(to_i64(after.position))
        .fetch_one(executor)
        .await
}

/// Backoff for a reader whose next events are held back by the feed horizon: short at first
/// (transactions are short), growing to at most half a second.
#[derive(Debug)]
pub(crate) struct HeldBackBackoff(Duration);

impl HeldBackBackoff {
    pub(crate) fn new() -> Self {
        Self(Duration::from_millis(10))
    }

    pub(crate) async fn sleep(&mut self) {
        tokio::time::sleep(self.0).await;
        self.0 = (self.0 * 2).min(Duration::from_millis(500));
    }
}

/// The oldest transaction id still running: the feed's visibility limit right now. Taken by a
/// transaction before it acquires an id of its own, it does not hold the limit back on itself.
pub(crate) async fn feed_horizon<'e>(executor: impl PgExecutor<'e>) -> Result<u64, sqlx::Error> {
    let xmin: String = sqlx::query_scalar("SELECT pg_snapshot_xmin(pg_current_snapshot())::text")
        .fetch_one(executor)
        .await?;
    Ok(xmin.parse().expect("xid8 renders as an unsigned integer"))
}

/// Wake-ups for feed readers: a NOTIFY on [`EVENTS_CHANNEL`] or the poll interval, whichever
/// comes first. Falls back to polling alone when the listening connection fails.
pub struct FeedWakeups {
    listener: Option<PgListener>,
    poll_interval: Duration,
}

impl FeedWakeups {
    pub async fn listen(pool: &PgPool, poll_interval: Duration) -> Result<Self, sqlx::Error> {
        let mut listener = PgListener::connect_with(pool).await?;
        listener.listen(EVENTS_CHANNEL).await?;
        Ok(Self {
            listener: Some(listener),
            poll_interval,
        })
    }

    /// Polling only.
    pub fn polling(poll_interval: Duration) -> Self {
        Self {
            listener: None,
            poll_interval,
        }
    }

    /// Waits for a notification or the poll interval. Notifications that arrived since the last
    /// wait count (they are buffered), so a reader that reads, then waits, misses none.
    pub async fn wait(&mut self) {
        let Some(listener) = self.listener.as_mut() else {
            tokio::time::sleep(self.poll_interval).await;
            return;
        };
        tokio::select! {
            received = listener.try_recv() => match received {
                Ok(Some(_)) => {
                    // Fold a burst of notifications into one wake-up.
                    while listener.next_buffered().is_some() {}
                }
                Ok(None) => {
                    // The connection dropped; the next try_recv reconnects. Events committed
                    // meanwhile are found by the read that follows this wake-up.
                    tracing::debug!("feed listener reconnecting");
                }
                Err(err) => {
                    tracing::warn!(error = %err, "feed listener failed; polling only from now on");
                    self.listener = None;
                }
            },
            _ = tokio::time::sleep(self.poll_interval) => {}
        }
    }
}

impl FeedWakeups {
    /// [`wait`](Self::wait) for a notification that may concern a stream whose name starts
    /// with `prefix` (one naming no streams may concern any): a reader of one category is not
    /// woken by every other append.
    pub async fn wait_for(&mut self, prefix: &str) {
        self.wait_for_streams(prefix).await;
    }

    /// [`wait_for`](Self::wait_for), answering which of the `prefix` streams the notifications
    /// named: `None` when any may have changed (a payload naming no streams, a poll tick, a
    /// listener that failed), so a caller fanning out to per-stream waiters wakes them all.
    pub async fn wait_for_streams(&mut self, prefix: &str) -> Option<Vec<String>> {
        let Some(listener) = self.listener.as_mut() else {
            tokio::time::sleep(self.poll_interval).await;
            return None;
        };
        let timeout = tokio::time::sleep(self.poll_interval);
        tokio::pin!(timeout);
        // Appends the payload's `prefix` streams to `named`; false when it names none at all.
        let collect =
            |payload: &str, named: &mut Vec<String>| match super::notifier::streams_of(payload) {
                None => false,
                Some(streams) => {
                    named.extend(streams.filter(|s| s.starts_with(prefix)).map(str::to_owned));
                    true
                }
            };
        loop {
            tokio::select! {
                received = listener.try_recv() => match received {
                    Ok(Some(n)) => {
                        let mut named = Vec::new();
                        let mut specific = collect(n.payload(), &mut named);
                        while let Some(more) = listener.next_buffered() {
                            specific &= collect(more.payload(), &mut named);
                        }
                        if !specific {
                            return None;
                        }
                        if !named.is_empty() {
                            return Some(named);
                        }
                    }
                    Ok(None) => return None,
                    Err(err) => {
                        tracing::warn!(error = %err, "feed listener failed; polling only from now on");
                        self.listener = None;
                        return None;
                    }
                },
                _ = &mut timeout => return None,
            }
        }
    }
}

/// A reader of the global feed that remembers where it is. It does not persist its position:
/// a subscriber that must survive restarts stores [`FeedSubscription::position`] (a projection
/// does so in the same transaction as its read model; see `crate::projections`).
pub struct FeedSubscription {
    store: EventStore,
    after: FeedPosition,
    wakeups: FeedWakeups,
    batch_size: u32,
}

impl FeedSubscription {
    pub fn with_batch_size(mut self, batch_size: u32) -> Self {
        self.batch_size = batch_size.max(1);
        self
    }

    /// The position after the last event returned.
    pub fn position(&self) -> FeedPosition {
        self.after
    }

    /// The next events after [`Self::position`], waiting until there is at least one.
    pub async fn next_batch(&mut self) -> Result<Vec<RecordedEvent>, ReadError> {
        let mut backoff = HeldBackBackoff::new();
        loop {
            let events = self.store.read_feed(self.after, self.batch_size).await?;
            if let Some(last) = events.last() {
                self.after = last.feed_position();
                return Ok(events);
            }
            if held_back(&self.store.pool, self.after).await? {
                backoff.sleep().await;
            } else {
                self.wakeups.wait().await;
            }
        }
    }
}
