//! The `stored_uploads` read model: the generations each team's uploads have published and the
//! blob store still holds, kept inline with the `files-…` and `object-…` appends, so a team's
//! stored bytes are one index range (`STRATA_TEAM_MAX_STORED_UPLOADS`, ADR 0032).
//!
//! A generation's row goes when the generation is retired (its bytes were found torn or
//! missing) or when garbage collection records its object `Deleted`; an archive published under
//! several names or generations is counted once ([`team_bytes`]).

use async_trait::async_trait;
use sqlx::PgConnection;

use crate::domain::files;
use crate::domain::ids::TeamId;
use crate::events::{InlineProjection, RecordedEvent};

pub struct StoredUploadsProjection;

#[async_trait]
impl InlineProjection for StoredUploadsProjection {
    async fn apply(
        &self,
        conn: &mut PgConnection,
        events: &[RecordedEvent],
    ) -> Result<(), sqlx::Error> {
        // Only the events that move the count are decoded: these streams' other events (and,
        // in streams written before the unambiguous names, other categories' events) are not
        // this read model's to judge.
        let counted = |e: &&RecordedEvent| {
            matches!(
                (e.stream_id.category(), e.event_type.as_str()),
                ("files", "GenerationPublished.v1" | "GenerationRetired.v1")
                    | ("object", "ObjectDeleted.v1")
            )
        };
        for recorded in events.iter().filter(counted) {
            if recorded.stream_id.category() == "object" {
                let digest = &recorded.stream_id.as_str()["object-".len()..];
                sqlx::query("DELETE FROM stored_uploads WHERE blob_digest = $1")
                    .bind(format!("sha256:{digest}"))
                    .execute(&mut *conn)
                    .await?;
                continue;
            }
            let event = recorded
                .decode::<files::Event>()
                .map_err(|err| sqlx::Error::Decode(Box::new(err)))?;
            let stream = recorded.stream_id.as_str();
            match event {
                // The team is the publishing build's: the `builds` projection (earlier in the
                // standing list) has its row, as the migration's backfill reads it.
                files::Event::GenerationPublished {
                    generation,
                    blob_digest,
                    size,
                    build,
                    ..
                } => {
                    sqlx::query(
                        "INSERT INTO stored_uploads
                           (team_id, stream_id, generation, blob_digest, size)
                         SELECT team_id, $2, $3, $4, $5 FROM builds WHERE build_id = $1
                         ON CONFLICT DO NOTHING",
                    )
                    .bind(build.as_uuid())
                    .bind(stream)
                    .bind(generation.0 as i64)
                    .bind(blob_digest.to_string())
                    .bind(size as i64)
                    .execute(&mut *conn)
                    .await?;
                }
                files::Event::GenerationRetired { generation, .. } => {
                    sqlx::query(
                        "DELETE FROM stored_uploads WHERE stream_id = $1 AND generation = $2",
                    )
                    .bind(stream)
                    .bind(generation.0 as i64)
                    .execute(&mut *conn)
                    .await?;
                }
                files::Event::GenerationReserved { .. } => {}
            }
        }
        Ok(())
    }
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
