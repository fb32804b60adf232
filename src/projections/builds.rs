//! The `builds` read model: one row per build, maintained inline with every append to a
//! `build-…` stream, so the worker's queue and the reconcilers' scans see exactly what was
//! committed. It is an index for finding work, never the authority: whoever acts on a row
//! re-reads the build stream and decides there. Beside it, `upload_intents`: the pending upload
//! intents of waiting builds by expiry, for the intent-expiry reconciler.

use async_trait::async_trait;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::domain::build::Event;
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
            sqlx::query("UPDATE builds SET phase = 'queued', deadline = $2 WHERE build_id = $1")
                .bind(build_id)
                .bind(queue_deadline)
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
                "UPDATE builds SET phase = 'active', epoch = $2, node = $3, lease_expires_at = $4, deadline = NULL
                 WHERE build_id = $1",
            )
            .bind(build_id)
            .bind(epoch.0 as i64)
            .bind(node.as_str())
            .bind(lease_expires_at)
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
        Event::ContextBound { .. }
        | Event::StepCompleted { .. }
        | Event::CacheConsulted { .. }
        | Event::BaseImageResolved { .. } => {}
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
