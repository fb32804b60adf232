//! `strata bench scale-store`: how the cost of reads and background passes grows with the size
//! of the store. Every operation is timed on a store holding only the probe team's template and
//! build (the same-run baseline), then again after the store is filled with other teams'
//! templates, builds, events and log lines.
//!
//! The probe (a key, a template, its waiting build with a pending upload intent, 1,000 log
//! lines) goes through the real API and event store. The fill copies the probe's own rows with
//! fresh ids in bulk SQL (each filler template and build is the probe's, renamed), so the store
//! holds rows of exactly the shapes the service writes without paying for 100k command runs:
//! per template 10 builds, one in 100 waiting with a pending intent, the rest ready; 10 log lines
//! per build. The database is dropped at the end.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use sqlx::PgPool;
use strata::api::AppState;
use strata::config::{ServeArgs, StorageArgs};
use strata::domain::ids::TeamId;
use strata::domain::team::{ApiKey, Command};
use strata::events::command::{execute, CommandContext};
use strata::events::{
    Actor, ActorRole, EventStore, ExpectedVersion, Metadata, NewEvent, StreamId, StreamWrite,
};
use strata::projections::ProjectionRunner;
use strata::reconcilers::{ReconcileEnv, Reconciler};
use strata::streams::{team_stream, Team};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

#[derive(Debug, Args)]
pub struct BenchScaleStoreArgs {
    /// Templates in the filled store; builds are 10 per template, log lines 10 per build
    /// (10,000 gives 100k builds and 1M log lines; lower it for a quick run).
    #[arg(long, default_value_t = 10_000)]
    templates: u64,
    /// Timed runs of each operation on each store.
    #[arg(long, default_value_t = 200)]
    runs: usize,
    #[command(flatten)]
    storage: StorageArgs,
}

const PROBE_TEAM: &str = "scaleprobe";
const FILL_TEAM: &str = "scalefill";
const PROBE_LOG_LINES: i64 = 1_000;

pub async fn run(args: BenchScaleStoreArgs) -> anyhow::Result<()> {
    if args.templates == 0 || args.runs == 0 {
        bail!("--templates and --runs must be at least 1");
    }
    let work = tempfile::Builder::new()
        .prefix("strata-bench-scale-")
        .tempdir()?;
    let data_dir = work.path().to_path_buf();
    let storage = args.storage.clone();
    super::bench::with_bench_database(&storage, |options, where_| async move {
        let pool = super::bench::bench_pool(options, 8).await?;
        let result = bench_scale(&pool, &data_dir, &args, where_).await;
        pool.close().await;
        result
    })
    .await
}

/// The probe's ids, as the API answered them.
struct Probe {
    key: String,
    template: String,
    build: String,
}

/// p50 and p99 of one operation on one store.
#[derive(Clone, Copy)]
struct Timing {
    p50: Duration,
    p99: Duration,
}

async fn bench_scale(
    pool: &PgPool,
    data_dir: &Path,
    args: &BenchScaleStoreArgs,
    where_: &str,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let serve = ServeArgs {
        listen: addr,
        admin_token: None,
        public_url: Some(format!("http://{addr}")),
        upload_secret: None,
        upload_max_bytes: 1 << 20,
        upload_url_ttl_secs: 3600,
        upload_idle_timeout_secs: 30,
        upload_max_concurrent: 64,
        status_hold_ms: 1500,
        status_max_held: 1024,
        sandbox_start_timeout_secs: 30,
        sandbox_domain: None,
        sandbox_tls_listen: None,
        sandbox_tls_cert: None,
        sandbox_tls_key: None,
        build_waiting_timeout_secs: 24 * 3600,
        build_queue_timeout_secs: 24 * 3600,
        build_cpu_max: strata::domain::build_spec::Ceilings::DEFAULT.cpu_count,
        build_memory_max_mb: strata::domain::build_spec::Ceilings::DEFAULT.memory_mb,
        cache_mode: None,
        sandbox_backend: None,
    };
    let state = AppState::new(pool.clone(), &serve, "bench".into(), data_dir)
        .context("preparing the API")?;
    let shutdown = CancellationToken::new();
    let server = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            axum::serve(listener, strata::api::router(state))
                .with_graceful_shutdown(async move { shutdown.cancelled().await })
                .await
        })
    };
    let result = async {
        let store = strata::app::event_store(pool.clone());
        let client = reqwest::Client::new();
        let base = format!("http://{addr}");
        let probe = make_probe(pool, &client, &base).await?;
        let env = ReconcileEnv {
            store: store.clone(),
            node: "bench-scale".into(),
            blobs: Arc::new(strata::vmm::LocalBlobStore::open(data_dir.join("blobs"))?),
            gc: Default::default(),
            catalog: None,
        };
        println!(
            "strata bench scale-store: {} runs per operation, Postgres {where_}, API on {addr}",
            args.runs
        );
        let empty = measure_all(pool, &store, &env, &client, &base, &probe, args.runs).await?;
        let started = Instant::now();
        let filled = fill(pool, &probe, args.templates).await?;
        println!(
            "filled in {:.1} s: {} templates, {} builds ({} waiting), {} events, {} log lines",
            started.elapsed().as_secs_f64(),
            filled.templates,
            filled.builds,
            filled.waiting,
            filled.events,
            filled.log_lines
        );
        let full = measure_all(pool, &store, &env, &client, &base, &probe, args.runs).await?;
        println!();
        println!(
            "{:<44} {:>10} {:>10} {:>11} {:>11} {:>9}",
            "operation", "empty p50", "empty p99", "filled p50", "filled p99", "p99 ratio"
        );
        for ((name, e), (_, f)) in empty.iter().zip(&full) {
            println!(
                "{:<44} {:>9.2}ms {:>9.2}ms {:>10.2}ms {:>10.2}ms {:>8.2}x",
                name,
                ms(e.p50),
                ms(e.p99),
                ms(f.p50),
                ms(f.p99),
                f.p99.as_secs_f64() / e.p99.as_secs_f64()
            );
        }
        println!();
        println!(
            "empty = the probe team's template and build alone; filled = the same store plus the \
             fill above. Goal: no operation's p99 grows past 1.5x."
        );
        Ok(())
    }
    .await;
    shutdown.cancel();
    let _ = server.await;
    result
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn timing(mut samples: Vec<Duration>) -> Timing {
    samples.sort();
    let at = |p: f64| samples[((samples.len() - 1) as f64 * p).round() as usize];
    Timing {
        p50: at(0.5),
        p99: at(0.99),
    }
}

async fn json_of(response: reqwest::Response, what: &str) -> anyhow::Result<serde_json::Value> {
    let status = response.status();
    let body = response.bytes().await?;
    if !status.is_success() {
        bail!("{what}: {status}: {}", String::from_utf8_lossy(&body));
    }
    serde_json::from_slice(&body).with_context(|| format!("{what}: the body is not JSON"))
}

/// A key, a registered template with its waiting build, an upload link (a pending intent) and
/// log lines, all through the service's own paths (logs straight into their table, as the
/// worker writes them).
async fn make_probe(pool: &PgPool, client: &reqwest::Client, base: &str) -> anyhow::Result<Probe> {
    let key = issue_key(pool).await?;
    let response = client
        .post(format!("{base}/v3/templates"))
        .header("x-api-key", &key)
        .header("content-type", "application/json")
        .body(r#"{"name":"scale-probe"}"#)
        .send()
        .await?;
    let body = json_of(response, "registering the probe template").await?;
    let template = body["templateID"]
        .as_str()
        .context("the registration has no templateID")?
        .to_owned();
    let build = body["buildID"]
        .as_str()
        .context("the registration has no buildID")?
        .to_owned();
    let hash = hex::encode(rand::random::<[u8; 32]>());
    let response = client
        .get(format!("{base}/templates/{template}/files/{hash}"))
        .header("x-api-key", &key)
        .send()
        .await?;
    json_of(response, "requesting an upload link").await?;
    sqlx::query(
        "INSERT INTO build_logs (build_id, seq, logged_at, level, message)
         SELECT $1, s, now(), 'info', 'probe log line ' || s FROM generate_series(0, $2 - 1) s",
    )
    .bind(Uuid::parse_str(&build)?)
    .bind(PROBE_LOG_LINES)
    .execute(pool)
    .await?;
    Ok(Probe {
        key,
        template,
        build,
    })
}

/// A key of the probe team, issued as `strata keys` issues one.
async fn issue_key(pool: &PgPool) -> anyhow::Result<String> {
    let store = strata::app::event_store(pool.clone());
    let ctx = CommandContext::new(Metadata::new(Actor::new(ActorRole::Cli, "bench")));
    let key = ApiKey::from_random(rand::random());
    let command = Command::IssueKey {
        key_id: Uuid::new_v4(),
        key_sha256: key.sha256_hex(),
        prefix: key.display_prefix(),
        now: strata::clock::local_now(),
    };
    let team = TeamId::parse(PROBE_TEAM)?;
    execute::<Team>(&store, &team_stream(&team), &command, &ctx)
        .await
        .context("issuing the probe's key")?;
    Ok(key.expose().to_string())
}

/// Times every operation `runs` times (after one untimed run), in a fixed order.
async fn measure_all(
    pool: &PgPool,
    store: &EventStore,
    env: &ReconcileEnv,
    client: &reqwest::Client,
    base: &str,
    probe: &Probe,
    runs: usize,
) -> anyhow::Result<Vec<(String, Timing)>> {
    sqlx::query("ANALYZE").execute(pool).await?;
    let mut out = Vec::new();
    let status = format!(
        "{base}/templates/{}/builds/{}/status",
        probe.template, probe.build
    );
    let gets = [
        ("status poll (GET …/status)", status.clone()),
        (
            "log paging (GET …/status?logsOffset=900)",
            format!("{status}?logsOffset=900&limit=100"),
        ),
        (
            "template listing (GET /templates)",
            format!("{base}/templates"),
        ),
        (
            "template with builds (GET /templates/{id})",
            format!("{base}/templates/{}", probe.template),
        ),
    ];
    for (name, url) in gets {
        let mut samples = Vec::with_capacity(runs);
        for i in 0..=runs {
            let t = Instant::now();
            let response = client
                .get(&url)
                .header("x-api-key", &probe.key)
                .send()
                .await?;
            json_of(response, name).await?;
            if i > 0 {
                samples.push(t.elapsed());
            }
        }
        out.push((name.to_string(), timing(samples)));
    }
    // GC reads every referencing stream by design (one snapshot of its roots); its growth is
    // what `strata bench gc` measures, at a scale of objects rather than builds.
    for reconciler in Reconciler::ALL.into_iter().filter(|r| *r != Reconciler::Gc) {
        let mut samples = Vec::with_capacity(runs);
        for i in 0..=runs {
            let t = Instant::now();
            reconciler.pass(env).await?;
            if i > 0 {
                samples.push(t.elapsed());
            }
        }
        out.push((format!("reconciler pass: {reconciler}"), timing(samples)));
    }
    // Catch-up of the stream catalog over 100 new events, from a checkpoint at the head.
    let runner = ProjectionRunner::new(
        store.clone(),
        strata::projections::by_name("stream_catalog")?,
    );
    runner.catch_up().await?;
    let rounds = (runs / 2).max(20);
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let writes = (0..100)
            .map(|_| -> anyhow::Result<StreamWrite> {
                Ok(StreamWrite::new(
                    StreamId::parse(format!("scalebench-{}", Uuid::new_v4().simple()))?,
                    ExpectedVersion::NoStream,
                    vec![NewEvent {
                        event_id: Uuid::now_v7(),
                        event_type: "BenchTicked.v1".into(),
                        data: serde_json::json!({"note": "catch-up probe"}),
                        metadata: Metadata::new(Actor::new(ActorRole::Cli, "bench")),
                    }],
                ))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        store.append(writes).await?;
        let t = Instant::now();
        let applied = runner.catch_up().await?;
        samples.push(t.elapsed());
        anyhow::ensure!(applied == 100, "catch-up applied {applied} events, not 100");
    }
    out.push((
        "projection catch-up, 100 events (stream_catalog)".to_string(),
        timing(samples),
    ));
    Ok(out)
}

/// What [`fill`] added.
struct Filled {
    templates: i64,
    builds: i64,
    waiting: i64,
    events: i64,
    log_lines: i64,
}

/// Copies the probe's template and build rows, renamed, into the filler team: `templates`
/// templates with 10 builds each (one build in 100 waiting, with the probe's pending intent;
/// the rest ready) and 10 log lines per build. The stream catalog is filled to match and its
/// checkpoint moved to the head, as a caught-up runner would leave it.
async fn fill(pool: &PgPool, probe: &Probe, templates: u64) -> anyhow::Result<Filled> {
    let template_stream: String = sqlx::query_scalar(
        "SELECT stream_id FROM streams WHERE stream_id LIKE '%' || $1 AND stream_id NOT LIKE 'build%' LIMIT 1",
    )
    .bind(&probe.template)
    .fetch_one(pool)
    .await
    .context("finding the probe's template stream")?;
    let build_stream: String =
        sqlx::query_scalar("SELECT stream_id FROM streams WHERE stream_id LIKE '%' || $1")
            .bind(&probe.build)
            .fetch_one(pool)
            .await
            .context("finding the probe's build stream")?;
    let mut tx = pool.begin().await?;
    for statement in [
        "CREATE TEMP TABLE fill_templates ON COMMIT DROP AS
         SELECT i, left($1, length($1) - 8) || lpad(i::text, 8, '0') AS template_id
         FROM generate_series(1, $2::bigint) i",
        "CREATE TEMP TABLE fill_builds ON COMMIT DROP AS
         SELECT t.i * 10 + j AS n, t.template_id, gen_random_uuid() AS build_id,
                (j = 0 AND t.i % 10 = 0) AS waiting
         FROM fill_templates t, generate_series(0, 9) j",
    ] {
        sqlx::query(statement)
            .bind(&probe.template)
            .bind(templates as i64)
            .execute(&mut *tx)
            .await?;
    }
    let statements = [
        // Template streams and rows.
        "INSERT INTO streams (stream_id, version, created_at, updated_at)
         SELECT replace(s.stream_id, $1, t.template_id), s.version, s.created_at, s.updated_at
         FROM streams s, fill_templates t WHERE s.stream_id = $3",
        "INSERT INTO events (stream_id, version, event_id, type, data, metadata, recorded_at)
         SELECT replace(e.stream_id, $1, t.template_id), e.version, gen_random_uuid(), e.type,
                replace(replace(e.data::text, $1, t.template_id), $5, $6)::jsonb, e.metadata, e.recorded_at
         FROM events e, fill_templates t WHERE e.stream_id = $3 ORDER BY t.i, e.version",
        "INSERT INTO templates (template_id, team_id, names, build_count, latest_build, created_at, updated_at, deleted)
         SELECT t.template_id, $6, ARRAY['fill-' || t.i], 10, NULL, x.created_at, x.updated_at, false
         FROM templates x, fill_templates t WHERE x.template_id = $1",
        // Build streams and rows.
        "INSERT INTO streams (stream_id, version, created_at, updated_at)
         SELECT replace(s.stream_id, $2, b.build_id::text), s.version, s.created_at, s.updated_at
         FROM streams s, fill_builds b WHERE s.stream_id = $4",
        "INSERT INTO events (stream_id, version, event_id, type, data, metadata, recorded_at)
         SELECT replace(e.stream_id, $2, b.build_id::text), e.version, gen_random_uuid(), e.type,
                replace(replace(replace(e.data::text, $2, b.build_id::text), $1, b.template_id), $5, $6)::jsonb,
                e.metadata, e.recorded_at
         FROM events e, fill_builds b WHERE e.stream_id = $4 ORDER BY b.n, e.version",
        "INSERT INTO builds (build_id, template_id, team_id, phase, epoch, node, lease_expires_at, deadline,
                             registered_at, updated_at, stream_version, cpu_count, memory_mb, finished_at)
         SELECT b.build_id, b.template_id, $6, CASE WHEN b.waiting THEN 'waiting' ELSE 'ready' END,
                x.epoch, x.node, x.lease_expires_at, CASE WHEN b.waiting THEN x.deadline END,
                x.registered_at, x.updated_at, x.stream_version, x.cpu_count, x.memory_mb,
                CASE WHEN b.waiting THEN NULL ELSE now() END
         FROM builds x, fill_builds b WHERE x.build_id = $2::uuid",
        "INSERT INTO build_logs (build_id, seq, logged_at, level, message)
         SELECT b.build_id, s, now(), 'info', 'fill log line ' || s
         FROM fill_builds b, generate_series(0, 9) s",
    ];
    for statement in statements {
        sqlx::query(statement)
            .bind(&probe.template)
            .bind(&probe.build)
            .bind(&template_stream)
            .bind(&build_stream)
            .bind(PROBE_TEAM)
            .bind(FILL_TEAM)
            .execute(&mut *tx)
            .await
            .with_context(|| format!("filling the store: {statement}"))?;
    }
    // Read models added by later migrations, filled when present.
    let intents: bool = sqlx::query_scalar("SELECT to_regclass('upload_intents') IS NOT NULL")
        .fetch_one(&mut *tx)
        .await?;
    if intents {
        sqlx::query(
            "INSERT INTO upload_intents (build_id, intent_id, expires_at)
             SELECT b.build_id, u.intent_id, u.expires_at
             FROM upload_intents u, fill_builds b WHERE u.build_id = $1::uuid AND b.waiting",
        )
        .bind(&probe.build)
        .execute(&mut *tx)
        .await?;
    }
    let waiting: i64 = sqlx::query_scalar("SELECT count(*) FROM fill_builds WHERE waiting")
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    // The stream catalog as its runner would have left it, checkpoint at the head.
    sqlx::query(
        "INSERT INTO stream_catalog (stream_id, category, version, event_count, first_recorded_at, last_recorded_at, last_event_type)
         SELECT e.stream_id, split_part(e.stream_id, '-', 1), max(e.version), count(*), min(e.recorded_at), max(e.recorded_at),
                (array_agg(e.type ORDER BY e.version DESC))[1]
         FROM events e GROUP BY e.stream_id
         ON CONFLICT (stream_id) DO NOTHING",
    )
    .execute(pool)
    .await?;
    sqlx::query(
        "UPDATE projection_checkpoints c SET tx_id = h.tx_id, position = h.position, updated_at = now()
         FROM (SELECT tx_id, position FROM events ORDER BY tx_id DESC, position DESC LIMIT 1) h
         WHERE c.name = 'stream_catalog'",
    )
    .execute(pool)
    .await?;
    let count =
        |sql: &'static str| async move { sqlx::query_scalar::<_, i64>(sql).fetch_one(pool).await };
    Ok(Filled {
        templates: count("SELECT count(*) FROM templates WHERE team_id = 'scalefill'").await?,
        builds: count("SELECT count(*) FROM builds WHERE team_id = 'scalefill'").await?,
        waiting,
        events: count("SELECT count(*) FROM events").await?,
        log_lines: count("SELECT count(*) FROM build_logs").await?,
    })
}
