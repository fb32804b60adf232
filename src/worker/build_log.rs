//! Build logs: what the status endpoint pages to the SDK, one row per output line.
//!
//! Lines are sent through a channel ([`BuildLog`]) and written in batches by [`write_logs`], so a
//! chatty RUN never waits on the database. Each batch is fenced: it is inserted only while the
//! `builds` row still shows this attempt's epoch active or publishing (the row is share-locked
//! by the insert, so an expiry that commits concurrently is ordered before or after the batch,
//! never around it). Once a batch is refused the writer drops everything after it: a closed
//! attempt writes no more logs. `seq` continues the build's list (the SDK's `logsOffset`).
//!
//! Levels: stdout is `info`, stderr is `error` (as E2B reports command output), progress lines are
//! `info`, the failure reason is `error`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot};

use crate::domain::build::status::LogLevel;
use crate::domain::ids::{BuildId, Epoch};

/// One log entry, as the SDK shows it.
#[derive(Debug, Clone)]
pub struct LogLine {
    pub at: DateTime<Utc>,
    pub level: LogLevel,
    pub message: String,
    /// `"1"`..`"n"`, `"base"` or `"finalize"`; `None` for build-wide lines.
    pub step: Option<String>,
}

enum LogMsg {
    Line(LogLine),
    /// Answered once every line sent before it is written (true) or refused (false).
    Flush(oneshot::Sender<bool>),
}

/// The sending side; cheap to clone.
#[derive(Clone)]
pub struct BuildLog {
    tx: mpsc::UnboundedSender<LogMsg>,
    output: Arc<OutputBudget>,
}

/// How much command output a build may still store: a chatty RUN (`yes` of long lines) must
/// not grow the worker's memory or `build_logs` without bound. strata's own lines (step
/// headers, the failure reason) are not counted and always pass.
struct OutputBudget {
    limit: u64,
    used: AtomicU64,
    truncated: AtomicBool,
}

/// The receiving side, for [`write_logs`].
pub struct LogReceiver {
    rx: mpsc::UnboundedReceiver<LogMsg>,
}

impl BuildLog {
    /// A log that stores at most `output_limit` bytes of command output.
    pub fn channel(output_limit: u64) -> (BuildLog, LogReceiver) {
        let (tx, rx) = mpsc::unbounded_channel();
        let output = Arc::new(OutputBudget {
            limit: output_limit,
            used: AtomicU64::new(0),
            truncated: AtomicBool::new(false),
        });
        (BuildLog { tx, output }, LogReceiver { rx })
    }

    fn line(&self, line: LogLine) {
        let _ = self.tx.send(LogMsg::Line(line));
    }

    /// A line of a command's output, stored while the build's output budget lasts; past it,
    /// one line says so and the rest is dropped (the command runs on).
    pub fn output(&self, line: LogLine) {
        let size = line.message.len() as u64 + 1;
        let used = self.output.used.fetch_add(size, Ordering::Relaxed) + size;
        if used <= self.output.limit {
            return self.line(line);
        }
        if !self.output.truncated.swap(true, Ordering::Relaxed) {
            self.line(LogLine {
                message: format!(
                    "[strata] this build's output passed {} bytes; the rest is not stored \
                     (STRATA_BUILD_LOG_MAX_BYTES), and its commands run on",
                    self.output.limit
                ),
                level: LogLevel::Error,
                ..line
            });
        }
    }

    pub fn info(&self, step: Option<&str>, message: impl Into<String>) {
        self.at(LogLevel::Info, step, message);
    }

    pub fn error(&self, step: Option<&str>, message: impl Into<String>) {
        self.at(LogLevel::Error, step, message);
    }

    fn at(&self, level: LogLevel, step: Option<&str>, message: impl Into<String>) {
        self.line(LogLine {
            at: crate::clock::local_now(),
            level,
            message: message.into(),
            step: step.map(str::to_owned),
        });
    }

    /// Waits until everything sent so far is stored; false when the attempt was fenced out (or
    /// the writer is gone).
    pub async fn flush(&self) -> bool {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(LogMsg::Flush(tx)).is_err() {
            return false;
        }
        rx.await.unwrap_or(false)
    }
}

/// Lines per insert.
const BATCH: usize = 500;

/// Writes the build's log lines until every [`BuildLog`] is dropped. Returns how many lines were
/// stored; stops storing (but keeps draining) once the attempt is fenced out.
pub async fn write_logs(pool: PgPool, build: BuildId, epoch: Epoch, mut rx: LogReceiver) -> u64 {
    let mut fenced = false;
    let mut stored = 0u64;
    while let Some(first) = rx.rx.recv().await {
        let mut lines = Vec::new();
        let mut flushes = Vec::new();
        let mut next = Some(first);
        while let Some(msg) = next.take() {
            match msg {
                LogMsg::Line(l) => lines.push(l),
                LogMsg::Flush(f) => flushes.push(f),
            }
            if lines.len() < BATCH {
                next = rx.rx.try_recv().ok();
            }
        }
        if !fenced && !lines.is_empty() {
            match insert(&pool, build, epoch, &lines).await {
                Ok(true) => {
                    stored += lines.len() as u64;
                    crate::projections::build_logs::notify_written(&pool, build).await;
                }
                Ok(false) => {
                    tracing::info!(%build, %epoch, "build logs refused: the attempt is closed");
                    fenced = true;
                }
                Err(err) => {
                    tracing::warn!(%build, %epoch, error = %err, lines = lines.len(), "writing build logs failed; lines dropped");
                }
            }
        }
        for f in flushes {
            let _ = f.send(!fenced);
        }
    }
    stored
}

/// One fenced batch insert; `Ok(false)` when the attempt no longer holds the build.
async fn insert(
    pool: &PgPool,
    build: BuildId,
    epoch: Epoch,
    lines: &[LogLine],
) -> Result<bool, sqlx::Error> {
    let at: Vec<DateTime<Utc>> = lines.iter().map(|l| l.at).collect();
    let level: Vec<String> = lines
        .iter()
        .map(|l| LogLevel::as_str(l.level).to_owned())
        .collect();
    // Postgres text cannot hold NUL.
    let message: Vec<String> = lines.iter().map(|l| l.message.replace('\0', "")).collect();
    let step: Vec<Option<String>> = lines.iter().map(|l| l.step.clone()).collect();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let result = sqlx::query(
            "INSERT INTO build_logs (build_id, seq, epoch, logged_at, level, message, step)
             SELECT $1, base.next + t.ord - 1, $2, t.at, t.level, t.message, t.step
             FROM unnest($3::timestamptz[], $4::text[], $5::text[], $6::text[])
                  WITH ORDINALITY AS t(at, level, message, step, ord),
                  (SELECT COALESCE(MAX(seq) + 1, 0) AS next FROM build_logs WHERE build_id = $1) AS base
             WHERE EXISTS (
                 SELECT 1 FROM builds
                 WHERE build_id = $1 AND epoch = $2 AND phase IN ('active', 'publishing')
                 FOR SHARE)",
        )
        .bind(build.as_uuid())
        .bind(epoch.0 as i64)
        .bind(&at)
        .bind(&level)
        .bind(&message)
        .bind(&step)
        .execute(pool)
        .await;
        match result {
            Ok(done) => return Ok(done.rows_affected() > 0),
            // Another writer took the same `seq` (a concurrent insert for this build): take the
            // next free one.
            Err(sqlx::Error::Database(db))
                if db.code().as_deref() == Some("23505") && attempt < 5 => {}
            Err(err) => return Err(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(message: &str) -> LogLine {
        LogLine {
            at: Utc::now(),
            level: LogLevel::Info,
            message: message.into(),
            step: Some("1".into()),
        }
    }

    #[test]
    fn output_past_the_budget_is_dropped_after_one_notice_and_own_lines_still_pass() {
        let (log, mut rx) = BuildLog::channel(10);
        log.output(output("12345")); // 6 bytes with its newline
        log.output(output("1234")); // 11: past the budget
        log.output(output("more"));
        log.info(Some("2"), "[2/2] RUN next");
        drop(log);
        let mut got = Vec::new();
        while let Ok(LogMsg::Line(l)) = rx.rx.try_recv() {
            got.push(l.message);
        }
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(got[0], "12345");
        assert!(
            got[1].contains("passed 10 bytes") && got[1].contains("STRATA_BUILD_LOG_MAX_BYTES")
        );
        assert_eq!(got[2], "[2/2] RUN next");
    }
}
