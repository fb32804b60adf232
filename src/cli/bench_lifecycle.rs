//! `strata bench lifecycle`: builds that finish although a node dies.
//!
//! N builds of a one-step recipe are queued; two `strata worker` processes take them and a
//! `strata reconcile` process runs beside them. When half the builds are terminal, one worker is
//! killed with SIGKILL. Reported: time until every build is terminal; throughput before and after
//! the kill; and the reconciler lag (lease expiry to the terminal event, database clock) for the
//! builds the dead node held, next to the baseline measured in the same run: how long a healthy
//! build takes from acquisition to Ready.
//!
//! It needs a fresh database: with DATABASE_URL, one named `strata_bench_…` is created on that
//! server (needs CREATEDB) and dropped at the end; without, a throwaway embedded Postgres.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::Args;
use sqlx::PgPool;
use strata::app::registration::{register_build, RegisterBuild};
use strata::config::StorageArgs;
use strata::domain::build_spec::{TemplateBuildStartV2, TemplateName};
use strata::domain::ids::{BuildId, TeamId};
use strata::events::{Actor, ActorRole, CommandContext, EventStore, Metadata};
use strata::projections::builds::{self, Outcomes};
use uuid::Uuid;

#[derive(Debug, Args)]
pub struct LifecycleBenchArgs {
    /// Builds to run.
    #[arg(long, default_value_t = 200)]
    builds: usize,
    /// Lease of each worker, in seconds.
    #[arg(long, default_value_t = 3)]
    lease_secs: u64,
    /// Builds each worker runs at once.
    #[arg(long, default_value_t = 4)]
    max_builds: usize,
    /// The RUN step of the one-step recipe.
    #[arg(long, default_value = "true")]
    run: String,
    #[command(flatten)]
    storage: StorageArgs,
}

pub async fn run(args: LifecycleBenchArgs) -> anyhow::Result<()> {
    match args.storage.database_url.clone() {
        Some(url) => {
            let name = format!(
                "strata_bench_{}",
                &Uuid::new_v4().simple().to_string()[..12]
            );
            let admin = strata::db::connect(&url, 1)
                .await
                .context("connecting to DATABASE_URL")?;
            sqlx::query(&format!("CREATE DATABASE \"{name}\""))
                .execute(&admin)
                .await
                .context("creating the bench database (needs CREATEDB)")?;
            let bench_url = with_database(&url, &name);
            let result = bench(&args, &bench_url).await;
            sqlx::query(&format!("DROP DATABASE \"{name}\" WITH (FORCE)"))
                .execute(&admin)
                .await
                .context("dropping the bench database")?;
            result
        }
        None => {
            super::bench::with_throwaway_postgres(|url| async move { bench(&args, &url).await })
                .await
        }
    }
}

fn with_database(url: &str, database: &str) -> String {
    let (base, rest) = url.rsplit_once('/').unwrap_or((url, ""));
    let query = rest
        .split_once('?')
        .map(|(_, q)| format!("?{q}"))
        .unwrap_or_default();
    format!("{base}/{database}{query}")
}

/// A child process leading its own process group; dropping it SIGKILLs the group (a worker and
/// its sandboxes: what a node's death takes with it) and reaps the child.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the process group this child leads (created at spawn).
        unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

fn spawn(args: &LifecycleBenchArgs, url: &str, role: &[&str], node: &str) -> anyhow::Result<Proc> {
    let exe = std::env::current_exe().context("locating the strata binary")?;
    let child = Command::new(exe)
        .process_group(0)
        .args(role)
        .env("DATABASE_URL", url)
        .env("STRATA_DATA_DIR", &args.storage.data_dir)
        .env("STRATA_NODE_ID", node)
        .env("STRATA_LEASE_SECS", args.lease_secs.to_string())
        .env("STRATA_MAX_BUILDS", args.max_builds.to_string())
        .env("STRATA_QUEUE_POLL_MS", "200")
        .env("RUST_LOG", "warn")
        // The throwaway database references none of the node's objects: GC on the node's data
        // dir would weigh the node's store against it (and, before the store carried its owner,
        // deleted everything). Only the expiry and promotion reconcilers are measured here.
        .env("STRATA_GC_SCHEDULE", "off")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting strata {}", role.join(" ")))?;
    Ok(Proc(child))
}

async fn bench(args: &LifecycleBenchArgs, url: &str) -> anyhow::Result<()> {
    let n = args.builds.max(2);
    let pool = strata::db::connect(url, 8).await?;
    strata::db::migrate(&pool).await?;
    let store = strata::app::event_store(pool.clone());
    let team = TeamId::parse("benchteam")?;
    let spec = serde_json::json!({
        "fromImage": "busybox", "force": false,
        "steps": [{"type": "RUN", "args": [args.run], "force": false}],
    });
    let queued = Instant::now();
    for i in 0..n {
        let build = register(&store, &team, &format!("lifecycle-{i}")).await?;
        start(&store, build, &spec).await?;
    }
    eprintln!(
        "queued {n} builds in {:.1} s",
        queued.elapsed().as_secs_f64()
    );

    let started = Instant::now();
    let _reconciler = spawn(args, url, &["reconcile"], "bench-reconciler")?;
    let mut victim = Some(spawn(args, url, &["worker"], "bench-worker-a")?);
    let _survivor = spawn(args, url, &["worker"], "bench-worker-b")?;
    let mut killed_at = None;
    let mut terminal_at_kill = 0;
    loop {
        let terminal = terminal_count(&pool).await?;
        if killed_at.is_none() && terminal >= (n / 2) as i64 {
            drop(victim.take());
            killed_at = Some(started.elapsed());
            terminal_at_kill = terminal;
        }
        if terminal >= n as i64 {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(60 + 10 * n as u64),
            "builds still not terminal after {:.0} s ({terminal} of {n})",
            started.elapsed().as_secs_f64()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let total = started.elapsed();
    let killed_at = killed_at.expect("the worker is killed at half");

    let Outcomes {
        ready,
        error: failed,
    } = builds::outcomes(&pool, None).await?;
    let healthy = healthy_durations(&pool).await?;
    let lags = reconciler_lags(&pool).await?;
    let before = terminal_at_kill as f64 / killed_at.as_secs_f64();
    let after = (n as i64 - terminal_at_kill) as f64 / (total - killed_at).as_secs_f64();

    println!("lifecycle: {n} builds of `RUN {}`, 2 workers (max {} builds each, lease {} s), one killed at half", args.run, args.max_builds, args.lease_secs);
    println!(
        "  all terminal after     {:>8.2} s   ({ready} ready, {failed} error)",
        total.as_secs_f64()
    );
    println!(
        "  worker killed at       {:>8.2} s   ({terminal_at_kill} terminal then)",
        killed_at.as_secs_f64()
    );
    println!(
        "  throughput             {before:>8.2} builds/s before the kill, {after:.2} after (ratio {:.2})",
        after / before
    );
    let base_p50 = percentile(&healthy, 0.5);
    println!(
        "  baseline: healthy build, acquired to ready: p50 {:.3} s, p99 {:.3} s ({} builds)",
        base_p50,
        percentile(&healthy, 0.99),
        healthy.len()
    );
    if lags.is_empty() {
        println!("  reconciler lag: no build was held by the killed worker");
    } else {
        let (p50, p99) = (percentile(&lags, 0.5), percentile(&lags, 0.99));
        println!(
            "  reconciler lag, lease expiry to terminal event: p50 {p50:.3} s, p99 {p99:.3} s ({} builds; {:.2}x / {:.2}x the healthy build p50)",
            lags.len(),
            p50 / base_p50,
            p99 / base_p50
        );
    }
    pool.close().await;
    Ok(())
}

async fn terminal_count(pool: &PgPool) -> anyhow::Result<i64> {
    Ok(builds::outcomes(pool, None).await?.terminal())
}

/// Seconds from acquisition to Ready of the builds a worker finished itself.
async fn healthy_durations(pool: &PgPool) -> anyhow::Result<Vec<f64>> {
    let rows: Vec<f64> = sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM r.recorded_at - a.recorded_at)::float8
         FROM events r JOIN events a ON a.stream_id = r.stream_id AND a.type = 'AttemptAcquired.v1'
         WHERE r.type = 'BuildReady.v1' AND r.metadata->'actor'->>'role' = 'worker'",
    )
    .fetch_all(pool)
    .await?;
    Ok(sorted(rows))
}

/// Seconds from the last lease expiry to the terminal event, for builds a reconciler finished.
async fn reconciler_lags(pool: &PgPool) -> anyhow::Result<Vec<f64>> {
    let rows: Vec<(DateTime<Utc>, DateTime<Utc>)> = sqlx::query_as(
        "SELECT t.recorded_at,
                (SELECT max((l.data->>'lease_expires_at')::timestamptz) FROM events l
                 WHERE l.stream_id = t.stream_id AND l.type IN ('AttemptAcquired.v1', 'LeaseRenewed.v1'))
         FROM events t
         WHERE t.type IN ('BuildReady.v1', 'BuildFailed.v1')
           AND t.metadata->'actor'->>'role' = 'reconciler'",
    )
    .fetch_all(pool)
    .await?;
    Ok(sorted(
        rows.into_iter()
            .map(|(t, lease)| (t - lease).num_microseconds().unwrap_or(0) as f64 / 1e6)
            .collect(),
    ))
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i]
}

fn bench_context() -> CommandContext {
    CommandContext::new(Metadata::new(Actor::new(ActorRole::Cli, "bench")))
}

/// What `POST /v3/templates` appends for a new name: the claim, the template, the build.
async fn register(store: &EventStore, team: &TeamId, name: &str) -> anyhow::Result<BuildId> {
    let now = strata::clock::local_now();
    let name = TemplateName::parse(name)?;
    let cmd = RegisterBuild::new(team.clone(), name, now, chrono::Duration::hours(1));
    let (_, build) = register_build(store, &bench_context(), &cmd).await?;
    Ok(build)
}

/// What `POST /v2/templates/{id}/builds/{bid}` appends: the build frozen and queued.
async fn start(store: &EventStore, build: BuildId, spec: &serde_json::Value) -> anyhow::Result<()> {
    let spec: TemplateBuildStartV2 = serde_json::from_value(spec.clone())?;
    let now = strata::clock::local_now();
    let queue_deadline = now + chrono::Duration::hours(1);
    strata::app::build::start_build(store, &bench_context(), &build, spec, now, queue_deadline)
        .await
        .map_err(|e| anyhow::anyhow!("starting build {build}: {e}"))?;
    Ok(())
}
