//! The node's launched sandboxes: place the requested ones, boot them on their template's
//! snapshot, answer for them through the agent, and end them (ADR 0028).
//!
//! A node takes a requested sandbox with a compare-and-set `Place` (one node wins; its epoch
//! fences the rest of its writes), boots it with the template's user and workdir, the create
//! call's `envVars`, the template's CPU and memory as cgroup limits and the node's egress policy
//! (none when the call said `allow_internet_access: false`), starts the template's start command
//! and waits for its ready command, and only then appends `Running` with its agent's URL: the
//! API answers the create call on that event, so the SDK's first command finds the agent up.
//!
//! While it runs, the node watches its stream's read model: an end written by anyone (a kill
//! through the API, an expiry) destroys it; its deadline passing is the node's own `Expire`. A
//! node that stops ends its sandboxes as `lost` (they die with it: every sandbox holds a
//! lifeline to the process that started it).
//!
//! A pause (asked through the API, or the deadline of an `autoPause` sandbox) stops its
//! processes, seals its writable layer as a checkpoint layer in the blob store, like a build
//! step's, and records the whole stack with the layers' references in one append; then the
//! sandbox is destroyed here. A resume is a new placement, on any node, booting that stack.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::app::{self, CommandContext, Refusal};
use crate::domain::ids::{Digest, Epoch};
use crate::domain::sandbox::{SandboxId, State};
use crate::envd::agent::{Agents, LiveSandbox};
use crate::events::command::load;
use crate::events::{Actor, ActorRole, CommandError, EventStore, FeedWakeups, Metadata};
use crate::streams::{snapshot_stream, Snapshot};
use crate::vmm::process::{AgentEnd, SpawnRequest};
use crate::vmm::{BootSpec, ExecDefaults, Limits, Network, SandboxBackend};

/// Requested sandboxes one round considers.
const ROUND: i64 = 16;
/// How often a running sandbox's read model is looked at when no notification named its
/// stream (a missed one; the host's own poll tick also wakes every watch).
const WATCH_EVERY: Duration = Duration::from_secs(5);

/// How a running sandbox's watch ended.
enum Watched {
    /// Ended (by anyone), fenced, or its node stops: destroy it.
    Over,
    /// Asked to pause: store its filesystem, then destroy it.
    Pause,
}

pub struct SandboxHost {
    /// What every sandbox's task shares (cloned into each).
    hosting: Hosting,
    slots: Arc<Semaphore>,
    poll: Duration,
}

/// The node's agent listener, bound before anything is placed, and the URL it is reached at.
pub async fn bind_agent(
    listen: std::net::SocketAddr,
    advertised: Option<&str>,
) -> std::io::Result<(tokio::net::TcpListener, String)> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let url = match advertised {
        Some(url) => url.trim_end_matches('/').to_owned(),
        None => format!("http://{}", listener.local_addr()?),
    };
    Ok((listener, url))
}

fn context(node: &str) -> CommandContext {
    CommandContext::new(Metadata::new(Actor::new(ActorRole::Worker, node)))
}

impl SandboxHost {
    /// The node `settings` describe, its agent reached at `agent_url`.
    pub fn new(
        store: EventStore,
        backend: Arc<dyn SandboxBackend>,
        settings: &super::WorkerSettings,
        agent_url: String,
    ) -> SandboxHost {
        SandboxHost {
            hosting: Hosting {
                store,
                backend,
                agents: Arc::new(Agents::default()),
                watches: Arc::new(Watches::default()),
                node: settings.node_id.clone(),
                agent_url,
                disk_max: settings.sandbox_disk_max,
                ready_timeout: settings.ready_timeout,
            },
            slots: Arc::new(Semaphore::new(settings.max_sandboxes)),
            poll: settings.poll_interval,
        }
    }

    /// Serves the agent on `listener` and runs sandboxes until `shutdown`; then ends them all.
    pub async fn run_until(self, listener: tokio::net::TcpListener, shutdown: CancellationToken) {
        let server = {
            let router = crate::envd::server::router(self.hosting.agents.clone());
            let stop = shutdown.clone();
            tokio::spawn(async move {
                let served =
                    crate::serve::serve_until(listener, router, stop, crate::serve::DRAIN).await;
                if let Err(e) = served {
                    tracing::error!(error = %e, "the sandbox agent stopped serving");
                }
            })
        };
        let pool = self.hosting.store.pool().clone();
        let mut wakeups = match FeedWakeups::listen(&pool, self.poll).await {
            Ok(w) => w,
            Err(_) => FeedWakeups::polling(self.poll),
        };
        let mut tasks = JoinSet::new();
        tracing::info!(agent = %self.hosting.agent_url, "sandbox host started");
        loop {
            while tasks.try_join_next().is_some() {}
            if let Err(e) = self.place_round(&mut tasks, &shutdown).await {
                tracing::warn!(error = %e, "looking for requested sandboxes failed; retrying");
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                named = wakeups.wait_for_streams("sandbox-") => self.hosting.watches.wake(named),
            }
        }
        while tasks.join_next().await.is_some() {}
        let _ = server.await;
    }

    async fn place_round(
        &self,
        tasks: &mut JoinSet<()>,
        shutdown: &CancellationToken,
    ) -> Result<(), String> {
        let requested = crate::projections::sandboxes::requested(self.hosting.store.pool(), ROUND)
            .await
            .map_err(|e| e.to_string())?;
        for raw in requested {
            let Ok(permit) = self.slots.clone().try_acquire_owned() else {
                return Ok(());
            };
            let Ok(id) = SandboxId::parse(&raw) else {
                continue;
            };
            let node = &self.hosting.node;
            let placed =
                app::sandbox::place(&self.hosting.store, &context(node), &id, node, Utc::now())
                    .await
                    .map_err(|e| e.to_string())?;
            let Some((epoch, state)) = placed else {
                continue;
            };
            tracing::info!(sandbox = %id, %epoch, "sandbox placed");
            let host = self.hosting.clone();
            let cancel = shutdown.child_token();
            let span = tracing::info_span!("sandbox", sandbox = %id);
            tasks.spawn(
                async move {
                    host.host(id, epoch, state, cancel).await;
                    drop(permit);
                }
                .instrument(span),
            );
        }
        Ok(())
    }
}

/// The running sandboxes' watches, woken by the notifications that name their streams (a kill
/// or a pause reaches the node at once, not at the next look).
#[derive(Default)]
struct Watches(std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Notify>>>);

impl Watches {
    fn add(&self, stream: String) -> Arc<tokio::sync::Notify> {
        let notify = Arc::new(tokio::sync::Notify::new());
        self.0
            .lock()
            .expect("watches lock")
            .insert(stream, notify.clone());
        notify
    }

    fn remove(&self, stream: &str) {
        self.0.lock().expect("watches lock").remove(stream);
    }

    /// Wakes the watches of `named` streams, or all of them (`None`: any may have changed).
    fn wake(&self, named: Option<Vec<String>>) {
        let watches = self.0.lock().expect("watches lock");
        match named {
            None => watches.values().for_each(|n| n.notify_one()),
            Some(streams) => streams
                .iter()
                .filter_map(|s| watches.get(s))
                .for_each(|n| n.notify_one()),
        }
    }
}

/// What one sandbox's task needs.
#[derive(Clone)]
struct Hosting {
    store: EventStore,
    backend: Arc<dyn SandboxBackend>,
    agents: Arc<Agents>,
    watches: Arc<Watches>,
    node: String,
    agent_url: String,
    disk_max: u64,
    /// How long the template's ready command may take to succeed at launch
    /// (`STRATA_READY_TIMEOUT_SECS`, as at a build's finalization).
    ready_timeout: Duration,
}

impl Hosting {
    async fn host(self, id: SandboxId, epoch: Epoch, state: State, cancel: CancellationToken) {
        let ctx = context(&self.node);
        let started = std::time::Instant::now();
        crate::fault::crash_point("sandbox:placed");
        let live = match self.boot(&id, &state).await {
            Ok(live) => live,
            Err(reason) => {
                tracing::warn!(%reason, "sandbox failed to start");
                let _ =
                    app::sandbox::fail(&self.store, &ctx, &id, Some(epoch), &reason, Utc::now())
                        .await;
                return;
            }
        };
        let live = Arc::new(live);
        self.agents.insert(live.clone());
        // Watched from before its `Running`: a kill written right after is not missed.
        let stream = crate::streams::sandbox_stream(&id).as_str().to_owned();
        let woken = self.watches.add(stream.clone());
        let ran =
            app::sandbox::running(&self.store, &ctx, &id, epoch, &self.agent_url, Utc::now()).await;
        match ran {
            Ok(running) => {
                crate::metrics::sandbox_boot(true, started.elapsed());
                tracing::info!(ms = started.elapsed().as_millis() as u64, "sandbox running");
                let watched = self
                    .watching(&id, epoch, running.end_at, &cancel, &woken)
                    .await;
                if let Watched::Pause = watched {
                    self.agents.remove(id.as_str());
                    if let Err(reason) = self.pause(&id, epoch, &live).await {
                        tracing::warn!(%reason, "pausing the sandbox failed; it ends");
                        let reason = format!("pausing failed: {reason}");
                        let _ = app::sandbox::fail(
                            &self.store,
                            &ctx,
                            &id,
                            Some(epoch),
                            &reason,
                            Utc::now(),
                        )
                        .await;
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "sandbox ended before it ran"),
        }
        self.watches.remove(&stream);
        self.agents.remove(id.as_str());
        if let Some(sandbox) = live.take_sandbox() {
            if let Err(e) = sandbox.destroy().await {
                tracing::warn!(error = %e, "destroying the sandbox failed");
            }
        }
        tracing::info!("sandbox ended");
    }

    /// Seals the sandbox's filesystem and records the pause; the sandbox is destroyed after.
    async fn pause(&self, id: &SandboxId, epoch: Epoch, live: &LiveSandbox) -> Result<(), String> {
        let started = std::time::Instant::now();
        let mut sandbox = live
            .take_sandbox()
            .ok_or("the sandbox was already taken down")?;
        let sealed = sandbox.checkpoint().await;
        let layers = sandbox.layers().to_vec();
        let recorded = match sealed {
            Ok(added) => {
                tracing::info!(
                    layer = ?added.map(|l| l.digest),
                    depth = layers.len(),
                    "sandbox filesystem sealed"
                );
                self.record_paused(id, epoch, &layers).await
            }
            Err(e) => Err(format!("storing its filesystem: {e}")),
        };
        if let Err(e) = sandbox.destroy().await {
            tracing::warn!(error = %e, "destroying the paused sandbox failed");
        }
        if recorded.is_ok() {
            tracing::info!(ms = started.elapsed().as_millis() as u64, "sandbox paused");
        }
        recorded
    }

    /// Records the pause; a layer a garbage-collection pass is deleting meanwhile is waited for
    /// and stored again from this node's copy, as a build's checkpoint record does.
    async fn record_paused(
        &self,
        id: &SandboxId,
        epoch: Epoch,
        layers: &[Digest],
    ) -> Result<(), String> {
        let ctx = context(&self.node);
        let mut restored: Vec<Digest> = Vec::new();
        for _ in 0..3 {
            let recorded =
                app::sandbox::record_paused(&self.store, &ctx, id, epoch, layers, &restored).await;
            let digest = match recorded {
                Ok(()) => return Ok(()),
                Err(CommandError::Rejected(Refusal::ObjectBarrier { digest, error })) => {
                    tracing::info!(%digest, %error, "a layer of the pause is being deleted; storing it again");
                    digest
                }
                Err(e) => return Err(format!("recording the pause: {e}")),
            };
            let (stored, _) = super::layer_hold::recreate_for(
                &self.store,
                &ctx,
                &format!("sandbox {id}"),
                self.backend.as_ref(),
                &[digest],
            )
            .await
            .map_err(|e| format!("storing layer {digest} again: {e}"))?;
            if stored.is_empty() {
                return Err(format!(
                    "layer {digest} was deleted by garbage collection and this node has no copy"
                ));
            }
            restored.push(digest);
        }
        Err("the pause's layers kept being deleted by garbage collection".into())
    }

    /// Boots the sandbox on its template's snapshot (or, resumed, on the stack its last pause
    /// stored) and runs the template's start command.
    async fn boot(&self, id: &SandboxId, state: &State) -> Result<LiveSandbox, String> {
        let request = state
            .request
            .as_ref()
            .ok_or("the sandbox's stream has no request")?;
        let record = load::<Snapshot>(&self.store, &snapshot_stream(&request.snapshot))
            .await
            .map_err(|e| format!("reading the template's snapshot: {e}"))?
            .state
            .record
            .ok_or("the template's snapshot has no record; rebuild the template")?;
        let runtime = record.runtime_context();
        // One backend today, so this node runs every sandbox; a second is a new arm here.
        match request.backend.as_ref().map(|b| b.backend) {
            None | Some(crate::domain::backend_name::BackendName::Namespace) => {}
        }
        let layers = state.boot_layers().unwrap_or(&record.layers).to_vec();
        let mut spec = BootSpec::new(layers);
        spec.context = ExecDefaults {
            env: request
                .env_vars
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            user: runtime.user.clone(),
            workdir: Some(runtime.workdir.clone()),
        };
        spec.limits = Limits {
            cpus: Some(f64::from(request.cpu_count)),
            memory_bytes: Some(u64::from(request.memory_mb) << 20),
            disk_max: Some(self.disk_max),
            network: if request.allow_internet {
                Network::Egress
            } else {
                Network::None
            },
            ..Limits::default()
        };
        let sandbox = self
            .backend
            .boot(spec)
            .await
            .map_err(|e| format!("booting the sandbox: {e}"))?;
        let live = LiveSandbox::new(
            id.as_str().to_owned(),
            request.envd_token.clone(),
            sandbox,
            runtime.user.clone(),
            request.env_vars.clone(),
        )
        .with_traffic_token(request.traffic_token.clone());
        if let Some(start) = &record.start_cmd {
            start_command(&live, start)?;
            if let Some(ready) = &record.ready_cmd {
                wait_ready(&live, ready, self.ready_timeout).await?;
            }
        }
        Ok(live)
    }

    /// Until the sandbox ends (by anyone's write, at its deadline, or with this node) or is
    /// asked to pause: looked at when `woken` (a notification named its stream), at its
    /// deadline, and every [`WATCH_EVERY`]; first when its `Running` (deadline `end_at`) is
    /// known.
    async fn watching(
        &self,
        id: &SandboxId,
        epoch: Epoch,
        end_at: Option<chrono::DateTime<Utc>>,
        cancel: &CancellationToken,
        woken: &tokio::sync::Notify,
    ) -> Watched {
        let ctx = context(&self.node);
        let until = |end: chrono::DateTime<Utc>| {
            (end - Utc::now())
                .to_std()
                .ok()
                .map(|left| WATCH_EVERY.min(left + Duration::from_millis(5)))
        };
        let mut next = end_at.map_or(Some(WATCH_EVERY), until).unwrap_or_default();
        loop {
            tokio::select! {
                _ = cancel.cancelled() => {
                    let _ = app::sandbox::lose(&self.store, &ctx, id, epoch, "its node stopped", Utc::now()).await;
                    return Watched::Over;
                }
                _ = tokio::time::sleep(next) => {}
                _ = woken.notified() => {}
            }
            next = WATCH_EVERY;
            match crate::projections::sandboxes::get(self.store.pool(), id.as_str()).await {
                Ok(Some(row)) if row.state == "ended" || row.epoch != epoch.0 as i64 => {
                    return Watched::Over
                }
                Ok(Some(row)) if row.state == "pausing" => return Watched::Pause,
                Ok(Some(row)) => {
                    if let Some(end) = row.end_at {
                        // Looked at again when its deadline passes, without a notification.
                        match until(end) {
                            Some(left) => next = left,
                            None => {
                                let _ =
                                    app::sandbox::expire(&self.store, &ctx, id, Utc::now()).await;
                                next = Duration::from_millis(250);
                            }
                        }
                    }
                }
                Ok(None) => return Watched::Over,
                Err(e) => tracing::debug!(error = %e, "reading the sandbox's state failed"),
            }
        }
    }
}

/// The template's start command, left running as E2B leaves it (its output is not kept).
fn start_command(live: &LiveSandbox, command: &str) -> Result<(), String> {
    let spawn = SpawnRequest {
        argv: vec!["/bin/sh".into(), "-c".into(), command.to_owned()],
        ..SpawnRequest::default()
    };
    let mut io = live
        .with(|s| s.spawn(spawn))
        .map_err(|e| format!("starting the template's start command: {e}"))?;
    tokio::spawn(async move {
        let _ = io.status.ended().await;
    });
    Ok(())
}

/// Runs the template's ready command until it succeeds.
async fn wait_ready(live: &LiveSandbox, command: &str, limit: Duration) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let spawn = SpawnRequest {
            argv: vec!["/bin/sh".into(), "-c".into(), command.to_owned()],
            ..SpawnRequest::default()
        };
        let io = live
            .with(|s| s.spawn(spawn))
            .map_err(|e| format!("running the template's ready command: {e}"))?;
        // One run that never ends is bounded by the same deadline; the sandbox that fails to
        // start then takes it down.
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        let Ok((_, end)) = tokio::time::timeout(remaining, io.output(64 << 10)).await else {
            return Err(format!(
                "the template's ready command {command:?} did not finish within {} s",
                limit.as_secs()
            ));
        };
        if end == AgentEnd::Exited(0) {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "the template's ready command {command:?} did not succeed within {} s (last: {end:?})",
                limit.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
