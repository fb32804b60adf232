//! `POST /v2/templates/{templateID}/builds/{buildID}`: start a build. One compare-and-set on
//! the build stream freezes the bindings, records the request digest and queues the build for a
//! worker; a COPY whose hash has no binding fails the start with 400 naming the hash.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;

use super::auth::Team;
use super::{api_metadata, check_team_template, command_error, parse_template_id};
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::app::CommandContext;
use crate::domain::build;
use crate::domain::build_spec::{BaseSource, TemplateBuildStartV2};
use crate::domain::ids::{BuildId, TeamId, TemplateId};
use crate::domain::image_ref::ImageRef;
use crate::events::command::load;
use crate::events::CommandError;
use crate::registry::sealed;
use crate::streams::{build_stream, Build};
use tracing::Instrument;

#[tracing::instrument(skip_all, fields(team = %team.0, template = %template_id, build = %build_id))]
pub async fn start_build(
    State(state): State<AppState>,
    team: Team,
    Path((template_id, build_id)): Path<(String, String)>,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let template_id = parse_template_id(&template_id)?;
    check_team_template(&state, &team.0, &template_id).await?;
    let build_id = parse_build_id(&build_id)?;
    let spec: TemplateBuildStartV2 = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid build start request: {e}")))?;
    state
        .protocol
        .team_limits
        .check_steps(spec.steps.len())
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    check_build_of(&state, &team.0, &template_id, &build_id).await?;
    // The template's pin, the team's, the service's setting: what the build runs for life.
    let pins = crate::app::settings::PinsInForce::read(&state.events, &team.0, Some(&template_id))
        .await
        .map_err(|e| ApiError::internal("reading the settings pins", &e))?;
    let resolved = crate::app::build::Resolved {
        cache_mode: Some(pins.cache_mode(state.protocol.cache_mode.as_deref())),
        sandbox_backend: Some(pins.sandbox_backend(state.protocol.sandbox_backend.as_deref())),
    };

    if let BaseSource::Image { reference, .. } = &spec.base {
        ImageRef::parse(reference)
            .map_err(|e| ApiError::bad_request(format!("invalid 'fromImage': {e}")))?;
    }
    // Credentials never enter the event; they are sealed for the worker that claims the build.
    let sealed = match &spec.base {
        BaseSource::Image {
            registry: Some(credentials),
            ..
        } => {
            let sealed = state.credential_seal.seal(&build_id, credentials);
            let stored = sealed::store(&state.pool, &build_id, &sealed)
                .await
                .map_err(|e| ApiError::internal("storing the registry credentials", &e))?;
            stored.then_some(sealed)
        }
        _ => None,
    };
    let now = crate::streams::database_now(&state.pool).await?;
    let queue_deadline = now + state.protocol.queue_timeout;
    let span = crate::trace::build_span(&state.events, build_id, "build.start").await;
    let ctx = span.in_scope(|| CommandContext::new(api_metadata(&state)));
    // The credentials enter the recorded request digest only keyed with the server secret.
    let fingerprint = match &spec.base {
        BaseSource::Image {
            registry: Some(credentials),
            ..
        } => Some(state.credential_seal.fingerprint(credentials)),
        _ => None,
    };
    let started = crate::app::build::start_build_keyed(
        &state.events,
        &ctx,
        &build_id,
        spec,
        fingerprint,
        resolved,
        now,
        queue_deadline,
    )
    .instrument(span)
    .await;
    if let (Err(CommandError::Rejected(_)), Some(sealed)) = (&started, &sealed) {
        // This start stored them and the build refused it: they belong to no build. Any other
        // error leaves the outcome unknown (the freeze may have committed and only its reply
        // been lost, and a node may be claiming the build now), so they stay: the event that
        // ends the build deletes them either way (`projections/builds.rs`), and a retry of
        // this request is a replay of the same start.
        let _ = sealed::discard(&state.pool, &build_id, sealed).await;
    }
    started.map_err(|e| command_error(e, start_error))?;
    tracing::info!("build started and queued");
    Ok(StatusCode::ACCEPTED)
}

pub(crate) fn parse_build_id(raw: &str) -> Result<BuildId, ApiError> {
    BuildId::parse(raw).map_err(|_| ApiError::not_found(format!("build {raw:?} not found")))
}

/// The build must belong to this template and team; anything else is reported as not found.
pub(crate) async fn check_build_of(
    state: &AppState,
    team: &TeamId,
    template: &TemplateId,
    build_id: &BuildId,
) -> Result<build::State, ApiError> {
    let loaded = load::<Build>(&state.events, &build_stream(build_id))
        .await
        .map_err(|e| command_error(e, |e: build::Error| ApiError::internal("build", &e)))?;
    match &loaded.state.registration {
        Some(r) if &r.team == team && &r.template == template => Ok(loaded.state),
        _ => Err(ApiError::not_found(format!(
            "build {build_id} of template {template} not found"
        ))),
    }
}

fn start_error(err: build::Error) -> ApiError {
    match err {
        build::Error::StartConflict { .. } => ApiError::conflict(err.to_string()),
        build::Error::NotRegistered => ApiError::not_found(err.to_string()),
        _ => ApiError::bad_request(err.to_string()),
    }
}
