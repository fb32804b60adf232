//! Group commit: concurrent one-stream appends share one transaction.
//!
//! An append on its own pays a round trip each for BEGIN, its statement and COMMIT, plus a WAL
//! flush; with many writers the database spends its time on transactions, not on rows. So an
//! append that writes events to one stream (no guard, no caller inline projection) joins a
//! queue. At most [`GroupCommitPolicy::max_in_flight`] groups commit at once (a leader held up
//! longer than [`MAX_HOLD`] lets the next group start); an append that
//! finds a slot free (or is handed one) leads a group made of itself and what is queued (one
//! append per stream, at most [`MAX_GROUP`]). A leader alone runs the ordinary append path,
//! holding its slot, so that appends arriving meanwhile queue and form the next group. A
//! group is one SERIALIZABLE transaction: one statement moves every head row and inserts every
//! event, then the standing inline projections run per append, then COMMIT.
//!
//! What each append keeps:
//! * All or nothing: the group commits or rolls back as a whole, so each append does too.
//! * An append whose expectation does not hold moves no head row and so inserts no event; it
//!   then takes the ordinary path by itself (which reports the conflict, or recognises a replay
//!   of its own earlier try), while the others commit.
//! * Any failure of the group transaction (a reused event id, a projection error, a lost
//!   connection, serialization failures past [`GROUP_ATTEMPTS`]) sends every member down the
//!   ordinary path by itself. Nothing of the group committed, or, when only the reply to COMMIT
//!   was lost, each member's own run recognises its stored events as a replay.
//! * One append per stream in a group, so a transaction id still tells what one append wrote
//!   to a stream ([`super::EventStore::events_by_id`]). Further appends to a stream of the group
//!   run on their own at once, racing as appends to one stream always did.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;

use sqlx::Row;

use super::{AppendError, AppendOutcome, NoInlineProjection, RecordedEvent, StreamId, StreamWrite};

/// Most appends in one group: bounds the statement's arrays and a failed group's fallout.
pub(crate) const MAX_GROUP: usize = 64;

/// Group transactions tried before the members go their own ways, on serialization failures.
pub(crate) const GROUP_ATTEMPTS: u32 = 3;

/// Longest a leader keeps its slot: an append or group stuck behind a row lock (or retrying)
/// lets the next group go ahead after this, instead of stalling every append of the process.
pub(crate) const MAX_HOLD: Duration = Duration::from_millis(20);

/// Runs `work` holding `slot`, for at most [`MAX_HOLD`]; the slot, if still held, comes back.
async fn holding<T>(slot: Slot, work: impl std::future::Future<Output = T>) -> (T, Option<Slot>) {
    let mut slot = Some(slot);
    tokio::pin!(work);
    let deadline = tokio::time::sleep(MAX_HOLD);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            out = &mut work => return (out, slot),
            () = &mut deadline, if slot.is_some() => slot = None,
        }
    }
}

/// How appends are grouped. The default: one group in flight, no waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupCommitPolicy {
    /// Groups committing at once; 0 turns grouping off (every append on its own). One by
    /// default: concurrent groups would fail each other's SERIALIZABLE checks, and one group
    /// in flight gave the most appends per second at 8 writers (ADR 0018).
    pub max_in_flight: usize,
    /// How long a leader waits for others to queue before it takes its group. Zero by default:
    /// groups form from appends that arrive while earlier groups commit, so a lone writer never
    /// waits.
    pub linger: Duration,
}

impl Default for GroupCommitPolicy {
    fn default() -> Self {
        Self {
            max_in_flight: 1,
            linger: Duration::ZERO,
        }
    }
}

impl GroupCommitPolicy {
    /// Every append on its own.
    pub fn off() -> Self {
        Self {
            max_in_flight: 0,
            linger: Duration::ZERO,
        }
    }
}

/// The queue of appends waiting for a group, shared by a store's clones.
#[derive(Debug)]
pub(crate) struct GroupCommit {
    pub(crate) policy: GroupCommitPolicy,
    queue: Mutex<Queue>,
}

#[derive(Debug, Default)]
struct Queue {
    waiting: VecDeque<Member>,
    in_flight: usize,
}

/// A queued append and where its answer goes.
#[derive(Debug)]
pub(crate) struct Member {
    pub(crate) write: StreamWrite,
    reply: oneshot::Sender<Turn>,
}

impl Member {
    /// Answers the member; a member that stopped waiting is not told.
    pub(crate) fn answer(self, outcome: Option<AppendOutcome>) {
        let _ = self.reply.send(match outcome {
            Some(outcome) => Turn::Done(outcome),
            None => Turn::Alone,
        });
    }
}

/// What a queued append is told.
#[derive(Debug)]
pub(crate) enum Turn {
    /// Committed in a group.
    Done(AppendOutcome),
    /// Not committed: run the ordinary path by yourself.
    Alone,
    /// Lead the next group.
    Lead(Slot),
}

/// The outcome of joining: lead now, or wait for a [`Turn`].
pub(crate) enum Joined {
    Lead(Slot),
    Wait(oneshot::Receiver<Turn>),
}

/// One of the group slots, held by a leader. Dropping it (also when the leader's future is
/// dropped) hands it to the first queued append, or frees it.
#[derive(Debug)]
pub(crate) struct Slot {
    group: Arc<GroupCommit>,
    held: bool,
}

impl GroupCommit {
    pub(crate) fn new(policy: GroupCommitPolicy) -> Arc<Self> {
        Arc::new(Self {
            policy,
            queue: Mutex::default(),
        })
    }

    pub(crate) fn enabled(&self) -> bool {
        self.policy.max_in_flight > 0
    }

    /// Takes a free slot, or queues `write` (the caller keeps its own copy).
    pub(crate) fn join(self: &Arc<Self>, write: StreamWrite) -> Joined {
        let mut queue = self.queue.lock().expect("not poisoned");
        if queue.in_flight < self.policy.max_in_flight {
            queue.in_flight += 1;
            return Joined::Lead(Slot {
                group: self.clone(),
                held: true,
            });
        }
        let (reply, rx) = oneshot::channel();
        queue.waiting.push_back(Member { write, reply });
        Joined::Wait(rx)
    }
}

impl Slot {
    /// The queued appends that join the leader's group: the first of each stream other than
    /// `own`, in queue order, at most [`MAX_GROUP`] with the leader. Later appends to a stream
    /// of the group are sent off to run on their own; past [`MAX_GROUP`], appends stay queued.
    pub(crate) fn take_members(&self, own: &StreamId) -> Vec<Member> {
        let mut queue = self.group.queue.lock().expect("not poisoned");
        let mut streams = HashSet::from([own.clone()]);
        let mut members = Vec::new();
        let mut kept = VecDeque::new();
        while let Some(member) = queue.waiting.pop_front() {
            if members.len() + 1 >= MAX_GROUP {
                kept.push_back(member);
            } else if streams.insert(member.write.stream.clone()) {
                members.push(member);
            } else {
                // Another append to a stream of this group: it races on its own, as appends
                // to one stream always did, instead of waiting for a group of its own.
                member.answer(None);
            }
        }
        queue.waiting = kept;
        members
    }

    pub(crate) fn linger(&self) -> Duration {
        self.group.policy.linger
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        let mut queue = self.group.queue.lock().expect("not poisoned");
        while let Some(next) = queue.waiting.pop_front() {
            let slot = Slot {
                group: self.group.clone(),
                held: true,
            };
            match next.reply.send(Turn::Lead(slot)) {
                Ok(()) => return,
                // That append stopped waiting: its slot goes back unheld, to the next one.
                Err(Turn::Lead(mut slot)) => slot.held = false,
                Err(_) => unreachable!("a Lead was sent"),
            }
        }
        queue.in_flight -= 1;
    }
}

/// Moves every write's head row (each by its own expectation) and inserts every event, in one
/// statement. A write whose expectation does not hold gets no head row and so no events.
const GROUP_APPEND: &str = "\
WITH w AS (
    SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS w(stream_id, expected, n)
), created AS (
    INSERT INTO streams (stream_id, version)
    SELECT stream_id, n FROM w WHERE expected = 0
    ON CONFLICT (stream_id) DO NOTHING
    RETURNING stream_id, version
), moved AS (
    UPDATE streams s SET version = s.version + w.n, updated_at = now()
    FROM w WHERE s.stream_id = w.stream_id AND w.expected > 0 AND s.version = w.expected
    RETURNING s.stream_id, s.version
), upserted AS (
    INSERT INTO streams (stream_id, version)
    SELECT stream_id, n FROM w WHERE expected IS NULL
    ON CONFLICT (stream_id) DO UPDATE
      SET version = streams.version + EXCLUDED.version, updated_at = now()
    RETURNING stream_id, version
), heads AS (
    SELECT h.stream_id, h.version - w.n AS base
    FROM (SELECT * FROM created UNION ALL SELECT * FROM moved UNION ALL SELECT * FROM upserted) h
    JOIN w USING (stream_id)
)
INSERT INTO events (stream_id, version, event_id, type, data, metadata)
SELECT e.stream_id, heads.base + e.ord, e.event_id, e.type, e.data, e.metadata
FROM unnest($4::text[], $5::bigint[], $6::uuid[], $7::text[], $8::jsonb[], $9::jsonb[])
    WITH ORDINALITY AS e(stream_id, ord, event_id, type, data, metadata, idx)
JOIN heads USING (stream_id)
ORDER BY e.idx
RETURNING stream_id, position, version, recorded_at, tx_id::text AS tx_id";

/// Where one event landed: version, position, recorded_at, transaction id.
type Landed = (u64, u64, chrono::DateTime<chrono::Utc>, u64);

impl super::EventStore {
    /// Appends `write` in a group when others are appending at the same time; on its own
    /// otherwise. See the module docs.
    pub(crate) async fn append_grouped(
        &self,
        write: &StreamWrite,
    ) -> Result<AppendOutcome, AppendError> {
        let slot = match self.group.join(write.clone()) {
            Joined::Lead(slot) => slot,
            Joined::Wait(turn) => match turn.await {
                Ok(Turn::Done(outcome)) => return self.answer_committed(write, outcome),
                Ok(Turn::Lead(slot)) => slot,
                // Not committed in a group (or the leader vanished mid-group: then a replay is
                // recognised by the ordinary path).
                Ok(Turn::Alone) | Err(_) => {
                    return self
                        .append_alone(std::slice::from_ref(write), &NoInlineProjection)
                        .await
                }
            },
        };
        if slot.linger().is_zero() {
            // Lets appends that are ready to run (often the previous group's writers, with
            // their next append) queue before the group is taken.
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(slot.linger()).await;
        }
        let members = slot.take_members(&write.stream);
        if members.is_empty() {
            // Alone, but still holding the slot: appends arriving meanwhile queue up and form
            // the next group.
            return holding(
                slot,
                self.append_alone(std::slice::from_ref(write), &NoInlineProjection),
            )
            .await
            .0;
        }
        let writes: Vec<&StreamWrite> = std::iter::once(write)
            .chain(members.iter().map(|m| &m.write))
            .collect();
        let (outcomes, slot) = holding(slot, self.commit_group(&writes)).await;
        let mut outcomes = outcomes.into_iter();
        let own = outcomes.next().flatten();
        for (member, outcome) in members.into_iter().zip(outcomes) {
            member.answer(outcome);
        }
        drop(slot);
        match own {
            Some(outcome) => self.answer_committed(write, outcome),
            None => {
                self.append_alone(std::slice::from_ref(write), &NoInlineProjection)
                    .await
            }
        }
    }

    /// The answer to an append committed in a group (or a test's lost reply).
    fn answer_committed(
        &self,
        write: &StreamWrite,
        outcome: AppendOutcome,
    ) -> Result<AppendOutcome, AppendError> {
        match self.faults.lost_reply(std::slice::from_ref(write)) {
            Some(lost) => Err(lost),
            None => Ok(outcome),
        }
    }

    /// Commits `writes` as one group: per write, its outcome, or `None` when it was not
    /// committed (its expectation failed, or the whole group did).
    async fn commit_group(&self, writes: &[&StreamWrite]) -> Vec<Option<AppendOutcome>> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.group_attempt(writes, attempt).await {
                Ok(outcomes) => {
                    tracing::debug!(
                        size = writes.len(),
                        committed = outcomes.iter().filter(|o| o.is_some()).count(),
                        "group committed"
                    );
                    if outcomes.iter().any(Option::is_some) {
                        let committed = writes.iter().zip(&outcomes).filter(|(_, o)| o.is_some());
                        self.notifier
                            .appended(&self.pool, committed.map(|(w, _)| w.stream.as_str()));
                    }
                    return outcomes;
                }
                Err(err) if super::is_serialization_failure(&err) && attempt < GROUP_ATTEMPTS => {
                    tokio::time::sleep(self.retry.backoff(attempt)).await;
                }
                Err(err) => {
                    tracing::debug!(error = %err, size = writes.len(), "group commit failed; its appends run on their own");
                    return vec![None; writes.len()];
                }
            }
        }
    }

    async fn group_attempt(
        &self,
        writes: &[&StreamWrite],
        attempt: u32,
    ) -> Result<Vec<Option<AppendOutcome>>, sqlx::Error> {
        let mut streams = Vec::with_capacity(writes.len());
        let mut expected = Vec::with_capacity(writes.len());
        let mut counts = Vec::with_capacity(writes.len());
        let mut event_streams = Vec::new();
        let mut ords = Vec::new();
        let mut ids = Vec::new();
        let mut types = Vec::new();
        let mut datas = Vec::new();
        let mut metadatas = Vec::new();
        for write in writes {
            streams.push(write.stream.as_str());
            expected.push(write.expected.pinned().map(super::store::to_i64));
            counts.push(write.events.len() as i64);
            for (i, event) in write.events.iter().enumerate() {
                event_streams.push(write.stream.as_str());
                ords.push(i as i64 + 1);
                ids.push(event.event_id);
                types.push(event.event_type.as_str());
                datas.push(&event.data);
                metadatas.push(
                    serde_json::to_value(&event.metadata)
                        .expect("metadata is plain data and always serializes"),
                );
            }
        }
        let mut tx = self
            .pool
            .begin_with("BEGIN ISOLATION LEVEL SERIALIZABLE")
            .await?;
        let rows = sqlx::query(GROUP_APPEND)
            .bind(&streams)
            .bind(&expected)
            .bind(&counts)
            .bind(&event_streams)
            .bind(&ords)
            .bind(&ids)
            .bind(&types)
            .bind(&datas)
            .bind(&metadatas)
            .fetch_all(&mut *tx)
            .await?;
        // Where each stream's events landed; the payloads are the write's own, in order.
        let mut stored: HashMap<String, Vec<Landed>> = HashMap::new();
        for row in &rows {
            let tx_id: String = row.try_get("tx_id")?;
            stored.entry(row.try_get("stream_id")?).or_default().push((
                row.try_get::<i64, _>("version")? as u64,
                row.try_get::<i64, _>("position")? as u64,
                row.try_get("recorded_at")?,
                tx_id.parse().expect("xid8 renders as an unsigned integer"),
            ));
        }
        let mut outcomes = Vec::with_capacity(writes.len());
        for write in writes {
            let Some(mut rows) = stored.remove(write.stream.as_str()) else {
                outcomes.push(None);
                continue;
            };
            rows.sort_unstable_by_key(|r| r.0);
            let recorded: Vec<RecordedEvent> = rows
                .into_iter()
                .zip(&write.events)
                .map(
                    |((version, position, recorded_at, tx_id), event)| RecordedEvent {
                        position,
                        stream_id: write.stream.clone(),
                        version,
                        event_id: event.event_id,
                        event_type: event.event_type.clone(),
                        data: event.data.clone(),
                        metadata: event.metadata.clone(),
                        recorded_at,
                        tx_id,
                    },
                )
                .collect();
            for standing in self.standing.iter() {
                standing.apply(&mut tx, &recorded).await?;
            }
            let version = recorded.last().map_or(0, |e| e.version);
            outcomes.push(Some(AppendOutcome {
                events: recorded,
                versions: [(write.stream.clone(), version)].into(),
                replay: false,
                attempts: attempt,
            }));
        }
        tx.commit().await?;
        Ok(outcomes)
    }
}
