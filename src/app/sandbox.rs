//! Launched sandboxes: request, place, run, deadline, end; each one write to `sandbox-{id}`.
//!
//! Rule and events: `domain/sandbox.rs`; read model: `sandboxes` (inline,
//! `projections/sandboxes.rs`), which the API lists and waits on and the nodes poll.

use chrono::{DateTime, Utc};

use super::{CommandContext, Error, Refusal};
use crate::domain::ids::{Digest, Epoch};
use crate::domain::sandbox::{self, Command, SandboxId, SandboxRequest, State};
use crate::events::command::{execute, execute_writes, load};
use crate::events::{CommandError, EventStore};
use crate::streams::{database_now, sandbox_stream, SandboxStream};

/// Decide-and-append rounds before a contended pause record gives up.
const MAX_ROUNDS: u32 = 16;

pub type Result<T> = std::result::Result<T, Error<sandbox::Error>>;

async fn run(
    store: &EventStore,
    ctx: &CommandContext,
    id: &SandboxId,
    command: Command,
) -> Result<State> {
    Ok(
        execute::<SandboxStream>(store, &sandbox_stream(id), &command, ctx)
            .await?
            .state,
    )
}

/// The sandbox as its stream says now.
pub async fn state(store: &EventStore, id: &SandboxId) -> Result<State> {
    Ok(load::<SandboxStream>(store, &sandbox_stream(id))
        .await?
        .state)
}

/// Records a create call; a node places it from the read model.
pub async fn request(
    store: &EventStore,
    ctx: &CommandContext,
    id: &SandboxId,
    request: SandboxRequest,
    now: DateTime<Utc>,
) -> Result<State> {
    run(
        store,
        ctx,
        id,
        Command::Request {
            request: Box::new(request),
            now,
        },
    )
    .await
}

/// This node takes `id`; answers the epoch its later writes are fenced by, or `None` when
/// another node was first (or the sandbox ended meanwhile).
pub async fn place(
    store: &EventStore,
    ctx: &CommandContext,
    id: &SandboxId,
    node: &str,
    now: DateTime<Utc>,
) -> Result<Option<(Epoch, State)>> {
    let command = Command::Place {
        node: node.to_owned(),
        now,
    };
    match run(store, ctx, id, command).await {
        Ok(state) if state.node.as_deref() == Some(node) => Ok(Some((state.epoch, state))),
        Ok(_) => Ok(None),
        Err(Error::Rejected(sandbox::Error::AlreadyPlaced { .. } | sandbox::Error::Ended(_))) => {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// The node's agent answers for the booted sandbox.
pub async fn running(
    store: &EventStore,
    ctx: &CommandContext,
    id: &SandboxId,
    epoch: Epoch,
    agent_url: &str,
    now: DateTime<Utc>,
) -> Result<State> {
    let command = Command::Run {
        epoch,
        agent_url: agent_url.to_owned(),
        now,
    };
    run(store, ctx, id, command).await
}

pub async fn set_timeout(
    store: &EventStore,
    ctx: &CommandContext,
    id: &SandboxId,
    timeout_secs: u32,
    now: DateTime<Utc>,
) -> Result<State> {
    run(store, ctx, id, Command::SetTimeout { timeout_secs, now }).await
}

/// `connect` on a live sandbox: its deadline grows to at least `now + timeout_secs`.
pub async fn extend(
    store: &EventStore,
    ctx: &CommandContext,
    id: &SandboxId,
    timeout_secs: u32,
    now: DateTime<Utc>,
) -> Result<State> {
    run(store, ctx, id, Command::Extend { timeout_secs, now }).await
}

pub async fn kill(
    store: &EventStore,
    ctx: &CommandContext,
    id: &SandboxId,
    now: DateTime<Utc>,
) -> Result<State> {
    run(store, ctx, id, Command::Kill { now }).await
}

/// Ends the sandbox if its deadline passed at `now` (nothing otherwise).
pub async fn expire(
    store: &EventStore,
    ctx: &CommandContext,
    id: &SandboxId,
    now: DateTime<Utc>,
) -> Result<State> {
    run(store, ctx, id, Command::Expire { now }).await
}

/// The sandbox could not start: its node (`epoch`) failed to boot it, or the create call gave
/// up waiting for a node (`None`).
pub async fn fail(
    store: &EventStore,
    ctx: &CommandContext,
    id: &SandboxId,
    epoch: Option<Epoch>,
    reason: &str,
    now: DateTime<Utc>,
) -> Result<State> {
    let command = Command::Fail {
        epoch,
        reason: reason.to_owned(),
        now,
    };
    run(store, ctx, id, command).await
}

/// The sandbox's node (`epoch`) is gone, and the sandbox with it.
pub async fn lose(
    store: &EventStore,
    ctx: &CommandContext,
    id: &SandboxId,
    epoch: Epoch,
    reason: &str,
    now: DateTime<Utc>,
) -> Result<State> {
    let command = Command::Lose {
        epoch,
        reason: reason.to_owned(),
        now,
    };
    run(store, ctx, id, command).await
}

/// Asks the running sandbox's node to pause it (a no-op while a pause is under way).
pub async fn pause(
    store: &EventStore,
    ctx: &CommandContext,
    id: &SandboxId,
    now: DateTime<Utc>,
) -> Result<State> {
    run(store, ctx, id, Command::Pause { now }).await
}

/// The node (`epoch`) stored the pausing sandbox's filesystem as `layers`; the pause and the
/// layers' references commit in one append, so a garbage-collection pass either sees the
/// sandbox rooting them or its mark refuses this write ([`Refusal::ObjectBarrier`]: the caller
/// waits for the deletion and stores the layer again, naming it in `restored`).
pub async fn record_paused(
    store: &EventStore,
    ctx: &CommandContext,
    id: &SandboxId,
    epoch: Epoch,
    layers: &[Digest],
    restored: &[Digest],
) -> std::result::Result<(), Error<Refusal>> {
    let stream = &sandbox_stream(id);
    match execute_writes(store, MAX_ROUNDS, move || async move {
        let now = database_now(store.pool()).await?;
        let loaded = load::<SandboxStream>(store, stream)
            .await
            .map_err(CommandError::into_other)?;
        let command = Command::RecordPaused {
            epoch,
            layers: layers.to_vec(),
            now,
        };
        let events = sandbox::decide(&loaded.state, &command)
            .map_err(|e| CommandError::Rejected(Refusal::from(e)))?;
        if events.is_empty() {
            // A replay of this pause: it is recorded (answered below as done).
            return Err(CommandError::Rejected(Refusal::Sandbox(
                sandbox::Error::AlreadyPaused,
            )));
        }
        let mut writes = vec![ctx.write(stream, loaded.expected(), &events)?];
        let by = format!("sandbox {id} pause at epoch {epoch}");
        writes
            .extend(super::object::reference_writes(store, ctx, layers, &by, now, restored).await?);
        Ok(writes)
    })
    .await
    {
        Ok(_) | Err(CommandError::Rejected(Refusal::Sandbox(sandbox::Error::AlreadyPaused))) => {
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Boots a paused sandbox again (a node places it as a new request).
pub async fn resume(
    store: &EventStore,
    ctx: &CommandContext,
    id: &SandboxId,
    timeout_secs: u32,
    now: DateTime<Utc>,
) -> Result<State> {
    run(store, ctx, id, Command::Resume { timeout_secs, now }).await
}
