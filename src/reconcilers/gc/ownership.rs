//! One store, one database: a blob store records the identity of the database that owns it
//! (its owner marker), and a pass connected to any other database refuses before it lists or
//! marks anything. Without it, a second database pointed at the same store (a benchmark's
//! throwaway Postgres, a re-created database, a staging deploy sharing a bucket) would find
//! every object the owner references unreachable and delete it (docs/adr/0019).

use super::super::{ReconcileEnv, ReconcileError};

/// Whether a check may record this database as the owner of an unclaimed store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// A pass (dry run included): an unclaimed store becomes this database's.
    Adopt,
    /// A read (`strata storage`): an unclaimed store stays unclaimed.
    ReadOnly,
}

/// Succeeds when the store is this database's (or unclaimed, and `claim` adopts it); refuses
/// with [`ReconcileError::NotOwner`] when another database owns it.
pub async fn ensure(env: &ReconcileEnv, claim: Claim) -> Result<(), ReconcileError> {
    let this = crate::db::store_identity(env.store.pool())
        .await?
        .to_string();
    let blobs = env.blobs.clone();
    let mine = this.clone();
    let owner = tokio::task::spawn_blocking(move || match claim {
        Claim::Adopt => blobs.claim_owner(&mine).map(Some),
        Claim::ReadOnly => blobs.owner(),
    })
    .await
    .map_err(|e| ReconcileError::Store(format!("owner marker task: {e}")))??;
    match owner {
        Some(owner) if owner != this => Err(ReconcileError::NotOwner {
            store: env.blobs.describe(),
            marker: env.blobs.owner_marker(),
            owner,
            this,
        }),
        _ => Ok(()),
    }
}
