//! The `strata` binary: one executable, one subcommand per role.

mod cli;

use clap::{Parser, Subcommand};
use strata::telemetry::{self, LogFormat};

/// strata: a self-hosted template-build service that speaks the E2B build protocol.
///
/// Point the stock E2B SDK at it (E2B_API_URL=http://127.0.0.1:3000) and build templates.
/// `strata up` runs everything in one process on a local Postgres it starts itself.
#[derive(Debug, Parser)]
#[command(name = "strata", version, propagate_version = true)]
struct Cli {
    /// Log format on stderr. `RUST_LOG` sets the filter (default: info).
    #[arg(
        long,
        env = "STRATA_LOG_FORMAT",
        value_enum,
        default_value_t,
        global = true
    )]
    log_format: LogFormat,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
// Parsed once per process: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
enum Command {
    /// Run everything in one process: API, worker and reconcilers. Without DATABASE_URL, a
    /// local Postgres cluster is created and started in the data directory, and stopped on
    /// Ctrl-C or SIGTERM.
    Up(cli::up::UpArgs),
    /// Run the stateless HTTP API (E2B-compatible endpoints, uploads, operator API).
    Api(cli::api::ApiArgs),
    /// Run a build node: claim started builds and execute them in sandboxes.
    Worker(cli::worker::WorkerArgs),
    /// Run reconcilers (all, or one with --only). Several copies may run at once.
    Reconcile(cli::reconcile::ReconcileArgs),
    /// Apply pending database migrations and exit.
    Migrate(cli::migrate::MigrateArgs),
    /// Manage the node's local image catalog (base images, imports).
    Image(cli::image::ImageArgs),
    /// Create, list and revoke API keys; a key maps to a team.
    Keys(cli::keys::KeysArgs),
    /// Pin a setting (`cache.mode`) for a team or one of its templates, unpin it, show it.
    Settings(cli::settings::SettingsArgs),
    /// Build a template from a Dockerfile and its context, over a strata server's API (as
    /// `docker build -t NAME .`).
    Build(cli::build::BuildArgs),
    /// Run a command on a built template, or export it as an OCI image layout.
    Template(cli::template::TemplateArgs),
    /// List launched sandboxes, or end one (`strata history sandbox-<id>` is its history).
    Sandbox(cli::sandboxes::SandboxArgs),
    /// Print a stream's (or a build's) audit history as a table or JSON.
    History(cli::history::HistoryArgs),
    /// Explain a build: why it failed, why each step was or was not a cache hit.
    Why(cli::why::WhyArgs),
    /// Run one garbage-collection pass now (`--dry-run`: print what would go and why, by tier).
    Gc(cli::gc::GcCliArgs),
    /// Show the blob store's usage by class (rooted, and each retention tier) and this node's
    /// extracted layers.
    Storage(cli::gc::StorageCliArgs),
    /// List, rebuild or run the async projections (read models).
    Projections(cli::projections::ProjectionsArgs),
    /// Measure throughput and latency against a baseline taken in the same run.
    Bench(cli::bench::BenchArgs),
}

fn main() -> std::process::ExitCode {
    // The sandbox side forks, so it runs before any runtime thread exists.
    if std::env::args_os().nth(1).is_some_and(|a| {
        a == "sandbox-init" || a == strata::vmm::namespace::init::HOLD_USER_NAMESPACE
    }) {
        return cli::sandbox::init();
    }
    let cli = Cli::parse();
    if let Err(err) = strata::open_files::raise() {
        eprintln!("strata: raising the open-file limit: {err}; going on with the one given");
    }
    if matches!(
        cli.command,
        Command::Build(_) | Command::History(_) | Command::Why(_) | Command::Storage(_)
    ) {
        // A client whose output is piped into `head` ends as other CLIs do when the reader
        // goes away, instead of panicking on the next print. Servers keep Rust's default.
        // SAFETY: restoring a signal's default disposition before any thread starts.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("strata: cannot start the async runtime: {err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        let _telemetry = telemetry::init(cli.log_format)?;
        match cli.command {
            Command::Up(args) => cli::up::run(args).await,
            Command::Api(args) => cli::api::run(args).await,
            Command::Worker(args) => cli::worker::run(args).await,
            Command::Reconcile(args) => cli::reconcile::run(args).await,
            Command::Migrate(args) => cli::migrate::run(args).await,
            Command::Image(args) => cli::image::run(args).await,
            Command::Keys(args) => cli::keys::run(args).await,
            Command::Settings(args) => cli::settings::run(args).await,
            Command::Build(args) => cli::build::run(args).await,
            Command::Template(args) => cli::template::run(args).await,
            Command::Sandbox(args) => cli::sandboxes::run(args).await,
            Command::History(args) => cli::history::run(args).await,
            Command::Why(args) => cli::why::run(args).await,
            Command::Projections(args) => cli::projections::run(args).await,
            Command::Gc(args) => cli::gc::run_gc(args).await,
            Command::Storage(args) => cli::gc::run_storage(args).await,
            Command::Bench(args) => cli::bench::run(args).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("strata: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
