//! The event store against a real Postgres: version races, atomic multi-stream appends, guards,
//! idempotent retries, serialization-failure retries and typed payloads.

use crate::common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;
use strata::events::{
    Actor, ActorRole, AppendError, DomainEvent, ExpectedVersion, InlineProjection, Metadata,
    NewEvent, RecordedEvent, RetryPolicy, StreamId, StreamWrite,
};
use tokio::sync::Barrier;
use uuid::Uuid;

fn meta() -> Metadata {
    Metadata::new(Actor::new(ActorRole::Cli, "test-node"))
}

fn event(event_type: &str, data: serde_json::Value) -> NewEvent {
    NewEvent {
        event_id: Uuid::now_v7(),
        event_type: event_type.into(),
        data,
        metadata: meta(),
    }
}

fn stream(id: &str) -> StreamId {
    StreamId::parse(id).unwrap()
}

async fn event_count(pool: &sqlx::PgPool, stream: Option<&StreamId>) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM events WHERE $1::text IS NULL OR stream_id = $1")
        .bind(stream.map(|s| s.as_str()))
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn racing_appends_at_one_version_have_exactly_one_winner() {
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    let s = stream("race-1");
    const RACERS: usize = 32;
    const ROUNDS: u64 = 6;
    for round in 0..ROUNDS {
        let barrier = Arc::new(Barrier::new(RACERS));
        let tasks: Vec<_> = (0..RACERS)
            .map(|i| {
                let store = store.clone();
                let s = s.clone();
                let barrier = barrier.clone();
                tokio::spawn(async move {
                    let expected = if round == 0 {
                        ExpectedVersion::NoStream
                    } else {
                        ExpectedVersion::Exact(round)
                    };
                    let write = StreamWrite::new(
                        s,
                        expected,
                        vec![event(
                            "Raced.v1",
                            serde_json::json!({"round": round, "racer": i}),
                        )],
                    );
                    barrier.wait().await;
                    store.append(vec![write]).await
                })
            })
            .collect();
        let mut winners = 0;
        for task in tasks {
            match task.await.unwrap() {
                Ok(outcome) => {
                    winners += 1;
                    assert!(!outcome.replay);
                    assert_eq!(outcome.version(&s), Some(round + 1));
                    assert_eq!(outcome.events[0].version, round + 1);
                }
                Err(AppendError::VersionConflict {
                    stream: conflicted,
                    actual,
                    ..
                }) => {
                    assert_eq!(conflicted, s);
                    assert_eq!(actual, round + 1, "the conflict names the actual version");
                }
                Err(other) => panic!("round {round}: unexpected error {other}"),
            }
        }
        assert_eq!(winners, 1, "round {round}: exactly one append wins");
    }
    assert_eq!(store.stream_version(&s).await.unwrap(), ROUNDS);
    assert_eq!(event_count(&db.pool, Some(&s)).await, ROUNDS as i64);
    let versions: Vec<u64> = store
        .read_stream(&s, 1, 100)
        .await
        .unwrap()
        .iter()
        .map(|e| e.version)
        .collect();
    assert_eq!(versions, (1..=ROUNDS).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_conflict_on_one_stream_writes_nothing_anywhere() {
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    let (a, b, c) = (stream("multi-a"), stream("multi-b"), stream("multi-c"));
    store
        .append(vec![StreamWrite::new(
            b.clone(),
            ExpectedVersion::NoStream,
            vec![event("Created.v1", serde_json::json!({}))],
        )])
        .await
        .unwrap();

    let err = store
        .append(vec![
            StreamWrite::new(
                a.clone(),
                ExpectedVersion::NoStream,
                vec![event("Created.v1", serde_json::json!({}))],
            ),
            // b is at 1, not 0.
            StreamWrite::new(
                b.clone(),
                ExpectedVersion::NoStream,
                vec![event("Changed.v1", serde_json::json!({}))],
            ),
            StreamWrite::new(
                c.clone(),
                ExpectedVersion::Any,
                vec![event("Created.v1", serde_json::json!({}))],
            ),
        ])
        .await
        .unwrap_err();
    match err {
        AppendError::VersionConflict {
            stream,
            expected,
            actual,
        } => {
            assert_eq!(stream, b);
            assert_eq!(expected, ExpectedVersion::NoStream);
            assert_eq!(actual, 1);
        }
        other => panic!("expected a version conflict, got {other}"),
    }
    assert_eq!(store.stream_version(&a).await.unwrap(), 0);
    assert_eq!(store.stream_version(&b).await.unwrap(), 1);
    assert_eq!(store.stream_version(&c).await.unwrap(), 0);
    assert_eq!(event_count(&db.pool, None).await, 1);

    // The same append at the right version writes to all three.
    let ok = store
        .append(vec![
            StreamWrite::new(
                a.clone(),
                ExpectedVersion::NoStream,
                vec![event("Created.v1", serde_json::json!({}))],
            ),
            StreamWrite::new(
                b.clone(),
                ExpectedVersion::Exact(1),
                vec![
                    event("Changed.v1", serde_json::json!({"n": 1})),
                    event("Changed.v1", serde_json::json!({"n": 2})),
                ],
            ),
            StreamWrite::new(
                c.clone(),
                ExpectedVersion::Any,
                vec![event("Created.v1", serde_json::json!({}))],
            ),
        ])
        .await
        .unwrap();
    assert_eq!(ok.version(&a), Some(1));
    assert_eq!(ok.version(&b), Some(3));
    assert_eq!(ok.version(&c), Some(1));
    assert_eq!(
        ok.events.iter().map(|e| e.version).collect::<Vec<_>>(),
        vec![1, 2, 3, 1]
    );
    let tx_ids: std::collections::HashSet<u64> = ok.events.iter().map(|e| e.tx_id).collect();
    assert_eq!(tx_ids.len(), 1, "one transaction");
}

#[tokio::test]
async fn a_guard_fails_the_append_when_its_stream_moved() {
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    let (template, build) = (stream("order-g"), stream("job-g"));
    store
        .append(vec![StreamWrite::new(
            template.clone(),
            ExpectedVersion::NoStream,
            vec![event("TemplateRegistered.v1", serde_json::json!({}))],
        )])
        .await
        .unwrap();

    // Guard holds: the template is still at 1.
    let ok = store
        .append(vec![
            StreamWrite::guard(template.clone(), ExpectedVersion::Exact(1)),
            StreamWrite::new(
                build.clone(),
                ExpectedVersion::NoStream,
                vec![event("BuildRegistered.v1", serde_json::json!({}))],
            ),
        ])
        .await
        .unwrap();
    assert_eq!(ok.version(&template), Some(1));
    assert_eq!(store.stream_version(&template).await.unwrap(), 1);

    // The template moves; a decision made on version 1 must not land.
    store
        .append(vec![StreamWrite::new(
            template.clone(),
            ExpectedVersion::Exact(1),
            vec![event("TemplateDeleted.v1", serde_json::json!({}))],
        )])
        .await
        .unwrap();
    let err = store
        .append(vec![
            StreamWrite::guard(template.clone(), ExpectedVersion::Exact(1)),
            StreamWrite::new(
                build.clone(),
                ExpectedVersion::Exact(1),
                vec![event("BuildStarted.v1", serde_json::json!({}))],
            ),
        ])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AppendError::VersionConflict { stream, actual: 2, .. } if *stream == template),
        "{err}"
    );
    assert_eq!(store.stream_version(&build).await.unwrap(), 1);

    // A guard that a stream does not exist.
    let err = store
        .append(vec![
            StreamWrite::guard(template.clone(), ExpectedVersion::NoStream),
            StreamWrite::new(
                build.clone(),
                ExpectedVersion::Exact(1),
                vec![event("BuildStarted.v1", serde_json::json!({}))],
            ),
        ])
        .await
        .unwrap_err();
    assert!(err.is_version_conflict());
    assert_eq!(event_count(&db.pool, None).await, 3);
}

#[tokio::test]
async fn a_retried_append_after_a_lost_reply_is_a_replay_not_a_duplicate() {
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    let s = stream("job-idem");
    let write = StreamWrite::new(
        s.clone(),
        ExpectedVersion::NoStream,
        vec![
            event(
                "BuildRegistered.v1",
                serde_json::json!({"x": 1.5, "tags": ["a"]}),
            ),
            event("UploadIntended.v1", serde_json::json!({"hash": "ab"})),
        ],
    );
    // The first try commits; pretend its reply never arrived.
    let first = store.append(vec![write.clone()]).await.unwrap();
    assert!(!first.replay);

    // The client retries the exact same append.
    let retry = store.append(vec![write.clone()]).await.unwrap();
    assert!(retry.replay, "the retry is recognised");
    assert_eq!(retry.events, first.events);
    assert_eq!(retry.version(&s), Some(2));
    assert_eq!(event_count(&db.pool, Some(&s)).await, 2, "no duplicate");

    // Also when the retry expects any version (no version check to trip over).
    let mut any = write.clone();
    any.expected = ExpectedVersion::Any;
    assert!(store.append(vec![any]).await.unwrap().replay);
    assert_eq!(event_count(&db.pool, Some(&s)).await, 2);

    // Same ids, different content: an error, not a silent success.
    let mut changed = write.clone();
    changed.events[1].data = serde_json::json!({"hash": "cd"});
    match store.append(vec![changed]).await {
        Err(AppendError::EventIdsReused {
            mismatched,
            missing,
        }) => {
            assert_eq!(mismatched, vec![write.events[1].event_id]);
            assert!(missing.is_empty());
        }
        other => panic!("expected EventIdsReused, got {other:?}"),
    }

    // Some ids stored, some new: an error too.
    let mut partial = write.clone();
    partial.expected = ExpectedVersion::Exact(2);
    let fresh = event("Other.v1", serde_json::json!({}));
    partial.events.push(fresh.clone());
    match store.append(vec![partial]).await {
        Err(AppendError::EventIdsReused { missing, .. }) => {
            assert_eq!(missing, vec![fresh.event_id])
        }
        other => panic!("expected EventIdsReused, got {other:?}"),
    }
    // The same id on another stream.
    let mut elsewhere = write.clone();
    elsewhere.stream = stream("job-other");
    assert!(matches!(
        store.append(vec![elsewhere]).await,
        Err(AppendError::EventIdsReused { .. })
    ));
    assert_eq!(event_count(&db.pool, None).await, 2);
}

/// A multi-stream append (a guard and two streams written) commits and its reply is lost (the
/// store's fault hook); the caller retries the same append. The retry is a replay with the
/// first commit's events and versions, the guard included, and nothing is stored twice. Ids
/// stored in another order, or by more than one append, are not this append's commit: those are
/// refused, never taken for a replay.
#[tokio::test]
async fn a_retried_multi_stream_append_after_a_lost_reply_is_a_replay_only_as_it_was_written() {
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    let (guarded, a, b) = (stream("tmpl-g"), stream("job-a"), stream("files-b"));
    store
        .append(vec![StreamWrite::new(
            guarded.clone(),
            ExpectedVersion::NoStream,
            vec![event("TemplateRegistered.v1", serde_json::json!({}))],
        )])
        .await
        .unwrap();
    let writes = vec![
        StreamWrite::guard(guarded.clone(), ExpectedVersion::Exact(1)),
        StreamWrite::new(
            a.clone(),
            ExpectedVersion::NoStream,
            vec![
                event("BuildRegistered.v1", serde_json::json!({"n": 1})),
                event("UploadIntended.v1", serde_json::json!({"n": 2})),
            ],
        ),
        StreamWrite::new(
            b.clone(),
            ExpectedVersion::NoStream,
            vec![event("GenerationReserved.v1", serde_json::json!({"n": 3}))],
        ),
    ];
    store.lose_next_reply("files");
    let lost = store.append(writes.clone()).await.unwrap_err();
    assert!(matches!(lost, AppendError::Database(_)), "{lost:?}");
    assert_eq!(store.lost_replies_pending(), 0);

    let retry = store.append(writes.clone()).await.unwrap();
    assert!(retry.replay, "the retry is recognised");
    let ids = |events: &[RecordedEvent]| events.iter().map(|e| e.event_id).collect::<Vec<_>>();
    let sent: Vec<Uuid> = writes
        .iter()
        .flat_map(|w| w.events.iter().map(|e| e.event_id))
        .collect();
    assert_eq!(ids(&retry.events), sent);
    assert_eq!(
        retry.events.iter().map(|e| e.version).collect::<Vec<_>>(),
        [1, 2, 1]
    );
    assert_eq!(retry.version(&guarded), Some(1));
    assert_eq!(retry.version(&a), Some(2));
    assert_eq!(retry.version(&b), Some(1));
    assert_eq!(event_count(&db.pool, None).await, 4, "nothing stored twice");

    // The same events, in another order within a write: not what was appended.
    let mut swapped = writes.clone();
    swapped[1].events.swap(0, 1);
    match store.append(swapped.clone()).await {
        Err(AppendError::EventIdsReused {
            mismatched,
            missing,
        }) => {
            assert!(missing.is_empty());
            assert!(!mismatched.is_empty(), "the misplaced ids are named");
        }
        other => panic!("expected EventIdsReused, got {other:?}"),
    }

    // Events stored by two appends, sent again as one: not a replay of either.
    let (c, d) = (stream("job-c"), stream("job-d"));
    let first = StreamWrite::new(
        c.clone(),
        ExpectedVersion::NoStream,
        vec![event("BuildRegistered.v1", serde_json::json!({}))],
    );
    let second = StreamWrite::new(
        d.clone(),
        ExpectedVersion::NoStream,
        vec![event("BuildRegistered.v1", serde_json::json!({}))],
    );
    store.append(vec![first.clone()]).await.unwrap();
    store.append(vec![second.clone()]).await.unwrap();
    match store.append(vec![first, second]).await {
        Err(AppendError::EventIdsReused { mismatched, .. }) => {
            assert_eq!(mismatched.len(), 1, "{mismatched:?}")
        }
        other => panic!("expected EventIdsReused, got {other:?}"),
    }
    assert_eq!(event_count(&db.pool, None).await, 6);
}

/// Makes two appends read the same rows before either writes: a write skew that SERIALIZABLE
/// must break with a serialization failure (40001) in one of them.
struct WriteSkew {
    barrier: Arc<Barrier>,
    calls: AtomicU32,
}

#[async_trait]
impl InlineProjection for WriteSkew {
    async fn apply(
        &self,
        conn: &mut PgConnection,
        events: &[RecordedEvent],
    ) -> Result<(), sqlx::Error> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        let seen: i64 = sqlx::query_scalar("SELECT count(*) FROM skew")
            .fetch_one(&mut *conn)
            .await?;
        if call == 0 {
            self.barrier.wait().await;
        }
        sqlx::query("INSERT INTO skew (stream_id, seen) VALUES ($1, $2)")
            .bind(events[0].stream_id.as_str())
            .bind(seen)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }
}

#[tokio::test]
async fn serialization_failures_are_retried() {
    let db = common::test_db().await;
    sqlx::query("CREATE TABLE skew (stream_id text, seen bigint)")
        .execute(&db.pool)
        .await
        .unwrap();
    let store = strata::app::event_store(db.pool.clone());
    let barrier = Arc::new(Barrier::new(2));
    let run = |name: &'static str| {
        let store = store.clone();
        let hook = WriteSkew {
            barrier: barrier.clone(),
            calls: AtomicU32::new(0),
        };
        tokio::spawn(async move {
            let outcome = store
                .append_with(
                    vec![StreamWrite::new(
                        stream(name),
                        ExpectedVersion::NoStream,
                        vec![event("Skewed.v1", serde_json::json!({}))],
                    )],
                    &hook,
                )
                .await;
            (outcome, hook.calls.load(Ordering::SeqCst))
        })
    };
    let (a, b) = (run("skew-a"), run("skew-b"));
    let (a, a_calls) = a.await.unwrap();
    let (b, b_calls) = b.await.unwrap();
    let (a, b) = (a.unwrap(), b.unwrap());
    let attempts = [a.attempts, b.attempts];
    assert!(
        attempts.contains(&1) && attempts.iter().any(|&n| n > 1),
        "one append went through, the other was retried: {attempts:?}"
    );
    assert_eq!(a_calls, a.attempts, "the inline hook ran once per attempt");
    assert_eq!(b_calls, b.attempts);
    // The retried one saw the other's row: serial order.
    let seen: Vec<i64> = sqlx::query_scalar("SELECT seen FROM skew ORDER BY seen")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(seen, vec![0, 1]);
    assert_eq!(event_count(&db.pool, None).await, 2);
}

/// Fault injection: a deferred constraint trigger raises SQLSTATE 40001 at COMMIT for as long as
/// a (non-transactional) sequence is below a limit. Real serialization failures at COMMIT
/// cannot be produced on demand; this one reaches the store exactly as they do.
async fn fail_commits(pool: &sqlx::PgPool, times: i64) {
    for sql in [
        "CREATE TABLE commit_probe (id int)".to_string(),
        "CREATE SEQUENCE commit_failures".to_string(),
        format!(
            "CREATE FUNCTION fail_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
               IF nextval('commit_failures') <= {times} THEN \
                 RAISE EXCEPTION 'injected serialization failure' USING ERRCODE = '40001'; \
               END IF; RETURN NULL; END $$"
        ),
        "CREATE CONSTRAINT TRIGGER fail_at_commit AFTER INSERT ON commit_probe \
         DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION fail_commit()"
            .to_string(),
    ] {
        sqlx::query(&sql).execute(pool).await.unwrap();
    }
}

struct TouchProbe(AtomicU32);

#[async_trait]
impl InlineProjection for TouchProbe {
    async fn apply(&self, conn: &mut PgConnection, _: &[RecordedEvent]) -> Result<(), sqlx::Error> {
        self.0.fetch_add(1, Ordering::SeqCst);
        sqlx::query("INSERT INTO commit_probe VALUES (1)")
            .execute(conn)
            .await?;
        Ok(())
    }
}

#[tokio::test]
async fn serialization_failures_at_commit_are_retried_within_a_budget() {
    let db = common::test_db().await;
    fail_commits(&db.pool, 2).await;
    let store = strata::app::event_store(db.pool.clone());
    let probe = TouchProbe(AtomicU32::new(0));
    let s = stream("commit-1");
    let outcome = store
        .append_with(
            vec![StreamWrite::new(
                s.clone(),
                ExpectedVersion::NoStream,
                vec![event("Committed.v1", serde_json::json!({}))],
            )],
            &probe,
        )
        .await
        .unwrap();
    assert_eq!(outcome.attempts, 3, "two failed COMMITs, then success");
    assert_eq!(probe.0.load(Ordering::SeqCst), 3);
    assert_eq!(event_count(&db.pool, Some(&s)).await, 1);
    assert_eq!(outcome.events[0].version, 1);

    // With a budget of 4 attempts, 10 failures exhaust it: a typed error, nothing written.
    sqlx::query("SELECT setval('commit_failures', 1, false)")
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query(
        "CREATE OR REPLACE FUNCTION fail_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
           IF nextval('commit_failures') <= 10 THEN \
             RAISE EXCEPTION 'injected serialization failure' USING ERRCODE = '40001'; \
           END IF; RETURN NULL; END $$",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let tight = store.clone().with_retry_policy(RetryPolicy {
        max_attempts: 4,
        ..RetryPolicy::default()
    });
    let probe = TouchProbe(AtomicU32::new(0));
    let err = tight
        .append_with(
            vec![StreamWrite::new(
                s.clone(),
                ExpectedVersion::Exact(1),
                vec![event("Committed.v1", serde_json::json!({}))],
            )],
            &probe,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            AppendError::SerializationRetriesExhausted { attempts: 4, .. }
        ),
        "{err}"
    );
    assert_eq!(
        probe.0.load(Ordering::SeqCst),
        4,
        "bounded: exactly 4 tries"
    );
    assert_eq!(store.stream_version(&s).await.unwrap(), 1);
    assert_eq!(event_count(&db.pool, Some(&s)).await, 1);
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
enum LampEvent {
    #[serde(rename = "LampInstalled.v1")]
    Installed { room: String },
    #[serde(rename = "LampSwitched.v1")]
    Switched { on: bool },
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
enum OldLampEvent {
    #[serde(rename = "LampInstalled.v1")]
    Installed { room: String },
}

#[tokio::test]
async fn typed_events_round_trip_through_the_store() {
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    let s = stream("lamp-1");
    let events = [
        LampEvent::Installed {
            room: "hall".into(),
        },
        LampEvent::Switched { on: true },
    ];
    let new: Vec<NewEvent> = events
        .iter()
        .map(|e| e.encode(Uuid::now_v7(), meta().with_epoch(2)).unwrap())
        .collect();
    store
        .append(vec![StreamWrite::new(
            s.clone(),
            ExpectedVersion::NoStream,
            new,
        )])
        .await
        .unwrap();
    let read = store.read_stream(&s, 1, 10).await.unwrap();
    assert_eq!(read[1].event_type, "LampSwitched.v1");
    assert_eq!(read[1].metadata.epoch, Some(2));
    let decoded: Vec<LampEvent> = read.iter().map(|e| e.decode().unwrap()).collect();
    assert_eq!(decoded, events);
    // A reader that predates LampSwitched.v1 gets a typed error, not a panic or a guess.
    assert!(matches!(
        read[1].decode::<OldLampEvent>(),
        Err(strata::events::DecodeError::UnknownType { .. })
    ));
    // Paging by version.
    assert_eq!(store.read_stream(&s, 2, 10).await.unwrap().len(), 1);
    assert_eq!(store.read_stream(&s, 1, 1).await.unwrap().len(), 1);
}

#[tokio::test]
async fn invalid_appends_are_refused_before_touching_the_database() {
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    let s = stream("bad-1");
    let e = event("X.v1", serde_json::json!({}));
    for writes in [
        vec![],
        vec![
            StreamWrite::new(s.clone(), ExpectedVersion::Any, vec![e.clone()]),
            StreamWrite::guard(s.clone(), ExpectedVersion::NoStream),
        ],
        vec![StreamWrite::new(
            s.clone(),
            ExpectedVersion::Any,
            vec![e.clone(), e.clone()],
        )],
        vec![StreamWrite::guard(s.clone(), ExpectedVersion::Any)],
    ] {
        assert!(matches!(
            store.append(writes).await,
            Err(AppendError::Invalid(_))
        ));
    }
    assert_eq!(event_count(&db.pool, None).await, 0);
}
