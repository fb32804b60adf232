//! What happened over a time window, for the operator page's charts: builds started and
//! finished, their queue waits and cache hits, the blob store's size as GC passes measured it,
//! and sandboxes' lives. Every read is one bounded query over a read model's time index,
//! grouped into a fixed number of buckets, so a chart costs the same on a store with a year of
//! history as on one with an hour.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};

use crate::domain::gc_pass::ClassSize;

/// A window of time cut into `buckets` equal buckets, oldest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub from: DateTime<Utc>,
    pub width: Duration,
    pub buckets: u32,
}

impl Window {
    /// The window of `span` that ends with the bucket holding `now`. Bucket edges are aligned
    /// to whole multiples of the width, so a reload a few seconds later shows the same buckets.
    pub fn ending_at(now: DateTime<Utc>, span: Duration, buckets: u32) -> Window {
        let buckets = buckets.max(1);
        let width_ms = (span.num_milliseconds() / i64::from(buckets)).max(1);
        let end_ms = (now.timestamp_millis() / width_ms + 1) * width_ms;
        let from =
            DateTime::from_timestamp_millis(end_ms - width_ms * i64::from(buckets)).unwrap_or(now);
        Window {
            from,
            width: Duration::milliseconds(width_ms),
            buckets,
        }
    }

    pub fn end(&self) -> DateTime<Utc> {
        self.from + self.width * self.buckets as i32
    }

    pub fn start_of(&self, bucket: u32) -> DateTime<Utc> {
        self.from + self.width * bucket as i32
    }

    fn width_seconds(&self) -> f64 {
        self.width.num_milliseconds() as f64 / 1000.0
    }
}

/// The bucket index of a timestamp column `column`, given `$1` = window start and `$2` = bucket
/// width in seconds.
fn bucket_of(column: &str) -> String {
    format!("floor(extract(epoch FROM {column} - $1) / $2)::int4")
}

/// Rows of `sql` over `w`: `$1` is the window's start, `$2` the bucket width in seconds (see
/// [`bucket_of`]), `$3` the window's end.
async fn bucketed<T>(pool: &sqlx::PgPool, w: &Window, sql: &str) -> Result<Vec<T>, sqlx::Error>
where
    T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin,
{
    sqlx::query_as(sql)
        .bind(w.from)
        .bind(w.width_seconds())
        .bind(w.end())
        .fetch_all(pool)
        .await
}

/// Builds in one bucket.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BuildBucket {
    /// Builds whose start (the SDK's start call, `BuildFrozen`) fell in the bucket.
    pub started: i64,
    /// Builds that ended in the bucket, by outcome.
    pub ready: i64,
    pub error: i64,
    /// Step completions of the builds that ended in the bucket.
    pub steps_cached: i64,
    pub steps_run: i64,
    /// Queue waits (start to first acquisition) of builds first acquired in the bucket.
    pub waits: i64,
    pub wait_p50: Option<f64>,
    pub wait_p99: Option<f64>,
}

impl BuildBucket {
    /// Cached steps among all completed steps, `None` when no step completed.
    pub fn hit_ratio(&self) -> Option<f64> {
        let all = self.steps_cached + self.steps_run;
        (all > 0).then(|| self.steps_cached as f64 / all as f64)
    }
}

/// One [`BuildBucket`] per bucket of `w`.
pub async fn builds(pool: &sqlx::PgPool, w: &Window) -> Result<Vec<BuildBucket>, sqlx::Error> {
    let mut out = vec![BuildBucket::default(); w.buckets as usize];
    let started: Vec<(i32, i64)> = bucketed(
        pool,
        w,
        &format!(
            "SELECT {b} AS i, count(*) FROM builds
         WHERE queued_at >= $1 AND queued_at < $3 GROUP BY 1",
            b = bucket_of("queued_at")
        ),
    )
    .await?;
    let ended: Vec<(i32, i64, i64, i64, i64)> = bucketed(
        pool,
        w,
        &format!(
            "SELECT {b} AS i, count(*) FILTER (WHERE phase = 'ready'),
                count(*) FILTER (WHERE phase = 'error'),
                coalesce(sum(steps_cached), 0)::int8, coalesce(sum(steps_run), 0)::int8
         FROM builds WHERE finished_at >= $1 AND finished_at < $3 GROUP BY 1",
            b = bucket_of("finished_at")
        ),
    )
    .await?;
    let waits: Vec<(i32, i64, Option<f64>, Option<f64>)> = bucketed(pool, w, &format!(
        "SELECT {b} AS i, count(*),
                percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM acquired_at - queued_at)::float8),
                percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM acquired_at - queued_at)::float8)
         FROM builds WHERE acquired_at >= $1 AND acquired_at < $3 AND queued_at IS NOT NULL
         GROUP BY 1",
        b = bucket_of("acquired_at")
    )).await?;
    for (i, n) in started {
        if let Some(b) = out.get_mut(i as usize) {
            b.started = n;
        }
    }
    for (i, ready, error, cached, run) in ended {
        if let Some(b) = out.get_mut(i as usize) {
            (b.ready, b.error, b.steps_cached, b.steps_run) = (ready, error, cached, run);
        }
    }
    for (i, n, p50, p99) in waits {
        if let Some(b) = out.get_mut(i as usize) {
            (b.waits, b.wait_p50, b.wait_p99) = (n, p50, p99);
        }
    }
    Ok(out)
}

/// The blob store as one GC pass measured it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StoreSize {
    pub pass_id: String,
    pub at: DateTime<Utc>,
    pub total_bytes: i64,
    pub budget_bytes: Option<i64>,
    pub classes: BTreeMap<String, ClassSize>,
}

/// GC in one bucket.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GcBucket {
    /// Passes started in the bucket.
    pub passes: i64,
    pub deleted_objects: i64,
    pub deleted_bytes: i64,
    /// The store as the latest measured pass up to the end of this bucket found it: the last
    /// one in the bucket, else carried from an earlier bucket (or from before the window).
    pub size: Option<StoreSize>,
}

type StoreRow = (
    i32,
    String,
    DateTime<Utc>,
    i64,
    Option<i64>,
    sqlx::types::Json<BTreeMap<String, ClassSize>>,
);

/// One [`GcBucket`] per bucket of `w`.
pub async fn gc(pool: &sqlx::PgPool, w: &Window) -> Result<Vec<GcBucket>, sqlx::Error> {
    let mut out = vec![GcBucket::default(); w.buckets as usize];
    let passes: Vec<(i32, i64, i64, i64)> = bucketed(
        pool,
        w,
        &format!(
            "SELECT {b} AS i, count(*), coalesce(sum(deleted_objects), 0)::int8,
                coalesce(sum(deleted_bytes), 0)::int8
         FROM gc_passes WHERE started_at >= $1 AND started_at < $3 GROUP BY 1",
            b = bucket_of("started_at")
        ),
    )
    .await?;
    // The last measured pass of each bucket, and the last one before the window (bucket -1).
    let sizes: Vec<StoreRow> = bucketed(
        pool,
        w,
        &format!(
        "(SELECT DISTINCT ON (i) {b} AS i, pass_id, started_at, total_bytes, budget_bytes, classes
          FROM gc_passes
          WHERE started_at >= $1 AND started_at < $3 AND total_bytes IS NOT NULL
          ORDER BY i, started_at DESC)
         UNION ALL
         (SELECT -1, pass_id, started_at, total_bytes, budget_bytes, classes FROM gc_passes
          WHERE started_at < $1 AND total_bytes IS NOT NULL ORDER BY started_at DESC LIMIT 1)",
        b = bucket_of("started_at")
    ),
    )
    .await?;
    for (i, n, objects, bytes) in passes {
        if let Some(b) = out.get_mut(i as usize) {
            (b.passes, b.deleted_objects, b.deleted_bytes) = (n, objects, bytes);
        }
    }
    let mut measured: BTreeMap<i32, StoreSize> = sizes
        .into_iter()
        .map(|(i, pass_id, at, total_bytes, budget_bytes, classes)| {
            let size = StoreSize {
                pass_id,
                at,
                total_bytes,
                budget_bytes,
                classes: classes.0,
            };
            (i, size)
        })
        .collect();
    let mut carried = measured.remove(&-1);
    for (i, b) in out.iter_mut().enumerate() {
        if let Some(size) = measured.remove(&(i as i32)) {
            carried = Some(size);
        }
        b.size = carried.clone();
    }
    Ok(out)
}

/// A sandbox's life: its starting, running and paused spans.
#[derive(Clone, Debug, PartialEq, sqlx::FromRow)]
pub struct SandboxLife {
    pub sandbox_id: String,
    pub team_id: String,
    pub alias: String,
    pub state: String,
    pub requested_at: DateTime<Utc>,
    pub ended_at: Option<DateTime<Utc>>,
    pub end_reason: Option<String>,
    #[sqlx(skip)]
    pub spans: Vec<Span>,
}

/// Starting, running or paused from `from` to `to` (`None`: still).
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct Span {
    pub state: String,
    pub from_at: DateTime<Utc>,
    pub to_at: Option<DateTime<Utc>>,
}

/// Up to `limit` sandboxes alive at some point in `w`, grouped by team, the newest first
/// within a team, each with its spans.
pub async fn sandbox_lives(
    pool: &sqlx::PgPool,
    w: &Window,
    limit: i64,
) -> Result<Vec<SandboxLife>, sqlx::Error> {
    let mut lives: Vec<SandboxLife> = sqlx::query_as(
        "SELECT sandbox_id, team_id, alias, state, requested_at, ended_at, end_reason FROM (
             SELECT * FROM sandboxes
             WHERE requested_at < $2 AND (ended_at IS NULL OR ended_at >= $1)
             ORDER BY requested_at DESC LIMIT $3) newest
         ORDER BY team_id, requested_at DESC",
    )
    .bind(w.from)
    .bind(w.end())
    .bind(limit)
    .fetch_all(pool)
    .await?;
    let ids: Vec<&str> = lives.iter().map(|l| l.sandbox_id.as_str()).collect();
    #[derive(sqlx::FromRow)]
    struct SpanOf {
        sandbox_id: String,
        #[sqlx(flatten)]
        span: Span,
    }
    let spans: Vec<SpanOf> = sqlx::query_as(
        "SELECT sandbox_id, state, from_at, to_at FROM sandbox_spans
         WHERE sandbox_id = ANY($1) ORDER BY from_at, opened_by",
    )
    .bind(&ids)
    .fetch_all(pool)
    .await?;
    let mut by_id: BTreeMap<String, Vec<Span>> = BTreeMap::new();
    for s in spans {
        by_id.entry(s.sandbox_id).or_default().push(s.span);
    }
    for life in &mut lives {
        life.spans = by_id.remove(&life.sandbox_id).unwrap_or_default();
    }
    Ok(lives)
}

/// Live sandboxes per team now: (team, running, paused).
pub async fn sandboxes_per_team(
    pool: &sqlx::PgPool,
) -> Result<Vec<(String, i64, i64)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT team_id, count(*) FILTER (WHERE state = 'running'),
                count(*) FILTER (WHERE state IN ('pausing', 'paused'))
         FROM sandboxes WHERE state <> 'ended' GROUP BY team_id ORDER BY team_id",
    )
    .fetch_all(pool)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_ends_with_the_bucket_holding_now_on_aligned_edges() {
        let now = DateTime::parse_from_rfc3339("2026-12-04T10:17:42Z")
            .unwrap()
            .to_utc();
        let w = Window::ending_at(now, Duration::hours(1), 60);
        assert_eq!(w.width, Duration::minutes(1));
        assert_eq!(w.end().to_rfc3339(), "2026-12-04T10:18:00+00:00");
        assert_eq!(w.from.to_rfc3339(), "2026-12-04T09:18:00+00:00");
        assert!(w.start_of(59) <= now && now < w.end());
        // Seconds later: the same buckets.
        assert_eq!(
            Window::ending_at(now + Duration::seconds(10), Duration::hours(1), 60),
            w
        );
    }

    #[test]
    fn hit_ratio_is_cached_among_completed_steps() {
        let b = BuildBucket {
            steps_cached: 3,
            steps_run: 1,
            ..BuildBucket::default()
        };
        assert_eq!(b.hit_ratio(), Some(0.75));
        assert_eq!(BuildBucket::default().hit_ratio(), None);
    }
}
