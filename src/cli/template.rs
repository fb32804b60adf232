//! `strata template`: user-facing operations on built templates.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use strata::config::StorageArgs;
use strata::domain::ids::TeamId;
use strata::domain::snapshot::SnapshotRecord;
use strata::vmm::{
    BootSpec, CommandLine, ExecDefaults, ExecOutcome, ExecRequest, NamespaceBackend,
    NamespaceConfig, OutputLine, OutputStream, SandboxBackend,
};
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
    /// Boot a sandbox on a template's latest ready build (or `NAME:TAG`) with its user and
    /// workdir (ENV is build-time only, as on E2B), run COMMAND, print its output and exit with
    /// its exit code.
    Exec {
        /// Template name or id, optionally with `:tag`.
        name: String,
        /// The team that owns the template.
        #[arg(long, env = "STRATA_TEAM")]
        team: String,
        /// Run as this user instead of the template's.
        #[arg(long)]
        user: Option<String>,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 300)]
        timeout_secs: u64,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
}

pub async fn run(args: TemplateArgs) -> anyhow::Result<()> {
    let pool = super::connect_database(&args.storage).await?;
    let store = strata::app::event_store(pool);
    match args.command {
        TemplateCommand::Exec {
            name,
            team,
            user,
            timeout_secs,
            command,
        } => {
            let team = TeamId::parse(&team).context("parsing --team")?;
            let found =
                template_lookup::resolve(&store, &team, &name, template_lookup::Checkpoint::Result)
                    .await
                    .with_context(|| format!("looking up template {name:?} in team {team}"))?;
            let code =
                exec_in_template(&args.storage, &found.record, user, timeout_secs, command).await?;
            std::process::exit(code);
        }
        TemplateCommand::Export { name, dir, team } => {
            let team = TeamId::parse(&team).context("parsing --team")?;
            let found =
                template_lookup::resolve(&store, &team, &name, template_lookup::Checkpoint::Result)
                    .await
                    .with_context(|| format!("looking up template {name:?} in team {team}"))?;
            let blobs = strata::vmm::open_blob_store(
                args.storage.blob_url.as_deref(),
                &args.storage.data_dir,
            )
            .context("opening the blob store (STRATA_BLOB_URL)")?;
            let record = found.record.clone();
            let (d, n) = (dir.clone(), name.clone());
            let progress = super::progress::Progress::for_stderr();
            progress.stage(
                1,
                1,
                &format!("exporting {name} ({} layers)", record.layers.len()),
            );
            let shown = progress.clone();
            let mut written = 0u64;
            let manifest = tokio::task::spawn_blocking(move || {
                export::write_oci_layout_reporting(
                    blobs.as_ref(),
                    &record,
                    &n,
                    &d,
                    &mut |i, total, size| {
                        written += size;
                        shown.detail(format!(
                            "layer {i}/{total}, {} written",
                            super::progress::bytes(written)
                        ));
                    },
                )
            })
            .await??;
            progress.finish_stage("done");
            progress.finish();
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

/// Boots a sandbox on `record`, runs `command` in it with the record's context, copies its
/// output to ours, destroys the sandbox, and returns the exit code (128 + signal when killed).
async fn exec_in_template(
    storage: &StorageArgs,
    record: &SnapshotRecord,
    user: Option<String>,
    timeout_secs: u64,
    command: Vec<String>,
) -> anyhow::Result<i32> {
    let blobs = strata::vmm::open_blob_store(storage.blob_url.as_deref(), &storage.data_dir)
        .context("opening the blob store (STRATA_BLOB_URL)")?;
    let backend = NamespaceBackend::with_blobs(
        NamespaceConfig {
            data_dir: storage.data_dir.clone(),
            agent_binary: std::env::current_exe().context("locating the strata binary")?,
            depth: Default::default(),
            ids: storage.sandbox_id_range,
            network: storage.sandbox_network.config()?,
            disk: storage.sandbox_disk.config(),
        },
        blobs,
    )
    .context("opening the node's sandbox backend")?;
    let mut spec = BootSpec::new(record.layers.clone());
    let runtime = record.runtime_context();
    spec.context = ExecDefaults {
        env: runtime.env.into_iter().collect(),
        user: runtime.user,
        workdir: Some(runtime.workdir),
    };
    // Whatever ends the command (its exit, an error, Ctrl-C or SIGTERM), the sandbox is
    // destroyed and the backend's spare disks are unmounted before this process exits.
    let ran = tokio::select! {
        ran = boot_and_exec(&backend, spec, user, timeout_secs, command) => Some(ran),
        _ = super::shutdown_signal() => None,
    };
    backend.shutdown().await;
    let Some(outcome) = ran.transpose()? else {
        eprintln!("strata: interrupted; the sandbox was destroyed");
        return Ok(130);
    };
    Ok(match outcome {
        ExecOutcome::Exited(code) => code,
        ExecOutcome::Signaled(signal) => 128 + signal,
        ExecOutcome::TimedOut => {
            eprintln!("strata: the command timed out after {timeout_secs} s");
            124
        }
    })
}

/// Boots the sandbox, runs the command with its output copied to ours, and destroys the
/// sandbox. Dropped half way (a signal), the sandbox's own drop kills and removes it.
async fn boot_and_exec(
    backend: &NamespaceBackend,
    spec: BootSpec,
    user: Option<String>,
    timeout_secs: u64,
    command: Vec<String>,
) -> anyhow::Result<ExecOutcome> {
    let mut sandbox = backend
        .boot(spec)
        .await
        .context("booting a sandbox on the template")?;
    let request = ExecRequest {
        command: CommandLine::Argv(command),
        user,
        env: Vec::new(),
        cwd: None,
        timeout: Some(std::time::Duration::from_secs(timeout_secs)),
    };
    let (tx, mut rx) = strata::vmm::OutputSink::channel();
    let printer = tokio::spawn(async move {
        while let Some(line) = rx.recv().await {
            let line: OutputLine = line;
            match line.stream {
                OutputStream::Stdout => println!("{}", line.line),
                OutputStream::Stderr => eprintln!("{}", line.line),
            }
        }
    });
    let outcome = sandbox.exec(request, tx).await;
    printer.await.ok();
    sandbox.destroy().await.context("destroying the sandbox")?;
    outcome.context("running the command")
}
