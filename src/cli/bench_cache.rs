//! `strata bench cache`: what the execution cache saves, per cache mode (ADR 0030). One run, one
//! throwaway database, an in-process build node on this machine's data directory, and a 10-step
//! recipe whose fifth step sleeps. For each mode of `--modes` (a fresh nonce each, so no mode
//! reuses another's entries): a cold build, the unchanged rebuild, and rebuilds with only the
//! first, the middle or the last mutating step changed from the cold build's. Each is timed from
//! registration to Ready, as a client waits for it; the ratios to the mode's cold build, and each
//! mode's cold build to `off`'s (the price of caching), are printed.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use strata::app::registration::{register_build, RegisterBuild};
use strata::config::StorageArgs;
use strata::domain::build::StepOutcome;
use strata::domain::build_spec::{TemplateBuildStartV2, TemplateName};
use strata::domain::cache_mode::{self, CacheMode};
use strata::domain::ids::{BuildId, TeamId};
use strata::events::command::{load, CommandContext};
use strata::events::{Actor, ActorRole, EventStore, Metadata};
use strata::streams::{build_stream, Build};
use strata::worker::{Worker, WorkerSettings};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

#[derive(Debug, Args)]
pub struct BenchCacheArgs {
    /// Seconds the RUN in the middle of the recipe sleeps.
    #[arg(long, default_value_t = 3)]
    sleep_secs: u64,
    /// Base image of the recipe (from this node's image catalog).
    #[arg(long, default_value = "busybox")]
    image: String,
    /// The cache modes to compare, in order: `off`, `final`, `steps`.
    #[arg(long, value_delimiter = ',', default_value = "steps")]
    modes: Vec<String>,
    #[command(flatten)]
    storage: StorageArgs,
}

/// One timed build.
struct Timed {
    label: &'static str,
    seconds: f64,
    executed: usize,
    cached: usize,
}

pub async fn run(args: BenchCacheArgs) -> anyhow::Result<()> {
    let modes = args
        .modes
        .iter()
        .map(|m| m.parse::<CacheMode>().map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let storage = args.storage.clone();
    super::bench::with_bench_database(&storage, |options, where_| async move {
        let pool = super::bench::bench_pool(options, 4).await?;
        let store = strata::app::event_store(pool.clone());
        let mut settings = WorkerSettings::new(
            "bench-cache",
            &args.storage.data_dir,
            std::env::current_exe().context("locating the strata binary")?,
        );
        settings.poll_interval = Duration::from_millis(50);
        let worker = Worker::new(store.clone(), settings).context("starting the build node")?;
        let shutdown = CancellationToken::new();
        let node = tokio::spawn(worker.run_until(shutdown.clone()));
        let team = TeamId::parse(&format!(
            "bench{}",
            &Uuid::new_v4().simple().to_string()[..8]
        ))?;
        let result = async {
            let mut by_mode = Vec::new();
            for &mode in &modes {
                // A fresh nonce per mode: no checkpoint of another mode or run is reused.
                let nonce = Uuid::new_v4();
                let mut runs = Vec::new();
                for (label, changed) in [
                    ("cold", None),
                    ("unchanged rebuild", None),
                    ("first step changed", Some(Changed::First)),
                    ("middle step changed", Some(Changed::Middle)),
                    ("last step changed", Some(Changed::Last)),
                ] {
                    let spec = recipe(&args, nonce, changed)?;
                    runs.push(timed(&store, &team, label, spec, mode).await?);
                }
                by_mode.push((mode, runs));
            }
            Ok::<_, anyhow::Error>(by_mode)
        }
        .await;
        shutdown.cancel();
        node.await.context("build node task")??;
        let by_mode = result?;
        println!(
            "strata bench cache ({where_}; 10 steps, RUN sleep {} s at step 5, image {})",
            args.sleep_secs, args.image
        );
        let off_cold = by_mode
            .iter()
            .find(|(m, _)| *m == CacheMode::Off)
            .map(|(_, runs)| runs[0].seconds);
        for (mode, runs) in &by_mode {
            println!("\nmode {mode}");
            println!(
                "{:<20} {:>9} {:>9} {:>7} {:>12}",
                "build", "seconds", "executed", "cached", "ratio/cold"
            );
            let cold = runs[0].seconds;
            for r in runs {
                println!(
                    "{:<20} {:>9.3} {:>9} {:>7} {:>12.3}",
                    r.label,
                    r.seconds,
                    r.executed,
                    r.cached,
                    r.seconds / cold
                );
            }
            if let Some(off) = off_cold {
                println!("cold build against mode off's: {:.3}", cold / off);
            }
        }
        Ok(())
    })
    .await
}

/// Which mutating step of the recipe a rebuild changes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Changed {
    First,
    Middle,
    Last,
}

fn recipe(
    args: &BenchCacheArgs,
    nonce: Uuid,
    changed: Option<Changed>,
) -> anyhow::Result<TemplateBuildStartV2> {
    let step =
        |kind: &str, a: &[&str]| serde_json::json!({"type": kind, "args": a, "force": false});
    let variant = |which: Changed| if changed == Some(which) { "v2" } else { "v1" };
    let first = format!("echo one-{} > one", variant(Changed::First));
    let sleep = format!("sleep {}; echo {nonce} > slow", args.sleep_secs);
    let middle = format!("echo six-{} > six", variant(Changed::Middle));
    let last = format!("echo last-{} > last", variant(Changed::Last));
    let spec = serde_json::json!({
        "fromImage": args.image,
        "force": false,
        "steps": [
            step("ENV", &["A", "1"]),
            step("WORKDIR", &["/tmp/bench"]),
            step("RUN", &[&first]),
            step("RUN", &["echo two > two"]),
            step("RUN", &[&sleep]),
            step("RUN", &[&middle]),
            step("ENV", &["B", "2"]),
            step("RUN", &["cat one two > both"]),
            step("WORKDIR", &["sub"]),
            step("RUN", &[&last]),
        ],
    });
    Ok(serde_json::from_value(spec)?)
}

fn context() -> CommandContext {
    CommandContext::new(Metadata::new(Actor::new(ActorRole::Api, "bench-cache")))
}

/// Registers, starts and waits for one build, as the API would append it.
async fn timed(
    store: &EventStore,
    team: &TeamId,
    label: &'static str,
    spec: TemplateBuildStartV2,
    mode: CacheMode,
) -> anyhow::Result<Timed> {
    let began = Instant::now();
    let build = register(store, team, label).await?;
    let now = strata::clock::local_now();
    let queue_deadline = now + chrono::Duration::minutes(10);
    let resolved = cache_mode::resolve(&cache_mode::ModeSettings {
        service: Some(mode.as_str().to_owned()),
        ..Default::default()
    });
    strata::app::build::start_build_keyed(
        store,
        &context(),
        &build,
        spec,
        None,
        Some(resolved),
        now,
        queue_deadline,
    )
    .await?;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let phase = strata::projections::builds::phase_of(store.pool(), &build).await?;
        match phase.as_deref() {
            Some("ready") => break,
            Some("error") => {
                let state = load::<Build>(store, &build_stream(&build)).await?.state;
                bail!("the {label} build failed: {:?}", state.phase);
            }
            _ if Instant::now() > deadline => bail!("the {label} build did not finish in 600 s"),
            _ => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    let seconds = began.elapsed().as_secs_f64();
    let state = load::<Build>(store, &build_stream(&build)).await?.state;
    let cached = state
        .progress
        .values()
        .filter(|o| matches!(o, StepOutcome::Cached { .. }))
        .count();
    Ok(Timed {
        label,
        seconds,
        executed: state.progress.len() - cached,
        cached,
    })
}

/// `POST /v3/templates`: claims a fresh name and registers a build.
async fn register(store: &EventStore, team: &TeamId, label: &str) -> anyhow::Result<BuildId> {
    let now = strata::clock::local_now();
    let name = TemplateName::parse(&format!(
        "bench-{}-{}",
        label.replace(' ', "-"),
        &Uuid::new_v4().simple().to_string()[..6]
    ))?;
    let cmd = RegisterBuild::new(team.clone(), name, now, chrono::Duration::minutes(10));
    let (_, build) = register_build(store, &context(), &cmd).await?;
    Ok(build)
}
