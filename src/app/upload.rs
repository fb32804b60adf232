//! The upload link and the upload completion: the two writes that span a build and the
//! `files-{scope}:{hash}` stream of one archive name, each one compare-and-set over both.
//!
//! Rule: [`reserve_upload`] / [`claim_upload`] / [`complete_upload`] in
//! `domain/build/upload.rs`; events: `UploadReserved`, `UploadClaimed`, `UploadClaimReleased`,
//! `UploadCompleted` and `ContextBound` on the build, the generation's events
//! on the files stream (`domain/files.rs`); read model: none (the build stream is the
//! authority; the link finds its build with [`crate::projections::builds::waiting_build`]).

use super::Refusal;
use crate::domain::build::upload::{
    claim_upload as decide_claim, complete_upload as decide_completion, release_claim,
    reserve_upload, Claim, ClaimUpload, CompleteUpload, Decision, LinkResponse, ReserveUpload,
    UploadError,
};
use std::sync::Arc;

use crate::domain::files::PublishedGeneration;
use crate::domain::ids::{BuildId, Digest, FilesHash, Generation, Scope};
use crate::domain::{build, files, reachability};
use crate::events::command::{execute_writes_admitted, load, CommandContext};
use crate::events::{CommandError, EventStore};
use crate::streams::{
    build_stream, database_now, files_stream, object_stream, Build, Files, Object,
};
use crate::vmm::BlobStore;

/// Decide-and-append rounds before a contended upload write gives up.
const MAX_ROUNDS: u32 = 16;

/// Reserves an upload intent for `command.hash` on its build: what the link response says. The
/// name is present only if the bytes of its latest generation are intact in `blobs` (read and
/// checked against their digest, once per stored file per process): a torn or missing archive
/// is absent, so the SDK uploads it again instead of every build failing on it.
pub async fn link_upload(
    store: &EventStore,
    ctx: &CommandContext,
    blobs: &Arc<dyn BlobStore>,
    command: &ReserveUpload,
) -> Result<LinkResponse, CommandError<UploadError>> {
    decide_build_and_files(
        store,
        ctx,
        &command.build,
        &command.hash,
        Some(blobs),
        |build, files, present_stored| reserve_upload(build, files, present_stored, command),
    )
    .await
}

/// Retires `generation` of `hash` in `scope`: a build found its bytes (`blob_digest`) torn or
/// missing, so the name is no longer present and the next link asks for an upload.
pub async fn retire_generation(
    store: &EventStore,
    ctx: &CommandContext,
    scope: &Scope,
    hash: &FilesHash,
    generation: Generation,
    blob_digest: Digest,
    reason: &str,
) -> Result<(), CommandError<files::Error>> {
    let command = files::Command::RetireGeneration {
        generation,
        blob_digest,
        reason: reason.to_owned(),
    };
    crate::events::command::execute::<Files>(store, &files_stream(scope, hash), &command, ctx)
        .await
        .map(drop)
}

/// Whether `blobs` holds the bytes of `published` intact. A store that cannot answer is not a
/// verdict on the bytes; the name is then not called present (the SDK uploads again, which
/// costs an upload, never a failed build).
async fn intact(blobs: &Arc<dyn BlobStore>, published: &PublishedGeneration) -> bool {
    let (blobs, digest) = (blobs.clone(), published.blob_digest);
    match tokio::task::spawn_blocking(move || blobs.intact_size(&digest)).await {
        Ok(Ok(Some(size))) => size == published.size,
        Ok(Ok(None)) => false,
        Ok(Err(e)) => {
            tracing::warn!(%digest, error = %e, "the blob store could not check an uploaded archive; answering not present");
            false
        }
        Err(e) => {
            tracing::warn!(%digest, error = %e, "the archive check task failed; answering not present");
            false
        }
    }
}

/// Claims `command.intent` for an upload about to read its body (or says it completed, and
/// with which bytes): another PUT to the same URL is refused until this one ends.
pub async fn claim_upload(
    store: &EventStore,
    ctx: &CommandContext,
    build: &BuildId,
    command: &ClaimUpload,
) -> Result<Claim, CommandError<UploadError>> {
    decide_build_and_files(store, ctx, build, &command.hash, None, |build, _, _| {
        decide_claim(build, command)
    })
    .await
}

/// Releases an upload's claim after it failed before completing, so the URL can be used again.
pub async fn release_upload_claim(
    store: &EventStore,
    ctx: &CommandContext,
    build: &BuildId,
    hash: &FilesHash,
    intent: crate::domain::ids::IntentId,
    claim: uuid::Uuid,
    reason: &str,
) -> Result<(), CommandError<UploadError>> {
    decide_build_and_files(store, ctx, build, hash, None, |build, _, _| {
        Ok((release_claim(build, intent, claim, reason), ()))
    })
    .await
}

/// Completes an intent with the stored blob and binds its generation.
pub async fn complete_upload(
    store: &EventStore,
    ctx: &CommandContext,
    command: &CompleteUpload,
) -> Result<(), CommandError<UploadError>> {
    decide_build_and_files(
        store,
        ctx,
        &command.build,
        &command.hash,
        None,
        |build, files, _| decide_completion(build, files, command).map(|decision| (decision, ())),
    )
    .await
}

/// Loads a build and the files stream of `hash` in its scope (with the `object-…` stream of its
/// latest generation's bytes), runs `decide` over them, and appends the decision's events to
/// both streams at the versions read, in one transaction (deciding again on a version
/// conflict). The bytes a decision binds or completes are referenced on their object stream in
/// the same append, so a garbage-collection pass can no longer take them (docs/adr/0019).
/// With `blobs`, the latest generation counts as stored only if its bytes are intact there;
/// without (a completion, which does not ask), `decide` is told it is not.
async fn decide_build_and_files<T>(
    store: &EventStore,
    ctx: &CommandContext,
    build_id: &BuildId,
    hash: &FilesHash,
    blobs: Option<&Arc<dyn BlobStore>>,
    decide: impl Fn(&build::State, &files::State, bool) -> Result<(Decision, T), UploadError>,
) -> Result<T, CommandError<UploadError>> {
    let decide = &decide;
    let admission = ctx.admission.as_ref();
    let (_, value) = execute_writes_admitted(store, MAX_ROUNDS, admission, move || async move {
        let b_stream = build_stream(build_id);
        let build = load::<Build>(store, &b_stream)
            .await
            .map_err(CommandError::into_other)?;
        let scope = build
            .state
            .scope()
            .ok_or(CommandError::Rejected(UploadError::NotRegistered))?;
        let f_stream = files_stream(&scope, hash);
        let files = load::<Files>(store, &f_stream)
            .await
            .map_err(CommandError::into_other)?;
        let present_stored = match (files.state.present(), blobs) {
            (Some(p), Some(blobs)) => {
                let object = load::<Object>(store, &object_stream(&p.blob_digest))
                    .await
                    .map_err(CommandError::into_other)?;
                reachability::usable(Some(&object.state)) && intact(blobs, &p).await
            }
            _ => false,
        };
        let (decision, value) =
            decide(&build.state, &files.state, present_stored).map_err(CommandError::Rejected)?;
        let mut writes = vec![
            ctx.write(&b_stream, build.expected(), &decision.build)?,
            ctx.write(&f_stream, files.expected(), &decision.files)?,
        ];
        let used: Vec<_> = decision
            .build
            .iter()
            .filter_map(|e| match e {
                build::Event::ContextBound { binding, .. } => Some(binding.blob_digest),
                build::Event::UploadCompleted { blob_digest, .. } => Some(*blob_digest),
                _ => None,
            })
            .collect();
        let now = database_now(store.pool()).await?;
        let by = format!("build {build_id} context {hash}");
        let objects = super::object::reference_writes(store, ctx, &used, &by, now, &[])
            .await
            .map_err(|e| match e {
                CommandError::Rejected(Refusal::ObjectBarrier { digest, .. }) => {
                    CommandError::Rejected(UploadError::ContentDeleting { digest })
                }
                other => other.into_other(),
            })?;
        writes.extend(objects);
        Ok((writes, value))
    })
    .await?;
    Ok(value)
}
