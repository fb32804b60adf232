//! The step cache on the build node (RFC §Index records, §Publication; ADR 0008): the key chain
//! of a frozen build, the lookup that decides where the build starts, the entries it publishes,
//! and single-flight for identical builds on this node.
//!
//! * [`Plan`]: the fingerprint, base identity and key chain, computed before any sandbox exists,
//!   and where `force` starts.
//! * [`lookup`]: the final key first, then checkpoints deepest first; each probe is validated
//!   (kind, versions, lineage, target snapshot, layers intact in the blob store) and reported in the
//!   build log as `cache hit`, `cache miss` or `cache unapplied`. A read failure is transient: it
//!   bypasses the cache for the build, which then neither reads nor writes it.
//! * [`Writer`]: publishes checkpoint entries after their snapshot is recorded, and the final
//!   entry once the build is Ready. Create-if-absent; forced steps and entries this build saw to
//!   be invalid are replaced by compare-and-set on the pointer generation. A build that loses a
//!   race stops writing: its later checkpoints were built on a snapshot no entry references.
//! * [`Flights`]: identical builds (same scope and final key, not forced) run one at a time on a
//!   node; the followers then find the leader's final entry.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::attempt::Attempt;
use super::base::ResolvedBase;
use super::build_log::BuildLog;
use super::job::BuildJob;
use super::store_retry::retrying_when;
use crate::app::cache::{publish_entry, Guard, PublishEntry};
use crate::app::{CommandError, Refusal};
use crate::domain::build_spec::{fold_contexts, home_of, Step, StepContext, DEFAULT_USER};
use crate::domain::cache_entry::{
    self, Entry, EntryKind, Invalid, ParentEdge, Target, Validity, CACHE_FORMAT_VERSION,
};
use crate::domain::cache_key::{
    key_chain_with_sources, stack_identity, BaseIdentity, CacheKey, Finalization, Fingerprint,
    KeyChain, HASHING_VERSION,
};
use crate::domain::ids::{self, Digest, Scope, SnapshotId};
use crate::domain::snapshot::{Purpose, SnapshotRecord};
use crate::events::command::load;
use crate::events::EventStore;
use crate::streams::{cache_key_stream, snapshot_stream, CacheEntry, Snapshot};
use crate::vmm::BlobStore;

/// Bumped whenever step execution semantics change (how USER, ENV, WORKDIR, COPY behave), so
/// checkpoints made under older semantics are never resumed. 2: steps that change nothing add
/// no layer; WORKDIR expands variables (ADR 0012).
pub const BUILDER_SEMANTICS_VERSION: u64 = 2;
/// Bumped whenever start/ready handling changes. 2: E2B's finalize rules (ADR 0012).
pub const FINALIZATION_SEMANTICS_VERSION: u64 = 2;

/// The cache identity of one frozen build.
#[derive(Clone, Debug)]
pub struct Plan {
    pub scope: Scope,
    pub chain: KeyChain,
    /// The first step (1-based) whose reads are bypassed, sticky to the end: build-level `force`
    /// makes it 1; a step's `force` or `forceUpload` makes it that step.
    pub force_from: Option<usize>,
    /// The mutating steps (1-based) and their keys, in order.
    pub checkpoints: Vec<(usize, CacheKey)>,
    /// Cache mode `final`: only the final result's entry is read; checkpoint entries still
    /// validate its lineage but are never resumed from.
    pub final_only: bool,
}

impl Plan {
    pub fn new(
        job: &BuildJob,
        resolved: &ResolvedBase,
        sources: &BTreeMap<String, Digest>,
        backend: &str,
    ) -> Result<Plan, crate::domain::cache_key::KeyError> {
        // Images by manifest digest; a `fromTemplate` base by content (layers and context), so
        // an unchanged rebuild of the parent keeps the keys of templates derived from it.
        let stack = stack_identity(&resolved.layers, &resolved.context);
        let (base, image_digest) = match (resolved.from_template, resolved.image_digest, &stack) {
            (false, Some(digest), _) => (BaseIdentity::Image { digest }, digest),
            (_, digest, BaseIdentity::Stack { digest: content }) => {
                let d = digest.unwrap_or(*content);
                (stack.clone(), d)
            }
            _ => unreachable!("stack_identity returns a stack"),
        };
        let fingerprint = Fingerprint {
            backend: backend.to_owned(),
            backend_version: env!("CARGO_PKG_VERSION").to_owned(),
            base_image_digest: image_digest,
            architecture: std::env::consts::ARCH.to_owned(),
            // What the sandbox runs with, not what was asked: a build that names E2B's
            // defaults and one that names nothing run alike and share their entries.
            cpu_count: job.resources.effective_cpu_count(),
            memory_mb: job.resources.effective_memory_mb(),
            disk_mb: job.resources.min_free_disk_mb.unwrap_or(0).into(),
            builder_semantics_version: BUILDER_SEMANTICS_VERSION,
            hashing_version: HASHING_VERSION,
        };
        let mut start = resolved.context.clone();
        if !resolved.from_template {
            start.user = DEFAULT_USER.to_owned();
            start.workdir = home_of(DEFAULT_USER);
        }
        let context = fold_contexts(&start, &job.spec.steps)
            .last()
            .map(|s| s.after.clone())
            .unwrap_or(start);
        // The commands finalization will run, inherited ones included: a parent rebuilt with
        // other commands but the same layers must not hit this build's final entry.
        let start = crate::domain::start::effective(
            job.spec.start_cmd.as_deref(),
            job.spec.ready_cmd.as_deref(),
            resolved.inherited_start.clone(),
        );
        let finalization = Finalization {
            start_cmd: start.as_ref().and_then(|s| s.start_cmd.clone()),
            ready_cmd: start.as_ref().and_then(|s| s.ready_cmd.clone()),
            context,
            semantics_version: FINALIZATION_SEMANTICS_VERSION,
        };
        let chain = key_chain_with_sources(
            &fingerprint,
            &base,
            &job.spec.steps,
            &job.bindings,
            sources,
            &finalization,
        )?;
        let force_from = if job.spec.force {
            Some(1)
        } else {
            job.spec.steps.iter().position(is_forced).map(|i| i + 1)
        };
        let mut checkpoints = chain.checkpoints_deepest_first(&job.spec.steps);
        checkpoints.reverse();
        Ok(Plan {
            scope: Scope::team(&job.team),
            chain,
            force_from,
            checkpoints,
            final_only: job.cache_mode() == crate::domain::cache_mode::CacheMode::Final,
        })
    }

    fn readable(&self, step: usize) -> bool {
        self.force_from.is_none_or(|f| step < f)
    }

    fn forced(&self, step: usize) -> bool {
        !self.readable(step)
    }
}

fn is_forced(step: &Step) -> bool {
    match step {
        Step::Run { force, .. }
        | Step::Env { force, .. }
        | Step::Workdir { force, .. }
        | Step::User { force, .. }
        | Step::CopyFrom { force, .. } => *force,
        Step::Copy {
            force,
            force_upload,
            ..
        } => *force || *force_upload,
    }
}

/// A read of the index or a snapshot failed: not a verdict on any entry.
#[derive(Debug, thiserror::Error)]
#[error("reading the cache index failed: {0}")]
pub struct Transient(pub String);

fn transient<E: std::fmt::Display>(e: E) -> Transient {
    Transient(e.to_string())
}

/// Where the build starts.
#[derive(Clone, Debug)]
pub enum Found {
    /// Every step and finalization are cached: promote the result.
    Final {
        candidate_id: SnapshotId,
        candidate: SnapshotRecord,
        build_base: Option<SnapshotRecord>,
    },
    /// Boot on this checkpoint and run the steps after it.
    Checkpoint {
        step: usize,
        snapshot: SnapshotId,
        record: SnapshotRecord,
        edge: ParentEdge,
    },
    /// Run everything.
    Nothing,
}

/// What a lookup found and what it learned for repair.
#[derive(Clone, Debug)]
pub struct Lookup {
    pub found: Found,
    /// Keys whose entries were authoritatively invalid or unapplied, at the generation seen:
    /// this build replaces them when it publishes (repair), instead of deferring to them.
    pub repair: BTreeMap<CacheKey, u64>,
}

enum Probe {
    Hit(SnapshotRecord),
    Miss(Option<Invalid>),
    Unapplied(String),
}

/// Looks the build up: the final key, then its checkpoints deepest first.
pub async fn lookup(
    store: &EventStore,
    blobs: &Arc<dyn BlobStore>,
    plan: &Plan,
    steps: &[Step],
    log: &BuildLog,
) -> Result<Lookup, Transient> {
    let mut states = Vec::with_capacity(plan.checkpoints.len());
    for (_, key) in &plan.checkpoints {
        let loaded = load::<CacheEntry>(store, &cache_key_stream(&plan.scope, key))
            .await
            .map_err(transient)?;
        states.push((*key, loaded.state));
    }
    let mut repair = BTreeMap::new();
    let total = steps.len();
    if plan.force_from.is_none() {
        let key = plan.chain.final_key;
        let state = load::<CacheEntry>(store, &cache_key_stream(&plan.scope, &key))
            .await
            .map_err(transient)?
            .state;
        let probe = probe(
            store,
            blobs,
            &state,
            &key,
            EntryKind::FinalResult,
            plan,
            &states,
        )
        .await?;
        report(log, None, total, "final result", &probe);
        match probe {
            Probe::Hit(candidate) => {
                let candidate_id = state.live().expect("a hit is live").0.target.snapshot();
                let build_base = match state.live().map(|(e, _)| &e.target) {
                    Some(Target::FinalResult {
                        build_base_checkpoint: Some(id),
                        ..
                    }) => read_snapshot(store, id).await?,
                    _ => None,
                };
                return Ok(Lookup {
                    found: Found::Final {
                        candidate_id,
                        candidate,
                        build_base,
                    },
                    repair,
                });
            }
            Probe::Miss(None) => {}
            Probe::Miss(Some(_)) | Probe::Unapplied(_) => {
                repair.insert(key, state.pointer_generation);
            }
        }
    } else if let Some(from) = plan.force_from {
        log.info(
            None,
            format!("[cache] force from step {from}: the cache is not read from there on"),
        );
    }
    for ((step, key), (_, state)) in plan.checkpoints.iter().zip(&states).rev() {
        if plan.final_only {
            break;
        }
        if !plan.readable(*step) {
            continue;
        }
        let probe = probe(
            store,
            blobs,
            state,
            key,
            EntryKind::Checkpoint,
            plan,
            &states,
        )
        .await?;
        let what = format!(
            "{} {}",
            steps[step - 1].kind(),
            steps[step - 1].args().join(" ")
        );
        report(log, Some(*step), total, &what, &probe);
        match probe {
            Probe::Hit(record) => {
                let (entry, generation) = state.live().expect("a hit is live");
                return Ok(Lookup {
                    found: Found::Checkpoint {
                        step: *step,
                        snapshot: entry.target.snapshot(),
                        record,
                        edge: ParentEdge::Checkpoint {
                            key: *key,
                            snapshot: entry.target.snapshot(),
                            pointer_generation: generation,
                        },
                    },
                    repair,
                });
            }
            Probe::Miss(None) => {}
            Probe::Miss(Some(_)) | Probe::Unapplied(_) => {
                repair.insert(*key, state.pointer_generation);
            }
        }
    }
    Ok(Lookup {
        found: Found::Nothing,
        repair,
    })
}

/// The layers the build would boot on, as the index reads now, without validating anything:
/// the deepest live checkpoint's stack, else `base`. `None` when a live final entry means no
/// sandbox is booted at all. For placement (ADR 0020), which only wants a good guess; the
/// attempt's own [`lookup`] decides.
pub async fn resume_stack(
    store: &EventStore,
    plan: &Plan,
    base: &[ids::Digest],
) -> Result<Option<Vec<ids::Digest>>, Transient> {
    if plan.force_from.is_none() {
        let key = plan.chain.final_key;
        let state = load::<CacheEntry>(store, &cache_key_stream(&plan.scope, &key))
            .await
            .map_err(transient)?
            .state;
        if state.live().is_some() {
            return Ok(None);
        }
    }
    for (step, key) in plan.checkpoints.iter().rev() {
        if !plan.readable(*step) {
            continue;
        }
        let state = load::<CacheEntry>(store, &cache_key_stream(&plan.scope, key))
            .await
            .map_err(transient)?
            .state;
        let Some((entry, _)) = state.live() else {
            continue;
        };
        if let Some(record) = read_snapshot(store, &entry.target.snapshot()).await? {
            return Ok(Some(record.layers));
        }
    }
    Ok(Some(base.to_vec()))
}

fn report(log: &BuildLog, step: Option<usize>, total: usize, what: &str, probe: &Probe) {
    crate::metrics::cache_probe(match probe {
        Probe::Hit(_) => "hit",
        Probe::Miss(_) => "miss",
        Probe::Unapplied(_) => "unapplied",
    });
    let verdict = match probe {
        Probe::Hit(_) => "cache hit".to_owned(),
        Probe::Miss(None) => "cache miss".to_owned(),
        Probe::Miss(Some(why)) => format!("cache miss (invalid entry: {why})"),
        Probe::Unapplied(why) => format!("cache unapplied ({why}); treated as a miss"),
    };
    match step {
        Some(n) => {
            let tag = n.to_string();
            log.info(
                Some(&tag),
                format!("[cache] step {n}/{total} {what}: {verdict}"),
            );
        }
        None => log.info(None, format!("[cache] {what}: {verdict}")),
    }
}

async fn probe(
    store: &EventStore,
    blobs: &Arc<dyn BlobStore>,
    state: &cache_entry::State,
    key: &CacheKey,
    kind: EntryKind,
    plan: &Plan,
    chain: &[(CacheKey, cache_entry::State)],
) -> Result<Probe, Transient> {
    match cache_entry::validate(state, kind, key, &plan.chain.base, chain) {
        Validity::Invalid(Invalid::Absent) => return Ok(Probe::Miss(None)),
        Validity::Invalid(why) => return Ok(Probe::Miss(Some(why))),
        Validity::Valid => {}
    }
    let (entry, _) = state.live().expect("valid entries are live");
    let mut wanted = vec![(entry.target.snapshot(), purpose_of(kind))];
    if let Target::FinalResult {
        build_base_checkpoint: Some(id),
        ..
    } = &entry.target
    {
        wanted.push((*id, Purpose::BuildCache));
    }
    let mut first = None;
    for (id, purpose) in wanted {
        let Some(record) = read_snapshot(store, &id).await? else {
            return Ok(Probe::Miss(Some(Invalid::Absent)));
        };
        if record.purpose != purpose {
            return Ok(Probe::Unapplied(format!(
                "snapshot {id} is a {:?} snapshot",
                record.purpose
            )));
        }
        if let Some(missing) = missing_layer(blobs, &record.layers).await? {
            return Ok(Probe::Unapplied(format!(
                "layer {missing} of snapshot {id} is missing from the blob store or does not match its digest"
            )));
        }
        first.get_or_insert(record);
    }
    Ok(Probe::Hit(first.expect("the target was read")))
}

fn purpose_of(kind: EntryKind) -> Purpose {
    match kind {
        EntryKind::Checkpoint => Purpose::BuildCache,
        EntryKind::FinalResult => Purpose::Template,
    }
}

async fn read_snapshot(
    store: &EventStore,
    id: &SnapshotId,
) -> Result<Option<SnapshotRecord>, Transient> {
    let loaded = load::<Snapshot>(store, &snapshot_stream(id))
        .await
        .map_err(transient)?;
    Ok(match loaded.state {
        s if s.tombstoned => None,
        s => s.record,
    })
}

async fn missing_layer(
    blobs: &Arc<dyn BlobStore>,
    layers: &[ids::Digest],
) -> Result<Option<ids::Digest>, Transient> {
    let (blobs, layers) = (blobs.clone(), layers.to_vec());
    tokio::task::spawn_blocking(move || {
        for layer in layers {
            // Verified, not only present: a layer torn by a crash must be a miss here, not a
            // hit that then fails every build at `base`. A stat per layer once this process
            // has verified it; a full hash the first time.
            match blobs.intact_size(&layer) {
                Ok(Some(_)) => {}
                Ok(None) => return Ok(Some(layer)),
                Err(e) => return Err(Transient(format!("reading the blob store: {e}"))),
            }
        }
        Ok(None)
    })
    .await
    .map_err(transient)?
}

/// The final entry a Ready build publishes.
#[derive(Clone, Debug)]
pub struct FinalPublication {
    pub writer: Writer,
    /// Held until the final entry is written, so that identical builds waiting on this node
    /// find it.
    pub flight: Option<Arc<tokio::sync::OwnedMutexGuard<()>>>,
}

/// Publishes the entries of one build.
#[derive(Clone, Debug)]
pub struct Writer {
    pub plan: Plan,
    repair: BTreeMap<CacheKey, u64>,
    /// The nearest checkpoint entry below the next one: what the next entry is built on.
    parent: ParentEdge,
    /// Off after a lost race or a failed write: later entries would have no valid parent.
    stopped: bool,
}

impl Writer {
    pub fn new(plan: Plan, lookup: &Lookup) -> Writer {
        let parent = match &lookup.found {
            Found::Checkpoint { edge, .. } => edge.clone(),
            _ => ParentEdge::Root {
                base_key: plan.chain.base,
            },
        };
        Writer {
            repair: lookup.repair.clone(),
            parent,
            plan,
            stopped: false,
        }
    }

    fn entry(&self, target: Target, attempt: &Attempt) -> Entry {
        Entry {
            target,
            parent: self.parent.clone(),
            hashing_version: HASHING_VERSION,
            cache_format_version: CACHE_FORMAT_VERSION,
            build: attempt.build,
            epoch: attempt.epoch,
        }
    }

    /// The checkpoint entry of step `step` (snapshot `snapshot` in `context`), to publish in
    /// the append that records the snapshot; `None` when the step has no key or this build
    /// writes no more entries.
    pub fn checkpoint_entry(
        &self,
        attempt: &Attempt,
        step: usize,
        snapshot: SnapshotId,
        context: &StepContext,
    ) -> Option<PublishEntry> {
        if self.stopped {
            return None;
        }
        let key = self
            .plan
            .checkpoints
            .iter()
            .find(|(n, _)| *n == step)
            .map(|(_, k)| *k)?;
        let entry = self.entry(
            Target::Checkpoint {
                snapshot,
                context: context.clone(),
            },
            attempt,
        );
        Some(self.publish(attempt, key, entry, self.plan.forced(step), Guard::Open))
    }

    /// After the snapshot was recorded with `publish` (its entry's verdict): the next entry is
    /// built on this one when it stands under its key.
    pub async fn checkpoint_recorded(
        &mut self,
        attempt: &Attempt,
        log: &BuildLog,
        step: usize,
        publish: &PublishEntry,
        verdict: Option<crate::app::attempt::EntryVerdict>,
    ) {
        use crate::app::attempt::EntryVerdict;
        let outcome = match verdict {
            Some(EntryVerdict::Published) => Ok(()),
            Some(EntryVerdict::Refused(reason)) => Err(CommandError::Rejected(reason)),
            None => return,
        };
        let Target::Checkpoint { snapshot, .. } = &publish.entry.target else {
            return;
        };
        let snapshot = *snapshot;
        if outcome.is_err() {
            if let Some(edge) = self.same_stack_winner(attempt, publish, snapshot).await {
                log.info(
                    Some(&step.to_string()),
                    "[cache] another build published this step first with the same layers; later entries build on its entry",
                );
                self.parent = edge;
                return;
            }
        }
        if let Some(generation) = self
            .settle(attempt, log, Some(step), publish, outcome)
            .await
        {
            self.parent = ParentEdge::Checkpoint {
                key: publish.key,
                snapshot,
                pointer_generation: generation,
            };
        }
    }

    /// After losing the race for a checkpoint key: the winner's entry, as the parent of this
    /// build's later entries, when it holds the very stack this build's snapshot holds. Layers
    /// are content-addressed and a step often writes the same bytes on the same parent (a
    /// WORKDIR, a COPY), so two concurrent builds sharing a prefix (the stages of one
    /// Dockerfile) would otherwise leave the loser's later steps uncached, and its result,
    /// rebuilt, a different stack. `None` when the stacks differ or cannot be read.
    async fn same_stack_winner(
        &self,
        attempt: &Attempt,
        publish: &PublishEntry,
        ours: SnapshotId,
    ) -> Option<ParentEdge> {
        let Target::Checkpoint { context, .. } = &publish.entry.target else {
            return None;
        };
        let stream = cache_key_stream(&self.plan.scope, &publish.key);
        let state = load::<CacheEntry>(&attempt.store, &stream)
            .await
            .ok()?
            .state;
        let (winner, generation) = state.live()?;
        let Target::Checkpoint {
            snapshot: theirs,
            context: their_context,
        } = &winner.target
        else {
            return None;
        };
        if their_context != context {
            return None;
        }
        let their_record = read_snapshot(&attempt.store, theirs).await.ok()??;
        let our_record = read_snapshot(&attempt.store, &ours).await.ok()??;
        (their_record.layers == our_record.layers).then_some(ParentEdge::Checkpoint {
            key: publish.key,
            snapshot: *theirs,
            pointer_generation: generation,
        })
    }

    /// Once the build is Ready: publish its final-result entry.
    pub async fn final_result(
        &mut self,
        attempt: &Attempt,
        log: &BuildLog,
        candidate: SnapshotId,
        build_base_checkpoint: Option<SnapshotId>,
    ) {
        let entry = self.entry(
            Target::FinalResult {
                candidate,
                build_base_checkpoint,
            },
            attempt,
        );
        let forced = self.plan.force_from.is_some();
        let key = self.plan.chain.final_key;
        self.write(attempt, log, None, key, entry, forced, Guard::Ready)
            .await;
    }

    /// Creates (or, when forced or repairing, replaces by CAS) the entry under `key`, in one
    /// append guarded by the build stream. Returns the entry's generation when this build's
    /// entry is the one the key points at.
    #[allow(clippy::too_many_arguments)]
    async fn write(
        &mut self,
        attempt: &Attempt,
        log: &BuildLog,
        step: Option<usize>,
        key: CacheKey,
        entry: Entry,
        forced: bool,
        guard: Guard,
    ) -> Option<u64> {
        if self.stopped {
            return None;
        }
        let publish = self.publish(attempt, key, entry, forced, guard);
        let ctx = attempt.context();
        let write_once = || publish_entry(&attempt.store, &ctx, &publish);
        let outcome = retrying_when(
            "writing a cache entry",
            attempt.build,
            attempt.lease,
            CommandError::is_unavailable,
            write_once,
        )
        .await
        .map(drop);
        self.settle(attempt, log, step, &publish, outcome).await
    }

    fn publish(
        &self,
        attempt: &Attempt,
        key: CacheKey,
        entry: Entry,
        forced: bool,
        guard: Guard,
    ) -> PublishEntry {
        PublishEntry {
            build: attempt.build,
            epoch: attempt.epoch,
            scope: self.plan.scope.clone(),
            key,
            entry,
            forced,
            repair: self.repair.get(&key).copied(),
            guard,
        }
    }

    /// What an entry's write came to: its generation when this build's entry is the one the
    /// key points at; otherwise this build writes no more entries (a later one would have no
    /// valid parent).
    async fn settle(
        &mut self,
        attempt: &Attempt,
        log: &BuildLog,
        step: Option<usize>,
        publish: &PublishEntry,
        outcome: Result<(), CommandError<Refusal>>,
    ) -> Option<u64> {
        let stream = cache_key_stream(&self.plan.scope, &publish.key);
        let entry = &publish.entry;
        let tag = step.map(|s| s.to_string());
        let what = match step {
            Some(n) => format!("step {n}"),
            None => "the final result".to_owned(),
        };
        match outcome {
            Ok(_) => match load::<CacheEntry>(&attempt.store, &stream).await {
                Ok(loaded) => match loaded.state.live() {
                    Some((e, generation)) if e.target == entry.target => Some(generation),
                    _ => {
                        self.stopped = true;
                        None
                    }
                },
                Err(e) => {
                    // Whether this build's entry is the one under the key, and at which
                    // generation, is unknown: the next entry would not know its parent. Naming
                    // an older one instead would glue it past this step, where a later forced
                    // rebuild of this step could not break its lineage. Stop, as after a failed
                    // write.
                    tracing::error!(build = %attempt.build, error = %e, "reading a cache entry back after writing it failed; this build writes no more entries");
                    self.stopped = true;
                    None
                }
            },
            Err(CommandError::Rejected(reason)) => {
                log.info(
                    tag.as_deref(),
                    format!("[cache] not publishing {what} or later entries: {reason}"),
                );
                self.stopped = true;
                None
            }
            Err(e) => {
                // The store, not a refusal: the build goes on (the cache only saves work), but
                // this is an outage to look at, not a lost race.
                tracing::error!(build = %attempt.build, error = %e, "writing a cache entry failed; this build writes no more entries");
                self.stopped = true;
                None
            }
        }
    }
}

type FlightMap = HashMap<(Scope, CacheKey), Arc<tokio::sync::Mutex<()>>>;

/// Per-node single-flight on `(scope, final_key)`.
#[derive(Clone, Debug, Default)]
pub struct Flights(Arc<std::sync::Mutex<FlightMap>>);

impl Flights {
    /// The lock for `(scope, key)`; the caller awaits it. Forgets locks nobody holds or awaits.
    pub fn lock_for(&self, scope: &Scope, key: &CacheKey) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self.0.lock().expect("the flights map is never poisoned");
        map.retain(|_, m| Arc::strong_count(m) > 1 || m.try_lock().is_err());
        map.entry((scope.clone(), *key)).or_default().clone()
    }
}
