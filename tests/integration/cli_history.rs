//! The operator CLI as a real process: `strata history` and `strata projections`.

use crate::common;

use std::process::Command;

use strata::events::{
    Actor, ActorRole, EventStore, ExpectedVersion, Metadata, NewEvent, StreamId, StreamWrite,
};
use uuid::Uuid;

fn strata(url: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(common::strata_bin())
        .args(args)
        .env("DATABASE_URL", url)
        .env("RUST_LOG", "error")
        .output()
        .expect("run strata");
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

async fn seed(store: &EventStore) {
    let events = ["BuildRegistered.v1", "AttemptAcquired.v1", "BuildReady.v1"]
        .iter()
        .enumerate()
        .map(|(i, t)| NewEvent {
            event_id: Uuid::now_v7(),
            event_type: t.to_string(),
            data: serde_json::json!({"step": i}),
            metadata: Metadata::new(Actor::new(ActorRole::Worker, "node-9")).with_epoch(4),
        })
        .collect();
    store
        .append(vec![StreamWrite::new(
            StreamId::parse("job-cli").unwrap(),
            ExpectedVersion::NoStream,
            events,
        )])
        .await
        .unwrap();
}

#[tokio::test]
async fn history_prints_a_stream_as_a_table_and_as_json() {
    let db = common::test_db().await;
    seed(&strata::app::event_store(db.pool.clone())).await;

    let (ok, out, err) = strata(&db.url, &["history", "job-cli"]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    for column in [
        "POSITION", "VERSION", "TIME", "TYPE", "ACTOR", "EPOCH", "DATA",
    ] {
        assert!(lines[0].contains(column), "{}", lines[0]);
    }
    assert!(lines[2].contains("AttemptAcquired.v1"));
    assert!(lines[2].contains("worker/node-9"));
    assert!(lines[2].contains(r#"{"step":1}"#));

    let (ok, out, _) = strata(
        &db.url,
        &["history", "job-cli", "--json", "--from-version", "2"],
    );
    assert!(ok);
    let events: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.len(), 2);
    assert_eq!(events[0]["version"], 2);
    assert_eq!(events[1]["type"], "BuildReady.v1");
    assert_eq!(events[1]["metadata"]["epoch"], 4);

    let (ok, _, err) = strata(&db.url, &["history", "job-missing"]);
    assert!(!ok);
    assert!(err.contains("has no events"), "{err}");
    let (ok, _, err) = strata(&db.url, &["history", "no_category"]);
    assert!(!ok);
    assert!(err.contains("category"), "{err}");
}

#[tokio::test]
async fn projections_list_and_rebuild() {
    let db = common::test_db().await;
    seed(&strata::app::event_store(db.pool.clone())).await;

    let (ok, out, err) = strata(&db.url, &["projections", "list"]);
    assert!(ok, "{err}");
    let row = out
        .lines()
        .find(|l| l.starts_with("stream_catalog"))
        .unwrap();
    assert!(row.contains("never"), "{row}");
    assert!(row.trim_end().ends_with('3'), "lag of 3 events: {row}");

    let (ok, out, err) = strata(&db.url, &["projections", "rebuild", "stream_catalog"]);
    assert!(ok, "{err}");
    assert!(out.contains("replayed 3 events"), "{out}");
    let (version, count): (i64, i64) = sqlx::query_as(
        "SELECT version, event_count FROM stream_catalog WHERE stream_id = 'job-cli'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((version, count), (3, 3));

    let (ok, out, _) = strata(&db.url, &["projections", "list"]);
    assert!(ok);
    let row = out
        .lines()
        .find(|l| l.starts_with("stream_catalog"))
        .unwrap();
    assert!(row.trim_end().ends_with(" 0"), "caught up: {row}");

    let (ok, _, err) = strata(&db.url, &["projections", "rebuild", "nope"]);
    assert!(!ok);
    assert!(err.contains("unknown projection"), "{err}");
}
