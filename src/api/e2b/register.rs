//! `POST /v3/templates`: register a build. The same name in the same team is the same template;
//! every call is a new build, waiting for its uploads and its start.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use chrono::Utc;
use serde::Serialize;
use uuid::Uuid;

use super::auth::Team;
use super::{api_metadata, command_error, lift};
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::domain::build;
use crate::domain::build_spec::TemplateBuildRequestV3;
use crate::domain::ids::{BuildId, TemplateId};
use crate::domain::template;
use crate::events::command::{execute_writes, load, CommandContext};
use crate::events::{CommandError, StreamWrite};
use crate::streams::{build_stream, template_name_stream, template_stream, Template, TemplateName};

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

#[derive(Debug, thiserror::Error)]
enum RegisterError {
    #[error(transparent)]
    Template(template::Error),
    #[error(transparent)]
    Build(build::Error),
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
    let tags = request.effective_tags();
    let build_id = BuildId::from_uuid(Uuid::new_v4());
    let candidate = new_template_id();
    let now = Utc::now();
    let waiting_deadline = now + state.protocol.waiting_timeout;
    let ctx = CommandContext::new(api_metadata(&state));
    let name_stream = template_name_stream(&team.0, &request.name.name);

    let chosen = std::sync::Mutex::new(candidate.clone());
    let (st, ctx, tm, req, tg, cand, name_stream, chosen_ref) = (
        &state,
        &ctx,
        &team,
        &request,
        &tags,
        &candidate,
        &name_stream,
        &chosen,
    );
    execute_writes(&state.events, 16, move || {
        let (state, team, request, tags, candidate, chosen) = (st, tm, req, tg, cand, chosen_ref);
        async move {
            let names = load::<TemplateName>(&state.events, name_stream)
                .await
                .map_err(lift)?;
            let holder = names
                .state
                .holder
                .clone()
                .unwrap_or_else(|| candidate.clone());
            let tpl_stream = template_stream(&holder);
            let tpl = load::<Template>(&state.events, &tpl_stream)
                .await
                .map_err(lift)?;
            let registration = template::register_build(
                &names.state,
                &tpl.state,
                &team.0,
                &request.name,
                candidate,
                build_id,
                tags,
                now,
            )
            .map_err(|e| CommandError::Rejected(RegisterError::Template(e)))?;
            let build_events = build::decide(
                &build::State::default(),
                &build::Command::RegisterBuild {
                    template: registration.template.clone(),
                    team: team.0.clone(),
                    tags: tags.clone(),
                    resources: request.resources,
                    now,
                    waiting_deadline,
                },
            )
            .map_err(|e| CommandError::Rejected(RegisterError::Build(e)))?;
            *chosen.lock().expect("not poisoned") = registration.template.clone();
            let b_stream = build_stream(&build_id);
            Ok(vec![
                StreamWrite::new(
                    name_stream.clone(),
                    names.expected(),
                    ctx.encode(name_stream, &registration.name_events)?,
                ),
                StreamWrite::new(
                    tpl_stream.clone(),
                    tpl.expected(),
                    ctx.encode(&tpl_stream, &registration.template_events)?,
                ),
                StreamWrite::new(
                    b_stream.clone(),
                    crate::events::ExpectedVersion::NoStream,
                    ctx.encode(&b_stream, &build_events)?,
                ),
            ])
        }
    })
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

    let template_id = chosen.into_inner().expect("not poisoned");
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

/// A short random template id, like E2B's: 20 lowercase letters and digits.
fn new_template_id() -> TemplateId {
    use rand::Rng;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::thread_rng();
    let id: String = (0..20)
        .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
        .collect();
    TemplateId::parse(&id).expect("the alphabet is valid for template ids")
}
