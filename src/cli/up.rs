use anyhow::Context;
use clap::Args;
use strata::api::AppState;
use strata::config::{BuildNodeArgs, GcArgs, NodeArgs, ServeArgs, StorageArgs};
use strata::embedded_postgres::{EmbeddedPostgres, DATABASE_NAME};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Args)]
pub struct UpArgs {
    #[command(flatten)]
    storage: StorageArgs,
    #[command(flatten)]
    serve: ServeArgs,
    #[command(flatten)]
    node: NodeArgs,
    #[command(flatten)]
    build: BuildNodeArgs,
    #[command(flatten)]
    gc: GcArgs,
    /// Port of the embedded Postgres (only used when DATABASE_URL is unset).
    #[arg(long, env = "STRATA_EMBEDDED_PG_PORT", default_value_t = 54329)]
    embedded_pg_port: u16,
}

pub async fn run(args: UpArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.storage.data_dir).with_context(|| {
        format!(
            "creating data directory {}",
            args.storage.data_dir.display()
        )
    })?;

    let embedded = match &args.storage.database_url {
        Some(_) => None,
        None => {
            let pg = EmbeddedPostgres::new(
                args.storage.data_dir.join("postgres"),
                args.embedded_pg_port,
            )?;
            pg.start().await.context("starting the embedded Postgres")?;
            Some(pg)
        }
    };
    let result = run_services(&args, embedded.as_ref()).await;
    if let Some(pg) = embedded {
        if let Err(err) = tokio::task::spawn_blocking(move || pg.stop()).await? {
            tracing::error!(error = %err, "stopping the embedded Postgres failed");
        }
    }
    result
}

async fn run_services(args: &UpArgs, embedded: Option<&EmbeddedPostgres>) -> anyhow::Result<()> {
    let url = match (&args.storage.database_url, embedded) {
        (Some(url), _) => url.clone(),
        (None, Some(pg)) => pg.url(DATABASE_NAME),
        (None, None) => unreachable!("an embedded Postgres is started when DATABASE_URL is unset"),
    };
    let pool = strata::db::connect(&url, args.storage.db_pool_size)
        .await
        .context("connecting to Postgres")?;
    strata::db::migrate(&pool)
        .await
        .context("applying migrations")?;

    let node_id = args.node.node_id();
    let shutdown = CancellationToken::new();
    let state = AppState::new(
        pool.clone(),
        &args.serve,
        node_id.clone(),
        &args.storage.data_dir,
    )
    .context("preparing the API")?
    .with_team_limits(args.storage.team_limits.limits())
    .with_metrics_token(args.storage.metrics_token.as_deref())
    .with_disk_ceiling(args.storage.sandbox_disk.build_disk_max.0)
    .with_blobs(
        strata::vmm::open_blob_store(args.storage.blob_url.as_deref(), &args.storage.data_dir)
            .context("opening the blob store (STRATA_BLOB_URL)")?,
    );
    let api = super::api::serve(&args.serve, state, shutdown.clone()).await?;
    let worker_settings = super::worker::settings(&args.build, &args.node, &args.storage)?;
    let worker = tokio::spawn(super::worker::run_until(
        pool.clone(),
        worker_settings,
        shutdown.clone(),
    ));
    let reconcile_env =
        super::reconcile::environment(pool.clone(), node_id, &args.storage, &args.gc)?;
    let reconcilers = tokio::spawn(super::reconcile::run_until(
        reconcile_env,
        Vec::new(),
        strata::reconcilers::Schedule::default(),
        args.gc.schedule()?,
        shutdown.clone(),
    ));
    let projections = tokio::spawn(strata::projections::run_all(
        strata::app::event_store(pool.clone()),
        std::time::Duration::from_secs(5),
        shutdown.clone(),
    ));
    tracing::info!(url = %args.serve.public_url(), "strata is up; press Ctrl-C to stop");

    super::shutdown_signal().await;
    shutdown.cancel();
    api.await.context("API task")??;
    worker.await.context("worker task")??;
    reconcilers.await.context("reconciler task")?;
    projections.await.context("projection task")?;
    pool.close().await;
    Ok(())
}
