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
    #[error("invalid schedule {expression:?}: {message}; use six fields, seconds first (\"*/2 * * * * *\")")]
    Schedule { expression: String, message: String },
}

impl ReconcileError {
    pub fn store<E: std::fmt::Display>(err: CommandError<E>) -> ReconcileError {
        ReconcileError::Store(err.to_string())
    }
}
