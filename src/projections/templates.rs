//! The `templates` read model: a team's templates with their names and latest build,
//! maintained inline with every append to a `template-…` stream. Listings read it; decisions
//! read the template streams.

use async_trait::async_trait;
use sqlx::PgConnection;

use crate::domain::template::Event;
use crate::events::{InlineProjection, RecordedEvent};

const CATEGORY: &str = "template";

pub struct TemplatesProjection;

#[async_trait]
impl InlineProjection for TemplatesProjection {
    async fn apply(
        &self,
        conn: &mut PgConnection,
        events: &[RecordedEvent],
    ) -> Result<(), sqlx::Error> {
        for item in super::events_of::<Event>(events, CATEGORY) {
            let (template_id, recorded, event) = item?;
            let at = recorded.recorded_at;
            match event {
                Event::TemplateRegistered { team, name, .. } => {
                    sqlx::query(
                        "INSERT INTO templates (template_id, team_id, names, created_at, updated_at)
                         VALUES ($1, $2, ARRAY[$3], $4, $4)
                         ON CONFLICT (template_id) DO UPDATE
                         SET names = array_append(templates.names, $3), updated_at = $4",
                    )
                    .bind(template_id)
                    .bind(team.as_str())
                    .bind(name)
                    .bind(at)
                    .execute(&mut *conn)
                    .await?;
                }
                Event::BuildAppended { build, .. } => {
                    sqlx::query(
                        "UPDATE templates SET build_count = build_count + 1, latest_build = $2, updated_at = $3
                         WHERE template_id = $1",
                    )
                    .bind(template_id)
                    .bind(build.as_uuid())
                    .bind(at)
                    .execute(&mut *conn)
                    .await?;
                }
                Event::TemplateDeleted { .. } => {
                    sqlx::query("UPDATE templates SET deleted = true, updated_at = $2 WHERE template_id = $1")
                        .bind(template_id)
                        .bind(at)
                        .execute(&mut *conn)
                        .await?;
                }
                Event::TagsAssigned { .. } | Event::TagsRemoved { .. } => {
                    sqlx::query("UPDATE templates SET updated_at = $2 WHERE template_id = $1")
                        .bind(template_id)
                        .bind(at)
                        .execute(&mut *conn)
                        .await?;
                }
            }
        }
        Ok(())
    }
}

/// Whether `template` is a live (not deleted) template of `team`.
pub async fn is_live_template_of(
    pool: &sqlx::PgPool,
    team: &crate::domain::ids::TeamId,
    template: &crate::domain::ids::TemplateId,
) -> Result<bool, sqlx::Error> {
    let owned: Option<bool> = sqlx::query_scalar(
        "SELECT true FROM templates WHERE template_id = $1 AND team_id = $2 AND NOT deleted",
    )
    .bind(template.as_str())
    .bind(team.as_str())
    .fetch_optional(pool)
    .await?;
    Ok(owned.is_some())
}

/// Whether `template` is `team`'s template and deleted; another team's template is `false`,
/// exactly like a missing one.
pub async fn is_deleted_template_of(
    pool: &sqlx::PgPool,
    team: &crate::domain::ids::TeamId,
    template: &crate::domain::ids::TemplateId,
) -> Result<bool, sqlx::Error> {
    let deleted: Option<bool> =
        sqlx::query_scalar("SELECT deleted FROM templates WHERE template_id = $1 AND team_id = $2")
            .bind(template.as_str())
            .bind(team.as_str())
            .fetch_optional(pool)
            .await?;
    Ok(deleted == Some(true))
}
