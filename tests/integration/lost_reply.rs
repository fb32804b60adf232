//! Issue 9, item 5: a reply lost after the commit of a worker's write. The store commits and
//! then answers with a connection error; that interleaving is produced with the store's fault
//! hook (`EventStore::lose_next_reply`, a fake for exactly this one fault, which no outside
//! signal can place between COMMIT and the reply). Real Postgres, real commands otherwise, and
//! for a checkpointed step's record a real build on a real sandbox.

use crate::common;

use std::time::Duration;

use common::build_api::{stream, Api};
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
    let claimed = attempt::acquire(&store, build, "node-a", LEASE)
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
    assert!(attempt::acquire(&store, build, "node-b", LEASE)
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
    let claimed = attempt::acquire(&store, build, "node-a", LEASE)
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
    let mut fx = Fixture::new(settings()).await;
    // The first append that writes a promotion stream is the one entering Publishing.
    fx.store.lose_next_reply("promotion");
    let (build, _) = build_losing_the_armed_reply(
        &fx,
        "lost-publish-reply",
        vec![step("RUN", &["echo published > /tmp/lost-publish"])],
    )
    .await;
    let types = event_types(&fx.store, build).await;
    let started = types
        .iter()
        .filter(|t| *t == "PublishingStarted.v1")
        .count();
    assert_eq!(started, 1, "Publishing entered once: {types:?}");
    let promotion = fx
        .store
        .read_stream_all(&stream(ids::stream::promotion(&build, Epoch::FIRST)))
        .await
        .unwrap();
    let types: Vec<&str> = promotion.iter().map(|e| e.event_type.as_str()).collect();
    let mut distinct = types.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        types.len(),
        "a promotion event stored twice: {types:?}"
    );
    fx.stop().await;
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
