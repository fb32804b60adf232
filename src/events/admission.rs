//! Admission checks: a caller's condition on the read models, decided inside the append's own
//! SERIALIZABLE transaction, after the standing projections have applied its events.
//!
//! A limit such as "at most N queued builds per team" spans many streams, so no stream's
//! compare-and-set can hold it, and a check made before the append lets every one of a burst of
//! concurrent requests through. Run inside the transaction, the check counts the read model
//! with this append's own rows in it; two appends whose counts see each other's rows cannot
//! both commit (SERIALIZABLE aborts one, and the retry counts again), so the limit holds
//! exactly whatever the concurrency, without a lock and without a stream that every admission
//! of a team would contend on.

use std::sync::Arc;

use super::InlineProjection;

/// What an admission check answers when the append would break its limit: the append stores
/// nothing and fails with [`super::AppendError::Refused`] carrying this.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AdmissionRefused(pub String);

impl AdmissionRefused {
    /// As the error an [`InlineProjection`] returns. sqlx's boxed `Configuration` variant is
    /// the carrier because no statement of ours raises it; [`Self::found_in`] takes it back out.
    pub fn into_sqlx(self) -> sqlx::Error {
        sqlx::Error::Configuration(Box::new(self))
    }

    /// The refusal `err` carries, if it is one.
    pub fn found_in(err: &sqlx::Error) -> Option<&AdmissionRefused> {
        match err {
            sqlx::Error::Configuration(inner) => inner.downcast_ref::<AdmissionRefused>(),
            _ => None,
        }
    }
}

/// A check a command carries ([`super::CommandContext::with_admission`]): every append the
/// command makes runs it in its transaction, after the standing projections.
#[derive(Clone)]
pub struct AdmissionCheck(pub Arc<dyn InlineProjection>);

impl AdmissionCheck {
    pub fn new(check: impl InlineProjection + 'static) -> Self {
        Self(Arc::new(check))
    }
}

impl std::fmt::Debug for AdmissionCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdmissionCheck")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_survives_the_trip_through_sqlx() {
        let err = AdmissionRefused("team t has 3 queued builds".into()).into_sqlx();
        assert_eq!(
            AdmissionRefused::found_in(&err).map(|r| r.0.as_str()),
            Some("team t has 3 queued builds")
        );
        assert!(AdmissionRefused::found_in(&sqlx::Error::RowNotFound).is_none());
    }
}
