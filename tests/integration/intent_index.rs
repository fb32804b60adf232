//! The `upload_intents` read model (migration 0016): the pending upload intents of waiting
//! builds, kept inline with the build streams, so the intent-expiry pass reads the streams of the
//! builds with an intent due and no others. Real Postgres, real commands.

use crate::common;

use std::sync::Arc;

use chrono::{Duration, Utc};
use common::build_api::Api;
use serde_json::json;
use strata::domain::ids::{BuildId, FilesHash, TeamId};
use strata::events::EventStore;
use strata::reconcilers::{ReconcileEnv, Reconciler};
use uuid::Uuid;

fn hash(n: u32) -> FilesHash {
    FilesHash::parse(&hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
        n.to_be_bytes(),
    )))
    .unwrap()
}

async fn pending(pool: &sqlx::PgPool, build: BuildId) -> Vec<Uuid> {
    sqlx::query_scalar(
        "SELECT intent_id FROM upload_intents WHERE build_id = $1 ORDER BY intent_id",
    )
    .bind(build.as_uuid())
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn pending_intents_follow_the_build_stream() {
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    let api = Api {
        store: store.clone(),
        team: TeamId::parse("team-intent-index").unwrap(),
    };
    let (_, build) = api.register("intent-index").await;
    let later = Utc::now() + Duration::hours(1);
    let first = api.reserve(build, &hash(1), later).await;
    let second = api.reserve(build, &hash(2), later).await;
    let mut both = vec![first.as_uuid(), second.as_uuid()];
    both.sort();
    assert_eq!(
        pending(&db.pool, build).await,
        both,
        "each reserved intent is pending"
    );

    // An upload reserves an intent of its own and completes it.
    let blobs_dir = tempfile::tempdir().unwrap();
    let blobs: std::sync::Arc<dyn strata::vmm::BlobStore> =
        std::sync::Arc::new(strata::vmm::LocalBlobStore::open(blobs_dir.path()).unwrap());
    api.upload(&blobs, build, &hash(3), b"context").await;
    assert_eq!(
        pending(&db.pool, build).await,
        both,
        "a completed upload's intent is not pending"
    );
    let completed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM events WHERE stream_id = $1 AND type = 'UploadCompleted.v1'",
    )
    .bind(format!("build-{}", build.as_uuid()))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(completed, 1, "the upload completed");

    api.start(
        build,
        json!({"fromImage": "busybox", "force": false, "steps": []}),
    )
    .await;
    assert!(
        pending(&db.pool, build).await.is_empty(),
        "a build past Waiting has no intent to expire"
    );
}

#[tokio::test]
async fn the_intent_expiry_pass_reads_only_builds_with_an_intent_due() {
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    let api = Api {
        store: store.clone(),
        team: TeamId::parse("team-intent-due").unwrap(),
    };
    // Many waiting builds with an intent not yet due, one with an intent due.
    for i in 0..20 {
        let (_, build) = api.register(&format!("not-due-{i}")).await;
        api.reserve(build, &hash(i), Utc::now() + Duration::hours(1))
            .await;
    }
    let (_, due) = api.register("due").await;
    api.reserve(due, &hash(100), Utc::now() - Duration::seconds(1))
        .await;
    // A waiting build whose stream cannot be read: a pass that reads every waiting build's
    // stream fails on it; one that reads only builds with an intent due never sees it.
    let (_, unreadable) = api.register("unreadable").await;
    api.reserve(unreadable, &hash(200), Utc::now() + Duration::hours(1))
        .await;
    let bstream = format!("build-{}", unreadable.as_uuid());
    sqlx::query("UPDATE streams SET version = version + 1 WHERE stream_id = $1")
        .bind(&bstream)
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO events (stream_id, version, event_id, type, data, metadata)
         SELECT $1, version, gen_random_uuid(), 'Unknown.v9', '{}', '{}' FROM streams WHERE stream_id = $1",
    )
    .bind(&bstream)
    .execute(&db.pool)
    .await
    .unwrap();

    let blobs_dir = tempfile::tempdir().unwrap();
    let env = ReconcileEnv {
        store: store.clone(),
        node: "test-node".into(),
        blobs: Arc::new(strata::vmm::LocalBlobStore::open(blobs_dir.path()).unwrap()),
        gc: Default::default(),
        catalog: None,
    };
    let pass = Reconciler::IntentExpiry.pass(&env).await.unwrap();
    assert_eq!(pass.candidates, 1, "one intent was due");
    assert_eq!(pass.applied, 1, "and it expired");
    assert_eq!(
        pass.failed, 0,
        "the pass read no stream of a build without an intent due"
    );
    assert!(
        pending(&db.pool, due).await.is_empty(),
        "expired: no longer pending"
    );
}

#[tokio::test]
async fn the_migration_lists_the_pending_intents_of_builds_already_waiting() {
    let db = common::test_db_at_migration(11).await;
    // Written under the old schema: no projection knows `upload_intents` yet.
    let bare = EventStore::with_standing_projections(db.pool.clone(), vec![]);
    let api = Api {
        store: bare.clone(),
        team: TeamId::parse("team-intent-migration").unwrap(),
    };
    let (template, build) = api.register("before-0016").await;
    let pending_one = api
        .reserve(build, &hash(1), Utc::now() + Duration::hours(1))
        .await;
    let blobs_dir = tempfile::tempdir().unwrap();
    let blobs: std::sync::Arc<dyn strata::vmm::BlobStore> =
        std::sync::Arc::new(strata::vmm::LocalBlobStore::open(blobs_dir.path()).unwrap());
    api.upload(&blobs, build, &hash(2), b"context").await;
    sqlx::query(
        "INSERT INTO builds (build_id, template_id, team_id, phase, registered_at, updated_at, stream_version)
         VALUES ($1, $2, 'team-intent-migration', 'waiting', now(), now(), 1)",
    )
    .bind(build.as_uuid())
    .bind(template.as_str())
    .execute(&db.pool)
    .await
    .unwrap();

    strata::db::migrate(&db.pool).await.unwrap();
    assert_eq!(
        pending(&db.pool, build).await,
        vec![pending_one.as_uuid()],
        "the reserved intent is pending, the completed one is not"
    );
}
