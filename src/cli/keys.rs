//! `strata keys`: API keys for teams. The key is printed once, on creation; strata keeps only
//! its sha256.

use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use strata::domain::ids::TeamId;
use strata::domain::team::{ApiKey, Command};
use strata::events::command::{execute, CommandContext};
use strata::events::{Actor, ActorRole, EventStore, Metadata};
use strata::streams::{team_stream, Team};
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
    let store = EventStore::new(pool.clone());
    let ctx = CommandContext::new(Metadata::new(Actor::new(ActorRole::Cli, whoami())));
    match args.command {
        KeysCommand::Create { team } => {
            let team = parse_team(&team)?;
            let key = ApiKey::from_random(rand::random());
            let command = Command::IssueKey {
                key_id: Uuid::new_v4(),
                key_sha256: key.sha256_hex(),
                prefix: key.display_prefix(),
                now: strata::clock::local_now(),
            };
            execute::<Team>(&store, &team_stream(&team), &command, &ctx)
                .await
                .context("issuing the key")?;
            eprintln!("issued a key for team {team}; it is shown once:");
            println!("{}", key.expose());
        }
        KeysCommand::List { team } => {
            let team = parse_team(&team)?;
            let rows: Vec<KeyRow> = sqlx::query_as(
                "SELECT key_id, prefix, issued_at, revoked_at FROM api_keys WHERE team_id = $1 ORDER BY issued_at",
            )
            .bind(team.as_str())
            .fetch_all(&pool)
            .await?;
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
            let command = Command::RevokeKey {
                key_id,
                now: strata::clock::local_now(),
            };
            execute::<Team>(&store, &team_stream(&team), &command, &ctx)
                .await
                .context("revoking the key")?;
            eprintln!("revoked key {key_id} of team {team}");
        }
    }
    Ok(())
}

/// key id, display prefix, issued, revoked.
type KeyRow = (Uuid, String, DateTime<Utc>, Option<DateTime<Utc>>);

fn parse_team(raw: &str) -> anyhow::Result<TeamId> {
    TeamId::parse(raw).with_context(|| format!("team name {raw:?}"))
}

fn whoami() -> String {
    std::env::var("USER").unwrap_or_else(|_| "cli".into())
}
