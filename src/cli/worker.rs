use clap::Args;
use strata::config::{NodeArgs, StorageArgs};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    storage: StorageArgs,
    #[command(flatten)]
    node: NodeArgs,
}

pub async fn run(args: WorkerArgs) -> anyhow::Result<()> {
    let pool = super::connect_database(&args.storage).await?;
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(run_until(pool, args.node.node_id(), shutdown.clone()));
    super::shutdown_signal().await;
    shutdown.cancel();
    task.await??;
    Ok(())
}

/// The worker loop. Build execution arrives with the E2B protocol; until then the worker only
/// proves it can reach the database and waits for shutdown.
pub async fn run_until(
    pool: sqlx::PgPool,
    node_id: String,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    sqlx::query("SELECT 1").execute(&pool).await?;
    tracing::info!(node = %node_id, "worker connected; no build executor is available yet");
    shutdown.cancelled().await;
    Ok(())
}
