//! Migration 0022 (ADR 0031) against events written before it: builds get their queue time,
//! first acquisition and step counts, GC passes their rows, sandboxes their spans, all from the
//! events, so the charts show the history from before the upgrade.

use crate::common;

use strata::events::{
    Actor, ActorRole, EventStore, ExpectedVersion, Metadata, NewEvent, StreamId, StreamWrite,
};
use uuid::Uuid;

type Time = chrono::DateTime<chrono::Utc>;

/// Appends raw events (type and payload) to `stream` on a store with no read models, as the
/// older version wrote them; returns each event's recorded time.
async fn append(
    store: &EventStore,
    stream: &str,
    events: &[(&str, serde_json::Value)],
) -> Vec<Time> {
    let mut times = vec![];
    for (event_type, data) in events {
        store
            .append(vec![StreamWrite::new(
                StreamId::parse(stream).unwrap(),
                ExpectedVersion::Any,
                vec![NewEvent {
                    event_id: Uuid::new_v4(),
                    event_type: event_type.to_string(),
                    data: data.clone(),
                    metadata: Metadata::new(Actor::new(ActorRole::Worker, "old-node")),
                }],
            )])
            .await
            .unwrap();
        let at: Time = sqlx::query_scalar(
            "SELECT recorded_at FROM events WHERE stream_id = $1 ORDER BY version DESC LIMIT 1",
        )
        .bind(stream)
        .fetch_one(store.pool())
        .await
        .unwrap();
        times.push(at);
    }
    times
}

#[tokio::test]
async fn the_charts_read_models_are_filled_from_the_events_before_them() {
    let db = common::test_db_at_migration(21).await;
    let store = EventStore::with_standing_projections(db.pool.clone(), vec![]);
    let build = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO builds (build_id, template_id, team_id, phase, registered_at, updated_at, stream_version)
         VALUES ($1, 'tpl', 'team', 'ready', now(), now(), 6)",
    )
    .bind(build)
    .execute(&db.pool)
    .await
    .unwrap();
    let stream = format!("build-{build}");
    let cached = serde_json::json!({"outcome": {"kind": "cached", "snapshot": Uuid::new_v4()}});
    let run = serde_json::json!({"outcome": {"kind": "executed"}});
    let times = append(
        &store,
        &stream,
        &[
            ("BuildFrozen.v1", serde_json::json!({})),
            ("AttemptAcquired.v1", serde_json::json!({"node": "n1"})),
            ("StepCompleted.v1", cached.clone()),
            ("StepCompleted.v1", run.clone()),
            ("AttemptAcquired.v1", serde_json::json!({"node": "n2"})),
            ("StepCompleted.v1", run),
        ],
    )
    .await;
    let finished = append(
        &store,
        "gcpass-gc-old1",
        &[
            ("GcPassStarted.v1", serde_json::json!({"node": "old-gc"})),
            ("GcPassEnded.v1", serde_json::json!({})),
        ],
    )
    .await;
    append(
        &store,
        "gcpass-gc-old2",
        &[
            ("GcPassStarted.v1", serde_json::json!({"node": "old-gc"})),
            ("GcPassFenced.v1", serde_json::json!({"by": "gc-old3"})),
        ],
    )
    .await;
    let life = append(
        &store,
        "sandbox-sbxold",
        &[
            ("SandboxRequested.v1", serde_json::json!({})),
            ("SandboxPlaced.v1", serde_json::json!({})),
            ("SandboxRunning.v1", serde_json::json!({})),
            ("SandboxPausing.v1", serde_json::json!({})),
            ("SandboxPaused.v1", serde_json::json!({})),
            ("SandboxResumed.v1", serde_json::json!({})),
            ("SandboxResumeFailed.v1", serde_json::json!({})),
            ("SandboxResumed.v1", serde_json::json!({})),
            ("SandboxRunning.v1", serde_json::json!({})),
            ("SandboxEnded.v1", serde_json::json!({})),
        ],
    )
    .await;

    strata::db::migrate(&db.pool).await.unwrap();

    let row: (Option<Time>, Option<Time>, i32, i32) = sqlx::query_as(
        "SELECT queued_at, acquired_at, steps_cached, steps_run FROM builds WHERE build_id = $1",
    )
    .bind(build)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        row,
        (Some(times[0]), Some(times[1]), 1, 2),
        "the first acquisition, every attempt's steps"
    );

    let passes: Vec<(String, String, Option<Time>, Option<String>)> =
        sqlx::query_as("SELECT pass_id, node, ended_at, fenced_by FROM gc_passes ORDER BY pass_id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        passes,
        [
            (
                "gc-old1".to_string(),
                "old-gc".to_string(),
                Some(finished[1]),
                None
            ),
            (
                "gc-old2".to_string(),
                "old-gc".to_string(),
                None,
                Some("gc-old3".to_string())
            ),
        ]
    );

    let spans: Vec<(String, Time, Option<Time>)> =
        sqlx::query_as(
            "SELECT state, from_at, to_at FROM sandbox_spans WHERE sandbox_id = 'sbxold' ORDER BY opened_by",
        )
        .fetch_all(&db.pool)
        .await
        .unwrap();
    let expected = [
        ("starting", life[0], Some(life[2])),
        ("running", life[2], Some(life[4])),
        ("paused", life[4], Some(life[5])),
        ("starting", life[5], Some(life[6])),
        ("paused", life[6], Some(life[7])),
        ("starting", life[7], Some(life[8])),
        ("running", life[8], Some(life[9])),
    ]
    .map(|(s, from, to)| (s.to_string(), from, to));
    assert_eq!(spans, expected);
}
