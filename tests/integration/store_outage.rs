//! A brief database outage in the middle of a worker's multi-stream writes is an outage, not
//! fencing: the worker retries within its lease and the build still ends Ready; the promotion
//! reconciler counts such a pass as failed (and retries it), never as nothing to do.
//!
//! The outage is real: the test database refuses connections and every open one is terminated
//! (`common::process::Outage`). The moment is chosen with a `STRATA_FAULT_STOP_AT` stop point:
//! the process stops itself there, the outage begins, and the process is resumed into it.

use crate::common;

use std::time::{Duration, Instant};

use common::build_api::{stream, Api};
use common::process::{Outage, Proc};
use serde_json::json;
use strata::domain::build::Phase;
use strata::domain::ids::{self, BuildId, Epoch, TeamId};
use strata::events::command::load;
use strata::events::EventStore;
use strata::fault::{CRASH_AT_ENV, STOP_AT_ENV};
use strata::streams::Build;

fn api(store: &EventStore) -> Api {
    Api {
        store: store.clone(),
        team: TeamId::parse(&format!(
            "team{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ))
        .unwrap(),
    }
}

fn recipe() -> serde_json::Value {
    json!({"fromImage": "busybox", "force": false, "steps": [
        {"type": "RUN", "args": ["echo hi > /tmp/hi"], "force": false}
    ]})
}

async fn phase(store: &EventStore, build: BuildId) -> Phase {
    load::<Build>(store, &stream(ids::stream::build(&build)))
        .await
        .unwrap()
        .state
        .phase
}

/// Polls (through the outage's aftermath: the pool reconnects) until the build is terminal.
async fn wait_terminal(store: &EventStore, build: BuildId, limit: Duration) -> Phase {
    let start = Instant::now();
    loop {
        if let Ok(loaded) = load::<Build>(store, &stream(ids::stream::build(&build))).await {
            if loaded.state.phase.is_terminal() {
                return loaded.state.phase;
            }
        }
        assert!(start.elapsed() < limit, "build {build} did not finish");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_brief_store_outage_while_publishing_does_not_abandon_the_build() {
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    let api = api(&store);
    let (_, build) = api.register("outage").await;
    api.start(build, recipe()).await;
    let (worker, _reconciler) = worker_stopped_at(&db, "outage", "worker:before-publishing").await;
    let log = resume_through_an_outage(&db, &store, build, worker).await;
    assert!(
        log.contains("the store is unavailable; retrying within the lease"),
        "the outage is logged as an error and retried:\n{log}"
    );
}

/// Starts a worker that stops itself at `stop_at`, with a reconciler beside it, and waits until
/// it has stopped. The lease is far longer than the outage: the attempt holds the build
/// throughout. Expiry and promotion run as in production, to end whatever the worker leaves.
async fn worker_stopped_at(db: &common::TestDb, node: &str, stop_at: &str) -> (Proc, Proc) {
    let mut worker = Proc::worker(
        &db.url,
        &format!("{node}-node"),
        15,
        &[(STOP_AT_ENV, stop_at)],
    );
    let reconciler = Proc::reconciler(&db.url, &format!("{node}-reconciler"), &[], &[]);
    worker.wait_stopped(Duration::from_secs(120)).await;
    (worker, reconciler)
}

/// Takes the database away, resumes the stopped worker into the outage, brings the database back
/// after 2 s, and waits for the build to end: the attempt that rode out the outage must finish it,
/// and nothing may take the outage for fencing. Returns the worker's log.
async fn resume_through_an_outage(
    db: &common::TestDb,
    store: &EventStore,
    build: BuildId,
    worker: Proc,
) -> String {
    let outage = Outage::begin(&db.name).await;
    worker.resume();
    tokio::time::sleep(Duration::from_secs(2)).await;
    outage.end().await;

    let phase = wait_terminal(store, build, Duration::from_secs(60)).await;
    let log = worker.stderr();
    assert!(
        matches!(phase, Phase::Ready { epoch: Epoch(1) }),
        "the attempt that rode out the outage finishes the build: {phase:?}\n{log}"
    );
    assert!(
        !log.contains("is closed"),
        "nothing was taken for fencing:\n{log}"
    );
    log
}

/// The same outage at a checkpointed step's record: the snapshot, the step's completion and
/// the layers' references in one multi-stream append. It is retried within the lease (logged),
/// lands once, and the attempt goes on to Ready; nothing takes the outage for fencing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_brief_store_outage_while_recording_a_checkpoint_does_not_abandon_the_build() {
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    let api = api(&store);
    let (_, build) = api.register("outage-checkpoint").await;
    api.start(build, recipe()).await;
    let (worker, _reconciler) =
        worker_stopped_at(&db, "outage-checkpoint", "worker:before-checkpoint-record").await;
    let before = step_completions(&store, build).await;
    assert_eq!(before, 0, "stopped before the step was recorded");

    let log = resume_through_an_outage(&db, &store, build, worker).await;
    assert_eq!(
        step_completions(&store, build).await,
        1,
        "the step is recorded once"
    );
    assert!(
        log.lines().any(
            |l| l.contains("the store is unavailable; retrying within the lease")
                && l.contains("recording a snapshot")
        ),
        "the outage at the checkpoint's record is logged as an error and retried:\n{log}"
    );
}

async fn step_completions(store: &EventStore, build: BuildId) -> usize {
    store
        .read_stream_all(&stream(ids::stream::build(&build)))
        .await
        .unwrap()
        .iter()
        .filter(|e| e.event_type == "StepCompleted.v1")
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_outage_in_a_promotion_pass_is_a_failed_pass_not_a_skip() {
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    let api = api(&store);
    let (_, build) = api.register("outage-reconciler").await;
    api.start(build, recipe()).await;
    let mut worker = Proc::worker(
        &db.url,
        "dies-promoting",
        2,
        &[(CRASH_AT_ENV, "promotion:after-layers-committed")],
    );
    worker.wait_exit(Duration::from_secs(120)).await;
    assert!(matches!(
        phase(&store, build).await,
        Phase::Publishing { .. }
    ));

    let mut reconciler = Proc::reconciler(
        &db.url,
        "promotion-reconciler",
        &["promotion"],
        &[(STOP_AT_ENV, "promotion:before-visible")],
    );
    reconciler.wait_stopped(Duration::from_secs(30)).await;
    let outage = Outage::begin(&db.name).await;
    reconciler.resume();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    outage.end().await;

    let phase = wait_terminal(&store, build, Duration::from_secs(30)).await;
    assert!(
        matches!(phase, Phase::Ready { epoch: Epoch(1) }),
        "{phase:?}"
    );
    let log = reconciler.stderr();
    assert!(
        log.contains("promotion failed; retrying next pass"),
        "the pass that met the outage counts the build as failed:\n{log}"
    );
}
