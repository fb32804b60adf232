//! `strata bench upload`: context-archive ingest through the real HTTP path, next to
//! `openssl dgst -sha256` of the same file in the same run.
//!
//! The API runs in-process on a loopback port over a throwaway database (see
//! [`super::bench::with_bench_database`]); a team key is issued, a build registered and an
//! upload link requested exactly as the SDK does, then the archive is PUT with an explicit
//! Content-Length. The PUT is timed from the first byte sent to the 200, so it includes hashing,
//! writing, fsync, publishing and the compare-and-set that binds it.
//!
//! Two clients send it, in turn: reqwest streaming the file (what most clients do), and a
//! plain HTTP/1.1 client that hands the file to the socket with `sendfile`. A real client runs
//! on another machine; here it shares the server's cores, and reading the file through tokio's
//! blocking pool and copying it into the socket took about a tenth of the run's CPU. The
//! sendfile client's row is the server's ingest with the least of the client on its cores.
//!
//! Baselines, same run: one core hashing the same (page-cached) file with openssl: the speed the
//! server's own digest cannot beat; and a plain copy of the file made durable with fdatasync on
//! the same filesystem (the disk's share, which the upload also pays). Each side runs `--repeat` times; medians are reported.
//!
//! `--store s3` adds a second API in the same run whose blob store is an S3 bucket: the one
//! `STRATA_BLOB_URL` names (with its `AWS_*` settings), else a bucket on a local S3-protocol
//! server started for the run (moto, `scripts/setup.sh`). Its row sits beside the local store's.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use sqlx::PgPool;
use strata::api::AppState;
use strata::app::CommandContext;
use strata::config::{ServeArgs, StorageArgs};
use strata::domain::ids::Digest;
use strata::domain::ids::TeamId;
use strata::events::{Actor, ActorRole, Metadata};
use strata::vmm::BlobStore;
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Args)]
pub struct BenchUploadArgs {
    /// Archive size in MiB.
    #[arg(long, default_value_t = 256)]
    size_mib: u64,
    /// Runs of each side; the median is reported.
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// Directory for the archive and the server's data (default: the system temp dir). On a
    /// tmpfs such as /dev/shm, fsync is free and the figures isolate the CPU path.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Which blob stores to upload into: `local` (the data directory), or `s3`, which measures
    /// the local store and an S3 bucket side by side.
    #[arg(long, value_enum, default_value_t = StoreChoice::Local)]
    store: StoreChoice,
    #[command(flatten)]
    storage: StorageArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum StoreChoice {
    Local,
    S3,
}

/// One API under test: where it listens and what it stores into.
pub(super) struct Target {
    label: &'static str,
    pub(super) base: String,
    blobs: Arc<dyn BlobStore>,
    pub(super) shutdown: CancellationToken,
    pub(super) server: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// Serves the API on a loopback port with `blobs` as its blob store.
pub(super) async fn start_api(
    pool: &PgPool,
    data_dir: &Path,
    size: u64,
    label: &'static str,
    blobs: Arc<dyn BlobStore>,
) -> anyhow::Result<Target> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let serve = ServeArgs {
        listen: addr,
        admin_token: None,
        public_url: Some(format!("http://{addr}")),
        upload_secret: None,
        upload_max_bytes: size + (1 << 20),
        upload_url_ttl_secs: 900,
        upload_idle_timeout_secs: 30,
        upload_max_concurrent: 64,
        status_hold_ms: 1500,
        status_max_held: 1024,
        sandbox_start_timeout_secs: 30,
        sandbox_domain: None,
        sandbox_tls_listen: None,
        sandbox_tls_cert: None,
        sandbox_tls_key: None,
        build_waiting_timeout_secs: 3600,
        build_queue_timeout_secs: 3600,
        build_cpu_max: strata::domain::build_spec::Ceilings::DEFAULT.cpu_count,
        build_memory_max_mb: strata::domain::build_spec::Ceilings::DEFAULT.memory_mb,
        cache_mode: None,
        sandbox_backend: None,
    };
    let state = AppState::new(pool.clone(), &serve, "bench".into(), data_dir)
        .context("preparing the API")?
        .with_blobs(blobs.clone());
    let shutdown = CancellationToken::new();
    let server = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            axum::serve(listener, strata::api::router(state))
                .with_graceful_shutdown(async move { shutdown.cancelled().await })
                .await
        })
    };
    Ok(Target {
        label,
        base: format!("http://{addr}"),
        blobs,
        shutdown,
        server,
    })
}

/// The S3 store to measure: `STRATA_BLOB_URL` when it names one, else a bucket on a local
/// S3-protocol server that lives as long as the returned guard.
fn s3_store(
    storage: &StorageArgs,
) -> anyhow::Result<(Arc<dyn BlobStore>, Option<strata::vmm::local_s3::LocalS3>)> {
    if let Some(url) = storage
        .blob_url
        .as_deref()
        .filter(|u| u.starts_with("s3://"))
    {
        let store = strata::vmm::open_blob_store(Some(url), &storage.data_dir)?;
        return Ok((store, None));
    }
    let server = strata::vmm::local_s3::LocalS3::start()
        .context("starting a local S3 server for the bench")?;
    let store = server.blob_store("bench", "strata")?;
    Ok((store, Some(server)))
}

pub async fn run(args: BenchUploadArgs) -> anyhow::Result<()> {
    if args.size_mib == 0 {
        bail!("--size-mib must be at least 1");
    }
    let repeat = args.repeat.max(1);
    let size = args.size_mib << 20;
    // The archive and the API's data directory share one temporary directory (one filesystem,
    // so the server's publish is a link, as in production).
    let mut work = tempfile::Builder::new();
    work.prefix("strata-bench-upload-");
    let work = match &args.dir {
        Some(dir) => work.tempdir_in(dir),
        None => work.tempdir(),
    }
    .context("creating the bench directory")?;
    let archive = work.path().join("context.tar");
    write_random_file(&archive, size).await?;
    let data_dir = work.path().join("data");
    let (s3, _s3_server) = match args.store {
        StoreChoice::Local => (None, None),
        StoreChoice::S3 => {
            let (store, server) = tokio::task::block_in_place(|| s3_store(&args.storage))?;
            (Some(store), server)
        }
    };

    super::bench::with_bench_database(&args.storage, |options, where_| async move {
        let pool = super::bench::bench_pool(options, 4).await?;
        let result = bench_upload(&pool, &data_dir, &archive, size, repeat, where_, s3).await;
        pool.close().await;
        result
    })
    .await
}

async fn bench_upload(
    pool: &PgPool,
    data_dir: &Path,
    archive: &Path,
    size: u64,
    repeat: usize,
    where_: &str,
    s3: Option<Arc<dyn BlobStore>>,
) -> anyhow::Result<()> {
    let local = strata::vmm::open_blob_store(None, data_dir)?;
    let mut targets = vec![start_api(pool, data_dir, size, "local store", local).await?];
    if let Some(s3) = s3 {
        targets.push(start_api(pool, data_dir, size, "S3 store", s3).await?);
    }
    let result = measure(pool, data_dir, archive, size, repeat, where_, &targets).await;
    for target in targets {
        target.shutdown.cancel();
        target.server.await.context("API task")??;
    }
    result
}

async fn measure(
    pool: &PgPool,
    data_dir: &Path,
    archive: &Path,
    size: u64,
    repeat: usize,
    where_: &str,
    targets: &[Target],
) -> anyhow::Result<()> {
    {
        let key = issue_key(pool).await?;
        let client = reqwest::Client::new();
        let mut templates = Vec::new();
        for target in targets {
            templates.push(register(&client, &target.base, &key).await?);
        }
        println!(
            "strata bench upload: {} MiB archive in {}, {repeat} runs each, Postgres {where_}, stores: {}",
            size >> 20,
            archive.parent().map(Path::display).map(|d| d.to_string()).unwrap_or_default(),
            targets.iter().map(|t| t.blobs.describe()).collect::<Vec<_>>().join(", ")
        );

        let mut ceiling = Runs::default();
        let mut disk = Runs::default();
        let mut ingest = vec![Runs::default(); targets.len() * CLIENTS.len()];
        let mut openssl_digest = String::new();
        for _ in 0..repeat {
            let cpu = cpu_used(libc::RUSAGE_CHILDREN);
            let (elapsed, digest) = openssl_sha256(archive).await?;
            ceiling.push(elapsed, cpu_used(libc::RUSAGE_CHILDREN) - cpu);
            openssl_digest = digest;
            let cpu = cpu_used(libc::RUSAGE_SELF);
            let elapsed = durable_copy(archive, data_dir).await?;
            disk.push(elapsed, cpu_used(libc::RUSAGE_SELF) - cpu);
            for (i, target) in targets.iter().enumerate() {
                for (c, sender) in CLIENTS.iter().enumerate() {
                    let url = upload_link(&client, &target.base, &key, &templates[i]).await?;
                    let cpu = cpu_used(libc::RUSAGE_SELF);
                    let elapsed = match sender {
                        Client::Reqwest => put_streaming(&client, &url, archive, size).await?,
                        Client::Sendfile => put_sendfile(&url, archive, size).await?,
                    };
                    ingest[i * CLIENTS.len() + c].push(elapsed, cpu_used(libc::RUSAGE_SELF) - cpu);
                }
            }
        }
        // Each server named the blob by the digest it computed; it must be openssl's.
        let digest = Digest::from_hex(&openssl_digest)?;
        for target in targets {
            let blobs = target.blobs.clone();
            let stored = tokio::task::spawn_blocking(move || blobs.intact_size(&digest)).await??;
            if stored != Some(size) {
                bail!(
                    "the {} did not store the archive under its sha256 {openssl_digest}",
                    target.label
                );
            }
        }

        let mib = size as f64 / (1 << 20) as f64;
        let ceiling_rate = ceiling.rate(mib);
        println!();
        println!(
            "{:<44} {:>8} {:>10} {:>12}   runs (MiB/s)",
            "scenario", "MiB/s", "vs ceiling", "CPU ms/MiB"
        );
        let row = |label: &str, runs: &Runs| {
            println!(
                "{:<44} {:>8.0} {:>10.2} {:>12.2}   {}",
                label,
                runs.rate(mib),
                runs.rate(mib) / ceiling_rate,
                runs.cpu_per_mib(mib),
                runs.rates(mib)
            );
        };
        row("openssl dgst -sha256, one core (ceiling)", &ceiling);
        row("cp + fdatasync, same filesystem (disk)", &disk);
        let rows = targets
            .iter()
            .flat_map(|t| CLIENTS.iter().map(move |c| (t, c)));
        for ((target, sender), runs) in rows.zip(&ingest) {
            row(
                &format!("PUT into the {}, {}", target.label, sender.label()),
                runs,
            );
        }
        println!();
        println!(
            "CPU ms/MiB: the median CPU time (all threads, user and system) the run took: openssl's \
             own, else this process's, client included. {} cores here.",
            std::thread::available_parallelism().map_or(1, |n| n.get())
        );
        println!("digest checked: each stored blob is named by openssl's sha256 {openssl_digest}");
        Ok(())
    }
}

/// `size` bytes that do not compress: the shape of a context archive that is mostly binaries.
async fn write_random_file(path: &PathBuf, size: u64) -> anyhow::Result<()> {
    let mut file = tokio::io::BufWriter::new(tokio::fs::File::create(path).await?);
    let mut block = vec![0u8; 1 << 20];
    let mut written = 0u64;
    while written < size {
        rand::Rng::fill(&mut rand::thread_rng(), &mut block[..]);
        let n = (size - written).min(block.len() as u64) as usize;
        file.write_all(&block[..n]).await?;
        written += n as u64;
    }
    file.flush().await?;
    Ok(())
}

async fn issue_key(pool: &PgPool) -> anyhow::Result<String> {
    let store = strata::app::event_store(pool.clone());
    let ctx = CommandContext::new(Metadata::new(Actor::new(ActorRole::Cli, "bench")));
    let team = TeamId::parse("bench-upload")?;
    let key = strata::app::team::issue_key(&store, &ctx, &team, strata::clock::local_now())
        .await
        .context("issuing the bench key")?;
    Ok(key.expose().to_string())
}

async fn json_of(response: reqwest::Response, what: &str) -> anyhow::Result<serde_json::Value> {
    let status = response.status();
    let body = response.bytes().await?;
    if !status.is_success() {
        bail!("{what}: {status}: {}", String::from_utf8_lossy(&body));
    }
    serde_json::from_slice(&body).with_context(|| format!("{what}: the body is not JSON"))
}

/// `POST /v3/templates`, as the SDK sends it; returns the template id.
async fn register(client: &reqwest::Client, base: &str, key: &str) -> anyhow::Result<String> {
    let response = client
        .post(format!("{base}/v3/templates"))
        .header("x-api-key", key)
        .header("content-type", "application/json")
        .body(r#"{"name":"bench-upload"}"#)
        .send()
        .await?;
    let body = json_of(response, "registering the bench build").await?;
    body["templateID"]
        .as_str()
        .map(str::to_owned)
        .context("the registration has no templateID")
}

/// The clients that send the archive, each in every run.
#[derive(Debug, Clone, Copy)]
enum Client {
    Reqwest,
    Sendfile,
}

const CLIENTS: [Client; 2] = [Client::Sendfile, Client::Reqwest];

impl Client {
    fn label(self) -> &'static str {
        match self {
            Client::Reqwest => "reqwest client",
            Client::Sendfile => "sendfile client",
        }
    }
}

/// A link under a fresh files hash, so the content is never "present" and every PUT is stored.
async fn upload_link(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    template: &str,
) -> anyhow::Result<String> {
    let hash = hex::encode(rand::random::<[u8; 32]>());
    let response = client
        .get(format!("{base}/templates/{template}/files/{hash}"))
        .header("x-api-key", key)
        .send()
        .await?;
    let link = json_of(response, "requesting an upload link").await?;
    Ok(link["url"]
        .as_str()
        .context("the link has no url")?
        .to_string())
}

/// The timed PUT with reqwest streaming the file in 1 MiB reads.
async fn put_streaming(
    client: &reqwest::Client,
    url: &str,
    archive: &Path,
    size: u64,
) -> anyhow::Result<Duration> {
    let file = tokio::fs::File::open(archive).await?;
    let body =
        reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::with_capacity(file, 1 << 20));
    let start = Instant::now();
    let response = client
        .put(url)
        .header("content-length", size)
        .body(body)
        .send()
        .await?;
    let status = response.status();
    let text = response.text().await?;
    let elapsed = start.elapsed();
    if !status.is_success() {
        bail!("the upload PUT failed: {status}: {text}");
    }
    Ok(elapsed)
}

/// The timed PUT as HTTP/1.1 by hand: the request head, then the file handed to the socket with
/// `sendfile` (no read into user space, no copy into the socket), then the whole response.
async fn put_sendfile(url: &str, archive: &Path, size: u64) -> anyhow::Result<Duration> {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;

    let url = reqwest::Url::parse(url)?;
    let host = url
        .host_str()
        .context("the upload url has no host")?
        .to_string();
    let port = url
        .port_or_known_default()
        .context("the upload url has no port")?;
    let target = match url.query() {
        Some(query) => format!("{}?{query}", url.path()),
        None => url.path().to_string(),
    };
    let archive = archive.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let file = std::fs::File::open(&archive)?;
        let mut socket = std::net::TcpStream::connect((host.as_str(), port))?;
        socket.set_nodelay(true)?;
        let start = Instant::now();
        write!(
            socket,
            "PUT {target} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n"
        )?;
        let mut offset: libc::off_t = 0;
        while (offset as u64) < size {
            let left = (size - offset as u64).min(1 << 30) as usize;
            // SAFETY: both descriptors are open for the duration of the call; `offset` is a
            // valid pointer the kernel advances.
            let sent = unsafe { libc::sendfile(socket.as_raw_fd(), file.as_raw_fd(), &mut offset, left) };
            if sent < 0 {
                return Err(anyhow::Error::from(std::io::Error::last_os_error()).context("sendfile"));
            }
            if sent == 0 {
                bail!("sendfile sent nothing at offset {offset} of {size}");
            }
        }
        let mut response = Vec::new();
        socket.read_to_end(&mut response)?;
        let elapsed = start.elapsed();
        let response = String::from_utf8_lossy(&response);
        let status = response.split_whitespace().nth(1).unwrap_or_default();
        if status != "200" {
            bail!("the upload PUT failed: {response}");
        }
        Ok(elapsed)
    })
    .await?
}

/// Times copying `archive` into a new file beside the server's data and making it durable:
/// what the upload must at least pay for on this disk, with no network and no hashing.
async fn durable_copy(archive: &Path, data_dir: &Path) -> anyhow::Result<Duration> {
    let (archive, dir) = (archive.to_path_buf(), data_dir.to_path_buf());
    tokio::task::spawn_blocking(move || {
        let mut target = tempfile::NamedTempFile::new_in(dir)?;
        let start = Instant::now();
        std::io::copy(&mut std::fs::File::open(&archive)?, target.as_file_mut())?;
        target.as_file().sync_data()?;
        Ok(start.elapsed())
    })
    .await?
}

/// Times `openssl dgst -sha256 FILE` as a subprocess; returns the time and the hex digest.
async fn openssl_sha256(path: &Path) -> anyhow::Result<(Duration, String)> {
    let start = Instant::now();
    let out = tokio::process::Command::new("openssl")
        .args(["dgst", "-sha256", "-r"])
        .arg(path)
        .output()
        .await
        .context("running openssl (install it: apt-get install openssl)")?;
    let elapsed = start.elapsed();
    if !out.status.success() {
        bail!(
            "openssl dgst failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let digest = String::from_utf8(out.stdout)?
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string();
    Ok((elapsed, digest))
}

/// The wall-clock and CPU times of each run of one scenario.
#[derive(Debug, Clone, Default)]
struct Runs {
    wall: Vec<Duration>,
    cpu: Vec<Duration>,
}

impl Runs {
    fn push(&mut self, wall: Duration, cpu: Duration) {
        self.wall.push(wall);
        self.cpu.push(cpu);
    }

    fn rate(&self, mib: f64) -> f64 {
        mib / median(&self.wall).as_secs_f64()
    }

    fn cpu_per_mib(&self, mib: f64) -> f64 {
        median(&self.cpu).as_secs_f64() * 1e3 / mib
    }

    fn rates(&self, mib: f64) -> String {
        self.wall
            .iter()
            .map(|d| format!("{:.0}", mib / d.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// CPU time used so far, user and system, by this process (`RUSAGE_SELF`, every thread) or by
/// its waited-for children (`RUSAGE_CHILDREN`).
fn cpu_used(who: libc::c_int) -> Duration {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(who, &mut usage);
        usage
    };
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    time(usage.ru_utime) + time(usage.ru_stime)
}

fn median(values: &[Duration]) -> Duration {
    let mut sorted = values.to_vec();
    sorted.sort();
    sorted[sorted.len() / 2]
}
