//! Deleting a template while one of its builds is queued, running, or publishing on a node that
//! died: the build ends in `error` with a reason that says the template was deleted, and nothing
//! keeps working on it (no node claims it, the running node stops, the promotion reconciler does
//! not re-drive it). The delete is the real `DELETE /templates/{id}` over HTTP; builds are real.

use crate::common;

use std::time::{Duration, Instant};

use common::process::Proc;
use common::worker_fixture::{settings, Fixture};
use serde_json::{json, Value};
use strata::domain::build::{FailureKind, Phase};
use strata::domain::ids::{self, BuildId, Epoch, TemplateId};
use strata::events::RecordedEvent;
use strata::reconcilers::ReconcileEnv;
use strata::worker::Worker;
use tokio_util::sync::CancellationToken;

/// The HTTP API in-process, with a key of the fixture's team.
struct Http {
    _api: common::api::TestApi,
    _data: tempfile::TempDir,
    base: String,
    key: String,
    client: reqwest::Client,
}

impl Http {
    async fn new(fx: &Fixture) -> Http {
        let data = common::data_dir();
        let api = common::api::serve(fx.db.pool.clone(), data.path(), None, &[]).await;
        let out = tokio::process::Command::new(common::strata_bin())
            .args(["keys", "create", "--team", fx.api.team.as_str()])
            .env("DATABASE_URL", &fx.db.url)
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Http {
            base: api.base.clone(),
            _api: api,
            _data: data,
            key: String::from_utf8(out.stdout).unwrap().trim().to_owned(),
            client: reqwest::Client::new(),
        }
    }

    async fn delete(&self, template: &TemplateId) {
        let resp = self
            .client
            .delete(format!("{}/templates/{template}", self.base))
            .header("X-API-KEY", &self.key)
            .send()
            .await
            .unwrap();
        assert_eq!(
            resp.status().as_u16(),
            204,
            "{}",
            resp.text().await.unwrap()
        );
    }

    /// The E2B status poll the SDK makes.
    async fn status(&self, template: &TemplateId, build: BuildId) -> Value {
        let resp = self
            .client
            .get(format!(
                "{}/templates/{template}/builds/{build}/status",
                self.base
            ))
            .header("X-API-KEY", &self.key)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        resp.json().await.unwrap()
    }
}

fn recipe(steps: Vec<Value>) -> Value {
    json!({"fromImage": "busybox", "force": false, "steps": steps})
}

fn run(cmd: &str) -> Value {
    json!({"type": "RUN", "args": [cmd], "force": false})
}

async fn events(fx: &Fixture, build: BuildId) -> Vec<RecordedEvent> {
    fx.store
        .read_stream_all(&common::build_api::stream(ids::stream::build(&build)))
        .await
        .unwrap()
}

fn count(events: &[RecordedEvent], event_type: &str) -> usize {
    events.iter().filter(|e| e.event_type == event_type).count()
}

/// The status poll says `error`, with a reason naming the deleted template, and the stream says
/// why in its own terms.
async fn assert_ended_for_deletion(
    fx: &Fixture,
    http: &Http,
    template: &TemplateId,
    build: BuildId,
) {
    let status = http.status(template, build).await;
    assert_eq!(status["status"], "error", "{status}");
    let message = status["reason"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("template {template} was deleted")),
        "{status}"
    );
    match fx.state(build).await.phase {
        Phase::Error { reason, .. } => assert_eq!(reason.kind, FailureKind::TemplateDeleted),
        other => panic!("{other:?}"),
    }
    assert!(
        fx.state(build).await.context_released,
        "bindings and intents are released"
    );
}

async fn wait_for<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_queued_build_of_a_deleted_template_ends_in_error_and_no_node_claims_it() {
    let fx = Fixture::with_worker(None).await;
    let http = Http::new(&fx).await;
    let (template, build) = fx.api.register("queued-then-deleted").await;
    fx.api.start(build, recipe(vec![run("true")])).await;
    // Started and not yet claimed: E2B answers `building` from the start on.
    assert_eq!(http.status(&template, build).await["status"], "building");
    assert!(matches!(fx.state(build).await.phase, Phase::Queued { .. }));

    http.delete(&template).await;
    assert_ended_for_deletion(&fx, &http, &template, build).await;

    // A node that starts now finds nothing to claim.
    let shutdown = CancellationToken::new();
    let worker = Worker::new(fx.store.clone(), settings()).unwrap();
    let running = tokio::spawn(worker.run_until(shutdown.clone()));
    tokio::time::sleep(Duration::from_secs(2)).await;
    shutdown.cancel();
    running.await.unwrap().unwrap();
    assert_eq!(count(&events(&fx, build).await, "AttemptAcquired.v1"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_running_build_of_a_deleted_template_ends_in_error_and_its_node_stops_mid_step() {
    let mut s = settings();
    s.max_builds = 1;
    let fx = Fixture::new(s).await;
    let http = Http::new(&fx).await;
    let (template, build) = fx.api.register("running-then-deleted").await;
    fx.api
        .start(build, recipe(vec![run("true"), run("sleep 60")]))
        .await;
    wait_for("step 1 to complete", Duration::from_secs(90), || async {
        count(&events(&fx, build).await, "StepCompleted.v1") == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    http.delete(&template).await;
    assert_ended_for_deletion(&fx, &http, &template, build).await;

    // The node gives the doomed attempt up (its renewal is refused) and its one slot runs the
    // next build long before `sleep 60` would have ended.
    let (_, next) = fx.api.register("after-the-deletion").await;
    fx.api.start(next, recipe(vec![run("true")])).await;
    let started = Instant::now();
    let state = fx.wait_terminal(next).await;
    assert!(
        matches!(state.phase, Phase::Ready { .. }),
        "{:?}",
        state.phase
    );
    assert!(
        started.elapsed() < Duration::from_secs(40),
        "the node kept running the deleted template's build for {:?}",
        started.elapsed()
    );
    let doomed = events(&fx, build).await;
    assert_eq!(
        count(&doomed, "StepCompleted.v1"),
        1,
        "step 2 never completes"
    );
    assert_eq!(doomed.last().unwrap().event_type, "ContextReleased.v1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_publishing_build_of_a_deleted_template_is_ended_by_the_promotion_reconciler() {
    let fx = Fixture::with_worker(None).await;
    let http = Http::new(&fx).await;
    let (template, build) = fx.api.register("publishing-then-deleted").await;
    fx.api
        .start(build, recipe(vec![run("echo hi > /tmp/hi")]))
        .await;
    let mut worker = Proc::worker(
        &fx.db.url,
        "dies-publishing",
        2,
        &[(strata::fault::CRASH_AT_ENV, "worker:after-publishing")],
    );
    worker.wait_exit(Duration::from_secs(120)).await;
    assert!(matches!(
        fx.state(build).await.phase,
        Phase::Publishing { .. }
    ));

    // The deletion leaves a publishing build to its promotion.
    http.delete(&template).await;
    assert_eq!(http.status(&template, build).await["status"], "building");

    let env = ReconcileEnv {
        store: fx.store.clone(),
        node: "reconciler".into(),
        blobs: fx.blobs.clone(),
        gc: Default::default(),
        catalog: None,
    };
    let mut pass = strata::reconcilers::promotion::pass(&env).await.unwrap();
    let waited = Instant::now();
    while pass.candidates == 0 && waited.elapsed() < Duration::from_secs(10) {
        // The dead node's lease has not passed yet.
        tokio::time::sleep(Duration::from_millis(200)).await;
        pass = strata::reconcilers::promotion::pass(&env).await.unwrap();
    }
    assert_eq!(
        (pass.candidates, pass.applied, pass.failed),
        (1, 1, 0),
        "{pass:?}"
    );
    assert_ended_for_deletion(&fx, &http, &template, build).await;
    let promotion = fx
        .store
        .read_stream_all(&common::build_api::stream(ids::stream::promotion(
            &build,
            Epoch(1),
        )))
        .await
        .unwrap();
    assert_eq!(
        promotion.last().unwrap().event_type,
        "PromotionAbandoned.v1"
    );
    // Nothing is left to re-drive.
    let again = strata::reconcilers::promotion::pass(&env).await.unwrap();
    assert_eq!(again.candidates, 0, "{again:?}");
}

/// The worker is the promotion driver of its own build: it entered Publishing and stops (a
/// `STRATA_FAULT_STOP_AT` point) inside its drive, just before the flip that makes the build
/// visible. The template is deleted then, and the worker resumed: its own drive meets the
/// deletion, abandons the outbox and ends the build in `error`. No reconciler runs, and the
/// abandonment's metadata names the worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_driving_its_promotion_when_the_template_is_deleted_abandons_it_itself() {
    let fx = Fixture::with_worker(None).await;
    let http = Http::new(&fx).await;
    let (template, build, worker) = build_stopped_at(
        &fx,
        "driving-then-deleted",
        "driving-node",
        "promotion:before-visible",
    )
    .await;
    assert!(matches!(
        fx.state(build).await.phase,
        Phase::Publishing { .. }
    ));

    http.delete(&template).await;
    // The deletion leaves a publishing build to its promotion: the worker's.
    assert_eq!(http.status(&template, build).await["status"], "building");
    worker.resume();

    wait_for(
        "the worker to end the build",
        Duration::from_secs(60),
        || async { fx.state(build).await.phase.is_terminal() },
    )
    .await;
    assert_ended_for_deletion(&fx, &http, &template, build).await;
    let promotion = fx
        .store
        .read_stream_all(&common::build_api::stream(ids::stream::promotion(
            &build,
            Epoch(1),
        )))
        .await
        .unwrap();
    let last = promotion.last().unwrap();
    assert_eq!(last.event_type, "PromotionAbandoned.v1");
    let by_worker = strata::events::Actor::new(strata::events::ActorRole::Worker, "driving-node");
    assert_eq!(last.metadata.actor, by_worker, "the worker abandoned it");
    let ended = events(&fx, build).await;
    let failed = ended
        .iter()
        .find(|e| e.event_type == "BuildFailed.v1")
        .unwrap_or_else(|| panic!("{ended:#?}"));
    assert_eq!(
        failed.metadata.actor, by_worker,
        "the worker ended the build"
    );
    let log = worker.stderr();
    assert!(
        log.contains("the template was deleted before the build was published"),
        "{log}"
    );
}

/// The moment before the worker enters Publishing: its build is still running, so the deletion
/// itself ends it (as for any running build). The resumed worker's Publishing is refused, so it
/// stages no promotion and writes nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_template_deleted_just_before_the_worker_enters_publishing_ends_the_build_and_stages_nothing(
) {
    let fx = Fixture::with_worker(None).await;
    let http = Http::new(&fx).await;
    let (template, build, worker) = build_stopped_at(
        &fx,
        "deleted-before-publishing",
        "about-to-publish",
        "worker:before-publishing",
    )
    .await;
    assert!(matches!(fx.state(build).await.phase, Phase::Active { .. }));

    http.delete(&template).await;
    assert_ended_for_deletion(&fx, &http, &template, build).await;
    let before = events(&fx, build).await.len();
    worker.resume();

    wait_for(
        "the worker to give the attempt up",
        Duration::from_secs(30),
        || {
            let log = worker.stderr();
            async move { log.contains("is closed") }
        },
    )
    .await;
    assert_eq!(
        events(&fx, build).await.len(),
        before,
        "the worker wrote nothing more"
    );
    let promotion = fx
        .store
        .read_stream_all(&common::build_api::stream(ids::stream::promotion(
            &build,
            Epoch(1),
        )))
        .await
        .unwrap();
    assert!(
        promotion.is_empty(),
        "no promotion was staged: {promotion:#?}"
    );
    assert_ended_for_deletion(&fx, &http, &template, build).await;
}

/// Registers and starts a one-step build named `name`, and a worker process on `node` that
/// stops itself at `stop_at`; waits until it has stopped. Its lease is far longer than the
/// pause: the attempt holds the build throughout.
async fn build_stopped_at(
    fx: &Fixture,
    name: &str,
    node: &str,
    stop_at: &str,
) -> (TemplateId, BuildId, Proc) {
    let (template, build) = fx.api.register(name).await;
    fx.api
        .start(build, recipe(vec![run("echo hi > /tmp/hi")]))
        .await;
    let mut worker = Proc::worker(
        &fx.db.url,
        node,
        30,
        &[(strata::fault::STOP_AT_ENV, stop_at)],
    );
    worker.wait_stopped(Duration::from_secs(120)).await;
    (template, build, worker)
}
