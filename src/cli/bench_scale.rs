//! `strata bench scale`: builds per second through 1, 2, 3… build nodes that share one Postgres
//! and one object store and nothing else. Each node has its own data directory (its own image
//! catalog and layer cache) and reads every blob from the shared store; the nodes run in this
//! process (their sandboxes are processes of their own). For each node count, `--builds`
//! one-step builds of distinct content are started at once and timed until the last is Ready;
//! the ratio is to the single-node rate of the same run.
//!
//! The store is the bucket `STRATA_BLOB_URL` names, else a local S3-protocol server (moto)
//! started for the run. The base image (`--image`, default busybox) is copied from this node's
//! catalog (`STRATA_DATA_DIR`, only read) into the store once.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use strata::app::registration::{register_build, RegisterBuild};
use strata::config::StorageArgs;
use strata::domain::build_spec::{TemplateBuildStartV2, TemplateName};
use strata::domain::ids::{BuildId, TeamId};
use strata::events::command::CommandContext;
use strata::events::{Actor, ActorRole, EventStore, Metadata};
use strata::vmm::image::{ImageCatalog, ImageManifest};
use strata::vmm::BlobStore;
use strata::worker::{Worker, WorkerSettings};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

#[derive(Debug, Args)]
pub struct BenchScaleArgs {
    /// Node counts to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    nodes: Vec<usize>,
    /// Builds started at once for each node count.
    #[arg(long, default_value_t = 12)]
    builds: usize,
    /// Base image of the builds (from this node's image catalog).
    #[arg(long, default_value = "busybox")]
    image: String,
    #[command(flatten)]
    storage: StorageArgs,
}

pub async fn run(args: BenchScaleArgs) -> anyhow::Result<()> {
    if args.nodes.is_empty() || args.nodes.contains(&0) || args.builds == 0 {
        bail!("--nodes needs counts of at least 1 and --builds at least 1");
    }
    let storage = args.storage.clone();
    let (blobs, _server) = tokio::task::block_in_place(|| s3_store(&storage))?;
    let manifest = {
        let (from, image, blobs) = (storage.data_dir.clone(), args.image.clone(), blobs.clone());
        tokio::task::spawn_blocking(move || seed_store(&from, &image, blobs.as_ref())).await??
    };
    let work = tempfile::Builder::new()
        .prefix("strata-bench-scale-")
        .tempdir()
        .context("creating the bench directory")?;
    super::bench::with_bench_database(&storage, |options, where_| async move {
        let pool = super::bench::bench_pool(options, 16).await?;
        let store = strata::app::event_store(pool.clone());
        let mut rows = Vec::new();
        for &nodes in &args.nodes {
            let before = cpu_ticks();
            let seconds =
                measure(&store, &blobs, &manifest, work.path(), nodes, args.builds).await?;
            let busy = match (before, cpu_ticks()) {
                (Some((b0, t0)), Some((b1, t1))) if t1 > t0 => {
                    100.0 * (b1 - b0) as f64 / (t1 - t0) as f64
                }
                _ => f64::NAN,
            };
            rows.push((nodes, seconds, busy));
        }
        pool.close().await;
        println!(
            "strata bench scale: {} one-step builds of {} at once per node count; Postgres {where_}; blobs in {}",
            args.builds,
            args.image,
            blobs.describe()
        );
        println!(
            "{:>6} {:>10} {:>12} {:>14} {:>16}",
            "nodes", "seconds", "builds/s", "vs 1st row", "machine CPU busy"
        );
        let first = args.builds as f64 / rows[0].1;
        for (nodes, seconds, busy) in rows {
            let rate = args.builds as f64 / seconds;
            println!(
                "{nodes:>6} {seconds:>10.2} {rate:>12.2} {:>14.2} {busy:>15.0}%",
                rate / first
            );
        }
        println!(
            "machine CPU busy near 100% means the curve bends at CPU (every node, Postgres and the \
             object store share this machine's {} cores)",
            std::thread::available_parallelism().map_or(1, |n| n.get())
        );
        Ok(())
    })
    .await
}

/// The S3 store of the run: `STRATA_BLOB_URL`'s bucket, else a local server's.
fn s3_store(
    storage: &StorageArgs,
) -> anyhow::Result<(Arc<dyn BlobStore>, Option<strata::vmm::local_s3::LocalS3>)> {
    if let Some(url) = storage.blob_url.as_deref() {
        let store = strata::vmm::open_blob_store(Some(url), &storage.data_dir)?;
        return Ok((store, None));
    }
    let server = strata::vmm::local_s3::LocalS3::start()
        .context("starting a local S3 server for the bench")?;
    let store = server.blob_store("bench", "strata")?;
    Ok((store, Some(server)))
}

/// Copies `image`'s blobs from the node directory `from` (only read) into `blobs`.
fn seed_store(from: &Path, image: &str, blobs: &dyn BlobStore) -> anyhow::Result<ImageManifest> {
    let manifest = ImageCatalog::open(from)?
        .get(image)
        .with_context(|| format!("image {image} in {}", from.display()))?;
    for digest in manifest
        .digests()
        .into_iter()
        .chain(manifest.license_notice)
    {
        if blobs.size(&digest)?.is_some() {
            continue;
        }
        let path = from.join("blobs/sha256").join(digest.hex());
        let mut file =
            std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
        let mut writer = blobs.writer()?;
        std::io::copy(&mut file, &mut writer)?;
        writer.commit_expecting(&digest)?;
    }
    Ok(manifest)
}

/// Starts `nodes` build nodes, runs `builds` builds at once through them, stops them; returns
/// the seconds from the first start to the last Ready.
async fn measure(
    store: &EventStore,
    blobs: &Arc<dyn BlobStore>,
    manifest: &ImageManifest,
    work: &Path,
    nodes: usize,
    builds: usize,
) -> anyhow::Result<f64> {
    let shutdown = CancellationToken::new();
    let agent = std::env::current_exe().context("locating the strata binary")?;
    let mut running = Vec::new();
    for n in 0..nodes {
        let dir = work.join(format!("{nodes}-nodes-{n}"));
        std::fs::create_dir_all(&dir)?;
        ImageCatalog::open(&dir)?.put(manifest)?;
        let mut settings = WorkerSettings::new(format!("bench-scale-{n}"), &dir, &agent);
        settings.poll_interval = Duration::from_millis(50);
        let worker = Worker::with_blobs(store.clone(), settings, blobs.clone())
            .context("starting a build node (it needs root for sandboxes)")?;
        running.push(tokio::spawn(worker.run_until(shutdown.clone())));
    }
    let team = TeamId::parse(&format!(
        "scale{}",
        &Uuid::new_v4().simple().to_string()[..8]
    ))?;
    let nonce = Uuid::new_v4();
    let mut ids = Vec::new();
    for i in 0..builds {
        ids.push(register(store, &team, i).await?);
    }
    let began = Instant::now();
    for (i, id) in ids.iter().enumerate() {
        let now = strata::clock::local_now();
        strata::app::build::start_build(
            store,
            &context(),
            id,
            recipe(&manifest.name, nonce, i)?,
            now,
            now + chrono::Duration::minutes(10),
        )
        .await?;
    }
    let result = wait_ready(store, &ids).await;
    let seconds = began.elapsed().as_secs_f64();
    shutdown.cancel();
    for node in running {
        node.await.context("build node task")??;
    }
    result.map(|()| seconds)
}

async fn wait_ready(store: &EventStore, ids: &[BuildId]) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(900);
    loop {
        let strata::projections::builds::Outcomes {
            ready,
            error: failed,
        } = strata::projections::builds::outcomes(store.pool(), Some(ids)).await?;
        if failed > 0 {
            bail!("{failed} of the bench builds failed");
        }
        if ready as usize == ids.len() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the bench builds did not finish in 900 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn recipe(image: &str, nonce: Uuid, i: usize) -> anyhow::Result<TemplateBuildStartV2> {
    Ok(serde_json::from_value(serde_json::json!({
        "fromImage": image,
        "force": false,
        "steps": [{"type": "RUN", "args": [format!("echo {nonce}-{i} > out")], "force": false}],
    }))?)
}

fn context() -> CommandContext {
    CommandContext::new(Metadata::new(Actor::new(ActorRole::Api, "bench-scale")))
}

async fn register(store: &EventStore, team: &TeamId, i: usize) -> anyhow::Result<BuildId> {
    let now = strata::clock::local_now();
    let name = TemplateName::parse(&format!("scale-{i}"))?;
    let cmd = RegisterBuild::new(team.clone(), name, now, chrono::Duration::minutes(10));
    let (_, build) = register_build(store, &context(), &cmd).await?;
    Ok(build)
}

/// Busy and total jiffies of the whole machine (`/proc/stat`), to tell a CPU-bound row.
fn cpu_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let total: u64 = fields.iter().sum();
    // idle and iowait are the 4th and 5th columns.
    let idle = fields.get(3)? + fields.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}
