//! Connecting to Postgres and applying the schema.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};

/// The schema, embedded at compile time from `migrations/` (append-only).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// How long a connection may sit idle inside a transaction before the server aborts it.
pub const IDLE_IN_TRANSACTION: &str = "10s";

/// Opens a pool on `url`. Statement logging is turned down to debug so that queries do not
/// flood the service log.
pub async fn connect(url: &str, max_connections: u32) -> Result<PgPool, sqlx::Error> {
    let options: PgConnectOptions = url
        .parse::<PgConnectOptions>()?
        .log_statements(log::LevelFilter::Debug)
        .log_slow_statements(log::LevelFilter::Warn, Duration::from_secs(1))
        // A process stopped inside a transaction (SIGSTOP, a hung node) would hold its row locks
        // and stall every writer of those streams, reconcilers included. No transaction here is
        // ever idle for long, so the server aborts one idle for IDLE_IN_TRANSACTION.
        .options([("idle_in_transaction_session_timeout", IDLE_IN_TRANSACTION)]);
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options)
        .await
}

/// Applies pending migrations. Safe to call from several processes at once: sqlx takes an
/// advisory lock for the duration.
pub async fn migrate(pool: &PgPool) -> Result<(), sqlx::migrate::MigrateError> {
    MIGRATOR.run(pool).await
}

/// This database's identity (migration 0018): a random UUID made once, when the schema was
/// created. The blob store records the identity of the database that owns it, so a garbage
/// collection pass never weighs a store against another database's references (docs/adr/0019).
pub async fn store_identity(pool: &PgPool) -> Result<uuid::Uuid, sqlx::Error> {
    sqlx::query_scalar("SELECT id FROM store_identity")
        .fetch_one(pool)
        .await
}
