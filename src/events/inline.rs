//! Inline projections: statements that run inside the append's own transaction.
//!
//! Use one for a lookup that must read its own writes exactly (a name index, a uniqueness
//! claim): it commits or rolls back with the events. Because an append re-runs after a
//! serialization failure, the hook runs again on every attempt, each time in a fresh
//! transaction, so it must derive everything from the events it is given.

use async_trait::async_trait;
use sqlx::PgConnection;

use super::RecordedEvent;

#[async_trait]
pub trait InlineProjection: Send + Sync {
    /// Applies `events` (this append's events, as they will be recorded) using `conn`, the
    /// append's transaction. An error aborts the append; a serialization failure is retried.
    async fn apply(
        &self,
        conn: &mut PgConnection,
        events: &[RecordedEvent],
    ) -> Result<(), sqlx::Error>;
}

/// No inline projection: what [`EventStore::append`](super::EventStore::append) uses.
pub struct NoInlineProjection;

#[async_trait]
impl InlineProjection for NoInlineProjection {
    async fn apply(&self, _: &mut PgConnection, _: &[RecordedEvent]) -> Result<(), sqlx::Error> {
        Ok(())
    }
}

/// Several inline projections, applied in order.
#[async_trait]
impl InlineProjection for [&dyn InlineProjection] {
    async fn apply(
        &self,
        conn: &mut PgConnection,
        events: &[RecordedEvent],
    ) -> Result<(), sqlx::Error> {
        for projection in self {
            projection.apply(conn, events).await?;
        }
        Ok(())
    }
}
