//! Reader leases on the layers an attempt boots on or promotes from a cache hit (the Deleting
//! barrier, docs/adr/0019): taken before the layers are read, so a garbage-collection pass
//! that has not marked them yet cannot, and one that has makes the lease fail first.

use std::time::Duration;

use super::attempt::Attempt;
use super::error::WorkerError;
use crate::app;
use crate::domain::ids::Digest;
use crate::domain::object::Error as ObjectError;
use crate::events::CommandError;
use crate::vmm::SandboxBackend;

/// How long a boot lease lasts: long enough to fetch and extract a large base, after which the
/// layers are pinned in the node's cache and referenced by the attempt's first record.
const LEASE: Duration = Duration::from_secs(15 * 60);

/// How long an attempt waits for a pass that is deleting a layer it needs.
const WAIT_FOR_DELETION: Duration = Duration::from_secs(120);

/// The holder name of an attempt's leases, as the object's history shows it.
pub fn holder(attempt: &Attempt) -> String {
    format!("build {} attempt {}", attempt.build, attempt.epoch)
}

/// Leases `layers` for this attempt. `Err(Refused)` when one is being or was deleted: a cache
/// hit is then a miss, a base is stored again with [`recreate`] first. Like the attempt's other
/// writes, an unavailable store (a lost reply among them) is retried within the lease under one
/// command id; a retry finds its own lease already taken and appends nothing.
pub async fn lease(
    attempt: &Attempt,
    layers: &[Digest],
    restored: &[Digest],
) -> Result<Held, WorkerError> {
    let ctx = attempt.context();
    let holder = holder(attempt);
    let length = chrono::Duration::from_std(LEASE).expect("the lease fits");
    attempt
        .retrying("leasing layers", || async {
            match app::object::lease(&attempt.store, &ctx, layers, &holder, length, restored).await
            {
                Ok(_) => Ok(Held::Leased),
                Err(CommandError::Rejected(
                    error @ (ObjectError::Deleting { .. } | ObjectError::NotLive { .. }),
                )) => Ok(Held::Refused(error)),
                Err(e) => Err(WorkerError::store(e)),
            }
        })
        .await
}

/// Whether the lease was taken.
#[derive(Debug)]
pub enum Held {
    Leased,
    Refused(ObjectError),
}

/// Records a snapshot; a layer a GC pass is deleting or deleted meanwhile is waited for and
/// stored again from this node's copy, and the record retried naming it restored (a writer
/// never links to doomed or vanished bytes). `entry`, the step's cache entry, is published
/// in the same append.
pub async fn record_recreating(
    attempt: &Attempt,
    backend: &dyn SandboxBackend,
    id: crate::domain::ids::SnapshotId,
    record: &crate::domain::snapshot::SnapshotRecord,
    step: Option<u32>,
    entry: Option<&crate::app::cache::PublishEntry>,
) -> Result<Option<crate::app::attempt::EntryVerdict>, WorkerError> {
    let mut restored = Vec::new();
    for _ in 0..3 {
        match attempt
            .record_snapshot_restoring(id, record, step, &restored, entry)
            .await
        {
            Err(WorkerError::ObjectDeleting { digest, error }) => {
                tracing::info!(build = %attempt.build, %digest, %error, "a layer of this snapshot was taken by garbage collection; storing it again");
                let (stored, missing) = recreate(attempt, backend, &record.layers).await?;
                if let Some(digest) = missing.first() {
                    return Err(WorkerError::Corrupt {
                        build: attempt.build,
                        message: format!(
                            "layer {digest} was deleted by garbage collection and this node has no copy"
                        ),
                    });
                }
                restored = stored;
            }
            other => return other,
        }
    }
    attempt
        .record_snapshot_restoring(id, record, step, &restored, entry)
        .await
}

/// Waits for passes deleting any of `layers` to finish, then stores again each layer whose
/// blob is gone from this node's extracted copy. Answers the layers stored now (intact in the
/// blob store) and those it could not store.
pub async fn recreate(
    attempt: &Attempt,
    backend: &dyn SandboxBackend,
    layers: &[Digest],
) -> Result<(Vec<Digest>, Vec<Digest>), WorkerError> {
    let by = format!("build {}", attempt.build);
    recreate_for(&attempt.store, &attempt.context(), &by, backend, layers).await
}

/// [`recreate`] for any writer (`by`, as the objects' history names it): a launched sandbox's
/// pause record uses it too.
pub async fn recreate_for(
    store: &crate::events::EventStore,
    ctx: &crate::events::CommandContext,
    by: &str,
    backend: &dyn SandboxBackend,
    layers: &[Digest],
) -> Result<(Vec<Digest>, Vec<Digest>), WorkerError> {
    let mut stored_now = Vec::new();
    let mut missing = Vec::new();
    for digest in layers {
        app::object::wait_while_deleting(store, ctx, digest, by, WAIT_FOR_DELETION)
            .await
            .map_err(WorkerError::store)?;
        // Blocking, on a rare path: sealing one cached tree again (the backend is borrowed).
        let stored = backend.republish(digest)?;
        if stored {
            stored_now.push(*digest);
        } else {
            missing.push(*digest);
        }
    }
    Ok((stored_now, missing))
}
