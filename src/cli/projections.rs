//! `strata projections list|rebuild NAME|run`: operate the async read models.

use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use strata::config::StorageArgs;
use strata::projections;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Args)]
pub struct ProjectionsArgs {
    #[command(subcommand)]
    command: ProjectionsCommand,
    #[command(flatten)]
    storage: StorageArgs,
}

#[derive(Debug, Subcommand)]
enum ProjectionsCommand {
    /// Each projection with its checkpoint (`tx_id:position`), last update and lag in events.
    List,
    /// Empty a projection's read model and replay the whole feed into it.
    Rebuild {
        /// Projection name, as `list` shows it.
        name: String,
    },
    /// Keep every projection up to date until Ctrl-C (safe to run in several processes).
    Run {
        /// Poll the feed this often when no NOTIFY arrives.
        #[arg(long, default_value = "5", value_name = "SECONDS")]
        poll_secs: u64,
    },
}

pub async fn run(args: ProjectionsArgs) -> anyhow::Result<()> {
    let pool = super::connect_database(&args.storage).await?;
    let store = strata::app::event_store(pool.clone());
    match args.command {
        ProjectionsCommand::List => {
            let registry = projections::registry();
            let names: Vec<&str> = registry.iter().map(|p| p.name()).collect();
            let rows = projections::status(&pool, &names).await?;
            println!(
                "{:<24} {:<24} {:<26} {:>8}",
                "NAME", "CHECKPOINT", "UPDATED (UTC)", "LAG"
            );
            for s in rows {
                let updated = s.updated_at.map_or_else(
                    || "never".to_string(),
                    |t| t.format("%Y-%m-%d %H:%M:%S").to_string(),
                );
                println!(
                    "{:<24} {:<24} {:<26} {:>8}",
                    s.name,
                    s.checkpoint.to_string(),
                    updated,
                    s.lag
                );
            }
        }
        ProjectionsCommand::Rebuild { name } => {
            let replayed = projections::rebuild(store, &name)
                .await
                .with_context(|| format!("rebuilding projection {name}"))?;
            println!("rebuilt {name}: replayed {replayed} events");
        }
        ProjectionsCommand::Run { poll_secs } => {
            let shutdown = CancellationToken::new();
            let task = tokio::spawn(projections::run_all(
                store,
                Duration::from_secs(poll_secs.max(1)),
                shutdown.clone(),
            ));
            super::shutdown_signal().await;
            shutdown.cancel();
            task.await?;
        }
    }
    Ok(())
}
