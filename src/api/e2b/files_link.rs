//! `GET /templates/{templateID}/files/{filesHash}`: hand out an upload link for one COPY's
//! context archive. Every response reserves an upload intent with a fresh generation and carries
//! a signed URL, also when the content is already present, because `forceUpload` PUTs to the URL
//! of this same response (RFC Phase 0).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::auth::Team;
use super::{api_metadata, check_team_template, command_error, parse_template_id};
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::domain::build::upload::{
    reserve_upload, Decision, LinkResponse, ReserveUpload, UploadError,
};
use crate::domain::ids::{BuildId, FilesHash, IntentId};
use crate::domain::upload_url::UploadGrant;
use crate::domain::{build, files};
use crate::events::command::{execute_writes, load, CommandContext};
use crate::events::{CommandError, StreamWrite};
use crate::streams::{build_stream, files_stream, Build, Files};

/// The 201 body. `present` is required and must be a JSON boolean; `url` is always sent.
#[derive(Debug, Serialize)]
pub struct LinkBody {
    present: bool,
    url: String,
}

/// An upload may take this long after its URL was issued before the intent lapses.
const UPLOAD_GRACE: chrono::Duration = chrono::Duration::hours(1);

#[tracing::instrument(skip_all, fields(team = %team.0, template = %template_id, hash = %hash))]
pub async fn upload_link(
    State(state): State<AppState>,
    team: Team,
    Path((template_id, hash)): Path<(String, String)>,
) -> Result<(StatusCode, Json<LinkBody>), ApiError> {
    let template_id = parse_template_id(&template_id)?;
    let hash = FilesHash::parse(&hash).map_err(|_| {
        ApiError::bad_request(format!(
            "filesHash {hash:?} is invalid: expected 64 lowercase hex characters"
        ))
    })?;
    check_team_template(&state, &team.0, &template_id).await?;
    let build = waiting_build(&state, &template_id).await?;

    let now = crate::streams::database_now(&state.pool).await?;
    let url_expires_at = now + state.protocol.upload_url_ttl;
    let command = ReserveUpload {
        build,
        intent: IntentId::from_uuid(Uuid::new_v4()),
        hash: hash.clone(),
        now,
        expires_at: url_expires_at + UPLOAD_GRACE,
    };
    let link = reserve(&state, &command).await?;
    let url = signed_url(&state, &team, &command, &link, url_expires_at);
    tracing::info!(build = %build, present = link.present, generation = %link.generation, "upload link issued");
    Ok((
        StatusCode::CREATED,
        Json(LinkBody {
            present: link.present,
            url,
        }),
    ))
}

/// The template's most recent build still waiting for uploads: the build the SDK just
/// registered (the link call names only the template).
async fn waiting_build(
    state: &AppState,
    template_id: &crate::domain::ids::TemplateId,
) -> Result<BuildId, ApiError> {
    let build: Option<Uuid> = sqlx::query_scalar(
        "SELECT build_id FROM builds WHERE template_id = $1 AND phase = 'waiting'
         ORDER BY registered_at DESC LIMIT 1",
    )
    .bind(template_id.as_str())
    .fetch_optional(&state.pool)
    .await?;
    build.map(BuildId::from_uuid).ok_or_else(|| {
        ApiError::bad_request(format!(
            "no build of template {template_id} is waiting for uploads; register one with POST /v3/templates first"
        ))
    })
}

/// One compare-and-set over the build and the files stream of the hash.
async fn reserve(state: &AppState, command: &ReserveUpload) -> Result<LinkResponse, ApiError> {
    decide_build_and_files(state, &command.build, &command.hash, |build, files| {
        reserve_upload(build, files, command)
    })
    .await
}

/// Loads a build and the `files-{scope}:{hash}` stream of its scope, runs `decide` over both,
/// and appends the decision's events to both streams at the versions read, in one transaction
/// (deciding again on a version conflict). The upload link and the upload completion are both
/// this shape.
pub(crate) async fn decide_build_and_files<T>(
    state: &AppState,
    build_id: &BuildId,
    hash: &FilesHash,
    decide: impl Fn(&build::State, &files::State) -> Result<(Decision, T), UploadError>,
) -> Result<T, ApiError> {
    let ctx = CommandContext::new(api_metadata(state));
    let answer = std::sync::Mutex::new(None);
    let (st, ctx_ref, answer_ref, decide) = (state, &ctx, &answer, &decide);
    execute_writes(&state.events, 16, move || async move {
        let b_stream = build_stream(build_id);
        let build = load::<Build>(&st.events, &b_stream)
            .await
            .map_err(CommandError::into_other)?;
        let scope = build
            .state
            .scope()
            .ok_or(CommandError::Rejected(UploadError::NotRegistered))?;
        let f_stream = files_stream(&scope, hash);
        let files = load::<Files>(&st.events, &f_stream)
            .await
            .map_err(CommandError::into_other)?;
        let (decision, value) =
            decide(&build.state, &files.state).map_err(CommandError::Rejected)?;
        *answer_ref.lock().expect("not poisoned") = Some(value);
        Ok(vec![
            StreamWrite::new(
                b_stream.clone(),
                build.expected(),
                ctx_ref.encode(&b_stream, &decision.build)?,
            ),
            StreamWrite::new(
                f_stream.clone(),
                files.expected(),
                ctx_ref.encode(&f_stream, &decision.files)?,
            ),
        ])
    })
    .await
    .map_err(|e| command_error(e, upload_error))?;
    Ok(answer
        .into_inner()
        .expect("not poisoned")
        .expect("a successful decision set the answer"))
}

fn signed_url(
    state: &AppState,
    team: &Team,
    command: &ReserveUpload,
    link: &LinkResponse,
    expires_at: DateTime<Utc>,
) -> String {
    let grant = UploadGrant {
        team: team.0.clone(),
        build: command.build,
        intent: link.intent,
        hash: command.hash.clone(),
        generation: link.generation,
        max_size: state.protocol.upload_max_bytes,
        expires_at,
    };
    format!(
        "{}{}",
        state.public_url,
        grant.sign(&state.upload_secret).expose_path_and_query()
    )
}

/// HTTP status of an upload refusal: the build moved on (409), it does not exist (404), or the
/// URL does not match what was reserved (409: request a new link).
pub(crate) fn upload_error(err: UploadError) -> ApiError {
    match err {
        UploadError::NotRegistered => ApiError::not_found(err.to_string()),
        _ => ApiError::conflict(err.to_string()),
    }
}
