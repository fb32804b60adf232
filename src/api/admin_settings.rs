//! Pins through the operator API, as `strata settings` does them on the database:
//!
//! * `GET /admin/settings?team=T[&template=NAME]`: the scope's pins and what a build started
//!   now resolves, each value with its level.
//! * `PUT /admin/settings?team=T[&template=NAME]` with `{"key": "cache.mode", "value": "final",
//!   "by": "alice"}`: pins it (`by` names the operator in the audit trail; default `admin-api`).
//! * `DELETE /admin/settings/{key}?team=T[&template=NAME]`: unpins it.
//!
//! Each answers the scope's view after the change. The audit trail is the scope's stream,
//! `GET /admin/streams/settings-team:T/events`. Behind the admin token like the rest of
//! `/admin`.

use axum::extract::{Path, Query, State};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::admin::AdminError;
use super::AppState;
use crate::app::settings::{self, ScopeError};
use crate::domain::backend_name::SERVICE_VARIABLE;
use crate::domain::settings::SettingsScope;
use crate::events::{Actor, ActorRole, CommandContext, CommandError, Metadata};

#[derive(Debug, Deserialize)]
pub struct ScopeQuery {
    team: String,
    template: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct PinBody {
    key: String,
    value: String,
    by: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
pub struct UnpinBody {
    by: Option<String>,
}

/// One pinned value.
#[derive(Debug, Serialize)]
pub struct PinView {
    pub value: String,
    pub pinned_at: chrono::DateTime<chrono::Utc>,
}

/// What applies to a scope.
#[derive(Debug, Serialize)]
pub struct SettingsView {
    pub scope: String,
    pub pins: std::collections::BTreeMap<String, PinView>,
    /// The cache mode a build started now resolves: value, level, values skipped on the way.
    pub cache_mode: ResolvedView,
    /// The sandbox backend, resolved the same way.
    pub sandbox_backend: ResolvedView,
}

#[derive(Debug, Serialize)]
pub struct ResolvedView {
    pub value: String,
    pub level: String,
    pub skipped: Vec<String>,
}

impl From<ScopeError> for AdminError {
    fn from(e: ScopeError) -> Self {
        match e {
            ScopeError::Store(e) => e.into(),
            other => AdminError::NotFound(other.to_string()),
        }
    }
}

impl From<CommandError<crate::domain::settings::Error>> for AdminError {
    fn from(e: CommandError<crate::domain::settings::Error>) -> Self {
        match e {
            CommandError::Rejected(refused) => AdminError::BadRequest(refused.to_string()),
            CommandError::Read(e) => AdminError::Read(e),
            other => AdminError::Store(other.to_string()),
        }
    }
}

fn context(by: Option<&str>) -> CommandContext {
    let by = by
        .map(str::trim)
        .filter(|b| !b.is_empty())
        .unwrap_or("admin-api");
    CommandContext::new(Metadata::new(Actor::new(ActorRole::Api, by)))
}

async fn view(state: &AppState, scope: &SettingsScope) -> Result<SettingsView, AdminError> {
    let in_force = settings::pins_in(&state.events, scope).await?;
    let pins = in_force.own(scope).clone();
    let mode = in_force.cache_mode(state.protocol.cache_mode.as_deref());
    let backend = in_force.sandbox_backend(state.protocol.sandbox_backend.as_deref());
    Ok(SettingsView {
        scope: scope.to_string(),
        pins: pins
            .pins
            .into_iter()
            .map(|(k, p)| {
                (
                    k,
                    PinView {
                        value: p.value,
                        pinned_at: p.pinned_at,
                    },
                )
            })
            .collect(),
        cache_mode: ResolvedView {
            value: mode.mode.to_string(),
            level: mode.level.as_str().to_owned(),
            skipped: mode
                .skipped
                .iter()
                .map(|(level, why)| format!("{}: {why}", level.as_str()))
                .collect(),
        },
        sandbox_backend: ResolvedView {
            value: backend.backend.to_string(),
            level: backend.level.describe(SERVICE_VARIABLE),
            skipped: backend
                .skipped
                .iter()
                .map(|(level, why)| format!("{}: {why}", level.describe(SERVICE_VARIABLE)))
                .collect(),
        },
    })
}

pub async fn show(
    State(state): State<AppState>,
    Query(q): Query<ScopeQuery>,
) -> Result<Json<SettingsView>, AdminError> {
    let scope = settings::scope_of(&state.events, &q.team, q.template.as_deref()).await?;
    Ok(Json(view(&state, &scope).await?))
}

pub async fn pin(
    State(state): State<AppState>,
    Query(q): Query<ScopeQuery>,
    Json(body): Json<PinBody>,
) -> Result<Json<SettingsView>, AdminError> {
    let scope = settings::scope_of(&state.events, &q.team, q.template.as_deref()).await?;
    let now = crate::clock::local_now();
    settings::pin(
        &state.events,
        &context(body.by.as_deref()),
        &scope,
        body.key.trim(),
        body.value.trim(),
        now,
    )
    .await?;
    Ok(Json(view(&state, &scope).await?))
}

pub async fn unpin(
    State(state): State<AppState>,
    Path(key): Path<String>,
    Query(q): Query<ScopeQuery>,
    body: Option<Json<UnpinBody>>,
) -> Result<Json<SettingsView>, AdminError> {
    let scope = settings::scope_of(&state.events, &q.team, q.template.as_deref()).await?;
    let body = body.map(|Json(b)| b).unwrap_or_default();
    let now = crate::clock::local_now();
    settings::unpin(
        &state.events,
        &context(body.by.as_deref()),
        &scope,
        key.trim(),
        now,
    )
    .await?;
    Ok(Json(view(&state, &scope).await?))
}
