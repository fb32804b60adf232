use anyhow::Context;
use clap::Args;
use strata::config::{BuildNodeArgs, NodeArgs, StorageArgs};
use strata::worker::{Worker, WorkerSettings};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    storage: StorageArgs,
    #[command(flatten)]
    node: NodeArgs,
    #[command(flatten)]
    build: BuildNodeArgs,
    /// Serve Prometheus metrics (`GET /metrics`) on this address; off when unset.
    #[arg(long, env = "STRATA_METRICS_LISTEN")]
    metrics_listen: Option<std::net::SocketAddr>,
}

pub async fn run(args: WorkerArgs) -> anyhow::Result<()> {
    let pool = super::connect_database(&args.storage).await?;
    let settings = settings(&args.build, &args.node, &args.storage)?;
    let shutdown = CancellationToken::new();
    if let Some(addr) = args.metrics_listen {
        let sources = strata::metrics::scrape::ScrapeSources {
            builds: None,
            data_dir: Some(args.storage.data_dir.clone()),
            team_limits: Some(settings.team_limits),
            token: args.storage.metrics_token.as_deref().map(Into::into),
        };
        strata::metrics::server::serve(addr, sources, shutdown.clone())
            .await
            .with_context(|| format!("binding the metrics listener to {addr}"))?;
    }
    let task = tokio::spawn(run_until(pool, settings, shutdown.clone()));
    super::shutdown_signal().await;
    shutdown.cancel();
    task.await??;
    Ok(())
}

/// The node's settings from the command line; the sandbox agent is this very binary.
pub fn settings(
    build: &BuildNodeArgs,
    node: &NodeArgs,
    storage: &StorageArgs,
) -> anyhow::Result<WorkerSettings> {
    let agent = std::env::current_exe().context("locating the strata binary")?;
    let mut settings = strata::worker::WorkerSettings::from_args(
        build,
        node.node_id(),
        storage.data_dir.clone(),
        agent,
    );
    settings.blob_url = storage.blob_url.clone();
    settings.sandbox_ids = storage.sandbox_id_range;
    settings.sandbox_network = storage.sandbox_network.config()?;
    settings.sandbox_disk = storage.sandbox_disk.config();
    // A base layer may expand to no more than one build may write.
    settings.registry.max_layer_bytes = settings.sandbox_disk.max;
    // No pull takes the node's disk below its reserve (which Postgres may share).
    settings.registry.disk_reserve = Some(settings.sandbox_disk.reserve);
    settings.team_limits = storage.team_limits.limits();
    // Registry credentials are sealed by the API under the server secret; every node opens
    // them with the same one (STRATA_UPLOAD_SECRET, or the data directory's secret file).
    let secret = strata::api::state::server_secret(
        std::env::var("STRATA_UPLOAD_SECRET").ok().as_deref(),
        &storage.data_dir,
    )
    .context("reading the server secret that seals registry credentials")?;
    settings.credential_seal = Some(strata::registry::sealed::CredentialSeal::from_secret(
        &secret,
    ));
    Ok(settings)
}

/// Runs a build node until `shutdown`.
pub async fn run_until(
    pool: sqlx::PgPool,
    settings: WorkerSettings,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let worker = Worker::new(strata::app::event_store(pool), settings)
        .context("starting the build node (it needs root for sandboxes)")
        .inspect_err(|e| tracing::error!("{e:#}"))?;
    worker.run_until(shutdown).await?;
    Ok(())
}
