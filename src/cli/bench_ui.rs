//! `strata bench ui`: what the overview's charts cost server-side as the store grows, against
//! the floor of any chart of the same builds: reading the window's builds once (the same-run
//! baseline). The page's builds list query is printed beside them.
//!
//! For each size the store is filled with that many builds spread evenly over the last day
//! (a tenth failed, ten steps each with a varying cached share, queue waits of up to a
//! second), and a GC pass every five minutes over the last week with its measure. The fill
//! writes the read models the charts read (`builds`, `gc_passes`) in bulk SQL, in the shapes
//! the inline projections write, rather than paying for a million command runs; the charts
//! read nothing else. Timed: the whole "Over time" section (queries and SVG) over 1 h, 24 h
//! and 7 d; one aggregate over the window's finished builds (the floor); the builds list's query
//! for one page; each the median of `--runs`.

use std::time::Instant;

use anyhow::bail;
use clap::Args;
use sqlx::PgPool;
use strata::config::StorageArgs;

#[derive(Debug, Args)]
pub struct BenchUiArgs {
    /// Store sizes (builds) to measure, comma-separated; each adds to the one before.
    #[arg(long, value_delimiter = ',', default_value = "1000,100000")]
    builds: Vec<u64>,
    /// Timed runs of each measurement (the median is printed).
    #[arg(long, default_value_t = 15)]
    runs: usize,
    #[command(flatten)]
    storage: StorageArgs,
}

pub async fn run(args: BenchUiArgs) -> anyhow::Result<()> {
    if args.builds.is_empty() || args.builds.windows(2).any(|w| w[1] <= w[0]) || args.runs == 0 {
        bail!("--builds needs increasing sizes and --runs at least 1");
    }
    let storage = args.storage.clone();
    super::bench::with_bench_database(&storage, |options, where_| async move {
        let pool = super::bench::bench_pool(options, 2).await?;
        let result = bench(&pool, &args, where_).await;
        pool.close().await;
        result
    })
    .await
}

async fn bench(pool: &PgPool, args: &BenchUiArgs, where_: &str) -> anyhow::Result<()> {
    println!("database: {where_}; GC passes: one per 5 minutes over the last 7 days");
    fill_gc_passes(pool).await?;
    println!(
        "{:>9} {:>6} {:>12} {:>12} {:>8} {:>12}",
        "builds", "over", "charts", "floor", "ratio", "list page"
    );
    let mut filled = 0;
    for &size in &args.builds {
        fill_builds(pool, filled, size).await?;
        filled = size;
        sqlx::query("ANALYZE builds").execute(pool).await?;
        let list = time(args.runs, || async {
            let filter = strata::projections::builds::BuildFilter::default();
            strata::projections::builds::list_builds(pool, &filter, 51).await?;
            Ok(())
        })
        .await?;
        for over in ["1h", "24h", "7d"] {
            let (_, span) =
                strata::api::ui::overview::span(Some(over)).map_err(|e| anyhow::anyhow!("{e}"))?;
            let window = strata::api::ui::overview::window(pool, span)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            // The floor: reading the window's builds once, as any chart of them must.
            let floor = time(args.runs, || async {
                sqlx::query(
                    "SELECT count(*), sum(steps_run) FROM builds
                     WHERE finished_at >= $1 AND finished_at < $2",
                )
                .bind(window.from)
                .bind(window.end())
                .fetch_one(pool)
                .await?;
                Ok(())
            })
            .await?;
            let charts = time(args.runs, || async {
                strata::api::ui::overview::over_time(pool, Some(over))
                    .await
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                Ok(())
            })
            .await?;
            println!(
                "{size:>9} {over:>6} {:>9.2} ms {:>9.2} ms {:>7.2}× {:>9.2} ms",
                charts * 1e3,
                floor * 1e3,
                charts / floor,
                list * 1e3,
            );
        }
    }
    Ok(())
}

/// Median seconds of `runs` calls of `f`, after one untimed warm-up call.
async fn time<F, Fut>(runs: usize, f: F) -> anyhow::Result<f64>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    f().await?;
    let mut seconds = Vec::with_capacity(runs);
    for _ in 0..runs {
        let started = Instant::now();
        f().await?;
        seconds.push(started.elapsed().as_secs_f64());
    }
    Ok(super::bench_sdk::median(seconds))
}

/// Builds `from..to` of the fill, spread over the last day by their number.
async fn fill_builds(pool: &PgPool, from: u64, to: u64) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO builds (build_id, template_id, team_id, phase, registered_at, updated_at,
                             stream_version, queued_at, acquired_at, finished_at,
                             steps_cached, steps_run, epoch, node)
         SELECT gen_random_uuid(), 'tpl' || (i % 200), 'team' || (i % 20),
                CASE WHEN i % 10 = 0 THEN 'error' ELSE 'ready' END,
                t, t + interval '20 s', 12, t, t + (i % 11) * interval '100 ms',
                t + interval '20 s', (i * 3) % 11, 10 - (i * 3) % 11, 1, 'bench-node'
         FROM (SELECT i, now() - interval '1 day' * ((i * 7919) % $2)::float8 / $2 AS t
               FROM generate_series($1, $2 - 1) AS i) s",
    )
    .bind(from as i64)
    .bind(to as i64)
    .execute(pool)
    .await?;
    Ok(())
}

/// A measured GC pass every 5 minutes over the last 7 days.
async fn fill_gc_passes(pool: &PgPool) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO gc_passes (pass_id, node, started_at, ended_at, total_bytes, budget_bytes,
                                deleted_objects, deleted_bytes, classes)
         SELECT 'gc-bench-' || i, 'bench-node', t, t + interval '2 s', total, 64::int8 << 30, i % 3,
                (i % 3) * (1 << 20),
                jsonb_build_object('rooted', jsonb_build_object('objects', 1000, 'bytes', total / 2),
                                   'superseded-checkpoint', jsonb_build_object('objects', 500, 'bytes', total / 2))
         FROM (SELECT i, now() - interval '5 min' * i AS t,
                      (40::int8 << 30) + (i % 100)::int8 * (100 << 20) AS total
               FROM generate_series(0, 7 * 24 * 12) AS i) s",
    )
    .execute(pool)
    .await?;
    Ok(())
}
