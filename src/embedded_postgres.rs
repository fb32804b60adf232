//! A local Postgres cluster that strata creates and runs itself, for the one-command default
//! (`strata up` without `DATABASE_URL`) and for the test harness.
//!
//! The cluster lives in a directory of its own and is driven with the system's own `initdb` and
//! `pg_ctl`. It listens on no TCP address at all: only on a Unix socket in that directory, which
//! is `0700` and owned by the server's user, so only root and that user reach it. Its `trust`
//! authentication is then the file system's: a build step, another host account or anything
//! on the network cannot log in (a step used to, as the superuser, over loopback). Postgres refuses to run as root, so when strata runs
//! as root the cluster is owned by and run as the `postgres` system user (created by the
//! distribution's package).

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use thiserror::Error;

/// Name of the database strata uses inside an embedded cluster.
pub const DATABASE_NAME: &str = "strata";

#[derive(Debug, Error)]
pub enum EmbeddedPostgresError {
    #[error(
        "no Postgres server binaries found (looked for initdb and pg_ctl in /usr/lib/postgresql/*/bin and on PATH); \
         install them with `apt-get install postgresql`, or set DATABASE_URL to use an existing server"
    )]
    BinariesNotFound,
    #[error(
        "running as root, but there is no `postgres` system user to own the embedded cluster; \
         install the `postgresql` package (it creates the user) or set DATABASE_URL"
    )]
    NoPostgresUser,
    #[error("{step} failed ({status}): {stderr}")]
    CommandFailed {
        step: &'static str,
        status: String,
        stderr: String,
    },
    #[error("embedded Postgres did not become ready within {0:?}; see {1}")]
    NotReady(Duration, PathBuf),
    #[error("I/O error while {doing} {path}: {source}")]
    Io {
        doing: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

type Result<T> = std::result::Result<T, EmbeddedPostgresError>;

/// Who runs the server processes: the current user, or (when we are root) `postgres`.
#[derive(Debug, Clone, Copy)]
struct RunAs {
    uid: u32,
    gid: u32,
}

/// A running (or about to run) cluster in `dir`. Stopping is explicit: [`EmbeddedPostgres::stop`].
#[derive(Debug)]
pub struct EmbeddedPostgres {
    /// Cluster directory (`PGDATA`), also holding the log file and the socket.
    dir: PathBuf,
    /// Directory with `initdb`, `pg_ctl`, `postgres`.
    bin_dir: PathBuf,
    port: u16,
    run_as: Option<RunAs>,
}

impl EmbeddedPostgres {
    /// Describes the cluster in `dir` listening on `port`; nothing is started yet.
    pub fn new(dir: impl Into<PathBuf>, port: u16) -> Result<Self> {
        let bin_dir = find_bin_dir().ok_or(EmbeddedPostgresError::BinariesNotFound)?;
        let run_as = if rustix::process::geteuid().is_root() {
            Some(postgres_user().ok_or(EmbeddedPostgresError::NoPostgresUser)?)
        } else {
            None
        };
        Ok(Self {
            dir: dir.into(),
            bin_dir,
            port,
            run_as,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn data_dir(&self) -> &Path {
        &self.dir
    }

    /// Connection URL for `database` on this cluster: its Unix socket (`host=` names the
    /// socket's directory; the port names the socket file).
    pub fn url(&self, database: &str) -> String {
        socket_url(&self.dir, self.port, database)
    }

    /// The socket file the server listens on.
    pub fn socket(&self) -> PathBuf {
        self.dir.join(format!(".s.PGSQL.{}", self.port))
    }

    fn log_file(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    fn pgdata(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// Whether a server is already running on this cluster directory.
    pub fn is_running(&self) -> bool {
        self.pg_ctl(["status"])
            .map(|o| o.status.success())
            .unwrap_or(false)
    }

    /// Creates the cluster if it does not exist, starts it if it is not running, waits until it
    /// accepts connections and makes sure the `strata` database exists. Idempotent.
    pub async fn start(&self) -> Result<()> {
        let this = self.clone_desc();
        tokio::task::spawn_blocking(move || this.start_blocking())
            .await
            .expect("embedded postgres start task panicked")
    }

    /// Blocking body of [`Self::start`], also used by the test harness under a file lock.
    pub fn start_blocking(&self) -> Result<()> {
        self.prepare_dir()?;
        if !self.pgdata().join("PG_VERSION").exists() {
            tracing::info!(dir = %self.pgdata().display(), "creating embedded Postgres cluster");
            let out = self.run(
                self.bin_dir.join("initdb"),
                [
                    OsStr::new("-D"),
                    self.pgdata().as_os_str(),
                    OsStr::new("-U"),
                    OsStr::new("postgres"),
                    OsStr::new("--auth=trust"),
                    OsStr::new("--encoding=UTF8"),
                    OsStr::new("--no-sync"),
                ],
            )?;
            check("initdb", out)?;
        }
        if !self.is_running() {
            tracing::info!(port = self.port, "starting embedded Postgres");
            let opts = format!(
                "-c listen_addresses='' -p {} -k {} -c unix_socket_permissions=0700 -c max_connections=300 -c fsync=on -c shared_buffers=128MB",
                self.port,
                self.dir.display()
            );
            let out = self.pg_ctl([
                OsStr::new("start"),
                OsStr::new("-w"),
                OsStr::new("-t"),
                OsStr::new("60"),
                OsStr::new("-l"),
                self.log_file().as_os_str(),
                OsStr::new("-o"),
                OsStr::new(&opts),
            ])?;
            check("pg_ctl start", out)?;
        }
        self.wait_ready(Duration::from_secs(60))?;
        self.ensure_database(DATABASE_NAME)?;
        Ok(())
    }

    /// Stops the server (fast shutdown: open transactions are rolled back). Idempotent.
    pub fn stop(&self) -> Result<()> {
        if !self.is_running() {
            return Ok(());
        }
        tracing::info!("stopping embedded Postgres");
        let out = self.pg_ctl(["stop", "-m", "fast", "-w", "-t", "60"])?;
        check("pg_ctl stop", out)
    }

    /// Creates `name` if it is missing, through the bundled `psql`.
    pub fn ensure_database(&self, name: &str) -> Result<()> {
        let exists = self.psql(&format!(
            "SELECT 1 FROM pg_database WHERE datname = '{}'",
            name.replace('\'', "''")
        ))?;
        if exists.trim() != "1" {
            self.psql(&format!(
                "CREATE DATABASE \"{}\"",
                name.replace('"', "\"\"")
            ))?;
        }
        Ok(())
    }

    /// Runs one SQL statement on the `postgres` database and returns its unaligned output.
    pub fn psql(&self, sql: &str) -> Result<String> {
        let psql = self.bin_dir.join("psql");
        let psql = if psql.exists() {
            psql
        } else {
            PathBuf::from("psql")
        };
        let out = Command::new(psql)
            .args(["-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(&self.dir)
            .args([
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-c",
                sql,
            ])
            .output()
            .map_err(|source| EmbeddedPostgresError::Io {
                doing: "running psql in",
                path: self.dir.clone(),
                source,
            })?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        check("psql", out)?;
        Ok(stdout)
    }

    fn wait_ready(&self, limit: Duration) -> Result<()> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            if std::os::unix::net::UnixStream::connect(self.socket()).is_ok()
                && self.psql("SELECT 1").is_ok()
            {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                return Err(EmbeddedPostgresError::NotReady(limit, self.log_file()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The cluster directory must be owned by the server's user; every parent must be
    /// traversable by it.
    fn prepare_dir(&self) -> Result<()> {
        let io = |doing, path: &Path| {
            let path = path.to_path_buf();
            move |source| EmbeddedPostgresError::Io {
                doing,
                path,
                source,
            }
        };
        std::fs::create_dir_all(&self.dir).map_err(io("creating", &self.dir))?;
        if let Some(run_as) = self.run_as {
            let mut p = self.dir.parent();
            while let Some(dir) = p {
                if let Ok(meta) = std::fs::metadata(dir) {
                    let mode = meta.permissions().mode();
                    if mode & 0o001 == 0 {
                        let mut perms = meta.permissions();
                        perms.set_mode(mode | 0o001);
                        std::fs::set_permissions(dir, perms)
                            .map_err(io("making traversable", dir))?;
                    }
                }
                p = dir.parent();
            }
            std::os::unix::fs::chown(&self.dir, Some(run_as.uid), Some(run_as.gid))
                .map_err(io("chowning", &self.dir))?;
        }
        // The socket lives here: whoever can enter the directory can log in.
        std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700))
            .map_err(io("setting mode of", &self.dir))?;
        Ok(())
    }

    fn pg_ctl<I, S>(&self, args: I) -> Result<Output>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut all: Vec<std::ffi::OsString> = vec!["-D".into(), self.pgdata().into()];
        all.extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self.run(self.bin_dir.join("pg_ctl"), all)
    }

    fn run<I, S>(&self, program: PathBuf, args: I) -> Result<Output>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = Command::new(&program);
        cmd.args(args).current_dir(&self.dir);
        // The server must not inherit our stdout/stderr: a `strata up` piped to a pager would
        // otherwise keep the pipe open after we exit.
        cmd.stdin(std::process::Stdio::null());
        if let Some(run_as) = self.run_as {
            cmd.uid(run_as.uid).gid(run_as.gid);
            cmd.env("HOME", &self.dir);
        }
        cmd.output().map_err(|source| EmbeddedPostgresError::Io {
            doing: "running",
            path: program,
            source,
        })
    }

    fn clone_desc(&self) -> Self {
        Self {
            dir: self.dir.clone(),
            bin_dir: self.bin_dir.clone(),
            port: self.port,
            run_as: self.run_as,
        }
    }
}

/// The URL of the `strata` database on the embedded cluster in `dir`, when its server runs
/// (read from the server's `postmaster.pid`, whose fourth line is the port).
pub fn running_url(dir: &Path) -> Option<String> {
    let pid_file = std::fs::read_to_string(dir.join("data").join("postmaster.pid")).ok()?;
    let port: u16 = pid_file.lines().nth(3)?.trim().parse().ok()?;
    std::os::unix::net::UnixStream::connect(dir.join(format!(".s.PGSQL.{port}"))).ok()?;
    Some(socket_url(dir, port, DATABASE_NAME))
}

/// `postgres://postgres@localhost/DB?host=DIR&port=PORT`: the Unix socket `DIR/.s.PGSQL.PORT`,
/// as both sqlx and libpq read it.
fn socket_url(dir: &Path, port: u16, database: &str) -> String {
    let mut host = String::new();
    for b in dir.display().to_string().bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'/' | b'-' | b'_' | b'.' | b'~' => {
                host.push(b as char)
            }
            _ => host.push_str(&format!("%{b:02X}")),
        }
    }
    format!("postgres://postgres@localhost/{database}?host={host}&port={port}")
}

fn check(step: &'static str, out: Output) -> Result<()> {
    if out.status.success() {
        return Ok(());
    }
    let mut stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if stderr.is_empty() {
        stderr = String::from_utf8_lossy(&out.stdout).trim().to_string();
    }
    Err(EmbeddedPostgresError::CommandFailed {
        step,
        status: out.status.to_string(),
        stderr,
    })
}

/// The newest `/usr/lib/postgresql/N/bin` with `initdb`, else the directory of `initdb` on PATH.
fn find_bin_dir() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Some(bin);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .find(|dir| dir.join("initdb").exists() && dir.join("pg_ctl").exists())
}

fn postgres_user() -> Option<RunAs> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        if fields.len() < 4 || fields[0] != "postgres" {
            return None;
        }
        Some(RunAs {
            uid: fields[2].parse().ok()?,
            gid: fields[3].parse().ok()?,
        })
    })
}
