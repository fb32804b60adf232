//! README's "Past one machine" listing, run as written: two `strata api`, three `strata worker`
//! and a `strata reconcile`, each with its own data directory, sharing only the test's Postgres
//! database and a bucket on a real S3-protocol server on loopback (moto). The README's
//! addresses, directories and database URL are replaced by this test's; `/var/lib/strata` (the
//! base images' source) by a directory holding the test node's busybox image only, and the
//! layer-cache budget by one byte, so that every worker evicts all the time.

use crate::common;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::http_build::{tar_gz, SdkClient};
use serde_json::json;
use strata::vmm::local_s3::LocalS3;

/// The `sh` block under `## Past one machine`.
fn listing() -> String {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with("Past one machine"))
        .expect("README has a Past one machine section");
    section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("the section has a sh block")
        .to_owned()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A node directory holding only the busybox base image of the test node (the listing copies
/// every image of its source into the bucket; busybox is all these builds need).
pub(crate) fn busybox_source(dir: &Path) {
    let node = common::sandbox::node_dir();
    std::fs::create_dir_all(dir.join("images")).unwrap();
    std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
    let manifest_path = node.join("images/busybox.json");
    let manifest: strata::vmm::image::ImageManifest =
        serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
    std::fs::copy(&manifest_path, dir.join("images/busybox.json")).unwrap();
    for digest in manifest
        .digests()
        .into_iter()
        .chain(manifest.license_notice)
    {
        let from = node.join("blobs/sha256").join(digest.hex());
        std::fs::copy(from, dir.join("blobs/sha256").join(digest.hex())).unwrap();
    }
}

/// Every file under `<dir>/*/blobs/sha256`: blobs a process kept on its own disk.
fn local_blobs(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for node in std::fs::read_dir(root).unwrap().flatten() {
        if node.file_name() == "seed" {
            continue;
        }
        if let Ok(entries) = std::fs::read_dir(node.path().join("blobs/sha256")) {
            found.extend(entries.flatten().map(|e| e.path().display().to_string()));
        }
    }
    found
}

/// How many attempts any node has acquired so far.
async fn acquisitions(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM events WHERE type = 'AttemptAcquired.v1'")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The node whose attempt ran `build`.
async fn attempt_node(pool: &sqlx::PgPool, build: &str) -> String {
    sqlx::query_scalar(
        "SELECT data->>'node' FROM events WHERE stream_id LIKE '%' || $1 AND type = 'AttemptAcquired.v1' ORDER BY position DESC LIMIT 1",
    )
    .bind(build)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The pid of the `strata worker` started with `STRATA_NODE_ID=<node>`.
fn worker_pid(node: &str) -> i32 {
    let wanted = format!("STRATA_NODE_ID={node}");
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        let has = |hay: &[u8], needle: &[u8]| hay.split(|b| *b == 0).any(|part| part == needle);
        if has(&cmdline, b"worker") && has(&environ, wanted.as_bytes()) {
            return pid;
        }
    }
    panic!("no strata worker runs as {node}");
}

/// The listing's shell and everything it started: one process group, ended together. The
/// nodes' data directories under `root` are swept after, for what the worker the test killed
/// (and any the SIGKILL caught) could not remove itself.
struct Cluster(std::process::Child, std::path::PathBuf);

impl Drop for Cluster {
    fn drop(&mut self) {
        let pgid = self.0.id() as i32;
        // SAFETY: kill(2) on the process group this test created.
        unsafe { libc::kill(-pgid, libc::SIGTERM) };
        std::thread::sleep(Duration::from_secs(2));
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        let _ = self.0.wait();
        for node in std::fs::read_dir(&self.1).into_iter().flatten().flatten() {
            if node.path().join("sandboxes").is_dir() {
                common::process::sweep_dead(&node.path());
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn past_one_machine_the_readme_layout_builds_through_either_api() {
    let script = listing();
    let db = common::test_db().await;
    let s3 = tokio::task::spawn_blocking(|| {
        let s3 = LocalS3::start().expect("the S3 test server");
        s3.create_bucket("strata-blobs").unwrap();
        s3
    })
    .await
    .unwrap();
    let root = tempfile::tempdir().unwrap();
    let seed = root.path().join("seed");
    busybox_source(&seed);
    let (port1, port2) = (free_port(), free_port());
    let script = script
        // Quoted: the test server's URL names its socket (`?host=…&port=…`).
        .replace(
            "postgres://strata:secret@127.0.0.1:5432/strata",
            &format!("'{}'", db.url),
        )
        .replace("http://127.0.0.1:9000", &s3.endpoint)
        .replace("/srv/strata", &root.path().display().to_string())
        .replace("/var/lib/strata", &seed.display().to_string())
        .replace("127.0.0.1:3001", &format!("127.0.0.1:{port1}"))
        .replace("127.0.0.1:3002", &format!("127.0.0.1:{port2}"))
        // A budget below any layer: every extraction evicts all a running sandbox does not
        // mount, and the builds must not notice.
        .replace(
            "STRATA_LAYER_CACHE_BYTES=20000000000",
            "STRATA_LAYER_CACHE_BYTES=1",
        );
    assert!(script.contains("STRATA_LAYER_CACHE_BYTES=1 "));
    assert!(script.contains("strata worker &") && script.contains("strata api &"));

    let bin_dir = common::strata_bin().parent().unwrap().to_owned();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let log = std::fs::File::create(root.path().join("cluster.log")).unwrap();
    let mut command = Command::new("bash");
    command
        .args(["-euo", "pipefail", "-c", &script])
        .env("PATH", &path)
        .env("STRATA_QUEUE_POLL_MS", "200")
        // A killed worker's lease runs out within seconds, so its build ends in the test.
        .env("STRATA_LEASE_SECS", "6")
        .env("RUST_LOG", "info")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .stdin(Stdio::null())
        .stdout(Stdio::from(log.try_clone().unwrap()))
        .stderr(Stdio::from(log));
    command.process_group(0);
    let mut cluster = Cluster(command.spawn().unwrap(), root.path().to_path_buf());
    let log_text = || std::fs::read_to_string(root.path().join("cluster.log")).unwrap_or_default();

    let apis = [
        format!("http://127.0.0.1:{port1}"),
        format!("http://127.0.0.1:{port2}"),
    ];
    let deadline = Instant::now() + Duration::from_secs(180);
    for base in &apis {
        while reqwest::get(format!("{base}/health")).await.is_err() {
            assert!(
                cluster.0.try_wait().unwrap().is_none(),
                "the listing exited:\n{}",
                log_text()
            );
            assert!(
                Instant::now() < deadline,
                "{base} did not serve:\n{}",
                log_text()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    // The stock SDK's requests, through either API: a COPY (the upload goes to the bucket
    // through that API) and a RUN on whichever worker takes the build.
    let app = tar_gz(&[("hello.txt", b"hi\n")]);
    let mut built = Vec::new();
    for (i, base) in apis.iter().enumerate() {
        let sdk = SdkClient::new(base, &db.url, "multi").await;
        let hash = format!("{:064x}", i + 1);
        let (_, build, status) = sdk
            .build(
                &format!("multi-{i}"),
                &[(&hash, app.clone())],
                json!({"fromImage": "busybox", "force": false, "steps": [
                    {"type": "COPY", "args": ["hello.txt", "/opt/app/", "", ""], "filesHash": hash, "force": false},
                    {"type": "RUN", "args": [format!("cat /opt/app/hello.txt > out-{i}")], "force": false}]}),
            )
            .await;
        assert_eq!(status["status"], "ready", "{status}\n{}", log_text());
        built.push(build);
    }

    // A checkpoint written on one worker resumes on another: the first build's node is
    // stopped, the second build (same first step) must take it from the bucket elsewhere.
    let sdk = SdkClient::new(&apis[0], &db.url, "multi").await;
    let stamp = "head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n' > stamp";
    let (_, first, status) = sdk
        .build(
            "multi-checkpoint",
            &[],
            json!({"fromImage": "busybox", "force": false, "steps": [
                {"type": "RUN", "args": [stamp], "force": false},
                {"type": "RUN", "args": ["echo one > one"], "force": false}]}),
        )
        .await;
    assert_eq!(status["status"], "ready", "{status}\n{}", log_text());
    let first_node = attempt_node(&db.pool, &first).await;
    let stopped = worker_pid(&first_node);
    // SAFETY: kill(2) on a worker this test's listing started.
    unsafe { libc::kill(stopped, libc::SIGSTOP) };
    let sdk = SdkClient::new(&apis[1], &db.url, "multi").await;
    let (_, second, status) = sdk
        .build(
            "multi-checkpoint",
            &[],
            json!({"fromImage": "busybox", "force": false, "steps": [
                {"type": "RUN", "args": [stamp], "force": false},
                {"type": "RUN", "args": ["echo two > two"], "force": false}]}),
        )
        .await;
    unsafe { libc::kill(stopped, libc::SIGCONT) };
    assert_eq!(status["status"], "ready", "{status}\n{}", log_text());
    let second_node = attempt_node(&db.pool, &second).await;
    assert_ne!(first_node, second_node);
    let resumed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM events WHERE stream_id LIKE '%' || $1 AND data::text LIKE '%\"kind\": \"cached\"%'",
    )
    .bind(&second)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(
        resumed >= 1,
        "build {second} on {second_node} did not resume from {first_node}'s checkpoint"
    );

    // Wipe every worker's layer cache while they run: the next build extracts what it needs
    // again from the bucket.
    for n in 1..=3 {
        let layers = root.path().join(format!("worker-{n}/layers"));
        if layers.exists() {
            std::fs::remove_dir_all(&layers).unwrap();
        }
    }
    let sdk = SdkClient::new(&apis[1], &db.url, "multi").await;
    let (_, _, status) = sdk
        .build(
            "multi-after-wipe",
            &[],
            json!({"fromImage": "busybox", "force": false, "steps": [
                {"type": "RUN", "args": ["echo after the wipe > after"], "force": false}]}),
        )
        .await;
    assert_eq!(status["status"], "ready", "{status}\n{}", log_text());

    // A worker killed mid-build: that build ends as the reconcilers decide, the others finish.
    let acquired_before = acquisitions(&db.pool).await;
    let victim = {
        let sdk = SdkClient::new(&apis[0], &db.url, "multi").await;
        tokio::spawn(async move {
            sdk.build(
                "multi-killed",
                &[],
                json!({"fromImage": "busybox", "force": false, "steps": [
                    {"type": "RUN", "args": ["sleep 60"], "force": false}]}),
            )
            .await
        })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while acquisitions(&db.pool).await == acquired_before {
        assert!(
            Instant::now() < deadline,
            "the build was never acquired\n{}",
            log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let killed_node: String = sqlx::query_scalar(
        "SELECT data->>'node' FROM events WHERE type = 'AttemptAcquired.v1' ORDER BY position DESC LIMIT 1",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    // SAFETY: kill(2) on a worker this test's listing started.
    unsafe { libc::kill(worker_pid(&killed_node), libc::SIGKILL) };
    let sdk = SdkClient::new(&apis[1], &db.url, "multi").await;
    let (_, _, status) = sdk
        .build(
            "multi-survivor",
            &[],
            json!({"fromImage": "busybox", "force": false, "steps": [
                {"type": "RUN", "args": ["echo still here > here"], "force": false}]}),
        )
        .await;
    assert_eq!(status["status"], "ready", "{status}\n{}", log_text());
    let (_, _, status) = victim.await.unwrap();
    assert_eq!(status["status"], "error", "{status}");
    assert!(
        status["reason"]["message"]
            .to_string()
            .contains(&killed_node)
            || status["reason"]["message"]
                .to_string()
                .to_lowercase()
                .contains("node"),
        "{status}"
    );

    assert!(
        log_text().contains("evicted a least recently used layer"),
        "no worker evicted a layer under its budget"
    );

    // Nothing but Postgres and the bucket is shared: no process kept a blob on its own disk.
    assert_eq!(local_blobs(root.path()), Vec::<String>::new());
    let bucket_blobs = tokio::task::spawn_blocking(move || {
        let store = strata::vmm::blob_url::open_blob_store_with(
            Some("s3://strata-blobs/prod"),
            Path::new("/nonexistent"),
            s3.env(),
        )
        .unwrap();
        let object = store.as_object().unwrap();
        let raw = object.raw();
        let prefix = object_store::path::Path::from("prod/sha256");
        let n = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                use futures::TryStreamExt;
                raw.list(Some(&prefix))
                    .try_collect::<Vec<_>>()
                    .await
                    .unwrap()
                    .len()
            });
        drop(s3);
        n
    })
    .await
    .unwrap();
    assert!(bucket_blobs >= 4, "{bucket_blobs} blobs in the bucket");
    drop(cluster);
}
