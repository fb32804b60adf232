//! `GET /ui/templates`: templates with their names, tags (where each points) and build results;
//! `GET /ui/storage`: bytes on this node's disk.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use axum::extract::{Query, State};
use axum::response::Html;

use super::builds::UiError;
use super::layout::{escape, page, url_encode};
use super::paging::{self, Cursor};
use crate::api::AppState;
use crate::domain::ids::TemplateId;
use crate::events::command::load;
use crate::projections::{builds, templates};
use crate::streams::{template_stream, Template};

#[derive(Debug, Default, serde::Deserialize)]
pub struct TemplatePage {
    /// Only templates updated before this cursor (from the page's "older" link).
    before: Option<String>,
    /// Rows per page.
    limit: Option<i64>,
}

pub async fn list_templates(
    State(state): State<AppState>,
    Query(asked): Query<TemplatePage>,
) -> Result<Html<String>, UiError> {
    let limit = paging::limit(asked.limit)?;
    let before = asked
        .before
        .as_deref()
        .filter(|s| !s.is_empty())
        .map(Cursor::parse)
        .transpose()?;
    // One row more than the page: whether there is an older page.
    let mut rows = templates::live_templates_page(
        &state.pool,
        before.as_ref().map(|c| (c.at, c.id.as_str())),
        limit + 1,
    )
    .await?;
    let more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    let last = rows.last().filter(|_| more).map(|r| Cursor {
        at: r.updated_at,
        id: r.template.to_string(),
    });
    let ids: Vec<TemplateId> = rows.iter().map(|r| r.template.clone()).collect();
    let counts = builds::phase_counts(&state.pool, &ids).await?;
    let mut by_template: BTreeMap<&TemplateId, Vec<(&str, i64)>> = BTreeMap::new();
    for count in &counts {
        by_template
            .entry(&count.template)
            .or_default()
            .push((&count.phase, count.builds));
    }
    let mut body = String::from(
        "<table id=\"templates\"><tr><th>template</th><th>names</th><th>team</th><th>tags</th>\
         <th>builds</th><th>results</th><th>latest build</th><th>updated</th></tr>",
    );
    for r in &rows {
        // Tags live in the template stream (the read model keeps names only).
        let tags = load::<Template>(&state.events, &template_stream(&r.template))
            .await
            .map(|t| {
                t.state
                    .tags
                    .iter()
                    .map(|(tag, build)| {
                        format!(
                            "{} → <a href=\"/ui/builds/{build}\"><code>{}</code></a>",
                            escape(tag.as_str()),
                            &build.to_string()[..8]
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("<br>")
            })
            .unwrap_or_else(|e| escape(&format!("(unreadable: {e})")));
        let results = by_template
            .get(&r.template)
            .map(|v| {
                v.iter()
                    .map(|(p, n)| format!("<span class=\"{p}\">{p}</span> {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        let _ = write!(
            body,
            "<tr><td><a href=\"/ui?template={}\"><code>{}</code></a></td><td>{}</td><td>{}</td><td>{tags}</td>\
             <td>{}</td><td>{results}</td><td>{}</td><td>{}</td></tr>",
            url_encode(r.template.as_str()),
            escape(r.template.as_str()),
            escape(&r.names.join(", ")),
            escape(r.team.as_str()),
            r.build_count,
            r.latest_build
                .map(|b| format!("<a href=\"/ui/builds/{b}\"><code>{b}</code></a>"))
                .unwrap_or_default(),
            r.updated_at.format("%Y-%m-%d %H:%M:%S"),
        );
    }
    body.push_str("</table>");
    body.push_str(&paging::older_link("/ui/templates", &[], last, limit));
    Ok(page("templates", &body))
}

pub async fn show_storage(State(state): State<AppState>) -> Html<String> {
    let usage = crate::metrics::storage_cache::cached_usage(&state.data_dir).await;
    let mut body = String::from(
        "<p>Bytes on this node's disk (the node serving this page), measured at most 30 s ago. \
         <code>strata storage</code> \
         shows the blob store by garbage-collection tier.</p>\
         <table id=\"storage\"><tr><th>kind</th><th>path</th><th>files</th><th>bytes</th></tr>",
    );
    for u in usage {
        let _ = write!(
            body,
            "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td>{} ({})</td></tr>",
            u.kind,
            escape(&u.path.display().to_string()),
            u.files,
            u.bytes,
            crate::metrics::storage::human_bytes(u.bytes)
        );
    }
    body.push_str("</table>");
    page("storage", &body)
}
