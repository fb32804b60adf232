//! `strata bench …`: throughput and latency, always next to a baseline measured in the same run.
//!
//! `bench events` compares, with N concurrent writers and one event per append:
//! * the ceiling: plain single-row INSERTs (autocommit) into an unindexed table;
//! * appends to distinct streams (the common case: every build its own stream), grouped into
//!   shared transactions as the store does by default, and each in its own transaction;
//! * appends contended on one stream, each writer re-trying at the version a conflict reports.
//!
//! With DATABASE_URL set, it works in a schema of its own (`strata_bench_…`, dropped at the end)
//! so it never writes into the service's event log; without, it starts a throwaway embedded
//! Postgres in a temporary directory.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Subcommand};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};
use strata::config::StorageArgs;
use strata::embedded_postgres::{EmbeddedPostgres, DATABASE_NAME};
use strata::events::{
    Actor, ActorRole, AppendError, EventStore, ExpectedVersion, GroupCommitPolicy, Metadata,
    NewEvent, StreamId, StreamWrite,
};
use uuid::Uuid;

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Event-store appends against plain INSERTs: appends/s, p50/p99 latency, conflicts.
    Events(EventsBenchArgs),
    /// Sandboxes: boot+exec+destroy latency, checkpoint cost against `tar | openssl dgst`,
    /// boot latency by stack depth.
    Sandbox(super::bench_sandbox::BenchSandboxArgs),
    /// Upload ingest through the real HTTP path against `openssl dgst -sha256` of the same file.
    Upload(super::bench_upload::BenchUploadArgs),
    /// One-step SDK build against a running strata: API time and step time, per phase.
    Sdk(super::bench_sdk::BenchSdkArgs),
    /// Launched sandboxes through the Python SDK (create, first command, kill), p50 and p99,
    /// against `strata template exec` in the same run.
    SandboxApi(super::bench_sandbox_api::BenchSandboxApiArgs),
    /// Builds through 2 worker processes with one killed halfway: time until all are terminal,
    /// reconciler lag (lease expiry to terminal event) p50/p99.
    Lifecycle(super::bench_lifecycle::LifecycleBenchArgs),
    /// The step cache: cold build, unchanged rebuild, last step changed; warm/cold ratios.
    Cache(super::bench_cache::BenchCacheArgs),
    /// `strata build` against `docker build` (BuildKit) on one Dockerfile and context: cold,
    /// unchanged, last step changed, one context file changed; strata/BuildKit ratios.
    Build(super::bench_build::BenchBuildArgs),
    /// A cold registry pull of a multi-layer image against `skopeo copy` + `tar -x`; a warm pull.
    Pull(super::bench_pull::BenchPullArgs),
    /// Blob and layer durability and verification against the plain (unsynced, unverified)
    /// paths: put, cache probe, layer extraction.
    Blobs(super::bench_blobs::BenchBlobsArgs),
    /// Builds per second through 1, 2, 3 build nodes sharing one Postgres and one object store.
    Scale(super::bench_scale::BenchScaleArgs),
    /// Reads and background passes on an empty store against the same on a filled one
    /// (10k templates, 100k builds, 1M log lines by default).
    ScaleStore(super::bench_scale_store::BenchScaleStoreArgs),
    /// Garbage collection: pass time and objects/s as the store grows (against listing the
    /// store and reading its streams), and storage over time with and without GC.
    Gc(super::bench_gc::BenchGcArgs),
    /// The operator page's charts over time on a store of 1,000 and 100,000 builds, against
    /// one aggregate over the same window's builds.
    Ui(super::bench_ui::BenchUiArgs),
}

#[derive(Debug, Args)]
pub struct EventsBenchArgs {
    /// Concurrent writers in every scenario.
    #[arg(long, default_value_t = 8)]
    writers: usize,
    /// Length of each scenario.
    #[arg(long, default_value_t = 5, value_name = "SECONDS")]
    seconds: u64,
    /// Commit groups in flight at once for the grouped scenario (default: the store's).
    #[arg(long)]
    group_in_flight: Option<usize>,
    #[command(flatten)]
    storage: StorageArgs,
}

/// The profile this binary was built with: figures worth quoting come from `release`.
pub(super) fn build_profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug (figures are not representative; build with --release)"
    } else {
        "release"
    }
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    println!("build profile: {}", build_profile());
    match args.command {
        BenchCommand::Events(args) => run_events(args).await,
        BenchCommand::Sandbox(args) => super::bench_sandbox::run(args).await,
        BenchCommand::Upload(args) => super::bench_upload::run(args).await,
        BenchCommand::Sdk(args) => super::bench_sdk::run(args).await,
        BenchCommand::SandboxApi(args) => super::bench_sandbox_api::run(args).await,
        BenchCommand::Lifecycle(args) => super::bench_lifecycle::run(args).await,
        BenchCommand::Gc(args) => super::bench_gc::run(args).await,
        BenchCommand::Ui(args) => super::bench_ui::run(args).await,
        BenchCommand::Cache(args) => super::bench_cache::run(args).await,
        BenchCommand::Build(args) => super::bench_build::run(args).await,
        BenchCommand::Pull(args) => super::bench_pull::run(args).await,
        BenchCommand::Blobs(args) => super::bench_blobs::run(args).await,
        BenchCommand::Scale(args) => super::bench_scale::run(args).await,
        BenchCommand::ScaleStore(args) => super::bench_scale_store::run(args).await,
    }
}

async fn run_events(args: EventsBenchArgs) -> anyhow::Result<()> {
    let writers = args.writers.max(1);
    let duration = Duration::from_secs(args.seconds.max(1));
    let group_in_flight = args.group_in_flight;
    with_bench_database(&args.storage, |options, where_| async move {
        let pool = bench_pool(options, writers).await?;
        let result = bench_events(&pool, writers, duration, group_in_flight, where_).await;
        pool.close().await;
        result
    })
    .await
}

/// Runs `body` with connection options to a database no service uses: with DATABASE_URL, a
/// schema of its own (`strata_bench_…`, dropped afterwards); without, a throwaway embedded
/// Postgres in a temporary directory. `body` gets the options and a word for where it runs.
pub(super) async fn with_bench_database<F, Fut>(
    storage: &StorageArgs,
    body: F,
) -> anyhow::Result<()>
where
    F: FnOnce(PgConnectOptions, &'static str) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    match storage.database_url.clone() {
        Some(url) => {
            let schema = format!(
                "strata_bench_{}",
                &Uuid::new_v4().simple().to_string()[..12]
            );
            let admin = strata::db::connect(&url, 1)
                .await
                .context("connecting to DATABASE_URL")?;
            sqlx::query(&format!("CREATE SCHEMA {schema}"))
                .execute(&admin)
                .await
                .context("creating the bench schema (needs CREATE on the database)")?;
            let result = async {
                let options = url
                    .parse::<PgConnectOptions>()?
                    .options([("search_path", schema.as_str())]);
                body(options, "DATABASE_URL").await
            }
            .await;
            sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
                .execute(&admin)
                .await
                .context("dropping the bench schema")?;
            result
        }
        None => {
            with_throwaway_postgres(|url| async move {
                body(url.parse::<PgConnectOptions>()?, "embedded").await
            })
            .await
        }
    }
}

/// Runs `body` with the URL of a throwaway embedded Postgres in a temporary directory, stopped
/// (and removed) afterwards whatever `body` returns: the benchmarks' default when
/// DATABASE_URL is unset.
pub(super) async fn with_throwaway_postgres<F, Fut>(body: F) -> anyhow::Result<()>
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let dir = tempfile::Builder::new().prefix("strata-bench-").tempdir()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let pg = EmbeddedPostgres::new(dir.path().join("postgres"), port)?;
    eprintln!(
        "DATABASE_URL is unset: starting a throwaway Postgres in {}",
        dir.path().display()
    );
    pg.start().await.context("starting the embedded Postgres")?;
    let result = body(pg.url(DATABASE_NAME)).await;
    tokio::task::spawn_blocking(move || pg.stop()).await??;
    result
}

pub(super) async fn bench_pool(
    options: PgConnectOptions,
    writers: usize,
) -> anyhow::Result<PgPool> {
    let options = options.log_statements(log::LevelFilter::Trace);
    let pool = PgPoolOptions::new()
        .max_connections(writers as u32 + 2)
        .min_connections(writers as u32 + 2)
        .connect_with(options)
        .await
        .context("connecting the bench pool")?;
    strata::db::migrate(&pool)
        .await
        .context("applying migrations for the bench")?;
    Ok(pool)
}

/// What one writer measured.
#[derive(Default)]
struct WriterStats {
    latencies: Vec<Duration>,
    conflicts: u64,
    retries: u64,
}

struct Scenario {
    name: &'static str,
    ops: usize,
    elapsed: Duration,
    p50: Duration,
    p99: Duration,
    conflicts: Option<u64>,
    retries: Option<u64>,
}

impl Scenario {
    fn per_second(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }
}

async fn measure<F, Fut>(
    name: &'static str,
    writers: usize,
    duration: Duration,
    writer: F,
) -> anyhow::Result<Scenario>
where
    F: Fn(usize, Instant) -> Fut,
    Fut: Future<Output = anyhow::Result<WriterStats>> + Send + 'static,
{
    let start = Instant::now();
    let deadline = start + duration;
    let tasks: Vec<_> = (0..writers)
        .map(|w| tokio::spawn(writer(w, deadline)))
        .collect();
    let mut all = WriterStats::default();
    for task in tasks {
        let stats = task.await??;
        all.latencies.extend(stats.latencies);
        all.conflicts += stats.conflicts;
        all.retries += stats.retries;
    }
    let elapsed = start.elapsed();
    all.latencies.sort();
    let pct = |p: f64| {
        all.latencies
            .get(
                ((all.latencies.len() as f64 * p) as usize)
                    .min(all.latencies.len().saturating_sub(1)),
            )
            .copied()
            .unwrap_or_default()
    };
    Ok(Scenario {
        name,
        ops: all.latencies.len(),
        elapsed,
        p50: pct(0.50),
        p99: pct(0.99),
        conflicts: Some(all.conflicts),
        retries: Some(all.retries),
    })
}

/// Every writer appends one event to a fresh stream, again and again.
async fn distinct_streams(
    name: &'static str,
    store: &EventStore,
    writers: usize,
    duration: Duration,
    prefix: &'static str,
) -> anyhow::Result<Scenario> {
    let store = store.clone();
    let mut s = measure(name, writers, duration, move |w, deadline| {
        let store = store.clone();
        async move {
            let mut stats = WriterStats::default();
            let mut i = 0u64;
            while Instant::now() < deadline {
                let stream = StreamId::parse(format!("bench-{prefix}-{w}-{i}"))?;
                let t = Instant::now();
                let outcome = store
                    .append(vec![StreamWrite::new(
                        stream,
                        ExpectedVersion::NoStream,
                        vec![bench_event(i)],
                    )])
                    .await?;
                stats.latencies.push(t.elapsed());
                stats.retries += u64::from(outcome.attempts - 1);
                i += 1;
            }
            Ok(stats)
        }
    })
    .await?;
    s.conflicts = None;
    Ok(s)
}

fn bench_event(i: u64) -> NewEvent {
    NewEvent {
        event_id: Uuid::now_v7(),
        event_type: "BenchTicked.v1".into(),
        data: serde_json::json!({"i": i, "note": "a small payload, like most events"}),
        metadata: Metadata::new(Actor::new(ActorRole::Cli, "bench")),
    }
}

async fn bench_events(
    pool: &PgPool,
    writers: usize,
    duration: Duration,
    group_in_flight: Option<usize>,
    where_: &str,
) -> anyhow::Result<()> {
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(pool)
        .await?;
    println!(
        "strata bench events: {writers} writers, {} s per scenario, one event per append, Postgres {version} ({where_})",
        duration.as_secs()
    );
    sqlx::query("CREATE TABLE bench_ceiling (id bigint, payload jsonb)")
        .execute(pool)
        .await?;

    let ceiling = {
        let pool = pool.clone();
        let mut s = measure(
            "plain INSERT, unindexed (ceiling)",
            writers,
            duration,
            move |w, deadline| {
                let pool = pool.clone();
                async move {
                    let mut stats = WriterStats::default();
                    let mut i = 0u64;
                    while Instant::now() < deadline {
                        let t = Instant::now();
                        sqlx::query("INSERT INTO bench_ceiling (id, payload) VALUES ($1, $2)")
                            .bind((w as i64) << 40 | i as i64)
                            .bind(bench_event(i).data)
                            .execute(&pool)
                            .await?;
                        stats.latencies.push(t.elapsed());
                        i += 1;
                    }
                    Ok(stats)
                }
            },
        )
        .await?;
        s.conflicts = None;
        s.retries = None;
        s
    };

    let mut store = strata::app::event_store(pool.clone());
    if let Some(max_in_flight) = group_in_flight {
        store = store.with_group_commit(GroupCommitPolicy {
            max_in_flight,
            ..GroupCommitPolicy::default()
        });
    }
    let distinct = distinct_streams(
        "append, distinct streams",
        &store,
        writers,
        duration,
        "grouped",
    )
    .await?;
    let alone = distinct_streams(
        "append, distinct streams, ungrouped",
        &store.clone().with_group_commit(GroupCommitPolicy::off()),
        writers,
        duration,
        "alone",
    )
    .await?;

    let contended = {
        let store = store.clone();
        measure(
            "append, one contended stream",
            writers,
            duration,
            move |_, deadline| {
                let store = store.clone();
                async move {
                    let stream = StreamId::parse("bench-hot")?;
                    let mut stats = WriterStats::default();
                    let mut known = store.stream_version(&stream).await?;
                    let mut i = 0u64;
                    while Instant::now() < deadline {
                        let t = Instant::now();
                        let write = StreamWrite::new(
                            stream.clone(),
                            ExpectedVersion::Exact(known),
                            vec![bench_event(i)],
                        );
                        match store.append(vec![write]).await {
                            Ok(outcome) => {
                                stats.latencies.push(t.elapsed());
                                stats.retries += u64::from(outcome.attempts - 1);
                                known = outcome.version(&stream).unwrap_or(known + 1);
                                i += 1;
                            }
                            Err(AppendError::VersionConflict { actual, .. }) => {
                                stats.conflicts += 1;
                                known = actual;
                            }
                            Err(other) => return Err(other.into()),
                        }
                    }
                    Ok(stats)
                }
            },
        )
        .await?
    };

    let base = ceiling.per_second();
    println!();
    println!(
        "{:<36} {:>10} {:>9} {:>9} {:>10} {:>8} {:>10}",
        "scenario", "ops/s", "p50 ms", "p99 ms", "conflicts", "retries", "vs ceiling"
    );
    for s in [&ceiling, &distinct, &alone, &contended] {
        let opt = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |n| n.to_string());
        println!(
            "{:<36} {:>10.0} {:>9.2} {:>9.2} {:>10} {:>8} {:>10.2}",
            s.name,
            s.per_second(),
            s.p50.as_secs_f64() * 1e3,
            s.p99.as_secs_f64() * 1e3,
            opt(s.conflicts),
            opt(s.retries),
            s.per_second() / base
        );
    }
    println!();
    println!(
        "ops/s counts successful operations; `retries` are serialization-failure re-runs inside append; \
         contended `conflicts` are appends that lost the version race and were re-tried by the writer at the reported version."
    );
    Ok(())
}
