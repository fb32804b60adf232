//! Publishing a step-cache entry: one append to the `cachekey-…` stream, guarded by the build
//! that made the entry (its attempt still open, or the build Ready in its epoch); and retiring
//! an entry whose bytes vanished (the GC pass's cache repair).
//!
//! Rules and events: `domain/cache_entry.rs` (`Publish`, `Replace` by compare-and-set on the
//! pointer generation); the guard's rule: `check_open_attempt` / `check_ready` in
//! `domain/build`; read model: none (lookups read the key's stream).

use super::{CommandContext, Error, Refusal};
use crate::domain::build;
use crate::domain::cache_entry::{self, Entry};
use crate::domain::cache_key::CacheKey;
use crate::domain::ids::{BuildId, Epoch, Scope};
use crate::events::command::{execute_writes, load};
use crate::events::{AppendOutcome, CommandError, EventStore, StreamWrite};
use crate::streams::{build_stream, cache_key_stream, database_now, Build, CacheEntry};

/// Decide-and-append rounds before a contended entry gives up.
const MAX_ROUNDS: u32 = 32;

/// What the build must still be for its entry to be published.
#[derive(Clone, Copy, Debug)]
pub enum Guard {
    /// The attempt must still hold the build.
    Open,
    /// The build must be Ready in this epoch.
    Ready,
}

/// One entry to publish under `key` in `scope`, made by attempt `epoch` of `build`.
#[derive(Clone, Debug)]
pub struct PublishEntry {
    pub build: BuildId,
    pub epoch: Epoch,
    pub scope: Scope,
    pub key: CacheKey,
    pub entry: Entry,
    /// The step was forced: a live entry under the key is replaced.
    pub forced: bool,
    /// This build found the live entry of this generation invalid: it is replaced.
    pub repair: Option<u64>,
    pub guard: Guard,
}

/// Creates the entry (or, when forced or repairing, replaces it by compare-and-set), in one
/// append guarded by the build. Nothing is written when the key already holds this entry (the
/// append is then only guards), so a retry after a lost reply succeeds.
pub async fn publish_entry(
    store: &EventStore,
    ctx: &CommandContext,
    publish: &PublishEntry,
) -> Result<AppendOutcome, Error<Refusal>> {
    let bstream = build_stream(&publish.build);
    let bstream = &bstream;
    execute_writes(store, MAX_ROUNDS, move || async move {
        let now = database_now(store.pool()).await?;
        let b = load::<Build>(store, bstream)
            .await
            .map_err(CommandError::into_other)?;
        match publish.guard {
            Guard::Open => build::check_open_attempt(&b.state, publish.epoch, now),
            Guard::Ready => build::check_ready(&b.state, publish.epoch),
        }
        .map_err(|e| CommandError::Rejected(e.into()))?;
        Ok(vec![
            StreamWrite::new(bstream.clone(), b.expected(), Vec::new()),
            entry_write(store, ctx, publish, now).await?,
        ])
    })
    .await
}

/// The write that creates `publish`'s entry under its key (or replaces the live one by
/// compare-and-set when forced or repairing), read and decided now; only a guard when the key
/// already holds this entry. The caller guards the build in the same append.
pub(crate) async fn entry_write(
    store: &EventStore,
    ctx: &CommandContext,
    publish: &PublishEntry,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<StreamWrite, CommandError<Refusal>> {
    let stream = cache_key_stream(&publish.scope, &publish.key);
    let c = load::<CacheEntry>(store, &stream)
        .await
        .map_err(CommandError::into_other)?;
    let entry = publish.entry.clone();
    let command = match c.state.live() {
        // Already there (an earlier try whose reply was lost, or a repeat): nothing to
        // append, and the write is a guard, which is still a valid append.
        Some((existing, _)) if *existing == entry => None,
        Some((_, generation)) if publish.forced || publish.repair == Some(generation) => {
            Some(cache_entry::Command::Replace {
                entry,
                expected_generation: generation,
                now,
            })
        }
        _ => Some(cache_entry::Command::Publish { entry, now }),
    };
    let events = match command {
        Some(command) => {
            cache_entry::decide(&c.state, &command).map_err(|e| CommandError::Rejected(e.into()))?
        }
        None => Vec::new(),
    };
    Ok(ctx.write(&stream, c.expected(), &events)?)
}

/// Retires the entry under `key` if it is still at `generation`: its target's bytes are gone
/// (cache repair), so lookups miss and the next build publishes a fresh entry.
pub async fn retire_entry(
    store: &EventStore,
    ctx: &CommandContext,
    scope: &Scope,
    key: &CacheKey,
    generation: u64,
    reason: &str,
) -> Result<AppendOutcome, Error<cache_entry::Error>> {
    let stream = cache_key_stream(scope, key);
    let stream = &stream;
    execute_writes(store, MAX_ROUNDS, move || async move {
        let now = database_now(store.pool()).await?;
        let c = load::<CacheEntry>(store, stream).await?;
        let events = cache_entry::decide(
            &c.state,
            &cache_entry::Command::Retire {
                expected_generation: generation,
                reason: reason.to_owned(),
                now,
            },
        )
        .map_err(CommandError::Rejected)?;
        Ok(vec![ctx.write(stream, c.expected(), &events)?])
    })
    .await
}
