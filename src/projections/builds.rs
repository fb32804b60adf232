//! The `builds` read model: one row per build, maintained inline with every append to a
//! `build-…` stream, so the worker's queue and the reconcilers' scans see exactly what was
//! committed. It is an index for finding work, never the authority: whoever acts on a row
//! re-reads the build stream and decides there. Beside it, `upload_intents`: the pending upload
//! intents of waiting builds by expiry, for the intent-expiry reconciler.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::domain::build::Event;
use crate::domain::ids::{BuildId, TemplateId};
use crate::events::{InlineProjection, RecordedEvent};

/// Category of the streams this projection follows.
const CATEGORY: &str = "build";

/// Applies build events to the `builds` table. Pass it to
/// [`EventStore::append_with`](crate::events::EventStore::append_with) on every append that
/// touches a build stream.
pub struct BuildsProjection;

#[async_trait]
impl InlineProjection for BuildsProjection {
    async fn apply(
        &self,
        conn: &mut PgConnection,
        events: &[RecordedEvent],
    ) -> Result<(), sqlx::Error> {
        for item in super::events_of::<Event>(events, CATEGORY) {
            let (id, recorded, event) = item?;
            let build_id = Uuid::parse_str(id).map_err(|err| sqlx::Error::Decode(Box::new(err)))?;
            apply_one(conn, build_id, recorded, &event).await?;
        }
        Ok(())
    }
}

async fn apply_one(
    conn: &mut PgConnection,
    build_id: Uuid,
    recorded: &RecordedEvent,
    event: &Event,
) -> Result<(), sqlx::Error> {
    let version = recorded.version as i64;
    let at = recorded.recorded_at;
    match event {
        Event::BuildRegistered {
            template,
            team,
            resources,
            registered_at,
            waiting_deadline,
            ..
        } => {
            sqlx::query(
                "INSERT INTO builds (build_id, template_id, team_id, phase, deadline, registered_at, updated_at, stream_version, cpu_count, memory_mb)
                 VALUES ($1, $2, $3, 'waiting', $4, $5, $6, $7, $8, $9)",
            )
            .bind(build_id)
            .bind(template.as_str())
            .bind(team.as_str())
            .bind(waiting_deadline)
            .bind(registered_at)
            .bind(at)
            .bind(version)
            .bind(resources.cpu_count.map(|c| c as i32))
            .bind(resources.memory_mb.map(|m| m as i32))
            .execute(&mut *conn)
            .await?;
            return Ok(());
        }
        Event::BuildFrozen { queue_deadline, .. } => {
            sqlx::query(
                "UPDATE builds SET phase = 'queued', deadline = $2, queued_at = $3 WHERE build_id = $1",
            )
            .bind(build_id)
            .bind(queue_deadline)
            .bind(at)
            .execute(&mut *conn)
            .await?;
            forget_intents(conn, build_id).await?;
        }
        Event::UploadReserved {
            intent, expires_at, ..
        } => {
            sqlx::query(
                "INSERT INTO upload_intents (build_id, intent_id, expires_at) VALUES ($1, $2, $3)
                 ON CONFLICT DO NOTHING",
            )
            .bind(build_id)
            .bind(intent.as_uuid())
            .bind(expires_at)
            .execute(&mut *conn)
            .await?;
        }
        Event::UploadCompleted { intent, .. } | Event::IntentExpired { intent, .. } => {
            sqlx::query("DELETE FROM upload_intents WHERE build_id = $1 AND intent_id = $2")
                .bind(build_id)
                .bind(intent.as_uuid())
                .execute(&mut *conn)
                .await?;
        }
        Event::ContextReleased { intents, .. } => {
            let ids: Vec<Uuid> = intents.iter().map(|i| i.as_uuid()).collect();
            sqlx::query("DELETE FROM upload_intents WHERE build_id = $1 AND intent_id = ANY($2)")
                .bind(build_id)
                .bind(&ids)
                .execute(&mut *conn)
                .await?;
        }
        Event::AttemptAcquired {
            epoch,
            node,
            lease_expires_at,
            ..
        } => {
            sqlx::query(
                "UPDATE builds SET phase = 'active', epoch = $2, node = $3, lease_expires_at = $4, deadline = NULL,
                 acquired_at = coalesce(acquired_at, $5)
                 WHERE build_id = $1",
            )
            .bind(build_id)
            .bind(epoch.0 as i64)
            .bind(node.as_str())
            .bind(lease_expires_at)
            .bind(at)
            .execute(&mut *conn)
            .await?;
            sqlx::query(
                "INSERT INTO team_turns (team_id, last_started_at)
                 SELECT team_id, $2 FROM builds WHERE build_id = $1
                 ON CONFLICT (team_id) DO UPDATE
                 SET last_started_at = greatest(team_turns.last_started_at, excluded.last_started_at)",
            )
            .bind(build_id)
            .bind(at)
            .execute(&mut *conn)
            .await?;
        }
        Event::LeaseRenewed {
            lease_expires_at, ..
        } => {
            sqlx::query("UPDATE builds SET lease_expires_at = $2 WHERE build_id = $1")
                .bind(build_id)
                .bind(lease_expires_at)
                .execute(&mut *conn)
                .await?;
        }
        Event::PublishingStarted { .. } => {
            sqlx::query("UPDATE builds SET phase = 'publishing' WHERE build_id = $1")
                .bind(build_id)
                .execute(&mut *conn)
                .await?;
        }
        Event::BuildReady { .. } => {
            sqlx::query(
                "UPDATE builds SET phase = 'ready', lease_expires_at = NULL, deadline = NULL, finished_at = $2
                 WHERE build_id = $1",
            )
            .bind(build_id)
            .bind(at)
            .execute(&mut *conn)
            .await?;
            destroy_credentials(conn, build_id).await?;
        }
        Event::AttemptExpired { .. } => {
            sqlx::query(
                "UPDATE builds SET phase = 'error', lease_expires_at = NULL, deadline = NULL WHERE build_id = $1",
            )
            .bind(build_id)
            .execute(&mut *conn)
            .await?;
            destroy_credentials(conn, build_id).await?;
            forget_intents(conn, build_id).await?;
        }
        Event::BuildFailed { .. } => {
            sqlx::query(
                "UPDATE builds SET phase = 'error', lease_expires_at = NULL, deadline = NULL, finished_at = $2
                 WHERE build_id = $1",
            )
            .bind(build_id)
            .bind(at)
            .execute(&mut *conn)
            .await?;
            destroy_credentials(conn, build_id).await?;
            forget_intents(conn, build_id).await?;
        }
        Event::StepCompleted { outcome, .. } => {
            let cached = matches!(outcome, crate::domain::build::StepOutcome::Cached { .. });
            sqlx::query(
                "UPDATE builds SET steps_cached = steps_cached + $2, steps_run = steps_run + $3
                 WHERE build_id = $1",
            )
            .bind(build_id)
            .bind(i32::from(cached))
            .bind(i32::from(!cached))
            .execute(&mut *conn)
            .await?;
        }
        Event::ContextBound { .. }
        | Event::CacheConsulted { .. }
        | Event::CacheModeResolved { .. }
        | Event::SandboxBackendResolved { .. }
        | Event::BaseImageResolved { .. }
        | Event::UploadClaimed { .. }
        | Event::UploadClaimReleased { .. } => {}
    }
    sqlx::query("UPDATE builds SET updated_at = $2, stream_version = $3 WHERE build_id = $1")
        .bind(build_id)
        .bind(at)
        .bind(version)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// A build that leaves Waiting has no intent left to expire: completion requires Waiting, and
/// the intents are released with the build's terminal state.
async fn forget_intents(conn: &mut sqlx::PgConnection, build_id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query("DELETE FROM upload_intents WHERE build_id = $1")
        .bind(build_id)
        .execute(&mut *conn)
        .await
        .map(drop)
}

/// A build's registry credentials (src/registry/sealed.rs) end with the build, in the same
/// transaction as the event that ends it.
async fn destroy_credentials(
    conn: &mut sqlx::PgConnection,
    build_id: Uuid,
) -> Result<(), sqlx::Error> {
    sqlx::query("DELETE FROM build_credentials WHERE build_id = $1")
        .bind(build_id)
        .execute(&mut *conn)
        .await
        .map(drop)
}

/// The template's most recently registered build still waiting for uploads and start.
pub async fn waiting_build(
    pool: &sqlx::PgPool,
    template: &TemplateId,
) -> Result<Option<BuildId>, sqlx::Error> {
    let build: Option<Uuid> = sqlx::query_scalar(
        "SELECT build_id FROM builds WHERE template_id = $1 AND phase = 'waiting'
         ORDER BY registered_at DESC LIMIT 1",
    )
    .bind(template.as_str())
    .fetch_optional(pool)
    .await?;
    Ok(build.map(BuildId::from_uuid))
}

/// Builds past a deadline or lease, by the database clock: what each reconciler acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// Active, lease passed: the node stopped renewing (attempt expiry).
    LapsedAttempt,
    /// Publishing, lease passed: the node died mid-promotion (promotion).
    LapsedPromotion,
    /// Waiting or Queued past the deadline (waiting-deadline expiry).
    PastDeadline,
}

/// A build past its deadline or lease, and by how long when it was listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DueBuild {
    pub build: BuildId,
    pub overdue: chrono::Duration,
}

/// At most `limit` builds `due`, the longest overdue first.
pub async fn due_builds(
    pool: &sqlx::PgPool,
    due: Due,
    limit: i64,
) -> Result<Vec<DueBuild>, sqlx::Error> {
    let sql = match due {
        Due::LapsedAttempt => {
            "SELECT build_id, extract(epoch FROM now() - lease_expires_at)::float8 FROM builds
             WHERE phase = 'active' AND lease_expires_at < now()
             ORDER BY lease_expires_at LIMIT $1"
        }
        Due::LapsedPromotion => {
            "SELECT build_id, extract(epoch FROM now() - lease_expires_at)::float8 FROM builds
             WHERE phase = 'publishing' AND lease_expires_at < now()
             ORDER BY lease_expires_at LIMIT $1"
        }
        Due::PastDeadline => {
            "SELECT build_id, extract(epoch FROM now() - deadline)::float8 FROM builds
             WHERE phase IN ('waiting', 'queued') AND deadline < now()
             ORDER BY deadline LIMIT $1"
        }
    };
    let rows: Vec<(Uuid, f64)> = sqlx::query_as(sql).bind(limit).fetch_all(pool).await?;
    Ok(rows
        .into_iter()
        .map(|(id, secs)| DueBuild {
            build: BuildId::from_uuid(id),
            overdue: chrono::Duration::milliseconds((secs * 1000.0) as i64),
        })
        .collect())
}

/// A page of the builds with an upload intent past its expiry (`upload_intents`), by id after
/// `after` (nil for the first page).
pub async fn builds_with_intents_due_after(
    pool: &sqlx::PgPool,
    after: Uuid,
    limit: i64,
) -> Result<Vec<Uuid>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT DISTINCT build_id FROM upload_intents WHERE expires_at <= now() AND build_id > $1
         ORDER BY build_id LIMIT $2",
    )
    .bind(after)
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// A queued build, how long it has been queued (by the database clock), and its fair-share
/// round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueuedBuild {
    pub build: BuildId,
    pub waited: std::time::Duration,
    /// The team's builds running now plus those of its builds queued ahead of this one: the
    /// build would be its team's `round`-th concurrent build. Lower rounds go first.
    pub round: u32,
}

/// At most `limit` queued builds in fair-share order: round by round across teams (a team's
/// oldest queued build is its round 0 when none of its builds runs); within a round, the team
/// whose last build started longest ago (or never) first, then the longest registered. A team
/// with `max_running` builds running has its builds left out: they wait for one of its own to
/// end (and an acquire counts again in its own transaction, so racing nodes cannot pass it).
/// This is the queue as placement reads it (ADR 0020, ADR 0024): one team's burst delays
/// another team's build by at most one slot, whatever the order they registered in.
pub async fn queue(
    pool: &sqlx::PgPool,
    limit: i64,
    max_running: Option<u32>,
) -> Result<Vec<QueuedBuild>, sqlx::Error> {
    let rows: Vec<(Uuid, f64, i64)> = sqlx::query_as(
        "WITH running AS (
             SELECT team_id, count(*) AS n FROM builds WHERE phase = 'active' GROUP BY team_id
         ), queued AS (
             SELECT build_id, team_id, registered_at,
                    greatest(extract(epoch FROM now() - coalesce(queued_at, updated_at)), 0)::float8 AS waited,
                    row_number() OVER (PARTITION BY team_id ORDER BY registered_at, build_id) - 1 AS ahead
             FROM builds WHERE phase = 'queued'
         )
         SELECT q.build_id, q.waited, coalesce(r.n, 0) + q.ahead AS round
         FROM queued q LEFT JOIN running r USING (team_id) LEFT JOIN team_turns t USING (team_id)
         WHERE $2::bigint IS NULL OR coalesce(r.n, 0) < $2
         ORDER BY round, t.last_started_at NULLS FIRST, q.registered_at, q.build_id
         LIMIT $1",
    )
    .bind(limit)
    .bind(max_running.map(i64::from))
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, secs, round)| QueuedBuild {
            build: BuildId::from_uuid(id),
            waited: std::time::Duration::from_secs_f64(secs.max(0.0)),
            round: u32::try_from(round).unwrap_or(u32::MAX),
        })
        .collect())
}

/// The template's builds that have not reached Publishing, oldest first: what deleting the
/// template ends.
pub async fn unpublished_builds_of(
    pool: &sqlx::PgPool,
    template: &TemplateId,
) -> Result<Vec<BuildId>, sqlx::Error> {
    let ids: Vec<Uuid> = sqlx::query_scalar(
        "SELECT build_id FROM builds
         WHERE template_id = $1 AND phase IN ('waiting', 'queued', 'active')
         ORDER BY registered_at, build_id",
    )
    .bind(template.as_str())
    .fetch_all(pool)
    .await?;
    Ok(ids.into_iter().map(BuildId::from_uuid).collect())
}

/// A build as the template listings show it: its phase, times and requested resources.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildSummary {
    pub build: BuildId,
    /// The read model's phase name: `waiting`, `queued`, `active`, `publishing`, `ready` or
    /// `error`.
    pub phase: String,
    pub registered_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// As requested; `None` = the default the build ran with.
    pub cpu_count: Option<i32>,
    pub memory_mb: Option<i32>,
}

#[derive(sqlx::FromRow)]
struct SummaryColumns {
    build_id: Uuid,
    phase: String,
    registered_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
    cpu_count: Option<i32>,
    memory_mb: Option<i32>,
}

impl From<SummaryColumns> for BuildSummary {
    fn from(row: SummaryColumns) -> Self {
        BuildSummary {
            build: BuildId::from_uuid(row.build_id),
            phase: row.phase,
            registered_at: row.registered_at,
            updated_at: row.updated_at,
            finished_at: row.finished_at,
            cpu_count: row.cpu_count,
            memory_mb: row.memory_mb,
        }
    }
}

const SUMMARY_COLUMNS: &str =
    "build_id, phase, registered_at, updated_at, finished_at, cpu_count, memory_mb";

/// The summaries of those of `builds` that exist, in no particular order.
pub async fn summaries_of(
    pool: &sqlx::PgPool,
    builds: &[BuildId],
) -> Result<Vec<BuildSummary>, sqlx::Error> {
    let ids: Vec<Uuid> = builds.iter().map(BuildId::as_uuid).collect();
    let rows: Vec<SummaryColumns> = sqlx::query_as(&format!(
        "SELECT {SUMMARY_COLUMNS} FROM builds WHERE build_id = ANY($1)"
    ))
    .bind(ids)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(BuildSummary::from).collect())
}

/// Every build of `template`, the most recently registered first.
pub async fn summaries_of_template(
    pool: &sqlx::PgPool,
    template: &TemplateId,
) -> Result<Vec<BuildSummary>, sqlx::Error> {
    let rows: Vec<SummaryColumns> = sqlx::query_as(&format!(
        "SELECT {SUMMARY_COLUMNS} FROM builds WHERE template_id = $1 ORDER BY registered_at DESC"
    ))
    .bind(template.as_str())
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(BuildSummary::from).collect())
}

/// The most recently registered of `template`'s Ready builds.
pub async fn newest_ready_build(
    pool: &sqlx::PgPool,
    template: &TemplateId,
) -> Result<Option<BuildId>, sqlx::Error> {
    let build: Option<Uuid> = sqlx::query_scalar(
        "SELECT build_id FROM builds WHERE template_id = $1 AND phase = 'ready'
         ORDER BY registered_at DESC LIMIT 1",
    )
    .bind(template.as_str())
    .fetch_optional(pool)
    .await?;
    Ok(build.map(BuildId::from_uuid))
}

/// How many builds of one template are in one phase.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PhaseCount {
    pub template: TemplateId,
    /// The read model's phase name (see [`BuildSummary::phase`]).
    pub phase: String,
    pub builds: i64,
}

/// The number of builds per phase of each of `templates` (phases without builds left out).
pub async fn phase_counts(
    pool: &sqlx::PgPool,
    templates: &[TemplateId],
) -> Result<Vec<PhaseCount>, sqlx::Error> {
    let ids: Vec<&str> = templates.iter().map(TemplateId::as_str).collect();
    let rows: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT template_id, phase, count(*) FROM builds
         WHERE template_id = ANY($1) GROUP BY template_id, phase",
    )
    .bind(ids)
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|(template, phase, builds)| {
            Ok(PhaseCount {
                template: TemplateId::parse(&template)
                    .map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
                phase,
                builds,
            })
        })
        .collect()
}

/// Up to `limit` builds of `template` other than `build` registered no later than
/// `registered_at`, the most recent first (ties by id, descending): what `why` compares a
/// build's cache keys against.
pub async fn builds_of_template_before(
    pool: &sqlx::PgPool,
    template: &TemplateId,
    build: BuildId,
    registered_at: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<BuildId>, sqlx::Error> {
    let ids: Vec<Uuid> = sqlx::query_scalar(
        "SELECT build_id FROM builds
         WHERE template_id = $1 AND build_id <> $2 AND registered_at <= $3
         ORDER BY registered_at DESC, build_id DESC LIMIT $4",
    )
    .bind(template.as_str())
    .bind(build.as_uuid())
    .bind(registered_at)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(ids.into_iter().map(BuildId::from_uuid).collect())
}

/// Which builds the operator's build list shows; every field unset lists all builds.
#[derive(Clone, Debug, Default)]
pub struct BuildFilter<'a> {
    /// A read-model phase name.
    pub phase: Option<&'a str>,
    pub team: Option<&'a str>,
    /// A template id or one of the template's names.
    pub template: Option<&'a str>,
    /// Only builds before this keyset (`registered_at`, then build id, both descending).
    pub before: Option<(DateTime<Utc>, Uuid)>,
}

/// A build as the operator's build list shows it, with its template's names.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct BuildListing {
    pub build_id: Uuid,
    pub team_id: String,
    pub template_id: String,
    /// `None` when the template's row is missing.
    pub names: Option<Vec<String>>,
    /// The read model's phase name (see [`BuildSummary::phase`]).
    pub phase: String,
    pub epoch: Option<i64>,
    pub node: Option<String>,
    pub registered_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The database clock when listed: how long a running build has taken so far.
    pub now: DateTime<Utc>,
}

/// Up to `limit` builds matching `filter`, the most recently registered first.
pub async fn list_builds(
    pool: &sqlx::PgPool,
    filter: &BuildFilter<'_>,
    limit: i64,
) -> Result<Vec<BuildListing>, sqlx::Error> {
    sqlx::query_as(
        "SELECT b.build_id, b.team_id, b.template_id, t.names, b.phase, b.epoch, b.node,
                b.registered_at, b.updated_at, now() AS now
         FROM builds b LEFT JOIN templates t ON t.template_id = b.template_id
         WHERE ($1::text IS NULL OR b.phase = $1)
           AND ($2::text IS NULL OR b.team_id = $2)
           AND ($3::text IS NULL OR b.template_id = $3 OR $3 = ANY(t.names))
           AND ($5::timestamptz IS NULL OR (b.registered_at, b.build_id) < ($5, $6))
         ORDER BY b.registered_at DESC, b.build_id DESC LIMIT $4",
    )
    .bind(filter.phase)
    .bind(filter.team)
    .bind(filter.template)
    .bind(limit)
    .bind(filter.before.map(|(at, _)| at))
    .bind(filter.before.map(|(_, id)| id))
    .fetch_all(pool)
    .await
}

/// What the `strata_builds`, queue-age and `strata_sandboxes` gauges export: builds per phase
/// over every template, the seconds since the oldest queued build's row last changed (by the
/// database's clock), and launched sandboxes per state.
pub async fn build_counts(
    pool: &sqlx::PgPool,
) -> Result<crate::metrics::scrape::ReadModelCounts, sqlx::Error> {
    let by_phase = sqlx::query_as("SELECT phase, count(*) FROM builds GROUP BY phase")
        .fetch_all(pool)
        .await?;
    let oldest_queued_seconds = sqlx::query_scalar(
        "SELECT extract(epoch FROM now() - min(updated_at))::float8 FROM builds WHERE phase = 'queued'",
    )
    .fetch_one(pool)
    .await?;
    let sandboxes_by_state = sqlx::query_as("SELECT state, count(*) FROM sandboxes GROUP BY state")
        .fetch_all(pool)
        .await?;
    Ok(crate::metrics::scrape::ReadModelCounts {
        by_phase,
        oldest_queued_seconds,
        sandboxes_by_state,
    })
}

/// The read model's phase of `build` (see [`BuildSummary::phase`]); `None` until its
/// registration reaches the read model.
pub async fn phase_of(pool: &sqlx::PgPool, build: &BuildId) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT phase FROM builds WHERE build_id = $1")
        .bind(build.as_uuid())
        .fetch_optional(pool)
        .await
}

/// How many builds ended, split by outcome.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcomes {
    pub ready: i64,
    pub error: i64,
}

impl Outcomes {
    pub fn terminal(&self) -> i64 {
        self.ready + self.error
    }
}

/// The outcomes of `builds`, or of every build when `builds` is `None`.
pub async fn outcomes(
    pool: &sqlx::PgPool,
    builds: Option<&[BuildId]>,
) -> Result<Outcomes, sqlx::Error> {
    let ids: Option<Vec<Uuid>> = builds.map(|b| b.iter().map(BuildId::as_uuid).collect());
    let (ready, error): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE phase = 'ready'), count(*) FILTER (WHERE phase = 'error')
         FROM builds WHERE $1::uuid[] IS NULL OR build_id = ANY($1)",
    )
    .bind(ids)
    .fetch_one(pool)
    .await?;
    Ok(Outcomes { ready, error })
}
