//! `strata bench sandbox-api`: a launched sandbox through the stock E2B Python SDK,
//! `Sandbox.create` -> first `commands.run("true")` -> `kill`, p50 and p99 over many runs,
//! next to the same three steps done by `strata template exec` in the same run (a fresh
//! process that boots a sandbox on the template, runs `true` and destroys it).
//!
//! Then the proxied-request figure (`--proxied-requests`, [`super::bench_proxied`]): a small GET
//! to a sandbox's port through host routing against the same GET straight into its namespace.
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
use tokio::io::AsyncBufReadExt;

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
    /// GETs of a sandbox's page through host routing, and as many straight into its network
    /// namespace, for the proxied-request figure; 0 skips it. Needs the bench on the node that
    /// runs the sandbox (it finds the sandbox's server among the host's processes).
    #[arg(long, default_value_t = 400)]
    proxied_requests: usize,
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

/// The script's last line with `--serve`.
#[derive(Debug, Deserialize)]
struct Serving {
    serve: super::bench_proxied::Served,
}

/// The API's address from its base URL.
fn api_address(url: &str) -> anyhow::Result<std::net::SocketAddr> {
    use std::net::ToSocketAddrs;
    let parsed = reqwest::Url::parse(url).with_context(|| format!("--url {url}"))?;
    let host = parsed.host_str().context("--url names no host")?;
    let port = parsed
        .port_or_known_default()
        .context("--url names no port")?;
    (host, port)
        .to_socket_addrs()?
        .next()
        .with_context(|| format!("{host} resolves to no address"))
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

    let mut script = tokio::process::Command::new(&args.python)
        .arg(&args.script)
        .args(["--url", &args.url, "--runs", &args.runs.max(1).to_string()])
        .args(["--image", &args.image])
        .args(args.pause.then_some("--pause"))
        .args((args.proxied_requests > 0).then_some("--serve"))
        .env("E2B_API_KEY", &key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("running {}", args.python.display()))?;
    let mut lines = tokio::io::BufReader::new(script.stdout.take().expect("piped stdout")).lines();
    let template = lines
        .next_line()
        .await?
        .context("the script printed no template name")?;
    let mut runs: Vec<Run> = Vec::new();
    let mut served = None;
    while let Some(line) = lines.next_line().await? {
        if let Some(serve) = serde_json::from_str::<Serving>(&line).ok().map(|s| s.serve) {
            served = Some(serve);
            break;
        }
        runs.push(serde_json::from_str(&line).with_context(|| format!("parsing {line:?}"))?);
    }
    let proxied = match served {
        Some(served) => {
            let api = api_address(&args.url)?;
            let n = args.proxied_requests;
            Some(
                tokio::task::spawn_blocking(move || super::bench_proxied::measure(api, &served, n))
                    .await??,
            )
        }
        None => None,
    };
    drop(script.stdin.take());
    while lines.next_line().await?.is_some() {}
    let status = script.wait().await?;
    if !status.success() {
        bail!("the SDK timing script failed ({status})");
    }
    if args.proxied_requests > 0 && proxied.is_none() {
        bail!("the SDK timing script did not leave a sandbox serving");
    }
    let template = template.as_str();
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
    if let Some(f) = proxied {
        let (direct, through) = (f.direct, f.proxied);
        println!();
        println!(
            "a small GET of a sandbox's port, {} each, a new connection per request:",
            direct.len()
        );
        println!(
            "{:<48} {:>9} {:>9} {:>9}",
            "path", "req/s", "p50 ms", "p99 ms"
        );
        for (name, times) in [
            ("straight into the sandbox's namespace", &direct),
            ("host routing (API -> node's agent -> sandbox)", &through),
        ] {
            println!(
                "{:<48} {:>9.0} {:>9.2} {:>9.2}",
                name,
                super::bench_proxied::rate(times),
                percentile(times.clone(), 0.5) * 1e3,
                percentile(times.clone(), 0.99) * 1e3
            );
        }
        let ratio = super::bench_proxied::rate(&through) / super::bench_proxied::rate(&direct);
        let added = (percentile(through, 0.99) - percentile(direct, 0.99)) * 1e3;
        println!(
            "proxied/direct rate {ratio:.2}x (goal >= 0.8x: {}); p99 {added:+.2} ms (goal <= +2 ms: {})",
            if ratio >= 0.8 { "met" } else { "not met" },
            if added <= 2.0 { "met" } else { "not met" }
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
