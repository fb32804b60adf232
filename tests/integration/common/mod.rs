//! The one harness every integration test shares.
//!
//! * Postgres: `STRATA_TEST_DATABASE_URL` (an admin URL to an existing server) when set;
//!   otherwise an embedded cluster in `/tmp/strata-test-pg`, started on first use and reused by
//!   every later test process (a file lock serializes the start).
//! * Each test gets a fresh database, cloned from a template database that has the current
//!   migrations applied (named by their checksums, so a new migration makes a new template).
//! * A temporary data directory per test.
//! * Test databases stay until `scripts/test.sh` removes the cluster after the run: dropping one
//!   forces a checkpoint while holding a transaction id, which holds back the cluster-wide feed
//!   horizon that concurrent tests read below.
#![allow(dead_code)]

pub mod api;
pub mod build_api;
pub mod chromium;
pub mod db_proxy;
pub mod http_build;
pub mod outside;
pub mod process;
pub mod publishing;
pub mod registry;
pub mod sandbox;
pub mod torn_blob;
pub mod worker_fixture;

use std::os::fd::AsRawFd;
use std::path::PathBuf;

use sha2::{Digest, Sha256};
use sqlx::PgPool;
use strata::embedded_postgres::EmbeddedPostgres;

/// Port of the shared embedded test cluster.
const TEST_PG_PORT: u16 = 54330;
const TEST_PG_DIR: &str = "/tmp/strata-test-pg";

/// A fresh, migrated database for one test.
pub struct TestDb {
    pub pool: PgPool,
    /// URL of this test's database, for child processes.
    pub url: String,
    pub name: String,
}

/// An admin URL (database `postgres`) on the shared server, starting it if needed.
pub fn server_admin_url() -> String {
    if let Ok(url) = std::env::var("STRATA_TEST_DATABASE_URL") {
        return url;
    }
    let pg = EmbeddedPostgres::new(TEST_PG_DIR, TEST_PG_PORT).expect("embedded Postgres for tests");
    std::fs::create_dir_all("/tmp").ok();
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open("/tmp/strata-test-pg.lock")
        .expect("open the test Postgres lock file");
    // SAFETY: flock on a file descriptor we own; released when `lock` is dropped.
    unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
    if !pg.is_running() {
        pg.start_blocking()
            .expect("start the embedded test Postgres");
    }
    drop(lock);
    pg.url("postgres")
}

fn with_database(url: &str, database: &str) -> String {
    let (path, query) = match url.split_once('?') {
        Some((path, q)) => (path, format!("?{q}")),
        None => (url, String::new()),
    };
    let (base, _) = path.rsplit_once('/').expect("database URL has a path");
    format!("{base}/{database}{query}")
}

fn template_name() -> String {
    let mut hasher = Sha256::new();
    for migration in strata::db::MIGRATOR.iter() {
        hasher.update(migration.version.to_le_bytes());
        hasher.update(&migration.checksum);
    }
    format!("strata_tpl_{}", &hex::encode(hasher.finalize())[..16])
}

/// Creates the migrated template database once per migration set.
async fn ensure_template(admin: &PgPool, admin_url: &str) -> String {
    let name = template_name();
    let mut conn = admin.acquire().await.expect("admin connection");
    // Serializes template creation across concurrently starting test processes.
    sqlx::query("SELECT pg_advisory_lock(727272)")
        .execute(&mut *conn)
        .await
        .unwrap();
    let exists: Option<i32> = sqlx::query_scalar("SELECT 1 FROM pg_database WHERE datname = $1")
        .bind(&name)
        .fetch_optional(&mut *conn)
        .await
        .unwrap();
    if exists.is_none() {
        let building = format!("{name}_building");
        sqlx::query(&format!("DROP DATABASE IF EXISTS \"{building}\""))
            .execute(&mut *conn)
            .await
            .unwrap();
        sqlx::query(&format!("CREATE DATABASE \"{building}\""))
            .execute(&mut *conn)
            .await
            .unwrap();
        let pool = strata::db::connect(&with_database(admin_url, &building), 2)
            .await
            .expect("connect to the template database");
        strata::db::migrate(&pool)
            .await
            .expect("migrate the template database");
        pool.close().await;
        // Postgres renames no database a session is in, and waits 5 s for each to go: a closed
        // pool's server processes may still be exiting, and an autovacuum worker may have
        // started on the new tables. Nobody else has a use for this database: end them.
        let rename = format!("ALTER DATABASE \"{building}\" RENAME TO \"{name}\"");
        let mut tries = 0;
        loop {
            sqlx::query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = $1 AND pid <> pg_backend_pid()",
            )
            .bind(&building)
            .execute(&mut *conn)
            .await
            .unwrap();
            match sqlx::query(&rename).execute(&mut *conn).await {
                Ok(_) => break,
                Err(e) => {
                    tries += 1;
                    assert!(tries < 5, "renaming the template database: {e}");
                }
            }
        }
    }
    sqlx::query("SELECT pg_advisory_unlock(727272)")
        .execute(&mut *conn)
        .await
        .unwrap();
    name
}

/// A fresh database for this test, with every migration applied.
pub async fn test_db() -> TestDb {
    let admin_url = tokio::task::spawn_blocking(server_admin_url).await.unwrap();
    let admin = strata::db::connect(&admin_url, 2)
        .await
        .expect("connect to the test server");
    let template = ensure_template(&admin, &admin_url).await;
    let name = format!("strata_test_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(&format!(
        "CREATE DATABASE \"{name}\" TEMPLATE \"{template}\""
    ))
    .execute(&admin)
    .await
    .expect("create the test database");
    admin.close().await;
    let url = with_database(&admin_url, &name);
    let pool = strata::db::connect(&url, 40)
        .await
        .expect("connect to the test database");
    // A clone carries its template's identity (migration 0018); every test database is a
    // database of its own, as one made by running the migrations would be.
    sqlx::query("UPDATE store_identity SET id = gen_random_uuid()")
        .execute(&pool)
        .await
        .expect("give the test database an identity of its own");
    TestDb { pool, url, name }
}

/// A temporary data directory, removed when dropped.
pub fn data_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("strata-test-")
        .tempdir()
        .expect("temporary data directory")
}

/// Path of the `strata` binary built for this test run.
pub fn strata_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_strata"))
}

/// A fresh database with the migrations up to and including `version` applied, for tests of a
/// later migration against data written under the older schema.
pub async fn test_db_at_migration(version: i64) -> TestDb {
    let admin_url = tokio::task::spawn_blocking(server_admin_url).await.unwrap();
    let admin = strata::db::connect(&admin_url, 2)
        .await
        .expect("connect to the test server");
    let name = format!("strata_test_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(&format!("CREATE DATABASE \"{name}\""))
        .execute(&admin)
        .await
        .expect("create the test database");
    admin.close().await;
    let url = with_database(&admin_url, &name);
    let pool = strata::db::connect(&url, 10)
        .await
        .expect("connect to the test database");
    let older = sqlx::migrate::Migrator {
        migrations: std::borrow::Cow::Owned(
            strata::db::MIGRATOR
                .iter()
                .filter(|m| m.version <= version)
                .cloned()
                .collect(),
        ),
        ignore_missing: false,
        locking: true,
        no_tx: false,
    };
    older.run(&pool).await.expect("apply the older migrations");
    TestDb { pool, url, name }
}

/// Runs one README line with `sh -c`, the strata binary under test first on `PATH` and `env`
/// set, and returns what it printed: it must succeed and print something.
pub async fn run_readme_line(line: &str, env: &[(&str, &str)]) -> String {
    let path = format!(
        "{}:{}",
        strata_bin().parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = tokio::process::Command::new("sh")
        .args(["-c", line])
        .env("PATH", &path)
        .envs(env.iter().copied())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && !stdout.trim().is_empty(),
        "{line}\nstdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The shell lines (comments and blank lines left out) of the first `sh` block in README.md's
/// section whose heading starts with `heading`: README examples are run as written.
pub fn readme_sh_block(heading: &str) -> Vec<String> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with(heading))
        .unwrap_or_else(|| panic!("README has a section {heading:?}"));
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .unwrap_or_else(|| panic!("README's {heading:?} section has a sh block"));
    block
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect()
}
