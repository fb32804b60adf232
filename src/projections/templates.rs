//! The `templates` read model: a team's templates with their names and latest build,
//! maintained inline with every append to a `template-…` stream. Listings read it; decisions
//! read the template streams.
//!
//! Layout: the [`TemplatesProjection`] that writes it, then its reads, one function per
//! question: ownership checks, the API's listing and lookup, the operator page's keyset page.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::domain::ids::{BuildId, TeamId, TemplateId};
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
    team: &TeamId,
    template: &TemplateId,
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
    team: &TeamId,
    template: &TemplateId,
) -> Result<bool, sqlx::Error> {
    let deleted: Option<bool> =
        sqlx::query_scalar("SELECT deleted FROM templates WHERE template_id = $1 AND team_id = $2")
            .bind(template.as_str())
            .bind(team.as_str())
            .fetch_optional(pool)
            .await?;
    Ok(deleted == Some(true))
}

/// One row of the `templates` read model: a template with its names and build counter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TemplateRow {
    pub template: TemplateId,
    pub team: TeamId,
    /// Every name the template was registered under, oldest first.
    pub names: Vec<String>,
    pub build_count: i64,
    /// The build registered last, whatever its phase.
    pub latest_build: Option<BuildId>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

const COLUMNS: &str =
    "template_id, team_id, names, build_count, latest_build, created_at, updated_at";

type Columns = (
    String,
    String,
    Vec<String>,
    i64,
    Option<Uuid>,
    DateTime<Utc>,
    DateTime<Utc>,
);

fn template_row(
    (template, team, names, build_count, latest_build, created_at, updated_at): Columns,
) -> Result<TemplateRow, sqlx::Error> {
    let decode = |e: crate::domain::ids::IdError| sqlx::Error::Decode(Box::new(e));
    Ok(TemplateRow {
        template: TemplateId::parse(&template).map_err(decode)?,
        team: TeamId::parse(&team).map_err(decode)?,
        names,
        build_count,
        latest_build: latest_build.map(BuildId::from_uuid),
        created_at,
        updated_at,
    })
}

/// `team`'s live (not deleted) templates, oldest first: `GET /templates`.
pub async fn live_templates_of(
    pool: &sqlx::PgPool,
    team: &TeamId,
) -> Result<Vec<TemplateRow>, sqlx::Error> {
    let rows: Vec<Columns> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM templates WHERE team_id = $1 AND NOT deleted ORDER BY created_at"
    ))
    .bind(team.as_str())
    .fetch_all(pool)
    .await?;
    rows.into_iter().map(template_row).collect()
}

/// The row of `template`, deleted or not; `None` when no such template was registered.
pub async fn template_row_of(
    pool: &sqlx::PgPool,
    template: &TemplateId,
) -> Result<Option<TemplateRow>, sqlx::Error> {
    let row: Option<Columns> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM templates WHERE template_id = $1"
    ))
    .bind(template.as_str())
    .fetch_optional(pool)
    .await?;
    row.map(template_row).transpose()
}

/// Up to `limit` live templates of every team, the most recently updated first, starting
/// after the keyset `before` (`updated_at`, then template id text, both descending): one page
/// of the operator's template list.
pub async fn live_templates_page(
    pool: &sqlx::PgPool,
    before: Option<(DateTime<Utc>, &str)>,
    limit: i64,
) -> Result<Vec<TemplateRow>, sqlx::Error> {
    let rows: Vec<Columns> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM templates
         WHERE NOT deleted AND ($2::timestamptz IS NULL OR (updated_at, template_id) < ($2, $3))
         ORDER BY updated_at DESC, template_id DESC LIMIT $1"
    ))
    .bind(limit)
    .bind(before.map(|(at, _)| at))
    .bind(before.map(|(_, id)| id))
    .fetch_all(pool)
    .await?;
    rows.into_iter().map(template_row).collect()
}
