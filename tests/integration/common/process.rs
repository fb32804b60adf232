//! `strata worker` and `strata reconcile` as child processes, for tests that kill, stop or
//! starve them, and a database outage a test can switch on and off.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::sandbox::node_dir;

/// A child in a process group of its own, its stderr in a log file. Dropping it SIGKILLs the
/// whole group (its sandboxes included) and sweeps what a killed strata cannot remove itself:
/// its sandboxes' directories and mounted spare disks in its data directory, which no later
/// strata may start on to sweep (a temporary one never is).
pub struct Proc {
    child: Child,
    log: PathBuf,
    data_dir: PathBuf,
}

impl Proc {
    pub fn spawn(args: &[&str], db_url: &str, node: &str, env: &[(&str, &str)]) -> Proc {
        let log = std::env::temp_dir().join(format!(
            "strata-proc-{node}-{}.log",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ));
        let mut cmd = Command::new(super::strata_bin());
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        cmd.args(args)
            .env("DATABASE_URL", db_url)
            .env("STRATA_DATA_DIR", node_dir())
            .env("STRATA_NODE_ID", node)
            .env("RUST_LOG", "strata=info")
            // GC on the shared test node would weigh other tests' blobs against this database.
            .env("STRATA_GC_SCHEDULE", "off")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        let mut data_dir = node_dir();
        for (k, v) in env {
            cmd.env(k, v);
            if *k == "STRATA_DATA_DIR" {
                data_dir = PathBuf::from(v);
            }
        }
        Proc {
            child: cmd.spawn().unwrap(),
            log,
            data_dir,
        }
    }

    /// A worker with one slot and a `lease_secs` lease; `env` adds fault points.
    pub fn worker(db_url: &str, node: &str, lease_secs: u64, env: &[(&str, &str)]) -> Proc {
        let lease = lease_secs.to_string();
        let mut all = vec![
            ("STRATA_LEASE_SECS", lease.as_str()),
            ("STRATA_MAX_BUILDS", "1"),
            ("STRATA_QUEUE_POLL_MS", "200"),
        ];
        all.extend_from_slice(env);
        Proc::spawn(&["worker"], db_url, node, &all)
    }

    /// `strata reconcile --only NAME...`.
    pub fn reconciler(db_url: &str, node: &str, only: &[&str], env: &[(&str, &str)]) -> Proc {
        let mut args = vec!["reconcile"];
        for name in only {
            args.extend(["--only", name]);
        }
        Proc::spawn(&args, db_url, node, env)
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Waits until the process stopped itself (a `STRATA_FAULT_STOP_AT` point), or died.
    pub async fn wait_stopped(&mut self, limit: Duration) {
        let start = Instant::now();
        loop {
            let stat =
                std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap_or_default();
            // The state follows the parenthesised command name.
            let state = stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next());
            if state == Some(Some('T')) {
                return;
            }
            assert!(
                self.child.try_wait().unwrap().is_none(),
                "the process exited before its stop point:\n{}",
                self.stderr()
            );
            assert!(
                start.elapsed() < limit,
                "the process did not reach its stop point:\n{}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the process exited (a `STRATA_FAULT_CRASH_AT` point).
    pub async fn wait_exit(&mut self, limit: Duration) {
        let start = Instant::now();
        while self.child.try_wait().unwrap().is_none() {
            assert!(
                start.elapsed() < limit,
                "the process did not exit:\n{}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on a child we spawned and have not reaped.
        assert_eq!(unsafe { libc::kill(self.pid(), signal) }, 0);
    }

    /// Waits for the process to exit and reaps it.
    pub fn reap(&mut self) {
        let _ = self.child.wait();
    }

    pub fn exited(&mut self) -> bool {
        self.child.try_wait().unwrap().is_some()
    }

    pub fn resume(&self) {
        // SAFETY: kill(2) on a child we spawned and have not reaped.
        assert_eq!(unsafe { libc::kill(self.pid(), libc::SIGCONT) }, 0);
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the process group this child leads (created at spawn).
        unsafe { libc::kill(-self.pid(), libc::SIGKILL) };
        let _ = self.child.wait();
        sweep_dead(&self.data_dir);
        if std::thread::panicking() {
            let stderr = self.stderr();
            let tail: Vec<&str> = stderr.lines().rev().take(40).collect();
            eprintln!(
                "--- {} (last lines, newest first) ---\n{}",
                self.log.display(),
                tail.join("\n")
            );
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Sweeps the sandboxes of every dead strata in `data_dir`: what a killed process could not
/// remove itself (mounted spare disks, their loop devices, directories). Live owners' (other
/// tests on the shared node) are left alone.
pub fn sweep_dead(data_dir: &std::path::Path) {
    strata::vmm::namespace::sweep::sweep_dead_owners(
        &data_dir.join("sandboxes"),
        &strata::vmm::namespace::cgroup::CgroupDriver::detect(),
        "",
    );
}

/// A real outage of one test database: while on, the server refuses new connections to it and
/// every open one (the test's own pools included) is terminated, so each query fails at once
/// with a database error. Other databases on the shared server are untouched.
pub struct Outage {
    admin: sqlx::PgPool,
    database: String,
    on: bool,
}

impl Outage {
    pub async fn begin(database: &str) -> Outage {
        let admin_url = tokio::task::spawn_blocking(super::server_admin_url)
            .await
            .unwrap();
        let admin = strata::db::connect(&admin_url, 1).await.unwrap();
        sqlx::query(&format!(
            "ALTER DATABASE \"{database}\" ALLOW_CONNECTIONS false"
        ))
        .execute(&admin)
        .await
        .unwrap();
        sqlx::query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = $1 AND pid <> pg_backend_pid()",
        )
        .bind(database)
        .execute(&admin)
        .await
        .unwrap();
        Outage {
            admin,
            database: database.to_owned(),
            on: true,
        }
    }

    pub async fn end(mut self) {
        sqlx::query(&format!(
            "ALTER DATABASE \"{}\" ALLOW_CONNECTIONS true",
            self.database
        ))
        .execute(&self.admin)
        .await
        .unwrap();
        self.on = false;
    }
}

impl Drop for Outage {
    fn drop(&mut self) {
        if self.on {
            eprintln!(
                "database {} left refusing connections by a failed test",
                self.database
            );
        }
    }
}
