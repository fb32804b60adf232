//! `GET /ui/sandboxes`: running and paused sandboxes per team, their lifetimes over the last
//! hour, 6 hours, day or week (`?over=`), then launched sandboxes, live ones first, then the
//! most recently ended with why they ended (ADR 0028). Each one's whole history is
//! `strata history sandbox-<id>`.

use std::fmt::Write as _;

use axum::extract::{Query, State};
use axum::response::Html;
use serde::Deserialize;

use super::builds::UiError;
use super::layout::{escape, page, status};
use super::overview;
use crate::api::AppState;
use crate::projections::activity;

const ROWS: i64 = 200;
/// Sandboxes drawn on the lifetimes axis at most (the newest alive in the window).
const LIVES: i64 = 60;

#[derive(Debug, Default, Deserialize)]
pub struct Over {
    over: Option<String>,
}

fn when(t: Option<chrono::DateTime<chrono::Utc>>) -> String {
    t.map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_default()
}

/// Per team, what runs and what is paused now; then each sandbox's spans on a time axis.
async fn lifetimes(state: &AppState, over: Option<&str>) -> Result<String, UiError> {
    let (name, span) = overview::span(over)?;
    let w = overview::window(&state.pool, span).await?;
    let teams = activity::sandboxes_per_team(&state.pool).await?;
    let lives = activity::sandbox_lives(&state.pool, &w, LIVES).await?;
    let mut out = String::from(
        "<table id=\"sandbox-teams\"><tr><th>team</th><th>running</th><th>paused</th></tr>",
    );
    for (team, running, paused) in &teams {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{running}</td><td>{paused}</td></tr>",
            escape(team)
        );
    }
    if teams.is_empty() {
        out.push_str("<tr><td colspan=\"3\">No sandbox is running or paused.</td></tr>");
    }
    out.push_str("</table><h2>Lifetimes</h2><p>");
    for (n, _) in overview::SPANS {
        if n == name {
            let _ = write!(out, "<b>{n}</b> ");
        } else {
            let _ = write!(out, "<a href=\"/ui/sandboxes?over={n}\">{n}</a> ");
        }
    }
    let _ = write!(
        out,
        "· <span class=\"swatch chart-starting\"></span>starting \
         <span class=\"swatch chart-running\"></span>running \
         <span class=\"swatch chart-paused\"></span>paused · {} sandbox{} alive in the window \
         (at most {LIVES}, the newest)</p>",
        lives.len(),
        if lives.len() == 1 { "" } else { "es" }
    );
    if !lives.is_empty() {
        let now = crate::streams::database_now(&state.pool).await?;
        out.push_str(&super::lifetimes::render(&w, &lives, now));
    }
    Ok(out)
}

pub async fn show_sandboxes(
    State(state): State<AppState>,
    Query(over): Query<Over>,
) -> Result<Html<String>, UiError> {
    let rows = crate::projections::sandboxes::recent(&state.pool, None, true, ROWS).await?;
    let live = rows.iter().filter(|r| r.state != "ended").count();
    let charts = lifetimes(&state, over.over.as_deref().filter(|o| !o.is_empty())).await?;
    let mut body = format!(
        "{charts}<h2>Sandboxes</h2><p>{live} live. Each sandbox's history: <code>strata history sandbox-&lt;id&gt;</code>.</p>\
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
