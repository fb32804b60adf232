//! The `api_keys` read model: key hash -> team, maintained inline with every append to a
//! `team-…` stream, so a key authenticates from the moment it is issued and never after it is
//! revoked.

use async_trait::async_trait;
use sqlx::PgConnection;

use crate::domain::team::Event;
use crate::events::{InlineProjection, RecordedEvent};

const CATEGORY: &str = "team";

pub struct ApiKeysProjection;

#[async_trait]
impl InlineProjection for ApiKeysProjection {
    async fn apply(
        &self,
        conn: &mut PgConnection,
        events: &[RecordedEvent],
    ) -> Result<(), sqlx::Error> {
        for item in super::events_of::<Event>(events, CATEGORY) {
            let (team_id, _, event) = item?;
            match event {
                Event::TeamCreated { .. } => {}
                Event::ApiKeyIssued {
                    key_id,
                    key_sha256,
                    prefix,
                    issued_at,
                } => {
                    sqlx::query(
                        "INSERT INTO api_keys (key_sha256, key_id, team_id, prefix, issued_at) VALUES ($1, $2, $3, $4, $5)",
                    )
                    .bind(key_sha256)
                    .bind(key_id)
                    .bind(team_id)
                    .bind(prefix)
                    .bind(issued_at)
                    .execute(&mut *conn)
                    .await?;
                }
                Event::ApiKeyRevoked { key_id, revoked_at } => {
                    sqlx::query("UPDATE api_keys SET revoked_at = $2 WHERE key_id = $1")
                        .bind(key_id)
                        .bind(revoked_at)
                        .execute(&mut *conn)
                        .await?;
                }
            }
        }
        Ok(())
    }
}

/// The team a live (unrevoked) key with this sha256 belongs to, as stored.
pub async fn team_of_key(
    pool: &sqlx::PgPool,
    key_sha256: &str,
) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT team_id FROM api_keys WHERE key_sha256 = $1 AND revoked_at IS NULL")
        .bind(key_sha256)
        .fetch_optional(pool)
        .await
}

/// One of a team's keys as listed: id, display prefix, issued, revoked.
pub type KeyRow = (
    uuid::Uuid,
    String,
    chrono::DateTime<chrono::Utc>,
    Option<chrono::DateTime<chrono::Utc>>,
);

/// Every key `team` was issued, oldest first, revoked ones included.
pub async fn keys_of(pool: &sqlx::PgPool, team: &str) -> Result<Vec<KeyRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT key_id, prefix, issued_at, revoked_at FROM api_keys WHERE team_id = $1 ORDER BY issued_at",
    )
    .bind(team)
    .fetch_all(pool)
    .await
}
