//! Cache-aware placement (ADR 0020) with real parts: `strata worker` processes, each with its
//! own data directory, sharing only the test's Postgres database and a bucket on a real
//! S3-protocol server on loopback (moto); and the residency report against a real layer cache.
//!
//! The placement tests assert what the nodes did and said (which node acquired the build, the
//! `placement=` field of its "build acquired" line, the other node's "leaving a queued build"
//! line, the placement counters on `/metrics`, the queue wait measured from the events), not
//! how fast anything happened to be.

use crate::common;

use std::time::{Duration, Instant};

use common::build_api::Api;
use common::process::Proc;
use serde_json::json;
use strata::domain::ids::{BuildId, TeamId};
use strata::vmm::local_s3::LocalS3;
use strata::worker::residency::{self, Reporter};

/// A cluster of build nodes: the database, the bucket, a seed directory with busybox, and the
/// nodes' data directories.
struct Nodes {
    db: common::TestDb,
    s3: LocalS3,
    root: tempfile::TempDir,
    api: Api,
}

const RUN_STAMP: &str = "head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n' > stamp";

impl Nodes {
    /// Builds the two-step "warm" template to ready on `node`, so that its first step's
    /// checkpoint is resident there.
    async fn warm(&self, node: &Proc) {
        let warm = self
            .start(
                "warm",
                json!([{"type": "RUN", "args": [RUN_STAMP], "force": false},
                       {"type": "RUN", "args": ["echo one > one"], "force": false}]),
            )
            .await;
        assert_eq!(
            self.wait_phase(warm, &["ready", "error"], &[node]).await,
            "ready"
        );
    }

    async fn new() -> Nodes {
        let db = common::test_db().await;
        let s3 = tokio::task::spawn_blocking(|| {
            let s3 = LocalS3::start().expect("the S3 test server");
            s3.create_bucket("placement").unwrap();
            s3
        })
        .await
        .unwrap();
        let root = tempfile::tempdir().unwrap();
        crate::multi_node::busybox_source(&root.path().join("seed"));
        let api = Api {
            store: strata::app::event_store(db.pool.clone()),
            team: TeamId::parse("team-placement").unwrap(),
        };
        Nodes { db, s3, root, api }
    }

    fn env(&self, node: &str) -> Vec<(String, String)> {
        let mut env = self.s3.env();
        env.push(("STRATA_BLOB_URL".into(), "s3://placement/blobs".into()));
        env.push((
            "STRATA_DATA_DIR".into(),
            self.root.path().join(node).display().to_string(),
        ));
        env
    }

    /// Starts `strata worker` as `node` (one build at a time, the given placement wait), its
    /// catalog copied from the seed first, its metrics on `metrics`.
    async fn worker(&self, node: &str, wait_ms: u64, metrics: u16) -> Proc {
        let env = self.env(node);
        let seed = self.root.path().join("seed");
        let copied = std::process::Command::new(common::strata_bin())
            .args(["image", "copy", "--from", &seed.display().to_string()])
            .envs(env.iter().map(|(k, v)| (k, v)))
            .output()
            .unwrap();
        assert!(copied.status.success(), "{copied:?}");
        let wait = wait_ms.to_string();
        let listen = format!("127.0.0.1:{metrics}");
        let mut all: Vec<(&str, &str)> =
            env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        all.extend([
            ("STRATA_LEASE_SECS", "10"),
            ("STRATA_MAX_BUILDS", "1"),
            ("STRATA_QUEUE_POLL_MS", "200"),
            ("STRATA_PLACEMENT_WAIT_MS", wait.as_str()),
            ("STRATA_METRICS_LISTEN", listen.as_str()),
        ]);
        let proc = Proc::spawn(&["worker"], &self.db.url, node, &all);
        // Up when its residency counts.
        let deadline = Instant::now() + Duration::from_secs(60);
        while !residency::live_nodes(&self.db.pool)
            .await
            .unwrap()
            .iter()
            .any(|n| n == node)
        {
            assert!(
                Instant::now() < deadline,
                "{node} never reported:\n{}",
                proc.stderr()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        proc
    }

    async fn start(&self, name: &str, steps: serde_json::Value) -> BuildId {
        let (_, build) = self.api.register(name).await;
        self.api
            .start(
                build,
                json!({"fromImage": "busybox", "force": false, "steps": steps}),
            )
            .await;
        build
    }

    async fn phase(&self, build: BuildId) -> String {
        sqlx::query_scalar("SELECT phase FROM builds WHERE build_id = $1")
            .bind(build.as_uuid())
            .fetch_one(&self.db.pool)
            .await
            .unwrap()
    }

    async fn wait_phase(&self, build: BuildId, wanted: &[&str], nodes: &[&Proc]) -> String {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let phase = self.phase(build).await;
            if wanted.contains(&phase.as_str()) {
                return phase;
            }
            assert!(
                Instant::now() < deadline,
                "build {build} stayed {phase}:\n{}",
                nodes
                    .iter()
                    .map(|n| n.stderr())
                    .collect::<Vec<_>>()
                    .join("\n----\n")
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The node the build's last attempt ran on.
    async fn node_of(&self, build: BuildId) -> String {
        sqlx::query_scalar("SELECT node FROM builds WHERE build_id = $1")
            .bind(build.as_uuid())
            .fetch_one(&self.db.pool)
            .await
            .unwrap()
    }

    /// Seconds from the build's `BuildFrozen` to its `AttemptAcquired`, by the database clock.
    async fn queue_wait(&self, build: BuildId) -> f64 {
        sqlx::query_scalar(
            "SELECT extract(epoch FROM max(recorded_at) FILTER (WHERE type = 'AttemptAcquired.v1')
                                    - max(recorded_at) FILTER (WHERE type = 'BuildFrozen.v1'))::float8
             FROM events WHERE stream_id = $1",
        )
        .bind(format!("build-{build}"))
        .fetch_one(&self.db.pool)
        .await
        .unwrap()
    }

    /// Whether the build resumed from a cached checkpoint (a step recorded as cached).
    async fn resumed(&self, build: BuildId) -> bool {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM events WHERE stream_id = $1 AND type = 'StepCompleted.v1'
             AND data::text LIKE '%\"kind\": \"cached\"%'",
        )
        .bind(format!("build-{build}"))
        .fetch_one(&self.db.pool)
        .await
        .unwrap();
        n >= 1
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn claims(port: u16, verdict: &str) -> f64 {
    let metrics = common::http_build::scrape(&format!("http://127.0.0.1:{port}/metrics")).await;
    metrics
        .get(&format!(
            "strata_placement_claims_total{{verdict=\"{verdict}\"}}"
        ))
        .copied()
        .unwrap_or(0.0)
}

/// A node's log without the colour codes around field names.
fn plain(log: &str) -> String {
    let mut out = String::with_capacity(log.len());
    let mut in_escape = false;
    for c in log.chars() {
        match c {
            '\x1b' => in_escape = true,
            'm' if in_escape => in_escape = false,
            c if !in_escape => out.push(c),
            _ => {}
        }
    }
    out
}

/// The "build acquired" line of `build` in a node's log, if that node acquired it.
fn acquired_line(log: &str, build: BuildId) -> Option<String> {
    plain(log)
        .lines()
        .find(|l| l.contains("build acquired") && l.contains(&build.to_string()))
        .map(str::to_owned)
}

fn left_to(log: &str, build: BuildId, node: &str) -> bool {
    plain(log).lines().any(|l| {
        l.contains("leaving a queued build")
            && l.contains(&build.to_string())
            && l.contains(&format!("preferred={node}"))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_build_whose_checkpoint_is_resident_on_a_node_is_claimed_there() {
    let nodes = Nodes::new().await;
    let (port_a, port_b) = (free_port(), free_port());
    // A long wait: if placement did not hold B back, B would take some of these builds; with
    // it, B never may within the test.
    let a = nodes.worker("node-a", 120_000, port_a).await;
    nodes.warm(&a).await;
    let b = nodes.worker("node-b", 120_000, port_b).await;

    // Both free, both live: each build resumes from the first step's checkpoint, which only A
    // holds, so A takes each one and B leaves each one to A.
    for i in 0..3 {
        let build = nodes
            .start(
                "warm",
                json!([{"type": "RUN", "args": [RUN_STAMP], "force": false},
                       {"type": "RUN", "args": [format!("echo {i} > n")], "force": false}]),
            )
            .await;
        assert_eq!(
            nodes
                .wait_phase(build, &["ready", "error"], &[&a, &b])
                .await,
            "ready"
        );
        assert_eq!(nodes.node_of(build).await, "node-a");
        assert!(nodes.resumed(build).await, "build {build} did not resume");
        let line = acquired_line(&a.stderr(), build).expect("A acquired it");
        assert!(line.contains("placement=hit"), "{line}");
        assert!(
            left_to(&b.stderr(), build, "node-a"),
            "B did not say it left {build} to A:\n{}",
            b.stderr()
        );
    }
    assert!(claims(port_a, "hit").await >= 3.0);
    assert_eq!(
        claims(port_b, "hit").await + claims(port_b, "miss").await,
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_build_left_to_a_busy_node_is_taken_by_another_after_the_wait() {
    let nodes = Nodes::new().await;
    let (port_a, port_b) = (free_port(), free_port());
    const WAIT_MS: u64 = 3_000;
    let a = nodes.worker("node-a", WAIT_MS, port_a).await;
    nodes.warm(&a).await;
    // A's only slot taken by a long build.
    let busy = nodes
        .start(
            "busy",
            json!([{"type": "RUN", "args": ["sleep 60"], "force": false}]),
        )
        .await;
    nodes.wait_phase(busy, &["active"], &[&a]).await;
    let b = nodes.worker("node-b", WAIT_MS, port_b).await;

    // Preferred for A (it holds the checkpoint), but A is busy: B leaves it for the wait,
    // then takes it, and it resumes there from the bucket.
    let build = nodes
        .start(
            "warm",
            json!([{"type": "RUN", "args": [RUN_STAMP], "force": false},
                   {"type": "RUN", "args": ["echo two > two"], "force": false}]),
        )
        .await;
    assert_eq!(
        nodes
            .wait_phase(build, &["ready", "error"], &[&a, &b])
            .await,
        "ready"
    );
    assert_eq!(nodes.node_of(build).await, "node-b");
    assert!(
        nodes.resumed(build).await,
        "build {build} did not resume on B"
    );
    let waited = nodes.queue_wait(build).await;
    assert!(
        waited >= WAIT_MS as f64 / 1000.0 - 0.1,
        "B took the build after {waited}s, before the placement wait"
    );
    assert!(
        waited < WAIT_MS as f64 / 1000.0 + 10.0,
        "the build waited {waited}s: the wait is not a bound"
    );
    assert!(left_to(&b.stderr(), build, "node-a"), "{}", b.stderr());
    let line = acquired_line(&b.stderr(), build).expect("B acquired it");
    assert!(line.contains("placement=miss"), "{line}");
    assert!(claims(port_b, "miss").await >= 1.0);
    assert_eq!(nodes.phase(busy).await, "active");

    // A stops dead (no clean expiry): its residency still counts until its heartbeat passes,
    // and the wait still bounds what a build preferred for it waits.
    a.signal(libc::SIGKILL);
    let next = nodes
        .start(
            "warm",
            json!([{"type": "RUN", "args": [RUN_STAMP], "force": false},
                   {"type": "RUN", "args": ["echo three > three"], "force": false}]),
        )
        .await;
    assert_eq!(
        nodes.wait_phase(next, &["ready", "error"], &[&b]).await,
        "ready"
    );
    assert_eq!(nodes.node_of(next).await, "node-b");
    assert!(nodes.queue_wait(next).await < WAIT_MS as f64 / 1000.0 + 10.0);
    drop(b);
    drop(a);
}

/// One layer of `len` bytes sealed into `blobs`.
fn layer(
    blobs: &dyn strata::vmm::BlobStore,
    name: &str,
    len: usize,
) -> strata::domain::ids::Digest {
    let dir = tempfile::tempdir().unwrap();
    let bytes: Vec<u8> = (0..len).map(|i| (i * 31 + name.len()) as u8).collect();
    std::fs::write(dir.path().join(name), bytes).unwrap();
    strata::vmm::layer::seal_dir(dir.path(), blobs, strata::vmm::id_range::Owners::AsSandbox)
        .unwrap()
        .digest
}

async fn held_by(pool: &sqlx::PgPool, d: &strata::domain::ids::Digest) -> Vec<String> {
    let mut nodes: Vec<String> = residency::holdings(pool, &[*d])
        .await
        .unwrap()
        .into_iter()
        .map(|(n, _, _)| n)
        .collect();
    nodes.sort();
    nodes
}

#[tokio::test]
async fn residency_follows_the_cache_and_a_silent_node_stops_counting() {
    let db = common::test_db().await;
    let dir = tempfile::tempdir().unwrap();
    let blobs = strata::vmm::LocalBlobStore::open(dir.path().join("blobs")).unwrap();
    let layers = dir.path().join("layers");
    let cache = strata::vmm::layer::LayerCache::open(&layers, Default::default()).unwrap();
    let (x, y) = (layer(&blobs, "x", 20_000), layer(&blobs, "y", 20_000));

    // A row an earlier run of this node left, for a layer its cache no longer has: the first
    // report replaces the node's whole set.
    sqlx::query("INSERT INTO cache_nodes VALUES ('node-r', now(), now() + interval '1 hour')")
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO layer_residency VALUES ('node-r', $1, 5)")
        .bind(y.to_string())
        .execute(&db.pool)
        .await
        .unwrap();
    cache.ensure(&blobs, &x).unwrap();
    let mut reporter = Reporter::new(
        db.pool.clone(),
        "node-r",
        cache.clone(),
        Duration::from_secs(3),
    );
    reporter.report().await.unwrap();
    assert_eq!(held_by(&db.pool, &x).await, ["node-r"]);
    assert!(
        held_by(&db.pool, &y).await.is_empty(),
        "a stale claim survived the restart"
    );
    let bytes = residency::holdings(&db.pool, &[x]).await.unwrap()[0].2;
    assert!(bytes >= 20_000, "{bytes}");

    // Gains and evictions are reported.
    cache.ensure(&blobs, &y).unwrap();
    reporter.report().await.unwrap();
    assert_eq!(held_by(&db.pool, &y).await, ["node-r"]);
    cache.set_budget(Some(25_000));
    reporter.report().await.unwrap();
    assert!(
        held_by(&db.pool, &x).await.is_empty(),
        "the evicted layer still counts"
    );
    assert_eq!(held_by(&db.pool, &y).await, ["node-r"]);

    // A cache wiped from outside (nothing in this process saw it) is reported as empty.
    std::fs::remove_dir_all(&layers).unwrap();
    reporter.report().await.unwrap();
    assert!(
        held_by(&db.pool, &y).await.is_empty(),
        "a wiped cache left a claim"
    );

    // A node that stops reporting stops counting when its time to live passes.
    cache.ensure(&blobs, &x).unwrap();
    reporter.report().await.unwrap();
    assert_eq!(held_by(&db.pool, &x).await, ["node-r"]);
    assert_eq!(residency::live_nodes(&db.pool).await.unwrap(), ["node-r"]);
    tokio::time::sleep(Duration::from_millis(3_200)).await;
    assert!(held_by(&db.pool, &x).await.is_empty());
    assert!(residency::live_nodes(&db.pool).await.unwrap().is_empty());

    // Its next report makes it count again; a clean stop expires it at once.
    reporter.report().await.unwrap();
    assert_eq!(held_by(&db.pool, &x).await, ["node-r"]);
    residency::expire(&db.pool, "node-r").await.unwrap();
    assert!(held_by(&db.pool, &x).await.is_empty());
}
