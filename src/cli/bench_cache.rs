//! `strata bench cache`: what the step cache saves. One run, one throwaway database, an
//! in-process build node on this machine's data directory, and a 10-step recipe whose middle RUN
//! sleeps: a cold build, the unchanged rebuild (the final entry hits: nothing executes), and a
//! rebuild with only the last step changed (resumes from step 9's checkpoint). Each is timed from
//! registration to Ready, as a client waits for it; the warm/cold ratios are printed.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use strata::app::registration::{register_build, RegisterBuild};
use strata::config::StorageArgs;
use strata::domain::build::StepOutcome;
use strata::domain::build_spec::{TemplateBuildStartV2, TemplateName};
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
        // A fresh nonce: no checkpoint of an earlier run on this node can be reused.
        let nonce = Uuid::new_v4();
        let result = async {
            let mut runs = Vec::new();
            for (label, last) in [
                ("cold", "last-v1"),
                ("unchanged rebuild", "last-v1"),
                ("last step changed", "last-v2"),
            ] {
                let spec = recipe(&args, nonce, last)?;
                runs.push(timed(&store, &team, label, spec).await?);
            }
            Ok::<_, anyhow::Error>(runs)
        }
        .await;
        shutdown.cancel();
        node.await.context("build node task")??;
        let runs = result?;
        println!(
            "strata bench cache ({where_}; 10 steps, RUN sleep {} s at step 5, image {})",
            args.sleep_secs, args.image
        );
        println!(
            "{:<20} {:>9} {:>9} {:>7} {:>12}",
            "build", "seconds", "executed", "cached", "ratio/cold"
        );
        let cold = runs[0].seconds;
        for r in &runs {
            println!(
                "{:<20} {:>9.3} {:>9} {:>7} {:>12.3}",
                r.label,
                r.seconds,
                r.executed,
                r.cached,
                r.seconds / cold
            );
        }
        Ok(())
    })
    .await
}

fn recipe(args: &BenchCacheArgs, nonce: Uuid, last: &str) -> anyhow::Result<TemplateBuildStartV2> {
    let step =
        |kind: &str, a: &[&str]| serde_json::json!({"type": kind, "args": a, "force": false});
    let sleep = format!("sleep {}; echo {nonce} > slow", args.sleep_secs);
    let last = format!("echo {last} > last");
    let spec = serde_json::json!({
        "fromImage": args.image,
        "force": false,
        "steps": [
            step("ENV", &["A", "1"]),
            step("WORKDIR", &["/tmp/bench"]),
            step("RUN", &["echo one > one"]),
            step("RUN", &["echo two > two"]),
            step("RUN", &[&sleep]),
            step("RUN", &["echo six > six"]),
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
) -> anyhow::Result<Timed> {
    let began = Instant::now();
    let build = register(store, team, label).await?;
    let now = strata::clock::local_now();
    let queue_deadline = now + chrono::Duration::minutes(10);
    strata::app::build::start_build(store, &context(), &build, spec, now, queue_deadline).await?;
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
