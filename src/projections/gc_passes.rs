//! The `gc_passes` read model: one row per `gcpass-{id}` stream, kept inline, so the operator
//! page draws the blob store's size and the passes over time from a bounded query instead of
//! replaying every pass's stream.

use async_trait::async_trait;
use sqlx::PgConnection;

use crate::domain::gc_pass::Event;
use crate::events::{InlineProjection, RecordedEvent};

const CATEGORY: &str = "gcpass";

pub struct GcPassesProjection;

#[async_trait]
impl InlineProjection for GcPassesProjection {
    async fn apply(
        &self,
        conn: &mut PgConnection,
        events: &[RecordedEvent],
    ) -> Result<(), sqlx::Error> {
        for item in super::events_of::<Event>(events, CATEGORY) {
            let (pass, recorded, event) = item?;
            let at = recorded.recorded_at;
            match event {
                Event::Started { node, .. } => {
                    sqlx::query(
                        "INSERT INTO gc_passes (pass_id, node, started_at) VALUES ($1, $2, $3)
                         ON CONFLICT DO NOTHING",
                    )
                    .bind(pass)
                    .bind(node)
                    .bind(at)
                    .execute(&mut *conn)
                    .await?;
                }
                Event::Renewed { .. } => {}
                Event::Measured { measure: m, .. } => {
                    sqlx::query(
                        "UPDATE gc_passes SET total_bytes = $2, budget_bytes = $3,
                         deleted_objects = $4, deleted_bytes = $5, classes = $6
                         WHERE pass_id = $1",
                    )
                    .bind(pass)
                    .bind(m.total_bytes as i64)
                    .bind(m.budget_bytes.map(|b| b as i64))
                    .bind(m.deleted_objects as i64)
                    .bind(m.deleted_bytes as i64)
                    .bind(sqlx::types::Json(&m.classes))
                    .execute(&mut *conn)
                    .await?;
                }
                Event::Ended { .. } => {
                    sqlx::query("UPDATE gc_passes SET ended_at = $2 WHERE pass_id = $1")
                        .bind(pass)
                        .bind(at)
                        .execute(&mut *conn)
                        .await?;
                }
                Event::Fenced { by, .. } => {
                    sqlx::query("UPDATE gc_passes SET fenced_by = $2 WHERE pass_id = $1")
                        .bind(pass)
                        .bind(by)
                        .execute(&mut *conn)
                        .await?;
                }
            }
        }
        Ok(())
    }
}
