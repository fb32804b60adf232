//! A build's waterfall: its phases and steps as bars on one time axis, drawn as inline SVG from
//! the timeline the page already reads (no script, no external asset, so it works offline).
//!
//! Each bar is a `<rect>` carrying what it shows in `data-` attributes (`data-kind`,
//! `data-name`, `data-outcome`, `data-seconds`), with a `<title>` for the hover text, so a test
//! or a reader of the page's source can check the drawing against the events. Attempts and
//! reconciler actions are vertical markers on the same axis.

use std::fmt::Write;

use chrono::{DateTime, Utc};

use super::layout::escape;
use crate::inspect::timeline::Timeline;

/// Pixels of the time axis.
pub const AXIS_WIDTH: f64 = 720.0;
/// The label column left of the axis.
const LABEL_WIDTH: f64 = 240.0;
const ROW: f64 = 18.0;
const BAR: f64 = 12.0;

/// The failed step, when the build failed at one: its bar runs to the failure and is marked.
pub struct Failure {
    pub step: u32,
    pub at: DateTime<Utc>,
}

/// One bar before layout.
struct Bar {
    kind: &'static str,
    name: String,
    outcome: &'static str,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    detail: String,
}

/// The SVG, or `None` when the build has no phase yet.
pub fn render(t: &Timeline, failure: Option<&Failure>) -> Option<String> {
    let start = t.phases.first()?.from;
    let mut bars = Vec::new();
    for p in &t.phases {
        let to = p.to.unwrap_or(p.from);
        bars.push(Bar {
            kind: "phase",
            name: p.phase.to_string(),
            outcome: if p.to.is_some() { "done" } else { "open" },
            from: p.from,
            to,
            detail: format!("{} {}", p.phase, seconds(p.from, to)),
        });
    }
    // The building phase's two ends that are not steps: booting the base before the first
    // step, and finalizing (start and ready commands, the last capture) after the last.
    let phase = |name: &str| t.phases.iter().find(|p| p.phase == name);
    let first_start = t.steps.iter().find_map(|s| s.started);
    let last_end = t.steps.iter().filter_map(|s| s.ended).max();
    bars.extend(stage(
        "base",
        phase("building").map(|p| p.from),
        first_start,
    ));
    for s in &t.steps {
        let failed = failure.filter(|f| f.step == s.step);
        let (from, to, outcome) = match (s.started, s.ended, failed) {
            (Some(from), Some(to), _) => (from, to, s.outcome),
            (Some(from), None, Some(f)) => (from, f.at, "failed"),
            _ => continue,
        };
        let mut detail = format!("{} {}: {}", s.step, s.instruction, outcome);
        let _ = write!(detail, ", {}", seconds(from, to));
        if let Some(v) = &s.cache_verdict {
            let _ = write!(detail, ", cache {v}");
        }
        if let Some(c) = &s.checkpoint {
            let _ = write!(detail, ", checkpoint {c}");
            if let Some(bytes) = s.checkpoint_bytes {
                let _ = write!(detail, " ({})", crate::metrics::storage::human_bytes(bytes));
            }
        }
        bars.push(Bar {
            kind: "step",
            name: s.step.to_string(),
            outcome,
            from,
            to,
            detail,
        });
    }
    bars.extend(stage(
        "finalize",
        last_end,
        phase("publishing").map(|p| p.from),
    ));
    let end = bars
        .iter()
        .map(|b| b.to)
        .chain(t.reconciler_actions.iter().map(|e| e.at))
        .max()
        .unwrap_or(start);
    let span = ((end - start).num_microseconds().unwrap_or(0) as f64).max(1.0);
    let x = |at: DateTime<Utc>| {
        LABEL_WIDTH
            + AXIS_WIDTH * ((at - start).num_microseconds().unwrap_or(0) as f64 / span).max(0.0)
    };
    let height = ROW * (bars.len() as f64 + 2.0);
    let mut svg = format!(
        "<svg id=\"waterfall\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{height}\" \
         viewBox=\"0 0 {w} {height}\" data-seconds=\"{total:.6}\" role=\"img\" \
         aria-label=\"phases and steps on a time axis of {total:.3} s\">",
        w = LABEL_WIDTH + AXIS_WIDTH + 10.0,
        total = span / 1e6,
    );
    for (row, bar) in bars.iter().enumerate() {
        let y = ROW * row as f64;
        let (left, right) = (x(bar.from), x(bar.to));
        let label = match bar.kind {
            "phase" | "stage" => bar.name.clone(),
            _ => bar.detail.split(':').next().unwrap_or_default().to_string(),
        };
        let _ = write!(
            svg,
            "<text x=\"4\" y=\"{ty}\" class=\"wf-label\">{label}</text>\
             <rect data-kind=\"{kind}\" data-name=\"{name}\" data-outcome=\"{outcome}\" \
             data-seconds=\"{secs:.6}\" class=\"wf-{outcome}\" x=\"{left:.2}\" y=\"{by}\" \
             width=\"{width:.2}\" height=\"{BAR}\"><title>{title}</title></rect>",
            ty = y + BAR,
            label = escape(&truncate(&label, 34)),
            kind = bar.kind,
            name = escape(&bar.name),
            outcome = bar.outcome,
            secs = (bar.to - bar.from).num_microseconds().unwrap_or(0) as f64 / 1e6,
            by = y + (ROW - BAR) / 2.0,
            // A bar as short as a cached step's stays visible: one pixel.
            width = (right - left).max(1.0),
            title = escape(&bar.detail),
        );
    }
    let markers = t
        .attempts
        .iter()
        .map(|a| {
            (
                a.acquired_at,
                format!("attempt {} acquired by {}", a.epoch, a.node),
            )
        })
        .chain(
            t.reconciler_actions
                .iter()
                .map(|e| (e.at, format!("{} by {}", e.event_type, e.actor))),
        );
    let bottom = ROW * bars.len() as f64;
    for (at, what) in markers {
        let _ = write!(
            svg,
            "<line data-kind=\"marker\" class=\"wf-marker\" x1=\"{p:.2}\" x2=\"{p:.2}\" y1=\"0\" \
             y2=\"{bottom}\"><title>{}</title></line>",
            escape(&what),
            p = x(at),
        );
    }
    let _ = write!(
        svg,
        "<text x=\"{LABEL_WIDTH}\" y=\"{ty}\" class=\"wf-label\">0 s</text>\
         <text x=\"{right}\" y=\"{ty}\" text-anchor=\"end\" class=\"wf-label\">{total:.3} s</text></svg>",
        ty = bottom + ROW,
        right = LABEL_WIDTH + AXIS_WIDTH,
        total = span / 1e6,
    );
    Some(svg)
}

/// A bar of the building phase that is not a step (`base`, `finalize`), when both ends are
/// known and in order.
fn stage(name: &str, from: Option<DateTime<Utc>>, to: Option<DateTime<Utc>>) -> Option<Bar> {
    let (from, to) = (from?, to?);
    (to >= from).then(|| Bar {
        kind: "stage",
        name: name.to_string(),
        outcome: "done",
        from,
        to,
        detail: format!("{name} {}", seconds(from, to)),
    })
}

fn seconds(from: DateTime<Utc>, to: DateTime<Utc>) -> String {
    format!(
        "{:.3} s",
        (to - from).num_microseconds().unwrap_or(0) as f64 / 1e6
    )
}

fn truncate(text: &str, chars: usize) -> String {
    if text.chars().count() <= chars {
        return text.to_string();
    }
    let mut out: String = text.chars().take(chars - 1).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inspect::timeline::{AttemptRow, PhaseSpan, StepRow};

    fn at(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(1_800_000_000_000 + ms).unwrap()
    }

    fn step(n: u32, outcome: &'static str, from: Option<i64>, to: Option<i64>) -> StepRow {
        StepRow {
            step: n,
            instruction: format!("RUN step {n}"),
            outcome,
            epoch: Some(1),
            seconds: None,
            started: from.map(at),
            ended: to.map(at),
            cache_verdict: Some(if outcome == "cached" { "hit" } else { "miss" }.into()),
            checkpoint: None,
            checkpoint_bytes: None,
            log_excerpt: Vec::new(),
        }
    }

    fn timeline() -> Timeline {
        Timeline {
            phases: vec![
                PhaseSpan {
                    phase: "queued",
                    from: at(0),
                    to: Some(at(100)),
                    seconds: Some(0.1),
                },
                PhaseSpan {
                    phase: "building",
                    from: at(100),
                    to: Some(at(1000)),
                    seconds: Some(0.9),
                },
            ],
            attempts: vec![AttemptRow {
                epoch: 1,
                node: "n1".into(),
                acquired_at: at(100),
                renewals: 0,
                last_lease_expiry: at(30_000),
                ended: "failed",
            }],
            steps: vec![
                step(1, "cached", Some(100), Some(100)),
                step(2, "checkpointed", Some(100), Some(400)),
                step(3, "not_run", Some(400), None),
                step(4, "not_run", Some(400), None),
            ],
            reconciler_actions: Vec::new(),
            events: Vec::new(),
        }
    }

    /// (kind, name, outcome, width) of every bar, in order.
    fn bars(svg: &str) -> Vec<(String, String, String, f64)> {
        let attr = |rect: &str, name: &str| {
            let from = rect.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
            rect[from..from + rect[from..].find('"').unwrap()].to_string()
        };
        svg.split("<rect ")
            .skip(1)
            .map(|r| format!(" {}", &r[..r.find('>').unwrap()]))
            .map(|r| {
                let r = r.as_str();
                (
                    attr(r, "data-kind"),
                    attr(r, "data-name"),
                    attr(r, "data-outcome"),
                    attr(r, "width").parse().unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn one_bar_per_phase_and_reached_step_with_widths_proportional_to_durations() {
        let failure = Failure {
            step: 3,
            at: at(1000),
        };
        let svg = render(&timeline(), Some(&failure)).unwrap();
        let got = bars(&svg);
        let kinds: Vec<(&str, &str, &str)> = got
            .iter()
            .map(|(k, n, o, _)| (k.as_str(), n.as_str(), o.as_str()))
            .collect();
        assert_eq!(
            kinds,
            [
                ("phase", "queued", "done"),
                ("phase", "building", "done"),
                ("stage", "base", "done"),
                ("step", "1", "cached"),
                ("step", "2", "checkpointed"),
                ("step", "3", "failed"),
            ],
            "a step never reached has no bar"
        );
        let px = |ms: f64| AXIS_WIDTH * ms / 1000.0;
        for ((_, name, _, width), want) in
            got.iter()
                .zip([px(100.0), px(900.0), 1.0, 1.0, px(300.0), px(600.0)])
        {
            assert!(
                (width - want).abs() <= 1.0,
                "{name}: {width} against {want}"
            );
        }
        assert_eq!(svg.matches("data-kind=\"marker\"").count(), 1);
        assert!(svg.contains("<title>2 RUN step 2: checkpointed, 0.300 s, cache miss</title>"));
    }

    #[test]
    fn text_from_the_build_is_escaped_and_an_empty_timeline_draws_nothing() {
        let mut t = timeline();
        t.steps[1].instruction = "RUN echo '<script>' && true".into();
        let svg = render(&t, None).unwrap();
        assert!(!svg.contains("<script>"), "{svg}");
        assert!(svg.contains("&lt;script&gt;"));
        t.phases.clear();
        assert!(render(&t, None).is_none());
    }

    #[test]
    fn a_hundred_steps_stay_one_row_each() {
        let mut t = timeline();
        t.steps = (1..=100)
            .map(|n| {
                step(
                    n,
                    "executed",
                    Some(100 + i64::from(n)),
                    Some(101 + i64::from(n)),
                )
            })
            .collect();
        let svg = render(&t, None).unwrap();
        assert_eq!(svg.matches("data-kind=\"step\"").count(), 100);
        let height: f64 = svg
            .split("height=\"")
            .nth(1)
            .and_then(|h| h.split('"').next())
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(
            height,
            ROW * 105.0,
            "two phases, base, 100 steps and the axis"
        );
    }
}
