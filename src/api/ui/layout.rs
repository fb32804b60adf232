//! The page frame every `/ui` page shares (navigation, a little CSS, no scripts) and the HTML
//! escaping every value goes through.

use axum::response::Html;

/// Escapes text for HTML element content and double-quoted attributes.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Escapes a query-string value.
pub fn url_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

const CSS: &str = "
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1b1f24;background:#f6f8fa}
header{background:#24292f;color:#fff;padding:8px 16px}
header a{color:#fff;margin-right:16px;text-decoration:none;font-weight:600}
main{padding:16px}
table{border-collapse:collapse;background:#fff;margin:8px 0 16px;width:100%}
th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#eaeef2}
code,pre{font:12px ui-monospace,monospace}
pre{margin:0;white-space:pre-wrap}
.ready{color:#1a7f37;font-weight:600}.error{color:#cf222e;font-weight:600}
.building,.active,.publishing{color:#9a6700;font-weight:600}
.hit{color:#1a7f37}.miss{color:#cf222e}
.box{background:#fff;border:1px solid #d0d7de;padding:8px 12px;margin:8px 0 16px}
form.filters input,form.filters select{margin-right:8px}
#waterfall{background:#fff;border:1px solid #d0d7de;max-width:100%}
.wf-label{font:11px ui-monospace,monospace;fill:#24292f}
.wf-done{fill:#8c959f}.wf-open{fill:#d4a72c}.wf-executed{fill:#0969da}
.wf-checkpointed{fill:#1f6feb}.wf-cached{fill:#1a7f37}.wf-failed{fill:#cf222e}
.wf-marker{stroke:#9a6700;stroke-width:1;stroke-dasharray:3 2}
.charts{display:flex;flex-wrap:wrap;gap:8px}
figure.chart{background:#fff;border:1px solid #d0d7de;margin:0;padding:8px;flex:0 1 640px}
figure.chart figcaption{font-weight:600}
svg.chart{max-width:100%}
.chart-axis{stroke:#8c959f}.chart-label{font:10px ui-monospace,monospace;fill:#57606a}
.chart-line{fill:none;stroke-width:1.5}
.chart-limit{stroke:#cf222e;stroke-width:1;stroke-dasharray:6 3}
.chart-marker{stroke:#9a6700;stroke-width:1;stroke-dasharray:3 2}
.chart-legend{margin:2px 0;font-size:12px}
.swatch{display:inline-block;width:10px;height:10px;margin:0 4px 0 8px;background:#8c959f}
.swatch.chart-limit{background:#cf222e}
.chart-ready{fill:#1a7f37;background:#1a7f37}.chart-error{fill:#cf222e;background:#cf222e}
.chart-started{stroke:#0969da;fill:#0969da;background:#0969da}
.chart-p50{stroke:#1a7f37;fill:#1a7f37;background:#1a7f37}
.chart-p99{stroke:#bf3989;fill:#bf3989;background:#bf3989}
.chart-hits{fill:#1f6feb;background:#1f6feb}
.chart-starting{fill:#afb8c1;background:#afb8c1}.chart-running{fill:#0969da;background:#0969da}.chart-paused{fill:#d4a72c;background:#d4a72c}
.chart-c0{fill:#0969da;background:#0969da}.chart-c1{fill:#8250df;background:#8250df}
.chart-c2{fill:#1a7f37;background:#1a7f37}.chart-c3{fill:#d4a72c;background:#d4a72c}
.chart-c4{fill:#bf3989;background:#bf3989}.chart-c5{fill:#57606a;background:#57606a}
";

/// A whole page: `title` in the tab and as the heading, `body` already escaped HTML.
pub fn page(title: &str, body: &str) -> Html<String> {
    Html(format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>strata · {t}</title><style>{CSS}</style></head><body>\
         <header><a href=\"/ui\">Builds</a><a href=\"/ui/templates\">Templates</a>\
         <a href=\"/ui/storage\">Storage</a><a href=\"/ui/teams\">Teams</a><a href=\"/ui/sandboxes\">Sandboxes</a><a href=\"/metrics\">Metrics</a></header>\
         <main><h1>{t}</h1>{body}</main></body></html>",
        t = escape(title)
    ))
}

/// A status word with its CSS class.
pub fn status(s: &str) -> String {
    format!("<span class=\"{0}\">{0}</span>", escape(s))
}

/// Seconds as `1.2s`, `3m04s`; empty for none.
pub fn seconds(s: Option<f64>) -> String {
    match s {
        Some(s) => crate::inspect::why::human(std::time::Duration::from_secs_f64(s.max(0.0))),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            escape("<script>\"x\" & 'y'</script>"),
            "&lt;script&gt;&quot;x&quot; &amp; &#39;y&#39;&lt;/script&gt;"
        );
        assert_eq!(url_encode("a b/c"), "a%20b%2Fc");
    }
}
