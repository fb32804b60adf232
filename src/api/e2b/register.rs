//! `POST /v3/templates`: register a build. The same name in the same team is the same template;
//! every call is a new build, waiting for its uploads and its start.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Serialize;

use super::auth::Team;
use super::{api_metadata, command_error};
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::app::registration::{
    register_build as register_build_events, RegisterBuild, RegisterError,
};
use crate::domain::build_spec::TemplateBuildRequestV3;
use crate::domain::template;
use crate::events::command::CommandContext;

/// The 202 body; the SDK requires all six keys.
#[derive(Debug, Serialize)]
pub struct RegisterResponse {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "buildID")]
    build_id: String,
    public: bool,
    names: Vec<String>,
    tags: Vec<String>,
    aliases: Vec<String>,
}

#[tracing::instrument(skip_all, fields(team = %team.0, template = tracing::field::Empty, build = tracing::field::Empty))]
pub async fn register_build(
    State(state): State<AppState>,
    team: Team,
    body: Bytes,
) -> Result<(StatusCode, Json<RegisterResponse>), ApiError> {
    let request: TemplateBuildRequestV3 = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid template build request: {e}")))?;
    if let Some(namespace) = &request.name.namespace {
        if namespace != team.0.as_str() {
            return Err(ApiError::bad_request(format!(
                "template name {} is namespaced to {namespace:?}, but this API key belongs to team {:?}; \
                 drop the namespace or use your team's",
                request.name, team.0.as_str()
            )));
        }
    }
    state
        .protocol
        .ceilings
        .check(&request.resources)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let tags = request.effective_tags();
    let now = crate::streams::database_now(&state.pool).await?;
    let command = RegisterBuild {
        team: team.0.clone(),
        name: request.name.clone(),
        tags: tags.clone(),
        resources: request.resources,
        now,
        waiting_deadline: now + state.protocol.waiting_timeout,
    };
    let ctx = CommandContext::new(api_metadata(&state)).with_admission(
        crate::projections::team_usage::admission(
            &state.protocol.team_limits,
            &team.0,
            crate::domain::team_limits::Held::QueuedBuilds,
        ),
    );
    let (template_id, build_id) = register_build_events(&state.events, &ctx, &command)
        .await
        .map_err(|e| {
            command_error(e, |e| match e {
                RegisterError::Template(template::Error::Deleted) => ApiError::conflict(format!(
                    "template {} was deleted; register under a new name",
                    request.name
                )),
                other => ApiError::bad_request(other.to_string()),
            })
        })?;

    let span = tracing::Span::current();
    span.record("template", template_id.as_str());
    span.record("build", build_id.to_string());
    tracing::info!("build registered");
    let name = request.name.to_string();
    Ok((
        StatusCode::ACCEPTED,
        Json(RegisterResponse {
            template_id: template_id.to_string(),
            build_id: build_id.to_string(),
            public: false,
            names: vec![name.clone()],
            tags: tags.iter().map(|t| t.as_str().to_owned()).collect(),
            aliases: vec![name],
        }),
    ))
}
