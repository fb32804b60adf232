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
    let (_, build, built) = sdk.build("launchable", &[], spec).await;
    assert_eq!(built["status"], "ready", "{built}");
    // The node says which sandbox backend the build resolved, and from which setting.
    let lines = strata::projections::build_logs::lines_of(
        &db.pool,
        strata::domain::ids::BuildId::parse(&build).unwrap(),
    )
    .await
    .unwrap();
    assert!(
        lines
            .iter()
            .any(|l| l.message == "[sandbox] backend namespace (default)"),
        "{lines:#?}"
    );

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
    let store = strata::app::event_store(db.pool.clone());
    let requested = strata::app::sandbox::state(
        &store,
        &strata::domain::sandbox::SandboxId::parse(&id).unwrap(),
    )
    .await
    .unwrap()
    .request
    .expect("requested");
    assert_eq!(
        requested.backend.map(|b| b.describe()).as_deref(),
        Some("namespace (default)"),
        "the backend is resolved at create, like a build's"
    );
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

/// The agent's file API through the API's routing, as the SDK's `files.read` / `files.write`.
async fn agent_file(
    http: &reqwest::Client,
    base: &str,
    sandbox: &serde_json::Value,
    path: &str,
    write: Option<&'static [u8]>,
) -> (u16, Vec<u8>) {
    let url = format!("{base}/files?path={path}");
    let request = match write {
        Some(body) => http
            .post(url)
            .header("content-type", "application/octet-stream")
            .body(body),
        None => http.get(url),
    };
    let response = request
        .header("e2b-sandbox-id", sandbox["sandboxID"].as_str().unwrap())
        .header(
            "x-access-token",
            sandbox["envdAccessToken"].as_str().unwrap(),
        )
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.bytes().await.unwrap().to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_sandbox_outlives_its_template_and_node_and_resumes_on_another_from_the_store() {
    // Two nodes with their own data directories (layer caches) and one blob store, as two
    // machines sharing a bucket.
    let a = common::sandbox::private_node(&["busybox"]);
    let b = common::sandbox::private_node(&["busybox"]);
    let blob_url = format!("file://{}", a.path().join("blobs").display());
    let db = common::test_db().await;
    let api = common::api::serve(
        db.pool.clone(),
        a.path(),
        Some(common::chromium::TOKEN),
        &["--sandbox-start-timeout-secs", "20"],
    )
    .await;
    let node = |name: &str, dir: &std::path::Path, crash: Option<&str>| {
        let mut env = vec![
            ("STRATA_DATA_DIR", dir.to_str().unwrap()),
            ("STRATA_MAX_SANDBOXES", "4"),
            ("STRATA_BLOB_URL", blob_url.as_str()),
        ];
        if let Some(point) = crash {
            env.push((strata::fault::CRASH_AT_ENV, point));
        }
        Proc::worker(&db.url, name, 30, &env)
    };
    let mut first = node("pause-a", a.path(), None);
    let _reconciler = Proc::reconciler(
        &db.url,
        "pause-r",
        &["sandbox-expiry"],
        &[("STRATA_DATA_DIR", a.path().to_str().unwrap())],
    );
    let sdk = SdkClient::new(&api.base, &db.url, "pause-team").await;
    let spec = json!({"fromImage": "busybox", "force": false, "steps": [
        {"type": "RUN", "args": ["echo from the template > /tmp/built"], "force": false},
    ]});
    let (template, _, built) = sdk.build("pausable", &[], spec).await;
    assert_eq!(built["status"], "ready", "{built}");
    let (status, created) = sdk
        .call(
            reqwest::Method::POST,
            "/v2/sandboxes",
            Some(json!({"templateID": "pausable"})),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    let id = created["sandboxID"].as_str().unwrap().to_owned();
    let http = reqwest::Client::new();
    let written = agent_file(&http, &api.base, &created, "/tmp/kept.txt", Some(b"kept")).await;
    assert_eq!(written.0, 200, "{:?}", String::from_utf8_lossy(&written.1));

    let pause = format!("/sandboxes/{id}/pause");
    let (status, body) = sdk
        .call(reqwest::Method::POST, &pause, Some(json!({})))
        .await;
    assert_eq!(status, 204, "{body}");
    let (status, body) = sdk
        .call(reqwest::Method::POST, &pause, Some(json!({})))
        .await;
    assert_eq!(status, 409, "already paused: {body}");
    let store = strata::app::event_store(db.pool.clone());
    let sandbox_id = strata::domain::sandbox::SandboxId::parse(&id).unwrap();
    let paused = strata::app::sandbox::state(&store, &sandbox_id)
        .await
        .unwrap();
    let stack = paused
        .boot_layers()
        .expect("a paused sandbox has its stack")
        .to_vec();

    // Its template deleted and a pass with no grace run: the stack a resume boots on stays.
    let (status, body) = sdk
        .call(
            reqwest::Method::DELETE,
            &format!("/templates/{template}"),
            None,
        )
        .await;
    assert!(status < 300, "{status} {body}");
    let blobs: std::sync::Arc<dyn strata::vmm::BlobStore> =
        std::sync::Arc::new(strata::vmm::LocalBlobStore::open(a.path().join("blobs")).unwrap());
    let env = strata::reconcilers::ReconcileEnv {
        store: store.clone(),
        node: "pause-gc".into(),
        blobs: blobs.clone(),
        gc: strata::reconcilers::gc::GcPolicy {
            budget: None,
            keep: chrono::Duration::zero(),
            grace: chrono::Duration::zero(),
            finals_per_template: 1,
            ..Default::default()
        },
        catalog: Some(a.path().to_path_buf()),
    };
    let report = strata::reconcilers::gc::pass(&env, &env.gc, &Default::default())
        .await
        .unwrap();
    let kept: std::collections::BTreeSet<_> =
        blobs.list().unwrap().iter().map(|b| b.digest).collect();
    for layer in &stack {
        assert!(
            kept.contains(layer),
            "layer {layer} of the paused sandbox was deleted: {:?}",
            report.deleted
        );
    }

    // Its node goes; a node that dies booting it leaves it paused, its files kept.
    first.signal(libc::SIGKILL);
    first.reap();
    let mut doomed = node("pause-c", b.path(), Some("sandbox:placed"));
    let connect = format!("/v2/sandboxes/{id}/connect");
    let (status, body) = sdk
        .call(reqwest::Method::POST, &connect, Some(json!({})))
        .await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("still paused"),
        "{body}"
    );
    doomed.reap();
    let row = strata::projections::sandboxes::get(&db.pool, &id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.state, "paused", "{row:?}");

    // Another node, whose cache never held the pause's layer, resumes it from the store.
    let _second = node("pause-b", b.path(), None);
    let (status, resumed) = sdk
        .call(
            reqwest::Method::POST,
            &connect,
            Some(json!({"timeout": 60})),
        )
        .await;
    assert_eq!(status, 201, "{resumed}");
    let row = strata::projections::sandboxes::get(&db.pool, &id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (row.state.as_str(), row.node_id.as_deref()),
        ("running", Some("pause-b"))
    );
    let (status, bytes) = agent_file(&http, &api.base, &resumed, "/tmp/kept.txt", None).await;
    assert_eq!((status, bytes.as_slice()), (200, b"kept".as_slice()));
    let (status, bytes) = agent_file(&http, &api.base, &resumed, "/tmp/built", None).await;
    assert_eq!(
        (status, bytes.as_slice()),
        (200, b"from the template\n".as_slice())
    );
    let (status, _) = sdk
        .call(reqwest::Method::DELETE, &format!("/sandboxes/{id}"), None)
        .await;
    assert_eq!(status, 204);

    // Its life on /ui/sandboxes: starting and running on the first node, paused, a resume that
    // failed (paused again), a resume on the second node, running there; each span ended, in
    // order.
    let page = common::chromium::page(&api.base, "/ui/sandboxes").await;
    let bars: Vec<&str> = page
        .split("<rect ")
        .skip(1)
        .filter(|r| r.contains(&format!("data-sandbox=\"{id}\"")))
        .map(|r| {
            let from = r.find("data-state=\"").unwrap() + 12;
            &r[from..from + r[from..].find('"').unwrap()]
        })
        .collect();
    assert_eq!(
        bars,
        ["starting", "running", "paused", "starting", "paused", "starting", "running"],
        "{page}"
    );
    let window = strata::projections::activity::Window::ending_at(
        strata::streams::database_now(&db.pool).await.unwrap(),
        chrono::Duration::hours(1),
        60,
    );
    let lives = strata::projections::activity::sandbox_lives(&db.pool, &window, 10)
        .await
        .unwrap();
    let life = lives.iter().find(|l| l.sandbox_id == id).unwrap();
    assert_eq!(life.state, "ended");
    assert!(life.spans.iter().all(|s| s.to_at.is_some()), "{life:?}");
    assert!(
        life.spans
            .windows(2)
            .all(|w| w[0].to_at.unwrap() <= w[1].from_at),
        "spans do not overlap: {life:?}"
    );
    common::chromium::screenshot(&api.base, "/ui/sandboxes", "sandboxes.png").await;
}
