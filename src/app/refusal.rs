//! What the domain may refuse in a multi-stream write of the worker or the promotion.
//! Deliberately no string and no store error: a refusal here is an answer from state, never a
//! failure to read it, so a failed clock read or load stays a store error.

use crate::domain::{build, cache_entry, object, promotion, sandbox, snapshot, template};

#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error(transparent)]
    Build(#[from] build::Error),
    #[error(transparent)]
    Snapshot(#[from] snapshot::Error),
    #[error(transparent)]
    Promotion(#[from] promotion::Error),
    #[error(transparent)]
    Template(#[from] template::Error),
    #[error(transparent)]
    CacheEntry(#[from] cache_entry::Error),
    #[error(transparent)]
    Object(#[from] object::Error),
    #[error(transparent)]
    Sandbox(#[from] sandbox::Error),
    #[error(transparent)]
    GcPass(#[from] crate::domain::gc_pass::Error),
    /// A stored object the write references is being (or was) deleted: the writer waits for
    /// the deletion to finish and stores the bytes again ([`crate::app::object`]).
    #[error("object {digest}: {error}")]
    ObjectBarrier {
        digest: crate::domain::ids::Digest,
        error: object::Error,
    },
}
