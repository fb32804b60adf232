//! Glue between the command line and the library: parse settings, open connections, wait for
//! shutdown. Errors here are `anyhow`, with context that reads like a sentence.

pub mod api;
pub mod bench;
pub mod bench_sandbox;
pub mod history;
pub mod image;
pub mod migrate;
pub mod projections;
pub mod reconcile;
pub mod sandbox;
pub mod template;
pub mod up;
pub mod worker;

use anyhow::Context;
use sqlx::PgPool;
use strata::config::StorageArgs;

/// Connects to `DATABASE_URL`; the roles other than `up` never start a database themselves.
pub async fn connect_database(storage: &StorageArgs) -> anyhow::Result<PgPool> {
    let url = storage.database_url.as_deref().context(
        "DATABASE_URL is not set: point it at Postgres, or use `strata up`, which starts a local one",
    )?;
    strata::db::connect(url, storage.db_pool_size)
        .await
        .context("connecting to Postgres at DATABASE_URL")
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
