//! Issue 9, item 5: a reply lost after the commit of a worker's or a reconciler's write. The
//! store commits and then answers with a connection error; that interleaving is produced with the
//! store's fault hook (`EventStore::lose_next_reply` by stream category, `lose_next_reply_to` by
//! event type: a fake for exactly this one fault, which no outside signal can place between
//! COMMIT and the reply). Real Postgres, real commands otherwise, and for the worker's writes
//! (checkpoint records, cache entries, layer leases, every promotion step) a real build on a real
//! sandbox. Each test asserts that the build still ends exactly once, with no event stored
//! twice and no build left Active or Publishing.

use crate::common;

use std::time::Duration;

use common::build_api::{stream, Api};
use common::publishing::enter_publishing;
use common::worker_fixture::{assert_ready, settings, step, Fixture};
use serde_json::json;
use strata::domain::build::{Phase, StepOutcome};
use strata::domain::ids::{self, BuildId, Epoch, TeamId};
use strata::events::command::load;
use strata::events::EventStore;
use strata::streams::Build;
use strata::worker::attempt;

const LEASE: Duration = Duration::from_secs(60);

async fn queued_build(store: &EventStore) -> BuildId {
    let api = Api {
        store: store.clone(),
        team: TeamId::parse("team-lost-reply").unwrap(),
    };
    let (_, build) = api.register("lost-reply").await;
    let run = |cmd: &str| json!({"type": "RUN", "args": [cmd], "force": false});
    api.start(
        build,
        json!({"fromImage": "busybox", "force": false, "steps": [run("true"), run("true")]}),
    )
    .await;
    build
}

async fn event_types(store: &EventStore, build: BuildId) -> Vec<String> {
    store
        .read_stream_all(&stream(ids::stream::build(&build)))
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.event_type)
        .collect()
}

/// `AcquireAttempt` commits and its reply is lost. Before: the worker got an error, dropped the
/// claim, and every later acquire answered "not queued": the build sat Active with nobody
/// running it until its lease passed. Now the retry is a replay and the worker keeps the claim.
#[tokio::test]
async fn a_lost_acquire_reply_keeps_the_claim() {
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    let build = queued_build(&store).await;

    store.lose_next_reply("build");
    let claimed = attempt::acquire(&store, build, "node-a", LEASE, None)
        .await
        .expect("a lost reply is retried, not reported")
        .expect("the retry finds the claim this node made");
    assert_eq!(claimed.epoch, Epoch::FIRST);
    assert_eq!(claimed.node, "node-a");
    let acquired = event_types(&store, build)
        .await
        .into_iter()
        .filter(|t| t.starts_with("AttemptAcquired"))
        .count();
    assert_eq!(acquired, 1, "the retry appended nothing");

    // The claim is usable: the attempt's own writes pass the fencing check.
    claimed.renew(LEASE).await.unwrap();
    // Another node still cannot take it.
    assert!(attempt::acquire(&store, build, "node-b", LEASE, None)
        .await
        .unwrap()
        .is_none());
}

/// Step completion commits and its reply is lost. Before: the worker abandoned a healthy
/// attempt. Now the retry is a replay: one `StepCompleted`, and the attempt goes on.
#[tokio::test]
async fn a_lost_step_completion_reply_is_a_replay() {
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    let build = queued_build(&store).await;
    let claimed = attempt::acquire(&store, build, "node-a", LEASE, None)
        .await
        .unwrap()
        .unwrap();

    store.lose_next_reply("build");
    claimed
        .record_step(1)
        .await
        .expect("a lost reply is retried, not reported");
    claimed.record_step(2).await.unwrap();
    let completed = event_types(&store, build)
        .await
        .into_iter()
        .filter(|t| t.starts_with("StepCompleted"))
        .count();
    assert_eq!(completed, 2, "one StepCompleted per step");
    let state = load::<Build>(&store, &stream(ids::stream::build(&build)))
        .await
        .unwrap()
        .state;
    assert!(
        matches!(state.phase, Phase::Active { epoch, .. } if epoch == Epoch::FIRST),
        "{:?}",
        state.phase
    );
}

/// A checkpointed step's record (its snapshot, its completion and its layers' references, in one
/// append named by the step) commits and its reply is lost, in a real build on a real sandbox.
/// The retry is a replay: one completion, one snapshot record, one reference per layer, and the
/// attempt goes on to Ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_reply_to_a_checkpointed_steps_record_is_a_replay() {
    let mut fx = Fixture::new(settings()).await;
    // The first append that writes a snapshot stream is step 1's checkpoint record.
    fx.store.lose_next_reply("snapshot");
    let (build, state) = build_losing_the_armed_reply(
        &fx,
        "lost-checkpoint-reply",
        vec![
            step("RUN", &["echo one > /tmp/lost-reply-one"]),
            step("RUN", &["echo two > /tmp/lost-reply-two"]),
        ],
    )
    .await;

    let types = event_types(&fx.store, build).await;
    let completed = types.iter().filter(|t| *t == "StepCompleted.v1").count();
    assert_eq!(completed, 2, "one StepCompleted per step: {types:?}");
    let Some(StepOutcome::Checkpointed { snapshot }) = state.progress.get(&1) else {
        panic!("step 1 is checkpointed: {:?}", state.progress)
    };
    let recorded = fx
        .store
        .read_stream_all(&stream(ids::stream::snapshot(snapshot)))
        .await
        .unwrap();
    assert_eq!(
        recorded
            .iter()
            .map(|e| e.event_type.as_str())
            .collect::<Vec<_>>(),
        ["SnapshotRecorded.v1"],
        "one snapshot record"
    );
    let layers =
        load::<strata::streams::Snapshot>(&fx.store, &stream(ids::stream::snapshot(snapshot)))
            .await
            .unwrap()
            .state
            .record
            .unwrap()
            .layers;
    let by = format!("build {build} attempt 1 snapshot {snapshot}");
    for layer in &layers {
        let references = fx
            .store
            .read_stream_all(&stream(ids::stream::object(layer)))
            .await
            .unwrap()
            .into_iter()
            .filter(|e| e.data["by"] == by.as_str())
            .count();
        // Layers used within the last few minutes (the base, by other builds) are guarded, not
        // referenced again (`object::USE_REFRESH`); none is referenced twice by the retry.
        assert!(
            references <= 1,
            "layer {layer} is referenced {references} times by the record"
        );
        if Some(layer) == layers.last() {
            assert_eq!(
                references, 1,
                "the step's own new layer is registered by the record"
            );
        }
    }
    fx.stop().await;
}

/// Entering Publishing (the build's `PublishingStarted` and the staged promotion, in one append
/// to the build and `promotion-…` streams) commits and its reply is lost, in a real build: the
/// attempt still finishes the build, and no promotion event is stored twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_reply_on_entering_publishing_still_finishes_the_build_once() {
    // The first append that writes a promotion stream is the one entering Publishing.
    let (mut fx, build, _) =
        one_step_build_losing("lost-publish-reply", |s| s.lose_next_reply("promotion")).await;
    let types = event_types(&fx.store, build).await;
    assert_counts(&types, &[("PublishingStarted.v1", 1)]);
    assert_none_twice("promotion", &promotion_types(&fx.store, build).await);
    fx.stop().await;
}

/// A fixture that builds one RUN step on busybox with the lost reply `arm` sets up, checked by
/// [`build_losing_the_armed_reply`]; the caller stops the fixture.
async fn one_step_build_losing(
    name: &str,
    arm: impl FnOnce(&EventStore),
) -> (Fixture, BuildId, strata::domain::build::State) {
    let fx = Fixture::new(settings()).await;
    arm(&fx.store);
    let (build, state) = build_losing_the_armed_reply(
        &fx,
        name,
        vec![step("RUN", &[&format!("echo {name} > /tmp/{name}")])],
    )
    .await;
    (fx, build, state)
}

/// Builds `steps` on busybox with a lost reply armed, and checks the reply was lost and the
/// attempt that lost it still finished the build.
async fn build_losing_the_armed_reply(
    fx: &Fixture,
    name: &str,
    steps: Vec<serde_json::Value>,
) -> (BuildId, strata::domain::build::State) {
    let (build, state) = fx
        .build(
            name,
            &[],
            json!({"fromImage": "busybox", "force": false, "steps": steps}),
        )
        .await;
    assert_eq!(fx.store.lost_replies_pending(), 0, "the reply was lost");
    assert_ready(&state);
    assert!(
        matches!(state.phase, Phase::Ready { epoch } if epoch == Epoch::FIRST),
        "the attempt that lost the reply finished the build: {:?}",
        state.phase
    );
    (build, state)
}

// ---------------------------------------------------------------------------------------------
// Promotion steps after staging, driven by the worker
// ---------------------------------------------------------------------------------------------

/// Committing the layers (`staged -> layers_committed`, one append to the outbox) commits and its
/// reply is lost while the worker drives its own promotion: the worker's retry finds the step
/// taken and goes on; every promotion event is stored once and the build is Ready in epoch 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_reply_on_committing_the_layers_still_finishes_the_build_once() {
    worker_loses_a_promotion_reply("PromotionLayersCommitted.v1", "lost-commit-reply").await;
}

/// The flip to visible (the outbox's `PromotionVisible`, the template's `TagsAssigned` and a
/// guard on the build, in one append) commits and its reply is lost while the worker drives its
/// promotion: the tags are assigned once, and the build is Ready once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_reply_on_the_flip_to_visible_still_finishes_the_build_once() {
    worker_loses_a_promotion_reply("PromotionVisible.v1", "lost-visible-reply").await;
}

/// The last step (the build's `BuildReady` and the outbox's `PromotionDone`, in one append)
/// commits and its reply is lost: the worker's retry finds the build Ready in its own epoch and
/// reports the build published, with nothing appended twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_reply_on_marking_the_build_ready_still_finishes_it_once() {
    worker_loses_a_promotion_reply("BuildReady.v1", "lost-ready-reply").await;
}

async fn worker_loses_a_promotion_reply(event_type: &str, name: &str) {
    let (mut fx, build, state) =
        one_step_build_losing(name, |s| s.lose_next_reply_to(event_type)).await;
    assert_promoted_once(&fx.store, &fx.db.pool, build, &state).await;
    fx.stop().await;
}

/// The build was published exactly once: one `PublishingStarted` and one `BuildReady` (no
/// failure), the outbox's four steps once each and in order, the template's tags assigned to it
/// once, and the read model says ready.
async fn assert_promoted_once(
    store: &EventStore,
    pool: &sqlx::PgPool,
    build: BuildId,
    state: &strata::domain::build::State,
) {
    assert_counts(
        &event_types(store, build).await,
        &[
            ("PublishingStarted.v1", 1),
            ("BuildReady.v1", 1),
            ("BuildFailed.v1", 0),
            ("ContextReleased.v1", 1),
        ],
    );
    assert_eq!(
        promotion_types(store, build).await,
        [
            "PromotionStaged.v1",
            "PromotionLayersCommitted.v1",
            "PromotionVisible.v1",
            "PromotionDone.v1"
        ]
    );
    let template = state.registration.as_ref().unwrap().template.clone();
    let assigned = store
        .read_stream_all(&stream(ids::stream::template(&template)))
        .await
        .unwrap()
        .into_iter()
        .filter(|e| {
            e.event_type == "TagsAssigned.v1" && e.data["build"] == build.to_string().as_str()
        })
        .count();
    assert_eq!(assigned, 1, "the tags are assigned to the build once");
    assert_eq!(read_model_phase(pool, build).await, "ready");
}

/// Each of `expected`'s event types occurs in `types` exactly as often as it says.
fn assert_counts(types: &[String], expected: &[(&str, usize)]) {
    for &(event_type, n) in expected {
        let found = types.iter().filter(|t| *t == event_type).count();
        assert_eq!(found, n, "{event_type} in {types:?}");
    }
}

/// No event type occurs twice in `types`, read from one `what` stream.
fn assert_none_twice(what: &str, types: &[String]) {
    let mut distinct = types.to_vec();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        types.len(),
        "a {what} event stored twice: {types:?}"
    );
}

async fn promotion_types(store: &EventStore, build: BuildId) -> Vec<String> {
    store
        .read_stream_all(&stream(ids::stream::promotion(&build, Epoch::FIRST)))
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.event_type)
        .collect()
}

async fn read_model_phase(pool: &sqlx::PgPool, build: BuildId) -> String {
    sqlx::query_scalar("SELECT phase FROM builds WHERE build_id = $1")
        .bind(build.as_uuid())
        .fetch_one(pool)
        .await
        .unwrap()
}

// ---------------------------------------------------------------------------------------------
// Promotion steps after staging, driven by the promotion reconciler
// ---------------------------------------------------------------------------------------------

/// A build whose node entered Publishing (the build and the staged outbox, one append, with a
/// plan of no layers) and then died: what the promotion reconciler finds.
async fn publishing_build(store: &EventStore, name: &str) -> (ids::TemplateId, BuildId) {
    use strata::domain::build::AttemptGrant;
    use strata::domain::ids::NodeId;

    let api = Api {
        store: store.clone(),
        team: TeamId::parse("team-lost-reply").unwrap(),
    };
    let (template, build) = api.register(name).await;
    api.start(
        build,
        json!({"fromImage": "busybox", "force": false, "steps": [{"type": "RUN", "args": ["true"], "force": false}]}),
    )
    .await;
    let now = strata::streams::database_now(store.pool()).await.unwrap();
    strata::app::attempt::acquire_attempt(
        store,
        &common::build_api::api_context(),
        build,
        None,
        AttemptGrant {
            node: NodeId::parse("died-publishing").unwrap(),
            lease_expires_at: now + chrono::Duration::minutes(5),
        },
        now,
    )
    .await
    .unwrap();
    enter_publishing(store, build, &template).await;
    (template, build)
}

fn reconciler_env(store: &EventStore) -> strata::reconcilers::ReconcileEnv {
    strata::reconcilers::ReconcileEnv {
        store: store.clone(),
        node: "lost-reply-reconciler".into(),
        blobs: common::sandbox::backend().blobs(),
        gc: Default::default(),
        catalog: None,
    }
}

/// Each promotion step after staging, driven by the promotion reconciler, commits and its reply
/// is lost: that pass fails (counted as failed, never as done or skipped), the next pass finishes
/// the promotion from where the committed step left it, and the one after finds nothing to do.
/// Every step is stored once and the build is Ready once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_reply_in_any_promotion_step_of_the_reconciler_fails_one_pass_and_the_next_finishes()
{
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    let env = reconciler_env(&store);
    for (i, event_type) in [
        "PromotionLayersCommitted.v1",
        "PromotionVisible.v1",
        "BuildReady.v1",
    ]
    .into_iter()
    .enumerate()
    {
        let (_, build) = publishing_build(&store, &format!("reconciled-{i}")).await;
        store.lose_next_reply_to(event_type);
        let failed = strata::reconcilers::promotion::finish(&env, build).await;
        assert!(
            failed.is_err(),
            "{event_type}: the pass that lost the reply fails: {failed:?}"
        );
        assert_eq!(
            store.lost_replies_pending(),
            0,
            "{event_type}: the reply was lost"
        );
        // The next pass finishes whatever is left (after a lost BuildReady, nothing is).
        let next = strata::reconcilers::promotion::finish(&env, build).await;
        assert_eq!(
            next.unwrap(),
            event_type != "BuildReady.v1",
            "{event_type}: the next pass"
        );
        let again = strata::reconcilers::promotion::finish(&env, build).await;
        assert!(!again.unwrap(), "{event_type}: nothing is left to do");
        let state = load::<Build>(&store, &stream(ids::stream::build(&build)))
            .await
            .unwrap()
            .state;
        assert!(
            matches!(state.phase, Phase::Ready { epoch } if epoch == Epoch::FIRST),
            "{event_type}: {:?}",
            state.phase
        );
        assert_promoted_once(&store, &db.pool, build, &state).await;
    }
}

/// The template was deleted while its build was publishing on a node that died; the promotion
/// reconciler's abandonment (the outbox's `PromotionAbandoned`, the build's `error`, guarded by
/// the template, in one append) commits and its reply is lost. That pass fails; the next finds
/// the outbox abandoned and the build in `error` (TemplateDeleted), and appends nothing: one
/// failure, one abandonment, one release.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_reply_on_abandoning_a_deleted_templates_promotion_ends_the_build_once() {
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    let env = reconciler_env(&store);
    let (template, build) = publishing_build(&store, "abandoned").await;
    let team = TeamId::parse("team-lost-reply").unwrap();
    let now = strata::streams::database_now(store.pool()).await.unwrap();
    strata::app::template::delete_template(
        &store,
        &common::build_api::api_context(),
        &team,
        &template,
        now,
    )
    .await
    .unwrap();

    store.lose_next_reply_to("PromotionAbandoned.v1");
    let failed = strata::reconcilers::promotion::finish(&env, build).await;
    assert!(
        failed.is_err(),
        "the pass that lost the reply fails: {failed:?}"
    );
    assert_eq!(store.lost_replies_pending(), 0, "the reply was lost");
    let next = strata::reconcilers::promotion::finish(&env, build).await;
    assert!(!next.unwrap(), "the next pass finds the build ended");

    let state = load::<Build>(&store, &stream(ids::stream::build(&build)))
        .await
        .unwrap()
        .state;
    let Phase::Error { reason, .. } = &state.phase else {
        panic!("expected error, got {:?}", state.phase)
    };
    assert_eq!(
        reason.kind,
        strata::domain::build::FailureKind::TemplateDeleted
    );
    assert_counts(
        &event_types(&store, build).await,
        &[
            ("BuildFailed.v1", 1),
            ("ContextReleased.v1", 1),
            ("BuildReady.v1", 0),
        ],
    );
    assert_eq!(
        promotion_types(&store, build).await,
        [
            "PromotionStaged.v1",
            "PromotionLayersCommitted.v1",
            "PromotionAbandoned.v1"
        ]
    );
    assert_eq!(read_model_phase(&db.pool, build).await, "error");
}

// ---------------------------------------------------------------------------------------------
// The worker's other multi-stream writes
// ---------------------------------------------------------------------------------------------

/// The attempt's lease on the layers it boots on (one append over their `object-…` streams)
/// commits and its reply is lost. The lease is the attempt's write like any other: retried, and
/// the attempt that lost the reply builds the template, with the lease stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_reply_to_the_boot_lease_on_the_base_layers_still_builds_once() {
    let (mut fx, build, state) = one_step_build_losing("lost-lease-reply", |s| {
        s.lose_next_reply_to("ObjectLeased.v1")
    })
    .await;
    assert_promoted_once(&fx.store, &fx.db.pool, build, &state).await;
    let holder = format!("build {build} attempt 1");
    let mut leased = 0;
    for object in fx.store.streams_with_prefix("object-").await.unwrap() {
        let leases = fx
            .store
            .read_stream_all(&stream(object.clone()))
            .await
            .unwrap()
            .into_iter()
            .filter(|e| e.event_type == "ObjectLeased.v1" && e.data["holder"] == holder.as_str())
            .count();
        assert!(leases <= 1, "{object} leased {leases} times by the attempt");
        leased += leases;
    }
    // Without this, a holder string that matched nothing would pass the loop above.
    assert!(
        leased > 0,
        "the attempt's lease on its base layers is stored"
    );
    fx.stop().await;
}

/// A cache entry (the `cachekey-…` stream, guarded by the build, in one append) commits and its
/// reply is lost. The retry finds the entry there and the build goes on publishing its later
/// entries: every checkpointed step and the final result have one entry each, and an identical
/// build is then served from the final entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_reply_to_a_cache_entry_keeps_the_builds_later_entries() {
    let mut fx = Fixture::new(settings()).await;
    fx.store.lose_next_reply_to("CacheEntryPublished.v1");
    let steps = vec![
        step("RUN", &["echo one > /tmp/lost-entry-one"]),
        step("RUN", &["echo two > /tmp/lost-entry-two"]),
    ];
    let (build, state) = build_losing_the_armed_reply(&fx, "lost-entry-reply", steps.clone()).await;
    assert_promoted_once(&fx.store, &fx.db.pool, build, &state).await;
    // Two checkpointed steps and the final result, whose entry is written once the build is
    // Ready (so it may still be on its way).
    let mut keys = fx.store.streams_with_prefix("cachekey-").await.unwrap();
    let waited = std::time::Instant::now();
    while keys.len() < 3 && waited.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        keys = fx.store.streams_with_prefix("cachekey-").await.unwrap();
    }
    assert_eq!(keys.len(), 3, "{keys:?}");
    for key in &keys {
        let types: Vec<String> = fx
            .store
            .read_stream_all(&stream(key.clone()))
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.event_type)
            .collect();
        assert_eq!(types, ["CacheEntryPublished.v1"], "{key}");
    }
    let logs = fx.logs(build).await;
    assert!(
        logs.iter()
            .all(|(_, _, m, _)| !m.contains("not publishing")),
        "{logs:?}"
    );

    let (again, _) = fx
        .build(
            "lost-entry-reply",
            &[],
            json!({"fromImage": "busybox", "force": false, "steps": steps}),
        )
        .await;
    let consulted: Vec<serde_json::Value> = fx
        .store
        .read_stream_all(&stream(ids::stream::build(&again)))
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.event_type == "CacheConsulted.v1")
        .map(|e| e.data)
        .collect();
    assert!(
        consulted
            .iter()
            .any(|c| c["consultation"]["found"]["kind"] == "final"),
        "the identical build is served from the final entry: {consulted:?}"
    );
    fx.stop().await;
}

// ---------------------------------------------------------------------------------------------
// The API's multi-stream writes: a client retries with a new request
// ---------------------------------------------------------------------------------------------

/// An upload's completion (the build's intent and binding, the `files-…` generation and the
/// bytes' object reference, in one append) commits and its reply is lost: the client sees a
/// failed PUT and sends it again, a new request with a new command id. The retry is answered as
/// done, nothing is stored twice, and the build made from that context is Ready once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_reply_on_completing_an_upload_is_answered_by_the_retried_put() {
    use common::worker_fixture::{copy, files_hash, single_file_tar};
    use strata::app::upload::complete_upload;

    let mut fx = Fixture::new(settings()).await;
    let (_, build) = fx.api.register("lost-upload-reply").await;
    let hash = files_hash("lost-upload-reply");
    let bytes = single_file_tar("hello.txt", b"hello after a lost reply\n");
    let completion = fx
        .api
        .upload_until_completion(&fx.blobs, build, &hash, &bytes)
        .await;

    fx.store.lose_next_reply_to("UploadCompleted.v1");
    let lost = complete_upload(&fx.store, &common::build_api::api_context(), &completion).await;
    assert!(lost.is_err(), "the reply was lost: {lost:?}");
    assert_eq!(fx.store.lost_replies_pending(), 0);
    complete_upload(&fx.store, &common::build_api::api_context(), &completion)
        .await
        .expect("the retried PUT is answered as done");

    assert_counts(
        &event_types(&fx.store, build).await,
        &[("UploadCompleted.v1", 1), ("ContextBound.v1", 1)],
    );
    let scope = ids::Scope::team(&fx.api.team);
    let files: Vec<String> = fx
        .store
        .read_stream_all(&stream(ids::stream::files(&scope, &hash)))
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.event_type)
        .collect();
    assert_none_twice("files", &files);

    fx.api
        .start(
            build,
            json!({"fromImage": "busybox", "force": false, "steps": [
                copy("hello.txt", "/srv/", "root", "0644", &hash),
            ]}),
        )
        .await;
    let state = fx.wait_terminal(build).await;
    assert_ready(&state);
    assert_promoted_once(&fx.store, &fx.db.pool, build, &state).await;
    fx.stop().await;
}

/// A template's deletion (the template, its name claims and the `error` of its queued build, in
/// one append) commits and its reply is lost: the client sends `DELETE` again, a new command,
/// which the template refuses as already deleted (the handler answers that with 204). The queued
/// build ended once, saying why, and no node claims it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_reply_on_deleting_a_template_ends_its_queued_build_once() {
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    let team = TeamId::parse("team-lost-reply").unwrap();
    let api = Api {
        store: store.clone(),
        team: team.clone(),
    };
    let (template, build) = api.register("deleted-lost-reply").await;
    api.start(
        build,
        json!({"fromImage": "busybox", "force": false, "steps": [{"type": "RUN", "args": ["true"], "force": false}]}),
    )
    .await;

    let delete = || async {
        let now = strata::streams::database_now(store.pool()).await.unwrap();
        strata::app::template::delete_template(
            &store,
            &common::build_api::api_context(),
            &team,
            &template,
            now,
        )
        .await
    };
    store.lose_next_reply_to("TemplateDeleted.v1");
    let lost = delete().await;
    assert!(lost.is_err(), "the reply was lost: {lost:?}");
    assert_eq!(store.lost_replies_pending(), 0);
    match delete().await {
        Err(strata::events::CommandError::Rejected(strata::domain::template::Error::Deleted)) => {}
        other => panic!("the retried DELETE finds the template deleted: {other:?}"),
    }

    assert_counts(
        &event_types(&store, build).await,
        &[("BuildFailed.v1", 1), ("ContextReleased.v1", 1)],
    );
    let template_events: Vec<String> = store
        .read_stream_all(&stream(ids::stream::template(&template)))
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.event_type)
        .collect();
    let deleted = template_events
        .iter()
        .filter(|t| *t == "TemplateDeleted.v1")
        .count();
    assert_eq!(deleted, 1, "{template_events:?}");
    assert_eq!(read_model_phase(&db.pool, build).await, "error");
    assert!(
        attempt::acquire(&store, build, "node-a", LEASE, None)
            .await
            .unwrap()
            .is_none(),
        "no node claims the ended build"
    );
}

/// `POST /v2/templates/{id}/builds/{bid}` with private-registry credentials: the start (the
/// freeze that queues the build) commits and its reply is lost, so the handler sees a store
/// error. Before: it took any error after sealing for a refusal and deleted the sealed
/// credentials, so the node that claimed the queued build found none and failed at `base`. Now
/// only a refusal deletes them, and the client's retry (a new request with the same body) is a
/// replay of the first start.
#[tokio::test]
async fn a_lost_reply_on_starting_a_build_keeps_its_sealed_registry_credentials() {
    use strata::registry::sealed;

    let db = common::test_db().await;
    let data = common::data_dir();
    let api = common::api::serve(db.pool.clone(), data.path(), None, &[]).await;
    let client = common::http_build::SdkClient::new(&api.base, &db.url, "team-lost-start").await;
    let (template, build) = client.register("lost-start").await;
    let build = BuildId::parse(&build).unwrap();
    let path = format!("/v2/templates/{template}/builds/{build}");
    let body = json!({
        "fromImage": "registry.example/private/app:1",
        "fromImageRegistry": {"type": "registry", "username": "u", "password": "secret"},
        "force": false,
        "steps": [{"type": "RUN", "args": ["true"], "force": false}],
    });

    api.state.events.lose_next_reply_to("BuildFrozen.v1");
    let (status, reply) = client
        .call(reqwest::Method::POST, &path, Some(body.clone()))
        .await;
    assert!(status >= 500, "the reply was lost: {status} {reply}");
    assert_eq!(api.state.events.lost_replies_pending(), 0);

    // The start committed: a node claims the queued build before the client retries, and the
    // credentials it needs at `base` are there.
    let store = api.state.events.clone();
    let epoch = attempt::acquire(&store, build, "node-a", LEASE, None)
        .await
        .unwrap()
        .expect("the committed start queued the build")
        .epoch;
    let opened = sealed::load(&db.pool, &api.state.credential_seal, &build, epoch)
        .await
        .unwrap();
    assert!(
        matches!(
            opened,
            Some(strata::domain::build_spec::RegistryCredentials::Registry { ref username, .. })
                if username == "u"
        ),
        "the claiming node reads the build's registry credentials"
    );

    // The retried request is answered as the start it repeats, and stores nothing new.
    let (status, reply) = client.call(reqwest::Method::POST, &path, Some(body)).await;
    assert_eq!(status, 202, "{reply}");
    assert_counts(&event_types(&store, build).await, &[("BuildFrozen.v1", 1)]);
    assert!(sealed::is_stored(&db.pool, &build).await.unwrap());
}
