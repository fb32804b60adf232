//! The build node's loop: find queued builds, claim them, run them under a renewed lease.
//!
//! * Finding work: the `builds` read model (`phase = 'queued'`, oldest first), woken by the
//!   event store's NOTIFY, the poll interval, or the moment a build left to another node
//!   becomes this node's to take. The row is only a hint; the claim is `AcquireAttempt`
//!   decided on the build stream with the database clock.
//! * Placement (ADR 0020): the queue is tried in the order [`super::placement`] gives, which
//!   prefers builds whose layers this node holds and leaves, for a bounded wait, builds that
//!   another live node holds more of. Beside the loop, [`super::residency`] reports which
//!   layers this node's cache holds.
//! * Concurrency: at most `max_builds` attempts at once (a semaphore permit per attempt; no
//!   claim is tried without a free permit).
//! * Lease: renewed every third of its duration, each renewal bounded by half that. A refused
//!   renewal (the attempt was closed), or a lease that can no longer be proven a sixth of its
//!   duration before it expires, cancels the attempt: the sandbox is destroyed, before the
//!   lease passes, and nothing more is written for it.
//! * Shutdown: stop claiming, cancel running attempts (they are abandoned: the attempt-expiry
//!   reconciler closes them when their lease passes), wait for their sandboxes to be destroyed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::attempt::{self, Attempt};
use super::build_log::{write_logs, BuildLog};
use super::error::{Fence, WorkerError};
use super::executor::{Executor, Outcome};
use super::job::BuildJob;
use super::publish;
use super::settings::WorkerSettings;
use crate::domain::build;
use crate::events::command::load;
use crate::events::{EventStore, FeedWakeups};
use crate::streams::Build;
use crate::vmm::image::ImageCatalog;
use crate::vmm::{BlobStore, NamespaceBackend, NamespaceConfig, SandboxBackend};

/// A build node.
#[derive(Clone)]
pub struct Worker {
    store: EventStore,
    backend: Arc<dyn SandboxBackend>,
    blobs: Arc<dyn BlobStore>,
    catalog: Arc<ImageCatalog>,
    puller: crate::registry::Puller,
    settings: Arc<WorkerSettings>,
    flights: crate::worker::cache::Flights,
    /// The node's extracted layers, whose residency it reports.
    layers: crate::vmm::layer::LayerCache,
    placer: Arc<super::placement::Placer>,
}

/// Queued builds one claim round considers: more than a node takes at once, because some may
/// be left to other nodes.
const QUEUE_WINDOW: i64 = 64;

/// What one claim round found.
enum Claim {
    Acquired(Attempt),
    /// Nothing to claim now; `retry_in`: when a build left to another node becomes ours.
    Nothing {
        retry_in: Option<Duration>,
    },
}

impl Worker {
    /// A node on the namespace backend in `settings.data_dir`.
    pub fn new(store: EventStore, settings: WorkerSettings) -> Result<Worker, WorkerError> {
        let blobs = crate::vmm::open_blob_store(settings.blob_url.as_deref(), &settings.data_dir)?;
        Self::with_blobs(store, settings, blobs)
    }

    /// A node whose blobs are in `blobs` instead of the store `settings.blob_url` names.
    pub fn with_blobs(
        store: EventStore,
        settings: WorkerSettings,
        blobs: Arc<dyn BlobStore>,
    ) -> Result<Worker, WorkerError> {
        let backend = NamespaceBackend::with_blobs(
            NamespaceConfig {
                data_dir: settings.data_dir.clone(),
                agent_binary: settings.agent_binary.clone(),
                depth: settings.depth,
                ids: settings.sandbox_ids,
                network: settings.sandbox_network.clone(),
                disk: settings.sandbox_disk,
            },
            blobs,
        )?;
        backend.layers().set_budget(settings.layer_cache_bytes);
        // Sandboxes are named `sbx-<owner>-…`: this line ties them (and the owner's lock file)
        // to the node that started them.
        tracing::info!(node = %settings.node_id, sandbox_owner = backend.owner_id(), "sandbox backend ready");
        let catalog = ImageCatalog::open(&settings.data_dir)?;
        let puller = crate::registry::Puller::new(
            &settings.data_dir,
            backend.layers().clone(),
            backend.blobs(),
            settings.registry.clone(),
        )?;
        Ok(Worker {
            store,
            puller,
            layers: backend.layers().clone(),
            placer: Default::default(),
            blobs: backend.blobs(),
            backend: Arc::new(backend),
            catalog: Arc::new(catalog),
            settings: Arc::new(settings),
            flights: Default::default(),
        })
    }

    /// Runs until `shutdown` is cancelled, then abandons running builds and returns once their
    /// sandboxes are gone.
    pub async fn run_until(self, shutdown: CancellationToken) -> Result<(), WorkerError> {
        let pool = self.store.pool().clone();
        let mut wakeups = match FeedWakeups::listen(&pool, self.settings.poll_interval).await {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %e, "cannot LISTEN for new events; polling only");
                FeedWakeups::polling(self.settings.poll_interval)
            }
        };
        let slots = Arc::new(Semaphore::new(self.settings.max_builds.max(1)));
        let running = CancellationToken::new();
        let mut tasks = JoinSet::new();
        let reporting = CancellationToken::new();
        let reporter = tokio::spawn(
            super::residency::Reporter::new(
                pool.clone(),
                &self.settings.node_id,
                self.layers.clone(),
                self.settings.residency_ttl(),
            )
            .run(self.settings.residency_heartbeat, reporting.clone())
            .in_current_span(),
        );
        let catalog_publisher = tokio::spawn(
            super::catalog_publisher::run(
                self.store.clone(),
                self.settings.node_id.clone(),
                self.catalog.clone(),
                self.settings.residency_heartbeat,
                reporting.clone(),
            )
            .in_current_span(),
        );
        let sandboxes = if self.settings.max_sandboxes > 0 {
            let (listener, url) = super::sandbox_host::bind_agent(
                self.settings.agent_listen,
                self.settings.agent_url.as_deref(),
            )
            .await
            .map_err(|source| WorkerError::Io {
                context: format!(
                    "binding the sandbox agent to {} (STRATA_AGENT_LISTEN)",
                    self.settings.agent_listen
                ),
                source,
            })?;
            let host = super::sandbox_host::SandboxHost::new(
                self.store.clone(),
                self.backend.clone(),
                &self.settings,
                url,
            );
            Some(tokio::spawn(
                host.run_until(listener, reporting.clone())
                    .in_current_span(),
            ))
        } else {
            None
        };
        tracing::info!(node = %self.settings.node_id, max_builds = self.settings.max_builds, "build node started");
        loop {
            while tasks.try_join_next().is_some() {}
            let permit = tokio::select! {
                _ = shutdown.cancelled() => break,
                p = slots.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            };
            let mut retry_in = None;
            match self.claim_next().await {
                Ok(Claim::Acquired(attempt)) => {
                    let worker = self.clone();
                    let cancel = running.child_token();
                    tasks.spawn(async move {
                        let span =
                            crate::trace::build_span(&worker.store, attempt.build, "build.attempt")
                                .await;
                        worker.run_attempt(attempt, cancel).instrument(span).await;
                        drop(permit);
                    });
                    continue;
                }
                Ok(Claim::Nothing { retry_in: due }) => {
                    drop(permit);
                    retry_in = due;
                }
                Err(e) => {
                    drop(permit);
                    tracing::warn!(error = %e, "looking for queued builds failed; retrying");
                }
            }
            let due = async {
                match retry_in {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = wakeups.wait() => {}
                _ = due => {}
            }
        }
        tracing::info!(
            builds = tasks.len(),
            "build node stopping; abandoning running builds"
        );
        running.cancel();
        while tasks.join_next().await.is_some() {}
        reporting.cancel();
        if let Some(sandboxes) = sandboxes {
            let _ = sandboxes.await;
        }
        let _ = reporter.await;
        let _ = catalog_publisher.await;
        // Checkpoint trees still syncing in the background: let them be marked complete, or
        // the next start extracts them again from their blobs.
        let layers = self.layers.clone();
        let _ = tokio::task::spawn_blocking(move || layers.wait_for_syncs()).await;
        // Spare scratch disks and destroyed sandboxes' disks: nothing stays mounted.
        self.backend.shutdown().await;
        Ok(())
    }

    /// Claims the first queued build this node can acquire, in placement's order.
    async fn claim_next(&self) -> Result<Claim, WorkerError> {
        let max_running = self.settings.team_limits.running_builds;
        let queue =
            crate::projections::builds::queue(self.store.pool(), QUEUE_WINDOW, max_running).await?;
        let node = super::placement::Node {
            store: &self.store,
            catalog: &self.catalog,
            backend: self.backend.name(),
            id: &self.settings.node_id,
            wait: self.settings.placement_wait,
        };
        let order = self.placer.order(&node, queue).await?;
        for (build, verdict) in order.tries {
            if let Some(a) = attempt::acquire(
                &self.store,
                build,
                &self.settings.node_id,
                self.settings.lease,
                max_running,
            )
            .instrument(crate::trace::build_span(&self.store, build, "build.acquire").await)
            .await?
            {
                match &verdict {
                    Some(v) => {
                        crate::metrics::placement_claim(v.label());
                        tracing::info!(%build, epoch = %a.epoch, placement = %v.label(), "build acquired");
                    }
                    None => tracing::info!(%build, epoch = %a.epoch, "build acquired"),
                }
                return Ok(Claim::Acquired(a));
            }
        }
        Ok(Claim::Nothing {
            retry_in: order.next_due,
        })
    }

    /// Runs one acquired attempt to a terminal state, or abandons it.
    pub async fn run_attempt(&self, attempt: Attempt, cancel: CancellationToken) {
        let (log, rx) = BuildLog::channel(self.settings.build_log_limits());
        let writer = tokio::spawn(write_logs(
            self.store.pool().clone(),
            attempt.build,
            attempt.epoch,
            rx,
        ));
        let renewer = tokio::spawn(
            renew(
                attempt.clone(),
                self.settings.lease,
                self.settings.renew_every(),
                cancel.clone(),
            )
            .in_current_span(),
        );
        crate::metrics::queue_wait_of(&self.store, attempt.build).await;
        let started = Instant::now();
        let result = self.execute(&attempt, &log, &cancel).await;
        let phase = match result {
            // Best effort: a failed read counts the build as abandoned.
            Ok(()) => crate::projections::builds::phase_of(self.store.pool(), &attempt.build)
                .await
                .ok()
                .flatten(),
            Err(_) => None,
        };
        crate::metrics::build_finished_in(phase.as_deref(), result.is_ok(), started);
        match result {
            Ok(()) => {}
            Err(
                e @ (WorkerError::Fenced { .. }
                | WorkerError::TemplateDeleted { .. }
                | WorkerError::LayerDeleted { .. }),
            ) => {
                tracing::info!(build = %attempt.build, "{e}")
            }
            Err(e) => {
                tracing::error!(build = %attempt.build, epoch = %attempt.epoch, error = %e, "build abandoned")
            }
        }
        renewer.abort();
        drop(log);
        let _ = writer.await;
    }

    async fn execute(
        &self,
        attempt: &Attempt,
        log: &BuildLog,
        cancel: &CancellationToken,
    ) -> Result<(), WorkerError> {
        // The state the acquire left, when nobody wrote since (one version read instead of
        // folding the stream again); otherwise the stream as it is.
        let version = attempt
            .retrying("reading the build's version", || async {
                Ok(self.store.stream_version(&attempt.stream()).await?)
            })
            .await?;
        let state = match attempt.carried() {
            Some(carried) if carried.version == version => carried.state,
            _ => {
                attempt
                    .retrying("loading the build", || async {
                        load::<Build>(&self.store, &attempt.stream())
                            .await
                            .map_err(WorkerError::store)
                    })
                    .await?
                    .state
            }
        };
        let now = attempt
            .retrying("reading the clock", || attempt.now())
            .await?;
        build::check_open_attempt(&state, attempt.epoch, now).map_err(|e| WorkerError::Fenced {
            build: attempt.build,
            epoch: attempt.epoch,
            reason: Fence::Refused(e),
        })?;
        let (registration, freeze) = match (&state.registration, &state.freeze) {
            (Some(r), Some(f)) => (r, f),
            _ => {
                return Err(WorkerError::Corrupt {
                    build: attempt.build,
                    message: "an active build without registration or freeze".into(),
                })
            }
        };
        let credentials = if freeze.registry_credentials {
            match &self.settings.credential_seal {
                None => Err("this build node has no key to open them (set STRATA_UPLOAD_SECRET to the API's)".to_owned()),
                Some(seal) => match crate::registry::sealed::load(self.store.pool(), seal, &attempt.build, attempt.epoch).await {
                    Ok(Some(c)) => Ok(Some(c)),
                    Ok(None) => Err("they are no longer stored (the build ended or was started without them)".to_owned()),
                    Err(crate::registry::sealed::SealError::Store { source, .. }) => {
                        return Err(WorkerError::Database(source))
                    }
                    Err(e) => Err(e.to_string()),
                },
            }
        } else {
            Ok(None)
        };
        let job = BuildJob {
            team: registration.team.clone(),
            spec: freeze.spec.clone(),
            bindings: freeze.bindings.clone(),
            resources: registration.resources,
            base_pin: state.base_pin.clone(),
            credentials,
            cache_mode: state.cache_mode.clone(),
            sandbox_backend: state.sandbox_backend.clone(),
        };
        log.info(
            None,
            format!(
                "Building template {}/{}",
                registration.template, attempt.build
            ),
        );
        let executor = Executor {
            backend: self.backend.as_ref(),
            blobs: self.blobs.clone(),
            catalog: &self.catalog,
            puller: &self.puller,
            settings: &self.settings,
            attempt,
            log: log.clone(),
            cancel: cancel.clone(),
            flights: self.flights.clone(),
        };
        crate::fault::crash_point("worker:before-first-step");
        let outcome = executor.run(&job).await?;
        crate::fault::crash_point("worker:after-last-step");
        if cancel.is_cancelled() {
            return Err(WorkerError::Fenced {
                build: attempt.build,
                epoch: attempt.epoch,
                reason: Fence::Stopped,
            });
        }
        match outcome {
            Outcome::Built(output) => {
                let published = publish::publish(
                    attempt,
                    self.backend.as_ref(),
                    self.blobs.clone(),
                    &registration.template,
                    &registration.tags,
                    &output,
                    log,
                )
                .instrument(tracing::info_span!("build.publish"))
                .await?;
                let snapshot = published.snapshot;
                tracing::info!(build = %attempt.build, %snapshot, layers = output.layers.len(), "build ready");
                if let Some(mut publication) = output.cache {
                    // Carried forward from the publication: the build's result as it recorded it.
                    publication
                        .writer
                        .final_result(attempt, log, snapshot, published.build_base_checkpoint)
                        .await;
                }
            }
            Outcome::Failed(failure) => {
                let step: String = failure.step.into();
                log.error(Some(&step), format!("Build failed: {}", failure.message));
                log.flush().await;
                attempt.fail(failure.step, &failure.message).await?;
                tracing::info!(build = %attempt.build, step, reason = %failure.message, "build failed");
            }
        }
        Ok(())
    }
}

/// Renews the lease every `every`, each try bounded; cancels the attempt when a renewal is
/// refused, or once the lease can no longer be proven for the time its sandboxes take to stop
/// (a sixth of the lease before it expires by the last renewal that succeeded), so that a node
/// cut off from the database has stopped its sandboxes before anyone may call it lost.
async fn renew(attempt: Attempt, lease: Duration, every: Duration, cancel: CancellationToken) {
    let margin = lease / 6;
    // Taken before the renewal reads the database's clock: the lease it grants runs from no
    // earlier than this instant, so the local estimate never outlives it.
    let mut last_ok = Instant::now();
    loop {
        let stop_at = last_ok + lease.saturating_sub(margin);
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
            _ = tokio::time::sleep_until(stop_at.into()) => {}
        }
        let tried = Instant::now();
        if tried >= stop_at {
            tracing::warn!(build = %attempt.build, "the lease could not be renewed in time; stopping the build's sandboxes before it expires");
            cancel.cancel();
            return;
        }
        let bound = (every / 2).min(stop_at - tried);
        match tokio::time::timeout(bound, attempt.renew(lease)).await {
            Ok(Ok(())) => last_ok = tried,
            Ok(Err(e @ WorkerError::Fenced { .. })) => {
                tracing::warn!(build = %attempt.build, "lease renewal refused: {e}");
                cancel.cancel();
                return;
            }
            Ok(Err(e)) => {
                tracing::warn!(build = %attempt.build, error = %e, "lease renewal failed; retrying")
            }
            Err(_) => {
                tracing::warn!(build = %attempt.build, timeout_ms = bound.as_millis() as u64, "lease renewal did not answer in time; retrying")
            }
        }
    }
}
