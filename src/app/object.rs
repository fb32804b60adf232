//! The Deleting barrier's writes on `object-{digest}` streams: writers and readers reference
//! the objects they use, readers lease them while they boot on them (a lease lapses at its
//! time; nothing releases it early), and a garbage-collection
//! pass marks, confirms or aborts a deletion.
//!
//! Rules and events: `domain/object.rs`; read model: none (the pass reads the streams).
//!
//! A writer references an object before its bytes become reachable, and a reader before it
//! reads them: a pass that marked the object first makes the reference fail with
//! [`object::Error::Deleting`] (the caller waits for `Deleted` with [`wait_while_deleting`],
//! then writes the bytes again); a reference that lands first makes the pass's mark fail
//! (`RecentlyUsed`, within the grace period) or its stream write lose the compare-and-set.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{CommandContext, Error, Refusal};
use crate::domain::cache_entry;
use crate::domain::cache_key::CacheKey;
use crate::domain::ids::{Digest, Scope};
use crate::domain::object::{self, Deletion, Lifecycle};
use crate::events::command::{execute_writes, execute_writes_with, load};
use crate::events::{AppendOutcome, CommandError, EventStore};
use crate::streams::{cache_key_stream, database_now, object_stream, CacheEntry, Object};

/// Decide-and-append rounds before a contended object write gives up.
const MAX_ROUNDS: u32 = 32;

/// Records that `by` uses `digests` (registering each one that is absent or deleted: the caller
/// is about to store its bytes), in one append. Refused with `Deleting` when a pass is deleting
/// one of them.
pub async fn reference(
    store: &EventStore,
    ctx: &CommandContext,
    digests: &[Digest],
    by: &str,
) -> Result<AppendOutcome, Error<object::Error>> {
    execute_writes(store, MAX_ROUNDS, move || async move {
        let now = database_now(store.pool()).await?;
        reference_writes(store, ctx, digests, by, now, digests)
            .await
            .map_err(|e| match e {
                CommandError::Rejected(Refusal::ObjectBarrier { error, .. }) => {
                    CommandError::Rejected(error)
                }
                CommandError::Rejected(other) => {
                    unreachable!("referencing objects refuses only at the barrier: {other}")
                }
                other => other.into_other(),
            })
    })
    .await
}

/// The writes that reference `digests` for `by`, for a caller's multi-stream append: the
/// reference commits with the write that makes the objects reachable, or not at all.
///
/// The caller stored the bytes before this write, so an object a pass deleted since is refused
/// like one being deleted ([`Refusal::ObjectBarrier`]): its bytes are gone. Only digests in
/// `restored`, whose bytes the caller stored again after seeing the deletion, register anew.
pub(super) async fn reference_writes(
    store: &EventStore,
    ctx: &CommandContext,
    digests: &[Digest],
    by: &str,
    now: DateTime<Utc>,
    restored: &[Digest],
) -> Result<Vec<crate::events::StreamWrite>, CommandError<Refusal>> {
    let mut writes = Vec::new();
    for digest in distinct(digests) {
        let stream = object_stream(&digest);
        let loaded = load::<Object>(store, &stream)
            .await
            .map_err(CommandError::into_other)?;
        if loaded.state.lifecycle == Lifecycle::Deleted && !restored.contains(&digest) {
            return Err(CommandError::Rejected(Refusal::ObjectBarrier {
                digest,
                error: object::Error::NotLive {
                    lifecycle: Lifecycle::Deleted,
                },
            }));
        }
        let events = object::decide(
            &loaded.state,
            &object::Command::Register {
                by: by.to_owned(),
                now,
            },
        )
        .map_err(|error| CommandError::Rejected(Refusal::ObjectBarrier { digest, error }))?;
        writes.push(ctx.write(&stream, loaded.expected(), &events)?);
    }
    Ok(writes)
}

/// Leases `digests` to `holder` for `length` from the database's clock, the clock GC passes
/// judge leases by (registering any that was never registered, or
/// that was deleted and is in `restored`: the caller stored its bytes again), in one append.
/// Refused when one is being deleted (`Deleting`) or was deleted (`NotLive`): the reader must
/// not boot on it.
pub async fn lease(
    store: &EventStore,
    ctx: &CommandContext,
    digests: &[Digest],
    holder: &str,
    length: chrono::Duration,
    restored: &[Digest],
) -> Result<AppendOutcome, Error<object::Error>> {
    let digests = distinct(digests);
    let digests = &digests;
    execute_writes(store, MAX_ROUNDS, move || async move {
        let now = database_now(store.pool()).await?;
        let mut writes = Vec::with_capacity(digests.len());
        for digest in digests {
            let stream = object_stream(digest);
            let loaded = load::<Object>(store, &stream).await?;
            let mut state = loaded.state.clone();
            let mut events = Vec::new();
            let again = state.lifecycle == Lifecycle::Deleted && restored.contains(digest);
            if state.lifecycle == Lifecycle::Absent || again {
                let registered = object::decide(
                    &state,
                    &object::Command::Register {
                        by: holder.to_owned(),
                        now,
                    },
                )
                .map_err(CommandError::Rejected)?;
                state = registered.iter().fold(state, object::evolve);
                events.extend(registered);
            }
            let leased = object::decide(
                &state,
                &object::Command::Lease {
                    holder: holder.to_owned(),
                    until: now + length,
                    now,
                },
            )
            .map_err(CommandError::Rejected)?;
            events.extend(leased);
            writes.push(ctx.write(&stream, loaded.expected(), &events)?);
        }
        Ok(writes)
    })
    .await
}

/// Waits while a pass is deleting `digest` (at most `limit`), polling its stream: answers the
/// lifecycle it ends in (`Deleted` once the pass confirmed, `Live` if it aborted). A mark whose
/// pass stopped renewing its lease is released here, by `by` ([`release_if_pass_stopped`]),
/// so a writer waits at most one pass lease for a pass that died, never for a later pass.
pub async fn wait_while_deleting(
    store: &EventStore,
    ctx: &CommandContext,
    digest: &Digest,
    by: &str,
    limit: Duration,
) -> Result<Lifecycle, Error<Refusal>> {
    let stream = object_stream(digest);
    let started = std::time::Instant::now();
    let mut next_release = std::time::Instant::now();
    loop {
        let state = load::<Object>(store, &stream)
            .await
            .map_err(CommandError::into_other)?
            .state;
        if state.lifecycle != Lifecycle::Deleting || started.elapsed() >= limit {
            return Ok(state.lifecycle);
        }
        if std::time::Instant::now() >= next_release {
            next_release = std::time::Instant::now() + Duration::from_secs(1);
            match release_if_pass_stopped(store, ctx, digest, by).await {
                Ok(Release::Released { owner }) => {
                    tracing::warn!(%digest, %owner, by, "released the deletion mark of a pass that stopped renewing its lease");
                    continue;
                }
                Ok(Release::NotMarked) => continue,
                // Still leased (or a race): the pass is alive; wait for it.
                Err(CommandError::Rejected(_) | CommandError::Contended { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A cache entry whose target holds the object: retired in the same append as the mark, so no
/// lookup finds an entry pointing at doomed bytes.
#[derive(Clone, Debug)]
pub struct EntryToRetire {
    pub scope: Scope,
    pub key: CacheKey,
    /// The pointer generation the pass saw: a key that moved since is left alone (and the mark
    /// is refused, so the pass decides again next time).
    pub generation: u64,
}

/// One object a pass means to delete.
#[derive(Clone, Debug)]
pub struct Mark {
    pub digest: Digest,
    pub deletion: Deletion,
    /// Nothing may have used the object after this (the pass's clock minus the grace period).
    pub unused_since: DateTime<Utc>,
    pub retire: Vec<EntryToRetire>,
}

/// Marks the object `Deleting` and retires the cache entries that point at it, in one append.
pub async fn mark_deleting(
    store: &EventStore,
    ctx: &CommandContext,
    mark: &Mark,
) -> Result<AppendOutcome, Error<Refusal>> {
    execute_writes(store, MAX_ROUNDS, move || async move {
        let now = database_now(store.pool()).await?;
        let stream = object_stream(&mark.digest);
        let loaded = load::<Object>(store, &stream)
            .await
            .map_err(CommandError::into_other)?;
        let events = object::decide(
            &loaded.state,
            &object::Command::MarkDeleting {
                deletion: mark.deletion.clone(),
                unused_since: mark.unused_since,
                now,
            },
        )
        .map_err(|e| CommandError::Rejected(e.into()))?;
        let mut writes = vec![ctx.write(&stream, loaded.expected(), &events)?];
        for entry in &mark.retire {
            let stream = cache_key_stream(&entry.scope, &entry.key);
            let loaded = load::<CacheEntry>(store, &stream)
                .await
                .map_err(CommandError::into_other)?;
            let events = cache_entry::decide(
                &loaded.state,
                &cache_entry::Command::Retire {
                    expected_generation: entry.generation,
                    reason: format!(
                        "GC pass {} deletes object {} ({})",
                        mark.deletion.pass, mark.digest, mark.deletion.tier
                    ),
                    now,
                },
            )
            .map_err(|e| CommandError::Rejected(e.into()))?;
            writes.push(ctx.write(&stream, loaded.expected(), &events)?);
        }
        Ok(writes)
    })
    .await
}

/// Records that pass `pass` removed the object's bytes.
pub async fn confirm_deleted(
    store: &EventStore,
    ctx: &CommandContext,
    digest: &Digest,
    pass: &str,
) -> Result<AppendOutcome, Error<object::Error>> {
    end_deletion(store, ctx, digest, |now| object::Command::ConfirmDeleted {
        pass: pass.to_owned(),
        now,
    })
    .await
}

/// Returns the object to `Live`: pass `pass` could not finish (fail closed keeps the bytes).
pub async fn abort_deletion(
    store: &EventStore,
    ctx: &CommandContext,
    digest: &Digest,
    pass: &str,
    reason: &str,
) -> Result<AppendOutcome, Error<object::Error>> {
    end_deletion(store, ctx, digest, |now| object::Command::AbortDeletion {
        pass: pass.to_owned(),
        reason: reason.to_owned(),
        now,
    })
    .await
}

async fn end_deletion(
    store: &EventStore,
    ctx: &CommandContext,
    digest: &Digest,
    command: impl Fn(DateTime<Utc>) -> object::Command,
) -> Result<AppendOutcome, Error<object::Error>> {
    let stream = object_stream(digest);
    let (stream, command) = (&stream, &command);
    execute_writes(store, MAX_ROUNDS, move || async move {
        let now = database_now(store.pool()).await?;
        let loaded = load::<Object>(store, stream).await?;
        let events =
            object::decide(&loaded.state, &command(now)).map_err(CommandError::Rejected)?;
        Ok(vec![ctx.write(stream, loaded.expected(), &events)?])
    })
    .await
}

fn distinct(digests: &[Digest]) -> Vec<Digest> {
    let mut out = digests.to_vec();
    out.sort();
    out.dedup();
    out
}

/// What [`release_if_pass_stopped`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// The marking pass had stopped: it is fenced and the object is Live again, bytes kept.
    Released { owner: String },
    /// The object is not being deleted (any more).
    NotMarked,
}

/// A mark of a pass that keeps no lease (a strata from before pass leases) counts as abandoned
/// this long after it was made.
pub const LEGACY_STALE_MARK: chrono::Duration = chrono::Duration::minutes(10);

/// Returns `digest` to Live if the pass that marked it can no longer delete it: its lease
/// expired (or it ended without confirming). The pass is fenced in the same append, so its own
/// renewal fails from then on and it deletes nothing more. Refused (`StillLeased`) while the
/// pass holds its lease: the caller waits, or leaves the mark to the next pass.
pub async fn release_if_pass_stopped(
    store: &EventStore,
    ctx: &CommandContext,
    digest: &Digest,
    by: &str,
) -> Result<Release, Error<Refusal>> {
    use crate::domain::gc_pass;
    use crate::streams::{gc_pass_stream, GcPass};
    let (_, release) = execute_writes_with(store, MAX_ROUNDS, move || async move {
        let now = database_now(store.pool()).await?;
        let stream = object_stream(digest);
        let loaded = load::<Object>(store, &stream)
            .await
            .map_err(CommandError::into_other)?;
        let (Lifecycle::Deleting, Some(deletion)) =
            (loaded.state.lifecycle, &loaded.state.deletion)
        else {
            // A guard on the stream's version: nothing is appended.
            let guard = ctx.write(&stream, loaded.expected(), &[] as &[object::Event])?;
            return Ok((vec![guard], Release::NotMarked));
        };
        let owner = deletion.pass.clone();
        let pass_stream = gc_pass_stream(&owner);
        let pass = load::<GcPass>(store, &pass_stream)
            .await
            .map_err(CommandError::into_other)?;
        let mut writes = Vec::new();
        let command = if pass.state.started {
            let fence = gc_pass::decide(
                &pass.state,
                &gc_pass::Command::Fence {
                    by: by.to_owned(),
                    now,
                },
            )
            .map_err(|e| CommandError::Rejected(e.into()))?;
            writes.push(ctx.write(&pass_stream, pass.expected(), &fence)?);
            object::Command::ReleaseMarkOfStoppedPass {
                owner: owner.clone(),
                by: by.to_owned(),
                now,
            }
        } else {
            object::Command::AbandonStaleMark {
                pass: by.to_owned(),
                marked_before: now - LEGACY_STALE_MARK,
                now,
            }
        };
        let events = object::decide(&loaded.state, &command)
            .map_err(|e| CommandError::Rejected(e.into()))?;
        writes.push(ctx.write(&stream, loaded.expected(), &events)?);
        Ok((writes, Release::Released { owner }))
    })
    .await?;
    Ok(release)
}
