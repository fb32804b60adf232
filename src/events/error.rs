//! Errors of the event store.
//!
//! Policy: a [`AppendError::VersionConflict`] is the normal outcome of losing a race and names
//! the stream and its actual version, so the caller reloads and decides again (the command
//! helper does this). Serialization failures never reach callers unless the retry budget runs
//! out. Everything else is a defect or an outage and carries the database error.

use thiserror::Error;
use uuid::Uuid;

use super::{ExpectedVersion, StreamId};

#[derive(Debug, Error)]
pub enum AppendError {
    #[error(
        "stream {stream} is at version {actual}, but the append expected {expected}; \
         reload the stream and decide again"
    )]
    VersionConflict {
        stream: StreamId,
        expected: ExpectedVersion,
        actual: u64,
    },
    /// Some of the append's event ids are already stored, but not as this exact append: part of
    /// them only, with another stream, type or payload, in another order, or by more than one
    /// append. An event id names one event forever.
    #[error(
        "event ids of this append are already stored differently \
         (stored with another stream, type or payload, in another order or by another append: \
         {mismatched:?}; not stored: {missing:?}); \
         a retried append must repeat the original events exactly, a new one needs new ids"
    )]
    EventIdsReused {
        mismatched: Vec<Uuid>,
        missing: Vec<Uuid>,
    },
    #[error("invalid append: {0}")]
    Invalid(String),
    #[error(
        "the append hit a serialization failure on each of {attempts} attempts; \
         the database is heavily contended, try again later ({last})"
    )]
    SerializationRetriesExhausted {
        attempts: u32,
        #[source]
        last: sqlx::Error,
    },
    /// The command's admission check ([`super::AdmissionCheck`]) found the append over its
    /// limit: nothing was stored. Not an outage: the same append refuses again until the
    /// usage it counts goes down.
    #[error("{0}")]
    Refused(super::AdmissionRefused),
    #[error("database error while appending: {0}")]
    Database(#[from] sqlx::Error),
}

impl AppendError {
    pub fn is_version_conflict(&self) -> bool {
        matches!(self, Self::VersionConflict { .. })
    }
}

#[derive(Debug, Error)]
pub enum ReadError {
    #[error("database error while reading events: {0}")]
    Database(#[from] sqlx::Error),
    #[error("stored event at position {position} is unreadable: {reason}")]
    Corrupt { position: i64, reason: String },
}

/// SQLSTATE 40001 (serialization_failure) or 40P01 (deadlock_detected): the transaction did not
/// commit and can be run again from the start.
pub fn is_serialization_failure(err: &sqlx::Error) -> bool {
    sqlstate(err).is_some_and(|code| code == "40001" || code == "40P01")
}

pub(crate) fn sqlstate(err: &sqlx::Error) -> Option<String> {
    match err {
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
        _ => None,
    }
}

pub(crate) fn violated_constraint(err: &sqlx::Error) -> Option<&str> {
    match err {
        sqlx::Error::Database(db) if db.code().as_deref() == Some("23505") => db.constraint(),
        _ => None,
    }
}
