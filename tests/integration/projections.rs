//! Async projections: exactly-once application with the checkpoint, one runner at a time,
//! rebuilds equal to incremental builds.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::PgConnection;
use strata::events::{
    Actor, ActorRole, ExpectedVersion, Metadata, NewEvent, RecordedEvent, StreamId, StreamWrite,
};
use strata::projections::{
    stream_catalog, Projection, ProjectionError, ProjectionRunner, RoundOutcome,
};
use tokio::sync::Notify;
use uuid::Uuid;

fn write(stream: &str, event_type: &str, n: usize) -> StreamWrite {
    StreamWrite::new(
        StreamId::parse(stream).unwrap(),
        ExpectedVersion::Any,
        (0..n)
            .map(|i| NewEvent {
                event_id: Uuid::now_v7(),
                event_type: event_type.into(),
                data: serde_json::json!({"i": i}),
                metadata: Metadata::new(Actor::new(ActorRole::Worker, "n1")),
            })
            .collect(),
    )
}

type CatalogRow = (String, String, i64, i64, String, String, String);

async fn catalog(pool: &sqlx::PgPool) -> Vec<CatalogRow> {
    sqlx::query_as(
        "SELECT stream_id, category, version, event_count, first_recorded_at::text, \
                last_recorded_at::text, last_event_type FROM stream_catalog ORDER BY stream_id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// The catalog computed straight from the events table.
async fn catalog_truth(pool: &sqlx::PgPool) -> Vec<CatalogRow> {
    sqlx::query_as(
        "SELECT stream_id, split_part(stream_id, '-', 1), max(version), count(*), \
                min(recorded_at)::text, \
                (array_agg(recorded_at::text ORDER BY version DESC))[1], \
                (array_agg(type ORDER BY version DESC))[1] \
         FROM events GROUP BY stream_id ORDER BY stream_id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_rebuilt_catalog_equals_the_incremental_one() {
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    let runner = ProjectionRunner::new(store.clone(), Arc::new(stream_catalog::StreamCatalog))
        .with_batch_size(7);
    for round in 0..5 {
        for (s, n) in [
            ("job-a", 3),
            ("job-b", 1),
            ("order-x", 2),
            ("files-s1-h", 1),
        ] {
            store
                .append(vec![write(s, &format!("Step{round}.v1"), n)])
                .await
                .unwrap();
        }
        store
            .append(vec![write(&format!("job-r{round}"), "Registered.v1", 1)])
            .await
            .unwrap();
        runner.catch_up().await.unwrap();
    }
    let incremental = catalog(&db.pool).await;
    assert_eq!(incremental, catalog_truth(&db.pool).await);
    assert_eq!(incremental.len(), 9);
    let build_a = incremental.iter().find(|r| r.0 == "job-a").unwrap();
    assert_eq!((build_a.1.as_str(), build_a.2, build_a.3), ("job", 15, 15));
    assert_eq!(build_a.6, "Step4.v1");

    let replayed = runner.rebuild().await.unwrap();
    assert_eq!(replayed, 40);
    assert_eq!(catalog(&db.pool).await, incremental);

    let status = strata::projections::status(&db.pool, &[stream_catalog::NAME])
        .await
        .unwrap();
    assert_eq!(status[0].lag, 0);
    store
        .append(vec![write("job-late", "Late.v1", 2)])
        .await
        .unwrap();
    let status = strata::projections::status(&db.pool, &[stream_catalog::NAME])
        .await
        .unwrap();
    assert_eq!(status[0].lag, 2);
}

/// Records each applied event under its id (a primary key, so a second application of one event
/// fails the round), and can hold its transaction open to observe the checkpoint lock.
struct Ledger {
    hold: AtomicBool,
    entered: Notify,
    release: Notify,
}

#[async_trait]
impl Projection for Ledger {
    fn name(&self) -> &str {
        "test_ledger"
    }

    async fn apply(
        &self,
        conn: &mut PgConnection,
        event: &RecordedEvent,
    ) -> Result<(), ProjectionError> {
        if self.hold.swap(false, Ordering::SeqCst) {
            self.entered.notify_one();
            self.release.notified().await;
        }
        sqlx::query("INSERT INTO ledger (event_id) VALUES ($1)")
            .bind(event.event_id)
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn reset(&self, conn: &mut PgConnection) -> Result<(), ProjectionError> {
        sqlx::query("DELETE FROM ledger").execute(conn).await?;
        Ok(())
    }
}

#[tokio::test]
async fn two_runners_of_one_projection_never_apply_an_event_twice() {
    let db = common::test_db().await;
    sqlx::query("CREATE TABLE ledger (event_id uuid PRIMARY KEY)")
        .execute(&db.pool)
        .await
        .unwrap();
    let store = strata::app::event_store(db.pool.clone());
    let ledger = Arc::new(Ledger {
        hold: AtomicBool::new(true),
        entered: Notify::new(),
        release: Notify::new(),
    });
    let a = Arc::new(ProjectionRunner::new(store.clone(), ledger.clone()).with_batch_size(5));
    let b = Arc::new(ProjectionRunner::new(store.clone(), ledger.clone()).with_batch_size(5));
    store
        .append(vec![write("ledger-1", "E.v1", 3)])
        .await
        .unwrap();

    // A holds the checkpoint mid-batch: B must skip, not apply the same events.
    let a_round = {
        let a = a.clone();
        tokio::spawn(async move { a.run_once().await })
    };
    ledger.entered.notified().await;
    assert_eq!(b.run_once().await.unwrap(), RoundOutcome::Busy);
    ledger.release.notify_one();
    assert_eq!(a_round.await.unwrap().unwrap(), RoundOutcome::Applied(3));
    assert_eq!(b.run_once().await.unwrap(), RoundOutcome::Applied(0));

    // Both run flat out while writers append; every event is applied once in total.
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                for _ in 0..20 {
                    store
                        .append(vec![write(&format!("ledger-w{w}"), "E.v1", 2)])
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    let spin = |runner: Arc<ProjectionRunner>| {
        let pool = db.pool.clone();
        tokio::spawn(async move {
            let mut applied = 0;
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            while tokio::time::Instant::now() < deadline {
                match runner.run_once().await.unwrap() {
                    RoundOutcome::Applied(n) => applied += n,
                    RoundOutcome::Busy | RoundOutcome::HeldBack => {}
                }
                let done: i64 = sqlx::query_scalar("SELECT count(*) FROM ledger")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                if done == 163 {
                    break;
                }
                tokio::task::yield_now().await;
            }
            applied
        })
    };
    let (ra, rb) = (spin(a.clone()), spin(b.clone()));
    for w in writers {
        w.await.unwrap();
    }
    let (ra, rb) = (ra.await.unwrap(), rb.await.unwrap());
    let ledger_count: i64 = sqlx::query_scalar("SELECT count(*) FROM ledger")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(ledger_count, 163);
    assert_eq!(
        ra + rb,
        160,
        "every new event applied by exactly one runner"
    );
}
