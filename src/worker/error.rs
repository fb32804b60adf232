//! Errors of the build node.
//!
//! Policy: [`WorkerError`] is what went wrong *around* a build (the database, the event store, the
//! node's storage); it is logged and the attempt is abandoned, to be expired by the reconciler.
//! What went wrong *in* a build (a failing step, an unknown base image) is a
//! [`StepFailure`](super::executor::StepFailure) and ends the build in `error` with a reason the
//! user sees. [`WorkerError::Fenced`] is the normal way a closed attempt stops its worker.
//!
//! Fencing and outages are kept apart by type: a worker's multi-stream decisions fail with
//! [`CommandError<Refusal>`], whose `Rejected` can only hold a domain refusal, so a failed clock
//! read or load stays a store error ([`WorkerError::is_unavailable`]), is retried within the
//! lease, and never stops an attempt as if it had been fenced.

use crate::domain::build;
use crate::domain::ids::{BuildId, Epoch, TemplateId};
use crate::events::{CommandError, ReadError};
use crate::vmm::VmmError;

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Read(#[from] ReadError),
    /// The event store could not be reached or was overloaded: retryable.
    #[error("event store unavailable: {0}")]
    Unavailable(String),
    #[error("event store: {0}")]
    Store(String),
    #[error(
        "attempt {epoch} of build {build} is closed ({reason}); stopping without further writes"
    )]
    Fenced {
        build: BuildId,
        epoch: Epoch,
        reason: Fence,
    },
    /// The build's template was deleted; the build was ended in `error` saying so (by this
    /// write or an earlier one).
    #[error("template {template} of build {build} was deleted; the build ended in error")]
    TemplateDeleted {
        build: BuildId,
        template: TemplateId,
    },
    /// A layer of the build's result was deleted by a GC pass before it was published; the
    /// build was ended in `error` naming it (by the promotion, this node's or a reconciler's).
    #[error("layer {layer} of build {build} was deleted before the build was published; the build ended in error")]
    LayerDeleted {
        build: BuildId,
        layer: crate::domain::ids::Digest,
    },
    /// A layer this attempt references is being (or was) deleted by a GC pass: the attempt
    /// waits for the deletion and stores the layer again from its local copy.
    #[error("layer {digest} is being deleted by garbage collection ({error})")]
    ObjectDeleting {
        digest: crate::domain::ids::Digest,
        error: crate::domain::object::Error,
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

/// Why an attempt stopped as fenced. Only these two: the build stream refusing this epoch's
/// write, or the node stopping the attempt itself (its lease could not be kept, or shutdown).
#[derive(Debug, thiserror::Error)]
pub enum Fence {
    #[error(transparent)]
    Refused(build::Error),
    #[error(
        "the attempt was stopped on this node: its lease was lost or the node is shutting down"
    )]
    Stopped,
}

pub use crate::app::Refusal;

/// A promotion's failure as the worker's: the same fencing, corruption and store errors.
impl From<crate::app::publish::PromoteError> for WorkerError {
    fn from(err: crate::app::publish::PromoteError) -> Self {
        use crate::app::publish::PromoteError;
        match err {
            PromoteError::Fenced {
                build,
                epoch,
                reason,
            } => WorkerError::Fenced {
                build,
                epoch,
                reason: Fence::Refused(reason),
            },
            PromoteError::Corrupt { build, message } => WorkerError::Corrupt { build, message },
            PromoteError::Database(e) => WorkerError::Database(e),
            PromoteError::Read(e) => WorkerError::Read(e),
            PromoteError::Unavailable(e) => WorkerError::Unavailable(e),
            PromoteError::Store(e) => WorkerError::Store(e),
        }
    }
}

impl WorkerError {
    /// A store failure that is not the domain refusing the command.
    pub fn store<E: std::fmt::Display>(err: CommandError<E>) -> WorkerError {
        match err {
            CommandError::Read(e @ ReadError::Database(_)) => WorkerError::Read(e),
            e if e.is_unavailable() => WorkerError::Unavailable(e.to_string()),
            e => WorkerError::Store(e.to_string()),
        }
    }

    /// A worker write's outcome: the build refusing the epoch is fencing; another stream refusing
    /// is a broken invariant of this build; everything else is the store's.
    pub fn from_command(build: BuildId, epoch: Epoch, err: CommandError<Refusal>) -> WorkerError {
        match err {
            CommandError::Rejected(Refusal::Build(e)) => WorkerError::Fenced {
                build,
                epoch,
                reason: Fence::Refused(e),
            },
            CommandError::Rejected(Refusal::ObjectBarrier { digest, error }) => {
                WorkerError::ObjectDeleting { digest, error }
            }
            CommandError::Rejected(other) => WorkerError::Corrupt {
                build,
                message: format!("attempt {epoch}: {other}"),
            },
            e => WorkerError::store(e),
        }
    }

    /// The database or event store could not be reached (or was overloaded): the same write may
    /// succeed a moment later. Never true of fencing, a refusal or a defect.
    pub fn is_unavailable(&self) -> bool {
        match self {
            WorkerError::Database(e) => !matches!(e, sqlx::Error::RowNotFound),
            WorkerError::Read(ReadError::Database(_)) | WorkerError::Unavailable(_) => true,
            _ => false,
        }
    }

    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> WorkerError {
        let context = context.into();
        move |source| WorkerError::Io { context, source }
    }
}
