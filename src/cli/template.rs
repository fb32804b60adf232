//! `strata template`: user-facing operations on built templates.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use strata::config::StorageArgs;
use strata::domain::ids::TeamId;
use strata::events::EventStore;
use strata::vmm::LocalBlobStore;
use strata::worker::{export, template_lookup};

#[derive(Debug, Args)]
pub struct TemplateArgs {
    #[command(flatten)]
    storage: StorageArgs,
    #[command(subcommand)]
    command: TemplateCommand,
}

#[derive(Debug, Subcommand)]
enum TemplateCommand {
    /// Write a template's latest ready build (or `NAME:TAG`) as an OCI image layout in DIR,
    /// importable with `strata image import DIR --name …`.
    Export {
        /// Template name or id, optionally with `:tag`.
        name: String,
        dir: PathBuf,
        /// The team that owns the template (templates are scoped per team).
        #[arg(long, env = "STRATA_TEAM")]
        team: String,
    },
}

pub async fn run(args: TemplateArgs) -> anyhow::Result<()> {
    let pool = super::connect_database(&args.storage).await?;
    let store = EventStore::new(pool);
    match args.command {
        TemplateCommand::Export { name, dir, team } => {
            let team = TeamId::parse(&team).context("parsing --team")?;
            let found = template_lookup::resolve(&store, &team, &name)
                .await
                .with_context(|| format!("looking up template {name:?} in team {team}"))?;
            let blobs = LocalBlobStore::open(args.storage.data_dir.join("blobs"))
                .context("opening the blob store")?;
            let record = found.record.clone();
            let (d, n) = (dir.clone(), name.clone());
            let manifest = tokio::task::spawn_blocking(move || {
                export::write_oci_layout(&blobs, &record, &n, &d)
            })
            .await??;
            println!(
                "{name}\t{}\tbuild {}\t{} layers\t{}",
                manifest,
                found.build,
                found.record.layers.len(),
                dir.display()
            );
        }
    }
    Ok(())
}
