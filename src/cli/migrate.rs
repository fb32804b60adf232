use anyhow::Context;
use clap::Args;
use strata::config::StorageArgs;

#[derive(Debug, Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    storage: StorageArgs,
}

pub async fn run(args: MigrateArgs) -> anyhow::Result<()> {
    let pool = super::connect_database(&args.storage).await?;
    strata::db::migrate(&pool)
        .await
        .context("applying migrations")?;
    tracing::info!("schema is up to date");
    Ok(())
}
