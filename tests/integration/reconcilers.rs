//! Builds that always finish, with real processes: `strata worker` killed (SIGKILL, or the
//! `STRATA_FAULT_CRASH_AT` crash points for places no outside signal can hit reliably) or paused,
//! `strata reconcile` processes driving every build to a terminal state, Postgres restarted
//! under a running build. Builds are registered and started through the domain, as the API would.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use common::build_api::{stream, Api};
use common::process::Proc;
use common::publishing::enter_publishing;
use serde_json::json;
use strata::domain::build::{self, AttemptGrant, FailureKind, Phase};
use strata::domain::build_spec::Tag;
use strata::domain::ids::{self, BuildId, Epoch, FilesHash, NodeId, TeamId};
use strata::events::command::load;
use strata::events::{Actor, ActorRole, CommandContext, EventStore, Metadata, RecordedEvent};
use strata::streams::{Build, Template};
use uuid::Uuid;

/// Lease of every worker here: short, so reconcilers act within seconds.
const LEASE_SECS: u64 = 3;

// ---------------------------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------------------------

/// A worker with the short test lease; `crash_at` names a fault point where it SIGKILLs itself.
/// [`Proc`] kills its whole process group on drop, so a failed test leaves nothing running (the
/// sandboxes of a killed worker die with it on their own: that is tested, not assumed, by
/// [`leftovers_of`]).
fn start_worker(db_url: &str, node: &str, crash_at: Option<&str>) -> Proc {
    start_worker_with_lease(db_url, node, crash_at, LEASE_SECS)
}

fn start_worker_with_lease(db_url: &str, node: &str, crash_at: Option<&str>, lease: u64) -> Proc {
    let env: Vec<(&str, &str)> = crash_at
        .map(|point| (strata::fault::CRASH_AT_ENV, point))
        .into_iter()
        .collect();
    Proc::worker(db_url, node, lease, &env)
}

fn start_reconciler(db_url: &str, node: &str, only: &[&str]) -> Proc {
    Proc::reconciler(db_url, node, only, &[])
}

/// What the crash tests ask of a worker process about its sandboxes.
trait SandboxOwner {
    fn running_sandboxes(&self) -> BTreeSet<String>;
    fn sandbox_links(&self) -> BTreeSet<String>;
    fn sandbox_owner(&self, data_dir: &std::path::Path) -> Option<String>;
    async fn wait_started(&mut self);
}

impl SandboxOwner for Proc {
    /// Ids of the sandboxes this process started that are running now (its children's cgroups).
    fn running_sandboxes(&self) -> BTreeSet<String> {
        let mut ids = BTreeSet::new();
        let tasks = std::fs::read_dir(format!("/proc/{}/task", self.pid()));
        for task in tasks.into_iter().flatten().flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in children.split_whitespace() {
                ids.extend(sandbox_of_process(child));
            }
        }
        ids
    }

    /// The host ends of its running sandboxes' network links (`sbx<slot>`), from the default
    /// route each `sandbox-init` sees: the gateway is the host end's address, `.1` of the slot.
    fn sandbox_links(&self) -> BTreeSet<String> {
        let subnet: strata::domain::egress_policy::Ipv4Net =
            strata::vmm::NetworkConfig::DEFAULT_SUBNET.parse().unwrap();
        let mut links = BTreeSet::new();
        let tasks = std::fs::read_dir(format!("/proc/{}/task", self.pid()));
        for task in tasks.into_iter().flatten().flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in children.split_whitespace() {
                let routes =
                    std::fs::read_to_string(format!("/proc/{child}/net/route")).unwrap_or_default();
                for fields in routes
                    .lines()
                    .skip(1)
                    .map(|l| l.split_whitespace().collect::<Vec<_>>())
                {
                    if fields.get(1) == Some(&"00000000") {
                        let raw = u32::from_str_radix(fields[2], 16).unwrap();
                        let gateway = std::net::Ipv4Addr::from(raw.to_ne_bytes());
                        if subnet.contains(gateway) {
                            let slot = (u32::from(gateway) - u32::from(subnet.addr())) / 4;
                            links.insert(format!("sbx{slot}"));
                        }
                    }
                }
            }
        }
        links
    }

    /// The owner id of this process's sandbox backend, from its log or its lock file (which a
    /// sibling's sweep removes once the process is dead).
    fn sandbox_owner(&self, data_dir: &std::path::Path) -> Option<String> {
        // Without colour codes (the log may carry them around field names).
        let logged = without_colours(&self.stderr());
        if let Some(rest) = logged.split("sandbox_owner=").nth(1) {
            let rest = rest.trim_start_matches('"');
            let id: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            if !id.is_empty() {
                return Some(id);
            }
        }
        let pid = self.pid().to_string();
        std::fs::read_dir(data_dir.join("sandboxes"))
            .ok()?
            .flatten()
            .find_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let owner = name
                    .strip_prefix(".owner-")?
                    .strip_suffix(".lock")?
                    .to_owned();
                (std::fs::read_to_string(e.path()).ok()?.trim() == pid).then_some(owner)
            })
    }

    /// Waits until the worker logged that it started (its backend swept before that).
    async fn wait_started(&mut self) {
        wait_for("a worker to start", Duration::from_secs(30), || {
            let started = self.stderr().contains("build node started");
            async move { started }
        })
        .await;
    }
}

/// The sandbox id a process belongs to, from its cgroup path (`…/strata/<id>`).
fn sandbox_of_process(pid: &str) -> Option<String> {
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    cg.lines().find_map(|l| {
        let (_, id) = l.split_once("/strata/")?;
        Some(id.trim().to_owned())
    })
}

/// Everything on the host that belongs to a sandbox whose id starts with `prefix`: its
/// directory under `data_dir`, its cgroups, its mounts, its processes.
fn leftovers_of(data_dir: &std::path::Path, prefix: &str) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir(data_dir.join("sandboxes"))
        .unwrap()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(prefix) {
            found.push(format!("directory {}", e.path().display()));
        }
    }
    for ctrl in ["", "pids/", "memory/", "cpu/", "unified/"] {
        for e in std::fs::read_dir(format!("/sys/fs/cgroup/{ctrl}strata"))
            .into_iter()
            .flatten()
            .flatten()
        {
            if e.file_name().to_string_lossy().starts_with(prefix) {
                found.push(format!("cgroup {}", e.path().display()));
            }
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    found.extend(
        mounts
            .lines()
            .filter(|l| l.contains(prefix))
            .map(|l| format!("mount {l}")),
    );
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let pid = e.file_name().to_string_lossy().into_owned();
        if let Some(id) = sandbox_of_process(&pid).filter(|id| id.starts_with(prefix)) {
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            found.push(format!(
                "process {pid} of {id}: {}",
                String::from_utf8_lossy(&cmd).replace('\0', " ")
            ));
        }
    }
    found
}

// ---------------------------------------------------------------------------------------------
// Database helpers
// ---------------------------------------------------------------------------------------------

fn new_api(store: &EventStore) -> Api {
    Api {
        store: store.clone(),
        team: TeamId::parse(&format!(
            "team{}",
            &Uuid::new_v4().simple().to_string()[..8]
        ))
        .unwrap(),
    }
}

async fn phase_row(pool: &sqlx::PgPool, build: BuildId) -> Option<String> {
    sqlx::query_scalar("SELECT phase FROM builds WHERE build_id = $1")
        .bind(build.as_uuid())
        .fetch_optional(pool)
        .await
        .unwrap()
}

async fn build_state(store: &EventStore, build: BuildId) -> build::State {
    load::<Build>(store, &stream(ids::stream::build(&build)))
        .await
        .unwrap()
        .state
}

async fn build_events(store: &EventStore, build: BuildId) -> Vec<RecordedEvent> {
    store
        .read_stream_all(&stream(ids::stream::build(&build)))
        .await
        .unwrap()
}

/// Polls (bounded by `limit`) until `check` holds.
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

async fn wait_terminal(pool: &sqlx::PgPool, build: BuildId, limit: Duration) {
    wait_for(&format!("build {build} to finish"), limit, || async {
        matches!(
            phase_row(pool, build).await.as_deref(),
            Some("ready" | "error")
        )
    })
    .await;
}

fn count(events: &[RecordedEvent], event_type: &str) -> usize {
    events.iter().filter(|e| e.event_type == event_type).count()
}

fn actor_of(events: &[RecordedEvent], event_type: &str) -> ActorRole {
    events
        .iter()
        .find(|e| e.event_type == event_type)
        .unwrap_or_else(|| panic!("no {event_type}"))
        .metadata
        .actor
        .role
}

fn step(kind: &str, args: &[&str]) -> serde_json::Value {
    json!({"type": kind, "args": args, "force": false})
}

fn recipe(steps: Vec<serde_json::Value>) -> serde_json::Value {
    json!({"fromImage": "busybox", "force": false, "steps": steps})
}

/// A node cut off from the database (a proxy that stops passing its bytes, so every renewal
/// hangs instead of failing) stops its build's sandbox before its lease expires by the
/// database's clock, so before anyone can call the node lost and run the build elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_cut_off_from_the_database_stops_its_sandbox_before_its_lease_expires() {
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    let api = new_api(&store);
    let (_, build) = api.register("partitioned").await;
    api.start(build, recipe(vec![step("RUN", &["sleep 600"])]))
        .await;
    let proxy = common::db_proxy::DbProxy::start(&db.url).await;
    let lease = 6;
    let worker = start_worker_with_lease(&proxy.url, "cut-off-node", None, lease);
    wait_for("the step's sandbox to run", Duration::from_secs(90), || {
        let running = !worker.running_sandboxes().is_empty();
        async move { running }
    })
    .await;
    // Let a renewal pass first, then cut the node off.
    tokio::time::sleep(Duration::from_secs(3)).await;
    proxy.cut();
    wait_for(
        "the cut-off node to stop its sandbox",
        Duration::from_secs(lease + 5),
        || {
            let running = !worker.running_sandboxes().is_empty();
            async move { !running }
        },
    )
    .await;
    let gone_at: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let Phase::Active {
        lease_expires_at, ..
    } = build_state(&store, build).await.phase
    else {
        panic!("the build is not active")
    };
    assert!(
        gone_at < lease_expires_at,
        "the sandbox ran until {gone_at}, past the lease ({lease_expires_at})"
    );
    assert!(
        worker.stderr().contains("could not be renewed in time"),
        "{}",
        worker.stderr()
    );
    // Only then may the attempt be expired (and the build retried elsewhere).
    let _reconciler = start_reconciler(&db.url, "expiry", &["attempt-expiry"]);
    wait_for("the attempt to expire", Duration::from_secs(30), || async {
        count(&build_events(&store, build).await, "AttemptExpired.v1") == 1
    })
    .await;
    let expired = build_events(&store, build)
        .await
        .into_iter()
        .find(|e| e.event_type == "AttemptExpired.v1")
        .unwrap();
    assert!(expired.recorded_at > gone_at);
}

// ---------------------------------------------------------------------------------------------
// Crash matrix
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Crash {
    /// A crash point of the worker (`STRATA_FAULT_CRASH_AT`).
    At(&'static str),
    /// SIGKILL from outside while the second step (`sleep`) runs.
    MidRun,
}

struct CrashResult {
    crash: Crash,
    events: Vec<RecordedEvent>,
    promotion: Vec<RecordedEvent>,
    state: build::State,
    tag_holder: Option<BuildId>,
    build: BuildId,
    /// The scenario's database, kept until the result is checked (`strata history` reads it).
    db: common::TestDb,
    /// The scenario's node directory, its own so that no other test's worker sweeps (or holds
    /// the lock of) its dead worker's sandboxes, and a retry finds the checkpoints it wrote.
    node: tempfile::TempDir,
    /// Seconds from the lease's expiry to the terminal event, by the database clock.
    lag_secs: f64,
}

/// A worker on a node directory of the test's own: no other test's worker sweeps (or holds
/// the owner lock of) its sandboxes there.
fn worker_in(db_url: &str, node: &str, crash_at: Option<&str>, data_dir: &Path) -> Proc {
    let data_dir = data_dir.to_str().unwrap();
    let mut env = vec![("STRATA_DATA_DIR", data_dir)];
    env.extend(crash_at.map(|point| (strata::fault::CRASH_AT_ENV, point)));
    Proc::worker(db_url, node, LEASE_SECS, &env)
}

async fn crash_scenario(crash: Crash) -> CrashResult {
    let node = common::sandbox::private_node(&["busybox"]);
    let data_dir = node.path().to_path_buf();
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    let api = new_api(&store);
    let (template, build) = api.register("crash").await;
    let second = match crash {
        Crash::MidRun => step("RUN", &["sleep 20"]),
        Crash::At("worker:mid-copy") => {
            // A real upload: a tar in the node's blob store, bound through the domain.
            let hash = FilesHash::parse(&hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
                build.to_string().as_bytes(),
            )))
            .unwrap();
            let mut tar = tar::Builder::new(Vec::new());
            let mut h = tar::Header::new_ustar();
            h.set_entry_type(tar::EntryType::Regular);
            h.set_size(5);
            h.set_mode(0o644);
            tar.append_data(&mut h, "hello.txt", &b"hello"[..]).unwrap();
            let bytes = tar.into_inner().unwrap();
            let blobs: std::sync::Arc<dyn strata::vmm::BlobStore> = std::sync::Arc::new(
                strata::vmm::LocalBlobStore::open(data_dir.join("blobs")).unwrap(),
            );
            api.upload(&blobs, build, &hash, &bytes).await;
            json!({"type": "COPY", "args": ["hello.txt", "/tmp/", "", ""], "filesHash": hash.as_str(), "force": false})
        }
        Crash::At(_) => step("RUN", &["echo two > /tmp/two"]),
    };
    api.start(
        build,
        recipe(vec![step("RUN", &["echo one > /tmp/one"]), second]),
    )
    .await;
    let crash_at = match crash {
        Crash::At(point) => Some(point),
        Crash::MidRun => None,
    };
    let mut worker = worker_in(&db.url, "crash-node", crash_at, &data_dir);
    // The dead worker's sandboxes, by observation (while it runs) and by its owner id.
    let mut seen = BTreeSet::new();
    let mut links = BTreeSet::new();
    let mut owner = None;
    match crash {
        Crash::At(point) => {
            wait_for(
                &format!("the worker to crash at {point}"),
                Duration::from_secs(90),
                || {
                    seen.extend(worker.running_sandboxes());
                    owner = owner.take().or_else(|| worker.sandbox_owner(&data_dir));
                    let exited = worker.exited();
                    let (pool, store) = (db.pool.clone(), store.clone());
                    async move {
                        if !exited && phase_row(&pool, build).await.as_deref() == Some("error") {
                            panic!(
                                "the build failed: {:?}",
                                build_state(&store, build).await.phase
                            );
                        }
                        exited
                    }
                },
            )
            .await;
            assert!(
                worker.stderr().contains(&format!("crashing at {point}")),
                "the worker did not reach {point}: {}",
                worker.stderr()
            );
        }
        Crash::MidRun => {
            wait_for("step 1 to complete", Duration::from_secs(90), || async {
                count(&build_events(&store, build).await, "StepCompleted.v1") == 1
            })
            .await;
            tokio::time::sleep(Duration::from_millis(1500)).await;
            seen.extend(worker.running_sandboxes());
            owner = worker.sandbox_owner(&data_dir);
            assert!(!seen.is_empty(), "the worker runs `sleep` in a sandbox");
            links = worker.sandbox_links();
            assert!(!links.is_empty(), "the worker's sandbox has a network link");
            worker.signal(libc::SIGKILL);
            worker.reap();
        }
    }
    // The worker logs its owner id when it starts, before it claims anything.
    let owner = owner
        .or_else(|| worker.sandbox_owner(&data_dir))
        .expect("the crashed worker's sandbox owner lock was seen");
    let mut prefixes: Vec<String> = seen.into_iter().collect();
    prefixes.push(format!("sbx-{owner}-"));
    // Its sandboxes die with it, before anyone sweeps: no process is left in their cgroups.
    wait_for(
        "the dead worker's sandbox processes to exit",
        Duration::from_secs(10),
        || {
            let alive: Vec<String> = prefixes
                .iter()
                .flat_map(|p| leftovers_of(&data_dir, p))
                .filter(|l| l.starts_with("process "))
                .collect();
            async move { alive.is_empty() }
        },
    )
    .await;
    // Their network links die with their namespaces, which die with the worker's descriptors.
    wait_for(
        "the dead worker's sandbox links to go",
        Duration::from_secs(10),
        || {
            let left: Vec<&String> = links
                .iter()
                .filter(|l| strata::vmm::namespace::netlink::index_of(l).is_ok())
                .collect();
            let gone = left.is_empty();
            async move { gone }
        },
    )
    .await;
    // The next worker's start removes the rest: directories, cgroups, mounts.
    let mut next = worker_in(&db.url, "crash-node", None, &data_dir);
    next.wait_started().await;
    let left: Vec<String> = prefixes
        .iter()
        .flat_map(|p| leftovers_of(&data_dir, p))
        .collect();
    assert!(
        left.is_empty(),
        "{crash:?}: the dead worker's sandboxes survived the next worker's start: {left:#?}"
    );
    assert!(
        !data_dir
            .join(format!("sandboxes/.owner-{owner}.lock"))
            .exists(),
        "the dead owner's lock is removed"
    );
    drop(next);
    let before_reconciler = build_state(&store, build).await;
    assert!(
        !before_reconciler.phase.is_terminal(),
        "{crash:?}: the build must still be open when the node dies: {:?}",
        before_reconciler.phase
    );
    let _reconciler = Proc::reconciler(
        &db.url,
        "reconciler-a",
        &[],
        &[("STRATA_DATA_DIR", data_dir.to_str().unwrap())],
    );
    wait_terminal(&db.pool, build, Duration::from_secs(60)).await;
    let events = build_events(&store, build).await;
    let promotion = store
        .read_stream_all(&stream(ids::stream::promotion(&build, Epoch(1))))
        .await
        .unwrap();
    let state = build_state(&store, build).await;
    let tag_holder = load::<Template>(&store, &stream(ids::stream::template(&template)))
        .await
        .unwrap()
        .state
        .tags
        .get(&Tag::default_tag())
        .copied();
    let lease_expires_at: DateTime<Utc> = events
        .iter()
        .rev()
        .find_map(|e| match e.decode::<build::Event>().unwrap() {
            build::Event::AttemptAcquired {
                lease_expires_at, ..
            }
            | build::Event::LeaseRenewed {
                lease_expires_at, ..
            } => Some(lease_expires_at),
            _ => None,
        })
        .unwrap();
    let terminal = events
        .iter()
        .find(|e| e.event_type == "BuildReady.v1" || e.event_type == "BuildFailed.v1")
        .unwrap();
    CrashResult {
        crash,
        lag_secs: (terminal.recorded_at - lease_expires_at).num_milliseconds() as f64 / 1000.0,
        events,
        promotion,
        state,
        tag_holder,
        build,
        db,
        node,
    }
}

/// Issue: the checkpoint record and its cache entry were separate appends, so a node lost
/// between them left a committed checkpoint no later build could find (RFC: "a retry build
/// reuses all committed checkpoints"). A worker killed right after step 1's record: the build
/// ends NodeLost, and a retry of the same recipe resumes from step 1 instead of running it
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_a_node_is_lost_a_retry_resumes_from_the_last_committed_step() {
    let r = crash_scenario(Crash::At("worker:after-checkpoint-record")).await;
    assert!(
        matches!(&r.state.phase, Phase::Error { reason, .. } if reason.kind == FailureKind::NodeLost),
        "{:?}",
        r.state.phase
    );
    assert!(
        matches!(
            r.state.progress.get(&1),
            Some(build::StepOutcome::Checkpointed { .. })
        ),
        "step 1 committed before the crash: {:?}",
        r.state.progress
    );
    let store = strata::app::event_store(r.db.pool.clone());
    let api = Api {
        store: store.clone(),
        team: r.state.registration.as_ref().unwrap().team.clone(),
    };
    let (_, retry) = api.register("crash").await;
    api.start(
        retry,
        recipe(vec![
            step("RUN", &["echo one > /tmp/one"]),
            step("RUN", &["echo two > /tmp/two"]),
        ]),
    )
    .await;
    let _worker = worker_in(&r.db.url, "retry-node", None, r.node.path());
    wait_terminal(&r.db.pool, retry, Duration::from_secs(90)).await;
    let state = build_state(&store, retry).await;
    assert!(
        matches!(state.phase, Phase::Ready { .. }),
        "{:?}",
        state.phase
    );
    assert!(
        matches!(
            state.progress.get(&1),
            Some(build::StepOutcome::Cached { .. })
        ),
        "the retry resumes from step 1's checkpoint: {:?}",
        state.progress
    );
    assert!(
        matches!(
            state.progress.get(&2),
            Some(build::StepOutcome::Checkpointed { .. })
        ),
        "{:?}",
        state.progress
    );
}

/// `strata history build ID` as an operator runs it.
fn history(db_url: &str, build: BuildId) -> String {
    let out = Command::new(common::strata_bin())
        .args(["history", "build", &build.to_string()])
        .env("DATABASE_URL", db_url)
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_killed_at_any_point_leaves_no_build_unfinished() {
    let crashes = [
        Crash::At("worker:before-first-step"),
        Crash::MidRun,
        Crash::At("worker:mid-copy"),
        Crash::At("worker:after-last-step"),
        Crash::At("worker:after-publishing"),
        Crash::At("promotion:after-layers-committed"),
        Crash::At("promotion:after-visible"),
    ];
    let results =
        futures::future::join_all(crashes.iter().map(|c| tokio::spawn(crash_scenario(*c)))).await;
    for result in results {
        let r = result.unwrap();
        let name = format!("{:?}", r.crash);
        // Within the lease plus a few one-second reconcile intervals of the lease's expiry.
        assert!(
            r.lag_secs < 10.0,
            "{name}: terminal {:.1} s after the lease expired",
            r.lag_secs
        );
        let published = count(&r.events, "PublishingStarted.v1") == 1;
        // The operator's timeline: every event of the build and its outbox, who, which epoch.
        let timeline = history(&r.db.url, r.build);
        let lines: Vec<&str> = timeline.lines().collect();
        assert_eq!(
            lines.len(),
            1 + r.events.len() + r.promotion.len(),
            "{name}: {timeline}"
        );
        assert!(lines[0].contains("STREAM") && lines[0].contains("EPOCH"));
        let terminal_line = lines
            .iter()
            .find(|l| l.contains("BuildReady.v1") || l.contains("BuildFailed.v1"))
            .unwrap();
        assert!(
            terminal_line.contains("reconciler/reconciler-a"),
            "{terminal_line}"
        );
        assert!(timeline.contains("worker/crash-node"), "{timeline}");
        match r.crash {
            Crash::At("worker:after-publishing")
            | Crash::At("promotion:after-layers-committed")
            | Crash::At("promotion:after-visible") => {
                assert!(published, "{name}");
                assert!(
                    matches!(r.state.phase, Phase::Ready { epoch: Epoch(1) }),
                    "{name}: published builds end Ready: {:?}",
                    r.state.phase
                );
                assert_eq!(actor_of(&r.events, "BuildReady.v1"), ActorRole::Reconciler);
                assert_eq!(count(&r.events, "BuildReady.v1"), 1, "{name}");
                assert_eq!(count(&r.events, "BuildFailed.v1"), 0, "{name}");
                assert_eq!(count(&r.events, "AttemptExpired.v1"), 0, "{name}");
                let types: Vec<&str> = r.promotion.iter().map(|e| e.event_type.as_str()).collect();
                assert_eq!(
                    types,
                    [
                        "PromotionStaged.v1",
                        "PromotionLayersCommitted.v1",
                        "PromotionVisible.v1",
                        "PromotionDone.v1"
                    ],
                    "{name}: every outbox step exactly once, in order"
                );
                // The worker took the steps before its crash point; the reconciler the rest.
                let worker_steps = match r.crash {
                    Crash::At("worker:after-publishing") => 1,
                    Crash::At("promotion:after-layers-committed") => 2,
                    _ => 3,
                };
                for (i, e) in r.promotion.iter().enumerate() {
                    let expected = if i < worker_steps {
                        ActorRole::Worker
                    } else {
                        ActorRole::Reconciler
                    };
                    assert_eq!(e.metadata.actor.role, expected, "{name}: {}", e.event_type);
                    assert_eq!(e.metadata.epoch, Some(1), "{name}: {}", e.event_type);
                }
                assert_eq!(r.tag_holder, Some(r.build), "{name}: the tag is visible");
            }
            _ => {
                assert!(!published, "{name}");
                let Phase::Error { reason, epoch } = &r.state.phase else {
                    panic!("{name}: expected error, got {:?}", r.state.phase)
                };
                assert_eq!(reason.kind, FailureKind::NodeLost, "{name}");
                // The step the node was on: one past the last it recorded.
                let expected_step = match r.crash {
                    Crash::At("worker:before-first-step") => 1,
                    _ => 2,
                };
                assert_eq!(
                    reason.step,
                    Some(build::FailedStep::Step(expected_step)),
                    "{name}"
                );
                assert_eq!(*epoch, Some(Epoch(1)), "{name}");
                assert!(reason.message.contains("crash-node"), "{}", reason.message);
                assert_eq!(count(&r.events, "AttemptExpired.v1"), 1, "{name}");
                assert_eq!(count(&r.events, "ContextReleased.v1"), 1, "{name}");
                let failed = r
                    .events
                    .iter()
                    .find(|e| e.event_type == "BuildFailed.v1")
                    .unwrap();
                assert_eq!(failed.metadata.actor.role, ActorRole::Reconciler);
                assert_eq!(failed.metadata.actor.node, "reconciler-a");
                assert_eq!(failed.metadata.epoch, Some(1));
                assert!(r.promotion.is_empty(), "{name}");
                assert_eq!(r.tag_holder, None, "{name}: nothing became visible");
            }
        }
    }
}

/// Two workers on one node, one on another data directory and one on the same: starting them
/// sweeps nothing of a live worker's sandbox. Once that worker is killed, its sandbox dies with
/// it, and the next start on its data directory removes what is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_starting_worker_sweeps_only_the_sandboxes_of_dead_workers() {
    let node = common::sandbox::private_node(&["busybox"]);
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    let api = new_api(&store);
    let (_, build) = api.register("sweep").await;
    api.start(build, recipe(vec![step("RUN", &["sleep 60"])]))
        .await;
    let mut first = worker_in(&db.url, "sweep-a", None, node.path());
    wait_for("the build to run", Duration::from_secs(60), || {
        let running = !first.running_sandboxes().is_empty();
        async move { running }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let running = first.running_sandboxes();
    assert_eq!(running.len(), 1, "{running:?}");
    let id = running.into_iter().next().unwrap();
    let alive = |what: &str| {
        let left = leftovers_of(node.path(), &id);
        assert!(
            left.iter().any(|l| l.starts_with("directory "))
                && left.iter().any(|l| l.contains("sleep 60")),
            "{what}: the live worker's sandbox was swept: {left:#?}"
        );
    };
    alive("before");

    let elsewhere = common::data_dir();
    let worker_env = [
        ("STRATA_DATA_DIR", elsewhere.path().to_str().unwrap()),
        ("STRATA_QUEUE_POLL_MS", "200"),
    ];
    let mut other_dir = Proc::spawn(&["worker"], &db.url, "sweep-b", &worker_env);
    other_dir.wait_started().await;
    let mut same_dir = worker_in(&db.url, "sweep-c", None, node.path());
    same_dir.wait_started().await;
    alive("after two more workers started");

    first.signal(libc::SIGKILL);
    first.reap();
    wait_for(
        "the killed worker's sandbox processes to exit",
        Duration::from_secs(10),
        || {
            let procs = leftovers_of(node.path(), &id)
                .iter()
                .any(|l| l.starts_with("process "));
            async move { !procs }
        },
    )
    .await;
    let mut next = worker_in(&db.url, "sweep-a", None, node.path());
    next.wait_started().await;
    let left = leftovers_of(node.path(), &id);
    assert!(left.is_empty(), "{left:#?}");
    drop((other_dir, same_dir, next));
}

/// The staging directories of the layer cache under `data_dir`.
fn layer_staging(data_dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(data_dir.join("layers"))
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with(".staging-"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// A worker stopped in the middle of extracting its first layer (the `layers:staged` stop
/// point: its staging directory made and locked) keeps that directory through a sweep of the
/// layer cache by another process. Once the worker is killed, the directory is still there, and
/// the next worker started on the data directory removes it (and says so).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_starting_worker_sweeps_only_the_layer_extractions_of_dead_workers() {
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    let api = new_api(&store);
    let (_, build) = api.register("layer-sweep").await;
    api.start(build, recipe(vec![step("RUN", &["true"])])).await;
    // A node of the test's own, whose layers no one has extracted yet.
    let node = common::sandbox::private_node(&["busybox"]);
    let data_dir = node.path().to_str().unwrap();
    let lease = LEASE_SECS.to_string();
    let mut first = Proc::spawn(
        &["worker"],
        &db.url,
        "layers-a",
        &[
            ("STRATA_DATA_DIR", data_dir),
            (strata::fault::STOP_AT_ENV, "layers:staged"),
            ("STRATA_LEASE_SECS", lease.as_str()),
            ("STRATA_QUEUE_POLL_MS", "200"),
        ],
    );
    first.wait_stopped(Duration::from_secs(90)).await;
    let staged = layer_staging(node.path());
    assert_eq!(staged.len(), 1, "{staged:?}");
    let staged_dir = node.path().join("layers").join(&staged[0]);

    let cache =
        strata::vmm::LayerCache::open(node.path().join("layers"), Default::default()).unwrap();
    let swept = cache.sweep_leftovers();
    assert_eq!(swept.live, staged, "{swept:?}");
    assert!(swept.staging.is_empty(), "{swept:?}");
    assert!(
        staged_dir.is_dir(),
        "a live worker's staging directory was swept"
    );

    first.signal(libc::SIGKILL);
    first.reap();
    assert!(
        staged_dir.is_dir(),
        "a killed worker leaves its staging directory"
    );
    let mut next = Proc::spawn(
        &["worker"],
        &db.url,
        "layers-b",
        &[
            ("STRATA_DATA_DIR", data_dir),
            ("STRATA_QUEUE_POLL_MS", "200"),
        ],
    );
    next.wait_started().await;
    assert!(!staged_dir.exists(), "{:?}", layer_staging(node.path()));
    let log = next.stderr();
    assert!(
        log.contains("removed layer extractions left by a strata process that died")
            && log.contains(&staged[0]),
        "{log}"
    );
    drop(next);
}

// ---------------------------------------------------------------------------------------------
// Fencing
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_worker_resumed_after_its_attempt_closed_changes_nothing() {
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    let api = new_api(&store);
    let (template, build) = api.register("fenced").await;
    api.start(
        build,
        recipe(vec![
            step("RUN", &["echo one > /tmp/one"]),
            step("RUN", &["sleep 4"]),
            step("RUN", &["echo three > /tmp/three"]),
        ]),
    )
    .await;
    let worker = start_worker(&db.url, "paused-node", None);
    wait_for("step 1 to complete", Duration::from_secs(90), || async {
        count(&build_events(&store, build).await, "StepCompleted.v1") == 1
    })
    .await;
    worker.signal(libc::SIGSTOP);
    let _reconciler = start_reconciler(&db.url, "reconciler-f", &["attempt-expiry"]);
    wait_terminal(&db.pool, build, Duration::from_secs(30)).await;
    let closed_at: i64 = sqlx::query_scalar("SELECT max(position) FROM events")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let template_stream = stream(ids::stream::template(&template));
    let template_version = store.stream_version(&template_stream).await.unwrap();

    worker.signal(libc::SIGCONT);
    // The sleep step ends, renewals fire: the worker now tries its writes and must be refused.
    wait_for(
        "the resumed worker to notice its attempt is closed",
        Duration::from_secs(30),
        || {
            let stderr = worker.stderr();
            async move { stderr.contains("is closed") }
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;

    let later: Vec<(String, String)> =
        sqlx::query_as("SELECT stream_id, type FROM events WHERE position > $1")
            .bind(closed_at)
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert!(
        later.is_empty(),
        "writes after the attempt closed: {later:?}"
    );
    let state = build_state(&store, build).await;
    let Phase::Error { reason, .. } = &state.phase else {
        panic!("expected error, got {:?}", state.phase)
    };
    assert_eq!(reason.kind, FailureKind::NodeLost);
    assert_eq!(
        store.stream_version(&template_stream).await.unwrap(),
        template_version,
        "template tags unchanged"
    );
    let visible = store
        .read_stream_all(&stream(ids::stream::promotion(&build, Epoch(1))))
        .await
        .unwrap();
    assert!(visible.is_empty(), "no promotion of the closed epoch");
    let logs_after: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM build_logs WHERE build_id = $1 AND logged_at > (SELECT recorded_at FROM events WHERE position = $2)",
    )
    .bind(build.as_uuid())
    .bind(closed_at)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(logs_after, 0, "no log lines of the closed attempt");
}

// ---------------------------------------------------------------------------------------------
// Several reconcilers of one kind
// ---------------------------------------------------------------------------------------------

fn test_context(role: ActorRole) -> CommandContext {
    CommandContext::new(Metadata::new(Actor::new(role, "test")))
}

/// A started build held by a node that will never renew: its lease passes at `lease_until`.
async fn acquire_for_ghost(store: &EventStore, build: BuildId, lease_until: DateTime<Utc>) {
    strata::app::attempt::acquire_attempt(
        store,
        &test_context(ActorRole::Worker),
        build,
        None,
        AttemptGrant {
            node: NodeId::parse("ghost").unwrap(),
            lease_expires_at: lease_until,
        },
        Utc::now(),
    )
    .await
    .unwrap();
}

/// How long each lease, deadline and link of the setup below holds, from the moment it is
/// written. Each is taken from the clock just before its own writes (not once for the whole
/// setup of forty builds), so a slow machine cannot let one pass before the writes that need it
/// (a ghost's lease must still hold when its build enters Publishing); a little longer than that
/// takes, so the reconcilers have them all to act on seconds later.
const SETUP_WINDOW: chrono::Duration = chrono::Duration::seconds(4);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_reconcilers_of_each_kind_apply_every_transition_once() {
    const EACH: usize = 8;
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    let api = new_api(&store);
    let soon = || Utc::now() + SETUP_WINDOW;
    let spec = recipe(vec![step("RUN", &["true"])]);

    let mut active = Vec::new();
    let mut publishing = Vec::new();
    let mut waiting = Vec::new();
    let mut queued = Vec::new();
    let mut intents = Vec::new();
    for i in 0..EACH {
        let (_, b) = api.register(&format!("active-{i}")).await;
        api.start(b, spec.clone()).await;
        acquire_for_ghost(&store, b, soon()).await;
        active.push(b);

        let (t, b) = api.register(&format!("publishing-{i}")).await;
        api.start(b, spec.clone()).await;
        acquire_for_ghost(&store, b, soon()).await;
        enter_publishing(&store, b, &t).await;
        publishing.push((t, b));

        let (_, b) = api.register_until(&format!("waiting-{i}"), soon()).await;
        waiting.push(b);

        let (_, b) = api.register(&format!("queued-{i}")).await;
        api.start_until(b, spec.clone(), soon()).await;
        queued.push(b);

        let (_, b) = api.register(&format!("uploading-{i}")).await;
        let hash = FilesHash::parse(&hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
            format!("ctx-{i}").as_bytes(),
        )))
        .unwrap();
        let intent = api.reserve(b, &hash, soon()).await;
        intents.push((b, intent));
    }

    let names = [
        "attempt-expiry",
        "promotion",
        "waiting-deadline",
        "intent-expiry",
    ];
    // Every pass is logged (at trace level), so the test can wait for passes rather than time.
    let passes_logged = [(
        "RUST_LOG",
        "strata=info,strata::reconcilers::schedule=trace",
    )];
    let procs: Vec<Proc> = names
        .iter()
        .flat_map(|n| {
            [
                Proc::reconciler(&db.url, &format!("{n}-1"), &[n], &passes_logged),
                Proc::reconciler(&db.url, &format!("{n}-2"), &[n], &passes_logged),
            ]
        })
        .collect();

    let all: Vec<BuildId> = active
        .iter()
        .chain(publishing.iter().map(|(_, b)| b))
        .chain(&waiting)
        .chain(&queued)
        .copied()
        .collect();
    for b in &all {
        wait_terminal(&db.pool, *b, Duration::from_secs(30)).await;
    }
    wait_for(
        "every intent to expire",
        Duration::from_secs(30),
        || async {
            let mut expired = 0;
            for (b, _) in &intents {
                expired += count(&build_events(&store, *b).await, "IntentExpired.v1");
            }
            expired == intents.len()
        },
    )
    .await;
    // Several more passes of every copy: nothing more may happen. Awaited, not slept: on a busy
    // machine a fixed time may hold no pass at all.
    let seen: Vec<usize> = procs.iter().map(passes_of).collect();
    wait_for(
        "three more passes of every reconciler",
        Duration::from_secs(60),
        || {
            let done = procs
                .iter()
                .zip(&seen)
                .all(|(p, before)| passes_of(p) >= before + 3);
            async move { done }
        },
    )
    .await;

    let mut by_node: BTreeMap<String, usize> = BTreeMap::new();
    let mut tally = |events: &[RecordedEvent]| {
        for e in events
            .iter()
            .filter(|e| e.metadata.actor.role == ActorRole::Reconciler)
        {
            *by_node.entry(e.metadata.actor.node.clone()).or_default() += 1;
        }
    };
    for b in &active {
        let events = build_events(&store, *b).await;
        assert_eq!(count(&events, "AttemptExpired.v1"), 1, "{b}");
        assert_eq!(count(&events, "BuildFailed.v1"), 1, "{b}");
        assert_eq!(count(&events, "ContextReleased.v1"), 1, "{b}");
        assert_eq!(events.last().unwrap().event_type, "ContextReleased.v1");
        tally(&events);
    }
    for (t, b) in &publishing {
        let events = build_events(&store, *b).await;
        assert_eq!(count(&events, "BuildReady.v1"), 1, "{b}");
        assert_eq!(count(&events, "BuildFailed.v1"), 0, "{b}");
        assert_eq!(count(&events, "AttemptExpired.v1"), 0, "{b}");
        tally(&events);
        let promotion = store
            .read_stream_all(&stream(ids::stream::promotion(b, Epoch(1))))
            .await
            .unwrap();
        assert_eq!(
            promotion.len(),
            4,
            "{b}: staged, committed, visible, done once each"
        );
        tally(&promotion);
        let template = store
            .read_stream_all(&stream(ids::stream::template(t)))
            .await
            .unwrap();
        assert_eq!(count(&template, "TagsAssigned.v1"), 1, "{t}");
    }
    for b in waiting.iter().chain(&queued) {
        let events = build_events(&store, *b).await;
        assert_eq!(count(&events, "BuildFailed.v1"), 1, "{b}");
        assert_eq!(count(&events, "ContextReleased.v1"), 1, "{b}");
        tally(&events);
        let Phase::Error { reason, .. } = build_state(&store, *b).await.phase else {
            panic!("{b} not in error")
        };
        let expected = if waiting.contains(b) {
            FailureKind::WaitingExpired
        } else {
            FailureKind::QueueExpired
        };
        assert_eq!(reason.kind, expected);
    }
    for (b, intent) in &intents {
        let events = build_events(&store, *b).await;
        assert_eq!(count(&events, "IntentExpired.v1"), 1, "{b}");
        let state = build_state(&store, *b).await;
        assert!(
            matches!(state.phase, Phase::Waiting { .. }),
            "still waiting"
        );
        assert_eq!(
            state.intents[intent].state,
            build::IntentState::Expired,
            "{intent}"
        );
        tally(&events);
    }
    // Every reconciler event names one of the eight processes.
    let known: Vec<String> = names
        .iter()
        .flat_map(|n| [format!("{n}-1"), format!("{n}-2")])
        .collect();
    assert!(
        by_node.keys().all(|n| known.contains(n)),
        "unknown actors: {by_node:?}"
    );
    assert!(!by_node.is_empty());
}

/// How many passes `reconciler` has logged (with `strata::reconcilers::schedule` at trace level,
/// every pass is a line).
fn passes_of(reconciler: &Proc) -> usize {
    without_colours(&reconciler.stderr())
        .lines()
        .filter(|l| l.contains("strata::reconcilers::schedule: pass"))
        .count()
}

/// `log` without its terminal colour codes (they may sit between a target and its message).
fn without_colours(log: &str) -> String {
    let mut plain = String::with_capacity(log.len());
    let mut in_escape = false;
    for c in log.chars() {
        match c {
            '\x1b' => in_escape = true,
            'm' if in_escape => in_escape = false,
            c if !in_escape => plain.push(c),
            _ => {}
        }
    }
    plain
}

// ---------------------------------------------------------------------------------------------
// Postgres restarted under a running build
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_build_survives_a_postgres_restart_and_loses_nothing() {
    let dir = common::data_dir();
    let port = cluster_port();
    let pg = StopOnDrop(
        strata::embedded_postgres::EmbeddedPostgres::new(dir.path().join("pg"), port).unwrap(),
    );
    pg.0.start().await.unwrap();
    let url = pg.0.url(strata::embedded_postgres::DATABASE_NAME);
    let pool = strata::db::connect(&url, 8).await.unwrap();
    strata::db::migrate(&pool).await.unwrap();
    let store = strata::app::event_store(pool.clone());
    let api = new_api(&store);
    let (_, build) = api.register("restart").await;
    api.start(
        build,
        recipe(vec![
            step("RUN", &["echo one > /tmp/one"]),
            step("RUN", &["sleep 3"]),
            step("RUN", &["echo three > /tmp/three"]),
        ]),
    )
    .await;
    // A lease far longer than the outage (stopping, two seconds down, starting again, each of
    // them slow on a busy machine): the node keeps its attempt across the restart.
    let worker = start_worker_with_lease(&url, "restart-node", None, 30);
    let _reconciler = start_reconciler(&url, "restart-reconciler", &[]);
    wait_for("step 1 to complete", Duration::from_secs(90), || async {
        count(&build_events(&store, build).await, "StepCompleted.v1") == 1
    })
    .await;
    let before = build_events(&store, build).await;

    let stopper =
        strata::embedded_postgres::EmbeddedPostgres::new(dir.path().join("pg"), port).unwrap();
    tokio::task::spawn_blocking(move || stopper.stop().unwrap())
        .await
        .unwrap();
    // The outage itself: two seconds without a server, across the end of step 2.
    tokio::time::sleep(Duration::from_secs(2)).await;
    start_again(&pg.0).await;

    wait_terminal(&pool, build, Duration::from_secs(90)).await;
    let after = build_events(&store, build).await;
    // Nothing committed before the restart is lost or changed, and versions have no gaps.
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(
            (b.event_id, b.version, &b.data),
            (a.event_id, a.version, &a.data)
        );
    }
    assert!(after.len() > before.len());
    for (i, e) in after.iter().enumerate() {
        assert_eq!(e.version, i as u64 + 1);
    }
    let state = build_state(&store, build).await;
    assert!(
        matches!(state.phase, Phase::Ready { epoch: Epoch(1) }),
        "the build finishes in the attempt that survived the outage: {:?}",
        state.phase
    );
    assert_eq!(count(&after, "StepCompleted.v1"), 3);
    // The log lines written before the outage are still there, in order, with no gaps.
    let seqs: Vec<i64> =
        sqlx::query_scalar("SELECT seq FROM build_logs WHERE build_id = $1 ORDER BY seq")
            .bind(build.as_uuid())
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(!seqs.is_empty());
    assert!(
        seqs.iter().enumerate().all(|(i, s)| *s == i as i64),
        "{seqs:?}"
    );
    let row = phase_row(&pool, build).await.unwrap();
    assert!(row == "ready" || row == "error");
    pool.close().await;
    drop(worker);
    drop(_reconciler);
    tokio::task::spawn_blocking(move || drop(pg)).await.unwrap();
}

/// A free port for the test's own cluster, below the kernel's ephemeral range. A port inside it
/// can be taken, while the server is down, as the local end of any outgoing connection on the
/// machine (every test's database connections among them), and the restart then fails with
/// "address already in use".
fn cluster_port() -> u16 {
    let ephemeral_from = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let from = 20000u16;
    let first = from + (std::process::id() % u32::from(ephemeral_from - from)) as u16;
    (first..ephemeral_from)
        .chain(from..first)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free port below the ephemeral range")
}

/// Starts the stopped cluster again. `pg_ctl start` can fail on a busy machine (its port or
/// shared memory not yet free, the start outliving its wait): tried again, with a growing pause,
/// up to five times, and the server log shown if it never comes up.
async fn start_again(pg: &strata::embedded_postgres::EmbeddedPostgres) {
    let mut failures = Vec::new();
    for attempt in 1..=5u32 {
        match pg.start().await {
            Ok(()) => return,
            Err(e) => {
                eprintln!("starting Postgres again, attempt {attempt}: {e}");
                failures.push(e.to_string());
                tokio::time::sleep(Duration::from_millis(500) * attempt).await;
            }
        }
    }
    let log = std::fs::read_to_string(pg.data_dir().join("server.log")).unwrap_or_default();
    panic!("Postgres did not start again: {failures:#?}\n{log}");
}

/// Stops the dedicated cluster however the test ends.
struct StopOnDrop(strata::embedded_postgres::EmbeddedPostgres);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        let _ = self.0.stop();
    }
}

// ---------------------------------------------------------------------------------------------
// The command line
// ---------------------------------------------------------------------------------------------

#[test]
fn reconcile_validates_names_and_schedules_and_lists_the_reconcilers() {
    let run = |args: &[&str]| {
        let out = Command::new(common::strata_bin())
            .args(args)
            .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let names = [
        "attempt-expiry",
        "promotion",
        "waiting-deadline",
        "intent-expiry",
    ];
    let (ok, _, err) = run(&["reconcile", "--only", "gc-everything"]);
    assert!(!ok);
    for name in names {
        assert!(err.contains(name), "{err}");
    }
    let (ok, help, _) = run(&["reconcile", "--help"]);
    assert!(ok);
    for name in names {
        assert!(help.contains(name), "{help}");
    }
    // The schedule is checked before any connection is tried.
    let (ok, _, err) = run(&["reconcile", "--schedule", "every second"]);
    assert!(!ok);
    assert!(
        err.contains("invalid schedule") && err.contains("six fields"),
        "{err}"
    );
}

/// Found in review: a build in Publishing whose node died, with a layer of its result deleted
/// by a garbage-collection pass (its object `Deleted`, its bytes gone from the blob store).
/// Before, `CommitLayers` was refused, the refusal became a store error, and the promotion
/// reconciler retried it every pass forever: the build never ended. That absence is
/// authoritative, so the pass ends the build in `error` (`PromotionFailed`) with a reason that
/// names the layer, and closes the outbox, in one append; the next pass finds nothing to do.
#[tokio::test]
async fn a_publishing_build_whose_layer_was_deleted_ends_in_error_naming_the_layer() {
    use strata::domain::object::Deletion;

    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    let api = Api {
        store: store.clone(),
        team: TeamId::parse("team-layer-gone").unwrap(),
    };
    let (template, build) = api.register("layer-gone").await;
    api.start(
        build,
        json!({"fromImage": "busybox", "force": false, "steps": [{"type": "RUN", "args": ["true"], "force": false}]}),
    )
    .await;
    let now = strata::streams::database_now(store.pool()).await.unwrap();
    strata::app::attempt::acquire_attempt(
        &store,
        &common::build_api::api_context(),
        build,
        None,
        AttemptGrant {
            node: NodeId::parse("died-publishing").unwrap(),
            lease_expires_at: now + chrono::Duration::minutes(5),
        },
        now,
    )
    .await
    .unwrap();

    // The layer: stored once, then deleted by a pass (no bytes under its digest any more).
    let layer = ids::Digest::of(format!("layer-gone-{}", Uuid::new_v4()).as_bytes());
    let ctx = common::build_api::api_context;
    strata::app::object::reference(&store, &ctx(), &[layer], "test: the build's layer")
        .await
        .unwrap();
    strata::app::object::mark_deleting(
        &store,
        &ctx(),
        &strata::app::object::Mark {
            digest: layer,
            deletion: Deletion {
                pass: "pass-1".into(),
                tier: "test".into(),
                reason: "test: taken by a pass".into(),
                last_referenced_by: None,
            },
            unused_since: now + chrono::Duration::hours(1),
            retire: vec![],
        },
    )
    .await
    .unwrap();
    strata::app::object::confirm_deleted(&store, &ctx(), &layer, "pass-1")
        .await
        .unwrap();
    common::publishing::enter_publishing_with_layers(&store, build, &template, vec![layer]).await;

    let env = strata::reconcilers::ReconcileEnv {
        store: store.clone(),
        node: "layer-gone-reconciler".into(),
        blobs: common::sandbox::backend().blobs(),
        gc: Default::default(),
        catalog: None,
    };
    let driven = strata::reconcilers::promotion::finish(&env, build).await;
    assert!(
        matches!(driven, Ok(true)),
        "the pass ends the build: {driven:?}"
    );
    let state = load::<Build>(&store, &stream(ids::stream::build(&build)))
        .await
        .unwrap()
        .state;
    match &state.phase {
        Phase::Error { reason, .. } => {
            assert_eq!(reason.kind, FailureKind::PromotionFailed);
            assert!(
                reason.message.contains(&layer.to_string()),
                "the reason names the layer: {}",
                reason.message
            );
        }
        other => panic!("expected error, got {other:?}"),
    }
    assert!(
        !strata::reconcilers::promotion::finish(&env, build)
            .await
            .unwrap(),
        "nothing is left to do"
    );
}
