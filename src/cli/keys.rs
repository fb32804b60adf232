//! `strata keys`: API keys for teams. The key is printed once, on creation; strata keeps only
//! its sha256.

use anyhow::Context;
use clap::{Args, Subcommand};
use strata::app::team::{issue_key, revoke_key};
use strata::app::CommandContext;
use strata::domain::ids::TeamId;
use strata::events::{Actor, ActorRole, Metadata};
use uuid::Uuid;

use strata::config::StorageArgs;

#[derive(Debug, Args)]
pub struct KeysArgs {
    #[command(subcommand)]
    command: KeysCommand,
    #[command(flatten)]
    storage: StorageArgs,
}

#[derive(Debug, Subcommand)]
enum KeysCommand {
    /// Issue a new key for TEAM (creating the team) and print it. Use it as E2B_API_KEY.
    Create {
        /// Team name: letters, digits, '_' and '-'. It scopes templates, uploads and builds.
        #[arg(long)]
        team: String,
    },
    /// List a team's keys (id, prefix, issued, revoked).
    List {
        #[arg(long)]
        team: String,
    },
    /// Revoke a key by id; requests with it get 401 from then on.
    Revoke {
        #[arg(long)]
        team: String,
        key_id: Uuid,
    },
}

pub async fn run(args: KeysArgs) -> anyhow::Result<()> {
    let pool = super::connect_database(&args.storage).await?;
    strata::db::migrate(&pool)
        .await
        .context("applying migrations")?;
    let store = strata::app::event_store(pool.clone());
    let ctx = CommandContext::new(Metadata::new(Actor::new(ActorRole::Cli, whoami())));
    match args.command {
        KeysCommand::Create { team } => {
            let team = parse_team(&team)?;
            let key = issue_key(&store, &ctx, &team, strata::clock::local_now())
                .await
                .context("issuing the key")?;
            eprintln!("issued a key for team {team}; it is shown once:");
            println!("{}", key.expose());
        }
        KeysCommand::List { team } => {
            let team = parse_team(&team)?;
            let rows = strata::projections::api_keys::keys_of(&pool, team.as_str()).await?;
            println!(
                "{:<36}  {:<12}  {:<20}  revoked",
                "key id", "prefix", "issued"
            );
            for (id, prefix, issued, revoked) in rows {
                println!(
                    "{id}  {prefix:<12}  {:<20}  {}",
                    issued.format("%Y-%m-%d %H:%M:%S"),
                    revoked
                        .map(|r| r.format("%Y-%m-%d %H:%M:%S").to_string())
                        .unwrap_or_else(|| "-".into())
                );
            }
        }
        KeysCommand::Revoke { team, key_id } => {
            let team = parse_team(&team)?;
            revoke_key(&store, &ctx, &team, key_id, strata::clock::local_now())
                .await
                .context("revoking the key")?;
            eprintln!("revoked key {key_id} of team {team}");
        }
    }
    Ok(())
}

fn parse_team(raw: &str) -> anyhow::Result<TeamId> {
    TeamId::parse(raw).with_context(|| format!("team name {raw:?}"))
}

fn whoami() -> String {
    std::env::var("USER").unwrap_or_else(|_| "cli".into())
}
