//! Sandboxes' lifetimes on a time axis: one row per sandbox, grouped by team, a bar per starting, running
//! or paused span clipped to the window, as inline SVG. Each bar is a `<rect>` with its
//! sandbox, state and seconds in `data-` attributes, and a hover title.

use std::fmt::Write;

use chrono::{DateTime, Utc};

use super::layout::escape;
use crate::projections::activity::{SandboxLife, Window};

const AXIS_WIDTH: f64 = 720.0;
const LABEL_WIDTH: f64 = 260.0;
const ROW: f64 = 16.0;
const BAR: f64 = 10.0;

/// The SVG of `lives` in `w`; an open span runs to `now`. The axis is fitted to the spans (from
/// the first start to the last end, within `w`), so a life of seconds is not a sliver.
pub fn render(w: &Window, lives: &[SandboxLife], now: DateTime<Utc>) -> String {
    let spans = || lives.iter().flat_map(|l| &l.spans);
    let first = spans().map(|s| s.from_at).min().unwrap_or(w.from);
    let last = spans().map(|s| s.to_at.unwrap_or(now)).max().unwrap_or(now);
    let from = first.clamp(w.from, w.end());
    let to = last.clamp(from, w.end());
    let span = ((to - from).num_milliseconds() as f64).max(1.0);
    let x = |at: DateTime<Utc>| {
        let at = at.clamp(from, to);
        LABEL_WIDTH + AXIS_WIDTH * (at - from).num_milliseconds() as f64 / span
    };
    let height = ROW * (lives.len() as f64 + 1.5);
    let mut svg = format!(
        "<svg id=\"lifetimes\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{height}\" \
         viewBox=\"0 0 {w} {height}\" data-from=\"{}\" data-to=\"{}\" role=\"img\" \
         aria-label=\"sandboxes' running and paused spans on a time axis; the table above lists them\">",
        from.to_rfc3339(),
        to.to_rfc3339(),
        w = LABEL_WIDTH + AXIS_WIDTH + 10.0,
    );
    for (row, life) in lives.iter().enumerate() {
        let y = ROW * row as f64;
        let short: String = life.sandbox_id.chars().take(12).collect();
        let _ = write!(
            svg,
            "<text class=\"wf-label\" x=\"0\" y=\"{:.1}\">{} / {} {}</text>",
            y + BAR,
            escape(&life.team_id),
            escape(&life.alias),
            escape(&short),
        );
        for s in &life.spans {
            let end = s.to_at.unwrap_or(now);
            if end < from || s.from_at >= to {
                continue;
            }
            let (left, right) = (x(s.from_at), x(end));
            let seconds = (end - s.from_at).num_milliseconds() as f64 / 1000.0;
            let _ = write!(
                svg,
                "<rect class=\"chart-{state}\" data-sandbox=\"{id}\" data-state=\"{state}\" \
                 data-seconds=\"{seconds:.3}\" x=\"{left:.2}\" y=\"{y:.1}\" width=\"{width:.2}\" height=\"{BAR}\">\
                 <title>{id} {state} {} to {}{}</title></rect>",
                s.from_at.format("%H:%M:%S"),
                end.format("%H:%M:%S"),
                if s.to_at.is_none() { " (now)" } else { "" },
                state = escape(&s.state),
                id = escape(&life.sandbox_id),
                width = (right - left).max(1.0),
            );
        }
    }
    let axis = ROW * lives.len() as f64 + 4.0;
    let _ = write!(
        svg,
        "<line class=\"chart-axis\" x1=\"{LABEL_WIDTH}\" y1=\"{axis:.1}\" x2=\"{r}\" y2=\"{axis:.1}\"/>\
         <text class=\"chart-label\" x=\"{LABEL_WIDTH}\" y=\"{t:.1}\">{}</text>\
         <text class=\"chart-label\" x=\"{r}\" y=\"{t:.1}\" text-anchor=\"end\">{}</text></svg>",
        from.format("%m-%d %H:%M:%S"),
        to.format("%m-%d %H:%M:%S"),
        r = LABEL_WIDTH + AXIS_WIDTH,
        t = axis + 12.0,
    );
    svg
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::projections::activity::Span;
    use chrono::Duration;

    #[test]
    fn bars_are_the_spans_clipped_to_the_window_in_proportion() {
        let now = DateTime::parse_from_rfc3339("2026-12-04T10:30:00Z")
            .unwrap()
            .to_utc();
        let w = Window::ending_at(now, Duration::hours(1), 60);
        let at = |m: i64| w.from + Duration::minutes(m);
        let life = SandboxLife {
            sandbox_id: "sbx1".into(),
            team_id: "acme".into(),
            alias: "app".into(),
            state: "running".into(),
            requested_at: at(-10),
            ended_at: None,
            end_reason: None,
            spans: vec![
                // Started before the window: clipped at its start.
                Span {
                    state: "running".into(),
                    from_at: at(-10),
                    to_at: Some(at(15)),
                },
                Span {
                    state: "paused".into(),
                    from_at: at(15),
                    to_at: Some(at(45)),
                },
                Span {
                    state: "running".into(),
                    from_at: at(45),
                    to_at: None,
                },
            ],
        };
        let svg = render(&w, &[life], now);
        let widths: Vec<f64> = svg
            .split("<rect ")
            .skip(1)
            .map(|r| {
                let from = r.find(" width=\"").unwrap() + 8;
                r[from..from + r[from..].find('"').unwrap()]
                    .parse()
                    .unwrap()
            })
            .collect();
        // The axis runs from the window's start (the first span began before it) to now.
        let minute = AXIS_WIDTH / ((now - w.from).num_seconds() as f64 / 60.0);
        assert_eq!(widths.len(), 3, "{svg}");
        assert!((widths[0] - 15.0 * minute).abs() < 1.0, "{widths:?}");
        assert!((widths[1] - 30.0 * minute).abs() < 1.0, "{widths:?}");
        // The open span runs to now (10:30; the window ends at 10:31).
        let open = (now - at(45)).num_seconds() as f64 / 60.0;
        assert!((widths[2] - open * minute).abs() < 1.0, "{widths:?}");
        assert!(svg.contains("data-state=\"paused\""));
    }

    #[test]
    fn the_axis_fits_lives_of_seconds() {
        let now = DateTime::parse_from_rfc3339("2026-12-04T10:30:00Z")
            .unwrap()
            .to_utc();
        let w = Window::ending_at(now, Duration::hours(1), 60);
        let at = |s: i64| now - Duration::minutes(10) + Duration::seconds(s);
        let life = SandboxLife {
            sandbox_id: "sbx2".into(),
            team_id: "acme".into(),
            alias: "app".into(),
            state: "ended".into(),
            requested_at: at(0),
            ended_at: Some(at(20)),
            end_reason: Some("killed".into()),
            spans: vec![
                Span {
                    state: "running".into(),
                    from_at: at(0),
                    to_at: Some(at(10)),
                },
                Span {
                    state: "paused".into(),
                    from_at: at(10),
                    to_at: Some(at(20)),
                },
            ],
        };
        let svg = render(&w, &[life], now);
        let halves: Vec<&str> = svg.split("<rect ").skip(1).collect();
        assert_eq!(halves.len(), 2);
        for r in halves {
            let from = r.find(" width=\"").unwrap() + 8;
            let width: f64 = r[from..from + r[from..].find('"').unwrap()]
                .parse()
                .unwrap();
            assert!((width - AXIS_WIDTH / 2.0).abs() < 1.0, "{svg}");
        }
    }
}
