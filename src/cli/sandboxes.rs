//! `strata sandbox`: launched sandboxes for operators: list them, end one. Their whole history
//! is `strata history sandbox-<id>`.

use anyhow::Context;
use clap::{Args, Subcommand};
use strata::app::CommandContext;
use strata::config::StorageArgs;
use strata::domain::sandbox::SandboxId;
use strata::events::{Actor, ActorRole, Metadata};

#[derive(Debug, Args)]
pub struct SandboxArgs {
    #[command(subcommand)]
    command: SandboxCommand,
    #[command(flatten)]
    storage: StorageArgs,
}

#[derive(Debug, Subcommand)]
enum SandboxCommand {
    /// List live sandboxes (newest first): id, team, template, state, node, deadline.
    Ls {
        /// Only this team's.
        #[arg(long)]
        team: Option<String>,
        /// Also the most recently ended, with why they ended.
        #[arg(long)]
        all: bool,
        #[arg(long, default_value_t = 100)]
        limit: i64,
    },
    /// End a sandbox now, as its team's `kill` would; its node destroys it.
    Kill { id: String },
}

pub async fn run(args: SandboxArgs) -> anyhow::Result<()> {
    let pool = super::connect_database(&args.storage).await?;
    match args.command {
        SandboxCommand::Ls { team, all, limit } => {
            let rows =
                strata::projections::sandboxes::recent(&pool, team.as_deref(), all, limit).await?;
            println!(
                "{:<22}  {:<16}  {:<20}  {:<8}  {:<16}  ends or ended",
                "sandbox", "team", "template", "state", "node"
            );
            for r in rows {
                let state = r.end_reason.clone().unwrap_or_else(|| r.state.clone());
                let when = r.ended_at.or(r.end_at).map_or_else(
                    || "-".to_owned(),
                    |t| t.format("%Y-%m-%d %H:%M:%S").to_string(),
                );
                println!(
                    "{:<22}  {:<16}  {:<20}  {:<8}  {:<16}  {when}",
                    r.sandbox_id,
                    r.team_id,
                    r.alias,
                    state,
                    r.node_id.as_deref().unwrap_or("-"),
                );
            }
        }
        SandboxCommand::Kill { id } => {
            let id = SandboxId::parse(&id).context("parsing the sandbox id")?;
            let store = strata::app::event_store(pool);
            let actor = std::env::var("USER").unwrap_or_else(|_| "cli".into());
            let ctx = CommandContext::new(Metadata::new(Actor::new(ActorRole::Cli, actor)));
            strata::app::sandbox::kill(&store, &ctx, &id, strata::clock::local_now())
                .await
                .with_context(|| format!("ending sandbox {id}"))?;
            eprintln!("sandbox {id} ended; its node destroys it within a second");
        }
    }
    Ok(())
}
