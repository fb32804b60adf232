//! A garbage-collection pass's lease on its `gcpass-{id}` stream: started, renewed while the
//! pass works, ended when it finishes, fenced by whoever releases the marks of a pass that
//! stopped renewing (rules: `domain/gc_pass.rs`).

use super::{CommandContext, Error};
use crate::domain::gc_pass::{self, State};
use crate::events::command::{execute_writes_with, load};
use crate::events::{CommandError, EventStore};
use crate::streams::{database_now, gc_pass_stream, GcPass};

/// Appends `command(now)` to pass `pass`'s stream and returns the state after it, with the
/// database's clock at the append.
async fn run(
    store: &EventStore,
    ctx: &CommandContext,
    pass: &str,
    command: impl Fn(chrono::DateTime<chrono::Utc>) -> gc_pass::Command,
) -> Result<(State, chrono::DateTime<chrono::Utc>), Error<gc_pass::Error>> {
    let stream = gc_pass_stream(pass);
    let (stream, command) = (&stream, &command);
    let (_, decided) = execute_writes_with(store, 8, move || async move {
        let now = database_now(store.pool()).await?;
        let loaded = load::<GcPass>(store, stream).await?;
        let events =
            gc_pass::decide(&loaded.state, &command(now)).map_err(CommandError::Rejected)?;
        let after = events.iter().fold(loaded.state.clone(), gc_pass::evolve);
        Ok((
            vec![ctx.write(stream, loaded.expected(), &events)?],
            (after, now),
        ))
    })
    .await?;
    Ok(decided)
}

/// Starts pass `pass` on `node` with a fresh lease.
pub async fn start(
    store: &EventStore,
    ctx: &CommandContext,
    pass: &str,
    node: &str,
    lease: chrono::Duration,
) -> Result<State, Error<gc_pass::Error>> {
    run(store, ctx, pass, |now| gc_pass::Command::Start {
        node: node.to_owned(),
        lease,
        now,
    })
    .await
    .map(|(s, _)| s)
}

/// Renews pass `pass`'s lease; refused (`Lost`) once it expired or was fenced, after which the
/// pass must delete nothing more. Returns the renewed state and the database's clock.
pub async fn renew(
    store: &EventStore,
    ctx: &CommandContext,
    pass: &str,
    lease: chrono::Duration,
) -> Result<(State, chrono::DateTime<chrono::Utc>), Error<gc_pass::Error>> {
    run(store, ctx, pass, |now| gc_pass::Command::Renew {
        lease,
        now,
    })
    .await
}

/// Ends pass `pass`: its lease no longer holds anything. `measure` is what the pass found and
/// did, for a pass that finished its work.
pub async fn end(
    store: &EventStore,
    ctx: &CommandContext,
    pass: &str,
    measure: Option<gc_pass::Measure>,
) -> Result<(), Error<gc_pass::Error>> {
    run(store, ctx, pass, |now| gc_pass::Command::End {
        measure: measure.clone(),
        now,
    })
    .await
    .map(|_| ())
}
