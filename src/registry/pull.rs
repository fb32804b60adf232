//! The pull engine: an image reference in, its layers extracted in the node's layer cache and
//! stored once in the blob store (by diff id), its config out.
//!
//! Order of a pull:
//! 1. the manifest is fetched with the caller's credentials, every time: that request is the
//!    authorization, so nothing stored is reused for a caller the registry would refuse;
//! 2. if this manifest digest was pulled before and all its layers are present, that is the
//!    answer (a warm pull is one request);
//! 3. an index is resolved to the node's platform, the manifest and the config are fetched and
//!    verified;
//! 4. the layers download in parallel; each is unpacked while it downloads ([`super::unpack`]),
//!    under a per-diff-id lock so that concurrent pulls of one layer on this node download it
//!    once (the second finds it present).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;

use super::error::PullError;
use super::expansion::ExpansionBudget;
use super::manifest::{self, Compression, Descriptor, Document, ImageConfigFile};
use super::session::{self, BasicAuth, Session};
use super::settings::RegistrySettings;
use super::unpack::{self, UnpackError};
use crate::domain::ids::Digest;
use crate::domain::image_ref::ImageRef;
use crate::vmm::archive_policy::ArchiveError;
use crate::vmm::image::ImageConfig;
use crate::vmm::layer::LayerCache;
use crate::vmm::{BlobStore, LayerRef, VmmError};

/// Layers downloaded at once per pull.
const PARALLEL_LAYERS: usize = 4;
/// How often progress is reported while bytes flow.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// A pulled image, ready to boot.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PulledImage {
    /// As requested, pinned to [`Self::digest`].
    pub reference: String,
    /// What the reference resolved to: the digest of the top-level manifest (an index for a
    /// multi-platform image). Pinning uses it; so does the step cache.
    pub digest: Digest,
    /// The platform manifest that was unpacked.
    pub manifest_digest: Digest,
    /// Bottom first, by diff id.
    pub layers: Vec<LayerRef>,
    pub config: ImageConfig,
    /// Sum of the compressed layer sizes.
    pub compressed_size: u64,
}

/// What one pull did, for benchmarks and tests.
#[derive(Debug, Clone, Default)]
pub struct PullStats {
    pub layers_downloaded: usize,
    pub bytes_downloaded: u64,
    pub requests: u64,
}

/// Progress of a pull: layers done of total, compressed bytes done of total.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub layers_done: usize,
    pub layers_total: usize,
    pub bytes_done: u64,
    pub bytes_total: u64,
}

impl std::fmt::Display for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pulling {}/{} layers, {}/{} MB",
            self.layers_done,
            self.layers_total,
            self.bytes_done / 1_000_000,
            self.bytes_total.div_ceil(1_000_000)
        )
    }
}

pub type ProgressFn = Arc<dyn Fn(Progress) + Send + Sync>;

#[derive(Clone)]
pub struct Puller {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    reach: Arc<super::reach::Reach>,
    settings: RegistrySettings,
    blobs: Arc<dyn BlobStore>,
    layers: LayerCache,
    pulled_dir: PathBuf,
    /// Which repositories served which layers and images ([`super::provenance`]).
    provenance: super::provenance::Provenance,
    flights: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// The layers of every image pulled on the node with `data_dir`, with the image each belongs
/// to: what garbage collection counts as re-fetchable. An unreadable directory is an error (a
/// pass that cannot read it deletes nothing); an unreadable record is skipped, as `list` does.
pub fn pulled_layers(
    data_dir: &Path,
) -> Result<std::collections::BTreeMap<Digest, String>, VmmError> {
    let dir = data_dir.join("images").join("pulled");
    let mut out = std::collections::BTreeMap::new();
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(VmmError::io(format!("listing {}", dir.display()))(e)),
    };
    for entry in entries {
        let path = entry
            .map_err(VmmError::io(format!("listing {}", dir.display())))?
            .path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let Some(image) = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<PulledImage>(&b).ok())
        else {
            continue;
        };
        for layer in &image.layers {
            out.insert(layer.digest, image.reference.clone());
        }
    }
    Ok(out)
}

impl Puller {
    /// A puller over the node's blob store and `<data_dir>/layers`, recording pulled images in
    /// `<data_dir>/images/pulled`.
    pub fn new(
        data_dir: &Path,
        layers: LayerCache,
        blobs: Arc<dyn BlobStore>,
        settings: RegistrySettings,
    ) -> Result<Puller, VmmError> {
        let pulled_dir = data_dir.join("images").join("pulled");
        std::fs::create_dir_all(&pulled_dir)
            .map_err(VmmError::io(format!("creating {}", pulled_dir.display())))?;
        let reach = Arc::new(super::reach::Reach::new(&settings));
        Ok(Puller {
            inner: Arc::new(Inner {
                http: session::http_client(reach.clone()),
                reach,
                settings,
                blobs,
                layers,
                provenance: super::provenance::Provenance::open(pulled_dir.join("provenance"))?,
                pulled_dir,
                flights: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// The HTTP client pulls share (also for token exchanges).
    pub fn http(&self) -> &reqwest::Client {
        &self.inner.http
    }

    pub fn settings(&self) -> &RegistrySettings {
        &self.inner.settings
    }

    /// Pulls `reference` (pinned by digest or by tag) with `credentials`.
    pub async fn pull(
        &self,
        reference: &ImageRef,
        credentials: Option<BasicAuth>,
        progress: Option<ProgressFn>,
    ) -> Result<(PulledImage, PullStats), PullError> {
        let inner = &self.inner;
        let image = reference.familiar();
        let session = Session::new(
            inner.http.clone(),
            inner.settings.endpoint(reference.registry()),
            reference.repository().to_owned(),
            image.clone(),
            credentials,
            inner.reach.clone(),
        );
        let stats = Stats::default();
        let (top_bytes, top_digest) = self
            .manifest(&session, &reference.manifest_reference(), &stats)
            .await?;
        if let Some(pinned) = reference.digest() {
            if pinned != &top_digest {
                return Err(PullError::DigestMismatch {
                    image,
                    what: "manifest",
                    expected: pinned.to_string(),
                    actual: top_digest.to_string(),
                });
            }
        }
        let pinned = reference.pinned(top_digest).familiar();
        // Stored layers and earlier results count only for the repository that served them:
        // digests are not secrets (see `provenance`).
        let source = format!("{}/{}", reference.registry(), reference.repository());
        let source = source.as_str();
        if let Some(found) = self
            .inner
            .provenance
            .has(&top_digest, source)
            .then(|| self.warm(&top_digest))
            .flatten()
        {
            return Ok((
                PulledImage {
                    reference: pinned,
                    ..found
                },
                stats.snapshot(),
            ));
        }
        let top: Document = parse_json(&image, "manifest", &top_bytes)?;
        let is_index = top.manifests.is_some();
        let (manifest, manifest_digest) = if let Some(entries) = &top.manifests {
            let node = manifest::node_platform();
            let chosen = manifest::select(entries, &node).ok_or_else(|| {
                let offered: Vec<String> = entries
                    .iter()
                    .filter_map(|d| d.platform.as_ref())
                    .filter(|p| p.os != "unknown")
                    .map(ToString::to_string)
                    .collect();
                PullError::UnsupportedPlatform {
                    image: image.clone(),
                    platform: node.to_string(),
                    offered: if offered.is_empty() {
                        "none".into()
                    } else {
                        offered.join(", ")
                    },
                }
            })?;
            let want = parse_digest(&image, "manifest", &chosen.digest)?;
            let (bytes, digest) = self.manifest(&session, &want.to_string(), &stats).await?;
            if digest != want {
                return Err(PullError::DigestMismatch {
                    image,
                    what: "manifest",
                    expected: want.to_string(),
                    actual: digest.to_string(),
                });
            }
            let doc: Document = parse_json(&image, "manifest", &bytes)?;
            if doc.manifests.is_some() {
                return Err(PullError::Unsupported {
                    image,
                    detail: "an index nested in an index is not supported".into(),
                });
            }
            (doc, digest)
        } else {
            (top, top_digest)
        };
        if manifest.schema_version == 1 {
            return Err(PullError::Unsupported {
                image,
                detail: "Docker schema 1 manifests are not supported; push the image again with a current tool".into(),
            });
        }
        let (Some(config_desc), Some(layer_descs)) = (&manifest.config, &manifest.layers) else {
            return Err(PullError::Malformed {
                image,
                what: "manifest",
                detail: "it has no config or no layers".into(),
            });
        };
        let config_digest = parse_digest(&image, "config", &config_desc.digest)?;
        let config_bytes = self.small_blob(&session, &config_digest, &stats).await?;
        let config: ImageConfigFile = parse_json(&image, "image config", &config_bytes)?;
        let node = manifest::node_platform();
        if !is_index
            && !config.architecture.is_empty()
            && (config.architecture != node.architecture
                || (!config.os.is_empty() && config.os != node.os))
        {
            return Err(PullError::UnsupportedPlatform {
                image,
                platform: node.to_string(),
                offered: format!("{}/{}", config.os, config.architecture),
            });
        }
        if config.rootfs.diff_ids.len() != layer_descs.len() {
            return Err(PullError::Malformed {
                image,
                what: "image config",
                detail: format!(
                    "it lists {} diff ids for {} layers",
                    config.rootfs.diff_ids.len(),
                    layer_descs.len()
                ),
            });
        }
        let total: u64 = layer_descs.iter().map(|d| d.size).sum();
        if let Some(limit) = inner.settings.max_bytes {
            if total > limit {
                return Err(PullError::TooLarge {
                    image,
                    size: total,
                    limit,
                });
            }
        }
        let tracker = Arc::new(Tracker {
            layers_total: layer_descs.len(),
            bytes_total: total,
            layers_done: AtomicU64::new(0),
            bytes_done: AtomicU64::new(0),
            last: Mutex::new(Instant::now()),
            report: progress,
            expansion: ExpansionBudget::new(
                self.inner.settings.max_expanded_bytes,
                self.inner.settings.max_entries,
                self.inner
                    .settings
                    .disk_reserve
                    .map(|r| (self.inner.layers.root().to_path_buf(), r)),
            ),
        });
        let mut plan = Vec::new();
        for (desc, diff_id) in layer_descs.iter().zip(&config.rootfs.diff_ids) {
            let compression = manifest::layer_compression(&desc.media_type).ok_or_else(|| {
                PullError::Unsupported {
                    image: image.clone(),
                    detail: format!(
                        "layer media type {:?} is not a layer tar this node can unpack",
                        desc.media_type
                    ),
                }
            })?;
            let digest = parse_digest(&image, "layer", &desc.digest)?;
            let diff = parse_digest(&image, "diff id", diff_id)?;
            plan.push((desc.clone(), compression, digest, diff));
        }
        tracker.emit(true);
        // A failed layer stops the others, and the pull returns only once every layer task has
        // cleaned up after itself: an error leaves nothing behind on the node.
        let stop = AtomicBool::new(false);
        let first_failure = std::sync::Mutex::new(None);
        let results: Vec<Option<LayerRef>> =
            futures::stream::iter(plan.into_iter().map(|(desc, compression, digest, diff)| {
                let (session, stats, stop, first_failure) =
                    (&session, &stats, &stop, &first_failure);
                let tracker = tracker.clone();
                async move {
                    let layer = self
                        .layer(
                            session,
                            source,
                            &desc,
                            compression,
                            &digest,
                            &diff,
                            stats,
                            &tracker,
                            stop,
                        )
                        .await;
                    layer
                        .map_err(|e| {
                            stop.store(true, Ordering::SeqCst);
                            first_failure.lock().expect("failure slot").get_or_insert(e);
                        })
                        .ok()
                }
            }))
            .buffered(PARALLEL_LAYERS)
            .collect()
            .await;
        if let Some(failure) = first_failure.into_inner().expect("failure slot") {
            return Err(failure);
        }
        let layers: Vec<LayerRef> = results.into_iter().flatten().collect();
        tracker.emit(true);
        let env = config
            .config
            .as_ref()
            .and_then(|c| c.env.clone())
            .unwrap_or_default();
        let runtime = config.config.unwrap_or_default();
        let pulled = PulledImage {
            reference: pinned,
            digest: top_digest,
            manifest_digest,
            layers,
            config: ImageConfig {
                env: env
                    .iter()
                    .filter_map(|e| e.split_once('='))
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect(),
                user: runtime.user.filter(|u| !u.is_empty()),
                workdir: runtime.working_dir.filter(|w| !w.is_empty()),
            },
            compressed_size: total,
        };
        self.record(&pulled).map_err(|source| PullError::Store {
            image: image.clone(),
            source,
        })?;
        inner
            .provenance
            .add(&top_digest, source)
            .map_err(|source| PullError::Store {
                image: image.clone(),
                source,
            })?;
        Ok((pulled, stats.snapshot()))
    }

    /// The record of a digest pulled before, if every layer is still on this node.
    fn warm(&self, digest: &Digest) -> Option<PulledImage> {
        let path = self.inner.pulled_dir.join(format!("{}.json", digest.hex()));
        let found: PulledImage = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
        let complete = found.layers.iter().all(|l| {
            self.inner.layers.contains(&l.digest)
                && matches!(self.inner.blobs.intact_size(&l.digest), Ok(Some(_)))
        });
        complete.then_some(found)
    }

    fn record(&self, pulled: &PulledImage) -> Result<(), VmmError> {
        let dir = &self.inner.pulled_dir;
        let tmp = dir.join(format!(".{}.tmp", uuid::Uuid::new_v4().simple()));
        std::fs::write(
            &tmp,
            serde_json::to_vec_pretty(pulled).expect("a pulled image serializes"),
        )
        .map_err(VmmError::io("writing a pulled-image record"))?;
        std::fs::rename(&tmp, dir.join(format!("{}.json", pulled.digest.hex())))
            .map_err(VmmError::io("publishing a pulled-image record"))
    }

    /// Every image pulled on this node (for `strata image ls`).
    pub fn list(&self) -> Vec<PulledImage> {
        let mut out: Vec<PulledImage> = std::fs::read_dir(&self.inner.pulled_dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
            .filter_map(|e| serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok())
            .collect();
        out.sort_by(|a: &PulledImage, b| a.reference.cmp(&b.reference));
        out
    }

    async fn manifest(
        &self,
        session: &Session,
        reference: &str,
        stats: &Stats,
    ) -> Result<(Vec<u8>, Digest), PullError> {
        stats.requests.fetch_add(1, Ordering::Relaxed);
        let response = session
            .get("manifests", reference, Some(manifest::ACCEPT))
            .await?;
        let bytes = read_capped(session, response, 4 << 20, "manifest").await?;
        let digest = Digest::of(&bytes);
        Ok((bytes, digest))
    }

    async fn small_blob(
        &self,
        session: &Session,
        digest: &Digest,
        stats: &Stats,
    ) -> Result<Vec<u8>, PullError> {
        stats.requests.fetch_add(1, Ordering::Relaxed);
        let response = session.get("blobs", &digest.to_string(), None).await?;
        let bytes = read_capped(session, response, 16 << 20, "image config").await?;
        let actual = Digest::of(&bytes);
        if &actual != digest {
            return Err(PullError::DigestMismatch {
                image: session.image().to_owned(),
                what: "image config",
                expected: digest.to_string(),
                actual: actual.to_string(),
            });
        }
        Ok(bytes)
    }

    fn flight(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self.inner.flights.lock().expect("flight map");
        map.retain(|_, lock| Arc::strong_count(lock) > 1);
        map.entry(key.to_owned()).or_default().clone()
    }

    #[allow(clippy::too_many_arguments)]
    async fn layer(
        &self,
        session: &Session,
        source: &str,
        desc: &Descriptor,
        compression: Compression,
        digest: &Digest,
        diff: &Digest,
        stats: &Stats,
        tracker: &Arc<Tracker>,
        stop: &AtomicBool,
    ) -> Result<LayerRef, PullError> {
        let inner = &self.inner;
        let image = session.image().to_owned();
        let stopped = || PullError::Transport {
            image: session.image().to_owned(),
            detail: "stopped: another layer of the image failed".into(),
        };
        if stop.load(Ordering::SeqCst) {
            return Err(stopped());
        }
        let store_err = |source: VmmError| PullError::Store {
            image: image.clone(),
            source,
        };
        let lock = self.flight(&diff.hex());
        let _guard = lock.lock().await;
        let stored = inner.blobs.intact_size(diff).map_err(store_err)?;
        if let Some(size) = stored.filter(|_| inner.provenance.has(diff, source)) {
            if !inner.layers.contains(diff) {
                // Stored (built or imported here) but not extracted yet.
                let (blobs, layers, d) = (inner.blobs.clone(), inner.layers.clone(), *diff);
                tokio::task::spawn_blocking(move || layers.ensure(blobs.as_ref(), &d))
                    .await
                    .expect("layer extraction does not panic")
                    .map_err(store_err)?;
            }
            tracker.layer_done(desc.size);
            return Ok(LayerRef {
                digest: *diff,
                size,
            });
        }
        if !desc.urls.is_empty() && desc.media_type.contains("foreign") {
            return Err(PullError::Unsupported {
                image,
                detail: "foreign layers (served from URLs outside the registry) are not supported"
                    .into(),
            });
        }
        stats.requests.fetch_add(1, Ordering::Relaxed);
        let response = session.get("blobs", &digest.to_string(), None).await?;
        let (tx, rx) = tokio::sync::mpsc::channel::<unpack::Chunk>(64);
        // A layer stored here already, which this repository has not served before, must be
        // served again: verified against both digests, stored nothing.
        let proving = stored.is_some();
        let max_layer = inner.settings.max_layer_bytes;
        let expansion = tracker.expansion.clone();
        let worker = {
            let (blobs, layers) = (inner.blobs.clone(), inner.layers.clone());
            let (digest, diff) = (*digest, *diff);
            tokio::task::spawn_blocking(move || match stored {
                Some(size) => {
                    unpack::verify(rx, compression, &digest, &diff, size).and_then(|()| {
                        if !layers.contains(&diff) {
                            layers
                                .ensure(blobs.as_ref(), &diff)
                                .map_err(UnpackError::Store)?;
                        }
                        Ok(LayerRef { digest: diff, size })
                    })
                }
                None => unpack::unpack(
                    rx,
                    compression,
                    &digest,
                    &diff,
                    blobs.as_ref(),
                    &layers,
                    max_layer,
                    &expansion,
                ),
            })
        };
        let mut body = response.bytes_stream();
        let mut received = 0u64;
        let mut failure: Option<PullError> = None;
        while let Some(chunk) = body.next().await {
            if stop.load(Ordering::SeqCst) {
                failure = Some(stopped());
                break;
            }
            match chunk {
                Ok(bytes) => {
                    received += bytes.len() as u64;
                    tracker.bytes(bytes.len() as u64);
                    // A descriptor without a size (or a lying one) is counted as it streams:
                    // the image's ceiling holds for the bytes that arrive, not the ones declared.
                    if let Some(limit) = inner.settings.max_bytes {
                        let so_far = tracker.bytes_done.load(Ordering::Relaxed);
                        if so_far > limit {
                            failure = Some(PullError::TooLarge {
                                image: image.clone(),
                                size: so_far,
                                limit,
                            });
                            break;
                        }
                    }
                    if desc.size > 0 && received > desc.size {
                        failure = Some(PullError::DigestMismatch {
                            image: image.clone(),
                            what: "layer",
                            expected: format!("{digest} ({} bytes)", desc.size),
                            actual: format!("more than {} bytes", desc.size),
                        });
                        break;
                    }
                    // Sending blocks this task only while the unpacker is behind; a dropped
                    // receiver means it stopped, and its result says why.
                    if tx.send(Ok(bytes)).await.is_err() {
                        break;
                    }
                }
                Err(e) => {
                    failure = Some(PullError::Transport {
                        image: image.clone(),
                        detail: format!("downloading layer {digest}: {e}"),
                    });
                    break;
                }
            }
        }
        if failure.is_some() {
            let _ = tx.send(Err(())).await;
        }
        drop(tx);
        let outcome = worker.await.expect("unpacking does not panic");
        if let Some(f) = failure {
            return Err(f);
        }
        stats.layers.fetch_add(1, Ordering::Relaxed);
        stats.bytes.fetch_add(received, Ordering::Relaxed);
        let layer = outcome.map_err(|e| match e {
            UnpackError::Compressed { actual } => PullError::DigestMismatch {
                image: image.clone(),
                what: "layer",
                expected: digest.to_string(),
                actual,
            },
            UnpackError::Uncompressed { actual } => PullError::DigestMismatch {
                image: image.clone(),
                what: "layer diff id",
                expected: diff.to_string(),
                actual,
            },
            UnpackError::Aborted => PullError::Transport {
                image: image.clone(),
                detail: format!("downloading layer {digest} stopped early"),
            },
            UnpackError::Store(VmmError::Archive(ArchiveError::TotalTooLarge {
                limit, ..
            })) if max_layer.is_some_and(|m| limit == m) => PullError::LayerTooLarge {
                image: image.clone(),
                limit,
            },
            UnpackError::Store(source) => PullError::Store {
                image: image.clone(),
                source,
            },
        })?;
        inner.provenance.add(diff, source).map_err(store_err)?;
        if proving {
            tracing::info!(image = %image, layer = %diff, %source, "a stored layer was served again by a repository that had not served it before; reused after verifying it");
        }
        tracker.layer_done(0);
        Ok(layer)
    }
}

#[derive(Default)]
struct Stats {
    layers: AtomicU64,
    bytes: AtomicU64,
    requests: AtomicU64,
}

impl Stats {
    fn snapshot(&self) -> PullStats {
        PullStats {
            layers_downloaded: self.layers.load(Ordering::Relaxed) as usize,
            bytes_downloaded: self.bytes.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
        }
    }
}

struct Tracker {
    layers_total: usize,
    bytes_total: u64,
    layers_done: AtomicU64,
    bytes_done: AtomicU64,
    last: Mutex<Instant>,
    report: Option<ProgressFn>,
    /// What the pull's layers have expanded to, against its bounds.
    expansion: Arc<ExpansionBudget>,
}

impl Tracker {
    fn bytes(&self, n: u64) {
        self.bytes_done.fetch_add(n, Ordering::Relaxed);
        self.emit(false);
    }

    /// A layer finished; `skipped` bytes were present already and count as done.
    fn layer_done(&self, skipped: u64) {
        self.bytes_done.fetch_add(skipped, Ordering::Relaxed);
        self.layers_done.fetch_add(1, Ordering::Relaxed);
        self.emit(false);
    }

    fn emit(&self, force: bool) {
        let Some(report) = &self.report else { return };
        {
            let mut last = self.last.lock().expect("progress clock");
            if !force && last.elapsed() < PROGRESS_EVERY {
                return;
            }
            *last = Instant::now();
        }
        report(Progress {
            layers_done: self.layers_done.load(Ordering::Relaxed) as usize,
            layers_total: self.layers_total,
            bytes_done: self
                .bytes_done
                .load(Ordering::Relaxed)
                .min(self.bytes_total),
            bytes_total: self.bytes_total,
        });
    }
}

async fn read_capped(
    session: &Session,
    response: reqwest::Response,
    limit: usize,
    what: &'static str,
) -> Result<Vec<u8>, PullError> {
    let mut out = Vec::new();
    let mut body = response.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| PullError::Transport {
            image: session.image().to_owned(),
            detail: format!("reading the {what}: {e}"),
        })?;
        out.extend_from_slice(&chunk);
        if out.len() > limit {
            return Err(PullError::Malformed {
                image: session.image().to_owned(),
                what,
                detail: format!("it is larger than {limit} bytes"),
            });
        }
    }
    Ok(out)
}

fn parse_json<T: serde::de::DeserializeOwned>(
    image: &str,
    what: &'static str,
    bytes: &[u8],
) -> Result<T, PullError> {
    serde_json::from_slice(bytes).map_err(|e| PullError::Malformed {
        image: image.to_owned(),
        what,
        detail: e.to_string(),
    })
}

fn parse_digest(image: &str, what: &'static str, text: &str) -> Result<Digest, PullError> {
    Digest::parse(text).map_err(|_| PullError::Unsupported {
        image: image.to_owned(),
        detail: format!("{what} digest {text:?} is not a sha256 digest"),
    })
}
