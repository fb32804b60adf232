//! Appending: all writes of one call in one SERIALIZABLE transaction, each stream's version
//! compare-and-set on its head row, retried on serialization failures, idempotent on event ids.
//!
//! Flow of one attempt:
//! 1. `BEGIN ISOLATION LEVEL SERIALIZABLE`.
//! 2. For each write, in stream-id order (so concurrent multi-stream appends lock head rows in
//!    the same order), one statement: a guard reads the head row `FOR SHARE`; a write with
//!    events moves the head row with a compare-and-set (`UPDATE … WHERE version = expected`, or
//!    an insert for a new stream) and, in the same statement, inserts its events at the versions
//!    after the old head. No row back is a version conflict. The event insert has no
//!    `ON CONFLICT`: a duplicate must fail loudly, never be dropped silently.
//! 3. The standing inline projections (see [`EventStore::with_standing_projections`]) and the caller's, then `COMMIT`; after it, a NOTIFY for feed subscribers.
//!
//! A serialization failure re-runs the attempt (bounded, with jittered backoff), unless a fresh
//! read shows a stream has moved past the expectation, which no re-run can fix.
//! A version conflict or a duplicate event id then asks: are all of this append's event ids
//! already stored exactly as this append would store them (same streams, types and payloads, in
//! the same order, by one transaction)? If so, an earlier try of this very append committed and
//! its reply was lost: answer success, marked as a replay. A multi-stream append is no different
//! from a one-stream one here.

use std::collections::{BTreeMap, HashSet};

use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::error::{is_serialization_failure, violated_constraint};
use super::inline::{InlineProjection, NoInlineProjection};
use super::store::{event_from_row, to_i64, EVENT_COLUMNS};
use super::{AppendError, EventStore, ExpectedVersion, RecordedEvent, StreamId, StreamWrite};

/// What a successful append did.
#[derive(Debug, Clone, PartialEq)]
pub struct AppendOutcome {
    /// The events as recorded, in the order given. For a replay, as recorded the first time.
    pub events: Vec<RecordedEvent>,
    /// Each written or guarded stream's version after the append.
    pub versions: BTreeMap<StreamId, u64>,
    /// The events were already stored by an earlier try of this same append; nothing new was
    /// written.
    pub replay: bool,
    /// Transactions it took (serialization failures are retried).
    pub attempts: u32,
}

impl AppendOutcome {
    /// `stream`'s version after the append.
    pub fn version(&self, stream: &StreamId) -> Option<u64> {
        self.versions.get(stream).copied()
    }
}

/// Why one attempt did not commit.
enum AttemptError {
    Conflict {
        stream: StreamId,
        expected: ExpectedVersion,
    },
    /// An event id of this append is already stored (`events_event_id_key`).
    EventIdTaken,
    Refused(super::AdmissionRefused),
    Database(sqlx::Error),
}

impl From<sqlx::Error> for AttemptError {
    fn from(err: sqlx::Error) -> Self {
        if let Some(refused) = super::AdmissionRefused::found_in(&err) {
            Self::Refused(refused.clone())
        } else if violated_constraint(&err) == Some("events_event_id_key") {
            Self::EventIdTaken
        } else {
            Self::Database(err)
        }
    }
}

impl EventStore {
    /// Appends `writes` atomically: every stream's expectation holds and all events are stored,
    /// or nothing is. See the module docs for how.
    /// A one-stream append may commit in one transaction with concurrent appends to other
    /// streams (group commit, `group_commit.rs`), with the same guarantees.
    pub async fn append(&self, writes: Vec<StreamWrite>) -> Result<AppendOutcome, AppendError> {
        self.append_observed(writes, &NoInlineProjection, true)
            .await
    }

    /// [`Self::append`], running `inline` in the same transaction after the events are inserted
    /// (and again on every retry).
    pub async fn append_with(
        &self,
        writes: Vec<StreamWrite>,
        inline: &(dyn InlineProjection + '_),
    ) -> Result<AppendOutcome, AppendError> {
        self.append_observed(writes, inline, false).await
    }

    /// [`Self::append`], or with `admission` run in the same transaction when there is one.
    pub async fn append_admitted(
        &self,
        writes: Vec<StreamWrite>,
        admission: Option<&super::AdmissionCheck>,
    ) -> Result<AppendOutcome, AppendError> {
        match admission {
            Some(check) => self.append_with(writes, check.0.as_ref()).await,
            None => self.append(writes).await,
        }
    }

    /// An append, traced and counted. `groupable`: the caller has no inline projection of its
    /// own, so a one-stream append may join a commit group.
    #[tracing::instrument(
        name = "events.append",
        skip_all,
        fields(
            streams = %writes.iter().map(|w| w.stream.as_str()).collect::<Vec<_>>().join(","),
            event_count = writes.iter().map(|w| w.events.len()).sum::<usize>(),
            outcome = tracing::field::Empty,
            attempts = tracing::field::Empty,
        )
    )]
    async fn append_observed(
        &self,
        writes: Vec<StreamWrite>,
        inline: &(dyn InlineProjection + '_),
        groupable: bool,
    ) -> Result<AppendOutcome, AppendError> {
        let started = std::time::Instant::now();
        let result = self.append_inner(&writes, inline, groupable).await;
        let span = tracing::Span::current();
        let outcome = match &result {
            Ok(o) if o.replay => "replay",
            Ok(_) => "appended",
            Err(AppendError::VersionConflict { .. }) => "version_conflict",
            Err(AppendError::EventIdsReused { .. }) => "event_ids_reused",
            Err(AppendError::Invalid(_)) => "invalid",
            Err(AppendError::Refused(_)) => "refused",
            Err(AppendError::SerializationRetriesExhausted { .. }) => "retries_exhausted",
            Err(AppendError::Database(_)) => "database_error",
        };
        span.record("outcome", outcome);
        crate::metrics::event_append(
            outcome,
            writes.iter().map(|w| w.events.len()).sum(),
            result.as_ref().map_or(1, |o| o.attempts),
            started.elapsed(),
        );
        if let Ok(o) = &result {
            span.record("attempts", o.attempts);
        }
        result
    }

    async fn append_inner(
        &self,
        writes: &[StreamWrite],
        inline: &(dyn InlineProjection + '_),
        groupable: bool,
    ) -> Result<AppendOutcome, AppendError> {
        validate(writes)?;
        match writes {
            [write] if groupable && !write.is_guard() && self.group.enabled() => {
                self.append_grouped(write).await
            }
            _ => self.append_alone(writes, inline).await,
        }
    }

    /// An append in a transaction of its own: attempts until it commits, conflicts, or the
    /// serialization-failure budget runs out.
    pub(crate) async fn append_alone(
        &self,
        writes: &[StreamWrite],
        inline: &(dyn InlineProjection + '_),
    ) -> Result<AppendOutcome, AppendError> {
        let max_attempts = self.retry.max_attempts.max(1);
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.attempt(writes, inline).await {
                Ok(mut outcome) => {
                    outcome.attempts = attempt;
                    if !outcome.events.is_empty() {
                        self.notifier
                            .appended(&self.pool, writes.iter().map(|w| w.stream.as_str()));
                    }
                    if let Some(lost) = self.faults.lost_reply(writes) {
                        return Err(lost);
                    }
                    return Ok(outcome);
                }
                Err(AttemptError::Conflict { stream, expected }) => {
                    return self
                        .conflict_or_replay(writes, stream, expected, attempt)
                        .await;
                }
                Err(AttemptError::EventIdTaken) => {
                    if let Some(outcome) = self.replayed(writes, attempt).await? {
                        return Ok(outcome);
                    }
                    // `replayed` found none of the ids: the holder of the id rolled back between
                    // our insert and our check. Run the append again.
                    if attempt >= max_attempts {
                        return Err(AppendError::Invalid(
                            "event ids kept colliding with concurrent appends that rolled back"
                                .into(),
                        ));
                    }
                }
                Err(AttemptError::Database(err)) if is_serialization_failure(&err) => {
                    // Most often we lost a race for a head row (a concurrent writer moved it
                    // while we waited for its lock): then another attempt can only conflict,
                    // so answer the conflict now instead of backing off.
                    if let Some((stream, expected)) = self.moved_stream(writes).await? {
                        return self
                            .conflict_or_replay(writes, stream, expected, attempt)
                            .await;
                    }
                    if attempt >= max_attempts {
                        return Err(AppendError::SerializationRetriesExhausted {
                            attempts: attempt,
                            last: err,
                        });
                    }
                    tracing::debug!(attempt, error = %err, "append serialization failure; retrying");
                    tokio::time::sleep(self.retry.backoff(attempt)).await;
                }
                Err(AttemptError::Refused(refused)) => return Err(AppendError::Refused(refused)),
                Err(AttemptError::Database(err)) => return Err(AppendError::Database(err)),
            }
        }
    }

    async fn attempt(
        &self,
        writes: &[StreamWrite],
        inline: &(dyn InlineProjection + '_),
    ) -> Result<AppendOutcome, AttemptError> {
        let mut tx = self
            .pool
            .begin_with("BEGIN ISOLATION LEVEL SERIALIZABLE")
            .await?;
        // Stream-id order, so that concurrent multi-stream appends lock head rows in one order.
        let mut order: Vec<usize> = (0..writes.len()).collect();
        order.sort_by(|&a, &b| writes[a].stream.cmp(&writes[b].stream));
        let mut stored: Vec<Vec<Stored>> = vec![Vec::new(); writes.len()];
        let mut before = vec![0u64; writes.len()];
        for i in order {
            let write = &writes[i];
            if write.is_guard() {
                before[i] = check_guard(&mut tx, write).await?;
            } else {
                stored[i] = move_head_and_insert(&mut tx, write).await?;
                before[i] = stored[i][0].version - 1;
            }
        }
        let recorded: Vec<RecordedEvent> = writes
            .iter()
            .zip(stored)
            .flat_map(|(write, rows)| {
                write
                    .events
                    .iter()
                    .zip(rows)
                    .map(|(event, row)| RecordedEvent {
                        position: row.position,
                        stream_id: write.stream.clone(),
                        version: row.version,
                        event_id: event.event_id,
                        event_type: event.event_type.clone(),
                        data: event.data.clone(),
                        metadata: event.metadata.clone(),
                        recorded_at: row.recorded_at,
                        tx_id: row.tx_id,
                    })
            })
            .collect();

        for standing in self.standing.iter() {
            standing.apply(&mut tx, &recorded).await?;
        }
        inline.apply(&mut tx, &recorded).await?;
        tx.commit().await?;

        let versions = writes
            .iter()
            .zip(&before)
            .map(|(w, &base)| (w.stream.clone(), base + w.events.len() as u64))
            .collect();
        Ok(AppendOutcome {
            events: recorded,
            versions,
            replay: false,
            attempts: 0,
        })
    }

    /// The first write whose stream is no longer where the write expects it (read fresh,
    /// outside any transaction), if any.
    async fn moved_stream(
        &self,
        writes: &[StreamWrite],
    ) -> Result<Option<(StreamId, ExpectedVersion)>, AppendError> {
        let pinned: Vec<&StreamWrite> = writes
            .iter()
            .filter(|w| w.expected.pinned().is_some())
            .collect();
        if pinned.is_empty() {
            return Ok(None);
        }
        let ids: Vec<&str> = pinned.iter().map(|w| w.stream.as_str()).collect();
        let versions: Vec<Option<i64>> = sqlx::query_scalar(
            "SELECT s.version FROM unnest($1::text[]) WITH ORDINALITY AS w(stream_id, ord) \
             LEFT JOIN streams s USING (stream_id) ORDER BY w.ord",
        )
        .bind(&ids)
        .fetch_all(&self.pool)
        .await?;
        Ok(pinned.iter().zip(versions).find_map(|(w, v)| {
            (!w.expected.admits(v.map_or(0, |v| v as u64))).then(|| (w.stream.clone(), w.expected))
        }))
    }

    /// After a conflict: the stream's actual version, unless this append turns out to be a
    /// replay (then its outcome). One round trip in the common case of a plain conflict.
    async fn conflict_or_replay(
        &self,
        writes: &[StreamWrite],
        stream: StreamId,
        expected: ExpectedVersion,
        attempts: u32,
    ) -> Result<AppendOutcome, AppendError> {
        let ids: Vec<Uuid> = writes
            .iter()
            .flat_map(|w| w.events.iter().map(|e| e.event_id))
            .collect();
        let row = sqlx::query(
            "SELECT (SELECT version FROM streams WHERE stream_id = $1) AS actual, \
                    EXISTS (SELECT 1 FROM events WHERE event_id = ANY($2)) AS any_stored",
        )
        .bind(stream.as_str())
        .bind(&ids)
        .fetch_one(&self.pool)
        .await?;
        if row.try_get::<bool, _>("any_stored")? {
            if let Some(outcome) = self.replayed(writes, attempts).await? {
                return Ok(outcome);
            }
        }
        let actual = row
            .try_get::<Option<i64>, _>("actual")?
            .map_or(0, |v| v as u64);
        Err(AppendError::VersionConflict {
            stream,
            expected,
            actual,
        })
    }

    /// If every event id of `writes` is stored exactly as this append would write it, the
    /// outcome of that earlier append: each id on the same stream with the same type and payload
    /// (jsonb equality), each write's events at consecutive versions in the order given, all of
    /// them committed by one transaction. None stored: `None`. Anything in between (some stored,
    /// other content, another order, several appends) is [`AppendError::EventIdsReused`].
    async fn replayed(
        &self,
        writes: &[StreamWrite],
        attempts: u32,
    ) -> Result<Option<AppendOutcome>, AppendError> {
        let mut ids = Vec::new();
        let mut streams = Vec::new();
        let mut types = Vec::new();
        let mut datas = Vec::new();
        for write in writes {
            for event in &write.events {
                ids.push(event.event_id);
                streams.push(write.stream.as_str().to_owned());
                types.push(event.event_type.clone());
                datas.push(event.data.clone());
            }
        }
        if ids.is_empty() {
            return Ok(None);
        }
        // jsonb equality, not serde_json's: the database's normal form decides.
        let rows = sqlx::query(
            "SELECT n.event_id, e.event_id IS NOT NULL AS stored, \
                    coalesce(e.stream_id = n.stream_id AND e.type = n.type AND e.data = n.data, false) AS same \
             FROM unnest($1::uuid[], $2::text[], $3::text[], $4::jsonb[]) AS n(event_id, stream_id, type, data) \
             LEFT JOIN events e ON e.event_id = n.event_id",
        )
        .bind(&ids)
        .bind(&streams)
        .bind(&types)
        .bind(&datas)
        .fetch_all(&self.pool)
        .await?;
        let mut missing = Vec::new();
        let mut mismatched = Vec::new();
        for row in &rows {
            let id: Uuid = row.try_get("event_id")?;
            if !row.try_get::<bool, _>("stored")? {
                missing.push(id);
            } else if !row.try_get::<bool, _>("same")? {
                mismatched.push(id);
            }
        }
        if missing.len() == ids.len() {
            return Ok(None);
        }
        if !missing.is_empty() || !mismatched.is_empty() {
            return Err(AppendError::EventIdsReused {
                mismatched,
                missing,
            });
        }
        let rows = sqlx::query(&format!(
            "SELECT {EVENT_COLUMNS} FROM events WHERE event_id = ANY($1)"
        ))
        .bind(&ids)
        .fetch_all(&self.pool)
        .await?;
        let mut by_id: BTreeMap<Uuid, RecordedEvent> = rows
            .iter()
            .map(|r| event_from_row(r).map(|e| (e.event_id, e)))
            .collect::<Result<_, _>>()
            .map_err(|e| match e {
                super::ReadError::Database(db) => AppendError::Database(db),
                other => AppendError::Invalid(other.to_string()),
            })?;
        let events: Vec<RecordedEvent> = ids
            .iter()
            .map(|id| by_id.remove(id).expect("every id was found stored above"))
            .collect();
        let misplaced = misplaced(writes, &events);
        if !misplaced.is_empty() {
            return Err(AppendError::EventIdsReused {
                mismatched: misplaced,
                missing: Vec::new(),
            });
        }
        let mut versions = BTreeMap::new();
        for write in writes {
            let version = events
                .iter()
                .filter(|e| e.stream_id == write.stream)
                .map(|e| e.version)
                .max()
                .or(write.expected.pinned())
                .unwrap_or(0);
            versions.insert(write.stream.clone(), version);
        }
        Ok(Some(AppendOutcome {
            events,
            versions,
            replay: true,
            attempts,
        }))
    }
}

/// The ids among `stored` (this append's events as stored, in the order `writes` gives them)
/// that one commit of this append would not have stored where they are: a write's events not at
/// consecutive versions in the order given, or events of another transaction than the first.
fn misplaced(writes: &[StreamWrite], stored: &[RecordedEvent]) -> Vec<Uuid> {
    let tx_id = stored.first().map(|e| e.tx_id);
    let mut misplaced = Vec::new();
    let mut stored = stored.iter();
    for write in writes {
        let mut previous: Option<u64> = None;
        for event in stored.by_ref().take(write.events.len()) {
            let in_order = previous.is_none_or(|v| event.version == v + 1);
            if !in_order || Some(event.tx_id) != tx_id {
                misplaced.push(event.event_id);
            }
            previous = Some(event.version);
        }
    }
    misplaced
}

/// One stored event, as `INSERT … RETURNING` reports it.
#[derive(Debug, Clone)]
struct Stored {
    position: u64,
    version: u64,
    recorded_at: chrono::DateTime<chrono::Utc>,
    tx_id: u64,
}

/// A guard: the stream must be at the expected version. `FOR SHARE` blocks a concurrent writer
/// of this stream until we finish (under SERIALIZABLE it then fails), so the checked version
/// holds until COMMIT. An absent row is covered by the serializable predicate lock of this read.
/// Returns the version.
async fn check_guard(conn: &mut PgConnection, write: &StreamWrite) -> Result<u64, AttemptError> {
    let version: Option<i64> =
        sqlx::query_scalar("SELECT version FROM streams WHERE stream_id = $1 FOR SHARE")
            .bind(write.stream.as_str())
            .fetch_optional(&mut *conn)
            .await?;
    let actual = version.map_or(0, |v| v as u64);
    if write.expected.admits(actual) {
        Ok(actual)
    } else {
        Err(AttemptError::Conflict {
            stream: write.stream.clone(),
            expected: write.expected,
        })
    }
}

/// Moves the stream's head row past the write's events, with a compare-and-set two
/// transactions cannot both pass, and inserts the events at the versions after the old head,
/// in one statement. No row back means the expectation did not hold.
async fn move_head_and_insert(
    conn: &mut PgConnection,
    write: &StreamWrite,
) -> Result<Vec<Stored>, AttemptError> {
    let head = match write.expected.pinned() {
        // ON CONFLICT on the head row only: an existing stream is a conflict, reported.
        Some(0) => {
            "INSERT INTO streams (stream_id, version) VALUES ($1, $3) \
             ON CONFLICT (stream_id) DO NOTHING RETURNING 0::bigint AS base"
        }
        Some(_) => {
            "UPDATE streams SET version = version + $3, updated_at = now() \
             WHERE stream_id = $1 AND version = $2 RETURNING version - $3 AS base"
        }
        None => {
            "INSERT INTO streams (stream_id, version) VALUES ($1, $3) \
             ON CONFLICT (stream_id) DO UPDATE \
               SET version = streams.version + EXCLUDED.version, updated_at = now() \
             RETURNING version - $3 AS base"
        }
    };
    let mut event_ids = Vec::with_capacity(write.events.len());
    let mut types = Vec::with_capacity(write.events.len());
    let mut datas = Vec::with_capacity(write.events.len());
    let mut metadatas = Vec::with_capacity(write.events.len());
    for event in &write.events {
        event_ids.push(event.event_id);
        types.push(event.event_type.as_str());
        datas.push(&event.data);
        metadatas.push(
            serde_json::to_value(&event.metadata)
                .expect("metadata is plain data and always serializes"),
        );
    }
    let rows = sqlx::query(&format!(
        "WITH head AS ({head}) \
         INSERT INTO events (stream_id, version, event_id, type, data, metadata) \
         SELECT $1, head.base + e.ord, e.event_id, e.type, e.data, e.metadata \
         FROM head, unnest($4::uuid[], $5::text[], $6::jsonb[], $7::jsonb[]) \
           WITH ORDINALITY AS e(event_id, type, data, metadata, ord) \
         ORDER BY e.ord \
         RETURNING position, version, recorded_at, tx_id::text AS tx_id"
    ))
    .bind(write.stream.as_str())
    .bind(write.expected.pinned().map(to_i64))
    .bind(write.events.len() as i64)
    .bind(&event_ids)
    .bind(&types)
    .bind(&datas)
    .bind(&metadatas)
    .fetch_all(&mut *conn)
    .await?;
    if rows.is_empty() {
        return Err(AttemptError::Conflict {
            stream: write.stream.clone(),
            expected: write.expected,
        });
    }
    let mut stored = rows
        .iter()
        .map(|r| {
            let tx_id: String = r.try_get("tx_id")?;
            Ok(Stored {
                position: r.try_get::<i64, _>("position")? as u64,
                version: r.try_get::<i64, _>("version")? as u64,
                recorded_at: r.try_get("recorded_at")?,
                tx_id: tx_id.parse().expect("xid8 renders as an unsigned integer"),
            })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
    stored.sort_by_key(|s| s.version);
    Ok(stored)
}

fn validate(writes: &[StreamWrite]) -> Result<(), AppendError> {
    if writes.is_empty() {
        return Err(AppendError::Invalid(
            "an append needs at least one write".into(),
        ));
    }
    let mut streams = HashSet::new();
    let mut ids = HashSet::new();
    for write in writes {
        if !streams.insert(&write.stream) {
            return Err(AppendError::Invalid(format!(
                "stream {} appears twice; put all its events in one write",
                write.stream
            )));
        }
        if write.is_guard() && write.expected == ExpectedVersion::Any {
            return Err(AppendError::Invalid(format!(
                "the guard on {} expects any version, which checks nothing",
                write.stream
            )));
        }
        for event in &write.events {
            if !ids.insert(event.event_id) {
                return Err(AppendError::Invalid(format!(
                    "event id {} appears twice in one append",
                    event.event_id
                )));
            }
            if event.event_type.is_empty() {
                return Err(AppendError::Invalid(format!(
                    "event {} has an empty type",
                    event.event_id
                )));
            }
        }
    }
    Ok(())
}
