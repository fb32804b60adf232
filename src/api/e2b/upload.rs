//! `PUT /upload/{build}/{intent}/{hash}/{generation}?team=&max=&exp=&sig=`: receive one context
//! archive. The URL is the only credential (the SDK sends no API key here).
//!
//! Order matters, and nothing is visible until the end: verify the signed URL; take one of the
//! process's upload slots (503 with `Retry-After` when all are busy); claim the intent before
//! reading a byte (another PUT to the same URL is refused at once, a build that already froze
//! too); stream the body to a temporary object while hashing it, enforcing the exact
//! `Content-Length`, the grant's ceiling and the idle limit; publish the bytes
//! content-addressed (create-if-absent) once their digest is known; then one compare-and-set
//! completes the intent and binds the generation (intent Pending ∧ build Waiting ∧ binding as
//! the link saw it), holding the team to its stored-uploads limit in the same append (413 past
//! it; the limit is also checked against `Content-Length` before a byte is read). Only then
//! 200. A PUT to a URL whose upload already completed is hashed and stored nowhere: the same
//! bytes are a replay (200), others a conflict (409).

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode, Uri};

use super::files_link::upload_error;
use super::{api_metadata, command_error};
use crate::api::error::ApiError;
use crate::api::upload_ingest::{digest_body, ingest_upload, BodyLimits, IngestError};
use crate::api::AppState;
use crate::app::CommandContext;
use crate::domain::build::upload::{Claim, ClaimUpload, CompleteUpload, UploadError};
use crate::domain::ids::TeamId;
use crate::domain::team_limits::Held;
use crate::domain::upload_url::{verify, UploadGrant, UrlError, METHOD_PUT};
use crate::events::{AppendError, CommandError};
use tracing::Instrument;
use uuid::Uuid;

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
    let _slot = state
        .upload_slots
        .clone()
        .try_acquire_owned()
        .map_err(|_| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "this server is receiving as many uploads as it takes at once \
             (STRATA_UPLOAD_MAX_CONCURRENT); retry shortly",
            )
            .retry_after(UPLOAD_BUSY_RETRY_SECS)
        })?;
    let limits = BodyLimits {
        declared,
        ceiling: grant.max_size,
        idle: state.protocol.upload_idle_timeout,
    };
    let claim = Uuid::new_v4();
    match claim_intent(&state, &grant, claim).await? {
        Claim::Completed { blob_digest } if stored_intact(&state, blob_digest).await => {
            return replay(body, limits, &grant, blob_digest).await;
        }
        Claim::Completed { blob_digest } => {
            return repair(&state, &grant, limits, body, blob_digest).await;
        }
        Claim::Receive => {}
    }
    // A request dropped mid-body (the client went away, the server is shutting down) never
    // reaches the release below: the guard's drop releases the claim then.
    let mut held = HeldClaim {
        state: state.clone(),
        grant: grant.clone(),
        claim,
        reason: Some("the client went away before the upload ended".into()),
    };

    let started = std::time::Instant::now();
    let work = crate::trace::build_span(&state.events, grant.build, "build.upload").await;
    let stored = store_upload(&state, &grant, claim, limits, body, &span)
        .instrument(work)
        .await;
    crate::metrics::upload(stored.as_ref().ok().map(|_| declared), started.elapsed());
    // Ended here: released before answering, so the client's retry finds the URL free.
    held.reason = None;
    if let Err(err) = &stored {
        release(&state, &grant, claim, &err.message).await;
    }
    stored?;
    tracing::info!("upload completed and bound");
    Ok(StatusCode::OK)
}

/// A claim this request holds: released when it is dropped still holding a `reason`, in a task
/// of its own, which is how a request cancelled mid-body releases it.
struct HeldClaim {
    state: AppState,
    grant: UploadGrant,
    claim: Uuid,
    reason: Option<String>,
}

impl Drop for HeldClaim {
    fn drop(&mut self) {
        let Some(reason) = self.reason.take() else {
            return;
        };
        let (state, grant, claim) = (self.state.clone(), self.grant.clone(), self.claim);
        tokio::spawn(async move { release(&state, &grant, claim, &reason).await });
    }
}

/// Seconds a client is told to wait when every upload slot is busy.
const UPLOAD_BUSY_RETRY_SECS: u32 = 5;

/// Claims the URL's intent for this upload, before its body is read.
async fn claim_intent(
    state: &AppState,
    grant: &UploadGrant,
    claim: Uuid,
) -> Result<Claim, ApiError> {
    let command = ClaimUpload {
        intent: grant.intent,
        hash: grant.hash.clone(),
        generation: grant.generation,
        claim,
        now: crate::streams::database_now(&state.pool).await?,
    };
    let ctx = CommandContext::new(api_metadata(state));
    crate::app::upload::claim_upload(&state.events, &ctx, &grant.build, &command)
        .await
        .map_err(|e| command_error(e, upload_error))
}

/// A PUT to a URL whose upload completed: hashed, stored nowhere. The same bytes are a replay
/// of the completed upload; any other bytes cannot replace them.
async fn replay(
    body: Body,
    limits: BodyLimits,
    grant: &UploadGrant,
    completed: crate::domain::ids::Digest,
) -> Result<StatusCode, ApiError> {
    let got = digest_body(body.into_data_stream(), limits)
        .await
        .map_err(ingest_error)?;
    if got.digest == completed {
        tracing::info!(digest = %completed, "upload replayed; the completed upload stands and nothing was stored");
        return Ok(StatusCode::OK);
    }
    Err(upload_error(UploadError::DigestConflict {
        intent: grant.intent,
        completed,
        attempted: got.digest,
    }))
}

/// Whether the blob store holds `digest` intact (read and checked; a store that cannot tell
/// counts as not intact, which costs a repair upload, never a wrong answer).
async fn stored_intact(state: &AppState, digest: crate::domain::ids::Digest) -> bool {
    let blobs = state.blobs.clone();
    matches!(
        tokio::task::spawn_blocking(move || blobs.intact_size(&digest)).await,
        Ok(Ok(Some(_)))
    )
}

/// A PUT to a URL whose upload completed, when the stored bytes are torn or gone (a host crash
/// under the blob store): the body is stored again, and published only if it is the completed
/// upload's bytes, so the repair can never store anything else.
async fn repair(
    state: &AppState,
    grant: &UploadGrant,
    limits: BodyLimits,
    body: Body,
    completed: crate::domain::ids::Digest,
) -> Result<StatusCode, ApiError> {
    ingest_upload(
        body.into_data_stream(),
        limits,
        state.blobs.clone(),
        |digest| async move {
            if digest != completed {
                return Err(IngestError::Conflict(
                    UploadError::DigestConflict {
                        intent: grant.intent,
                        completed,
                        attempted: digest,
                    }
                    .to_string(),
                ));
            }
            reference_content(state, grant, digest).await
        },
    )
    .await
    .map_err(ingest_error)?;
    tracing::warn!(digest = %completed, "the completed upload's stored bytes were torn or missing; the replay stored them again");
    Ok(StatusCode::OK)
}

/// Releases the claim of an upload that failed, so the URL can be used again. A release that
/// cannot be written leaves the URL claimed: the client then asks for a new link.
async fn release(state: &AppState, grant: &UploadGrant, claim: Uuid, reason: &str) {
    let ctx = CommandContext::new(api_metadata(state));
    if let Err(e) = crate::app::upload::release_upload_claim(
        &state.events,
        &ctx,
        &grant.build,
        &grant.hash,
        grant.intent,
        claim,
        reason,
    )
    .await
    {
        tracing::warn!(error = %e, "releasing the claim of a failed upload failed; its URL stays claimed, and a new link is needed");
    }
}

/// Stages, publishes and binds the body: the part of an upload whose size and time are measured.
async fn store_upload(
    state: &AppState,
    grant: &UploadGrant,
    claim: Uuid,
    limits: BodyLimits,
    body: Body,
    span: &tracing::Span,
) -> Result<(), ApiError> {
    let team_limits = &state.protocol.team_limits;
    if team_limits.stored_upload_bytes.is_some() {
        let stored =
            crate::projections::stored_uploads::team_bytes(&state.pool, &grant.team).await?;
        team_limits
            .check_upload(&grant.team, stored, limits.declared)
            .map_err(|e| ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, e.to_string()))?;
    }
    let ingested = ingest_upload(
        body.into_data_stream(),
        limits,
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
        size: ingested.size,
        now: crate::streams::database_now(&state.pool).await?,
        claim: Some(claim),
    };
    complete(state, &command, &grant.team).await
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

/// Completes the intent, holding the team to its stored-uploads limit inside the append: two
/// uploads that each fit alone cannot both commit past it. The refused one's bytes stay in the
/// blob store unreferenced until garbage collection takes them.
async fn complete(state: &AppState, cmd: &CompleteUpload, team: &TeamId) -> Result<(), ApiError> {
    let ctx = CommandContext::new(api_metadata(state)).with_admission(
        crate::projections::team_usage::admission(
            &state.protocol.team_limits,
            team,
            Held::StoredUploadBytes,
        ),
    );
    crate::app::upload::complete_upload(&state.events, &ctx, cmd)
        .await
        .map_err(|e| match e {
            CommandError::Append(AppendError::Refused(limit)) => {
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, limit.0)
            }
            e => command_error(e, upload_error),
        })
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
        IngestError::Idle { .. } => ApiError::new(StatusCode::REQUEST_TIMEOUT, err.to_string()),
        IngestError::Store { .. } => ApiError::internal("storing the upload", &err),
        IngestError::Refused(_) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, err.to_string()),
        IngestError::Conflict(_) => ApiError::conflict(err.to_string()),
    }
}
