//! The examples of README.md's "Operators" section, run as written against a real `strata up`
//! (the test's database, the node's data dir) after a real build that fails: each line runs in
//! `sh` with `strata` on PATH, `$BUILD_ID` and `$STRATA_ADMIN_TOKEN` set, and the README's
//! address replaced by the one this test serves on.

use crate::common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::http_build::SdkClient;
use serde_json::json;

const TOKEN: &str = "readme-admin-token-51c2";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_readme_operator_examples_run() {
    let examples = common::readme_sh_block("Operators");
    assert!(examples.len() >= 5, "{examples:?}");
    let db = common::test_db().await;
    let port = free_port();
    let mut child = common::http_build::ChildGuard(Some(
        Command::new(common::strata_bin())
            .arg("up")
            .env("DATABASE_URL", &db.url)
            .env("STRATA_DATA_DIR", common::sandbox::node_dir())
            .env("STRATA_LISTEN", format!("127.0.0.1:{port}"))
            .env("STRATA_ADMIN_TOKEN", TOKEN)
            .env(
                "STRATA_UPLOAD_SECRET",
                "readme-test-upload-secret-0123456789abcdef",
            )
            .env("STRATA_NODE_ID", "readme-node")
            // GC on the shared test node would weigh other tests' blobs against this database.
            .env("STRATA_GC_SCHEDULE", "off")
            .env("STRATA_QUEUE_POLL_MS", "200")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
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
    let sdk = SdkClient::new(&base, &db.url, "readme-team").await;
    let (_, ok, status) = sdk
        .build(
            "readme",
            &[],
            json!({"fromImage": "busybox", "force": false, "steps": [
            {"type": "RUN", "args": ["echo fine"], "force": false}]}),
        )
        .await;
    assert_eq!(status["status"], "ready");
    let (_, failed, status) = sdk
        .build(
            "readme",
            &[],
            json!({"fromImage": "busybox", "force": false, "steps": [
            {"type": "RUN", "args": ["echo fine"], "force": false},
            {"type": "RUN", "args": ["echo broken >&2; exit 4"], "force": false}]}),
        )
        .await;
    assert_eq!(status["status"], "error");

    let mut outputs = Vec::new();
    for line in &examples {
        let line = line.replace("http://127.0.0.1:3000", &base);
        let stdout = common::run_readme_line(
            &line,
            &[
                ("BUILD_ID", &failed),
                ("STRATA_ADMIN_TOKEN", TOKEN),
                ("DATABASE_URL", &db.url),
            ],
        )
        .await;
        outputs.push(stdout);
    }
    // What each example printed.
    assert!(
        outputs[0].contains("why it failed: StepFailed"),
        "{}",
        outputs[0]
    );
    assert!(outputs[0].contains("exit code: 4"), "{}", outputs[0]);
    assert!(
        outputs[0].contains(&format!("compared with build {ok}")),
        "{}",
        outputs[0]
    );
    let json: serde_json::Value = serde_json::from_str(&outputs[1]).unwrap();
    assert_eq!(json["failure"]["step"], "2");
    assert_eq!(json["cache"]["steps"][0]["hit"], true);
    assert_eq!(outputs[2].trim(), "strata_builds{phase=\"ready\"} 1");
    let page: serde_json::Value = serde_json::from_str(&outputs[3]).unwrap();
    assert_eq!(page, json);
    assert_eq!(outputs[4].trim(), "401");

    assert!(child.terminate().success());
}
