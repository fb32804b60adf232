use anyhow::Context;
use clap::Args;
use strata::api::AppState;
use strata::config::{NodeArgs, ServeArgs, StorageArgs};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Args)]
pub struct ApiArgs {
    #[command(flatten)]
    storage: StorageArgs,
    #[command(flatten)]
    serve: ServeArgs,
    #[command(flatten)]
    node: NodeArgs,
}

pub async fn run(args: ApiArgs) -> anyhow::Result<()> {
    let pool = super::connect_database(&args.storage).await?;
    strata::db::migrate(&pool)
        .await
        .context("applying migrations")?;
    let state = AppState::new(
        pool,
        &args.serve,
        args.node.node_id(),
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
    let shutdown = CancellationToken::new();
    let server = serve(args.serve.listen, state, shutdown.clone()).await?;
    super::shutdown_signal().await;
    shutdown.cancel();
    server.await.context("API server task")??;
    Ok(())
}

/// Binds `listen` and serves until `shutdown` is cancelled.
pub async fn serve(
    listen: std::net::SocketAddr,
    state: AppState,
    shutdown: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<anyhow::Result<()>>> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding the API to {listen}"))?;
    tracing::info!(address = %listener.local_addr()?, "API listening");
    Ok(tokio::spawn(async move {
        strata::serve::serve_until(
            listener,
            strata::api::router(state),
            shutdown,
            strata::serve::DRAIN,
        )
        .await
        .context("serving the API")
    }))
}
