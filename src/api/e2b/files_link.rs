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
use crate::app::CommandContext;
use crate::domain::build::upload::{LinkResponse, ReserveUpload, UploadError};
use crate::domain::ids::{BuildId, FilesHash, IntentId};
use crate::domain::upload_url::UploadGrant;

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
    let span = crate::trace::build_span(&state.events, build, "build.upload_link").await;
    let link = tracing::Instrument::instrument(reserve(&state, &team, &command), span).await?;
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
    crate::projections::builds::waiting_build(&state.pool, template_id)
        .await?
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "no build of template {template_id} is waiting for uploads; register one with POST /v3/templates first"
            ))
        })
}

/// One compare-and-set over the build and the files stream of the hash.
/// The team's limit on upload links not yet used is checked in the same transaction.
async fn reserve(
    state: &AppState,
    team: &Team,
    command: &ReserveUpload,
) -> Result<LinkResponse, ApiError> {
    let ctx = CommandContext::new(api_metadata(state)).with_admission(
        crate::projections::team_usage::admission(
            &state.protocol.team_limits,
            &team.0,
            crate::domain::team_limits::Held::PendingUploads,
        ),
    );
    crate::app::upload::link_upload(&state.events, &ctx, &state.blobs, command)
        .await
        .map_err(|e| command_error(e, upload_error))
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
