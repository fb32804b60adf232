//! Errors of a reconciler pass. A pass that fails is retried at the next tick; a lost race is not
//! an error (it is [`Pass::skipped`](super::Pass)).

use crate::app::publish::PromoteError;
use crate::events::{CommandError, ReadError};

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("database: {0}; the pass is retried at the next tick")]
    Database(#[from] sqlx::Error),
    #[error("reading a stream: {0}")]
    Read(#[from] ReadError),
    #[error("event store: {0}")]
    Store(String),
    #[error("blob store: {0}; the pass deletes nothing more and is retried at the next tick")]
    Blobs(#[from] crate::vmm::VmmError),
    #[error("promotion: {0}")]
    Promotion(#[from] PromoteError),
    #[error("blob store {store} belongs to database {owner}, and this is database {this}: a GC pass here would delete what that database references, so the pass deleted nothing. Point strata at the owning database (DATABASE_URL) or give this one a store of its own (STRATA_DATA_DIR, STRATA_BLOB_URL); if that database is gone for good, remove {marker} and the next pass adopts the store")]
    NotOwner {
        store: String,
        marker: String,
        owner: String,
        this: String,
    },
    #[error("invalid schedule {expression:?}: {message}; use six fields, seconds first (\"*/2 * * * * *\")")]
    Schedule { expression: String, message: String },
}

impl ReconcileError {
    pub fn store<E: std::fmt::Display>(err: CommandError<E>) -> ReconcileError {
        ReconcileError::Store(err.to_string())
    }
}
