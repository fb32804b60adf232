//! `GET /ui/teams`: the limits every team is held to (ADR 0024), what each team holds now, so
//! an operator sees who is at a limit and why their builds wait, and the settings pinned for
//! teams and templates (ADR 0030) with who pinned them.

use std::fmt::Write as _;

use axum::extract::State;
use axum::response::Html;

use super::builds::UiError;
use super::layout::{escape, page};
use crate::api::AppState;
use crate::domain::byte_size::human_bytes;
use crate::domain::team_limits::Held;
use crate::projections::team_usage;

/// Teams shown at most; the busiest first.
const ROWS: i64 = 200;

pub async fn show_teams(State(state): State<AppState>) -> Result<Html<String>, UiError> {
    let limits = state.protocol.team_limits;
    let teams = team_usage::holdings(&state.pool, ROWS).await?;
    let mut body = String::from(
        "<p>Limits every team is held to, as this API process was configured; the running \
         limit is the build nodes' own setting (give every process the same values).</p>\
         <table id=\"limits\"><tr><th>setting</th><th>value</th></tr>",
    );
    let stored_setting = Held::StoredUploadBytes.setting();
    for (setting, value) in limits.rows() {
        let shown = match value {
            None => "none".to_string(),
            Some(v) if setting == stored_setting => human_bytes(v),
            Some(v) => v.to_string(),
        };
        let _ = write!(
            body,
            "<tr><td><code>{setting}</code></td><td>{shown}</td></tr>"
        );
    }
    body.push_str(
        "</table><h2>What teams hold now</h2>\
         <table id=\"teams\"><tr><th>team</th><th>running</th><th>waiting or queued</th>\
         <th>unused upload links</th><th>uploads stored</th></tr>",
    );
    if teams.is_empty() {
        body.push_str("<tr><td colspan=\"5\">No team holds anything now.</td></tr>");
    }
    for t in &teams {
        let stored = t.stored_upload_bytes.max(0) as u64;
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}{}</td></tr>",
            escape(&t.team),
            cell(t.running, limits.running_builds),
            cell(t.queued, limits.queued_builds),
            cell(t.pending_uploads, limits.pending_uploads),
            human_bytes(stored),
            limits
                .stored_upload_bytes
                .map_or_else(String::new, |max| format!(" of {}", human_bytes(max))),
        );
    }
    body.push_str("</table>");
    body.push_str(&pins(&state).await?);
    Ok(page("teams", &body))
}

/// The pins in force: scope, setting, value, when and by whom.
async fn pins(state: &AppState) -> Result<String, UiError> {
    let pins = crate::app::settings::all_pins(&state.events).await?;
    let mut out = String::from(
        "<h2>Pinned settings</h2><p>Over the service's settings, a template's pin over its \
         team's; <code>strata settings</code> or <code>/admin/settings</code> move them, and \
         <code>strata history settings-team:&lt;team&gt;</code> is who moved whom.</p>\
         <table id=\"pins\"><tr><th>scope</th><th>setting</th><th>value</th><th>pinned</th>\
         <th>by</th></tr>",
    );
    if pins.is_empty() {
        out.push_str(
            "<tr><td colspan=\"5\">Nothing is pinned: every build resolves the service's \
             settings.</td></tr>",
        );
    }
    for p in &pins {
        let _ = write!(
            out,
            "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&p.scope.to_string()),
            escape(&p.key),
            escape(&p.value),
            p.pinned_at.format("%Y-%m-%d %H:%M:%S"),
            escape(&p.by),
        );
    }
    out.push_str("</table>");
    Ok(out)
}

/// `n`, or `n of max` marked when the team is at its limit.
fn cell(n: i64, max: Option<u32>) -> String {
    match max {
        Some(max) if n >= i64::from(max) => {
            format!("<span class=\"error\">{n} of {max} (at the limit)</span>")
        }
        Some(max) => format!("{n} of {max}"),
        None => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_team_at_its_limit_is_marked() {
        assert_eq!(cell(2, Some(8)), "2 of 8");
        assert!(cell(8, Some(8)).contains("at the limit"));
        assert_eq!(cell(5, None), "5");
    }
}
