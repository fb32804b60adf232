//! `strata settings`: pin a setting for a team or one of its templates, unpin it, show what
//! applies. A pin is the rollback lever that moves one tenant without a deploy; `strata history
//! settings-team:T` is who moved it when.

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use strata::app::CommandContext;
use strata::domain::backend_name;
use strata::domain::setting_levels::Level;
use strata::domain::settings::{SettingsScope, CACHE_MODE, SANDBOX_BACKEND};
use strata::events::{Actor, ActorRole, EventStore, Metadata};

use strata::config::StorageArgs;

#[derive(Debug, Args)]
pub struct SettingsArgs {
    #[command(subcommand)]
    command: SettingsCommand,
    #[command(flatten)]
    storage: StorageArgs,
}

/// The scope a command acts on: a team, or one template of it.
#[derive(Debug, Args)]
struct ScopeArgs {
    #[arg(long)]
    team: String,
    /// A template of the team, by name: the pin applies to its builds only, over the team's.
    #[arg(long)]
    template: Option<String>,
}

#[derive(Debug, Subcommand)]
enum SettingsCommand {
    /// Pin KEY=VALUE (`cache.mode=final`, `sandbox.backend=namespace`): every build (and
    /// sandbox) started from now on resolves it, over the service's setting (and, for a
    /// template, over the team's pin).
    Pin {
        #[command(flatten)]
        scope: ScopeArgs,
        /// `cache.mode=off|final|steps` or `sandbox.backend=namespace`.
        setting: String,
    },
    /// Remove the pin of KEY; builds fall back to the next level.
    Unpin {
        #[command(flatten)]
        scope: ScopeArgs,
        key: String,
    },
    /// What a build started now resolves, with the level each value comes from.
    Show {
        #[command(flatten)]
        scope: ScopeArgs,
    },
}

pub async fn run(args: SettingsArgs) -> anyhow::Result<()> {
    let pool = super::connect_database(&args.storage).await?;
    strata::db::migrate(&pool)
        .await
        .context("applying migrations")?;
    let store = strata::app::event_store(pool.clone());
    let actor = std::env::var("USER").unwrap_or_else(|_| "cli".into());
    let ctx = CommandContext::new(Metadata::new(Actor::new(ActorRole::Cli, actor)));
    let now = strata::clock::local_now();
    match args.command {
        SettingsCommand::Pin { scope, setting } => {
            let Some((key, value)) = setting.split_once('=') else {
                bail!("give the setting as KEY=VALUE, for example {CACHE_MODE}=final");
            };
            let scope = resolve_scope(&store, &scope).await?;
            strata::app::settings::pin(&store, &ctx, &scope, key.trim(), value.trim(), now)
                .await
                .with_context(|| format!("pinning {setting} for {scope}"))?;
            println!("pinned {} for {scope}", setting.trim());
        }
        SettingsCommand::Unpin { scope, key } => {
            let scope = resolve_scope(&store, &scope).await?;
            strata::app::settings::unpin(&store, &ctx, &scope, key.trim(), now)
                .await
                .with_context(|| format!("unpinning {key} for {scope}"))?;
            println!("unpinned {key} for {scope}");
        }
        SettingsCommand::Show { scope } => {
            let resolved = resolve_scope(&store, &scope).await?;
            let pins = strata::app::settings::pins_in(&store, &resolved).await?;
            let mode = pins.cache_mode(std::env::var("STRATA_CACHE_MODE").ok().as_deref());
            println!("{CACHE_MODE} = {} ({})", mode.mode, mode.level.as_str());
            for (level, why) in &mode.skipped {
                println!("  skipped at the {}: {why}", level.as_str());
            }
            let backend = pins.sandbox_backend(
                std::env::var(backend_name::SERVICE_VARIABLE)
                    .ok()
                    .as_deref(),
            );
            println!("{SANDBOX_BACKEND} = {}", backend.describe());
            for (level, why) in &backend.skipped {
                println!(
                    "  skipped at the {}: {why}",
                    level.describe(backend_name::SERVICE_VARIABLE)
                );
            }
            if [mode.level, backend.level]
                .iter()
                .any(|l| matches!(l, Level::Service | Level::Default))
            {
                println!("  (where no pin applies, the service setting is the API's, read here from this shell's environment)");
            }
        }
    }
    pool.close().await;
    Ok(())
}

async fn resolve_scope(store: &EventStore, scope: &ScopeArgs) -> anyhow::Result<SettingsScope> {
    Ok(strata::app::settings::scope_of(store, &scope.team, scope.template.as_deref()).await?)
}
