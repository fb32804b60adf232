//! The build stream's single-stream use cases: start a build, and the three expiries the
//! reconcilers run.
//!
//! Rules and events: `domain/build/decide.rs` (`StartBuild` → `BuildFrozen`, `ExpireWaiting`,
//! `ExpireAttempt` → `AttemptExpired`, `ExpireIntent` → `IntentExpired`); read model: `builds`
//! (inline, `projections/builds.rs`), whose queries find the builds these act on.

use chrono::{DateTime, Utc};

use std::collections::BTreeMap;

use super::{CommandContext, Error, Executed};
use crate::domain::build::{self, Binding, Command};
use crate::domain::build_spec::{Step, TemplateBuildStartV2};
use crate::domain::ids::{BuildId, FilesHash, IntentId};
use crate::domain::{object, reachability};
use crate::events::command::{execute, execute_from, execute_writes, load, Loaded};
use crate::events::{AppendOutcome, CommandError, EventStore, StreamWrite};
use crate::streams::{build_stream, files_stream, object_stream, Build, Files, Object};

/// Decide-and-append rounds before a contended start gives up.
const MAX_ROUNDS: u32 = 16;

/// Freezes the build's bindings and queues it for a node until `queue_deadline`, in one append
/// with the files streams it read: a COPY hash the build never linked is bound to the scope's
/// latest present generation (its bytes referenced on their object stream in the same append,
/// as a link does), so two builds of one template started at once both freeze with the
/// context one of them uploaded. Whether those bytes are intact is not read here: a build that
/// finds them torn fails at its COPY and retires the generation.
///
/// The command id is the start's own ([`start_command_id`]), whatever id `ctx` carries: a
/// client that sends the same start again after a lost reply sends a new request, and it must
/// be the same command, so that its retry decides nothing new and its events keep the ids of
/// the first (ADR 0009) instead of the caller taking the lost reply for a refusal.
pub async fn start_build(
    store: &EventStore,
    ctx: &CommandContext,
    build: &BuildId,
    spec: TemplateBuildStartV2,
    now: DateTime<Utc>,
    queue_deadline: DateTime<Utc>,
) -> Result<AppendOutcome, Error<build::Error>> {
    start_build_keyed(
        store,
        ctx,
        build,
        spec,
        None,
        Resolved::default(),
        now,
        queue_deadline,
    )
    .await
}

/// What a start resolved from the settings, recorded with its freeze (`None`: records none,
/// and the build runs the default).
#[derive(Clone, Debug, Default)]
pub struct Resolved {
    pub cache_mode: Option<crate::domain::cache_mode::ResolvedMode>,
    pub sandbox_backend: Option<crate::domain::backend_name::ResolvedBackend>,
}

/// [`start_build`] with the request's registry credentials entering its digest as
/// `credentials_fingerprint`, a keyed digest of them (what the API records), instead of their
/// plain digest.
#[allow(clippy::too_many_arguments)]
pub async fn start_build_keyed(
    store: &EventStore,
    ctx: &CommandContext,
    build: &BuildId,
    spec: TemplateBuildStartV2,
    credentials_fingerprint: Option<crate::domain::ids::Digest>,
    resolved: Resolved,
    now: DateTime<Utc>,
    queue_deadline: DateTime<Utc>,
) -> Result<AppendOutcome, Error<build::Error>> {
    let ctx = CommandContext {
        command_id: start_command_id(
            build,
            &spec.request_digest_with(credentials_fingerprint.as_ref()),
        ),
        ..ctx.clone()
    };
    let (ctx, spec, resolved) = (&ctx, &spec, &resolved);
    let bstream = build_stream(build);
    let bstream = &bstream;
    execute_writes(store, MAX_ROUNDS, move || async move {
        let b = load::<Build>(store, bstream).await?;
        let mut writes = Vec::new();
        let mut present = BTreeMap::new();
        if let (None, Some(scope)) = (&b.state.freeze, b.state.scope()) {
            for hash in copied_hashes(spec) {
                if b.state.bindings.contains_key(hash) || present.contains_key(hash) {
                    continue;
                }
                let fstream = files_stream(&scope, hash);
                let f = load::<Files>(store, &fstream)
                    .await
                    .map_err(CommandError::into_other)?;
                writes.push(StreamWrite::guard(fstream, f.expected()));
                let Some(p) = f.state.present() else { continue };
                let ostream = object_stream(&p.blob_digest);
                let o = load::<Object>(store, &ostream)
                    .await
                    .map_err(CommandError::into_other)?;
                if !reachability::usable(Some(&o.state)) {
                    continue;
                }
                let by = format!("build {build} context {hash}");
                let Ok(events) = object::decide(&o.state, &object::Command::Register { by, now })
                else {
                    continue;
                };
                writes.push(ctx.write(&ostream, o.expected(), &events)?);
                present.insert(
                    hash.clone(),
                    Binding {
                        generation: p.generation,
                        blob_digest: p.blob_digest,
                        size: p.size,
                    },
                );
            }
        }
        let command = Command::StartBuild {
            spec: spec.clone(),
            now,
            queue_deadline,
            attempt: None,
            present,
            credentials_fingerprint,
            cache_mode: resolved.cache_mode.clone(),
            sandbox_backend: resolved.sandbox_backend.clone(),
        };
        let events = build::decide(&b.state, &command).map_err(CommandError::Rejected)?;
        if events.is_empty() {
            // Started already with this request (a retry after a lost reply): nothing else to
            // write either.
            return Ok(vec![StreamWrite::guard(bstream.clone(), b.expected())]);
        }
        writes.insert(0, ctx.write(bstream, b.expected(), &events)?);
        Ok(writes)
    })
    .await
}

/// The context hashes the steps of `spec` copy, each once.
fn copied_hashes(spec: &TemplateBuildStartV2) -> Vec<&FilesHash> {
    let mut hashes: Vec<&FilesHash> = spec
        .steps
        .iter()
        .filter_map(|step| match step {
            Step::Copy { files_hash, .. } => Some(files_hash),
            _ => None,
        })
        .collect();
    hashes.sort();
    hashes.dedup();
    hashes
}

/// The id of the start of `build` with this request (its request digest): the same request
/// to start the same build is the same command.
pub fn start_command_id(
    build: &BuildId,
    request_digest: &crate::domain::ids::Digest,
) -> uuid::Uuid {
    use sha2::Digest as _;
    let mut hasher = sha2::Sha256::new();
    hasher.update(b"strata.start-build-command-id.v1\0");
    hasher.update(build.as_uuid().as_bytes());
    hasher.update(request_digest.hex().as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&hasher.finalize()[..16]);
    uuid::Builder::from_custom_bytes(bytes).into_uuid()
}

/// Ends a build still Waiting or Queued past its deadline.
pub async fn expire_waiting(
    store: &EventStore,
    ctx: &CommandContext,
    build: &BuildId,
    now: DateTime<Utc>,
) -> Result<Executed<build::State>, Error<build::Error>> {
    run(store, ctx, build, &Command::ExpireWaiting { now }).await
}

/// Closes an Active attempt whose lease passed.
pub async fn expire_attempt(
    store: &EventStore,
    ctx: &CommandContext,
    build: &BuildId,
    now: DateTime<Utc>,
) -> Result<Executed<build::State>, Error<build::Error>> {
    run(store, ctx, build, &Command::ExpireAttempt { now }).await
}

/// Expires an upload intent still pending past its expiry.
pub async fn expire_intent(
    store: &EventStore,
    ctx: &CommandContext,
    build: &BuildId,
    intent: IntentId,
    now: DateTime<Utc>,
) -> Result<Executed<build::State>, Error<build::Error>> {
    run(store, ctx, build, &Command::ExpireIntent { intent, now }).await
}

/// Runs `command` on the build's stream.
pub(crate) async fn run(
    store: &EventStore,
    ctx: &CommandContext,
    build: &BuildId,
    command: &Command,
) -> Result<Executed<build::State>, Error<build::Error>> {
    execute::<Build>(store, &build_stream(build), command, ctx).await
}

/// Runs `command` on the build's stream, from the state the caller carried forward when it has
/// one ([`execute_from`]).
pub(crate) async fn run_from(
    store: &EventStore,
    ctx: &CommandContext,
    build: &BuildId,
    carried: Option<Loaded<build::State>>,
    command: &Command,
) -> Result<Executed<build::State>, Error<build::Error>> {
    match carried {
        Some(carried) => {
            execute_from::<Build>(store, &build_stream(build), carried, command, ctx).await
        }
        None => run(store, ctx, build, command).await,
    }
}
