//! `strata bench sandbox-api`: a launched sandbox through the stock E2B Python SDK,
//! `Sandbox.create` -> first `commands.run("true")` -> `kill`, p50 and p99 over many runs,
//! next to the same three steps done by `strata template exec` in the same run (a fresh
//! process that boots a sandbox on the template, runs `true` and destroys it).
//!
//! The client timings come from `scripts/bench_sandbox_api.py` (run with the repository's
//! `.venv`), against the running strata at `--url`; the baseline runs this binary with the same
//! storage settings, so it boots on the same node directory.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use serde::Deserialize;
use strata::config::StorageArgs;

const TEAM: &str = "bench-sandbox-api";

#[derive(Debug, Args)]
pub struct BenchSandboxApiArgs {
    /// Base URL of the running strata's API.
    #[arg(long, default_value = "http://127.0.0.1:3000")]
    url: String,
    /// Sandboxes to launch; p50 and p99 are reported.
    #[arg(long, default_value_t = 50)]
    runs: usize,
    /// `strata template exec` runs for the baseline.
    #[arg(long, default_value_t = 20)]
    baseline_runs: usize,
    /// Python with the pinned `e2b` package (scripts/setup.sh creates it).
    #[arg(long, default_value = ".venv/bin/python")]
    python: PathBuf,
    /// The timing script shipped in the repository.
    #[arg(long, default_value = "scripts/bench_sandbox_api.py")]
    script: PathBuf,
    /// Base image of the launched template.
    #[arg(long, default_value = "busybox")]
    image: String,
    /// Also pause each sandbox after a 1 MiB file write and resume it (`connect`), timing the
    /// pause, the resume and the first command after it.
    #[arg(long)]
    pause: bool,
    #[command(flatten)]
    storage: StorageArgs,
}

#[derive(Debug, Deserialize)]
struct Run {
    create: f64,
    first_run: f64,
    kill: f64,
    /// With `--pause`: the pause, the `connect` that resumed it, its first command after.
    pause: Option<f64>,
    resume: Option<f64>,
    resumed_run: Option<f64>,
}

fn percentile(mut values: Vec<f64>, p: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let i = ((values.len() as f64 - 1.0) * p).round() as usize;
    values[i.min(values.len() - 1)]
}

pub async fn run(args: BenchSandboxApiArgs) -> anyhow::Result<()> {
    super::bench_sdk::require_scripts(&args.python, &args.script)?;
    let pool = super::connect_database(&args.storage).await?;
    let store = strata::app::event_store(pool.clone());
    let key = super::bench_sdk::issue_key(&store, TEAM).await?;
    pool.close().await;

    let output = tokio::process::Command::new(&args.python)
        .arg(&args.script)
        .args(["--url", &args.url, "--runs", &args.runs.max(1).to_string()])
        .args(["--image", &args.image])
        .args(args.pause.then_some("--pause"))
        .env("E2B_API_KEY", &key)
        .stderr(Stdio::inherit())
        .output()
        .await
        .with_context(|| format!("running {}", args.python.display()))?;
    if !output.status.success() {
        bail!("the SDK timing script failed ({})", output.status);
    }
    let text = String::from_utf8(output.stdout)?;
    let mut lines = text.lines();
    let template = lines
        .next()
        .context("the script printed no template name")?;
    let runs: Vec<Run> = lines
        .map(|l| serde_json::from_str(l).with_context(|| format!("parsing {l:?}")))
        .collect::<anyhow::Result<_>>()?;
    if runs.is_empty() {
        bail!("the SDK timing script printed no runs");
    }

    let exe = std::env::current_exe().context("locating the strata binary")?;
    let mut baseline = Vec::new();
    for _ in 0..args.baseline_runs.max(1) {
        let started = Instant::now();
        let status = tokio::process::Command::new(&exe)
            .args(["template", "exec", "--team", TEAM, template, "--", "true"])
            .env("STRATA_DATA_DIR", &args.storage.data_dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await
            .context("running strata template exec")?;
        if !status.success() {
            bail!("strata template exec failed ({status}); is DATABASE_URL the running strata's?");
        }
        baseline.push(started.elapsed().as_secs_f64());
    }

    println!(
        "strata bench sandbox-api: {} sandboxes of a {} template through the Python SDK against {}",
        runs.len(),
        args.image,
        args.url
    );
    println!();
    println!("{:<48} {:>9} {:>9}", "step", "p50 ms", "p99 ms");
    let row = |name: &str, values: Vec<f64>| {
        println!(
            "{:<48} {:>9.1} {:>9.1}",
            name,
            percentile(values.clone(), 0.5) * 1e3,
            percentile(values, 0.99) * 1e3
        );
    };
    let to_first: Vec<f64> = runs.iter().map(|r| r.create + r.first_run).collect();
    row("Sandbox.create", runs.iter().map(|r| r.create).collect());
    row(
        "first commands.run(\"true\")",
        runs.iter().map(|r| r.first_run).collect(),
    );
    row("kill", runs.iter().map(|r| r.kill).collect());
    row("create -> first result", to_first.clone());
    row(
        "create -> first result -> kill",
        runs.iter()
            .map(|r| r.create + r.first_run + r.kill)
            .collect(),
    );
    row(
        &format!(
            "baseline: strata template exec -- true ({}x)",
            baseline.len()
        ),
        baseline.clone(),
    );
    let paused: Vec<(f64, f64, f64)> = runs
        .iter()
        .filter_map(|r| Some((r.pause?, r.resume?, r.resumed_run?)))
        .collect();
    if !paused.is_empty() {
        row(
            "pause (1 MiB written)",
            paused.iter().map(|p| p.0).collect(),
        );
        row("connect (resume)", paused.iter().map(|p| p.1).collect());
        row(
            "first commands.run after resume",
            paused.iter().map(|p| p.2).collect(),
        );
        let resumed: Vec<f64> = paused.iter().map(|p| p.1 + p.2).collect();
        let create = percentile(to_first.clone(), 0.5);
        println!(
            "resume -> first result p50 / create -> first result p50: {:.2}",
            percentile(resumed, 0.5) / create
        );
    }
    let p50 = percentile(to_first, 0.5);
    println!(
        "create -> first result p50 / template exec p50: {:.2}; goal p50 <= 150 ms: {}",
        p50 / percentile(baseline, 0.5),
        if p50 <= 0.150 { "met" } else { "not met" }
    );
    Ok(())
}
