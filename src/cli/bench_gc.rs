//! `strata bench gc`: how a garbage-collection pass grows with the store, and what it does to
//! storage over time.
//!
//! 1. **Pass cost.** For each size, a fresh local blob store holds that many small objects, each
//!    with its `object-…` stream (as writers leave them), a tenth of them pinned by the node
//!    catalog. Timed: a dry-run pass (list, read every referencing stream, classify, plan) and a
//!    full pass deleting the other nine tenths through the barrier. The same-run baseline is what
//!    a pass cannot do without: listing the store plus reading the streams.
//! 2. **Storage over time.** A steady stream of synthetic builds, each writing two layers and
//!    moving the one pinned result to its own; the store's size after every tenth build, with no
//!    GC and with a pass every tenth build under a budget.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use sqlx::PgPool;
use strata::config::StorageArgs;
use strata::domain::ids::Digest;
use strata::events::{Actor, ActorRole, CommandContext, Metadata};
use strata::reconcilers::gc::{self, GcPolicy, PassOptions};
use strata::reconcilers::ReconcileEnv;
use strata::vmm::image::{ImageCatalog, ImageConfig, ImageManifest};
use strata::vmm::layer::LayerRef;
use strata::vmm::{BlobStore, LocalBlobStore};

#[derive(Debug, Args)]
pub struct BenchGcArgs {
    /// Store sizes (objects) to time a pass on, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "10000,100000")]
    objects: Vec<usize>,
    /// Synthetic builds in the storage-over-time run.
    #[arg(long, default_value_t = 200)]
    builds: usize,
    /// Bytes of each synthetic layer.
    #[arg(long, default_value_t = 64 << 10)]
    layer_bytes: usize,
    #[command(flatten)]
    storage: StorageArgs,
}

/// Streams referenced per append while filling.
const REFERENCE_BATCH: usize = 500;

pub async fn run(args: BenchGcArgs) -> anyhow::Result<()> {
    if args.objects.is_empty() || args.objects.contains(&0) || args.builds == 0 {
        bail!("--objects needs sizes of at least 1 and --builds at least 1");
    }
    println!("pass cost (one pass over the whole store; a tenth pinned, the rest deleted)");
    println!(
        "{:>9} {:>12} {:>12} {:>12} {:>12} {:>10}",
        "objects", "list+read", "dry run", "ratio", "full pass", "deleted/s"
    );
    for &n in &args.objects {
        let storage = args.storage.clone();
        super::bench::with_bench_database(&storage, |options, _| async move {
            let pool = super::bench::bench_pool(options, 4).await?;
            let result = pass_cost(&pool, n).await;
            pool.close().await;
            result
        })
        .await?;
    }
    let storage = args.storage.clone();
    super::bench::with_bench_database(&storage, |options, _| async move {
        let pool = super::bench::bench_pool(options, 4).await?;
        let result = storage_over_time(&pool, args.builds, args.layer_bytes).await;
        pool.close().await;
        result
    })
    .await
}

fn context() -> CommandContext {
    CommandContext::new(Metadata::new(Actor::new(ActorRole::Reconciler, "bench-gc")))
        .with_max_attempts(16)
}

fn env(pool: &PgPool, dir: &Path, blobs: Arc<dyn BlobStore>, policy: GcPolicy) -> ReconcileEnv {
    ReconcileEnv {
        store: strata::app::event_store(pool.clone()),
        node: "bench-gc".into(),
        blobs,
        gc: policy,
        catalog: Some(dir.to_path_buf()),
    }
}

fn eager(budget: Option<u64>) -> GcPolicy {
    GcPolicy {
        budget,
        keep: chrono::Duration::zero(),
        grace: chrono::Duration::zero(),
        finals_per_template: 1,
        ..GcPolicy::default()
    }
}

/// Pins `layers` as the node catalog's one image.
fn pin(dir: &Path, layers: Vec<LayerRef>) -> anyhow::Result<()> {
    ImageCatalog::open(dir)?.put(&ImageManifest {
        name: "bench/pinned".into(),
        layers,
        config: ImageConfig {
            env: vec![],
            user: None,
            workdir: None,
        },
        license_notice: None,
        source: "strata bench gc".into(),
    })?;
    Ok(())
}

async fn pass_cost(pool: &PgPool, n: usize) -> anyhow::Result<()> {
    let work = tempfile::Builder::new()
        .prefix("strata-bench-gc-")
        .tempdir()?;
    let dir = work.path().to_path_buf();
    let blobs: Arc<dyn BlobStore> = Arc::new(LocalBlobStore::open(dir.join("blobs"))?);
    let stored = {
        let blobs = blobs.clone();
        tokio::task::spawn_blocking(move || {
            (0..n)
                .map(|i| blobs.put_bytes(format!("bench gc object {i}").as_bytes()))
                .collect::<Result<Vec<_>, _>>()
        })
        .await??
    };
    let digests: Vec<Digest> = stored.iter().map(|(d, _)| *d).collect();
    let store = strata::app::event_store(pool.clone());
    for chunk in digests.chunks(REFERENCE_BATCH) {
        strata::app::object::reference(&store, &context(), chunk, "bench writer")
            .await
            .context("registering the objects")?;
    }
    let pinned: Vec<LayerRef> = stored
        .iter()
        .step_by(10)
        .map(|(digest, size)| LayerRef {
            digest: *digest,
            size: *size,
        })
        .collect();
    pin(&dir, pinned.clone())?;
    let env = env(pool, &dir, blobs.clone(), eager(None));

    let started = Instant::now();
    let listed = {
        let blobs = blobs.clone();
        tokio::task::spawn_blocking(move || blobs.list()).await??
    };
    let events = store
        .read_categories(&[
            "template", "build", "snapshot", "cachekey", "files", "object",
        ])
        .await?;
    let baseline = started.elapsed();
    anyhow::ensure!(
        listed.len() == n && events.len() >= n,
        "the fill is incomplete"
    );

    let started = Instant::now();
    let dry = gc::pass(
        &env,
        &env.gc,
        &PassOptions {
            dry_run: true,
            ..Default::default()
        },
    )
    .await?;
    let dry_took = started.elapsed();
    let started = Instant::now();
    let full = gc::pass(&env, &env.gc, &PassOptions::default()).await?;
    let full_took = started.elapsed();
    anyhow::ensure!(
        full.deleted.len() == n - pinned.len() && dry.planned.len() == full.deleted.len(),
        "the pass deleted {} of {} unpinned objects",
        full.deleted.len(),
        n - pinned.len()
    );
    println!(
        "{:>9} {:>12} {:>12} {:>11.2}x {:>12} {:>10.0}",
        n,
        ms(baseline),
        ms(dry_took),
        dry_took.as_secs_f64() / baseline.as_secs_f64(),
        ms(full_took),
        full.deleted.len() as f64 / full_took.as_secs_f64()
    );
    Ok(())
}

async fn storage_over_time(pool: &PgPool, builds: usize, layer_bytes: usize) -> anyhow::Result<()> {
    let work = tempfile::Builder::new()
        .prefix("strata-bench-gc-")
        .tempdir()?;
    let (plain_dir, gc_dir) = (work.path().join("no-gc"), work.path().join("gc"));
    let plain: Arc<dyn BlobStore> = Arc::new(LocalBlobStore::open(plain_dir.join("blobs"))?);
    let collected: Arc<dyn BlobStore> = Arc::new(LocalBlobStore::open(gc_dir.join("blobs"))?);
    // The budget holds about ten builds' layers.
    let budget = (20 * layer_bytes) as u64;
    let env = env(pool, &gc_dir, collected.clone(), eager(Some(budget)));
    let store = strata::app::event_store(pool.clone());
    println!();
    println!(
        "storage over time ({builds} builds, 2 layers of {} KiB each; GC every 10th build, budget {} KiB)",
        layer_bytes >> 10,
        budget >> 10
    );
    println!("{:>7} {:>14} {:>14}", "builds", "without GC", "with GC");
    for b in 1..=builds {
        let mut layers = Vec::new();
        for store_ in [&plain, &collected] {
            let bytes: Vec<u8> = (0..layer_bytes)
                .map(|i| ((i as u64 * 2654435761) ^ b as u64) as u8)
                .collect();
            let mut written = Vec::new();
            for layer in 0..2u8 {
                let mut content = bytes.clone();
                content[0] = layer;
                let (digest, size) = store_.put_bytes(&content)?;
                written.push(LayerRef { digest, size });
            }
            layers = written;
        }
        let digests: Vec<Digest> = layers.iter().map(|l| l.digest).collect();
        strata::app::object::reference(&store, &context(), &digests, "bench build").await?;
        pin(&gc_dir, layers)?;
        if b % 10 == 0 {
            gc::pass(&env, &env.gc, &PassOptions::default()).await?;
            let size = |s: &Arc<dyn BlobStore>| -> anyhow::Result<u64> {
                Ok(s.list()?.iter().map(|b| b.size).sum())
            };
            println!(
                "{:>7} {:>11} KiB {:>11} KiB",
                b,
                size(&plain)? >> 10,
                size(&collected)? >> 10
            );
        }
    }
    Ok(())
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}
