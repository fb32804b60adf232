//! The build-node fixture shared by the worker tests: a fresh database and store, the API's
//! appends (`build_api`), the node's blob store, an in-process worker, and helpers that make
//! real tar archives and step JSON.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use strata::domain::build::{self, Phase};
use strata::domain::cache_entry;
use strata::domain::cache_key::CacheKey;
use strata::domain::ids::{self, BuildId, FilesHash, TeamId};
use strata::events::command::load;
use strata::events::EventStore;
use strata::streams::{Build, CacheEntry};
use strata::vmm::{BootSpec, Network};
use strata::worker::{template_lookup, Worker, WorkerSettings};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::build_api::{stream, Api};
use super::sandbox::{backend, boot, node_dir};
use super::TestDb;

// ---------------------------------------------------------------------------------------------
// Fixture: database, store, worker
// ---------------------------------------------------------------------------------------------

pub struct Fixture {
    pub db: TestDb,
    pub store: EventStore,
    pub api: Api,
    pub blobs: Arc<dyn strata::vmm::BlobStore>,
    pub shutdown: CancellationToken,
    pub worker: Option<tokio::task::JoinHandle<()>>,
}

pub fn settings() -> WorkerSettings {
    let mut s = WorkerSettings::new("test-node", node_dir(), super::strata_bin());
    s.lease = Duration::from_secs(6);
    s.poll_interval = Duration::from_millis(200);
    s.ready_timeout = Duration::from_secs(20);
    // Tests reach nothing beyond loopback: Docker Hub is "mirrored" to a closed local port, so
    // an image missing from the catalog fails fast instead of going to the internet.
    s.registry
        .mirrors
        .insert("docker.io".into(), "http://127.0.0.1:9".into());
    s
}

impl Fixture {
    pub async fn new(settings: WorkerSettings) -> Fixture {
        Self::with_worker(Some(settings)).await
    }

    /// With an in-process worker when `settings` is given, else only the database and store.
    pub async fn with_worker(settings: Option<WorkerSettings>) -> Fixture {
        Self::with_blobs(settings, backend().blobs()).await
    }

    /// A worker on a node directory of its own (`dir`, e.g. [`super::sandbox::private_node`]),
    /// its uploads in that node's blob store: for tests that delete blobs.
    pub async fn on_node(dir: &std::path::Path) -> Fixture {
        let mut s = settings();
        s.data_dir = dir.to_path_buf();
        let blobs = Arc::new(strata::vmm::LocalBlobStore::open(dir.join("blobs")).unwrap());
        Self::with_blobs(Some(s), blobs).await
    }

    async fn with_blobs(
        settings: Option<WorkerSettings>,
        blobs: Arc<dyn strata::vmm::BlobStore>,
    ) -> Fixture {
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_env_filter("strata=info")
            .try_init();
        let db = super::test_db().await;
        let store = strata::app::event_store(db.pool.clone());
        let team = TeamId::parse(&format!(
            "team{}",
            &Uuid::new_v4().simple().to_string()[..8]
        ))
        .unwrap();
        let shutdown = CancellationToken::new();
        let handle = settings.map(|settings| {
            let worker = Worker::new(store.clone(), settings).unwrap();
            let token = shutdown.clone();
            tokio::spawn(async move { worker.run_until(token).await.unwrap() })
        });
        Fixture {
            api: Api {
                store: store.clone(),
                team,
            },
            db,
            store,
            blobs,
            shutdown,
            worker: handle,
        }
    }

    pub async fn stop(&mut self) {
        self.shutdown.cancel();
        if let Some(w) = self.worker.take() {
            w.await.unwrap();
        }
    }

    /// Every cache entry of the fixture's team, by key.
    pub async fn entries(&self) -> BTreeMap<CacheKey, cache_entry::State> {
        let prefix = format!("cachekey-{}:", self.api.team);
        let streams: Vec<String> =
            sqlx::query_scalar("SELECT stream_id FROM streams WHERE stream_id LIKE $1 || '%'")
                .bind(&prefix)
                .fetch_all(&self.db.pool)
                .await
                .unwrap();
        let mut out = BTreeMap::new();
        for s in streams {
            let key = CacheKey(ids::Digest::from_hex(&s[prefix.len()..]).unwrap());
            let state = load::<CacheEntry>(&self.store, &stream(s))
                .await
                .unwrap()
                .state;
            out.insert(key, state);
        }
        out
    }

    /// The entries once `settled` holds of them. The final result's entry is written after the
    /// build is Ready, so a test that reads it right after the build may be ahead of it.
    pub async fn entries_when(
        &self,
        settled: impl Fn(&BTreeMap<CacheKey, cache_entry::State>) -> bool,
    ) -> BTreeMap<CacheKey, cache_entry::State> {
        let waited = std::time::Instant::now();
        loop {
            let entries = self.entries().await;
            if settled(&entries) || waited.elapsed() > std::time::Duration::from_secs(30) {
                return entries;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// Waits (bounded) for the build to reach ready or error; returns its state.
    /// Registers `name`, uploads `files` and starts `spec`.
    pub async fn start_build(
        &self,
        name: &str,
        files: &[(&FilesHash, Vec<u8>)],
        spec: serde_json::Value,
    ) -> BuildId {
        let (_, build) = self.api.register(name).await;
        for (hash, bytes) in files {
            self.api.upload(&self.blobs, build, hash, bytes).await;
        }
        self.api.start(build, spec).await;
        build
    }

    /// [`Self::build`] with the service's cache mode setting `setting`.
    pub async fn build_in_mode(
        &self,
        name: &str,
        files: &[(&FilesHash, Vec<u8>)],
        spec: serde_json::Value,
        setting: &str,
    ) -> (BuildId, build::State) {
        let (_, build) = self.api.register(name).await;
        for (hash, bytes) in files {
            self.api.upload(&self.blobs, build, hash, bytes).await;
        }
        self.api.start_in_mode(build, spec, setting).await;
        (build, self.wait_terminal(build).await)
    }

    /// Registers `name`, uploads `files`, starts `spec` and waits for a terminal state.
    pub async fn build(
        &self,
        name: &str,
        files: &[(&FilesHash, Vec<u8>)],
        spec: serde_json::Value,
    ) -> (BuildId, build::State) {
        let build = self.start_build(name, files, spec).await;
        (build, self.wait_terminal(build).await)
    }

    pub async fn wait_terminal(&self, build: BuildId) -> build::State {
        for _ in 0..1800 {
            let phase: Option<String> =
                sqlx::query_scalar("SELECT phase FROM builds WHERE build_id = $1")
                    .bind(build.as_uuid())
                    .fetch_optional(&self.db.pool)
                    .await
                    .unwrap();
            if matches!(phase.as_deref(), Some("ready" | "error")) {
                return self.state(build).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "build {build} did not finish: {:?}",
            self.state(build).await.phase
        );
    }

    pub async fn state(&self, build: BuildId) -> build::State {
        load::<Build>(&self.store, &stream(ids::stream::build(&build)))
            .await
            .unwrap()
            .state
    }

    pub async fn logs(&self, build: BuildId) -> Vec<(i64, String, String, Option<String>)> {
        sqlx::query_as(
            "SELECT seq, level, message, step FROM build_logs WHERE build_id = $1 ORDER BY seq",
        )
        .bind(build.as_uuid())
        .fetch_all(&self.db.pool)
        .await
        .unwrap()
    }

    /// The template's result, as export sees it.
    pub async fn result(&self, name: &str) -> template_lookup::TemplateSnapshot {
        template_lookup::resolve(
            &self.store,
            &self.api.team,
            name,
            template_lookup::Checkpoint::Result,
        )
        .await
        .unwrap()
    }
}

pub fn files_hash(seed: &str) -> FilesHash {
    FilesHash::parse(&hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
        seed.as_bytes(),
    )))
    .unwrap()
}

pub fn assert_ready(state: &build::State) {
    assert!(
        matches!(state.phase, Phase::Ready { .. }),
        "expected ready, got {:?}",
        state.phase
    );
}

// ---------------------------------------------------------------------------------------------
// Archives, as the SDK uploads them
// ---------------------------------------------------------------------------------------------

pub fn append_file(b: &mut tar::Builder<Vec<u8>>, path: &str, mode: u32, data: &[u8]) {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(data.len() as u64);
    h.set_mode(mode);
    h.set_mtime(1_700_000_000);
    b.append_data(&mut h, path, data).unwrap();
}

pub fn append_dir(b: &mut tar::Builder<Vec<u8>>, path: &str) {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(tar::EntryType::Directory);
    h.set_size(0);
    h.set_mode(0o755);
    b.append_data(&mut h, path, &[][..]).unwrap();
}

/// The captured first build's `app` tree: nested dirs, an executable, a relative symlink.
pub fn app_tar() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    append_dir(&mut b, "app");
    append_dir(&mut b, "app/bin");
    append_file(
        &mut b,
        "app/bin/run.sh",
        0o755,
        b"#!/bin/sh\necho running\n",
    );
    append_file(&mut b, "app/config.txt", 0o644, b"config-line\n");
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    h.set_mode(0o777);
    b.append_link(&mut h, "app/link.txt", "config.txt").unwrap();
    append_dir(&mut b, "app/nested");
    append_dir(&mut b, "app/nested/deep");
    append_file(&mut b, "app/nested/deep/data.txt", 0o644, b"deep-data\n");
    b.into_inner().unwrap()
}

pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

pub fn single_file_tar(name: &str, data: &[u8]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    append_file(&mut b, name, 0o644, data);
    b.into_inner().unwrap()
}

pub fn step(kind: &str, args: &[&str]) -> serde_json::Value {
    json!({"type": kind, "args": args, "force": false})
}

pub fn copy(src: &str, dest: &str, owner: &str, mode: &str, hash: &FilesHash) -> serde_json::Value {
    json!({"type": "COPY", "args": [src, dest, owner, mode], "filesHash": hash.as_str(), "force": false})
}

pub async fn boot_on(layers: &[ids::Digest]) -> Box<dyn strata::vmm::Sandbox> {
    boot_with(&backend(), layers).await
}

/// [`boot_on`] on the node directory `dir` (see [`super::sandbox::private_node`]).
pub async fn boot_in(
    dir: &std::path::Path,
    layers: &[ids::Digest],
) -> Box<dyn strata::vmm::Sandbox> {
    let be = strata::vmm::NamespaceBackend::new(strata::vmm::NamespaceConfig {
        data_dir: dir.to_path_buf(),
        agent_binary: super::strata_bin(),
        depth: Default::default(),
        ids: Default::default(),
        network: Default::default(),
        disk: Default::default(),
    })
    .expect("the namespace backend (these tests run as root)");
    boot_with(&be, layers).await
}

async fn boot_with(
    be: &strata::vmm::NamespaceBackend,
    layers: &[ids::Digest],
) -> Box<dyn strata::vmm::Sandbox> {
    let mut spec = BootSpec::new(layers.to_vec());
    spec.limits.network = Network::None;
    boot(be, spec).await
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------
