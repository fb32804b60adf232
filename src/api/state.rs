//! What every handler shares: the database, the event store, the blob store and the settings.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;

use chrono::Duration;
use sqlx::PgPool;
use thiserror::Error;

use crate::config::ServeArgs;
use crate::domain::upload_url::UploadSecret;
use crate::events::EventStore;
use crate::vmm::{BlobStore, LocalBlobStore, VmmError};

#[derive(Debug, Error)]
pub enum StateError {
    #[error("STRATA_UPLOAD_SECRET is too short: {0}")]
    WeakSecret(#[from] crate::domain::upload_url::UrlError),
    #[error("reading or creating the upload secret {path}: {source}")]
    SecretFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("opening the blob store: {0}")]
    Blobs(#[from] VmmError),
}

/// Limits and lifetimes of the upload and build protocol.
#[derive(Debug, Clone)]
pub struct ProtocolSettings {
    pub upload_max_bytes: u64,
    pub upload_url_ttl: Duration,
    /// Longest pause in an upload body.
    pub upload_idle_timeout: std::time::Duration,
    pub waiting_timeout: Duration,
    pub queue_timeout: Duration,
    /// The most one build may ask for.
    pub ceilings: crate::domain::build_spec::Ceilings,
    /// What one team may hold at once (ADR 0024).
    pub team_limits: crate::domain::team_limits::TeamLimits,
    /// Longest a status request waits for news (ADR 0027); zero answers at once.
    pub status_hold: std::time::Duration,
    /// Longest `Sandbox.create` waits for a node to run the sandbox (ADR 0028).
    pub sandbox_start_timeout: std::time::Duration,
    /// The `domain` of sandbox answers: `STRATA_SANDBOX_DOMAIN`, else the public URL's host.
    pub sandbox_domain: String,
    /// `STRATA_CACHE_MODE`, as given: resolved (and, when invalid, skipped) per build at start.
    pub cache_mode: Option<String>,
    /// `STRATA_SANDBOX_BACKEND`, as given: resolved per build and sandbox like the cache mode.
    pub sandbox_backend: Option<String>,
}

/// The host of `url` (`http://host:port/…` -> `host`).
fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let host = rest.split('/').next().unwrap_or(rest);
    host.rsplit_once(':').map_or(host, |(h, _)| h)
}

/// Shared by every handler; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub pool: PgPool,
    /// The event store on `pool`, shared so that the process has one post-commit notifier.
    pub events: EventStore,
    /// Bearer token for `/admin/*`; `None` closes the operator API.
    pub admin_token: Option<String>,
    /// Base URL handed out in links (upload URLs).
    pub public_url: String,
    /// Actor id recorded on events this process appends.
    pub node_id: String,
    /// Uploaded context archives, content-addressed; shared with the workers.
    pub blobs: Arc<dyn BlobStore>,
    /// Signs and verifies upload URLs; never logged.
    pub upload_secret: Arc<UploadSecret>,
    /// Seals the registry credentials a build start brings (key derived from the same secret).
    pub credential_seal: crate::registry::sealed::CredentialSeal,
    pub protocol: Arc<ProtocolSettings>,
    /// The node's data dir: `/metrics` and `/ui` report its bytes on disk.
    pub data_dir: std::path::PathBuf,
    /// Uploads this process may receive at once (`STRATA_UPLOAD_MAX_CONCURRENT`).
    pub upload_slots: Arc<tokio::sync::Semaphore>,
    /// What a `/metrics` scrape must present, if anything (`STRATA_METRICS_TOKEN`).
    pub metrics_token: Option<Arc<str>>,
    /// Wakes held status requests (`STRATA_STATUS_MAX_HELD` of them at most).
    pub stream_news: crate::api::stream_news::StreamNews,
    /// Running sandboxes' nodes, kept until their streams have news.
    pub sandbox_routes: Arc<crate::api::sandbox_routes::SandboxRoutes>,
}

impl AppState {
    pub fn new(
        pool: PgPool,
        serve: &ServeArgs,
        node_id: String,
        data_dir: &Path,
    ) -> Result<Self, StateError> {
        let secret_bytes = server_secret(serve.upload_secret.as_deref(), data_dir)?;
        let credential_seal = crate::registry::sealed::CredentialSeal::from_secret(&secret_bytes);
        let secret = UploadSecret::new(secret_bytes)?;
        let secs = |s: u64| Duration::seconds(s as i64);
        Ok(Self {
            events: crate::app::event_store(pool.clone()),
            pool: pool.clone(),
            admin_token: serve.admin_token.clone(),
            public_url: serve.public_url(),
            node_id,
            blobs: Arc::new(LocalBlobStore::open(data_dir.join("blobs"))?),
            upload_secret: Arc::new(secret),
            credential_seal,
            protocol: Arc::new(ProtocolSettings {
                upload_max_bytes: serve.upload_max_bytes,
                upload_url_ttl: secs(serve.upload_url_ttl_secs),
                upload_idle_timeout: std::time::Duration::from_secs(
                    serve.upload_idle_timeout_secs.max(1),
                ),
                waiting_timeout: secs(serve.build_waiting_timeout_secs),
                queue_timeout: secs(serve.build_queue_timeout_secs),
                ceilings: crate::domain::build_spec::Ceilings {
                    cpu_count: serve.build_cpu_max,
                    memory_mb: serve.build_memory_max_mb,
                    disk_mb: crate::domain::build_spec::Ceilings::DEFAULT.disk_mb,
                },
                team_limits: crate::domain::team_limits::TeamLimits::DEFAULT,
                status_hold: std::time::Duration::from_millis(serve.status_hold_ms),
                sandbox_start_timeout: std::time::Duration::from_secs(
                    serve.sandbox_start_timeout_secs.max(1),
                ),
                sandbox_domain: serve
                    .sandbox_domain
                    .clone()
                    .filter(|d| !d.is_empty())
                    .unwrap_or_else(|| host_of(&serve.public_url()).to_owned()),
                cache_mode: serve.cache_mode.clone(),
                sandbox_backend: serve.sandbox_backend.clone(),
            }),
            data_dir: data_dir.to_path_buf(),
            upload_slots: Arc::new(tokio::sync::Semaphore::new(
                serve.upload_max_concurrent.max(1),
            )),
            metrics_token: None,
            stream_news: crate::api::stream_news::StreamNews::new(
                pool.clone(),
                serve.status_max_held,
            ),
            sandbox_routes: Arc::default(),
        })
    }

    /// The same state holding teams to `limits` (`STRATA_TEAM_MAX_*`, `STRATA_BUILD_MAX_STEPS`)
    /// instead of the defaults.
    pub fn with_team_limits(mut self, limits: crate::domain::team_limits::TeamLimits) -> Self {
        Arc::make_mut(&mut self.protocol).team_limits = limits;
        self
    }

    /// The same state refusing a `minFreeDiskMb` above `disk_max` bytes
    /// (`STRATA_BUILD_DISK_MAX`; `None`: unbounded).
    pub fn with_disk_ceiling(mut self, disk_max: Option<u64>) -> Self {
        Arc::make_mut(&mut self.protocol).ceilings.disk_mb = disk_max.map(|b| b >> 20);
        self
    }

    /// The same state with `/metrics` behind `token` (`STRATA_METRICS_TOKEN`).
    pub fn with_metrics_token(mut self, token: Option<&str>) -> Self {
        self.metrics_token = token.map(Arc::from);
        self
    }

    /// The same state with uploads stored in `blobs` (`STRATA_BLOB_URL`) instead of
    /// `<data-dir>/blobs`.
    pub fn with_blobs(mut self, blobs: Arc<dyn BlobStore>) -> Self {
        self.blobs = blobs;
        self
    }
}

/// The server secret: `STRATA_UPLOAD_SECRET` when given, else `<data-dir>/upload-secret`.
pub fn server_secret(explicit: Option<&str>, data_dir: &Path) -> Result<Vec<u8>, StateError> {
    match explicit {
        Some(s) => Ok(s.as_bytes().to_vec()),
        None => secret_from_file(&data_dir.join("upload-secret")),
    }
}

/// Reads the node's signing key, creating it (32 random bytes, mode 0600) on first use. Creation
/// is exclusive, so two processes starting together agree on one key.
fn secret_from_file(path: &Path) -> Result<Vec<u8>, StateError> {
    let err = |source| StateError::SecretFile {
        path: path.display().to_string(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(mut file) => {
            let key: [u8; 32] = rand::random();
            file.write_all(hex::encode(key).as_bytes()).map_err(err)?;
            file.sync_all().map_err(err)?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(err(e)),
    }
    // A concurrent creator may not have written yet; wait briefly for the full key.
    for _ in 0..50 {
        let bytes = std::fs::read(path).map_err(err)?;
        if bytes.len() >= 64 {
            return Ok(bytes);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Err(err(std::io::Error::other(
        "the secret file stays incomplete",
    )))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_sandbox_domain_defaults_to_the_public_urls_host() {
        assert_eq!(super::host_of("http://127.0.0.1:3000"), "127.0.0.1");
        assert_eq!(
            super::host_of("https://strata.example/api"),
            "strata.example"
        );
        assert_eq!(super::host_of("strata.example:443"), "strata.example");
    }
}
