//! The global feed never passes a transaction still in flight, returns every committed event
//! exactly once in (tx_id, position) order, and resumes from a checkpoint after a restart.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::PgConnection;
use strata::events::{
    Actor, ActorRole, ExpectedVersion, FeedPosition, InlineProjection, Metadata, NewEvent,
    RecordedEvent, StreamId, StreamWrite,
};
use tokio::sync::{mpsc, Notify};
use uuid::Uuid;

fn event(event_type: &str) -> NewEvent {
    NewEvent {
        event_id: Uuid::now_v7(),
        event_type: event_type.into(),
        data: serde_json::json!({}),
        metadata: Metadata::new(Actor::new(ActorRole::Cli, "test-node")),
    }
}

fn write(stream: &str, event_type: &str) -> StreamWrite {
    StreamWrite::new(
        StreamId::parse(stream).unwrap(),
        ExpectedVersion::Any,
        vec![event(event_type)],
    )
}

/// Holds the append's transaction open after its events are inserted, until released.
struct HoldOpen {
    inserted: mpsc::UnboundedSender<()>,
    release: Arc<Notify>,
}

#[async_trait]
impl InlineProjection for HoldOpen {
    async fn apply(&self, _: &mut PgConnection, _: &[RecordedEvent]) -> Result<(), sqlx::Error> {
        self.inserted.send(()).unwrap();
        self.release.notified().await;
        Ok(())
    }
}

/// Waits (bounded) until the feed shows `n` events from the start.
async fn wait_visible(store: &strata::events::EventStore, n: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while store
        .read_feed(FeedPosition::START, 100)
        .await
        .unwrap()
        .len()
        < n
    {
        assert!(
            std::time::Instant::now() < deadline,
            "{n} committed events never passed the feed horizon"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn types(events: &[RecordedEvent]) -> Vec<&str> {
    events.iter().map(|e| e.event_type.as_str()).collect()
}

#[tokio::test]
async fn the_feed_waits_for_transactions_in_flight_and_never_skips_them() {
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    store.append(vec![write("feed-0", "E0.v1")]).await.unwrap();
    // The horizon is cluster-wide: a transaction of another test on the shared server may hold
    // it for a moment. Start once E0 is past it.
    wait_visible(&store, 1).await;

    // T1 inserts its event and stays open.
    let (inserted_tx, mut inserted) = mpsc::unbounded_channel();
    let release = Arc::new(Notify::new());
    let t1 = {
        let store = store.clone();
        let hold = HoldOpen {
            inserted: inserted_tx,
            release: release.clone(),
        };
        tokio::spawn(async move {
            store
                .append_with(vec![write("feed-1", "E1.v1")], &hold)
                .await
        })
    };
    inserted.recv().await.unwrap();

    // T2 appends after it and commits first.
    let t2 = store.append(vec![write("feed-2", "E2.v1")]).await.unwrap();
    let t2_event = &t2.events[0];

    // A position-only reader would now return E2 and move past T1's event forever. The feed
    // returns nothing past T1.
    let now = store.read_feed(FeedPosition::START, 100).await.unwrap();
    assert_eq!(types(&now), vec!["E0.v1"]);
    let after_e0 = now[0].feed_position();
    assert!(store.read_feed(after_e0, 100).await.unwrap().is_empty());

    // A subscriber reads E0, checkpoints and "restarts"; nothing more arrives while T1 is open.
    let mut sub = store
        .subscribe(FeedPosition::START, Duration::from_millis(20))
        .await
        .unwrap();
    assert_eq!(types(&sub.next_batch().await.unwrap()), vec!["E0.v1"]);
    let checkpoint = sub.position();
    assert_eq!(checkpoint, after_e0);
    drop(sub);
    let mut sub = store
        .subscribe(checkpoint, Duration::from_millis(20))
        .await
        .unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), sub.next_batch())
            .await
            .is_err(),
        "nothing is delivered past an open transaction"
    );
    drop(sub);

    // T1 commits: both events arrive, T1's first (it is the older transaction), exactly once.
    release.notify_one();
    let t1 = t1.await.unwrap().unwrap();
    let t1_event = &t1.events[0];
    assert!(t1_event.position < t2_event.position);
    assert!(t1_event.tx_id < t2_event.tx_id);
    let mut sub = store
        .subscribe(checkpoint, Duration::from_millis(20))
        .await
        .unwrap()
        .with_batch_size(1);
    let mut got = Vec::new();
    while got.len() < 2 {
        got.extend(
            tokio::time::timeout(Duration::from_secs(10), sub.next_batch())
                .await
                .expect("the committed events arrive")
                .unwrap(),
        );
    }
    assert_eq!(types(&got), vec!["E1.v1", "E2.v1"]);
    assert_eq!(got[0].event_id, t1_event.event_id);
    assert_eq!(got[1].event_id, t2_event.event_id);
    let checkpoint = sub.position();
    assert_eq!(checkpoint, t2_event.feed_position());
    drop(sub);

    // Restart from the checkpoint: only what comes after, woken by NOTIFY (the poll interval is
    // an hour, so only the notification can wake it in time).
    let mut sub = store
        .subscribe(checkpoint, Duration::from_secs(3600))
        .await
        .unwrap();
    let waiting = tokio::spawn(async move { sub.next_batch().await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    store.append(vec![write("feed-3", "E3.v1")]).await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("NOTIFY wakes the subscriber")
        .unwrap()
        .unwrap();
    assert_eq!(types(&next), vec!["E3.v1"]);

    // The whole feed, once more from the start: every event exactly once, in commit-safe order.
    let all = store.read_feed(FeedPosition::START, 100).await.unwrap();
    assert_eq!(types(&all), vec!["E0.v1", "E1.v1", "E2.v1", "E3.v1"]);
}

#[tokio::test]
async fn feed_pages_cover_many_concurrent_appends_exactly_once() {
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 0..25 {
                    store
                        .append(vec![write(&format!("page-{w}"), &format!("E{i}.v1"))])
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    // Read concurrently with the writers, in small pages, as a subscriber would.
    let mut seen = Vec::new();
    let mut cursor = FeedPosition::START;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while seen.len() < 200 {
        let page = store.read_feed(cursor, 7).await.unwrap();
        for e in &page {
            assert!(e.feed_position() > cursor, "strictly after the cursor");
            cursor = e.feed_position();
        }
        seen.extend(page.into_iter().map(|e| e.event_id));
        assert!(tokio::time::Instant::now() < deadline, "feed stalled");
        tokio::task::yield_now().await;
    }
    for w in writers {
        w.await.unwrap();
    }
    let unique: std::collections::HashSet<_> = seen.iter().collect();
    assert_eq!(seen.len(), 200);
    assert_eq!(unique.len(), 200, "no event twice");
    assert!(store.read_feed(cursor, 10).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_raw_transaction_that_wrote_first_and_commits_last_is_not_skipped() {
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());

    // T1: any writer of `events` (here plain SQL on its own connection), inserting first and
    // staying open.
    let mut t1 = db.pool.begin().await.unwrap();
    sqlx::query("INSERT INTO streams (stream_id, version) VALUES ('raw-1', 1)")
        .execute(&mut *t1)
        .await
        .unwrap();
    let t1_position: i64 = sqlx::query_scalar(
        "INSERT INTO events (stream_id, version, event_id, type, data, metadata) \
         VALUES ('raw-1', 1, $1, 'Raw.v1', '{}', '{\"actor\": {\"role\": \"cli\", \"node\": \"psql\"}}') \
         RETURNING position",
    )
    .bind(Uuid::now_v7())
    .fetch_one(&mut *t1)
    .await
    .unwrap();

    // T2 appends through the store and commits; its position is past T1's.
    let t2 = store.append(vec![write("raw-2", "E2.v1")]).await.unwrap();
    assert!(t2.events[0].position as i64 > t1_position);

    // A reader that went by position alone would hand out T2's event now and never see T1's.
    assert!(store
        .read_feed(FeedPosition::START, 10)
        .await
        .unwrap()
        .is_empty());

    t1.commit().await.unwrap();
    let all = store.read_feed(FeedPosition::START, 10).await.unwrap();
    assert_eq!(types(&all), vec!["Raw.v1", "E2.v1"]);
    assert_eq!(all[0].position as i64, t1_position);
    assert_eq!(all[0].metadata.actor.node, "psql");
}

/// Telling "caught up" from "held back" at the head of the feed is one index probe, however
/// many events the store holds, also when Postgres plans the statement generically (as it does
/// for a prepared statement after a few runs). The `EXISTS` form it replaced read every event.
#[tokio::test]
async fn the_held_back_check_at_the_head_of_a_large_feed_reads_no_table() {
    let db = common::test_db().await;
    for statement in [
        "INSERT INTO streams (stream_id, version) SELECT 'bulk-' || i, 1 FROM generate_series(1, 30000) i",
        "INSERT INTO events (stream_id, version, event_id, type, data, metadata) \
         SELECT 'bulk-' || i, 1, gen_random_uuid(), 'Bulk.v1', '{}', '{}' FROM generate_series(1, 30000) i",
        "ANALYZE events",
    ] {
        sqlx::query(statement).execute(&db.pool).await.unwrap();
    }
    let mut conn = db.pool.acquire().await.unwrap();
    sqlx::query("SET plan_cache_mode = force_generic_plan")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query(&format!(
        "PREPARE held_back(text, bigint) AS {}",
        strata::events::HELD_BACK_SQL
    ))
    .execute(&mut *conn)
    .await
    .unwrap();
    let (tx_id, position): (String, i64) = sqlx::query_as(
        "SELECT tx_id::text, position FROM events ORDER BY tx_id DESC, position DESC LIMIT 1",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    let explain = |tx_id: String, position: i64| {
        format!("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE held_back('{tx_id}', {position})")
    };
    let plan: serde_json::Value = sqlx::query_scalar(&explain(tx_id.clone(), position))
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    let text = plan.to_string();
    assert!(
        !text.contains("Seq Scan"),
        "a sequential scan at the head: {plan:#}"
    );
    assert!(text.contains("events_tx_id_position_idx"), "{plan:#}");
    // And the answers: nothing after the head, something after the event before it.
    for (after, expected) in [(position, false), (position - 1, true)] {
        let pending: bool = sqlx::query_scalar(&format!("EXECUTE held_back('{tx_id}', {after})"))
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        assert_eq!(pending, expected, "events after position {after}");
    }
}
