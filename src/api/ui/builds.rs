//! `GET /ui`: the charts over time ([`super::overview`]), then builds, filterable by phase,
//! team and template, newest first, with the latest events of the global feed; `GET /ui/builds/{id}`: one build's timeline and its `why`;
//! `GET /ui/builds/{id}/why.json`: the `why` answer as `strata why build ID --json` prints it.

use std::fmt::Write as _;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Json, Response};
use serde::Deserialize;

use super::layout::{escape, page, seconds, status, url_encode};
use super::paging::{self, Cursor};
use crate::api::AppState;
use crate::domain::ids::BuildId;
use crate::events::ReadError;
use crate::inspect::facts::FactsError;
use crate::inspect::{facts, timeline, why};
use crate::projections::builds;

const FEED_LIMIT: u32 = 20;

#[derive(Debug, Default, Deserialize)]
pub struct BuildFilter {
    phase: Option<String>,
    team: Option<String>,
    /// A template id or one of its names.
    template: Option<String>,
    /// Only builds older than this cursor (from the page's "older" link).
    before: Option<String>,
    /// Rows per page.
    limit: Option<i64>,
    /// The span of the charts over time (`1h`, `6h`, `24h`, `7d`).
    over: Option<String>,
}

fn non_empty(s: &Option<String>) -> Option<&str> {
    s.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

pub async fn list_builds(
    State(state): State<AppState>,
    Query(filter): Query<BuildFilter>,
) -> Result<Html<String>, UiError> {
    let limit = paging::limit(filter.limit)?;
    let before = non_empty(&filter.before).map(Cursor::parse).transpose()?;
    let before_id = before
        .as_ref()
        .map(|c| uuid::Uuid::parse_str(&c.id))
        .transpose()
        .map_err(|_| UiError::BadRequest("before= names no build".into()))?;
    let listed = builds::BuildFilter {
        phase: non_empty(&filter.phase),
        team: non_empty(&filter.team),
        template: non_empty(&filter.template),
        before: before.as_ref().zip(before_id).map(|(c, id)| (c.at, id)),
    };
    // One row more than the page: whether there is an older page.
    let mut rows = builds::list_builds(&state.pool, &listed, limit + 1).await?;
    let more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    let last = rows.last().filter(|_| more).map(|r| Cursor {
        at: r.registered_at,
        id: r.build_id.to_string(),
    });

    let mut body = String::new();
    // The charts head the first page only: the older pages are for reading the list.
    if before.is_none() {
        body.push_str(&super::overview::over_time(&state.pool, non_empty(&filter.over)).await?);
        body.push_str("<h2>Builds</h2>");
    }
    let opt = |v: &str| {
        format!(
            "<option{}>{v}</option>",
            if non_empty(&filter.phase) == Some(v) {
                " selected"
            } else {
                ""
            }
        )
    };
    let _ = write!(
        body,
        "<form class=\"filters\" method=\"get\" action=\"/ui\">\
         <label>phase <select name=\"phase\"><option value=\"\">any</option>{}</select></label>\
         <label>team <input name=\"team\" value=\"{}\"></label>\
         <label>template <input name=\"template\" value=\"{}\"></label>\
         <button type=\"submit\">filter</button></form>",
        [
            "waiting",
            "queued",
            "active",
            "publishing",
            "ready",
            "error"
        ]
        .map(opt)
        .concat(),
        escape(non_empty(&filter.team).unwrap_or("")),
        escape(non_empty(&filter.template).unwrap_or("")),
    );
    let _ = write!(
        body,
        "<table id=\"builds\"><tr><th>build</th><th>phase</th><th>team</th><th>template</th>\
         <th>epoch / node</th><th>registered</th><th>duration</th></tr>"
    );
    for r in &rows {
        let terminal = matches!(r.phase.as_str(), "ready" | "error");
        let until = if terminal { r.updated_at } else { r.now };
        let took = (until - r.registered_at).num_milliseconds() as f64 / 1000.0;
        let names = r.names.clone().unwrap_or_default().join(", ");
        let _ = write!(
            body,
            "<tr class=\"build\"><td><a href=\"/ui/builds/{id}\"><code>{id}</code></a></td><td>{}</td>\
             <td><a href=\"/ui?team={}\">{}</a></td><td><a href=\"/ui?template={}\">{}</a> <code>{}</code></td>\
             <td>{}</td><td>{}</td><td>{}{}</td></tr>",
            status(&r.phase),
            url_encode(&r.team_id),
            escape(&r.team_id),
            url_encode(&r.template_id),
            escape(&names),
            escape(&r.template_id),
            r.epoch
                .map(|e| format!("{e} / {}", escape(r.node.as_deref().unwrap_or(""))))
                .unwrap_or_default(),
            r.registered_at.format("%Y-%m-%d %H:%M:%S"),
            seconds(Some(took)),
            if terminal { "" } else { " (so far)" },
            id = r.build_id,
        );
    }
    body.push_str("</table>");
    if rows.is_empty() {
        body.push_str("<p>No builds match.</p>");
    }
    body.push_str(&paging::older_link(
        "/ui",
        &[
            ("phase", non_empty(&filter.phase)),
            ("team", non_empty(&filter.team)),
            ("template", non_empty(&filter.template)),
        ],
        last,
        limit,
    ));
    body.push_str(&recent_events(&state).await?);
    Ok(page("builds", &body))
}

/// The newest events of the whole store, newest first: what just happened anywhere.
async fn recent_events(state: &AppState) -> Result<String, ReadError> {
    let events = state.events.latest_events(FEED_LIMIT).await?;
    let mut out = String::from(
        "<h2>Latest events</h2><table id=\"feed\"><tr><th>time</th><th>stream</th><th>event</th>\
         <th>actor</th></tr>",
    );
    for event in events {
        let actor = &event.metadata.actor;
        let actor = format!("{}/{}", actor.role.as_str(), actor.node);
        let stream = event.stream_id.as_str();
        let link = stream
            .strip_prefix("build-")
            .map(|id| {
                format!(
                    "<a href=\"/ui/builds/{0}\">{1}</a>",
                    escape(id),
                    escape(stream)
                )
            })
            .unwrap_or_else(|| escape(stream));
        let _ = write!(
            out,
            "<tr><td>{}</td><td><code>{link}</code></td><td>{}</td><td>{}</td></tr>",
            event.recorded_at.format("%H:%M:%S%.3f"),
            escape(&event.event_type),
            escape(&actor)
        );
    }
    out.push_str("</table>");
    Ok(out)
}

/// Fills in the size of the layer each checkpointed step added: the top layer of its
/// snapshot, as the blob store has it. A size that cannot be read is left out.
async fn checkpoint_sizes(state: &AppState, t: &mut timeline::Timeline) {
    use crate::domain::ids::SnapshotId;
    use crate::streams::{snapshot_stream, Snapshot};
    for step in t.steps.iter_mut().filter(|s| s.outcome == "checkpointed") {
        let Some(id) = step
            .checkpoint
            .as_deref()
            .and_then(|c| SnapshotId::parse(c).ok())
        else {
            continue;
        };
        let Ok(loaded) =
            crate::events::command::load::<Snapshot>(&state.events, &snapshot_stream(&id)).await
        else {
            continue;
        };
        let Some(top) = loaded.state.record.and_then(|r| r.layers.last().copied()) else {
            continue;
        };
        let blobs = state.blobs.clone();
        if let Ok(Ok(Some(bytes))) = tokio::task::spawn_blocking(move || blobs.size(&top)).await {
            step.checkpoint_bytes = Some(bytes);
        }
    }
}

fn parse_build(id: &str) -> Result<BuildId, UiError> {
    uuid::Uuid::parse_str(id)
        .map(BuildId::from_uuid)
        .map_err(|_| UiError::NotFound(format!("{id:?} is not a build id")))
}

async fn load_why(
    state: &AppState,
    build: BuildId,
) -> Result<(facts::BuildFacts, why::Why), UiError> {
    let target = facts::load(&state.events, build).await?;
    let earlier =
        facts::earlier_builds(&state.events, &target, crate::inspect::EARLIER_BUILDS).await?;
    let answer = why::why(&target, &earlier);
    Ok((target, answer))
}

pub async fn why_json(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<why::Why>, UiError> {
    let (_, answer) = load_why(&state, parse_build(&id)?).await?;
    Ok(Json(answer))
}

pub async fn show_build(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Html<String>, UiError> {
    let build = parse_build(&id)?;
    let (facts, answer) = load_why(&state, build).await?;
    let mut t = timeline::timeline(&facts);
    checkpoint_sizes(&state, &mut t).await;
    let reg = facts.state.registration.as_ref();
    let mut body = String::new();
    let _ = write!(
        body,
        "<div class=\"box\"><b>status</b> {} · <b>template</b> <a href=\"/ui?template={tid}\"><code>{}</code></a> \
         · <b>team</b> {} · <a href=\"/ui/builds/{build}/why.json\">why.json</a></div>",
        status(answer.status),
        escape(&reg.map(|r| r.template.to_string()).unwrap_or_default()),
        escape(&reg.map(|r| r.team.to_string()).unwrap_or_default()),
        tid = url_encode(&reg.map(|r| r.template.to_string()).unwrap_or_default()),
    );

    body.push_str(
        "<h2>Phases</h2><table id=\"phases\"><tr><th>phase</th><th>from</th><th>duration</th></tr>",
    );
    for p in &t.phases {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            p.phase,
            p.from.format("%H:%M:%S%.3f"),
            if p.to.is_some() {
                seconds(p.seconds)
            } else {
                "(open)".into()
            }
        );
    }
    body.push_str("</table>");

    // The failed step: the one the failure names, else the one the attempt was inside when it
    // ended (a node lost mid-step), drawn up to the end of the build.
    let failure = answer.failure.as_ref().and_then(|f| {
        let in_flight = || {
            t.steps
                .iter()
                .find(|s| s.started.is_some() && s.ended.is_none())
                .map(|s| s.step)
        };
        Some(super::waterfall::Failure {
            step: f
                .step
                .as_deref()
                .and_then(|s| s.parse().ok())
                .or_else(in_flight)?,
            at: t.phases.iter().rev().find_map(|p| p.to)?,
        })
    });
    if let Some(svg) = super::waterfall::render(&t, failure.as_ref()) {
        body.push_str("<h2>Waterfall</h2>");
        body.push_str(&svg);
    }

    body.push_str("<h2 id=\"why\">Why</h2>");
    match &answer.failure {
        Some(f) => {
            let _ = write!(
                body,
                "<div class=\"box failure\"><b class=\"error\">{:?}</b>{}{} — {}<br>ended by <b>{}</b>{}{}{}</div>",
                f.kind,
                f.step
                    .as_ref()
                    .map(|s| format!(" at step <b>{}</b>", escape(s)))
                    .unwrap_or_default(),
                f.instruction
                    .as_ref()
                    .map(|i| format!(" (<code>{}</code>)", escape(i)))
                    .unwrap_or_default(),
                escape(&f.message),
                escape(&f.ended_by),
                f.exit_code
                    .map(|c| format!(" · exit code <b>{c}</b>"))
                    .unwrap_or_default(),
                f.evidence
                    .as_ref()
                    .map(|e| format!("<br>evidence: {}", escape(e)))
                    .unwrap_or_default(),
                if f.last_log_lines.is_empty() {
                    String::new()
                } else {
                    format!(
                        "<pre>{}</pre>",
                        escape(&f.last_log_lines.join("\n"))
                    )
                },
            );
        }
        None => body.push_str("<div class=\"box\">The build did not fail.</div>"),
    }
    if let Some(c) = &answer.cache {
        let _ = write!(
            body,
            "<div class=\"box\">cache compared with {}; final result: {}{}</div>",
            c.compared_with
                .as_ref()
                .map(|b| format!("<a href=\"/ui/builds/{0}\"><code>{0}</code></a>", escape(b)))
                .unwrap_or_else(|| "no earlier build".into()),
            escape(&c.final_result),
            c.mode
                .as_ref()
                .map(|m| format!("; cache mode {}", escape(m)))
                .unwrap_or_default()
        );
    }

    body.push_str(
        "<h2>Steps</h2><table id=\"steps\"><tr><th>#</th><th>instruction</th><th>outcome</th>\
         <th>duration</th><th>cache</th><th>why</th><th>checkpoint</th><th>epoch</th><th>log</th></tr>",
    );
    let reasons = answer.cache.as_ref().map(|c| &c.steps);
    for s in &t.steps {
        let reason = reasons
            .and_then(|r| r.iter().find(|w| w.step == s.step))
            .map(|w| w.reason.clone())
            .unwrap_or_default();
        let verdict = s.cache_verdict.clone().unwrap_or_default();
        let class = if verdict.contains("hit") || verdict == "cached" {
            "hit"
        } else {
            "miss"
        };
        let _ = write!(
            body,
            "<tr class=\"step\"><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td>\
             <td class=\"{class}\">{}</td><td>{}</td><td><code>{}</code>{}</td><td>{}</td><td><pre>{}</pre></td></tr>",
            s.step,
            escape(&s.instruction),
            s.outcome,
            seconds(s.seconds),
            escape(&verdict),
            escape(&reason),
            escape(s.checkpoint.as_deref().unwrap_or("")),
            s.checkpoint_bytes
                .map(|b| format!(" {}", crate::metrics::storage::human_bytes(b)))
                .unwrap_or_default(),
            s.epoch.map(|e| e.to_string()).unwrap_or_default(),
            escape(&s.log_excerpt.join("\n")),
        );
    }
    body.push_str("</table>");

    body.push_str(
        "<h2>Attempts</h2><table id=\"attempts\"><tr><th>epoch</th><th>node</th><th>acquired</th>\
         <th>renewals</th><th>last lease expiry</th><th>ended</th></tr>",
    );
    for a in &t.attempts {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            a.epoch,
            escape(&a.node),
            a.acquired_at.format("%H:%M:%S%.3f"),
            a.renewals,
            a.last_lease_expiry.format("%H:%M:%S%.3f"),
            a.ended
        );
    }
    body.push_str("</table>");

    body.push_str("<h2>Reconciler actions</h2>");
    if t.reconciler_actions.is_empty() {
        body.push_str("<p>None.</p>");
    } else {
        body.push_str(&event_table("reconciler-actions", &t.reconciler_actions));
    }
    body.push_str("<h2>Events</h2>");
    body.push_str(&event_table("events", &t.events));
    Ok(page(&format!("build {build}"), &body))
}

fn event_table(id: &str, rows: &[timeline::EventRow]) -> String {
    let mut out = format!(
        "<table id=\"{id}\"><tr><th>v</th><th>time</th><th>actor</th><th>epoch</th><th>event</th><th>detail</th></tr>"
    );
    for e in rows {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            e.version,
            e.at.format("%H:%M:%S%.3f"),
            escape(&e.actor),
            e.epoch.map(|e| e.to_string()).unwrap_or_default(),
            escape(&e.event_type),
            escape(&e.summary)
        );
    }
    out.push_str("</table>");
    out
}

/// Failures of a page: a missing build is 404; anything else a logged 500.
#[derive(Debug, thiserror::Error)]
pub enum UiError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("reading the build: {0}")]
    Facts(#[from] FactsError),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("reading the event store: {0}")]
    Events(#[from] ReadError),
}

impl IntoResponse for UiError {
    fn into_response(self) -> Response {
        let status = match &self {
            UiError::NotFound(_) | UiError::Facts(FactsError::NotFound(_)) => StatusCode::NOT_FOUND,
            UiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            _ => {
                tracing::error!(error = %self, "operator page failed");
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        (
            status,
            page("error", &format!("<p>{}</p>", escape(&self.to_string()))),
        )
            .into_response()
    }
}
