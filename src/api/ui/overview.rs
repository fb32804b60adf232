//! The overview's charts on `/ui`: builds started and finished by outcome, queue wait p50 and
//! p99, the cache hit ratio, and the blob store by class against `STRATA_STORAGE_BUDGET` with
//! the GC passes marked, over the last hour, 6 hours, day or week (`?over=`), in [`BUCKETS`]
//! buckets. Read from the read models ([`crate::projections::activity`]), so the cost is the
//! same however long the history.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use chrono::Duration;

use super::builds::UiError;
use super::charts::{Chart, Marker, Series, Unit};
use super::layout::escape;
use crate::metrics::storage::human_bytes;
use crate::projections::activity::{self, Window};

/// Buckets per chart, whatever the span.
pub const BUCKETS: u32 = 60;

/// The spans `?over=` takes, the first the default.
pub const SPANS: [(&str, i64); 4] = [("1h", 60), ("6h", 360), ("24h", 1440), ("7d", 10080)];

/// The span named by `?over=`, the default when absent; a 400 naming the choices otherwise.
pub fn span(over: Option<&str>) -> Result<(&'static str, Duration), UiError> {
    let over = over.unwrap_or(SPANS[0].0);
    SPANS
        .iter()
        .find(|(name, _)| *name == over)
        .map(|(name, minutes)| (*name, Duration::minutes(*minutes)))
        .ok_or_else(|| {
            let names: Vec<&str> = SPANS.iter().map(|(n, _)| *n).collect();
            UiError::BadRequest(format!("over={over:?}: choose one of {}", names.join(", ")))
        })
}

/// The window of `span` ending now by the database's clock (the clock the read models'
/// timestamps come from).
pub async fn window(pool: &sqlx::PgPool, span: Duration) -> Result<Window, UiError> {
    let now = crate::streams::database_now(pool).await?;
    Ok(Window::ending_at(now, span, BUCKETS))
}

/// The "Over time" section.
pub async fn over_time(pool: &sqlx::PgPool, over: Option<&str>) -> Result<String, UiError> {
    let (name, span) = span(over)?;
    let w = window(pool, span).await?;
    let builds = activity::builds(pool, &w).await?;
    let gc = activity::gc(pool, &w).await?;

    let mut out = String::from("<h2>Over time</h2><p>");
    for (n, _) in SPANS {
        if n == name {
            let _ = write!(out, "<b>{n}</b> ");
        } else {
            let _ = write!(out, "<a href=\"/ui?over={n}\">{n}</a> ");
        }
    }
    let started: i64 = builds.iter().map(|b| b.started).sum();
    let ready: i64 = builds.iter().map(|b| b.ready).sum();
    let error: i64 = builds.iter().map(|b| b.error).sum();
    let cached: i64 = builds.iter().map(|b| b.steps_cached).sum();
    let run: i64 = builds.iter().map(|b| b.steps_run).sum();
    let _ = write!(
        out,
        "· buckets of {}: {started} builds started, {ready} ready, {error} failed",
        crate::inspect::why::human(w.width.to_std().unwrap_or_default()),
    );
    if cached + run > 0 {
        let _ = write!(out, "; {cached} of {} steps cached", cached + run);
    }
    out.push_str("</p><div class=\"charts\">");
    let per = |f: &dyn Fn(&activity::BuildBucket) -> Option<f64>| -> Vec<Option<f64>> {
        builds.iter().map(f).collect()
    };
    let count = |n: i64| (n > 0).then_some(n as f64);
    out.push_str(
        &Chart {
            id: "chart-builds",
            title: "Builds started, and finished by outcome".into(),
            unit: Unit::Count,
            window: &w,
            bars: vec![
                Series {
                    name: "ready".into(),
                    class: "chart-ready",
                    values: per(&|b| count(b.ready)),
                },
                Series {
                    name: "failed".into(),
                    class: "chart-error",
                    values: per(&|b| count(b.error)),
                },
            ],
            lines: vec![Series {
                name: "started".into(),
                class: "chart-started",
                values: per(&|b| count(b.started)),
            }],
            limit: None,
            markers: vec![],
        }
        .render(),
    );
    out.push_str(
        &Chart {
            id: "chart-queue-wait",
            title: "Queue wait, start to first acquisition".into(),
            unit: Unit::Seconds,
            window: &w,
            bars: vec![],
            lines: vec![
                Series {
                    name: "p50".into(),
                    class: "chart-p50",
                    values: per(&|b| b.wait_p50),
                },
                Series {
                    name: "p99".into(),
                    class: "chart-p99",
                    values: per(&|b| b.wait_p99),
                },
            ],
            limit: None,
            markers: vec![],
        }
        .render(),
    );
    out.push_str(
        &Chart {
            id: "chart-cache",
            title: "Cache hit ratio: cached steps of the builds that finished".into(),
            unit: Unit::Ratio,
            window: &w,
            bars: vec![Series {
                name: "cached".into(),
                class: "chart-hits",
                values: per(&|b| b.hit_ratio()),
            }],
            lines: vec![],
            limit: None,
            markers: vec![],
        }
        .render(),
    );
    out.push_str(&storage_chart(&w, &gc));
    out.push_str("</div>");
    Ok(out)
}

/// The blob store by class (`rooted` first, then the retention tiers), as the latest GC pass
/// up to each bucket measured it, the budget as a line, and a marker at each bucket with passes.
fn storage_chart(w: &Window, gc: &[activity::GcBucket]) -> String {
    let mut classes: BTreeSet<&str> = BTreeSet::new();
    for b in gc {
        if let Some(size) = &b.size {
            classes.extend(size.classes.keys().map(String::as_str));
        }
    }
    let mut ordered: Vec<&str> = classes.iter().copied().filter(|c| *c != "rooted").collect();
    if classes.contains("rooted") {
        ordered.insert(0, "rooted");
    }
    const CLASSES: [&str; 6] = [
        "chart-c0", "chart-c1", "chart-c2", "chart-c3", "chart-c4", "chart-c5",
    ];
    let bars = ordered
        .iter()
        .enumerate()
        .map(|(i, class)| Series {
            name: (*class).to_owned(),
            class: CLASSES[i % CLASSES.len()],
            values: gc
                .iter()
                .map(|b| {
                    b.size
                        .as_ref()
                        .and_then(|s| s.classes.get(*class))
                        .map(|c| c.bytes as f64)
                })
                .collect(),
        })
        .collect();
    let budget = gc
        .iter()
        .rev()
        .find_map(|b| b.size.as_ref())
        .and_then(|s| s.budget_bytes);
    let markers = gc
        .iter()
        .enumerate()
        .filter(|(_, b)| b.passes > 0)
        .map(|(i, b)| Marker {
            bucket: i as u32,
            label: format!(
                "{} GC pass{}, {} objects deleted ({})",
                b.passes,
                if b.passes == 1 { "" } else { "es" },
                b.deleted_objects,
                human_bytes(b.deleted_bytes.max(0) as u64)
            ),
        })
        .collect();
    let mut html = Chart {
        id: "chart-storage",
        title: "Blob store by class, as GC passes measured it".into(),
        unit: Unit::Bytes,
        window: w,
        bars,
        lines: vec![],
        limit: budget.map(|b| ("STRATA_STORAGE_BUDGET".to_owned(), b as f64)),
        markers,
    }
    .render();
    if gc.iter().all(|b| b.size.is_none()) {
        html =
            html.replace(
                "</figcaption>",
                &format!(
                "</figcaption><p>{}</p>",
                escape("No GC pass measured the store yet (strata gc, or the reconciler's passes).")
            ),
            );
    }
    html
}
