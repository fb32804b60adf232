//! The build stream's single-stream use cases: start a build, and the three expiries the
//! reconcilers run.
//!
//! Rules and events: `domain/build/decide.rs` (`StartBuild` → `BuildFrozen`, `ExpireWaiting`,
//! `ExpireAttempt` → `AttemptExpired`, `ExpireIntent` → `IntentExpired`); read model: `builds`
//! (inline, `projections/builds.rs`), whose queries find the builds these act on.

use chrono::{DateTime, Utc};

use super::{CommandContext, Error, Executed};
use crate::domain::build::{self, Command};
use crate::domain::build_spec::TemplateBuildStartV2;
use crate::domain::ids::{BuildId, IntentId};
use crate::events::command::{execute, execute_from, Loaded};
use crate::events::EventStore;
use crate::streams::{build_stream, Build};

/// Freezes the build's bindings and queues it for a node until `queue_deadline`.
///
/// The command id is the start's own ([`start_command_id`]), whatever id `ctx` carries: a
/// client that sends the same start again after a lost reply sends a new request, and it must
/// be the same command, so that the store recognises the retry as a replay of the first
/// (ADR 0009) instead of the caller taking the lost reply for a refusal.
pub async fn start_build(
    store: &EventStore,
    ctx: &CommandContext,
    build: &BuildId,
    spec: TemplateBuildStartV2,
    now: DateTime<Utc>,
    queue_deadline: DateTime<Utc>,
) -> Result<Executed<build::State>, Error<build::Error>> {
    let ctx = CommandContext {
        command_id: start_command_id(build, &spec),
        ..ctx.clone()
    };
    let ctx = &ctx;
    let command = Command::StartBuild {
        spec,
        now,
        queue_deadline,
        attempt: None,
    };
    run(store, ctx, build, &command).await
}

/// The id of the start of `build` with this request (its request digest): the same request
/// to start the same build is the same command.
pub fn start_command_id(build: &BuildId, spec: &TemplateBuildStartV2) -> uuid::Uuid {
    use sha2::Digest as _;
    let mut hasher = sha2::Sha256::new();
    hasher.update(b"strata.start-build-command-id.v1\0");
    hasher.update(build.as_uuid().as_bytes());
    hasher.update(spec.request_digest().hex().as_bytes());
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
