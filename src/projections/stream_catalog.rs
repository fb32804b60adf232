//! `stream_catalog`: one row per stream (category, version, event count, first and last
//! recorded time, last event type), so operators can browse streams without scanning events.
//! Table: migrations/0002_stream_catalog.sql. Lags the feed; never a basis for decisions.

use std::collections::BTreeMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use super::{Projection, ProjectionError};
use crate::events::RecordedEvent;

pub const NAME: &str = "stream_catalog";

pub struct StreamCatalog;

/// What a batch contributes to one stream's row.
struct Delta<'a> {
    category: &'a str,
    version: i64,
    count: i64,
    first: DateTime<Utc>,
    last: DateTime<Utc>,
    last_type: &'a str,
}

#[async_trait]
impl Projection for StreamCatalog {
    fn name(&self) -> &str {
        NAME
    }

    async fn apply(
        &self,
        conn: &mut PgConnection,
        event: &RecordedEvent,
    ) -> Result<(), ProjectionError> {
        self.apply_batch(conn, std::slice::from_ref(event)).await
    }

    /// One upsert for the whole batch, folded per stream first.
    async fn apply_batch(
        &self,
        conn: &mut PgConnection,
        events: &[RecordedEvent],
    ) -> Result<(), ProjectionError> {
        let mut deltas: BTreeMap<&str, Delta> = BTreeMap::new();
        for e in events {
            let d = deltas.entry(e.stream_id.as_str()).or_insert(Delta {
                category: e.stream_id.category(),
                version: 0,
                count: 0,
                first: e.recorded_at,
                last: e.recorded_at,
                last_type: &e.event_type,
            });
            d.count += 1;
            d.first = d.first.min(e.recorded_at);
            if e.version as i64 >= d.version {
                d.version = e.version as i64;
                d.last = e.recorded_at;
                d.last_type = &e.event_type;
            }
        }
        if deltas.is_empty() {
            return Ok(());
        }
        let mut ids = Vec::new();
        let mut categories = Vec::new();
        let mut versions = Vec::new();
        let mut counts = Vec::new();
        let mut firsts = Vec::new();
        let mut lasts = Vec::new();
        let mut types = Vec::new();
        for (id, d) in deltas {
            ids.push(id.to_string());
            categories.push(d.category.to_string());
            versions.push(d.version);
            counts.push(d.count);
            firsts.push(d.first);
            lasts.push(d.last);
            types.push(d.last_type.to_string());
        }
        sqlx::query(
            "INSERT INTO stream_catalog AS c \
               (stream_id, category, version, event_count, first_recorded_at, last_recorded_at, last_event_type) \
             SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[], $5::timestamptz[], $6::timestamptz[], $7::text[]) \
             ON CONFLICT (stream_id) DO UPDATE SET \
               event_count = c.event_count + EXCLUDED.event_count, \
               first_recorded_at = LEAST(c.first_recorded_at, EXCLUDED.first_recorded_at), \
               version = GREATEST(c.version, EXCLUDED.version), \
               last_recorded_at = CASE WHEN EXCLUDED.version >= c.version THEN EXCLUDED.last_recorded_at ELSE c.last_recorded_at END, \
               last_event_type = CASE WHEN EXCLUDED.version >= c.version THEN EXCLUDED.last_event_type ELSE c.last_event_type END",
        )
        .bind(&ids)
        .bind(&categories)
        .bind(&versions)
        .bind(&counts)
        .bind(&firsts)
        .bind(&lasts)
        .bind(&types)
        .execute(conn)
        .await?;
        Ok(())
    }

    async fn reset(&self, conn: &mut PgConnection) -> Result<(), ProjectionError> {
        sqlx::query("DELETE FROM stream_catalog")
            .execute(conn)
            .await?;
        Ok(())
    }
}

/// A row of the catalog, as the admin API and CLI show it.
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
pub struct CatalogEntry {
    pub stream_id: String,
    pub category: String,
    pub version: i64,
    pub event_count: i64,
    pub first_recorded_at: DateTime<Utc>,
    pub last_recorded_at: DateTime<Utc>,
    pub last_event_type: String,
}

/// Streams in id order after `after`, optionally of one category.
pub async fn list_streams(
    pool: &sqlx::PgPool,
    category: Option<&str>,
    after: Option<&str>,
    limit: u32,
) -> Result<Vec<CatalogEntry>, sqlx::Error> {
    sqlx::query_as(
        "SELECT stream_id, category, version, event_count, first_recorded_at, last_recorded_at, last_event_type \
         FROM stream_catalog \
         WHERE ($1::text IS NULL OR category = $1) AND ($2::text IS NULL OR stream_id > $2) \
         ORDER BY stream_id LIMIT $3",
    )
    .bind(category)
    .bind(after)
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await
}
