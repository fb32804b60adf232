//! The `sandboxes` read model: one row per `sandbox-{id}` stream, kept inline with every append
//! so a create call sees its sandbox running the moment the node's write commits, and the
//! SDK's `Sandbox.list` never shows one that ended.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use crate::domain::sandbox::{EndReason, Event};
use crate::events::{InlineProjection, RecordedEvent};

const CATEGORY: &str = "sandbox";

pub struct SandboxesProjection;

#[async_trait]
impl InlineProjection for SandboxesProjection {
    async fn apply(
        &self,
        conn: &mut PgConnection,
        events: &[RecordedEvent],
    ) -> Result<(), sqlx::Error> {
        for item in super::events_of::<Event>(events, CATEGORY) {
            let (id, recorded, event) = item?;
            spans(conn, id, recorded, &event).await?;
            match event {
                Event::Requested {
                    request: r,
                    requested_at,
                } => {
                    sqlx::query(
                        "INSERT INTO sandboxes (sandbox_id, team_id, template_id, alias, build_id, \
                         snapshot_id, state, envd_token, metadata, env_vars, allow_internet, \
                         timeout_secs, cpu_count, memory_mb, requested_at, auto_pause, traffic_token) \
                         VALUES ($1, $2, $3, $4, $5, $6, 'requested', $7, $8, $9, $10, $11, $12, $13, $14, $15, $16) \
                         ON CONFLICT (sandbox_id) DO NOTHING",
                    )
                    .bind(id)
                    .bind(r.team.as_str())
                    .bind(r.template.as_str())
                    .bind(&r.alias)
                    .bind(r.build.as_uuid())
                    .bind(r.snapshot.as_uuid())
                    .bind(&r.envd_token)
                    .bind(sqlx::types::Json(&r.metadata))
                    .bind(sqlx::types::Json(&r.env_vars))
                    .bind(r.allow_internet)
                    .bind(r.timeout_secs as i32)
                    .bind(r.cpu_count as i32)
                    .bind(r.memory_mb as i32)
                    .bind(requested_at)
                    .bind(r.auto_pause)
                    .bind(&r.traffic_token)
                    .execute(&mut *conn)
                    .await?;
                }
                Event::Placed { node, epoch, .. } => {
                    sqlx::query(
                        "UPDATE sandboxes SET state = 'placed', node_id = $2, epoch = $3 WHERE sandbox_id = $1",
                    )
                    .bind(id)
                    .bind(node)
                    .bind(epoch.0 as i64)
                    .execute(&mut *conn)
                    .await?;
                }
                Event::Running {
                    agent_url,
                    started_at,
                    end_at,
                    ..
                } => {
                    sqlx::query(
                        "UPDATE sandboxes SET state = 'running', agent_url = $2, started_at = $3, \
                         end_at = $4 WHERE sandbox_id = $1",
                    )
                    .bind(id)
                    .bind(agent_url)
                    .bind(started_at)
                    .bind(end_at)
                    .execute(&mut *conn)
                    .await?;
                }
                Event::TimeoutSet { end_at, .. } => {
                    sqlx::query("UPDATE sandboxes SET end_at = $2 WHERE sandbox_id = $1")
                        .bind(id)
                        .bind(end_at)
                        .execute(&mut *conn)
                        .await?;
                }
                Event::Pausing { .. } => {
                    sqlx::query("UPDATE sandboxes SET state = 'pausing' WHERE sandbox_id = $1")
                        .bind(id)
                        .execute(&mut *conn)
                        .await?;
                }
                Event::Paused { paused_at, .. } => {
                    sqlx::query(
                        "UPDATE sandboxes SET state = 'paused', paused_at = $2, node_id = NULL, \
                         agent_url = NULL, end_at = NULL WHERE sandbox_id = $1",
                    )
                    .bind(id)
                    .bind(paused_at)
                    .execute(&mut *conn)
                    .await?;
                }
                Event::Resumed { timeout_secs, .. } => {
                    sqlx::query(
                        "UPDATE sandboxes SET state = 'requested', timeout_secs = $2, end_at = NULL, \
                         resume_detail = NULL WHERE sandbox_id = $1",
                    )
                    .bind(id)
                    .bind(timeout_secs as i32)
                    .execute(&mut *conn)
                    .await?;
                }
                Event::ResumeFailed { reason, .. } => {
                    sqlx::query(
                        "UPDATE sandboxes SET state = 'paused', node_id = NULL, resume_detail = $2 \
                         WHERE sandbox_id = $1",
                    )
                    .bind(id)
                    .bind(reason)
                    .execute(&mut *conn)
                    .await?;
                }
                Event::Ended {
                    reason,
                    detail,
                    ended_at,
                } => {
                    sqlx::query(
                        "UPDATE sandboxes SET state = 'ended', end_reason = $2, end_detail = $3, \
                         ended_at = $4 WHERE sandbox_id = $1",
                    )
                    .bind(id)
                    .bind(reason.as_str())
                    .bind(detail)
                    .bind(ended_at)
                    .execute(&mut *conn)
                    .await?;
                }
            }
        }
        Ok(())
    }
}

/// Keeps `sandbox_spans`, each span closed by the next transition: starting from the request or
/// a resume, running from `Running`, paused from `Paused` (or a failed resume, which leaves it
/// paused); `Ended` closes the last. Times are the appends'.
async fn spans(
    conn: &mut PgConnection,
    id: &str,
    recorded: &RecordedEvent,
    event: &Event,
) -> Result<(), sqlx::Error> {
    let at = recorded.recorded_at;
    let opens = match event {
        Event::Requested { .. } | Event::Resumed { .. } => Some("starting"),
        Event::Running { .. } => Some("running"),
        Event::Paused { .. } | Event::ResumeFailed { .. } => Some("paused"),
        Event::Ended { .. } => None,
        Event::Placed { .. } | Event::TimeoutSet { .. } | Event::Pausing { .. } => return Ok(()),
    };
    sqlx::query("UPDATE sandbox_spans SET to_at = $2 WHERE sandbox_id = $1 AND to_at IS NULL")
        .bind(id)
        .bind(at)
        .execute(&mut *conn)
        .await?;
    if let Some(state) = opens {
        sqlx::query(
            "INSERT INTO sandbox_spans (sandbox_id, opened_by, state, from_at)
             VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
        )
        .bind(id)
        .bind(recorded.version as i64)
        .bind(state)
        .bind(at)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// A sandbox as the API and the nodes read it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SandboxRow {
    pub sandbox_id: String,
    pub team_id: String,
    pub template_id: String,
    pub alias: String,
    pub build_id: uuid::Uuid,
    pub snapshot_id: uuid::Uuid,
    pub state: String,
    pub end_reason: Option<String>,
    pub end_detail: Option<String>,
    pub node_id: Option<String>,
    pub epoch: i64,
    pub agent_url: Option<String>,
    pub envd_token: String,
    pub metadata: sqlx::types::Json<std::collections::BTreeMap<String, String>>,
    pub env_vars: sqlx::types::Json<std::collections::BTreeMap<String, String>>,
    pub allow_internet: bool,
    pub timeout_secs: i32,
    pub cpu_count: i32,
    pub memory_mb: i32,
    pub requested_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub end_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
    pub paused_at: Option<DateTime<Utc>>,
    pub auto_pause: bool,
    /// Why its last resume did not get as far as running, while it is paused again.
    pub resume_detail: Option<String>,
    /// What a request for one of its ports must carry; `None`: they are public.
    pub traffic_token: Option<String>,
}

impl SandboxRow {
    /// Paused or pausing: what the SDK reports as `paused` (E2B reports a pausing sandbox so).
    pub fn is_paused(&self) -> bool {
        matches!(self.state.as_str(), "pausing" | "paused")
    }

    pub fn end_reason(&self) -> Option<EndReason> {
        match self.end_reason.as_deref()? {
            "killed" => Some(EndReason::Killed),
            "expired" => Some(EndReason::Expired),
            "failed" => Some(EndReason::Failed),
            "lost" => Some(EndReason::Lost),
            _ => None,
        }
    }
}

pub async fn get(pool: &sqlx::PgPool, id: &str) -> Result<Option<SandboxRow>, sqlx::Error> {
    sqlx::query_as("SELECT * FROM sandboxes WHERE sandbox_id = $1")
        .bind(id)
        .fetch_optional(pool)
        .await
}

/// The oldest requested sandboxes, for a node to place.
pub async fn requested(pool: &sqlx::PgPool, limit: i64) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT sandbox_id FROM sandboxes WHERE state = 'requested' ORDER BY requested_at LIMIT $1",
    )
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// Live (placed or running) sandboxes whose deadline passed at `now`.
pub async fn past_deadline(
    pool: &sqlx::PgPool,
    now: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT sandbox_id FROM sandboxes WHERE state IN ('placed', 'running') AND end_at <= $1 \
         ORDER BY end_at LIMIT $2",
    )
    .bind(now)
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// Which live sandboxes a listing wants, as the SDK's `state` filter names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wanted {
    /// Requested, placed or running (a resuming sandbox is among them).
    pub running: bool,
    /// Pausing or paused.
    pub paused: bool,
}

/// A page of a team's live sandboxes in the `wanted` states whose metadata holds every pair of
/// `metadata`, newest first, after the cursor `(requested_at, id)`.
pub async fn list_live(
    pool: &sqlx::PgPool,
    team: &str,
    wanted: Wanted,
    metadata: &std::collections::BTreeMap<String, String>,
    after: Option<(DateTime<Utc>, String)>,
    limit: i64,
) -> Result<Vec<SandboxRow>, sqlx::Error> {
    let (at, id) = match after {
        Some((at, id)) => (Some(at), Some(id)),
        None => (None, None),
    };
    let mut states: Vec<&str> = Vec::new();
    if wanted.running {
        states.extend(["requested", "placed", "running"]);
    }
    if wanted.paused {
        states.extend(["pausing", "paused"]);
    }
    sqlx::query_as(
        "SELECT * FROM sandboxes WHERE team_id = $1 AND state = ANY($6) \
         AND ($2::timestamptz IS NULL OR (requested_at, sandbox_id) < ($2, $3)) \
         AND metadata @> $5 ORDER BY requested_at DESC, sandbox_id DESC LIMIT $4",
    )
    .bind(team)
    .bind(at)
    .bind(id)
    .bind(limit)
    .bind(sqlx::types::Json(metadata))
    .bind(&states)
    .fetch_all(pool)
    .await
}

/// Sandboxes on a node (`id`, `epoch`, `node`: placed, running or pausing) whose node stopped reporting that it lives (its
/// `cache_nodes` heartbeat expired, by the database clock, or it never reported within 30 s of
/// the request).
pub async fn on_lost_nodes(
    pool: &sqlx::PgPool,
    limit: i64,
) -> Result<Vec<(String, i64, String)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT s.sandbox_id, s.epoch, s.node_id FROM sandboxes s \
         LEFT JOIN cache_nodes n ON n.node_id = s.node_id \
         WHERE s.state IN ('placed', 'running', 'pausing') AND s.node_id IS NOT NULL \
         AND (n.expires_at < now() OR (n.node_id IS NULL AND s.requested_at < now() - interval '30 seconds')) \
         ORDER BY s.requested_at LIMIT $1",
    )
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// Sandboxes for operators: the live ones (of `team`, or all), and with `ended` also the most
/// recently ended, newest first.
pub async fn recent(
    pool: &sqlx::PgPool,
    team: Option<&str>,
    ended: bool,
    limit: i64,
) -> Result<Vec<SandboxRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT * FROM sandboxes WHERE ($1::text IS NULL OR team_id = $1) \
         AND ($2 OR state <> 'ended') ORDER BY requested_at DESC, sandbox_id DESC LIMIT $3",
    )
    .bind(team)
    .bind(ended)
    .bind(limit)
    .fetch_all(pool)
    .await
}
