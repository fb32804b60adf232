//! `/ui`: the operator page. Server-rendered HTML, no scripts, no build chain; it only reads
//! (the `builds` and `templates` read models, build streams, `build_logs`, the event table),
//! never writes. Behind the admin token ([`auth`]).
//!
//! * [`overview`]: the charts over time heading the builds list, drawn by [`charts`].
//! * [`builds`]: the builds list (filterable), one build's timeline and its `why`.
//! * [`templates`]: templates with tags and results; storage on this node.
//! * [`sandboxes`]: sandboxes per team, their lifetimes ([`lifetimes`]), live and recently
//!   ended.
//! * [`teams`]: the per-team limits and what each team holds now.
//! * [`layout`]: the page frame and HTML escaping.
//! * [`paging`]: newest-first pages with an "older" link.
//! * [`waterfall`]: a build's phases and steps drawn on one time axis (inline SVG).

pub mod auth;
pub mod builds;
pub mod charts;
pub mod layout;
pub mod lifetimes;
pub mod overview;
pub mod paging;
pub mod sandboxes;
pub mod teams;
pub mod templates;
pub mod waterfall;

use axum::middleware;
use axum::routing::{get, post};
use axum::Router;

use super::AppState;

pub fn routes(state: AppState) -> Router<AppState> {
    let pages = Router::new()
        .route("/ui", get(builds::list_builds))
        .route("/ui/builds/{id}", get(builds::show_build))
        .route("/ui/builds/{id}/why.json", get(builds::why_json))
        .route("/ui/templates", get(templates::list_templates))
        .route("/ui/storage", get(templates::show_storage))
        .route("/ui/teams", get(teams::show_teams))
        .route("/ui/sandboxes", get(sandboxes::show_sandboxes))
        .route_layer(middleware::from_fn_with_state(state, auth::require_admin));
    pages.route("/ui/login", post(auth::login).get(auth::login_link))
}
