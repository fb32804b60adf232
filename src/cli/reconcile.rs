use clap::Args;
use strata::config::{NodeArgs, StorageArgs};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Args)]
pub struct ReconcileArgs {
    #[command(flatten)]
    storage: StorageArgs,
    #[command(flatten)]
    node: NodeArgs,
    /// Run only this reconciler (see the list in `strata reconcile --help`).
    #[arg(long)]
    only: Option<String>,
}

pub async fn run(args: ReconcileArgs) -> anyhow::Result<()> {
    let pool = super::connect_database(&args.storage).await?;
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(run_until(
        pool,
        args.node.node_id(),
        args.only,
        shutdown.clone(),
    ));
    super::shutdown_signal().await;
    shutdown.cancel();
    task.await??;
    Ok(())
}

/// Runs the selected reconcilers until `shutdown`. The reconcilers themselves arrive with the
/// build lifecycle; today there are none to run, which `--only` reports as an error.
pub async fn run_until(
    pool: sqlx::PgPool,
    node_id: String,
    only: Option<String>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    if let Some(name) = only {
        anyhow::bail!("unknown reconciler {name:?}: none are available in this version");
    }
    sqlx::query("SELECT 1").execute(&pool).await?;
    tracing::info!(node = %node_id, "reconciler process connected; no reconcilers are available yet");
    shutdown.cancelled().await;
    Ok(())
}
