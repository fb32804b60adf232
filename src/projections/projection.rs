//! The contract of an async projection: a read model fed from the global feed.

use async_trait::async_trait;
use sqlx::PgConnection;
use thiserror::Error;

use crate::events::{DecodeError, ReadError, RecordedEvent};

#[derive(Debug, Error)]
pub enum ProjectionError {
    #[error("database error in projection: {0}")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    Decode(#[from] DecodeError),
    #[error("unknown projection {0:?}; `strata projections list` shows the known ones")]
    Unknown(String),
}

/// A read model built from the global feed. The runner calls [`Projection::apply_batch`] and
/// moves the checkpoint in one transaction, so an event is applied exactly once per read model
/// even across crashes; `apply` itself need not be idempotent.
#[async_trait]
pub trait Projection: Send + Sync {
    /// Stable name: the checkpoint row's key and the CLI's argument.
    fn name(&self) -> &str;

    /// Applies one event, inside the runner's transaction.
    async fn apply(
        &self,
        conn: &mut PgConnection,
        event: &RecordedEvent,
    ) -> Result<(), ProjectionError>;

    /// Applies events in feed order. Override to apply a batch with fewer statements.
    async fn apply_batch(
        &self,
        conn: &mut PgConnection,
        events: &[RecordedEvent],
    ) -> Result<(), ProjectionError> {
        for event in events {
            self.apply(conn, event).await?;
        }
        Ok(())
    }

    /// Empties the read model, for a rebuild from the start of the feed.
    async fn reset(&self, conn: &mut PgConnection) -> Result<(), ProjectionError>;
}
