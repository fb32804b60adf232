//! Held status requests (ADR 0027) over real HTTP and a real Postgres: a request for a build in
//! flight with nothing new past its offset waits for news, woken by NOTIFY from the log writer
//! and the event store, and answers at once when there is news already, when the build has
//! ended, or when the process holds as many requests as it may.
//!
//! The hold here is 20 s, far longer than any wake-up, so "answered at once" and "answered on
//! news" are told apart by seconds, not by tight timings.

use crate::common;

use std::time::{Duration, Instant};

use chrono::Utc;
use common::http_build::SdkClient;
use serde_json::{json, Value};
use strata::domain::build::{AttemptGrant, FailedStep};
use strata::domain::ids::{BuildId, Epoch, NodeId};
use strata::events::{Actor, ActorRole, CommandContext, Metadata};
use strata::worker::build_log::{write_logs, BuildLog};

const HOLD: &str = "20000";
/// Far below the hold: an answer this fast did not wait for the deadline.
const PROMPT: Duration = Duration::from_secs(5);

struct Setup {
    db: common::TestDb,
    _data: tempfile::TempDir,
    client: SdkClient,
}

async fn setup(extra: &[&str]) -> Setup {
    let db = common::test_db().await;
    let data = common::data_dir();
    let mut args = vec!["--status-hold-ms", HOLD];
    args.extend(extra);
    let api = common::api::serve(db.pool.clone(), data.path(), None, &args).await;
    let client = SdkClient::new(&api.base, &db.url, "holdteam").await;
    let listening = Instant::now();
    while !api.state.stream_news.is_listening() {
        assert!(
            listening.elapsed() < Duration::from_secs(10),
            "the API never listened"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Setup {
        db,
        _data: data,
        client,
    }
}

impl Setup {
    /// Another connection of the same team, for a request that runs beside the test's.
    fn client(&self) -> SdkClient {
        SdkClient {
            http: reqwest::Client::new(),
            base: self.client.base.clone(),
            key: self.client.key.clone(),
            traceparent: None,
        }
    }

    /// A registered and started build with one RUN step, queued (no worker runs here).
    async fn started(&self, name: &str) -> (String, String) {
        let (template, build) = self.client.register(name).await;
        let (status, body) = self
            .client
            .call(
                reqwest::Method::POST,
                &format!("/v2/templates/{template}/builds/{build}"),
                Some(json!({"fromImage": "busybox", "force": false,
                    "steps": [{"type": "RUN", "args": ["true"], "force": false}]})),
            )
            .await;
        assert_eq!(status, 202, "{body}");
        (template, build)
    }

    /// Claims the build as node `n1`, epoch 1, as a worker would.
    async fn acquire(&self, build: &str) -> BuildId {
        let build = BuildId::parse(build).unwrap();
        strata::app::attempt::acquire_attempt(
            &strata::app::event_store(self.db.pool.clone()),
            &worker(),
            build,
            None,
            AttemptGrant {
                node: NodeId::parse("n1").unwrap(),
                lease_expires_at: Utc::now() + chrono::Duration::seconds(60),
            },
            Utc::now(),
        )
        .await
        .unwrap();
        build
    }

    /// `GET …/status` with its wall time.
    async fn status(&self, template: &str, build: &str, offset: u32) -> (Value, Duration) {
        let started = Instant::now();
        let (status, body) = self
            .client
            .call(
                reqwest::Method::GET,
                &format!("/templates/{template}/builds/{build}/status?logsOffset={offset}"),
                None,
            )
            .await;
        assert_eq!(status, 200, "{body}");
        (body, started.elapsed())
    }
}

fn worker() -> CommandContext {
    CommandContext::new(Metadata::new(Actor::new(ActorRole::Worker, "n1")))
}

/// Writes `message` as the worker's log writer does (fenced batch insert, then its NOTIFY).
async fn log_line(pool: &sqlx::PgPool, build: BuildId, message: &str) {
    let (log, rx) = BuildLog::channel(strata::worker::build_log::OutputLimits {
        bytes: 1 << 20,
        lines: 100_000,
    });
    let writer = tokio::spawn(write_logs(pool.clone(), build, Epoch::FIRST, rx));
    log.info(None, message);
    assert!(log.flush().await, "the attempt holds the build");
    drop(log);
    assert_eq!(writer.await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_status_request_answers_as_soon_as_a_log_line_is_written() {
    let s = setup(&[]).await;
    let (template, build) = s.started("hold-log").await;
    let id = s.acquire(&build).await;
    let request = {
        let (client, template, build) = (s.client(), template.clone(), build.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            let (_, body) = client
                .call(
                    reqwest::Method::GET,
                    &format!("/templates/{template}/builds/{build}/status?logsOffset=0"),
                    None,
                )
                .await;
            (body, started)
        })
    };
    // The request is held: nothing is past offset 0 and the build is in flight.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!request.is_finished(), "a quiet build's status is held");
    let written = Instant::now();
    log_line(&s.db.pool, id, "step 1 says hello").await;
    let (body, started) = request.await.unwrap();
    let woke = written.elapsed();
    assert!(
        woke < PROMPT,
        "answered {woke:?} after the line was written (hold {HOLD} ms)"
    );
    assert!(
        started.elapsed() > Duration::from_millis(700),
        "it was held"
    );
    assert_eq!(body["status"], "building", "{body}");
    assert_eq!(
        body["logEntries"][0]["message"], "step 1 says hello",
        "{body}"
    );
    println!("held status woke {woke:?} after the log line was written");

    // With something past the offset already, the answer does not wait.
    let (body, took) = s.status(&template, &build, 0).await;
    assert!(took < PROMPT, "{took:?}");
    assert_eq!(body["logEntries"].as_array().unwrap().len(), 1, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_status_request_wakes_on_the_builds_end_and_an_ended_build_answers_at_once() {
    let s = setup(&[]).await;
    let (template, build) = s.started("hold-end").await;
    let id = s.acquire(&build).await;
    let (_, other_build) = s.started("hold-other").await;
    let held = {
        let client = s.client();
        let path = format!("/templates/{template}/builds/{build}/status?logsOffset=0");
        tokio::spawn(async move { client.call(reqwest::Method::GET, &path, None).await.1 })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    // Another build's news does not answer this one.
    let other = BuildId::parse(&other_build).unwrap();
    s.acquire(&other_build).await;
    log_line(&s.db.pool, other, "not yours").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!held.is_finished(), "another build's news woke this one");

    let failed = Instant::now();
    strata::app::attempt::fail_build(
        &strata::app::event_store(s.db.pool.clone()),
        &worker(),
        id,
        None,
        Epoch::FIRST,
        FailedStep::Step(1),
        "the step failed",
        Utc::now(),
    )
    .await
    .unwrap();
    let body = held.await.unwrap();
    let woke = failed.elapsed();
    assert!(woke < PROMPT, "answered {woke:?} after the build failed");
    assert_eq!(body["status"], "error", "{body}");
    println!("held status woke {woke:?} after the build ended");

    let (body, took) = s.status(&template, &build, 1000).await;
    assert!(took < PROMPT, "an ended build answers at once: {took:?}");
    assert_eq!(body["status"], "error", "{body}");
    assert_eq!(body["logEntries"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_the_bound_of_held_requests_a_status_request_answers_at_once() {
    let s = setup(&["--status-max-held", "2"]).await;
    let (template, build) = s.started("hold-burst").await;
    s.acquire(&build).await;
    let path = format!("/templates/{template}/builds/{build}/status?logsOffset=0");
    let mut held = Vec::new();
    for _ in 0..2 {
        let client = s.client();
        let path = path.clone();
        held.push(tokio::spawn(async move {
            client.call(reqwest::Method::GET, &path, None).await
        }));
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    let (body, took) = s.status(&template, &build, 0).await;
    assert!(took < PROMPT, "the third request is not held: {took:?}");
    assert_eq!(body["status"], "building", "{body}");
    assert!(
        held.iter().all(|h| !h.is_finished()),
        "the first two are still held"
    );
    for h in held {
        h.abort();
    }
}
