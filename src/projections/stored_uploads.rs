//! The `stored_uploads` read model: the generations each team's uploads have published and the
//! blob store still holds, kept inline with the `files-…` and `object-…` appends, so a team's
//! stored bytes are one index range (`STRATA_TEAM_MAX_STORED_UPLOADS`, ADR 0032).
//!
//! A generation's row goes when the generation is retired (its bytes were found torn or
//! missing) or when garbage collection records its object `Deleted`; an archive published under
//! several names or generations is counted once ([`team_bytes`]).

use async_trait::async_trait;
use sqlx::PgConnection;

use crate::domain::ids::{self, TeamId};
use crate::domain::{files, object};
use crate::events::{InlineProjection, RecordedEvent};

pub struct StoredUploadsProjection;

#[async_trait]
impl InlineProjection for StoredUploadsProjection {
    async fn apply(
        &self,
        conn: &mut PgConnection,
        events: &[RecordedEvent],
    ) -> Result<(), sqlx::Error> {
        for item in super::events_of::<files::Event>(events, "files") {
            let (_, recorded, event) = item?;
            let stream = recorded.stream_id.as_str();
            match event {
                files::Event::GenerationPublished {
                    generation,
                    blob_digest,
                    size,
                    ..
                } => {
                    sqlx::query(
                        "INSERT INTO stored_uploads
                           (team_id, stream_id, generation, blob_digest, size)
                         VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
                    )
                    .bind(team_of(stream)?.as_str())
                    .bind(stream)
                    .bind(generation.0 as i64)
                    .bind(blob_digest.to_string())
                    .bind(size as i64)
                    .execute(&mut *conn)
                    .await?;
                }
                files::Event::GenerationRetired { generation, .. } => {
                    sqlx::query(
                        "DELETE FROM stored_uploads
                         WHERE team_id = $1 AND stream_id = $2 AND generation = $3",
                    )
                    .bind(team_of(stream)?.as_str())
                    .bind(stream)
                    .bind(generation.0 as i64)
                    .execute(&mut *conn)
                    .await?;
                }
                files::Event::GenerationReserved { .. } => {}
            }
        }
        for item in super::events_of::<object::Event>(events, "object") {
            let (digest, _, event) = item?;
            if let object::Event::Deleted { .. } = event {
                sqlx::query("DELETE FROM stored_uploads WHERE blob_digest = $1")
                    .bind(format!("sha256:{digest}"))
                    .execute(&mut *conn)
                    .await?;
            }
        }
        Ok(())
    }
}

/// The team a `files-{team}:{hash}` stream belongs to.
fn team_of(stream: &str) -> Result<TeamId, sqlx::Error> {
    ids::stream::decode(stream)
        .and_then(|(_, parts)| parts.into_iter().next())
        .and_then(|scope| TeamId::parse(&scope).ok())
        .ok_or_else(|| {
            sqlx::Error::Protocol(format!(
                "stream {stream:?} does not name the team its uploads belong to"
            ))
        })
}

/// Bytes the blob store holds for `team`'s uploads, each distinct archive once.
pub async fn team_bytes<'c, X>(executor: X, team: &TeamId) -> Result<u64, sqlx::Error>
where
    X: sqlx::Executor<'c, Database = sqlx::Postgres>,
{
    let n: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(size), 0)::bigint
         FROM (SELECT DISTINCT blob_digest, size FROM stored_uploads WHERE team_id = $1) s",
    )
    .bind(team.as_str())
    .fetch_one(executor)
    .await?;
    Ok(n.max(0) as u64)
}
