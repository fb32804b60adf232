//! `strata bench sdk`: the whole round trip of a one-step build through the stock E2B Python
//! SDK against a running strata, split into the time spent in API calls and the time the
//! build itself took on the worker.
//!
//! The client side comes from `scripts/bench_sdk.py` (run with the repository's `.venv`): the
//! wall time of every SDK call. The server side comes from the build's own events, read from
//! the database the running strata uses: queued (`BuildFrozen`) to claimed (`AttemptAcquired`),
//! claimed to the last `StepCompleted`, and publishing to `BuildReady`. What the client waited
//! beyond `BuildFrozen`..`BuildReady` is the status-poll detection lag.

use std::path::PathBuf;
use std::process::Stdio;

use anyhow::{bail, Context};
use chrono::{DateTime, Utc};
use clap::Args;
use serde::Deserialize;
use strata::app::CommandContext;
use strata::config::StorageArgs;
use strata::domain::ids::{BuildId, TeamId};
use strata::events::{Actor, ActorRole, EventStore, Metadata};
use strata::streams::build_stream;

#[derive(Debug, Args)]
pub struct BenchSdkArgs {
    /// Base URL of the running strata's API.
    #[arg(long, default_value = "http://127.0.0.1:3000")]
    url: String,
    /// Builds to time; medians are reported.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Python with the pinned `e2b` package (scripts/setup.sh creates it).
    #[arg(long, default_value = ".venv/bin/python")]
    python: PathBuf,
    /// The timing script shipped in the repository.
    #[arg(long, default_value = "scripts/bench_sdk.py")]
    script: PathBuf,
    /// Base image of the one-step template.
    #[arg(long, default_value = "busybox")]
    image: String,
    /// Time unchanged rebuilds (every step answered from the cache, after one untimed build)
    /// instead of builds that run their step.
    #[arg(long)]
    unchanged: bool,
    #[command(flatten)]
    storage: StorageArgs,
}

/// One line of the script's output: seconds per SDK call.
#[derive(Debug, Deserialize)]
struct ClientRun {
    build_id: String,
    total: f64,
    register: f64,
    link: f64,
    upload: f64,
    start: f64,
    wait: f64,
    poll_http: f64,
    polls: u64,
}

/// Seconds between the build's milestones, from its events' commit times.
#[derive(Debug, Default)]
struct ServerRun {
    /// BuildFrozen to BuildReady.
    total: f64,
    queued: f64,
    steps: f64,
    publish: f64,
}

pub async fn run(args: BenchSdkArgs) -> anyhow::Result<()> {
    require_scripts(&args.python, &args.script)?;
    let pool = super::connect_database(&args.storage).await?;
    let store = strata::app::event_store(pool.clone());
    let key = issue_key(&store, "bench-sdk").await?;

    let output = tokio::process::Command::new(&args.python)
        .arg(&args.script)
        .args(["--url", &args.url, "--runs", &args.runs.max(1).to_string()])
        .args(["--image", &args.image])
        .args(args.unchanged.then_some("--unchanged"))
        .env("E2B_API_KEY", &key)
        .stderr(Stdio::inherit())
        .output()
        .await
        .with_context(|| format!("running {}", args.python.display()))?;
    if !output.status.success() {
        bail!("the SDK timing script failed ({})", output.status);
    }
    let mut client = Vec::new();
    let mut server = Vec::new();
    for line in String::from_utf8(output.stdout)?.lines() {
        let run: ClientRun =
            serde_json::from_str(line).with_context(|| format!("parsing {line:?}"))?;
        server.push(server_timings(&store, &run.build_id).await?);
        client.push(run);
    }
    pool.close().await;
    if client.is_empty() {
        bail!("the SDK timing script printed no runs");
    }
    report(&args, &client, &server);
    Ok(())
}

/// The repository's Python and timing script, which the SDK benchmarks run.
pub fn require_scripts(python: &std::path::Path, script: &std::path::Path) -> anyhow::Result<()> {
    for (path, what) in [(python, "--python"), (script, "--script")] {
        if !path.exists() {
            bail!(
                "{what} {} does not exist: run from the repository root after ./scripts/setup.sh, or pass {what}",
                path.display()
            );
        }
    }
    Ok(())
}

/// A fresh API key of `team`, for the SDK a benchmark drives.
pub async fn issue_key(store: &EventStore, team: &str) -> anyhow::Result<String> {
    let ctx = CommandContext::new(Metadata::new(Actor::new(ActorRole::Cli, "bench")));
    let team = TeamId::parse(team)?;
    let key = strata::app::team::issue_key(store, &ctx, &team, strata::clock::local_now())
        .await
        .context("issuing the bench key")?;
    Ok(key.expose().to_string())
}

async fn server_timings(store: &EventStore, build_id: &str) -> anyhow::Result<ServerRun> {
    let build = BuildId::parse(build_id).with_context(|| format!("build id {build_id:?}"))?;
    let events = store.read_stream_all(&build_stream(&build)).await?;
    let first = |kind: &str| -> Option<DateTime<Utc>> {
        events
            .iter()
            .find(|e| e.event_type == kind)
            .map(|e| e.recorded_at)
    };
    let last = |kind: &str| -> Option<DateTime<Utc>> {
        events
            .iter()
            .rev()
            .find(|e| e.event_type == kind)
            .map(|e| e.recorded_at)
    };
    let (Some(frozen), Some(acquired), Some(ready)) = (
        first("BuildFrozen.v1"),
        first("AttemptAcquired.v1"),
        first("BuildReady.v1"),
    ) else {
        bail!("build {build_id} has no BuildFrozen, AttemptAcquired and BuildReady events");
    };
    let stepped = last("StepCompleted.v1").unwrap_or(acquired);
    let publishing = first("PublishingStarted.v1").unwrap_or(stepped);
    let secs =
        |a: DateTime<Utc>, b: DateTime<Utc>| (b - a).num_microseconds().unwrap_or(0) as f64 / 1e6;
    Ok(ServerRun {
        total: secs(frozen, ready),
        queued: secs(frozen, acquired),
        steps: secs(acquired, stepped),
        publish: secs(publishing, ready),
    })
}

/// The middle value (the upper one of an even count).
pub(super) fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn report(args: &BenchSdkArgs, client: &[ClientRun], server: &[ServerRun]) {
    let col = |f: &dyn Fn(&ClientRun) -> f64| median(client.iter().map(f).collect());
    let srv = |f: &dyn Fn(&ServerRun) -> f64| median(server.iter().map(f).collect());
    let api = col(&|r| r.register + r.link + r.upload + r.start + r.poll_http);
    let build = srv(&|s| s.total);
    println!(
        "strata bench sdk: {} one-step {} (FROM {} + one RUN) through the Python SDK against {}",
        client.len(),
        if args.unchanged {
            "unchanged rebuilds"
        } else {
            "builds"
        },
        args.image,
        args.url
    );
    println!();
    println!("{:<52} {:>10}", "phase (median of runs)", "ms");
    let row = |name: &str, secs: f64| println!("{:<52} {:>10.1}", name, secs * 1e3);
    row("Template.build, whole round trip", col(&|r| r.total));
    row("  API calls, all (sum of the rows below)", api);
    row("    POST /v3/templates", col(&|r| r.register));
    row(
        "    GET files link + PUT upload",
        col(&|r| r.link + r.upload),
    );
    row("    POST /v2/.../builds/{id} (start)", col(&|r| r.start));
    row("    status polls, HTTP time only", col(&|r| r.poll_http));
    row("  build on the worker (frozen -> ready)", build);
    row(
        "    queued (frozen -> attempt acquired)",
        srv(&|s| s.queued),
    );
    row(
        "    steps (acquired -> last step completed)",
        srv(&|s| s.steps),
    );
    row("    publish (publishing -> ready)", srv(&|s| s.publish));
    row(
        "  wait beyond the build (SDK's 0.2 s sleep, held polls)",
        col(&|r| r.wait) - build,
    );
    println!(
        "status polls per build (median): {:.0}",
        median(client.iter().map(|r| r.polls as f64).collect())
    );
    // The goal (issue: rebuilds faster than BuildKit): the client's whole round trip within
    // 1.3 x the server's own frozen-to-ready time plus 30 ms.
    let ratio = col(&|r| r.total) / (1.3 * build + 0.030);
    println!("round trip / (1.3 x frozen->ready + 30 ms): {ratio:.2} (goal <= 1.00)");
}
