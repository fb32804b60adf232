//! What a team holds right now, counted from the `builds` and `upload_intents` read models, and
//! the admission check that holds a team to its limits ([`crate::domain::team_limits`]).
//!
//! The check runs inside the append that would add to the count, after the standing
//! projections have applied it, so the count includes the new row: over the limit, the append
//! stores nothing ([`crate::events::AdmissionCheck`]). The counts read an index range of the
//! team's rows (`builds_team_phase_idx`), so under SERIALIZABLE two concurrent admissions of
//! one team cannot both commit past the limit, and admissions of different teams do not meet.

use async_trait::async_trait;
use sqlx::PgConnection;

use crate::domain::ids::TeamId;
use crate::domain::team_limits::{Held, TeamLimits};
use crate::events::{AdmissionCheck, AdmissionRefused, InlineProjection, RecordedEvent};

/// Holds `team` to `max` of `held`, inside the append.
pub struct TeamCap {
    pub team: TeamId,
    pub held: Held,
    pub max: u64,
}

#[async_trait]
impl InlineProjection for TeamCap {
    async fn apply(&self, conn: &mut PgConnection, _: &[RecordedEvent]) -> Result<(), sqlx::Error> {
        let count = count(&mut *conn, &self.team, self.held).await?;
        match self.held.over(&self.team, count, self.max) {
            Some(over) => Err(AdmissionRefused(over.to_string()).into_sqlx()),
            None => Ok(()),
        }
    }
}

/// The check that holds `team` to its limit on `held`, if it has one.
pub fn admission(limits: &TeamLimits, team: &TeamId, held: Held) -> Option<AdmissionCheck> {
    cap(team, held, limits.max(held))
}

/// The check that holds `team` to at most `max` of `held` (none without a `max`).
pub fn cap(team: &TeamId, held: Held, max: Option<u64>) -> Option<AdmissionCheck> {
    max.map(|max| {
        AdmissionCheck::new(TeamCap {
            team: team.clone(),
            held,
            max,
        })
    })
}

/// How many of `held` `team` has.
pub async fn count<'c, X>(executor: X, team: &TeamId, held: Held) -> Result<u64, sqlx::Error>
where
    X: sqlx::Executor<'c, Database = sqlx::Postgres>,
{
    let sql = match held {
        Held::StoredUploadBytes => {
            return super::stored_uploads::team_bytes(executor, team).await;
        }
        Held::RunningBuilds => {
            "SELECT count(*) FROM builds WHERE team_id = $1 AND phase = 'active'"
        }
        Held::QueuedBuilds => {
            "SELECT count(*) FROM builds WHERE team_id = $1 AND phase IN ('waiting', 'queued')"
        }
        Held::PendingUploads => {
            "SELECT count(*) FROM builds b JOIN upload_intents i USING (build_id)
             WHERE b.team_id = $1 AND b.phase = 'waiting'"
        }
    };
    let n: i64 = sqlx::query_scalar(sql)
        .bind(team.as_str())
        .fetch_one(executor)
        .await?;
    Ok(n.max(0) as u64)
}

/// What one team holds now, for the operator page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TeamHoldings {
    pub team: String,
    pub running: i64,
    pub queued: i64,
    pub pending_uploads: i64,
    /// Bytes its uploads take in the blob store, each distinct archive once.
    pub stored_upload_bytes: i64,
}

/// Every team holding anything now (running, waiting or queued builds, unused upload links,
/// stored uploads), the most running first. At most `limit` rows.
pub async fn holdings(pool: &sqlx::PgPool, limit: i64) -> Result<Vec<TeamHoldings>, sqlx::Error> {
    let rows: Vec<(String, i64, i64, i64, i64)> = sqlx::query_as(
        "WITH held AS (
           SELECT b.team_id,
                  count(*) FILTER (WHERE b.phase = 'active') AS running,
                  count(*) FILTER (WHERE b.phase IN ('waiting', 'queued')) AS queued,
                  coalesce(sum((SELECT count(*) FROM upload_intents i
                                WHERE i.build_id = b.build_id))
                           FILTER (WHERE b.phase = 'waiting'), 0)::bigint AS pending
           FROM builds b
           WHERE b.phase IN ('waiting', 'queued', 'active')
           GROUP BY b.team_id
         ), stored AS (
           SELECT team_id, sum(size)::bigint AS bytes
           FROM (SELECT DISTINCT team_id, blob_digest, size FROM stored_uploads) s
           GROUP BY team_id
         )
         SELECT coalesce(h.team_id, s.team_id), coalesce(h.running, 0), coalesce(h.queued, 0),
                coalesce(h.pending, 0), coalesce(s.bytes, 0)
         FROM held h FULL JOIN stored s ON s.team_id = h.team_id
         ORDER BY 2 DESC, 3 DESC, 5 DESC, 1
         LIMIT $1",
    )
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(team, running, queued, pending_uploads, stored_upload_bytes)| TeamHoldings {
                team,
                running,
                queued,
                pending_uploads,
                stored_upload_bytes,
            },
        )
        .collect())
}
