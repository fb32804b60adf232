//! The Postgres event store: the handle and its reads. Appends are in `append.rs`, the global
//! feed in `feed.rs`.

use std::sync::Arc;

use sqlx::postgres::PgRow;
use sqlx::{PgExecutor, PgPool, Row};

use super::group_commit::{GroupCommit, GroupCommitPolicy};
use super::notifier::Notifier;
use super::{InlineProjection, ReadError, RecordedEvent, RetryPolicy, StreamId};

/// Columns of `events` in the order [`event_from_row`] reads them.
pub(crate) const EVENT_COLUMNS: &str =
    "position, stream_id, version, event_id, type, data, metadata, recorded_at, tx_id::text AS tx_id";

/// Handle on the event store; cheap to clone (it holds a pool).
#[derive(Clone)]
pub struct EventStore {
    pub(crate) pool: PgPool,
    pub(crate) retry: RetryPolicy,
    /// Wakes feed subscribers after appends commit.
    pub(crate) notifier: Arc<Notifier>,
    /// Inline projections applied to every append, whoever makes it, so an exact read model
    /// (such as `builds`) can never miss an append through a caller that forgot it.
    pub(crate) standing: Arc<Vec<Arc<dyn InlineProjection>>>,
    /// Faults armed by tests ([`super::fault`]).
    pub(crate) faults: Arc<super::fault::Faults>,
    /// Appends waiting to commit together ([`super::group_commit`]).
    pub(crate) group: Arc<GroupCommit>,
}

impl std::fmt::Debug for EventStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventStore")
            .field("retry", &self.retry)
            .field("standing_projections", &self.standing.len())
            .field("group_commit", &self.group.policy)
            .finish_non_exhaustive()
    }
}

impl EventStore {
    /// A store that applies exactly `standing` to every append (none, for a bare store). The
    /// store knows no read model of its own: strata's are wired in one layer up, by
    /// `crate::app::event_store`.
    pub fn with_standing_projections(
        pool: PgPool,
        standing: Vec<Arc<dyn InlineProjection>>,
    ) -> Self {
        Self {
            pool,
            retry: RetryPolicy::default(),
            notifier: Notifier::new(),
            standing: Arc::new(standing),
            faults: Arc::default(),
            group: GroupCommit::new(GroupCommitPolicy::default()),
        }
    }

    /// Replaces how concurrent one-stream appends are grouped into transactions
    /// ([`GroupCommitPolicy::off`]: never).
    pub fn with_group_commit(mut self, policy: GroupCommitPolicy) -> Self {
        self.group = GroupCommit::new(policy);
        self
    }

    /// Replaces the serialization-failure retry policy of appends.
    pub fn with_retry_policy(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub fn retry_policy(&self) -> RetryPolicy {
        self.retry
    }

    /// Events of `stream` with version `>= from_version`, oldest first, at most `limit`.
    /// Reads the authoritative stream: exact, never lagging.
    pub async fn read_stream(
        &self,
        stream: &StreamId,
        from_version: u64,
        limit: u32,
    ) -> Result<Vec<RecordedEvent>, ReadError> {
        if let Some(failed) = self.faults.failed_read(stream) {
            return Err(failed);
        }
        read_stream(&self.pool, stream, from_version, limit).await
    }

    /// Every event of `stream`, oldest first (paged internally).
    pub async fn read_stream_all(
        &self,
        stream: &StreamId,
    ) -> Result<Vec<RecordedEvent>, ReadError> {
        const PAGE: u32 = 1000;
        let mut all = Vec::new();
        loop {
            let from = all.last().map_or(1, |e: &RecordedEvent| e.version + 1);
            let page = self.read_stream(stream, from, PAGE).await?;
            let done = page.len() < PAGE as usize;
            all.extend(page);
            if done {
                return Ok(all);
            }
        }
    }

    /// The events of `stream` appended in the same transaction as event `first`, from `first`
    /// on: what one command appended there. Empty when `first` is not stored in `stream`.
    pub async fn events_by_id(
        &self,
        first: &uuid::Uuid,
        stream: &StreamId,
    ) -> Result<Vec<RecordedEvent>, ReadError> {
        let rows = sqlx::query(&format!(
            "SELECT {EVENT_COLUMNS} FROM events e \
             WHERE e.stream_id = $2 AND e.tx_id = (SELECT tx_id FROM events WHERE event_id = $1 AND stream_id = $2) \
               AND e.version >= (SELECT version FROM events WHERE event_id = $1) \
             ORDER BY e.version"
        ))
        .bind(first)
        .bind(stream.as_str())
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(event_from_row).collect()
    }

    /// The `limit` most recently inserted events of every stream, newest first: a glance at
    /// what just happened, for operators. Not a cursor (see [`EventStore::read_feed`]).
    pub async fn latest_events(&self, limit: u32) -> Result<Vec<RecordedEvent>, ReadError> {
        let rows = sqlx::query(&format!(
            "SELECT {EVENT_COLUMNS} FROM events ORDER BY position DESC LIMIT $1"
        ))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(event_from_row).collect()
    }

    /// Every event of every stream in `categories` (the part of a stream id before its first
    /// `-`), ordered by stream and version. One statement, so one snapshot of the store: what a
    /// garbage-collection pass reads its roots from, where a reference moving from one stream to
    /// another between two reads must not be missed.
    pub async fn read_categories(
        &self,
        categories: &[&str],
    ) -> Result<Vec<RecordedEvent>, ReadError> {
        let categories: Vec<String> = categories.iter().map(|c| (*c).to_owned()).collect();
        let rows = sqlx::query(&format!(
            "SELECT {EVENT_COLUMNS} FROM events \
             WHERE split_part(stream_id, '-', 1) = ANY($1) \
             ORDER BY stream_id, version"
        ))
        .bind(&categories)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(event_from_row).collect()
    }

    /// Ids of the streams whose id starts with `prefix`, in id order: a build's promotion
    /// streams (`promotion-{build}:…`) are found this way.
    pub async fn streams_with_prefix(&self, prefix: &str) -> Result<Vec<String>, ReadError> {
        let pattern = format!(
            "{}%",
            prefix
                .replace('\\', "\\\\")
                .replace('%', "\\%")
                .replace('_', "\\_")
        );
        Ok(sqlx::query_scalar(
            "SELECT stream_id FROM streams WHERE stream_id LIKE $1 ORDER BY stream_id",
        )
        .bind(pattern)
        .fetch_all(&self.pool)
        .await?)
    }

    /// The stream's current version: its last event's version, 0 when it has none.
    pub async fn stream_version(&self, stream: &StreamId) -> Result<u64, ReadError> {
        Ok(stream_version(&self.pool, stream).await?)
    }
}

pub(crate) async fn read_stream<'e>(
    executor: impl PgExecutor<'e>,
    stream: &StreamId,
    from_version: u64,
    limit: u32,
) -> Result<Vec<RecordedEvent>, ReadError> {
    let rows = sqlx::query(&format!(
        "SELECT {EVENT_COLUMNS} FROM events WHERE stream_id = $1 AND version >= $2 \
         ORDER BY version LIMIT $3"
    ))
    .bind(stream.as_str())
    .bind(to_i64(from_version))
    .bind(i64::from(limit))
    .fetch_all(executor)
    .await?;
    rows.iter().map(event_from_row).collect()
}

pub(crate) async fn stream_version<'e>(
    executor: impl PgExecutor<'e>,
    stream: &StreamId,
) -> Result<u64, sqlx::Error> {
    let version: Option<i64> =
        sqlx::query_scalar("SELECT version FROM streams WHERE stream_id = $1")
            .bind(stream.as_str())
            .fetch_optional(executor)
            .await?;
    Ok(version.map_or(0, |v| v as u64))
}

/// Versions and positions are `bigint`; values past `i64::MAX` cannot occur in practice and
/// saturate rather than wrap.
pub(crate) fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(crate) fn event_from_row(row: &PgRow) -> Result<RecordedEvent, ReadError> {
    let position: i64 = row.try_get("position")?;
    let corrupt = |reason: String| ReadError::Corrupt { position, reason };
    let stream_id: String = row.try_get("stream_id")?;
    let metadata: serde_json::Value = row.try_get("metadata")?;
    let tx_id: String = row.try_get("tx_id")?;
    Ok(RecordedEvent {
        position: position as u64,
        stream_id: StreamId::parse(stream_id).map_err(|e| corrupt(e.to_string()))?,
        version: row.try_get::<i64, _>("version")? as u64,
        event_id: row.try_get("event_id")?,
        event_type: row.try_get("type")?,
        data: row.try_get("data")?,
        metadata: serde_json::from_value(metadata)
            .map_err(|e| corrupt(format!("metadata: {e}")))?,
        recorded_at: row.try_get("recorded_at")?,
        tx_id: tx_id
            .parse()
            .map_err(|e| corrupt(format!("tx_id {tx_id:?}: {e}")))?,
    })
}
