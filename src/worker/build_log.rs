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
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

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
    /// A line, with its share of [`IN_FLIGHT_BYTES`] when it is command output.
    Line(LogLine, Option<OwnedSemaphorePermit>),
    /// Answered once every line sent before it is written (true) or refused (false).
    Flush(oneshot::Sender<bool>),
}

/// Command output sent to the writer and not yet stored, at most. A line waits for its share,
/// so a slow database holds the command back (through the worker's bounded output channel to
/// the sandbox's pipes) instead of queueing the whole budget in memory.
pub const IN_FLIGHT_BYTES: usize = 4 << 20;

/// What a build may store of its commands' output (`STRATA_BUILD_LOG_MAX_BYTES`,
/// `STRATA_BUILD_LOG_MAX_LINES`): lines cost a row each, so short lines are capped by count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputLimits {
    pub bytes: u64,
    pub lines: u64,
}

/// The sending side; cheap to clone.
#[derive(Clone)]
pub struct BuildLog {
    tx: mpsc::UnboundedSender<LogMsg>,
    output: Arc<OutputBudget>,
    in_flight: Arc<Semaphore>,
}

/// How much command output a build may still store: a chatty RUN (`yes` of long lines) must
/// not grow the worker's memory or `build_logs` without bound. strata's own lines (step
/// headers, the failure reason) are not counted and always pass.
struct OutputBudget {
    limits: OutputLimits,
    used_bytes: AtomicU64,
    used_lines: AtomicU64,
    dropped_bytes: AtomicU64,
    dropped_lines: AtomicU64,
    /// Dropped lines the log has already said, at the last flush.
    reported_lines: AtomicU64,
    truncated: AtomicBool,
}

/// The receiving side, for [`write_logs`].
pub struct LogReceiver {
    rx: mpsc::UnboundedReceiver<LogMsg>,
}

impl BuildLog {
    /// A log that stores at most `limits` of command output.
    pub fn channel(limits: OutputLimits) -> (BuildLog, LogReceiver) {
        let (tx, rx) = mpsc::unbounded_channel();
        let output = Arc::new(OutputBudget {
            limits,
            used_bytes: AtomicU64::new(0),
            used_lines: AtomicU64::new(0),
            dropped_bytes: AtomicU64::new(0),
            dropped_lines: AtomicU64::new(0),
            reported_lines: AtomicU64::new(0),
            truncated: AtomicBool::new(false),
        });
        let in_flight = Arc::new(Semaphore::new(IN_FLIGHT_BYTES));
        (
            BuildLog {
                tx,
                output,
                in_flight,
            },
            LogReceiver { rx },
        )
    }

    fn line(&self, line: LogLine) {
        let _ = self.tx.send(LogMsg::Line(line, None));
    }

    /// A line of a command's output, stored while the build's output budget lasts; past it,
    /// one line says so and the rest is dropped (the command runs on). Waits while
    /// [`IN_FLIGHT_BYTES`] of output are on their way to the database.
    pub async fn output(&self, line: LogLine) {
        let budget = &self.output;
        let size = line.message.len() as u64 + 1;
        let bytes = budget.used_bytes.fetch_add(size, Ordering::Relaxed) + size;
        let lines = budget.used_lines.fetch_add(1, Ordering::Relaxed) + 1;
        if bytes <= budget.limits.bytes && lines <= budget.limits.lines {
            let share = size.min(IN_FLIGHT_BYTES as u64) as u32;
            let permit = self.in_flight.clone().acquire_many_owned(share).await.ok();
            let _ = self.tx.send(LogMsg::Line(line, permit));
            return;
        }
        budget.dropped_bytes.fetch_add(size, Ordering::Relaxed);
        budget.dropped_lines.fetch_add(1, Ordering::Relaxed);
        if !budget.truncated.swap(true, Ordering::Relaxed) {
            self.line(LogLine {
                message: format!(
                    "[strata] this build's output passed {} bytes or {} lines; the rest is not \
                     stored (STRATA_BUILD_LOG_MAX_BYTES, STRATA_BUILD_LOG_MAX_LINES), and its \
                     commands run on",
                    budget.limits.bytes, budget.limits.lines
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
    /// the writer is gone). Says first how much output was not stored, if that grew.
    pub async fn flush(&self) -> bool {
        let budget = &self.output;
        let dropped = budget.dropped_lines.load(Ordering::Relaxed);
        if budget.reported_lines.swap(dropped, Ordering::Relaxed) != dropped {
            self.info(
                None,
                format!(
                    "[strata] {dropped} lines ({} bytes) of this build's output were not stored",
                    budget.dropped_bytes.load(Ordering::Relaxed)
                ),
            );
        }
        let (tx, rx) = oneshot::channel();
        if self.tx.send(LogMsg::Flush(tx)).is_err() {
            return false;
        }
        rx.await.unwrap_or(false)
    }
}

/// Lines per insert, and bytes: one insert's batch and its copies are what the writer holds.
const BATCH: usize = 500;
const BATCH_BYTES: usize = 1 << 20;

/// Writes the build's log lines until every [`BuildLog`] is dropped. Returns how many lines were
/// stored; stops storing (but keeps draining) once the attempt is fenced out.
pub async fn write_logs(pool: PgPool, build: BuildId, epoch: Epoch, mut rx: LogReceiver) -> u64 {
    let mut fenced = false;
    let mut stored = 0u64;
    while let Some(first) = rx.rx.recv().await {
        let mut lines = Vec::new();
        // Released once the batch is stored (or dropped): the senders waiting on them go on.
        let mut permits = Vec::new();
        let mut bytes = 0;
        let mut flushes = Vec::new();
        let mut next = Some(first);
        while let Some(msg) = next.take() {
            match msg {
                LogMsg::Line(l, permit) => {
                    bytes += l.message.len();
                    lines.push(l);
                    permits.extend(permit);
                }
                LogMsg::Flush(f) => flushes.push(f),
            }
            if lines.len() < BATCH && bytes < BATCH_BYTES {
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
        drop((lines, permits));
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

    fn drain(rx: &mut LogReceiver) -> Vec<String> {
        let mut got = Vec::new();
        while let Ok(msg) = rx.rx.try_recv() {
            match msg {
                LogMsg::Line(l, _) => got.push(l.message),
                LogMsg::Flush(f) => {
                    let _ = f.send(true);
                }
            }
        }
        got
    }

    fn limits(bytes: u64, lines: u64) -> OutputLimits {
        OutputLimits { bytes, lines }
    }

    #[tokio::test]
    async fn output_past_the_budget_is_dropped_after_one_notice_and_own_lines_still_pass() {
        let (log, mut rx) = BuildLog::channel(limits(10, 100));
        log.output(output("12345")).await; // 6 bytes with its newline
        log.output(output("1234")).await; // 11: past the budget
        log.output(output("more")).await;
        log.info(Some("2"), "[2/2] RUN next");
        drop(log);
        let got = drain(&mut rx);
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(got[0], "12345");
        assert!(
            got[1].contains("passed 10 bytes") && got[1].contains("STRATA_BUILD_LOG_MAX_BYTES")
        );
        assert_eq!(got[2], "[2/2] RUN next");
    }

    #[tokio::test]
    async fn short_lines_are_capped_by_count_and_a_flush_says_how_much_was_dropped() {
        let (log, mut rx) = BuildLog::channel(limits(1 << 20, 3));
        for i in 0..10 {
            log.output(output(&i.to_string())).await;
        }
        let flushed = {
            let log = log.clone();
            tokio::spawn(async move { log.flush().await })
        };
        // The flush waits for the writer; answer it as the writer would.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let got = drain(&mut rx);
        assert!(flushed.await.unwrap());
        assert_eq!(&got[..3], ["0", "1", "2"]);
        assert!(got[3].contains("or 3 lines"), "{got:?}");
        assert_eq!(
            got[4],
            "[strata] 7 lines (14 bytes) of this build's output were not stored"
        );
        assert_eq!(got.len(), 5, "{got:?}");
        // Nothing new was dropped: the next flush says nothing more.
        let again = tokio::spawn(async move { log.flush().await });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(drain(&mut rx).is_empty());
        assert!(again.await.unwrap());
    }

    #[tokio::test]
    async fn output_waits_while_its_bytes_in_flight_are_not_yet_stored() {
        let (log, mut rx) = BuildLog::channel(limits(1 << 30, 1 << 20));
        let line = "x".repeat(64 << 10);
        // 4 MiB in flight is 63 lines of 64 KiB and their newlines; the 64th waits.
        for _ in 0..63 {
            log.output(output(&line)).await;
        }
        let waiting = tokio::time::timeout(
            std::time::Duration::from_millis(100),
            log.output(output(&line)),
        )
        .await;
        assert!(waiting.is_err(), "the 64th line did not wait for room");
        // The writer stores (drops) what it holds: room again.
        assert_eq!(drain(&mut rx).len(), 63);
        tokio::time::timeout(std::time::Duration::from_secs(5), log.output(output(&line)))
            .await
            .expect("a line goes once earlier ones are stored");
    }
}
