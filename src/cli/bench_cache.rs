//! `strata bench cache`: what the execution cache saves, per cache mode (ADR 0030). One run, one
//! throwaway database, an in-process build node on this machine's data directory, and an
//! 11-step recipe: a COPY of a generated context (`--files` files of 16 KiB, uploaded as the
//! SDK does: only when the link says the archive is not present), then RUNs, the fifth of which
//! sleeps. For each mode of `--modes` (a fresh nonce each, so no mode reuses another's entries):
//! a cold build, the unchanged rebuild, and rebuilds with only the first, the middle or the last
//! mutating step changed from the cold build's. Each is timed from registration to Ready, as a
//! client waits for it. Per build: steps executed and cached, bytes uploaded, the node's CPU
//! time (this process and its exited children: step execution and checkpoint capture), bytes
//! the build added to the blob store, the store's size after it, and the layer depth of the
//! result. The ratios to the mode's cold build, and each mode's cold build to `off`'s (the
//! price of caching), are printed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use strata::app::registration::{register_build, RegisterBuild};
use strata::config::StorageArgs;
use strata::domain::build::StepOutcome;
use strata::domain::build_spec::{TemplateBuildStartV2, TemplateName};
use strata::domain::cache_mode::{self, CacheMode};
use strata::domain::ids::{BuildId, TeamId};
use strata::events::command::{load, CommandContext};
use strata::events::{Actor, ActorRole, EventStore, Metadata};
use strata::streams::{build_stream, snapshot_stream, Build, Snapshot};
use strata::vmm::BlobStore;
use strata::worker::{Worker, WorkerSettings};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

#[derive(Debug, Args)]
pub struct BenchCacheArgs {
    /// Seconds the RUN in the middle of the recipe sleeps.
    #[arg(long, default_value_t = 3)]
    sleep_secs: u64,
    /// Base image of the recipe (from this node's image catalog).
    #[arg(long, default_value = "busybox")]
    image: String,
    /// The cache modes to compare, in order: `off`, `final`, `steps`.
    #[arg(long, value_delimiter = ',', default_value = "steps")]
    modes: Vec<String>,
    /// Files of 16 KiB in the COPY's generated context.
    #[arg(long, default_value_t = 256)]
    files: usize,
    #[command(flatten)]
    storage: StorageArgs,
}

/// One timed build.
struct Timed {
    label: &'static str,
    seconds: f64,
    executed: usize,
    cached: usize,
    uploaded: u64,
    cpu_seconds: f64,
    written: u64,
    stored: u64,
    depth: usize,
}

/// The COPY's context: its archive and the SDK's files hash of it.
struct CopyContext {
    archive: Vec<u8>,
    hash: strata::domain::ids::FilesHash,
}

/// `files` files of 16 KiB of pseudo-random bytes (incompressible, as built code mostly is),
/// and one naming `nonce`, so each mode's cold build uploads its own archive.
fn generate_context(files: usize, nonce: Uuid) -> anyhow::Result<CopyContext> {
    let dir = tempfile::tempdir()?;
    let app = dir.path().join("app");
    std::fs::create_dir_all(&app)?;
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..files {
        let bytes: Vec<u8> = (0..16 << 10)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        std::fs::write(app.join(format!("f{i:04}.bin")), bytes)?;
    }
    std::fs::write(app.join("nonce"), nonce.to_string())?;
    let ignore = strata::build_context::load_ignore(dir.path(), &[])?;
    let hash = strata::build_context::files_hash(dir.path(), "app", "/srv/app", &ignore)?;
    let selected = strata::build_context::select_files(dir.path(), "app", &ignore)?;
    let mut archive = Vec::new();
    strata::build_context::write_archive(dir.path(), &selected, &mut archive)?;
    Ok(CopyContext {
        archive,
        hash: strata::domain::ids::FilesHash::parse(&hash)?,
    })
}

/// CPU seconds of this process and its reaped children so far.
fn cpu_seconds() -> f64 {
    let of = |who| {
        // SAFETY: getrusage writes into the zeroed struct it is given and reads nothing else.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(who, &mut usage) };
        let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
        t(usage.ru_utime) + t(usage.ru_stime)
    };
    of(libc::RUSAGE_SELF) + of(libc::RUSAGE_CHILDREN)
}

/// Bytes in the blob store.
async fn store_bytes(blobs: &Arc<dyn BlobStore>) -> anyhow::Result<u64> {
    let blobs = blobs.clone();
    let listed = tokio::task::spawn_blocking(move || blobs.list()).await??;
    Ok(listed.iter().map(|b| b.size).sum())
}

pub async fn run(args: BenchCacheArgs) -> anyhow::Result<()> {
    let modes = args
        .modes
        .iter()
        .map(|m| m.parse::<CacheMode>().map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let storage = args.storage.clone();
    super::bench::with_bench_database(&storage, |options, where_| async move {
        let pool = super::bench::bench_pool(options, 4).await?;
        let store = strata::app::event_store(pool.clone());
        let mut settings = WorkerSettings::new(
            "bench-cache",
            &args.storage.data_dir,
            std::env::current_exe().context("locating the strata binary")?,
        );
        settings.poll_interval = Duration::from_millis(50);
        let blobs: Arc<dyn BlobStore> = Arc::new(
            strata::vmm::LocalBlobStore::open(args.storage.data_dir.join("blobs"))
                .context("opening the node's blob store")?,
        );
        let worker = Worker::new(store.clone(), settings).context("starting the build node")?;
        let shutdown = CancellationToken::new();
        let node = tokio::spawn(worker.run_until(shutdown.clone()));
        let team = TeamId::parse(&format!(
            "bench{}",
            &Uuid::new_v4().simple().to_string()[..8]
        ))?;
        let mut archive_bytes = 0;
        let result = async {
            let mut by_mode = Vec::new();
            for &mode in &modes {
                // A fresh nonce per mode: no checkpoint of another mode or run is reused.
                let nonce = Uuid::new_v4();
                let context =
                    generate_context(args.files, nonce).context("generating the COPY's context")?;
                archive_bytes = context.archive.len() as u64;
                let mut runs = Vec::new();
                for (label, changed) in [
                    ("cold", None),
                    ("unchanged rebuild", None),
                    ("first step changed", Some(Changed::First)),
                    ("middle step changed", Some(Changed::Middle)),
                    ("last step changed", Some(Changed::Last)),
                ] {
                    let spec = recipe(&args, nonce, changed, &context.hash)?;
                    let bench = Bench {
                        store: &store,
                        blobs: &blobs,
                        team: &team,
                        context: &context,
                    };
                    runs.push(bench.timed(label, spec, mode).await?);
                }
                by_mode.push((mode, runs));
            }
            Ok::<_, anyhow::Error>(by_mode)
        }
        .await;
        shutdown.cancel();
        node.await.context("build node task")??;
        let by_mode = result?;
        println!(
            "strata bench cache ({where_}; 11 steps: COPY of {} files ({} archive), RUN sleep {} s at step 6, image {})",
            args.files,
            strata::metrics::storage::human_bytes(archive_bytes),
            args.sleep_secs,
            args.image
        );
        let off_cold = by_mode
            .iter()
            .find(|(m, _)| *m == CacheMode::Off)
            .map(|(_, runs)| runs[0].seconds);
        for (mode, runs) in &by_mode {
            println!("\nmode {mode}");
            println!(
                "{:<20} {:>8} {:>6} {:>6} {:>10} {:>8} {:>10} {:>10} {:>5} {:>10}",
                "build",
                "seconds",
                "run",
                "cached",
                "uploaded",
                "cpu s",
                "written",
                "store",
                "depth",
                "ratio/cold"
            );
            let cold = runs[0].seconds;
            let b = |n: u64| strata::metrics::storage::human_bytes(n);
            for r in runs {
                println!(
                    "{:<20} {:>8.3} {:>6} {:>6} {:>10} {:>8.2} {:>10} {:>10} {:>5} {:>10.3}",
                    r.label,
                    r.seconds,
                    r.executed,
                    r.cached,
                    b(r.uploaded),
                    r.cpu_seconds,
                    b(r.written),
                    b(r.stored),
                    r.depth,
                    r.seconds / cold
                );
            }
            if let Some(off) = off_cold {
                println!("cold build against mode off's: {:.3}", cold / off);
            }
        }
        Ok(())
    })
    .await
}

/// Which mutating step of the recipe a rebuild changes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Changed {
    First,
    Middle,
    Last,
}

fn recipe(
    args: &BenchCacheArgs,
    nonce: Uuid,
    changed: Option<Changed>,
    files: &strata::domain::ids::FilesHash,
) -> anyhow::Result<TemplateBuildStartV2> {
    let step =
        |kind: &str, a: &[&str]| serde_json::json!({"type": kind, "args": a, "force": false});
    let variant = |which: Changed| if changed == Some(which) { "v2" } else { "v1" };
    let first = format!("echo one-{} > one", variant(Changed::First));
    let sleep = format!("sleep {}; echo {nonce} > slow", args.sleep_secs);
    let middle = format!("echo six-{} > six", variant(Changed::Middle));
    let last = format!("echo last-{} > last", variant(Changed::Last));
    let mut copy = step("COPY", &["app", "/srv/app", "", ""]);
    copy["filesHash"] = files.as_str().into();
    let spec = serde_json::json!({
        "fromImage": args.image,
        "force": false,
        "steps": [
            step("ENV", &["A", "1"]),
            step("WORKDIR", &["/tmp/bench"]),
            copy,
            step("RUN", &[&first]),
            step("RUN", &["echo two > two"]),
            step("RUN", &[&sleep]),
            step("RUN", &[&middle]),
            step("ENV", &["B", "2"]),
            step("RUN", &["cat one two > both"]),
            step("WORKDIR", &["sub"]),
            step("RUN", &[&last]),
        ],
    });
    Ok(serde_json::from_value(spec)?)
}

fn context() -> CommandContext {
    CommandContext::new(Metadata::new(Actor::new(ActorRole::Api, "bench-cache")))
}

/// What one timed build runs against.
struct Bench<'a> {
    store: &'a EventStore,
    blobs: &'a Arc<dyn BlobStore>,
    team: &'a TeamId,
    context: &'a CopyContext,
}

impl Bench<'_> {
    /// Registers, uploads the COPY's archive when the link says it is not present, starts and
    /// waits for one build, as the API would append it.
    async fn timed(
        &self,
        label: &'static str,
        spec: TemplateBuildStartV2,
        mode: CacheMode,
    ) -> anyhow::Result<Timed> {
        let store = self.store;
        let (stored_before, cpu_before) = (store_bytes(self.blobs).await?, cpu_seconds());
        let began = Instant::now();
        let build = register(store, self.team, label).await?;
        let uploaded = self.upload(build).await?;
        let now = strata::clock::local_now();
        let queue_deadline = now + chrono::Duration::minutes(10);
        let resolved = cache_mode::resolve(&cache_mode::ModeSettings {
            service: Some(mode.as_str().to_owned()),
            ..Default::default()
        });
        strata::app::build::start_build_keyed(
            store,
            &context(),
            &build,
            spec,
            None,
            strata::app::build::Resolved {
                cache_mode: Some(resolved),
                ..Default::default()
            },
            now,
            queue_deadline,
        )
        .await?;
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let phase = strata::projections::builds::phase_of(store.pool(), &build).await?;
            match phase.as_deref() {
                Some("ready") => break,
                Some("error") => {
                    let state = load::<Build>(store, &build_stream(&build)).await?.state;
                    bail!("the {label} build failed: {:?}", state.phase);
                }
                _ if Instant::now() > deadline => {
                    bail!("the {label} build did not finish in 600 s")
                }
                _ => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
        let seconds = began.elapsed().as_secs_f64();
        let cpu = cpu_seconds() - cpu_before;
        let stored = store_bytes(self.blobs).await?;
        let state = load::<Build>(store, &build_stream(&build)).await?.state;
        let cached = state
            .progress
            .values()
            .filter(|o| matches!(o, StepOutcome::Cached { .. }))
            .count();
        let result = state
            .result
            .as_ref()
            .context("a ready build has a result")?;
        let depth = load::<Snapshot>(store, &snapshot_stream(&result.candidate))
            .await?
            .state
            .record
            .map_or(0, |r| r.layers.len());
        Ok(Timed {
            label,
            seconds,
            executed: state.progress.len() - cached,
            cached,
            uploaded,
            cpu_seconds: cpu,
            written: stored.saturating_sub(stored_before),
            stored,
            depth,
        })
    }

    /// The SDK's link request and, when the archive is not present, its upload: the bytes
    /// uploaded.
    async fn upload(&self, build: BuildId) -> anyhow::Result<u64> {
        use strata::domain::build::upload::{CompleteUpload, ReserveUpload};
        use strata::domain::ids::IntentId;
        let now = strata::clock::local_now();
        let intent = IntentId::from_uuid(Uuid::new_v4());
        let link = strata::app::upload::link_upload(
            self.store,
            &context(),
            self.blobs,
            &ReserveUpload {
                build,
                intent,
                hash: self.context.hash.clone(),
                now,
                expires_at: now + chrono::Duration::hours(1),
            },
        )
        .await?;
        if link.present {
            return Ok(0);
        }
        let bytes = &self.context.archive;
        strata::app::object::reference(
            self.store,
            &context(),
            &[strata::domain::ids::Digest::of(bytes)],
            "bench upload",
        )
        .await?;
        let blobs = self.blobs.clone();
        let owned = bytes.clone();
        let (blob_digest, size) =
            tokio::task::spawn_blocking(move || blobs.put_bytes(&owned)).await??;
        strata::app::upload::complete_upload(
            self.store,
            &context(),
            &CompleteUpload {
                build,
                intent,
                hash: self.context.hash.clone(),
                generation: link.generation,
                blob_digest,
                size,
                now: strata::clock::local_now(),
                claim: None,
            },
        )
        .await?;
        Ok(size)
    }
}

/// `POST /v3/templates`: claims a fresh name and registers a build.
async fn register(store: &EventStore, team: &TeamId, label: &str) -> anyhow::Result<BuildId> {
    let now = strata::clock::local_now();
    let name = TemplateName::parse(&format!(
        "bench-{}-{}",
        label.replace(' ', "-"),
        &Uuid::new_v4().simple().to_string()[..6]
    ))?;
    let cmd = RegisterBuild::new(team.clone(), name, now, chrono::Duration::minutes(10));
    let (_, build) = register_build(store, &context(), &cmd).await?;
    Ok(build)
}
