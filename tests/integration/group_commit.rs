//! Group commit against a real Postgres: concurrent one-stream appends share a transaction, and
//! each keeps the guarantees of an append on its own. The stores here linger before taking a
//! group and commit one group at a time, so the appends of a test reliably meet in one group.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::PgConnection;
use strata::events::{
    Actor, ActorRole, AppendError, AppendOutcome, EventStore, ExpectedVersion, GroupCommitPolicy,
    InlineProjection, Metadata, NewEvent, RecordedEvent, StreamId, StreamWrite,
};
use uuid::Uuid;

fn event(event_type: &str) -> NewEvent {
    NewEvent {
        event_id: Uuid::now_v7(),
        event_type: event_type.into(),
        data: serde_json::json!({"n": 1}),
        metadata: Metadata::new(Actor::new(ActorRole::Cli, "test-node")),
    }
}

fn stream(id: &str) -> StreamId {
    StreamId::parse(id).unwrap()
}

/// One group at a time, each gathered over 300 ms: appends started together commit together.
fn gathering() -> GroupCommitPolicy {
    GroupCommitPolicy {
        max_in_flight: 1,
        linger: Duration::from_millis(300),
    }
}

/// Runs `writes` as concurrent appends; their results in the same order.
async fn concurrently(
    store: &EventStore,
    writes: Vec<StreamWrite>,
) -> Vec<Result<AppendOutcome, AppendError>> {
    let tasks: Vec<_> = writes
        .into_iter()
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move { store.append(vec![w]).await })
        })
        .collect();
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    results
}

async fn stored(pool: &sqlx::PgPool, stream: &StreamId) -> Vec<(i64, String)> {
    sqlx::query_as("SELECT version, tx_id::text FROM events WHERE stream_id = $1 ORDER BY version")
        .bind(stream.as_str())
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_conflicting_append_in_a_group_neither_fails_nor_loses_the_others() {
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone()).with_group_commit(gathering());
    let contested = stream("gc-contested");
    store
        .append(vec![StreamWrite::new(
            contested.clone(),
            ExpectedVersion::NoStream,
            vec![event("Seeded.v1"), event("Seeded.v1")],
        )])
        .await
        .unwrap();

    let fresh: Vec<StreamId> = (0..6).map(|i| stream(&format!("gc-fresh-{i}"))).collect();
    let mut writes: Vec<StreamWrite> = fresh
        .iter()
        .map(|s| StreamWrite::new(s.clone(), ExpectedVersion::NoStream, vec![event("Ok.v1")]))
        .collect();
    // Stale: the stream is at 2.
    writes.push(StreamWrite::new(
        contested.clone(),
        ExpectedVersion::Exact(1),
        vec![event("Stale.v1")],
    ));
    let mut results = concurrently(&store, writes).await;

    match results.pop().unwrap() {
        Err(AppendError::VersionConflict {
            stream, actual: 2, ..
        }) => assert_eq!(stream, contested),
        other => panic!("the stale append must conflict at version 2, got {other:?}"),
    }
    let outcomes: Vec<AppendOutcome> = results.into_iter().map(Result::unwrap).collect();
    let tx_ids: std::collections::HashSet<u64> =
        outcomes.iter().map(|o| o.events[0].tx_id).collect();
    assert_eq!(tx_ids.len(), 1, "the six appends committed in one group");
    for (s, outcome) in fresh.iter().zip(&outcomes) {
        assert_eq!(outcome.version(s), Some(1));
        assert!(!outcome.replay);
        let rows = stored(&db.pool, s).await;
        assert_eq!(rows.len(), 1, "{s} holds its one event");
        assert_eq!(rows[0].1, outcomes[0].events[0].tx_id.to_string());
        assert_eq!(outcome.events[0].stream_id, *s);
    }
    assert_eq!(
        stored(&db.pool, &contested).await.len(),
        2,
        "nothing stale stored"
    );
}

/// Terminates its own database connection when it sees a `Crash.v1` event: a crash of the
/// session in the middle of a transaction, as a killed backend or a dropped connection gives.
struct CrashOn;

#[async_trait]
impl InlineProjection for CrashOn {
    async fn apply(
        &self,
        conn: &mut PgConnection,
        events: &[RecordedEvent],
    ) -> Result<(), sqlx::Error> {
        if events.iter().any(|e| e.event_type == "Crash.v1") {
            sqlx::query("SELECT pg_terminate_backend(pg_backend_pid())")
                .execute(&mut *conn)
                .await?;
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_crash_in_the_middle_of_a_group_is_atomic_per_append() {
    let db = common::test_db().await;
    let store = EventStore::with_standing_projections(db.pool.clone(), vec![Arc::new(CrashOn)])
        .with_group_commit(gathering());
    let fine: Vec<StreamId> = (0..5).map(|i| stream(&format!("gc-fine-{i}"))).collect();
    let doomed = stream("gc-doomed");
    let mut writes: Vec<StreamWrite> = fine
        .iter()
        .map(|s| StreamWrite::new(s.clone(), ExpectedVersion::NoStream, vec![event("Ok.v1")]))
        .collect();
    writes.insert(
        2,
        StreamWrite::new(
            doomed.clone(),
            ExpectedVersion::NoStream,
            vec![event("Ok.v1"), event("Crash.v1")],
        ),
    );
    let mut results = concurrently(&store, writes).await;

    assert!(
        matches!(results.remove(2), Err(AppendError::Database(_))),
        "the append whose transaction dies fails"
    );
    let head: Option<i64> = sqlx::query_scalar("SELECT version FROM streams WHERE stream_id = $1")
        .bind(doomed.as_str())
        .fetch_optional(&db.pool)
        .await
        .unwrap();
    assert_eq!(head, None, "no head row of the failed append");
    assert!(
        stored(&db.pool, &doomed).await.is_empty(),
        "none of its events"
    );
    let mut tx_ids = std::collections::HashSet::new();
    for (s, result) in fine.iter().zip(results) {
        let outcome = result.expect("the others commit after the group died");
        assert_eq!(outcome.version(s), Some(1));
        let rows = stored(&db.pool, s).await;
        assert_eq!(rows.len(), 1, "{s} holds its event exactly once");
        tx_ids.insert(rows[0].1.clone());
    }
    assert_eq!(
        tx_ids.len(),
        fine.len(),
        "the group rolled back whole: each append committed afterwards on its own"
    );
}

#[tokio::test]
async fn a_retried_append_in_a_group_is_recognised_as_a_replay() {
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone()).with_group_commit(gathering());
    let retried = StreamWrite::new(
        stream("gc-retried"),
        ExpectedVersion::Any,
        vec![event("Ok.v1")],
    );
    let first = store.append(vec![retried.clone()]).await.unwrap();

    let others: Vec<StreamId> = (0..4).map(|i| stream(&format!("gc-other-{i}"))).collect();
    let mut writes: Vec<StreamWrite> = others
        .iter()
        .map(|s| StreamWrite::new(s.clone(), ExpectedVersion::Any, vec![event("Ok.v1")]))
        .collect();
    writes.push(retried.clone());
    let mut results = concurrently(&store, writes).await;

    let again = results
        .pop()
        .unwrap()
        .expect("a retry of a committed append succeeds");
    assert!(again.replay);
    assert_eq!(again.events, first.events);
    assert_eq!(
        stored(&db.pool, &retried.stream).await.len(),
        1,
        "stored once"
    );
    for (s, result) in others.iter().zip(results) {
        assert_eq!(result.unwrap().version(s), Some(1));
        assert_eq!(stored(&db.pool, s).await.len(), 1);
    }
}

#[tokio::test]
async fn appends_to_one_stream_never_share_a_transaction() {
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone()).with_group_commit(gathering());
    let shared = stream("gc-shared");
    let mut writes: Vec<StreamWrite> = (0..4)
        .map(|_| StreamWrite::new(shared.clone(), ExpectedVersion::Any, vec![event("Ok.v1")]))
        .collect();
    writes.extend((0..3).map(|i| {
        StreamWrite::new(
            stream(&format!("gc-side-{i}")),
            ExpectedVersion::Any,
            vec![event("Ok.v1")],
        )
    }));
    for result in concurrently(&store, writes).await {
        result.unwrap();
    }
    let rows = stored(&db.pool, &shared).await;
    assert_eq!(
        rows.iter().map(|r| r.0).collect::<Vec<_>>(),
        [1, 2, 3, 4],
        "every append stored, in version order"
    );
    let tx_ids: std::collections::HashSet<&String> = rows.iter().map(|r| &r.1).collect();
    assert_eq!(
        tx_ids.len(),
        4,
        "a transaction id names what one append wrote to a stream"
    );
}
