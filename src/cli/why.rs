//! `strata why build ID`: why a build failed, and why each of its steps was or was not a cache
//! hit, from its events and logs (see `strata::inspect::why`).

use anyhow::Context;
use clap::{Args, ValueEnum};
use strata::config::StorageArgs;
use strata::domain::ids::BuildId;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Subject {
    /// A build, by id.
    Build,
}

#[derive(Debug, Args)]
pub struct WhyArgs {
    /// What to explain (only `build` for now).
    #[arg(value_enum)]
    subject: Subject,
    /// The build id (a UUID).
    id: String,
    /// Print the answer as one JSON object (the same the operator page shows).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    storage: StorageArgs,
}

pub async fn run(args: WhyArgs) -> anyhow::Result<()> {
    let Subject::Build = args.subject;
    let uuid = uuid::Uuid::parse_str(&args.id)
        .with_context(|| format!("{:?} is not a build id (a UUID)", args.id))?;
    let pool = super::connect_database(&args.storage).await?;
    let store = strata::app::event_store(pool);
    let why = strata::inspect::why_build(&store, BuildId::from_uuid(uuid)).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&why)?);
    } else {
        print!("{}", why.to_text());
    }
    Ok(())
}
