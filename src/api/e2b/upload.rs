//! `PUT /upload/{build}/{intent}/{hash}/{generation}?team=&max=&exp=&sig=`: receive one context
//! archive. The URL is the only credential (the SDK sends no API key here).
//!
//! Order matters, and nothing is visible until the end: verify the signed URL; refuse a build
//! that already froze; stream the body to a temporary object while hashing it, enforcing the
//! exact `Content-Length` and the grant's ceiling; publish the bytes content-addressed
//! (create-if-absent) once their digest is known; then one compare-and-set completes the intent and binds the generation
//! (intent Pending ∧ build Waiting ∧ binding as the link saw it). Only then 200.

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode, Uri};

use super::files_link::upload_error;
use super::{api_metadata, command_error};
use crate::api::error::ApiError;
use crate::api::upload_ingest::{ingest_upload, IngestError};
use crate::api::AppState;
use crate::app::CommandContext;
use crate::domain::build::upload::CompleteUpload;
use crate::domain::build::Phase;
use crate::domain::upload_url::{verify, UploadGrant, UrlError, METHOD_PUT};
use crate::events::command::load;
use crate::streams::{build_stream, Build};
use tracing::Instrument;

#[tracing::instrument(skip_all, fields(build = tracing::field::Empty, hash = tracing::field::Empty, size = tracing::field::Empty, digest = tracing::field::Empty))]
pub async fn upload_context(
    State(state): State<AppState>,
    uri: Uri,
    headers: axum::http::HeaderMap,
    body: Body,
) -> Result<StatusCode, ApiError> {
    // Expiry is judged by the database's clock, like every lease and deadline (crate::clock).
    let now = crate::streams::database_now(&state.pool).await?;
    let grant = verify(
        uri.path(),
        uri.query().unwrap_or(""),
        METHOD_PUT,
        &state.upload_secret,
        now,
    )
    .map_err(url_error)?;
    let span = tracing::Span::current();
    span.record("build", grant.build.to_string());
    span.record("hash", grant.hash.as_str());

    let declared: u64 = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::LENGTH_REQUIRED,
                "the upload needs an exact Content-Length header; chunked bodies are not accepted",
            )
        })?;
    if declared > grant.max_size {
        return Err(too_large(declared, grant.max_size));
    }
    refuse_if_frozen(&state, &grant).await?;

    let started = std::time::Instant::now();
    let work = crate::trace::build_span(&state.events, grant.build, "build.upload").await;
    let stored = store_upload(&state, &grant, declared, body, &span)
        .instrument(work)
        .await;
    crate::metrics::upload(stored.as_ref().ok().map(|_| declared), started.elapsed());
    stored?;
    tracing::info!("upload completed and bound");
    Ok(StatusCode::OK)
}

/// Stages, publishes and binds the body: the part of an upload whose size and time are measured.
async fn store_upload(
    state: &AppState,
    grant: &UploadGrant,
    declared: u64,
    body: Body,
    span: &tracing::Span,
) -> Result<(), ApiError> {
    let ingested = ingest_upload(
        body.into_data_stream(),
        declared,
        grant.max_size,
        state.blobs.clone(),
        |digest| reference_content(state, grant, digest),
    )
    .await
    .map_err(ingest_error)?;
    let digest = ingested.digest;
    span.record("size", ingested.size);
    span.record("digest", digest.to_string());

    let command = CompleteUpload {
        build: grant.build,
        intent: grant.intent,
        hash: grant.hash.clone(),
        generation: grant.generation,
        blob_digest: digest,
        size: declared,
        now: crate::streams::database_now(&state.pool).await?,
    };
    complete(state, &command).await
}

/// References the received bytes on their `object-…` stream before they are published: if a
/// garbage-collection pass is deleting an identical object, waits for it to finish so the
/// publish that follows stores these bytes anew.
async fn reference_content(
    state: &AppState,
    grant: &UploadGrant,
    digest: crate::domain::ids::Digest,
) -> Result<(), IngestError> {
    use crate::domain::object::Error as ObjectError;
    let by = format!("upload to build {} for {}", grant.build, grant.hash);
    for _ in 0..2 {
        let ctx = CommandContext::new(api_metadata(state));
        match crate::app::object::reference(&state.events, &ctx, &[digest], &by).await {
            Ok(_) => return Ok(()),
            Err(crate::events::CommandError::Rejected(ObjectError::Deleting { .. })) => {
                crate::app::object::wait_while_deleting(
                    &state.events,
                    &CommandContext::new(api_metadata(state)),
                    &digest,
                    &by,
                    std::time::Duration::from_secs(60),
                )
                .await
                .map_err(|e| IngestError::Refused(e.to_string()))?;
            }
            Err(e) => return Err(IngestError::Refused(e.to_string())),
        }
    }
    Err(IngestError::Refused(format!(
        "the content {digest} is still being deleted by garbage collection; upload it again"
    )))
}

/// Cheap early refusal, before reading a body that could not be used. The compare-and-set at
/// the end is what guarantees it.
async fn refuse_if_frozen(state: &AppState, grant: &UploadGrant) -> Result<(), ApiError> {
    let build = load::<Build>(&state.events, &build_stream(&grant.build))
        .await
        .map_err(|e| {
            command_error(e, |e: crate::domain::build::Error| {
                ApiError::internal("build", &e)
            })
        })?;
    match &build.state.phase {
        Phase::Waiting { .. } => Ok(()),
        Phase::Unregistered => Err(ApiError::not_found(format!("build {} not found", grant.build))),
        _ => Err(ApiError::conflict(format!(
            "build {} has already started (or ended); uploads are accepted only before the build starts",
            grant.build
        ))),
    }
}

async fn complete(state: &AppState, cmd: &CompleteUpload) -> Result<(), ApiError> {
    let ctx = CommandContext::new(api_metadata(state));
    crate::app::upload::complete_upload(&state.events, &ctx, cmd)
        .await
        .map_err(|e| command_error(e, upload_error))
}

/// Expired or altered URLs are 403: the URL is the credential.
fn url_error(err: UrlError) -> ApiError {
    tracing::info!(error = %err, "upload URL refused");
    ApiError::forbidden(err.to_string())
}

fn too_large(declared: u64, ceiling: u64) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("upload of {declared} bytes exceeds the {ceiling}-byte limit of this upload URL"),
    )
}

fn ingest_error(err: IngestError) -> ApiError {
    match err {
        IngestError::TooLarge { declared, ceiling } => too_large(declared, ceiling),
        IngestError::LengthMismatch { .. } | IngestError::Body(_) => {
            ApiError::bad_request(err.to_string())
        }
        IngestError::Store { .. } => ApiError::internal("storing the upload", &err),
        IngestError::Refused(_) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, err.to_string()),
    }
}
