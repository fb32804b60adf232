//! The upload link and the upload completion: the two writes that span a build and the
//! `files-{scope}:{hash}` stream of one archive name, each one compare-and-set over both.
//!
//! Rule: [`reserve_upload`] / [`complete_upload`] in `domain/build/upload.rs`; events:
//! `UploadReserved`, `UploadCompleted` and `ContextBound` on the build, the generation's events
//! on the files stream (`domain/files.rs`); read model: none (the build stream is the
//! authority; the link finds its build with [`crate::projections::builds::waiting_build`]).

use super::Refusal;
use crate::domain::build::upload::{
    complete_upload as decide_completion, reserve_upload, CompleteUpload, Decision, LinkResponse,
    ReserveUpload, UploadError,
};
use crate::domain::ids::{BuildId, FilesHash};
use crate::domain::{build, files, reachability};
use crate::events::command::{execute_writes_with, load, CommandContext};
use crate::events::{CommandError, EventStore};
use crate::streams::{
    build_stream, database_now, files_stream, object_stream, Build, Files, Object,
};

/// Decide-and-append rounds before a contended upload write gives up.
const MAX_ROUNDS: u32 = 16;

/// Reserves an upload intent for `command.hash` on its build: what the link response says.
pub async fn link_upload(
    store: &EventStore,
    ctx: &CommandContext,
    command: &ReserveUpload,
) -> Result<LinkResponse, CommandError<UploadError>> {
    decide_build_and_files(
        store,
        ctx,
        &command.build,
        &command.hash,
        |build, files, present_stored| reserve_upload(build, files, present_stored, command),
    )
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
        |build, files, _| decide_completion(build, files, command).map(|decision| (decision, ())),
    )
    .await
}

/// Loads a build and the files stream of `hash` in its scope (with the `object-…` stream of its
/// latest generation's bytes), runs `decide` over them, and appends the decision's events to
/// both streams at the versions read, in one transaction (deciding again on a version
/// conflict). The bytes a decision binds or completes are referenced on their object stream in
/// the same append, so a garbage-collection pass can no longer take them (docs/adr/0019).
async fn decide_build_and_files<T>(
    store: &EventStore,
    ctx: &CommandContext,
    build_id: &BuildId,
    hash: &FilesHash,
    decide: impl Fn(&build::State, &files::State, bool) -> Result<(Decision, T), UploadError>,
) -> Result<T, CommandError<UploadError>> {
    let decide = &decide;
    let (_, value) = execute_writes_with(store, MAX_ROUNDS, move || async move {
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
        let present_stored = match files.state.present() {
            Some(p) => {
                let object = load::<Object>(store, &object_stream(&p.blob_digest))
                    .await
                    .map_err(CommandError::into_other)?;
                reachability::usable(Some(&object.state))
            }
            None => false,
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
