//! `GET /ui/sandboxes`: launched sandboxes, live ones first, then the most recently ended with
//! why they ended (ADR 0028). Each one's whole history is `strata history sandbox-<id>`.

use std::fmt::Write as _;

use axum::extract::State;
use axum::response::Html;

use super::builds::UiError;
use super::layout::{escape, page, status};
use crate::api::AppState;

const ROWS: i64 = 200;

fn when(t: Option<chrono::DateTime<chrono::Utc>>) -> String {
    t.map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_default()
}

pub async fn show_sandboxes(State(state): State<AppState>) -> Result<Html<String>, UiError> {
    let rows = crate::projections::sandboxes::recent(&state.pool, None, true, ROWS).await?;
    let live = rows.iter().filter(|r| r.state != "ended").count();
    let mut body = format!(
        "<p>{live} live. Each sandbox's history: <code>strata history sandbox-&lt;id&gt;</code>.</p>\
         <table id=\"sandboxes\"><tr><th>sandbox</th><th>team</th><th>template</th><th>state</th>\
         <th>node</th><th>requested</th><th>started</th><th>ends</th><th>ended</th></tr>"
    );
    if rows.is_empty() {
        body.push_str("<tr><td colspan=\"9\">No sandbox was launched yet.</td></tr>");
    }
    for r in &rows {
        let state_cell = match (&r.end_reason, &r.end_detail) {
            (Some(reason), Some(detail)) => {
                format!("{} <small>{}</small>", status(reason), escape(detail))
            }
            (Some(reason), None) => status(reason),
            _ => status(&r.state),
        };
        let _ = write!(
            body,
            "<tr data-state=\"{}\"><td><code>{}</code></td><td>{}</td><td>{}</td><td>{state_cell}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&r.state),
            escape(&r.sandbox_id),
            escape(&r.team_id),
            escape(&r.alias),
            escape(r.node_id.as_deref().unwrap_or("")),
            when(Some(r.requested_at)),
            when(r.started_at),
            when(r.end_at),
            when(r.ended_at),
        );
    }
    body.push_str("</table>");
    Ok(page("sandboxes", &body))
}
