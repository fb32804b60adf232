//! Errors of the build node.
//!
//! Policy: [`WorkerError`] is what went wrong *around* a build (the database, the event store, the
//! node's storage); it is logged and the attempt is abandoned, to be expired by the reconciler.
//! What went wrong *in* a build (a failing step, an unknown base image) is a
//! [`StepFailure`](super::executor::StepFailure) and ends the build in `error` with a reason the
//! user sees. [`WorkerError::Fenced`] is the normal way a closed attempt stops its worker.

use crate::domain::ids::{BuildId, Epoch};
use crate::events::{CommandError, ReadError};
use crate::vmm::VmmError;

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("event store: {0}")]
    Store(String),
    #[error(
        "attempt {epoch} of build {build} is closed ({reason}); stopping without further writes"
    )]
    Fenced {
        build: BuildId,
        epoch: Epoch,
        reason: String,
    },
    #[error(transparent)]
    Sandbox(#[from] VmmError),
    #[error("build {build}: {message}")]
    Corrupt { build: BuildId, message: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl WorkerError {
    /// A store failure that is not the domain refusing the command.
    pub fn store<E: std::fmt::Display>(err: CommandError<E>) -> WorkerError {
        WorkerError::Store(err.to_string())
    }

    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> WorkerError {
        let context = context.into();
        move |source| WorkerError::Io { context, source }
    }
}
