//! Glue between the command line and the library: parse settings, open connections, wait for
//! shutdown. Errors here are `anyhow`, with context that reads like a sentence.

pub mod api;
pub mod bench;
pub mod bench_blobs;
pub mod bench_build;
pub mod bench_cache;
pub mod bench_gc;
pub mod bench_lifecycle;
pub mod bench_probe;
pub mod bench_proxied;
pub mod bench_pull;
pub mod bench_sandbox;
pub mod bench_sandbox_api;
pub mod bench_scale;
pub mod bench_scale_store;
pub mod bench_sdk;
pub mod bench_ui;
pub mod bench_upload;
pub mod build;
pub mod build_client;
pub mod gc;
pub mod history;
pub mod image;
pub mod keys;
pub mod migrate;
pub mod progress;
pub mod projections;
pub mod reconcile;
pub mod sandbox;
pub mod sandboxes;
pub mod settings;
pub mod template;
pub mod up;
pub mod why;
pub mod worker;

use anyhow::Context;
use sqlx::PgPool;
use strata::config::StorageArgs;

/// Connects to `DATABASE_URL`, or else to the embedded Postgres a running `strata up` keeps in
/// the data directory. The roles other than `up` never start a database themselves.
pub async fn connect_database(storage: &StorageArgs) -> anyhow::Result<PgPool> {
    let url = match &storage.database_url {
        Some(url) => url.clone(),
        None => strata::embedded_postgres::running_url(&storage.data_dir.join("postgres"))
            .with_context(|| {
                format!(
                    "DATABASE_URL is not set and no `strata up` is running with data directory {}: \
                     point DATABASE_URL at Postgres, or start `strata up`",
                    storage.data_dir.display()
                )
            })?,
    };
    strata::db::connect(&url, storage.db_pool_size)
        .await
        .context("connecting to Postgres")
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutdown requested");
}
