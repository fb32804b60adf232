//! Launched sandboxes across processes: the API in this test, `strata worker` and
//! `strata reconcile` as child processes on a node directory of their own (ADR 0028).

use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{self, http_build::SdkClient, process::Proc};

fn worker(db_url: &str, node: &str, dir: &std::path::Path) -> Proc {
    Proc::worker(
        db_url,
        node,
        30,
        &[
            ("STRATA_DATA_DIR", dir.to_str().unwrap()),
            ("STRATA_MAX_SANDBOXES", "4"),
        ],
    )
}

async fn agent_health(http: &reqwest::Client, base: &str, sandbox: &str) -> u16 {
    http.get(format!("{base}/health"))
        .header("e2b-sandbox-id", sandbox)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

fn entries(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("sbx-"))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_on_a_killed_node_ends_lost_and_nothing_of_it_survives_the_next_start() {
    let node = common::sandbox::private_node(&["busybox"]);
    let db = common::test_db().await;
    let api = common::api::serve(db.pool.clone(), node.path(), None, &[]).await;
    let mut first = worker(&db.url, "launch-a", node.path());
    let _reconciler = Proc::reconciler(
        &db.url,
        "launch-r",
        &["sandbox-expiry"],
        &[("STRATA_DATA_DIR", node.path().to_str().unwrap())],
    );
    let sdk = SdkClient::new(&api.base, &db.url, "launch-team").await;
    let spec = json!({"fromImage": "busybox", "force": false, "steps": [
        {"type": "RUN", "args": ["echo launched > marker"], "force": false},
    ]});
    let (_, _, built) = sdk.build("launchable", &[], spec).await;
    assert_eq!(built["status"], "ready", "{built}");

    let (status, created) = sdk
        .call(
            reqwest::Method::POST,
            "/v2/sandboxes",
            Some(json!({"templateID": "launchable", "metadata": {}, "envVars": {}})),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    for key in [
        "templateID",
        "sandboxID",
        "clientID",
        "envdVersion",
        "envdAccessToken",
        "domain",
    ] {
        assert!(
            created.get(key).is_some_and(|v| !v.is_null()),
            "{key} in {created}"
        );
    }
    // The public URL's host, as no STRATA_SANDBOX_DOMAIN is set; never null.
    assert_eq!(created["domain"], "127.0.0.1", "{created}");
    let id = created["sandboxID"].as_str().unwrap().to_owned();
    let http = reqwest::Client::new();
    assert_eq!(agent_health(&http, &api.base, &id).await, 204);
    let sandboxes_dir = node.path().join("sandboxes");
    let while_running = entries(&sandboxes_dir);
    assert!(!while_running.is_empty(), "the sandbox has a directory");

    // The node dies with its sandbox: nothing ends it but the reconciler.
    first.signal(libc::SIGKILL);
    first.reap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, _) = sdk
            .call(reqwest::Method::GET, &format!("/sandboxes/{id}"), None)
            .await;
        if status == 404 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the sandbox of a killed node is still listed after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let row = strata::projections::sandboxes::get(&db.pool, &id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.end_reason.as_deref(), Some("lost"), "{row:?}");
    assert!(
        row.end_detail.as_deref().unwrap_or("").contains("launch-a"),
        "{row:?}"
    );
    assert_eq!(agent_health(&http, &api.base, &id).await, 502);

    // The node's next start sweeps what the dead one left.
    let _second = worker(&db.url, "launch-b", node.path());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left: Vec<_> = entries(&sandboxes_dir)
            .into_iter()
            .filter(|e| while_running.contains(e))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the dead node's sandbox directories are still there: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_with_no_node_to_run_it_fails_and_no_node_starts_it_later() {
    let node = common::sandbox::private_node(&["busybox"]);
    let db = common::test_db().await;
    let api = common::api::serve(
        db.pool.clone(),
        node.path(),
        None,
        &["--sandbox-start-timeout-secs", "3"],
    )
    .await;
    let mut builder = Proc::worker(
        &db.url,
        "build-only",
        30,
        &[
            ("STRATA_DATA_DIR", node.path().to_str().unwrap()),
            ("STRATA_MAX_SANDBOXES", "0"),
        ],
    );
    let sdk = SdkClient::new(&api.base, &db.url, "nonode-team").await;
    let spec = json!({"fromImage": "busybox", "force": false, "steps": [
        {"type": "RUN", "args": ["true"], "force": false},
    ]});
    let (_, _, built) = sdk.build("unlaunched", &[], spec).await;
    assert_eq!(built["status"], "ready", "{built}");

    // An unknown template first: 404, nothing recorded.
    let (status, body) = sdk
        .call(
            reqwest::Method::POST,
            "/v2/sandboxes",
            Some(json!({"templateID": "no-such"})),
        )
        .await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = sdk
        .call(
            reqwest::Method::POST,
            "/v2/sandboxes",
            Some(json!({"templateID": "unlaunched", "timeout": 0})),
        )
        .await;
    assert_eq!(status, 400, "{body}");

    let started = Instant::now();
    let (status, body) = sdk
        .call(
            reqwest::Method::POST,
            "/v2/sandboxes",
            Some(json!({"templateID": "unlaunched"})),
        )
        .await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("STRATA_MAX_SANDBOXES"),
        "{body}"
    );
    assert!(started.elapsed() >= Duration::from_secs(3));
    let failed: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT state, end_reason FROM sandboxes")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        failed,
        vec![("ended".to_owned(), Some("failed".to_owned()))]
    );
    builder.signal(libc::SIGTERM);
    builder.wait_exit(Duration::from_secs(30)).await;
}
