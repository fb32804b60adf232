//! Reads of `build_logs`, a build's log lines. Not projected from events: the worker's fenced
//! writer ([`crate::worker::build_log`]) appends them directly, because they are high-volume and
//! decide nothing (see [`crate::domain::build`]). They are read like the read models, so their
//! reads live here: the SDK's status page and the inspectors' whole list.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::domain::build::status::{LogEntry, LogLevel};
use crate::domain::ids::BuildId;

/// The LISTEN/NOTIFY channel the log writer notifies after a batch commits; the payload is the
/// build's id. Held status requests wake on it (`crate::api::stream_news`).
pub const LOGS_CHANNEL: &str = "strata_build_logs";

/// Tells listeners that `build` has new lines. Sent after the batch committed, in a statement
/// of its own (a notifying transaction would serialize its commit with every other notifier's);
/// a lost notification costs a held request its wait, never a line.
pub async fn notify_written(pool: &sqlx::PgPool, build: BuildId) {
    if let Err(err) = sqlx::query("SELECT pg_notify($1, $2)")
        .bind(LOGS_CHANNEL)
        .bind(build.to_string())
        .execute(pool)
        .await
    {
        tracing::debug!(%build, error = %err, "sending the log wake-up failed; held status requests answer at their deadline");
    }
}

/// One stored log line with its place in the build's list and the attempt that wrote it.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct LogRow {
    /// The line's index in the build's list (the SDK's `logsOffset` counts these).
    pub seq: i64,
    pub epoch: Option<i64>,
    pub logged_at: DateTime<Utc>,
    /// The stored level (see [`LogLevel::as_str`]).
    pub level: String,
    pub message: String,
    pub step: Option<String>,
}

/// Every line `build` logged, in order.
pub async fn lines_of(pool: &sqlx::PgPool, build: BuildId) -> Result<Vec<LogRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT seq, epoch, logged_at, level, message, step FROM build_logs
         WHERE build_id = $1 ORDER BY seq",
    )
    .bind(build.as_uuid())
    .fetch_all(pool)
    .await
}

/// Up to `limit` of `build`'s lines at `min_level` or above, skipping the first `offset` of
/// them: one page of the status endpoint.
pub async fn page_of(
    pool: &sqlx::PgPool,
    build: BuildId,
    min_level: LogLevel,
    offset: i64,
    limit: i64,
) -> Result<Vec<LogEntry>, sqlx::Error> {
    let levels: Vec<&str> = LogLevel::ALL
        .into_iter()
        .filter(|l| *l >= min_level)
        .map(LogLevel::as_str)
        .collect();
    let rows: Vec<(DateTime<Utc>, String, String, Option<String>)> = sqlx::query_as(
        "SELECT logged_at, level, message, step FROM build_logs
         WHERE build_id = $1 AND level = ANY($2)
         ORDER BY seq OFFSET $3 LIMIT $4",
    )
    .bind(build.as_uuid())
    .bind(&levels)
    .bind(offset)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(timestamp, level, message, step)| LogEntry {
            timestamp,
            level: LogLevel::from_stored(&level),
            message,
            step,
        })
        .collect())
}
