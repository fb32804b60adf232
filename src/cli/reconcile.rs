//! `strata reconcile`: runs the reconcilers (all, or `--only` some) as their own process.

use anyhow::Context;
use clap::Args;
use strata::config::{GcArgs, NodeArgs, StorageArgs};
use strata::reconcilers::schedule::DEFAULT_SCHEDULE;
use strata::reconcilers::{run_scheduled, ReconcileEnv, Reconciler, Schedule};
use strata::vmm::open_blob_store;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Args)]
pub struct ReconcileArgs {
    #[command(flatten)]
    storage: StorageArgs,
    #[command(flatten)]
    node: NodeArgs,
    /// Run only these reconcilers (repeat the flag for several); all of them by default.
    #[arg(long, value_enum, value_name = "NAME")]
    only: Vec<Reconciler>,
    /// When passes run: a cron expression with six fields, seconds first (`*/2 * * * * *` is
    /// every two seconds), applied to each selected reconciler.
    #[arg(long, env = "STRATA_RECONCILE_SCHEDULE", default_value = DEFAULT_SCHEDULE)]
    schedule: String,
    #[command(flatten)]
    gc: GcArgs,
    /// Serve Prometheus metrics (`GET /metrics`) on this address; off when unset.
    #[arg(long, env = "STRATA_METRICS_LISTEN")]
    metrics_listen: Option<std::net::SocketAddr>,
}

pub async fn run(args: ReconcileArgs) -> anyhow::Result<()> {
    let schedule = Schedule::parse(&args.schedule)?;
    let gc_schedule = args.gc.schedule()?;
    let pool = super::connect_database(&args.storage).await?;
    let env = environment(pool, args.node.node_id(), &args.storage, &args.gc)?;
    let shutdown = CancellationToken::new();
    if let Some(addr) = args.metrics_listen {
        let sources = strata::metrics::scrape::ScrapeSources {
            token: args.storage.metrics_token.as_deref().map(Into::into),
            ..Default::default()
        };
        strata::metrics::server::serve(addr, sources, shutdown.clone())
            .await
            .with_context(|| format!("binding the metrics listener to {addr}"))?;
    }
    let task = tokio::spawn(run_until(
        env,
        args.only,
        schedule,
        gc_schedule,
        shutdown.clone(),
    ));
    super::shutdown_signal().await;
    shutdown.cancel();
    task.await?;
    Ok(())
}

/// What the reconcilers need: the store, the node id in their events' metadata, the blob store
/// (`STRATA_BLOB_URL`, else `<data-dir>/blobs`) where promotion checks a build's layers and GC
/// deletes, the retention policy, and the image catalog GC keeps.
pub fn environment(
    pool: sqlx::PgPool,
    node: String,
    storage: &StorageArgs,
    gc: &GcArgs,
) -> anyhow::Result<ReconcileEnv> {
    let blobs = open_blob_store(storage.blob_url.as_deref(), &storage.data_dir)
        .context("opening the blob store (STRATA_BLOB_URL)")?;
    Ok(ReconcileEnv {
        store: strata::app::event_store(pool),
        node,
        blobs,
        gc: gc.policy(),
        catalog: Some(storage.data_dir.clone()),
    })
}

/// Runs the `only` reconcilers (all when empty) on `schedule` (GC on `gc_schedule`, or not at
/// all when it is off) until `shutdown`.
pub async fn run_until(
    env: ReconcileEnv,
    only: Vec<Reconciler>,
    schedule: Schedule,
    gc_schedule: Option<Schedule>,
    shutdown: CancellationToken,
) {
    let mut selected = Vec::new();
    for r in if only.is_empty() {
        Reconciler::ALL.to_vec()
    } else {
        only
    } {
        if !selected.contains(&r) {
            selected.push(r);
        }
    }
    let tasks: Vec<_> = selected
        .into_iter()
        .filter_map(|r| {
            let schedule = if r == Reconciler::Gc {
                gc_schedule.clone()?
            } else {
                schedule.clone()
            };
            Some(tokio::spawn(run_scheduled(
                r,
                env.clone(),
                schedule,
                shutdown.clone(),
            )))
        })
        .collect();
    for task in tasks {
        if let Err(e) = task.await {
            tracing::error!(error = %e, "a reconciler task panicked");
        }
    }
}
