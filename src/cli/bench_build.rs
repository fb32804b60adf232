//! `strata bench build`: `strata build` against `docker build` (BuildKit) on the same Dockerfile,
//! context and base layer, in the same run, each scenario timed for both back to back.
//!
//! strata runs in process on a throwaway database and a temporary node directory seeded from
//! this node's image catalog (only read); `strata build` is this binary, spawned as a user would
//! run it. Docker is a private `dockerd` on a temporary socket and data root with no bridge and
//! no iptables rules (or the daemon `--docker-host` names), with strata's own base layer imported
//! as its image, and builds with `--network=none`. Both are warmed with one untimed build, so a
//! cold build pays for its steps and context, not for unpacking the base.
//!
//! Scenarios, in order, each round with a fresh nonce in the first RUN so that round's cold
//! build shares nothing with the last: cold, unchanged rebuild, last step changed, one context
//! file changed. Reported: the median wall time of each and strata's time over BuildKit's.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use sqlx::PgPool;
use strata::config::StorageArgs;
use strata::vmm::blob_store::LocalBlobStore;
use strata::worker::{Worker, WorkerSettings};

use super::bench_sdk::median;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

#[derive(Debug, Args)]
pub struct BenchBuildArgs {
    /// Rounds of the four scenarios; medians are reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Files in the generated context.
    #[arg(long, default_value_t = 400)]
    files: usize,
    /// Bytes of each context file.
    #[arg(long, default_value_t = 8192)]
    file_bytes: usize,
    /// Base image, from this node's catalog (a one-layer image: Docker imports it as one tar).
    #[arg(long, default_value = "busybox")]
    image: String,
    /// The Docker daemon to compare with (`unix:///run/docker.sock`); by default the bench
    /// starts a private one and stops it at the end.
    #[arg(long)]
    docker_host: Option<String>,
    #[command(flatten)]
    storage: StorageArgs,
}

/// The scenarios, in the order they run within a round.
const SCENARIOS: [&str; 4] = ["cold", "unchanged", "last step changed", "one file changed"];

/// The goals of strata's time over BuildKit's, per scenario.
const GOALS: [f64; 4] = [1.0, 0.3, 0.5, 0.8];

pub async fn run(args: BenchBuildArgs) -> anyhow::Result<()> {
    if args.rounds == 0 || args.files == 0 {
        bail!("--rounds and --files must be at least 1");
    }
    let work = tempfile::Builder::new()
        .prefix("strata-bench-build-")
        .tempdir()
        .context("creating the bench directory")?;
    let node_dir = work.path().join("node");
    let base_blob = tokio::task::block_in_place(|| seed_node(&args, &node_dir))?;
    let docker = match &args.docker_host {
        Some(host) => Docker::existing(host.clone())?,
        None => Docker::start(&work.path().join("docker")).await?,
    };
    let result = async {
        docker.import_base(&args.image, &base_blob).await?;
        let storage = args.storage.clone();
        let args = &args;
        let node_dir = &node_dir;
        let docker = &docker;
        let work = work.path();
        super::bench::with_bench_database(&storage, |options, where_| async move {
            let pool = super::bench::bench_pool(options, 4).await?;
            let result = bench(args, &pool, node_dir, docker, work, where_).await;
            pool.close().await;
            result
        })
        .await
    }
    .await;
    docker.stop().await;
    result
}

/// Seeds `node_dir` with this node's image catalog and returns the path of the base's one
/// layer blob, which Docker imports.
fn seed_node(args: &BenchBuildArgs, node_dir: &Path) -> anyhow::Result<PathBuf> {
    let blobs = LocalBlobStore::open(node_dir.join("blobs"))?;
    strata::vmm::image::copy_images(&args.storage.data_dir, node_dir, &blobs)
        .with_context(|| format!("seeding from {}", args.storage.data_dir.display()))?;
    let catalog = strata::vmm::image::ImageCatalog::open(node_dir)?;
    let image = catalog.get(&args.image).with_context(|| {
        format!(
            "image {} is not in the catalog of {} (run ./scripts/setup.sh, or pass --data-dir)",
            args.image,
            args.storage.data_dir.display()
        )
    })?;
    let [layer] = image.layers.as_slice() else {
        bail!(
            "image {} has {} layers; the bench imports a one-layer base into Docker",
            args.image,
            image.layers.len()
        );
    };
    Ok(blobs.path_of(&layer.digest))
}

async fn bench(
    args: &BenchBuildArgs,
    pool: &PgPool,
    node_dir: &Path,
    docker: &Docker,
    work: &Path,
    where_: &str,
) -> anyhow::Result<()> {
    let store = strata::app::event_store(pool.clone());
    let api = super::bench_upload::start_api(
        pool,
        node_dir,
        (args.files * args.file_bytes) as u64 * 2,
        "local store",
        std::sync::Arc::new(LocalBlobStore::open(node_dir.join("blobs"))?),
    )
    .await?;
    let mut settings = WorkerSettings::new(
        "bench-build",
        node_dir,
        std::env::current_exe().context("locating the strata binary")?,
    );
    settings.poll_interval = Duration::from_millis(20);
    let worker = Worker::new(store.clone(), settings).context("starting the build node")?;
    let shutdown = CancellationToken::new();
    let node = tokio::spawn(worker.run_until(shutdown.clone()));
    let key = super::bench_sdk::issue_key(&store, "bench-build").await?;
    let strata = StrataCli {
        url: api.base.clone(),
        key,
    };
    let result = rounds(args, docker, &strata, work).await;
    shutdown.cancel();
    node.await.context("build node task")??;
    api.shutdown.cancel();
    api.server.await.context("API task")??;
    let times = result?;
    report(args, where_, &times);
    Ok(())
}

/// Seconds per scenario and round: `[scenario][round]`, Docker's and strata's.
struct Times {
    docker: Vec<Vec<f64>>,
    strata: Vec<Vec<f64>>,
}

async fn rounds(
    args: &BenchBuildArgs,
    docker: &Docker,
    strata: &StrataCli,
    work: &Path,
) -> anyhow::Result<Times> {
    let context = work.join("context");
    write_context(&context, args)?;
    // Warm-up: each side unpacks the base once, outside the timings.
    std::fs::write(context.join("Dockerfile"), "FROM busybox\nRUN true\n")?;
    docker.build(&context, "warmup").await?;
    strata.build(&context, "warmup").await?;

    let mut times = Times {
        docker: vec![Vec::new(); SCENARIOS.len()],
        strata: vec![Vec::new(); SCENARIOS.len()],
    };
    for round in 0..args.rounds {
        let nonce = Uuid::new_v4().simple().to_string();
        write_context(&context, args)?;
        for (scenario, name) in SCENARIOS.iter().enumerate() {
            match scenario {
                0 | 1 => std::fs::write(context.join("Dockerfile"), dockerfile(&nonce, "one"))?,
                2 => std::fs::write(context.join("Dockerfile"), dockerfile(&nonce, "two"))?,
                _ => std::fs::write(context.join("src/f0000.txt"), format!("changed {nonce}\n"))?,
            }
            // Alternate who goes first, so neither always builds on a warmer page cache.
            let docker_first = (round + scenario) % 2 == 0;
            for side in if docker_first { [0, 1] } else { [1, 0] } {
                let seconds = if side == 0 {
                    docker.build(&context, "bench").await?
                } else {
                    strata.build(&context, "bench").await?
                };
                let into = if side == 0 {
                    &mut times.docker
                } else {
                    &mut times.strata
                };
                into[scenario].push(seconds);
            }
            eprintln!(
                "round {}/{}: {name}: docker {:.2} s, strata {:.2} s",
                round + 1,
                args.rounds,
                times.docker[scenario][round],
                times.strata[scenario][round]
            );
        }
    }
    Ok(times)
}

/// The bench's Dockerfile: a nonce step, the context, work over it, a last small step.
fn dockerfile(nonce: &str, last: &str) -> String {
    format!(
        "FROM busybox\n\
         RUN echo {nonce} > /nonce\n\
         WORKDIR /app\n\
         COPY src/ ./src/\n\
         RUN find src -type f | sort | xargs cat | sha256sum > sum\n\
         RUN for i in $(seq 1 2000); do echo line $i; done > numbers && gzip -c numbers > numbers.gz\n\
         ENV MODE=bench\n\
         RUN echo {last} > last\n"
    )
}

/// `files` files of `file_bytes` each under `src/`, deterministic per index.
fn write_context(context: &Path, args: &BenchBuildArgs) -> anyhow::Result<()> {
    let src = context.join("src");
    std::fs::create_dir_all(&src)?;
    for i in 0..args.files {
        let line = format!("file {i} of the bench context\n");
        let body: String = line.repeat(args.file_bytes / line.len() + 1);
        std::fs::write(src.join(format!("f{i:04}.txt")), &body[..args.file_bytes])?;
    }
    Ok(())
}

fn report(args: &BenchBuildArgs, where_: &str, times: &Times) {
    println!(
        "strata bench build ({where_}; {} rounds; 7 steps; context {} files x {} B; base {})",
        args.rounds, args.files, args.file_bytes, args.image
    );
    println!(
        "{:<20} {:>12} {:>12} {:>14} {:>6}",
        "scenario", "docker s", "strata s", "strata/docker", "goal"
    );
    for (i, name) in SCENARIOS.iter().enumerate() {
        let docker = median(times.docker[i].clone());
        let strata = median(times.strata[i].clone());
        let ratio = strata / docker;
        println!(
            "{:<20} {:>12.3} {:>12.3} {:>14.2} {:>6} {}",
            name,
            docker,
            strata,
            ratio,
            format!("≤{:.1}", GOALS[i]),
            if ratio <= GOALS[i] { "met" } else { "missed" }
        );
    }
}

/// This binary's `strata build`, pointed at the bench's API.
struct StrataCli {
    url: String,
    key: String,
}

impl StrataCli {
    async fn build(&self, context: &Path, name: &str) -> anyhow::Result<f64> {
        let exe = std::env::current_exe()?;
        let began = Instant::now();
        let out = tokio::process::Command::new(exe)
            .args([
                "build",
                "--progress",
                "quiet",
                "-t",
                name,
                "--url",
                &self.url,
            ])
            .arg(context)
            .env("E2B_API_KEY", &self.key)
            .stdin(Stdio::null())
            .output()
            .await
            .context("running strata build")?;
        let seconds = began.elapsed().as_secs_f64();
        if !out.status.success() {
            bail!(
                "strata build failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(seconds)
    }
}

/// A Docker daemon: a private one this run started, or one the caller named.
struct Docker {
    host: String,
    client: PathBuf,
    daemon: Option<PrivateDaemon>,
}

struct PrivateDaemon {
    child: tokio::process::Child,
    root: PathBuf,
}

impl Docker {
    /// Debian's client matches Debian's daemon; another client on PATH may speak a newer API.
    fn client() -> anyhow::Result<PathBuf> {
        let debian = PathBuf::from("/usr/bin/docker");
        if debian.exists() {
            return Ok(debian);
        }
        which("docker")
            .context("no docker client is installed (scripts/setup.sh installs Debian's docker.io)")
    }

    fn existing(host: String) -> anyhow::Result<Docker> {
        Ok(Docker {
            host,
            client: Self::client()?,
            daemon: None,
        })
    }

    async fn start(root: &Path) -> anyhow::Result<Docker> {
        let dockerd = which("dockerd").context(
            "no dockerd is installed (scripts/setup.sh installs Debian's docker.io), or pass --docker-host",
        )?;
        std::fs::create_dir_all(root)?;
        let sock = root.join("docker.sock");
        let log = std::fs::File::create(root.join("dockerd.log"))?;
        let child = tokio::process::Command::new(dockerd)
            .arg("--data-root")
            .arg(root.join("data"))
            .arg("--exec-root")
            .arg(root.join("exec"))
            .arg("--pidfile")
            .arg(root.join("dockerd.pid"))
            .arg("-H")
            .arg(format!("unix://{}", sock.display()))
            .args(["--bridge=none", "--iptables=false", "--ip6tables=false"])
            .arg("--ip-masq=false")
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .context("starting dockerd")?;
        let docker = Docker {
            host: format!("unix://{}", sock.display()),
            client: Self::client()?,
            daemon: Some(PrivateDaemon {
                child,
                root: root.to_path_buf(),
            }),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if sock.exists() && docker.run(&["info"]).await.is_ok() {
                return Ok(docker);
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let log = std::fs::read_to_string(root.join("dockerd.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(5).collect();
        docker.stop().await;
        bail!(
            "the private dockerd did not answer in 60 s:\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )
    }

    async fn run(&self, args: &[&str]) -> anyhow::Result<()> {
        let out = tokio::process::Command::new(&self.client)
            .args(args)
            .env("DOCKER_HOST", &self.host)
            .env("DOCKER_BUILDKIT", "1")
            .stdin(Stdio::null())
            .output()
            .await
            .context("running docker")?;
        if !out.status.success() {
            bail!(
                "docker {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    async fn import_base(&self, image: &str, blob: &Path) -> anyhow::Result<()> {
        let blob = blob.to_str().context("the blob path is not UTF-8")?;
        self.run(&["import", blob, &format!("{image}:latest")])
            .await
    }

    async fn build(&self, context: &Path, tag: &str) -> anyhow::Result<f64> {
        let context = context.to_str().context("the context path is not UTF-8")?;
        let began = Instant::now();
        self.run(&["build", "--network=none", "-q", "-t", tag, context])
            .await?;
        Ok(began.elapsed().as_secs_f64())
    }

    async fn stop(&self) {
        let Some(daemon) = &self.daemon else { return };
        if let Some(pid) = daemon.child.id() {
            // SIGTERM: dockerd unmounts its layers on the way out.
            // SAFETY: kill(2) on the pid of a child this process spawned and still holds.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
        let pidfile = daemon.root.join("dockerd.pid");
        let deadline = Instant::now() + Duration::from_secs(30);
        while pidfile.exists() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let _ = std::process::Command::new("umount")
            .arg("-R")
            .arg(daemon.root.join("data"))
            .output();
    }
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}
