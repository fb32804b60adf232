//! One trace per build, end to end, exported over OTLP/HTTP: a real `strata up` process with
//! `OTEL_EXPORTER_OTLP_ENDPOINT` pointing at a receiver this test starts. No OpenTelemetry
//! collector installs from the registries here, so the receiver is minimal: it accepts
//! `POST /v1/traces` and decodes the protobuf `ExportTraceServiceRequest` with the
//! OpenTelemetry protocol's own message types.
//!
//! The SDK's first request carries a `traceparent`; the registration, start, upload, the
//! worker's attempt with its steps and promotion all land in that trace, parented on the
//! registration, and every event of the build records its trace id. A build without a
//! `traceparent` gets a trace of its own, started by its registration.

use crate::common;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use common::http_build::{tar_gz, SdkClient};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message;
use serde_json::json;

/// One received span: (trace id, span id, parent span id, name), ids as hex.
#[derive(Clone, Debug)]
struct Received {
    trace: String,
    span: String,
    parent: String,
    name: String,
}

type Spans = Arc<Mutex<Vec<Received>>>;

async fn receive(State(spans): State<Spans>, body: Bytes) -> Vec<u8> {
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf export");
    let mut out = spans.lock().unwrap();
    for rs in request.resource_spans {
        for ss in rs.scope_spans {
            for s in ss.spans {
                out.push(Received {
                    trace: hex::encode(&s.trace_id),
                    span: hex::encode(&s.span_id),
                    parent: hex::encode(&s.parent_span_id),
                    name: s.name,
                });
            }
        }
    }
    ExportTraceServiceResponse::default().encode_to_vec()
}

async fn otlp_receiver() -> (String, Spans) {
    let spans: Spans = Arc::default();
    let app = axum::Router::new()
        .route("/v1/traces", post(receive))
        .with_state(spans.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), spans)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn build_metadata(pool: &sqlx::PgPool, build: &str) -> Vec<(String, serde_json::Value)> {
    sqlx::query_as("SELECT type, metadata FROM events WHERE stream_id = $1 ORDER BY version")
        .bind(format!("build-{build}"))
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_build_is_one_trace_from_the_first_request_through_steps_and_promotion() {
    let db = common::test_db().await;
    let (endpoint, spans) = otlp_receiver().await;
    let port = free_port();
    let mut child = common::http_build::ChildGuard(Some(
        Command::new(common::strata_bin())
            .arg("up")
            // GC on the shared test node would weigh other tests' blobs against this database.
            .env("STRATA_GC_SCHEDULE", "off")
            .env("DATABASE_URL", &db.url)
            .env("STRATA_DATA_DIR", common::sandbox::node_dir())
            .env("STRATA_LISTEN", format!("127.0.0.1:{port}"))
            .env(
                "STRATA_UPLOAD_SECRET",
                "trace-test-upload-secret-0123456789abcdef",
            )
            .env("STRATA_NODE_ID", "trace-node")
            .env("STRATA_QUEUE_POLL_MS", "200")
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
            .env("OTEL_BSP_SCHEDULE_DELAY", "200")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    ));
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while reqwest::get(format!("{base}/health")).await.is_err() {
        assert!(child.try_wait().is_none(), "strata up exited");
        assert!(Instant::now() < deadline, "strata up did not serve");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    let mut sdk = SdkClient::new(&base, &db.url, "trace-team").await;
    sdk.traceparent = Some(format!("00-{trace}-{client_span}-01"));
    let hash = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90";
    let spec = |cmd: &str| {
        json!({"fromImage": "busybox", "force": false, "steps": [
            {"type": "COPY", "args": ["app", "app", "", ""], "filesHash": hash, "force": false},
            {"type": "RUN", "args": [cmd], "force": false},
        ]})
    };
    let archive = tar_gz(&[("app/x.txt", b"traced\n")]);
    let (_, build, status) = sdk
        .build("traced", &[(hash, archive.clone())], spec("cat app/x.txt"))
        .await;
    assert_eq!(status["status"], "ready", "{status}");
    // A second build, without a client trace: its registration starts a new trace.
    sdk.traceparent = None;
    let (_, other, status) = sdk
        .build("traced", &[(hash, archive)], spec("echo other"))
        .await;
    assert_eq!(status["status"], "ready", "{status}");

    // Every event of the first build is in the client's trace.
    let events = build_metadata(&db.pool, &build).await;
    assert!(events.len() >= 8, "{events:?}");
    for (kind, meta) in &events {
        assert_eq!(meta["trace_id"], trace, "{kind}: {meta}");
    }
    let registration_span = events[0].1["span_id"].as_str().unwrap().to_owned();
    let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
    for k in [
        "BuildRegistered.v1",
        "BuildFrozen.v1",
        "AttemptAcquired.v1",
        "StepCompleted.v1",
        "PublishingStarted.v1",
        "BuildReady.v1",
    ] {
        assert!(kinds.contains(&k), "{k} missing: {kinds:?}");
    }
    let other_events = build_metadata(&db.pool, &other).await;
    let other_trace = other_events[0].1["trace_id"].as_str().unwrap().to_owned();
    assert_ne!(other_trace, trace);
    assert_eq!(other_trace.len(), 32);
    for (kind, meta) in &other_events {
        assert_eq!(meta["trace_id"], other_trace.as_str(), "{kind}: {meta}");
    }

    // Stop the process: the exporter flushes what is left.
    assert!(child.terminate().success());

    let received = spans.lock().unwrap().clone();
    let in_trace: Vec<&Received> = received.iter().filter(|s| s.trace == trace).collect();
    let by_name = |name: &str| in_trace.iter().filter(|s| s.name == name).count();
    // The client's first request is parented on the client's span.
    assert!(
        in_trace
            .iter()
            .any(|s| s.name == "request" && s.parent == client_span),
        "{in_trace:#?}"
    );
    for name in [
        "build.start",
        "build.upload_link",
        "build.upload",
        "build.attempt",
        "build.cache_lookup",
        "build.publish",
    ] {
        assert!(
            by_name(name) >= 1,
            "no {name} span in the trace: {in_trace:#?}"
        );
    }
    assert_eq!(by_name("build.step"), 2, "{in_trace:#?}");
    // Later work hangs off the registration's span, recorded on the first event.
    let attempt = in_trace.iter().find(|s| s.name == "build.attempt").unwrap();
    assert_eq!(attempt.parent, registration_span);
    let ids: BTreeMap<&str, &Received> = in_trace.iter().map(|s| (s.span.as_str(), *s)).collect();
    for step in in_trace.iter().filter(|s| s.name == "build.step") {
        let mut at = step.parent.as_str();
        let mut hops = 0;
        while at != attempt.span {
            at = ids
                .get(at)
                .map(|s| s.parent.as_str())
                .expect("the step's ancestors were exported");
            hops += 1;
            assert!(hops < 20);
        }
    }
    // The second build's work is in its own trace.
    assert!(received
        .iter()
        .any(|s| s.trace == other_trace && s.name == "build.attempt"));
}
