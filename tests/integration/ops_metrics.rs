//! Prometheus metrics after real builds: the API's `/metrics` in a process that also runs the
//! worker (as `strata up` does), scraped before and after two builds over real HTTP; and the
//! `--metrics-listen` listeners of separate `strata worker` and `strata reconcile` processes.

use crate::common;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::http_build::{scrape, tar_gz, SdkClient};
use common::worker_fixture::{settings, Fixture};
use serde_json::json;
use strata::events::{Actor, ActorRole, ExpectedVersion, Metadata, StreamId, StreamWrite};

const SECRET: &str = "metrics-test-upload-secret-0123456789abcdef";

fn delta(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>, series: &str) -> f64 {
    after
        .get(series)
        .copied()
        .unwrap_or_else(|| panic!("{series} missing: {after:#?}"))
        - before.get(series).copied().unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_move_as_builds_upload_run_hit_the_cache_and_append() {
    let mut fx = Fixture::new(settings()).await;
    // The API shares the node's blob store with the in-process worker, as in `strata up`.
    let api = common::api::serve(
        fx.db.pool.clone(),
        &common::sandbox::node_dir(),
        None,
        &["--upload-secret", SECRET],
    )
    .await;
    let metrics_url = format!("{}/metrics", api.base);
    let before = scrape(&metrics_url).await;
    // Every family is listed from the start, at zero.
    assert_eq!(
        before["strata_cache_lookups_total{outcome=\"bypass\"}"],
        0.0
    );
    assert_eq!(before["strata_builds{phase=\"ready\"}"], 0.0);

    let sdk = SdkClient::new(&api.base, &fx.db.url, "metrics-team").await;
    let archive = tar_gz(&[("app/hello.txt", b"hello metrics\n")]);
    let hash = "5bb1a4a2b1c0d3e4f5061728394a5b6c7d8e9f00112233445566778899aabbcc";
    let spec = json!({"fromImage": "busybox", "force": false, "steps": [
        {"type": "COPY", "args": ["app", "app", "", ""], "filesHash": hash, "force": false},
        {"type": "RUN", "args": ["cat app/hello.txt > seen.txt"], "force": false},
    ]});
    let (_, _, first) = sdk
        .build("metrics", &[(hash, archive.clone())], spec.clone())
        .await;
    assert_eq!(first["status"], "ready", "{first}");
    // The same recipe again: the final result comes from the cache, no sandbox boots.
    let (_, _, second) = sdk.build("metrics", &[(hash, archive.clone())], spec).await;
    assert_eq!(second["status"], "ready", "{second}");

    // A lost compare-and-set, as two writers racing one stream produce.
    let stream = StreamId::parse("metricsprobe-1").unwrap();
    let event = |n: u8| strata::events::NewEvent {
        event_id: uuid::Uuid::new_v4(),
        event_type: "Probed.v1".into(),
        data: json!({ "n": n }),
        metadata: Metadata::new(Actor::new(ActorRole::Cli, "test")),
    };
    fx.store
        .append(vec![StreamWrite::new(
            stream.clone(),
            ExpectedVersion::NoStream,
            vec![event(1)],
        )])
        .await
        .unwrap();
    assert!(fx
        .store
        .append(vec![StreamWrite::new(
            stream,
            ExpectedVersion::NoStream,
            vec![event(2)]
        )])
        .await
        .is_err());

    let after = scrape(&metrics_url).await;
    let d = |s: &str| delta(&before, &after, s);
    assert_eq!(d("strata_upload_bytes_total"), archive.len() as f64);
    assert_eq!(d("strata_uploads_total{outcome=\"stored\"}"), 1.0);
    assert_eq!(d("strata_upload_duration_seconds_count"), 1.0);
    assert_eq!(
        d("strata_worker_builds_finished_total{outcome=\"ready\"}"),
        2.0
    );
    assert_eq!(
        d("strata_worker_build_duration_seconds_count{outcome=\"ready\"}"),
        2.0
    );
    assert_eq!(d("strata_build_queue_wait_seconds_count"), 2.0);
    // Only the first build ran its steps and booted a sandbox.
    assert_eq!(
        d("strata_build_step_duration_seconds_count{kind=\"COPY\",outcome=\"ok\"}"),
        1.0
    );
    assert_eq!(
        d("strata_build_step_duration_seconds_count{kind=\"RUN\",outcome=\"ok\"}"),
        1.0
    );
    assert_eq!(d("strata_sandbox_boots_total{outcome=\"ok\"}"), 1.0);
    assert_eq!(d("strata_sandbox_boot_duration_seconds_count"), 1.0);
    // First build: final result and both checkpoints missed; second: the final result hit.
    assert_eq!(d("strata_cache_lookups_total{outcome=\"miss\"}"), 3.0);
    assert_eq!(d("strata_cache_lookups_total{outcome=\"hit\"}"), 1.0);
    assert_eq!(d("strata_cache_lookups_total{outcome=\"bypass\"}"), 0.0);
    // Read-model gauges.
    assert_eq!(after["strata_builds{phase=\"ready\"}"], 2.0);
    assert_eq!(after["strata_builds{phase=\"queued\"}"], 0.0);
    assert_eq!(after["strata_build_queue_oldest_age_seconds"], 0.0);
    assert!(after["strata_node_storage_bytes{kind=\"blobs\"}"] >= archive.len() as f64);
    // Event store: appends, events, and the one conflict.
    assert!(d("strata_event_appends_total{outcome=\"appended\"}") >= 10.0);
    assert!(
        d("strata_events_appended_total") >= d("strata_event_appends_total{outcome=\"appended\"}")
    );
    assert_eq!(
        d("strata_event_appends_total{outcome=\"version_conflict\"}"),
        1.0
    );
    assert!(d("strata_event_append_duration_seconds_count") >= 11.0);
    fx.stop().await;
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn the_reconciler_serves_its_own_metrics_listener() {
    let db = common::test_db().await;
    // A build already past its waiting deadline: the waiting-deadline reconciler ends it, and
    // its lag is observed.
    let api = common::build_api::Api {
        store: strata::app::event_store(db.pool.clone()),
        team: strata::domain::ids::TeamId::parse("team-metrics-reconciler").unwrap(),
    };
    api.register_until("overdue", chrono::Utc::now() - chrono::Duration::seconds(5))
        .await;
    // And an upload link that lapsed unused on a build still waiting: intent expiry.
    let (_, waiting) = api.register("waiting").await;
    api.reserve(
        waiting,
        &strata::domain::ids::FilesHash::parse(&"ab".repeat(32)).unwrap(),
        chrono::Utc::now() - chrono::Duration::seconds(3),
    )
    .await;
    let data = common::data_dir();
    let port = free_port();
    let mut child = common::http_build::ChildGuard(Some(
        Command::new(common::strata_bin())
            .args([
                "reconcile",
                "--metrics-listen",
                &format!("127.0.0.1:{port}"),
            ])
            .env("DATABASE_URL", &db.url)
            .env("STRATA_DATA_DIR", data.path())
            .env("STRATA_RECONCILE_SCHEDULE", "* * * * * *")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    ));
    let url = format!("http://127.0.0.1:{port}/metrics");
    let passes = scrape_until(
        &url,
        "two reconciler passes",
        Duration::from_secs(30),
        |m| {
            m.get("strata_reconciler_passes_total{outcome=\"ok\",reconciler=\"attempt-expiry\"}")
                .copied()
                .unwrap_or(0.0)
                >= 2.0
        },
    )
    .await;
    for r in ["promotion", "waiting-deadline", "intent-expiry"] {
        assert!(
            passes[&format!("strata_reconciler_passes_total{{outcome=\"ok\",reconciler=\"{r}\"}}")]
                >= 1.0
        );
    }
    assert!(
        passes["strata_reconciler_pass_duration_seconds_count{reconciler=\"attempt-expiry\"}"]
            >= 2.0
    );
    assert!(
        passes["strata_reconciler_lag_seconds_count{reconciler=\"waiting-deadline\"}"] >= 1.0,
        "{passes:#?}"
    );
    assert!(passes["strata_reconciler_lag_seconds_sum{reconciler=\"waiting-deadline\"}"] >= 5.0);
    assert!(
        passes["strata_reconciler_lag_seconds_count{reconciler=\"intent-expiry\"}"] >= 1.0,
        "{passes:#?}"
    );
    // The reconciler reports no build gauges: those come from the API.
    assert!(!passes.keys().any(|k| k.starts_with("strata_builds{")));
    assert!(child.terminate().success());
}

/// Scrapes `url` until `ready` holds for what it serves (bounded), returning that scrape.
async fn scrape_until(
    url: &str,
    what: &str,
    limit: Duration,
    ready: impl Fn(&BTreeMap<String, f64>) -> bool,
) -> BTreeMap<String, f64> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(resp) = reqwest::get(url).await {
            let m = common::http_build::parse_metrics(&resp.text().await.unwrap());
            if ready(&m) {
                return m;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{what} not scraped within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_serves_its_own_metrics_listener() {
    let db = common::test_db().await;
    let api = common::build_api::Api {
        store: strata::app::event_store(db.pool.clone()),
        team: strata::domain::ids::TeamId::parse("team-metrics-worker").unwrap(),
    };
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let _worker = common::process::Proc::worker(
        &db.url,
        "metrics-worker",
        30,
        &[("STRATA_METRICS_LISTEN", listen.as_str())],
    );
    let url = format!("http://{listen}/metrics");
    // Served before any build: the listener is up as soon as the worker is.
    let idle = scrape_until(
        &url,
        "the idle worker's metrics",
        Duration::from_secs(30),
        |m| !m.is_empty(),
    )
    .await;
    let boots = |m: &BTreeMap<String, f64>| {
        m.get("strata_sandbox_boots_total{outcome=\"ok\"}")
            .copied()
            .unwrap_or(0.0)
    };
    assert_eq!(boots(&idle), 0.0, "{idle:#?}");

    let (_, build) = api.register("listened").await;
    api.start(
        build,
        json!({"fromImage": "busybox", "force": false, "steps": [
            {"type": "RUN", "args": ["echo hi > /tmp/hi"], "force": false},
        ]}),
    )
    .await;
    let finished = |m: &BTreeMap<String, f64>, outcome: &str| {
        m.get(&format!(
            "strata_worker_builds_finished_total{{outcome=\"{outcome}\"}}"
        ))
        .copied()
        .unwrap_or(0.0)
    };
    let after = scrape_until(&url, "a finished build", Duration::from_secs(120), |m| {
        finished(m, "ready") + finished(m, "failed") >= 1.0
    })
    .await;
    assert_eq!(finished(&after, "ready"), 1.0, "{after:#?}");
    assert!(boots(&after) >= 1.0, "{after:#?}");
    assert!(
        after
            .iter()
            .any(|(k, v)| k.starts_with("strata_build_step_duration_seconds_count") && *v >= 1.0),
        "{after:#?}"
    );
    // Build gauges and reconciler passes come from other roles.
    assert!(!after.keys().any(|k| k.starts_with("strata_builds{")));
    assert!(!after
        .keys()
        .any(|k| k.starts_with("strata_reconciler_passes_total")));
}
