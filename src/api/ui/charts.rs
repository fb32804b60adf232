//! Charts over a time window as inline SVG, each with its numbers in a table beside it (for
//! screen readers, and to copy). No script and no external asset, like the waterfall.
//!
//! A chart is stacked bars and lines over the window's buckets, with an optional limit line
//! and markers. Every bar is a `<rect>` and every line point a `<circle>` carrying its series,
//! bucket and value in `data-` attributes, so a test can check the drawing against the data.

use std::fmt::Write;

use super::layout::escape;
use crate::projections::activity::Window;

const PLOT_WIDTH: f64 = 540.0;
const PLOT_HEIGHT: f64 = 110.0;
const LEFT: f64 = 70.0;
const TOP: f64 = 8.0;
const BOTTOM: f64 = 22.0;

/// How a chart's values read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Count,
    Seconds,
    Ratio,
    Bytes,
}

impl Unit {
    pub fn format(self, v: f64) -> String {
        match self {
            Unit::Count => format!("{v:.0}"),
            Unit::Seconds => format!("{v:.3} s"),
            Unit::Ratio => format!("{:.0}%", v * 100.0),
            Unit::Bytes => crate::metrics::storage::human_bytes(v.max(0.0) as u64),
        }
    }
}

/// One series: a value per bucket (`None`: nothing to show there).
pub struct Series {
    pub name: String,
    /// CSS class of its bars or line (`chart-…` in the layout's CSS).
    pub class: &'static str,
    pub values: Vec<Option<f64>>,
}

/// A vertical marker at a bucket, with its hover text.
pub struct Marker {
    pub bucket: u32,
    pub label: String,
}

pub struct Chart<'a> {
    pub id: &'a str,
    pub title: String,
    pub unit: Unit,
    pub window: &'a Window,
    /// Stacked, bottom first.
    pub bars: Vec<Series>,
    pub lines: Vec<Series>,
    /// A horizontal line, e.g. the storage budget.
    pub limit: Option<(String, f64)>,
    pub markers: Vec<Marker>,
}

impl Chart<'_> {
    fn buckets(&self) -> usize {
        self.window.buckets as usize
    }

    fn value(series: &Series, bucket: usize) -> Option<f64> {
        series.values.get(bucket).copied().flatten()
    }

    /// The top of the y axis: the largest stack, line point or limit (at least 1 unit).
    fn top(&self) -> f64 {
        let stacks = (0..self.buckets()).map(|i| {
            self.bars
                .iter()
                .filter_map(|s| Self::value(s, i))
                .sum::<f64>()
        });
        let points = self
            .lines
            .iter()
            .flat_map(|s| s.values.iter().flatten().copied());
        let top = stacks
            .chain(points)
            .chain(self.limit.iter().map(|(_, v)| *v))
            .fold(0.0, f64::max);
        match self.unit {
            Unit::Ratio => 1.0,
            Unit::Count => top.max(1.0).ceil(),
            _ if top > 0.0 => top,
            _ => 1.0,
        }
    }

    /// The figure: the SVG, a legend, and the table of its numbers.
    pub fn render(&self) -> String {
        let n = self.buckets().max(1);
        let step = PLOT_WIDTH / n as f64;
        let top = self.top();
        let y = |v: f64| TOP + PLOT_HEIGHT * (1.0 - (v / top).clamp(0.0, 1.0));
        let x = |i: usize| LEFT + step * i as f64;
        let (w, h) = (LEFT + PLOT_WIDTH + 10.0, TOP + PLOT_HEIGHT + BOTTOM);
        let mut svg = format!(
            "<svg id=\"{id}\" class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
             viewBox=\"0 0 {w} {h}\" data-top=\"{top}\" data-buckets=\"{n}\" role=\"img\" \
             aria-label=\"{title}; the numbers are in the table below\">",
            id = escape(self.id),
            title = escape(&self.title),
        );
        // Axes: zero and the top, the window's first, middle and last bucket.
        let _ = write!(
            svg,
            "<line class=\"chart-axis\" x1=\"{LEFT}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\"/>\
             <text class=\"chart-label\" x=\"{lx}\" y=\"{tt}\" text-anchor=\"end\">{tops}</text>\
             <text class=\"chart-label\" x=\"{lx}\" y=\"{b}\" text-anchor=\"end\">0</text>",
            b = y(0.0),
            r = LEFT + PLOT_WIDTH,
            lx = LEFT - 4.0,
            tt = TOP + 8.0,
            tops = escape(&self.unit.format(top)),
        );
        for (i, anchor) in [(0, "start"), (n / 2, "middle"), (n, "end")] {
            let _ = write!(
                svg,
                "<text class=\"chart-label\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"{anchor}\">{}</text>",
                x(i),
                h - 6.0,
                self.window.start_of(i as u32).format("%m-%d %H:%M"),
            );
        }
        for i in 0..n {
            let mut base = 0.0;
            for s in &self.bars {
                let Some(v) = Self::value(s, i).filter(|v| *v > 0.0) else {
                    continue;
                };
                let (y0, y1) = (y(base), y(base + v));
                let _ = write!(
                    svg,
                    "<rect class=\"{c}\" data-series=\"{name}\" data-bucket=\"{i}\" data-value=\"{v}\" \
                     x=\"{x:.2}\" y=\"{y1:.2}\" width=\"{bw:.2}\" height=\"{bh:.2}\">\
                     <title>{name} {at}: {val}</title></rect>",
                    c = s.class,
                    name = escape(&s.name),
                    x = x(i) + step * 0.1,
                    bw = step * 0.8,
                    bh = y0 - y1,
                    at = self.window.start_of(i as u32).format("%H:%M"),
                    val = escape(&self.unit.format(v)),
                );
                base += v;
            }
        }
        for s in &self.lines {
            let points: Vec<(usize, f64)> = (0..n)
                .filter_map(|i| Self::value(s, i).map(|v| (i, v)))
                .collect();
            let path: Vec<String> = points
                .iter()
                .map(|(i, v)| format!("{:.2},{:.2}", x(*i) + step / 2.0, y(*v)))
                .collect();
            let _ = write!(
                svg,
                "<polyline class=\"{} chart-line\" points=\"{}\"/>",
                s.class,
                path.join(" ")
            );
            for (i, v) in points {
                let _ = write!(
                    svg,
                    "<circle class=\"{c}\" data-series=\"{name}\" data-bucket=\"{i}\" data-value=\"{v}\" \
                     cx=\"{cx:.2}\" cy=\"{cy:.2}\" r=\"2.5\"><title>{name} {at}: {val}</title></circle>",
                    c = s.class,
                    name = escape(&s.name),
                    cx = x(i) + step / 2.0,
                    cy = y(v),
                    at = self.window.start_of(i as u32).format("%H:%M"),
                    val = escape(&self.unit.format(v)),
                );
            }
        }
        if let Some((label, v)) = &self.limit {
            let _ = write!(
                svg,
                "<line class=\"chart-limit\" data-value=\"{v}\" x1=\"{LEFT}\" y1=\"{yv:.2}\" x2=\"{r}\" y2=\"{yv:.2}\">\
                 <title>{l}: {val}</title></line>",
                yv = y(*v),
                r = LEFT + PLOT_WIDTH,
                l = escape(label),
                val = escape(&self.unit.format(*v)),
            );
        }
        for m in &self.markers {
            let mx = x(m.bucket as usize) + step / 2.0;
            let _ = write!(
                svg,
                "<line class=\"chart-marker\" data-bucket=\"{b}\" x1=\"{mx:.2}\" y1=\"{TOP}\" x2=\"{mx:.2}\" y2=\"{y0:.2}\">\
                 <title>{l}</title></line>",
                b = m.bucket,
                y0 = y(0.0),
                l = escape(&m.label),
            );
        }
        svg.push_str("</svg>");
        format!(
            "<figure class=\"chart\"><figcaption>{title}</figcaption>{svg}{legend}{table}</figure>",
            title = escape(&self.title),
            legend = self.legend(),
            table = self.table(),
        )
    }

    fn legend(&self) -> String {
        let mut out = String::from("<p class=\"chart-legend\">");
        for s in self.bars.iter().chain(&self.lines) {
            let _ = write!(
                out,
                "<span class=\"swatch {}\"></span>{} ",
                s.class,
                escape(&s.name)
            );
        }
        if let Some((label, v)) = &self.limit {
            let _ = write!(
                out,
                "<span class=\"swatch chart-limit\"></span>{} ({}) ",
                escape(label),
                escape(&self.unit.format(*v))
            );
        }
        out.push_str("</p>");
        out
    }

    /// One row per bucket with anything in it.
    fn table(&self) -> String {
        let series: Vec<&Series> = self.bars.iter().chain(&self.lines).collect();
        let mut out = format!(
            "<details><summary>numbers</summary><table id=\"{}-numbers\"><tr><th>from</th>",
            escape(self.id)
        );
        for s in &series {
            let _ = write!(out, "<th>{}</th>", escape(&s.name));
        }
        if !self.markers.is_empty() {
            out.push_str("<th>marks</th>");
        }
        out.push_str("</tr>");
        for i in 0..self.buckets() {
            let mark = self.markers.iter().find(|m| m.bucket as usize == i);
            if series.iter().all(|s| Self::value(s, i).is_none()) && mark.is_none() {
                continue;
            }
            let _ = write!(
                out,
                "<tr data-bucket=\"{i}\"><td>{}</td>",
                self.window.start_of(i as u32).format("%Y-%m-%d %H:%M:%S")
            );
            for s in &series {
                let cell = Self::value(s, i).map(|v| self.unit.format(v));
                let _ = write!(out, "<td>{}</td>", escape(&cell.unwrap_or_default()));
            }
            if !self.markers.is_empty() {
                let _ = write!(
                    out,
                    "<td>{}</td>",
                    escape(mark.map(|m| m.label.as_str()).unwrap_or(""))
                );
            }
            out.push_str("</tr>");
        }
        out.push_str("</table></details>");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{Duration, Utc};

    fn attr(tag: &str, name: &str) -> f64 {
        let from = tag.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
        tag[from..from + tag[from..].find('"').unwrap()]
            .parse()
            .unwrap()
    }

    #[test]
    fn stacked_bars_are_as_tall_as_their_values_and_the_table_has_the_numbers() {
        let window = Window::ending_at(Utc::now(), Duration::hours(1), 4);
        let chart = Chart {
            id: "t",
            title: "builds".into(),
            unit: Unit::Count,
            window: &window,
            bars: vec![
                Series {
                    name: "ready".into(),
                    class: "chart-ready",
                    values: vec![Some(2.0), None, Some(1.0), Some(0.0)],
                },
                Series {
                    name: "error".into(),
                    class: "chart-error",
                    values: vec![Some(2.0), None, None, None],
                },
            ],
            lines: vec![Series {
                name: "started".into(),
                class: "chart-started",
                values: vec![Some(3.0), None, None, Some(1.0)],
            }],
            limit: None,
            markers: vec![Marker {
                bucket: 1,
                label: "gc".into(),
            }],
        };
        let html = chart.render();
        let rects: Vec<&str> = html.split("<rect ").skip(1).collect();
        assert_eq!(
            rects.len(),
            3,
            "a zero or missing value draws no bar: {html}"
        );
        // The top is the tallest stack (4), so a bar of 2 is half the plot.
        assert!(html.contains("data-top=\"4\""), "{html}");
        for r in &rects {
            let h = attr(r, "height");
            let v = attr(r, "data-value");
            assert!((h - PLOT_HEIGHT * v / 4.0).abs() < 0.01, "{r}");
        }
        // Error sits on top of ready in bucket 0.
        let ready = rects
            .iter()
            .find(|r| r.contains("data-series=\"ready\" data-bucket=\"0\""))
            .unwrap();
        let error = rects
            .iter()
            .find(|r| r.contains("data-series=\"error\" data-bucket=\"0\""))
            .unwrap();
        assert!((attr(error, "y") + attr(error, "height") - attr(ready, "y")).abs() < 0.01);
        assert_eq!(html.matches("<circle ").count(), 2);
        let table = &html[html.find("<table id=\"t-numbers\">").unwrap()..];
        assert_eq!(table.matches("<tr data-bucket=").count(), 4, "{table}");
        assert!(
            table.contains("<td>2</td><td>2</td><td>3</td><td></td></tr>"),
            "{table}"
        );
        assert!(table.contains("<td>gc</td>"), "{table}");
    }
}
