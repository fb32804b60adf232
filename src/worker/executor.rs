//! The build executor: runs one frozen build in a sandbox, step by step, as PROTOCOL §3.7 says.
//!
//! Order: base (resolve, boot, and for images the implicit `USER user` with sudo), then each
//! user step (ENV, WORKDIR, USER, RUN, COPY), a checkpoint after every mutating step (RUN, COPY,
//! WORKDIR) recorded as a build-cache snapshot together with the step's progress, then
//! finalization (start and ready commands) when either is set, by E2B's rules
//! ([`crate::domain::start`]). The result is the layer stack
//! and the final command context; publishing it is [`super::publish`]'s job.
//!
//! Before booting, the step cache is consulted ([`super::cache`], ADR 0008): a final hit skips
//! every step and returns the cached result; a checkpoint hit boots on that checkpoint and runs
//! only the steps after it. Each checkpoint then publishes its cache entry.
//!
//! Every sandbox operation races the attempt's cancellation token: when the lease is lost the
//! operation is dropped, the sandbox destroyed, and the build abandoned without another write.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::attempt::Attempt;
use super::base::{self, BaseError, ResolvedBase};
use super::build_log::{BuildLog, LogLine};
use super::cache::{self, Flights, Found};
use super::copy_from;
use super::error::{Fence, WorkerError};
use super::job::BuildJob;
use super::layer_hold::{self, Held};
use super::settings::WorkerSettings;
use super::shell;
use crate::domain::build::status::LogLevel;
use crate::domain::build::{Binding, FailedStep};
use crate::domain::build_spec::{
    home_of, resolve_path, BaseSource, Step, StepContext, DEFAULT_USER,
};
use crate::domain::ids::{self, SnapshotId};
use crate::domain::snapshot::{Purpose, SnapshotRecord};
use crate::domain::start::{self, StartCommands};
use crate::vmm::image::ImageCatalog;
use crate::vmm::start_failure::StartFailure;
use crate::vmm::{
    BlobStore, BootSpec, CommandLine, CopyRequest, ExecOutcome, ExecRequest, Limits, OutputSink,
    OutputStream, Sandbox, SandboxBackend, VmmError,
};

/// Most output an ENV or WORKDIR value's evaluation may write: the value is held in memory and
/// recorded in the template.
const ENV_VALUE_MAX_BYTES: usize = 1 << 20;

/// A build that failed: where, and the message the SDK raises.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepFailure {
    pub step: FailedStep,
    pub message: String,
}

/// A finished build's result.
#[derive(Debug, Clone)]
pub struct BuildOutput {
    /// Bottom first: base layers, then checkpoints.
    pub layers: Vec<ids::Digest>,
    pub context: StepContext,
    pub base_image_digest: Option<ids::Digest>,
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
    /// The stack before finalization, when finalization added a layer.
    pub build_base_layers: Option<Vec<ids::Digest>>,
    /// The final cache entry to publish once the build is Ready (none when the build did not
    /// use the cache, or its result came from the cache).
    pub cache: Option<cache::FinalPublication>,
}

#[derive(Debug)]
pub enum Outcome {
    Built(Box<BuildOutput>),
    Failed(StepFailure),
}

/// Why the step loop stopped early.
enum Stop {
    Failed(StepFailure),
    Abandon(WorkerError),
}

impl From<WorkerError> for Stop {
    fn from(e: WorkerError) -> Self {
        Stop::Abandon(e)
    }
}

fn fail(step: FailedStep, message: impl Into<String>) -> Stop {
    Stop::Failed(StepFailure {
        step,
        message: message.into(),
    })
}

pub struct Executor<'a> {
    pub backend: &'a dyn SandboxBackend,
    pub blobs: Arc<dyn BlobStore>,
    pub catalog: &'a ImageCatalog,
    pub puller: &'a crate::registry::Puller,
    pub settings: &'a WorkerSettings,
    pub attempt: &'a Attempt,
    pub log: BuildLog,
    pub cancel: CancellationToken,
    /// Single-flight for identical builds on this node.
    pub flights: Flights,
}

/// The running state of the step loop.
struct Run {
    sandbox: Box<dyn Sandbox>,
    context: StepContext,
    has_bash: bool,
    /// Changes since the last checkpoint that no step checkpoints (user creation).
    dirty: bool,
    /// Publishes this build's cache entries; `None` when the build bypasses the cache.
    cache: Option<cache::Writer>,
    /// The templates COPY_FROM steps copy out of, resolved once per attempt.
    sources: std::collections::BTreeMap<String, copy_from::CopySource>,
}

impl Executor<'_> {
    /// Runs the build. `Err` means the attempt was abandoned (fenced out, lease lost, or the
    /// node could not reach its database): nothing more may be written for it.
    pub async fn run(&self, job: &BuildJob) -> Result<Outcome, WorkerError> {
        let base_line = match &job.spec.base {
            BaseSource::Image { reference, .. } => format!("FROM {reference}"),
            BaseSource::Template { reference } => format!("FROM TEMPLATE {reference}"),
        };
        self.log.info(Some("base"), format!("[base] {base_line}"));
        let registry = base::Registry {
            puller: self.puller,
            credentials: job.credentials.clone(),
            pin: job.base_pin.as_ref(),
            log: &self.log,
        };
        let resolve = base::resolve(
            &self.attempt.store,
            self.catalog,
            registry,
            &job.team,
            &job.spec.base,
        );
        let resolved = tokio::select! {
            biased;
            _ = self.cancel.cancelled() => return Err(self.abandoned()),
            r = resolve => r,
        };
        let resolved = match resolved {
            Ok(r) => r,
            Err(BaseError::Unavailable(m)) => {
                return Ok(Outcome::Failed(StepFailure {
                    step: FailedStep::Base,
                    message: m,
                }))
            }
            Err(BaseError::Worker(e)) => return Err(e),
        };
        if let (Some(pin), None) = (&resolved.pin, &job.base_pin) {
            self.attempt.pin_base_image(pin).await?;
        }
        let sources =
            match copy_from::resolve_all(&self.attempt.store, &job.team, &job.spec.steps).await? {
                Ok(sources) => sources,
                Err(failure) => return Ok(Outcome::Failed(failure)),
            };
        for (template, source) in &sources {
            self.log.info(
                None,
                format!("[copy-from] {template}: its ready build {}", source.build),
            );
        }
        let (mut writer, found, flight) = self.consult_cache(job, &resolved, &sources).await?;
        let hit = !matches!(found, Found::Nothing);
        let found = match self.hold_layers(&resolved, found).await? {
            Ok(found) => found,
            Err(failure) => return Ok(Outcome::Failed(failure)),
        };
        if hit && matches!(found, Found::Nothing) {
            // The hit's entry is being retired by GC: the chain this writer would extend is gone.
            writer = None;
        }
        let total = job.spec.steps.len();
        let (layers, context, start) = match found {
            Found::Final {
                candidate_id,
                candidate,
                build_base,
            } => {
                self.record_cached(job, total, candidate_id).await?;
                let start = start_commands(job, &resolved);
                return Ok(Outcome::Built(Box::new(BuildOutput {
                    layers: candidate.layers,
                    context: candidate.context,
                    base_image_digest: candidate.base_image_digest,
                    start_cmd: start.as_ref().and_then(|s| s.start_cmd.clone()),
                    ready_cmd: start.as_ref().and_then(|s| s.ready_cmd.clone()),
                    build_base_layers: build_base.map(|b| b.layers),
                    cache: None,
                })));
            }
            Found::Checkpoint {
                step,
                snapshot,
                record,
                ..
            } => {
                self.record_cached(job, step, snapshot).await?;
                (record.layers, record.context, step)
            }
            Found::Nothing => (resolved.layers.clone(), resolved.context.clone(), 0),
        };
        let boot = self.boot(job, layers, &context);
        let sandbox = tokio::select! {
            biased;
            _ = self.cancel.cancelled() => return Err(self.abandoned()),
            s = boot => s,
        };
        let sandbox = match sandbox {
            Ok(s) => s,
            Err(e) => {
                return Ok(Outcome::Failed(StepFailure {
                    step: FailedStep::Base,
                    message: format!("booting a sandbox on the base failed: {e}"),
                }))
            }
        };
        let mut run = Run {
            sandbox,
            context,
            has_bash: false,
            dirty: false,
            cache: writer,
            sources,
        };
        let result = self.steps(job, &resolved, &mut run, start).await;
        if let Err(e) = run.sandbox.destroy().await {
            tracing::warn!(build = %self.attempt.build, error = %e, "destroying the build sandbox failed");
        }
        match result {
            Ok(mut output) => {
                output.cache = run.cache.take().map(|writer| cache::FinalPublication {
                    writer,
                    flight: flight.clone(),
                });
                Ok(Outcome::Built(Box::new(output)))
            }
            Err(Stop::Failed(f)) => Ok(Outcome::Failed(f)),
            Err(Stop::Abandon(e)) => Err(e),
        }
    }

    /// Leases the layers the attempt is about to read: a cache hit's, or else the base's. A hit
    /// whose layers a GC pass is deleting becomes a miss (the pass retired its entry); base
    /// layers being deleted are waited for and stored again from this node's copy.
    async fn hold_layers(
        &self,
        resolved: &ResolvedBase,
        found: Found,
    ) -> Result<Result<Found, StepFailure>, WorkerError> {
        let hit_layers: Option<Vec<ids::Digest>> = match &found {
            Found::Final {
                candidate,
                build_base,
                ..
            } => Some(
                candidate
                    .layers
                    .iter()
                    .chain(build_base.iter().flat_map(|b| b.layers.iter()))
                    .copied()
                    .collect(),
            ),
            Found::Checkpoint { record, .. } => Some(record.layers.clone()),
            Found::Nothing => None,
        };
        if let Some(layers) = hit_layers {
            match layer_hold::lease(self.attempt, &layers, &[]).await? {
                Held::Leased => return Ok(Ok(found)),
                Held::Refused(e) => {
                    self.log.info(
                        None,
                        format!("[cache] a layer of the cached result is being deleted ({e}); building without it"),
                    );
                }
            }
        }
        let base = resolved.layers.as_slice();
        let mut restored = Vec::new();
        for round in 0..2 {
            match layer_hold::lease(self.attempt, base, &restored).await? {
                Held::Leased => return Ok(Ok(Found::Nothing)),
                Held::Refused(e) if round == 0 => {
                    self.log.info(
                        Some("base"),
                        format!("[base] a base layer is being deleted ({e}); waiting, then storing it again"),
                    );
                    let (stored, missing) =
                        layer_hold::recreate(self.attempt, self.backend, base).await?;
                    restored = stored;
                    if !missing.is_empty() {
                        return Ok(Err(StepFailure {
                            step: FailedStep::Base,
                            message: format!(
                                "base layer {} was deleted by garbage collection and this node has no copy; build again to fetch the base anew",
                                missing[0]
                            ),
                        }));
                    }
                }
                Held::Refused(e) => {
                    return Ok(Err(StepFailure {
                        step: FailedStep::Base,
                        message: format!("a base layer could not be leased: {e}; build again"),
                    }))
                }
            }
        }
        unreachable!("the loop returns in its second round")
    }

    fn abandoned(&self) -> WorkerError {
        WorkerError::Fenced {
            build: self.attempt.build,
            epoch: self.attempt.epoch,
            reason: Fence::Stopped,
        }
    }

    /// Computes the build's keys and looks it up. Identical builds on this node wait for each
    /// other here (single-flight); the guard is released once the leader's final entry is
    /// written (or when this build ends otherwise). A read failure bypasses the cache: the
    /// build then neither reads nor writes it.
    #[allow(clippy::type_complexity)]
    async fn consult_cache(
        &self,
        job: &BuildJob,
        resolved: &ResolvedBase,
        sources: &std::collections::BTreeMap<String, copy_from::CopySource>,
    ) -> Result<
        (
            Option<cache::Writer>,
            Found,
            Option<Arc<tokio::sync::OwnedMutexGuard<()>>>,
        ),
        WorkerError,
    > {
        if let Some(backend) = &job.sandbox_backend {
            for (level, why) in &backend.skipped {
                self.log.info(
                    None,
                    format!(
                        "[sandbox] {}: {why}; skipped",
                        level.describe(crate::domain::backend_name::SERVICE_VARIABLE)
                    ),
                );
            }
            // One backend today, so every node runs it; a second is a new arm here.
            match backend.backend {
                crate::domain::backend_name::BackendName::Namespace => self
                    .log
                    .info(None, format!("[sandbox] backend {}", backend.describe())),
            }
        }
        if let Some(mode) = &job.cache_mode {
            for (level, why) in &mode.skipped {
                self.log
                    .info(None, format!("[cache] {}: {why}; skipped", level.as_str()));
            }
            self.log.info(
                None,
                format!("[cache] mode {} ({})", mode.mode, mode.level.as_str()),
            );
        }
        let identities = copy_from::identities(sources);
        let plan = match cache::Plan::new(job, resolved, &identities, self.backend.name()) {
            Ok(p) => p,
            Err(e) => {
                self.log.info(
                    None,
                    format!("[cache] not cacheable: {e}; building without the cache"),
                );
                return Ok((None, Found::Nothing, None));
            }
        };
        if !job.cache_mode().reads() {
            let level = job
                .cache_mode
                .as_ref()
                .map_or("default", |m| m.level.as_str());
            let found = crate::domain::build::CacheFound::Bypassed {
                reason: format!("cache mode off ({level})"),
            };
            super::cache_consultation::record(self.attempt, &plan, resolved, found).await?;
            self.log.info(
                None,
                "[cache] mode off: every step runs, nothing is read or written",
            );
            return Ok((None, Found::Nothing, None));
        }
        let flight = if plan.force_from.is_none() {
            let lock = self.flights.lock_for(&plan.scope, &plan.chain.final_key);
            let guard = match lock.clone().try_lock_owned() {
                Ok(g) => g,
                Err(_) => {
                    self.log.info(
                        None,
                        "[cache] an identical build is running on this node; waiting for its result",
                    );
                    tokio::select! {
                        biased;
                        _ = self.cancel.cancelled() => return Err(self.abandoned()),
                        g = lock.lock_owned() => g,
                    }
                }
            };
            Some(Arc::new(guard))
        } else {
            None
        };
        match cache::lookup(
            &self.attempt.store,
            &self.blobs,
            &plan,
            &job.spec.steps,
            &self.log,
        )
        .instrument(tracing::info_span!("build.cache_lookup"))
        .await
        {
            Ok(lookup) => {
                let found = super::cache_consultation::found_of(&lookup.found);
                super::cache_consultation::record(self.attempt, &plan, resolved, found).await?;
                let writer = cache::Writer::new(plan, &lookup);
                Ok((Some(writer), lookup.found, flight))
            }
            Err(e) => {
                let found = crate::domain::build::CacheFound::Bypassed {
                    reason: e.to_string(),
                };
                super::cache_consultation::record(self.attempt, &plan, resolved, found).await?;
                tracing::warn!(build = %self.attempt.build, error = %e, "cache bypassed");
                self.log.info(
                    None,
                    format!("[cache] {e}; building without the cache (nothing is read or written)"),
                );
                Ok((None, Found::Nothing, flight))
            }
        }
    }

    /// Records steps `1..=upto` as cached by `snapshot`, with their progress lines.
    async fn record_cached(
        &self,
        job: &BuildJob,
        upto: usize,
        snapshot: SnapshotId,
    ) -> Result<(), WorkerError> {
        let total = job.spec.steps.len();
        for (i, step) in job.spec.steps.iter().take(upto).enumerate() {
            let number = i as u32 + 1;
            self.log.info(
                Some(&number.to_string()),
                format!(
                    "[{number}/{total}] CACHED {} {}",
                    step.kind(),
                    step.args().join(" ")
                ),
            );
        }
        if upto > 0 {
            self.attempt
                .record_cached_prefix(upto as u32, snapshot)
                .await?;
        }
        Ok(())
    }

    /// What every sandbox of `job` runs under: its steps' and the sources its COPY --from
    /// steps read.
    fn limits(&self, job: &BuildJob) -> Limits {
        Limits {
            cpus: Some(f64::from(job.resources.effective_cpu_count())),
            memory_bytes: Some(u64::from(job.resources.effective_memory_mb()) << 20),
            disk_min_free: job.resources.min_free_disk_mb.map(|mb| u64::from(mb) << 20),
            timeout: self.settings.step_timeout,
            ..Limits::default()
        }
    }

    async fn boot(
        &self,
        job: &BuildJob,
        layers: Vec<ids::Digest>,
        context: &StepContext,
    ) -> Result<Box<dyn Sandbox>, VmmError> {
        let mut spec = BootSpec::new(layers);
        spec.limits = self.limits(job);
        spec.context = vmm_context(context);
        let started = std::time::Instant::now();
        let booted = self.backend.boot(spec).await;
        crate::metrics::sandbox_boot(booted.is_ok(), started.elapsed());
        booted
    }

    /// Awaits `op` unless the attempt is cancelled first.
    async fn guarded<T>(&self, op: impl std::future::Future<Output = T>) -> Result<T, Stop> {
        tokio::select! {
            biased;
            _ = self.cancel.cancelled() => Err(Stop::Abandon(self.abandoned())),
            r = op => Ok(r),
        }
    }

    async fn steps(
        &self,
        job: &BuildJob,
        base: &ResolvedBase,
        run: &mut Run,
        start: usize,
    ) -> Result<BuildOutput, Stop> {
        let probe = ExecRequest::shell("[ -x /bin/bash ]").user("root");
        let outcome = self
            .guarded(run.sandbox.exec(probe, OutputSink::discard()))
            .await?;
        run.has_bash = outcome
            .map_err(|e| {
                fail(
                    FailedStep::Base,
                    format!("the base cannot run commands: {e}"),
                )
            })?
            .success();
        // A checkpoint already holds the default user.
        if !base.from_template && start == 0 {
            self.log
                .info(Some("base"), format!("[base] USER {DEFAULT_USER}"));
            self.guarded(run.sandbox.ensure_user(DEFAULT_USER, true))
                .await?
                .map_err(|e| {
                    fail(
                        FailedStep::Base,
                        format!("creating the default user {DEFAULT_USER:?} failed: {e}"),
                    )
                })?;
            run.context.user = DEFAULT_USER.to_owned();
            run.context.workdir = home_of(DEFAULT_USER);
            run.dirty = true;
        }
        let total = job.spec.steps.len();
        let mut budget = self.checkpoint_budget(job, base, run, start)?;
        if !job.cache_mode().checkpoints() {
            // `final` and `off`: one capture at the end, as a build past the depth budget.
            budget = 0;
        }
        for (i, step) in job.spec.steps.iter().enumerate().skip(start) {
            let number = i as u32 + 1;
            let tag = number.to_string();
            self.log.info(
                Some(&tag),
                format!(
                    "[{number}/{total}] {} {}",
                    step.kind(),
                    step.args().join(" ")
                ),
            );
            run.sandbox
                .context_mut()
                .clone_from(&vmm_context(&run.context));
            let started = std::time::Instant::now();
            let stepped = self
                .step(job, number, &tag, step, run)
                .instrument(tracing::info_span!(
                    "build.step",
                    step = number,
                    kind = step.kind()
                ))
                .await;
            if !matches!(stepped, Err(Stop::Abandon(_))) {
                crate::metrics::step_finished(step.kind(), stepped.is_ok(), started.elapsed());
            }
            stepped?;
            if step.is_mutating() && budget == 0 {
                // Past the budget: the changes stay in the writable layer until the final seal.
                run.dirty = true;
                self.attempt.record_step(number).await?;
            } else if step.is_mutating() {
                budget -= 1;
                self.checkpoint(number, job, base, run, Purpose::BuildCache)
                    .await?;
            } else {
                self.attempt.record_step(number).await?;
            }
        }
        if run.dirty {
            self.seal(run, FailedStep::Step(total.max(1) as u32))
                .await?;
        }
        let before_finalize = layers_of(run.sandbox.as_ref());
        let mut build_base_layers = None;
        let start = start_commands(job, base);
        if let Some(commands) = &start {
            // A build's own commands run in its final context; inherited ones in the parent's
            // (E2B keeps the context with the commands).
            let context =
                if StartCommands::of(job.spec.start_cmd.as_deref(), job.spec.ready_cmd.as_deref())
                    .is_some()
                {
                    run.context.clone()
                } else {
                    base.context.clone()
                };
            self.finalize(commands, &context, run).await?;
            self.seal(run, FailedStep::Finalize).await?;
            build_base_layers = Some(before_finalize);
        }
        Ok(BuildOutput {
            layers: layers_of(run.sandbox.as_ref()),
            context: run.context.clone(),
            base_image_digest: base.image_digest,
            start_cmd: start.as_ref().and_then(|s| s.start_cmd.clone()),
            ready_cmd: start.as_ref().and_then(|s| s.ready_cmd.clone()),
            build_base_layers,
            cache: None,
        })
    }

    /// How many of the remaining mutating steps get a checkpoint (RFC §Depth budget): what the
    /// overlay limit leaves on this stack after the captures every build must still take (the
    /// final seal, and the finalization seal with a start command). A stack that cannot take
    /// those fails at `base`; past the budget, steps run without checkpoints.
    fn checkpoint_budget(
        &self,
        job: &BuildJob,
        base: &ResolvedBase,
        run: &Run,
        start: usize,
    ) -> Result<usize, Stop> {
        let depth = run.sandbox.layers().len();
        let reserved = 1 + usize::from(start_commands(job, base).is_some());
        let limit = self.settings.depth.overlay_max;
        if depth + reserved > limit {
            return Err(fail(
                FailedStep::Base,
                format!(
                    "the base stack has {depth} layers; a build must add up to {reserved} more and a sandbox takes at most {limit}: compact the base (fewer, larger layers) and build again"
                ),
            ));
        }
        let mutating = job.spec.steps[start..]
            .iter()
            .filter(|s| s.is_mutating())
            .count();
        let budget = (limit - depth - reserved).min(mutating);
        if budget < mutating {
            self.log.info(
                None,
                format!(
                    "[depth] the stack has {depth} of {limit} layers: {budget} of {mutating} mutating steps get a checkpoint, the rest run without one"
                ),
            );
        }
        Ok(budget)
    }

    async fn step(
        &self,
        job: &BuildJob,
        number: u32,
        tag: &str,
        step: &Step,
        run: &mut Run,
    ) -> Result<(), Stop> {
        let at = FailedStep::Step(number);
        match step {
            Step::Env { vars, .. } => {
                for (key, value) in vars {
                    let user = run.context.user.clone();
                    let evaluated = match self.eval_env(value, &user, run).await {
                        Ok(v) => v,
                        Err(EnvError::Stop(stop)) => return Err(stop),
                        Err(EnvError::Message(m)) => {
                            return Err(fail(
                                at,
                                format!("ENV {key}: evaluating {value:?} failed: {m}"),
                            ))
                        }
                    };
                    run.context.env.insert(key.clone(), evaluated);
                    run.sandbox
                        .context_mut()
                        .clone_from(&vmm_context(&run.context));
                }
            }
            Step::Workdir { path, .. } => {
                // As E2B: a relative path joins the current workdir, then the shell expands
                // variables (`WORKDIR $APP`) as root with the build's environment (ADR 0012).
                let joined = resolve_path(&run.context.workdir, path);
                let target = if joined.contains('$') {
                    match self.eval_env(&joined, "root", run).await {
                        Ok(v) => resolve_path("/", &v),
                        Err(EnvError::Stop(stop)) => return Err(stop),
                        Err(EnvError::Message(m)) => {
                            return Err(fail(
                                at,
                                format!("WORKDIR {path}: expanding {joined:?} failed: {m}"),
                            ))
                        }
                    }
                } else {
                    joined
                };
                let request = ExecRequest::shell(shell::WORKDIR_SCRIPT)
                    .user("root")
                    .cwd("/")
                    .env("STRATA_WORKDIR", target.clone())
                    .env("STRATA_OWNER", run.context.user.clone());
                let (outcome, last_err) = self.exec_logged(run, request, tag).await?;
                match outcome {
                    Ok(o) if o.success() => run.context.workdir = target,
                    other => {
                        return Err(fail(
                            at,
                            format!(
                                "WORKDIR {target} could not be created: {}",
                                describe(other, last_err)
                            ),
                        ))
                    }
                }
            }
            Step::User { name, sudo, .. } => {
                self.guarded(run.sandbox.ensure_user(name, sudo.unwrap_or(false)))
                    .await?
                    .map_err(|e| fail(at, format!("USER {name}: {e}")))?;
                run.context.user = name.clone();
                run.dirty = true;
            }
            Step::Run { command, user, .. } => {
                let argv = if run.has_bash {
                    vec![
                        "/bin/bash".into(),
                        "-l".into(),
                        "-c".into(),
                        command.clone(),
                    ]
                } else {
                    vec!["/bin/sh".into(), "-c".into(), command.clone()]
                };
                let request = ExecRequest {
                    command: CommandLine::Argv(argv),
                    user: Some(user.clone().unwrap_or_else(|| run.context.user.clone())),
                    env: Vec::new(),
                    cwd: Some(run.context.workdir.clone()),
                    timeout: Some(self.settings.step_timeout),
                };
                let (outcome, last_err) = self.exec_logged(run, request, tag).await?;
                match outcome {
                    Ok(o) if o.success() => {}
                    Ok(ExecOutcome::TimedOut) => {
                        return Err(fail(
                            at,
                            format!(
                                "RUN timed out after {}",
                                humanize(self.settings.step_timeout)
                            ),
                        ))
                    }
                    Err(VmmError::CommandStart(failure)) => {
                        return Err(fail(at, start_failure_reason(command, &failure)));
                    }
                    other => {
                        let mut reason = format!("RUN failed {}", describe(other, last_err));
                        if let Some(note) = run.sandbox.disk_note() {
                            reason = format!("{reason} ({note})");
                        } else if let Some(note) = self.backend.network_note() {
                            reason = format!("{reason} ({note})");
                        }
                        return Err(fail(at, reason));
                    }
                }
            }
            Step::Copy {
                src,
                dest,
                owner,
                mode,
                files_hash,
                ..
            } => {
                let binding = job.bindings.get(files_hash).ok_or_else(|| {
                    fail(
                        at,
                        format!("COPY {src}: no upload is bound for filesHash {files_hash}"),
                    )
                })?;
                let archive = match self.fetch_archive(binding).await {
                    Ok(archive) => archive,
                    Err(m) => {
                        self.retire_if_torn(job, files_hash, binding).await;
                        return Err(fail(at, format!("COPY {src}: {m}")));
                    }
                };
                let mut request = CopyRequest::new(src.clone(), dest.clone());
                request.owner = owner.clone();
                request.mode = mode.clone();
                let copied = self
                    .guarded(run.sandbox.copy_in(archive.path(), request))
                    .await?;
                if let Err(e) = copied {
                    let mut reason = format!("COPY {src} {dest}: {e}");
                    if let Some(note) = run.sandbox.disk_note() {
                        reason = format!("{reason} ({note})");
                    }
                    return Err(fail(at, reason));
                }
                crate::fault::crash_point("worker:mid-copy");
            }
            Step::CopyFrom {
                template,
                src,
                dest,
                owner,
                mode,
                ..
            } => {
                let source = run.sources.get(template).cloned().ok_or_else(|| {
                    fail(
                        at,
                        format!("COPY_FROM {template}: the source was not resolved"),
                    )
                })?;
                let max = self
                    .settings
                    .sandbox_disk
                    .max
                    .unwrap_or(crate::vmm::namespace::scratch::DiskConfig::DEFAULT_MAX);
                let tmp_dir = self.settings.data_dir.join("tmp");
                let archived = copy_from::archive(
                    self.backend,
                    self.attempt,
                    copy_from::From {
                        template,
                        source: &source,
                        path: src,
                    },
                    self.limits(job),
                    &tmp_dir,
                    max,
                );
                let archive = match self.guarded(archived).await?.map_err(Stop::Abandon)? {
                    Ok(archive) => archive,
                    Err(m) => return Err(fail(at, format!("COPY_FROM {template} {src}: {m}"))),
                };
                // The archive's top entry is named after the source's last component.
                let name = std::path::Path::new(src)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let mut request = CopyRequest::new(name, dest.clone());
                request.owner = owner.clone();
                request.mode = mode.clone();
                // A Dockerfile's COPY --from --chown: a directory's new destination is the
                // owner's, as Docker makes it.
                request.owns_created_dest = true;
                let copied = self
                    .guarded(run.sandbox.copy_in(archive.path(), request))
                    .await?;
                if let Err(e) = copied {
                    let mut reason = format!("COPY_FROM {template} {src} {dest}: {e}");
                    if let Some(note) = run.sandbox.disk_note() {
                        reason = format!("{reason} ({note})");
                    }
                    return Err(fail(at, reason));
                }
            }
        }
        Ok(())
    }

    /// Evaluates one value (an ENV value, a WORKDIR path) in the sandbox as `user`, with the
    /// environment so far (so `$HOME` is that user's home). Runs in `/`: the current workdir
    /// may be gone.
    async fn eval_env(&self, value: &str, user: &str, run: &mut Run) -> Result<String, EnvError> {
        let request = ExecRequest::shell(shell::env_eval_command(value))
            .user(user.to_owned())
            .cwd("/");
        let (sink, collecting) = OutputSink::collect(ENV_VALUE_MAX_BYTES);
        let outcome = self
            .guarded(run.sandbox.exec(request, sink))
            .await
            .map_err(EnvError::Stop)?;
        let output = collecting.finish().await;
        match outcome {
            Ok(_) if output.dropped_lines > 0 => Err(EnvError::Message(format!(
                "the value and its messages are longer than {} KiB; a value this long belongs in a file",
                ENV_VALUE_MAX_BYTES >> 10
            ))),
            Ok(o) if o.success() => Ok(output.lines_of(OutputStream::Stdout).join("\n")),
            Ok(o) => Err(EnvError::Message(format!(
                "{o:?}: {}",
                output.lines_of(OutputStream::Stderr).join(" ")
            ))),
            Err(e) => Err(EnvError::Message(e.to_string())),
        }
    }

    /// Runs a command, forwarding every output line to the build log under `step`. Returns the
    /// outcome and the last stderr line.
    async fn exec_logged(
        &self,
        run: &mut Run,
        request: ExecRequest,
        step: &str,
    ) -> Result<(Result<ExecOutcome, VmmError>, Option<String>), Stop> {
        let (sink, mut rx) = OutputSink::channel();
        let log = self.log.clone();
        let step = step.to_owned();
        let forward = tokio::spawn(async move {
            let mut last_err = None;
            while let Some(l) = rx.recv().await {
                let level = match l.stream {
                    OutputStream::Stdout => LogLevel::Info,
                    OutputStream::Stderr => {
                        if !l.line.trim().is_empty() {
                            last_err = Some(l.line.clone());
                        }
                        LogLevel::Error
                    }
                };
                log.output(LogLine {
                    at: l.at,
                    level,
                    message: l.line,
                    step: Some(step.clone()),
                })
                .await;
            }
            last_err
        });
        let outcome = match self.guarded(run.sandbox.exec(request, sink)).await {
            Ok(outcome) => outcome,
            // Abandoned: the command's output pumps end only when the sandbox is destroyed,
            // which must not wait for them.
            Err(stop) => {
                forward.abort();
                return Err(stop);
            }
        };
        let last_err = match tokio::time::timeout(Duration::from_secs(10), forward).await {
            Ok(Ok(l)) => l,
            _ => None,
        };
        Ok((outcome, last_err))
    }

    /// Streams a frozen context archive out of the blob store into a temporary file, verifying
    /// its digest on the way.
    async fn fetch_archive(&self, binding: &Binding) -> Result<tempfile::NamedTempFile, String> {
        let digest = binding.blob_digest;
        let blobs = self.blobs.clone();
        let tmp_dir = self.settings.data_dir.join("tmp");
        tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&tmp_dir)
                .map_err(|e| format!("creating {}: {e}", tmp_dir.display()))?;
            let mut file = tempfile::NamedTempFile::new_in(&tmp_dir)
                .map_err(|e| format!("creating a temporary file: {e}"))?;
            let mut reader = blobs.open_verified(&digest).map_err(|e| {
                format!("the uploaded archive {digest} cannot be read: {e}; upload it again")
            })?;
            std::io::copy(&mut reader, file.as_file_mut()).map_err(|e| {
                format!("reading the uploaded archive {digest}: {e}; upload it again")
            })?;
            reader
                .finish()
                .map_err(|e| format!("the uploaded archive {digest} is corrupt: {e}"))?;
            file.as_file_mut()
                .flush()
                .map_err(|e| format!("writing a temporary file: {e}"))?;
            Ok(file)
        })
        .await
        .map_err(|e| format!("archive task: {e}"))?
    }

    /// After a failed fetch of `binding`: when the blob store's own check says its bytes are
    /// missing or torn (a torn file is moved to quarantine by that check), the generation is
    /// retired, so that the next link answers `present: false` and the SDK uploads again
    /// instead of every build of this content failing. A check that cannot answer (a store
    /// outage) retires nothing. This build still fails: its bindings are frozen.
    async fn retire_if_torn(&self, job: &BuildJob, hash: &ids::FilesHash, binding: &Binding) {
        let (blobs, digest) = (self.blobs.clone(), binding.blob_digest);
        let intact = tokio::task::spawn_blocking(move || blobs.intact_size(&digest)).await;
        if !matches!(intact, Ok(Ok(None))) {
            return;
        }
        let reason = format!(
            "build {} could not read archive {digest}: missing or torn in the blob store",
            self.attempt.build
        );
        let retired = crate::app::upload::retire_generation(
            &self.attempt.store,
            &self.attempt.context(),
            &crate::domain::ids::Scope::team(&job.team),
            hash,
            binding.generation,
            digest,
            &reason,
        )
        .await;
        match retired {
            Ok(()) => {
                tracing::warn!(build = %self.attempt.build, %hash, generation = %binding.generation, %digest, "an uploaded archive is torn or missing; retired its generation, the next link asks for an upload")
            }
            Err(e) => {
                tracing::error!(build = %self.attempt.build, %hash, %digest, error = %e, "retiring the generation of a torn archive failed")
            }
        }
    }

    /// Seals the sandbox's changes as a layer (no step record). A step that changed nothing
    /// adds no layer: its checkpoint is its parent's stack (ADR 0012).
    async fn seal(&self, run: &mut Run, at: FailedStep) -> Result<(), Stop> {
        self.guarded(run.sandbox.checkpoint())
            .await?
            .map_err(|e| fail(at, format!("checkpoint failed: {e}")))?;
        run.dirty = false;
        Ok(())
    }

    /// Seals a mutating step and records it as a snapshot plus the step's progress and its
    /// cache entry, in one append fenced by the epoch: a checkpoint that committed is always
    /// one a later build can find.
    async fn checkpoint(
        &self,
        number: u32,
        job: &BuildJob,
        base: &ResolvedBase,
        run: &mut Run,
        purpose: Purpose,
    ) -> Result<SnapshotId, Stop> {
        self.seal(run, FailedStep::Step(number)).await?;
        let record = SnapshotRecord {
            purpose,
            layers: layers_of(run.sandbox.as_ref()),
            base_image_digest: base.image_digest,
            context: run.context.clone(),
            start_cmd: job.spec.start_cmd.clone(),
            ready_cmd: job.spec.ready_cmd.clone(),
            build: self.attempt.build,
            epoch: self.attempt.epoch,
        };
        let id = SnapshotId::from_uuid(uuid::Uuid::now_v7());
        let entry = run.cache.as_ref().and_then(|writer| {
            writer.checkpoint_entry(self.attempt, number as usize, id, &run.context)
        });
        crate::fault::stop_point("worker:before-checkpoint-record");
        let verdict = layer_hold::record_recreating(
            self.attempt,
            self.backend,
            id,
            &record,
            Some(number),
            entry.as_ref(),
        )
        .await?;
        crate::fault::crash_point("worker:after-checkpoint-record");
        if let (Some(writer), Some(entry)) = (run.cache.as_mut(), &entry) {
            writer
                .checkpoint_recorded(self.attempt, &self.log, number as usize, entry, verdict)
                .await;
        }
        Ok(id)
    }

    /// Starts the start command (when set) and retries the ready command until it succeeds,
    /// within the ready timeout, as `context`'s user, in its workdir and environment.
    async fn finalize(
        &self,
        commands: &StartCommands,
        context: &StepContext,
        run: &mut Run,
    ) -> Result<(), Stop> {
        let ready = commands.ready();
        let start = commands.start_cmd.as_deref().unwrap_or("");
        if !start.is_empty() {
            self.log
                .info(Some("finalize"), format!("[finalize] START {start}"));
        }
        self.log
            .info(Some("finalize"), format!("[finalize] READY {ready}"));
        run.sandbox.context_mut().clone_from(&vmm_context(context));
        let request = ExecRequest::shell(shell::FINALIZE_SCRIPT)
            .env("STRATA_START_CMD", start)
            .env("STRATA_READY_CMD", ready)
            .cwd(context.workdir.clone())
            .user(context.user.clone())
            .timeout(self.settings.ready_timeout);
        let (outcome, last_err) = self.exec_logged(run, request, "finalize").await?;
        run.sandbox
            .context_mut()
            .clone_from(&vmm_context(&run.context));
        match outcome {
            Ok(o) if o.success() => Ok(()),
            Ok(ExecOutcome::Exited(shell::START_FAILED_EXIT)) => Err(fail(
                FailedStep::Finalize,
                format!(
                    "the start command `{start}` failed before the template was ready{}",
                    last_err.map(|l| format!(": {l}")).unwrap_or_default()
                ),
            )),
            Ok(ExecOutcome::TimedOut) => Err(fail(
                FailedStep::Finalize,
                format!(
                    "the ready command `{ready}` did not succeed within {}",
                    humanize(self.settings.ready_timeout)
                ),
            )),
            other => Err(fail(
                FailedStep::Finalize,
                format!(
                    "the start/ready script failed {}",
                    describe(other, last_err)
                ),
            )),
        }
    }
}

/// The commands this build finalizes with (E2B's rules, [`crate::domain::start`]).
fn start_commands(job: &BuildJob, base: &ResolvedBase) -> Option<StartCommands> {
    start::effective(
        job.spec.start_cmd.as_deref(),
        job.spec.ready_cmd.as_deref(),
        base.inherited_start.clone(),
    )
}

/// ENV evaluation's failure: a message for the user, or a stop of the whole loop.
enum EnvError {
    Message(String),
    Stop(Stop),
}

fn layers_of(sandbox: &dyn Sandbox) -> Vec<ids::Digest> {
    sandbox.layers().to_vec()
}

fn vmm_context(ctx: &StepContext) -> crate::vmm::ExecDefaults {
    crate::vmm::ExecDefaults {
        env: ctx
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        user: ctx.user.clone(),
        workdir: Some(ctx.workdir.clone()),
    }
}

/// A RUN whose command could not start, worded as E2B's builder reports it (the envd error
/// behind `failed to run command …`), which code written against E2B matches on; strata's own
/// detail follows in parentheses.
fn start_failure_reason(command: &str, failure: &StartFailure) -> String {
    let envd = match failure {
        StartFailure::User { user, .. } => format!("unauthenticated: invalid username: '{user}'"),
        StartFailure::Workdir {
            dir, missing: true, ..
        } => format!("invalid_argument: cwd '{dir}' does not exist"),
        StartFailure::Workdir { dir, detail, .. } => {
            format!("invalid_argument: error starting process '{command}': chdir {dir}: {detail}")
        }
        StartFailure::Program { detail, .. } => {
            format!("invalid_argument: error starting process '{command}': {detail}")
        }
    };
    format!("failed to run command '{command}': command failed: {envd} ({failure})")
}

/// "with exit code 2: <last stderr line>", "(killed by signal 9)", ...
fn describe(outcome: Result<ExecOutcome, VmmError>, last_err: Option<String>) -> String {
    let what = match outcome {
        Ok(ExecOutcome::Exited(c)) => format!("with exit code {c}"),
        Ok(ExecOutcome::Signaled(s)) => format!("(killed by signal {s})"),
        Ok(ExecOutcome::TimedOut) => "(timed out)".to_owned(),
        Err(e) => format!("to start: {e}"),
    };
    match last_err {
        Some(line) => format!("{what}: {line}"),
        None => what,
    }
}

fn humanize(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 1.0 {
        format!("{s:.0} s")
    } else {
        format!("{} ms", d.as_millis())
    }
}
