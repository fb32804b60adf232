//! Garbage collection: one pass marks what no root reaches, weighs it against the retention
//! policy and deletes it through the per-object Deleting barrier (docs/adr/0019).
//!
//! Order of a pass, and why it never loses a live object:
//! 0. **Own** the store ([`ownership`]): a store another database owns is refused whole, since
//!    that database's references are invisible here. An unclaimed store is claimed.
//! 1. **List** the store and **read** the inventory (every referencing stream, one statement).
//!    Any error here ends the pass before anything is marked: fail closed.
//! 2. **Classify** ([`crate::domain::reachability`]) and **plan** ([`crate::domain::retention`]).
//!    `--dry-run` stops here and reports the plan.
//! 3. **Mark** each planned object `Deleting` (retiring the cache entries that point at it in
//!    the same append). The mark is refused if the object was used within the grace period, is
//!    leased, or another pass owns it: that pass or a later one decides again.
//! 4. **Re-read** the inventory after every mark is up: an object rooted again (a reference
//!    that committed before its mark) is returned to `Live` (`DeletionAborted`). From the mark
//!    on, a writer or reader that meets the object waits for `Deleted` and writes it again.
//! 5. **Delete** the bytes, then record `Deleted` (the tombstone). A delete that fails aborts
//!    that object's deletion and every one after it in this pass; so does a confirm that fails.
//! 6. Remove temporary objects unwritten for an hour (crashed writers' leftovers), and blobs
//!    quarantined (they failed verification) longer ago than the keep period: evidence for an
//!    operator until then.
//!
//! Two passes at once are safe: each mark is a compare-and-set on the object's stream, and a
//! second pass's mark of an object another pass owns is refused, so each object is deleted once.
//!
//! A pass holds a lease on its `gcpass-{id}` stream from its first mark to its end, renewed
//! every third of [`GcPolicy::pass_lease`], and deletes bytes only while at least a third of it
//! is left. The marks of a pass that stopped renewing are
//! released (by the next pass, or by a writer waiting on one) only after its lease expired, and
//! only by fencing the pass in the same append, so a slow pass stops instead of deleting what
//! was returned to Live (`domain/gc_pass.rs`).

pub mod inventory;
pub mod ownership;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};

use super::{ReconcileEnv, ReconcileError};
use crate::app;
use crate::domain::gc_pass;
use crate::domain::ids::Digest;
use crate::domain::object::Deletion;
use crate::domain::reachability::{self, Classified, Keep, Standing, Stored};
use crate::domain::retention::{self, Candidate, Policy, Tier};
use crate::events::{Actor, ActorRole, CommandContext, CommandError, Metadata};
use crate::streams::database_now;

/// Temporary files and objects younger than this (since their last write) are never swept,
/// whatever the grace period: a writer may still be streaming into one, or about to publish it.
pub const TEMPORARY_AGE: Duration = Duration::hours(1);

/// A pass's lease: held from its first mark, renewed while it works.
struct PassLease {
    pass: String,
    lease: Duration,
    state: gc_pass::State,
    renewed_at: DateTime<Utc>,
}

impl PassLease {
    async fn start(
        env: &ReconcileEnv,
        pass: &str,
        lease: Duration,
    ) -> Result<PassLease, ReconcileError> {
        let state = app::gc_pass::start(&env.store, &context(env), pass, &env.node, lease)
            .await
            .map_err(ReconcileError::store)?;
        let renewed_at = database_now(env.store.pool()).await?;
        Ok(PassLease {
            pass: pass.to_owned(),
            lease,
            state,
            renewed_at,
        })
    }

    /// Renews the lease when a third of it has passed; an error when it is lost (expired or
    /// fenced): the pass must stop.
    async fn hold(&mut self, env: &ReconcileEnv) -> Result<DateTime<Utc>, ReconcileError> {
        let now = database_now(env.store.pool()).await?;
        if now - self.renewed_at < self.lease / 3 && self.state.holds_at(now) {
            return Ok(now);
        }
        let (state, at) = app::gc_pass::renew(&env.store, &context(env), &self.pass, self.lease)
            .await
            .map_err(ReconcileError::store)?;
        self.state = state;
        self.renewed_at = at;
        Ok(at)
    }

    /// [`Self::hold`], and whether a delete may start now (enough of the lease is left).
    async fn may_delete(&mut self, env: &ReconcileEnv) -> Result<(), ReconcileError> {
        let now = self.hold(env).await?;
        if self
            .state
            .may_delete_at(now, gc_pass::delete_margin(self.lease))
        {
            Ok(())
        } else {
            Err(ReconcileError::Store(format!(
                "GC pass {} cannot prove its lease for a delete (it holds until {:?}, now {now})",
                self.pass, self.state.lease_until
            )))
        }
    }

    async fn end(self, env: &ReconcileEnv, measure: Option<gc_pass::Measure>) {
        if let Err(e) = app::gc_pass::end(&env.store, &context(env), &self.pass, measure).await {
            tracing::warn!(pass = %self.pass, error = %e, "could not end the GC pass's lease; it expires by itself");
        }
    }
}

/// A live cache entry (scope, key, pointer generation) whose layer the store does not hold.
type BrokenEntry = (
    crate::domain::ids::Scope,
    crate::domain::cache_key::CacheKey,
    u64,
    Digest,
);

/// What the retention rules keep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GcPolicy {
    /// Total bytes the blob store should stay under (`STRATA_STORAGE_BUDGET`).
    pub budget: Option<u64>,
    /// Cache entries, superseded results and uploads unused this long go whatever the budget.
    pub keep: Duration,
    /// Nothing used more recently than this goes.
    pub grace: Duration,
    /// Cached final results kept per template before older ones are surplus.
    pub finals_per_template: usize,
    /// How long one renewal of a pass's lease holds ([`gc_pass::LEASE`]): a pass that stops
    /// renewing has its marks released this long after its last renewal.
    pub pass_lease: Duration,
}

impl Default for GcPolicy {
    fn default() -> Self {
        GcPolicy {
            budget: None,
            keep: Duration::days(7),
            grace: Duration::hours(1),
            finals_per_template: 3,
            pass_lease: gc_pass::LEASE,
        }
    }
}

/// Called once every planned object is marked and before the roots are read again; tests pause
/// a pass there to race it against builds. Off (`None`) outside tests.
pub type AfterMark =
    Arc<dyn Fn(Vec<Digest>) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// How one pass runs.
#[derive(Clone, Default)]
pub struct PassOptions {
    pub dry_run: bool,
    pub after_mark: Option<AfterMark>,
}

/// One object the plan chose.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    pub digest: Digest,
    pub size: u64,
    pub tier: Tier,
    pub why: String,
    pub last_referenced_by: Option<String>,
}

/// Bytes and objects in one class of the store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub objects: u64,
    pub bytes: u64,
}

/// What a pass found and did.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub pass: String,
    /// By class: `rooted` or a tier name.
    pub usage: BTreeMap<String, Usage>,
    pub total_before: u64,
    /// Once the plan is carried out.
    pub total_after_plan: u64,
    pub over_budget_by: u64,
    pub planned: Vec<Planned>,
    pub deleted: Vec<Planned>,
    /// Planned but left: refused at the mark (recently used, leased, another pass) or rooted
    /// again, with the reason.
    pub kept: Vec<(Digest, String)>,
    pub temporary_removed: usize,
    /// Quarantined blobs removed, past [`GcPolicy::keep`] since they were moved aside.
    pub quarantine_removed: usize,
    /// Cache entries retired because a layer of theirs had left the store.
    pub repaired: usize,
}

impl Report {
    pub fn deleted_bytes(&self) -> u64 {
        self.deleted.iter().map(|p| p.size).sum()
    }

    /// What the pass's stream keeps of this report (the operator page's storage chart).
    fn measure(&self, budget: Option<u64>) -> gc_pass::Measure {
        gc_pass::Measure {
            classes: self
                .usage
                .iter()
                .map(|(class, u)| {
                    (
                        class.clone(),
                        gc_pass::ClassSize {
                            objects: u.objects,
                            bytes: u.bytes,
                        },
                    )
                })
                .collect(),
            total_bytes: self.total_before,
            budget_bytes: budget,
            deleted_objects: self.deleted.len() as u64,
            deleted_bytes: self.deleted_bytes(),
        }
    }
}

/// Classifies the store: usage by class, without planning (`strata storage`).
pub async fn usage(
    env: &ReconcileEnv,
    policy: &GcPolicy,
) -> Result<BTreeMap<String, Usage>, ReconcileError> {
    ownership::ensure(env, ownership::Claim::ReadOnly).await?;
    let survey = survey(env, policy).await?;
    Ok(usage_of(&survey.classified))
}

/// One garbage-collection pass.
pub async fn pass(
    env: &ReconcileEnv,
    policy: &GcPolicy,
    options: &PassOptions,
) -> Result<Report, ReconcileError> {
    ownership::ensure(env, ownership::Claim::Adopt).await?;
    let pass_id = format!("gc-{}", uuid::Uuid::now_v7().simple());
    let Survey {
        classified,
        now,
        marked_elsewhere,
        broken,
    } = survey(env, policy).await?;
    let total: u64 = classified.iter().map(|c| c.stored.size).sum();
    let by_digest: BTreeMap<Digest, &Classified> =
        classified.iter().map(|c| (c.stored.digest, c)).collect();
    let candidates: Vec<Candidate> = classified
        .iter()
        .filter_map(|c| match c.standing {
            Standing::Candidate(tier) => Some(Candidate {
                id: c.stored.digest.to_string(),
                size: c.stored.size,
                tier,
                last_used: c.last_used,
            }),
            Standing::Rooted(_) => None,
        })
        .collect();
    let plan = retention::plan(
        &candidates,
        total,
        &Policy {
            budget: policy.budget,
            keep: policy.keep,
            grace: policy.grace,
        },
        now,
    );
    let planned: Vec<Planned> = plan
        .deletions
        .iter()
        .map(|d| {
            let digest = Digest::parse(&d.candidate.id).expect("candidate ids are digests");
            Planned {
                digest,
                size: d.candidate.size,
                tier: d.candidate.tier,
                why: d.why.to_string(),
                last_referenced_by: by_digest.get(&digest).and_then(|c| c.referenced_by.clone()),
            }
        })
        .collect();
    let report = Report {
        pass: pass_id.clone(),
        usage: usage_of(&classified),
        total_before: total,
        total_after_plan: plan.total_after,
        over_budget_by: plan.over_budget_by,
        planned: planned.clone(),
        ..Report::default()
    };
    if options.dry_run {
        return Ok(report);
    }

    // Marks of passes that stopped renewing their lease: released, their passes fenced.
    for digest in &marked_elsewhere {
        match app::object::release_if_pass_stopped(&env.store, &context(env), digest, &pass_id)
            .await
        {
            Ok(app::object::Release::Released { owner }) => {
                tracing::warn!(pass = %pass_id, %digest, %owner, "returned an object marked by a pass that stopped to live")
            }
            Ok(app::object::Release::NotMarked) | Err(CommandError::Rejected(_)) => {}
            Err(CommandError::Contended { .. }) => {}
            Err(e) => return Err(ReconcileError::store(e)),
        }
    }
    let mut lease = PassLease::start(env, &pass_id, policy.pass_lease).await?;
    let result = mark_and_delete(
        env, policy, options, &pass_id, &mut lease, report, planned, &by_digest, broken,
    )
    .await;
    let measure = result.as_ref().ok().map(|r| r.measure(policy.budget));
    lease.end(env, measure).await;
    result
}

/// Steps 3 to 6 of a pass, under its lease.
#[allow(clippy::too_many_arguments)]
async fn mark_and_delete(
    env: &ReconcileEnv,
    policy: &GcPolicy,
    options: &PassOptions,
    pass_id: &str,
    lease: &mut PassLease,
    mut report: Report,
    planned: Vec<Planned>,
    by_digest: &BTreeMap<Digest, &Classified>,
    broken: Vec<BrokenEntry>,
) -> Result<Report, ReconcileError> {
    let pass_id = pass_id.to_owned();
    let now = lease.renewed_at;
    for (scope, key, generation, missing) in &broken {
        // Absent from the listing, but an entry published after the listing names a layer
        // stored after it: only a layer that is absent now makes the entry broken.
        let blobs = env.blobs.clone();
        let digest = *missing;
        let present_now = tokio::task::spawn_blocking(move || blobs.size(&digest))
            .await
            .map_err(|e| ReconcileError::Store(format!("presence task: {e}")))?;
        if !matches!(present_now, Ok(None)) {
            continue;
        }
        let reason =
            format!("layer {missing} is no longer in the store (cache repair by {pass_id})");
        match app::cache::retire_entry(&env.store, &context(env), scope, key, *generation, &reason)
            .await
        {
            Ok(_) => {
                tracing::info!(pass = %pass_id, key = %key.0, %missing, "retired a cache entry whose layer vanished");
                report.repaired += 1;
            }
            Err(CommandError::Rejected(_) | CommandError::Contended { .. }) => {}
            Err(e) => return Err(ReconcileError::store(e)),
        }
    }
    let unused_since = now - policy.grace;
    let mut marked = Vec::new();
    for p in &planned {
        if let Err(e) = lease.hold(env).await {
            abort_all(env, &pass_id, &marked, "the pass lost its lease").await;
            return Err(e);
        }
        let entries = by_digest
            .get(&p.digest)
            .map(|c| c.entries.clone())
            .unwrap_or_default();
        let mark = app::object::Mark {
            digest: p.digest,
            deletion: Deletion {
                pass: pass_id.clone(),
                tier: p.tier.name().to_owned(),
                reason: p.why.clone(),
                last_referenced_by: p.last_referenced_by.clone(),
            },
            unused_since,
            retire: entries
                .into_iter()
                .map(|(scope, key, generation)| app::object::EntryToRetire {
                    scope,
                    key,
                    generation,
                })
                .collect(),
        };
        match app::object::mark_deleting(&env.store, &context(env), &mark).await {
            Ok(_) => marked.push(p.clone()),
            Err(CommandError::Rejected(refusal)) => {
                report.kept.push((p.digest, refusal.to_string()));
            }
            Err(CommandError::Contended { .. }) => {
                report
                    .kept
                    .push((p.digest, "lost a race on its streams".into()));
            }
            Err(e) => {
                abort_all(env, &pass_id, &marked, "the pass could not mark").await;
                return Err(ReconcileError::store(e));
            }
        }
    }
    if let Some(hook) = &options.after_mark {
        hook(marked.iter().map(|p| p.digest).collect()).await;
    }

    // The barrier is up: re-read the roots. Anything rooted now goes back to Live.
    let fresh = match survey(env, policy).await {
        Ok(s) => s.classified,
        Err(e) => {
            abort_all(
                env,
                &pass_id,
                &marked,
                "the pass could not re-read its roots",
            )
            .await;
            return Err(e);
        }
    };
    let fresh: BTreeMap<Digest, Standing> = fresh
        .into_iter()
        .map(|c| (c.stored.digest, c.standing))
        .collect();
    let mut doomed = Vec::new();
    for p in marked {
        match fresh.get(&p.digest) {
            Some(Standing::Rooted(root)) => {
                let reason = format!("rooted again: {root}");
                abort_all(env, &pass_id, std::slice::from_ref(&p), &reason).await;
                report.kept.push((p.digest, reason));
            }
            _ => doomed.push(p),
        }
    }

    let mut failed: Option<ReconcileError> = None;
    for (i, p) in doomed.iter().enumerate() {
        // Only while the mark is provably this pass's: nobody releases it before the lease
        // expires, and the delete starts with at least DELETE_MARGIN of it left.
        if let Err(e) = lease.may_delete(env).await {
            abort_all(env, &pass_id, &doomed[i..], "the pass lost its lease").await;
            failed = Some(e);
            break;
        }
        let blobs = env.blobs.clone();
        let digest = p.digest;
        let deleted = tokio::task::spawn_blocking(move || blobs.delete(&digest))
            .await
            .map_err(|e| ReconcileError::Store(format!("delete task: {e}")))
            .and_then(|r| r.map_err(ReconcileError::from));
        match deleted {
            Ok(()) => {
                match app::object::confirm_deleted(&env.store, &context(env), &p.digest, &pass_id)
                    .await
                {
                    Ok(_) => {
                        tracing::info!(pass = %pass_id, digest = %p.digest, tier = p.tier.name(), size = p.size, why = %p.why, "gc deleted an object");
                        report.deleted.push(p.clone());
                    }
                    Err(e) => {
                        // The bytes are gone; the mark stays until a later pass confirms. The
                        // event store is failing: the pass stops, keeping every other object.
                        tracing::warn!(pass = %pass_id, digest = %p.digest, error = %e, "gc deleted an object but could not record it; the pass stops");
                        abort_all(
                            env,
                            &pass_id,
                            &doomed[i + 1..],
                            "the pass stopped: a confirm failed",
                        )
                        .await;
                        failed = Some(ReconcileError::store(e));
                        break;
                    }
                }
            }
            Err(e) => {
                let reason = format!("the store refused the delete: {e}");
                abort_all(env, &pass_id, &doomed[i..], &reason).await;
                failed = Some(e);
                break;
            }
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }

    let blobs = env.blobs.clone();
    let before = std::time::SystemTime::from(now - policy.grace.max(TEMPORARY_AGE));
    report.temporary_removed = tokio::task::spawn_blocking(move || blobs.sweep_temporary(before))
        .await
        .map_err(|e| ReconcileError::Store(format!("sweep task: {e}")))??;
    let blobs = env.blobs.clone();
    let quarantined_before = std::time::SystemTime::from(now - policy.keep);
    report.quarantine_removed =
        tokio::task::spawn_blocking(move || blobs.sweep_quarantine(quarantined_before))
            .await
            .map_err(|e| ReconcileError::Store(format!("quarantine sweep task: {e}")))??;
    if report.quarantine_removed > 0 {
        tracing::info!(pass = %pass_id, removed = report.quarantine_removed, keep_secs = policy.keep.num_seconds(), "gc removed quarantined blobs kept past their retention");
    }
    Ok(report)
}

struct Survey {
    classified: Vec<Classified>,
    /// The database's clock when the inventory was read.
    now: DateTime<Utc>,
    /// Objects marked `Deleting` (by another pass, or one that died).
    marked_elsewhere: Vec<Digest>,
    /// Live cache entries pointing at a layer the store does not hold (cache repair).
    broken: Vec<BrokenEntry>,
}

/// Lists the store, then reads and classifies the inventory. Listing first: an object written
/// after the listing is not in this pass at all, and one written before it was registered or
/// referenced before it became reachable.
async fn survey(env: &ReconcileEnv, policy: &GcPolicy) -> Result<Survey, ReconcileError> {
    let blobs = env.blobs.clone();
    let listed = tokio::task::spawn_blocking(move || blobs.list())
        .await
        .map_err(|e| ReconcileError::Store(format!("listing task: {e}")))??;
    let mut inventory = inventory::read(&env.store).await?;
    if let Some(dir) = &env.catalog {
        let images = dir.join("images");
        if images.is_dir() {
            let catalog = crate::vmm::image::ImageCatalog::open(dir)?;
            for image in catalog.list()? {
                for digest in image.digests().into_iter().chain(image.license_notice) {
                    inventory
                        .pinned
                        .insert(digest, format!("image {} in the node catalog", image.name));
                }
            }
            inventory.pulled = crate::registry::pull::pulled_layers(dir)?;
        }
    }
    let now = database_now(env.store.pool()).await?;
    let stored: Vec<Stored> = listed
        .into_iter()
        .map(|b| Stored {
            digest: b.digest,
            size: b.size,
            written_at: b.written_at.into(),
        })
        .collect();
    let classified = reachability::classify(
        &inventory,
        &stored,
        Keep {
            finals_per_template: policy.finals_per_template,
        },
        now,
    );
    let present: std::collections::BTreeSet<Digest> = stored.iter().map(|s| s.digest).collect();
    let broken = reachability::broken_entries(&inventory, &present);
    let marked_elsewhere = inventory
        .objects
        .iter()
        .filter(|(_, o)| o.lifecycle == crate::domain::object::Lifecycle::Deleting)
        .map(|(d, _)| *d)
        .collect();
    Ok(Survey {
        classified,
        now,
        marked_elsewhere,
        broken,
    })
}

fn usage_of(classified: &[Classified]) -> BTreeMap<String, Usage> {
    let mut usage: BTreeMap<String, Usage> = BTreeMap::new();
    for c in classified {
        let class = match c.standing {
            Standing::Rooted(_) => "rooted".to_owned(),
            Standing::Candidate(tier) => tier.name().to_owned(),
        };
        let u = usage.entry(class).or_default();
        u.objects += 1;
        u.bytes += c.stored.size;
    }
    usage
}

/// A context for one command: every append of the pass is its own command, with its own ids.
fn context(env: &ReconcileEnv) -> CommandContext {
    CommandContext::new(Metadata::new(Actor::new(ActorRole::Reconciler, &env.node)))
        .with_max_attempts(16)
}

/// Returns `objects` to Live: this pass will not delete them.
async fn abort_all(env: &ReconcileEnv, pass: &str, objects: &[Planned], reason: &str) {
    for p in objects {
        if let Err(e) =
            app::object::abort_deletion(&env.store, &context(env), &p.digest, pass, reason).await
        {
            // The mark stays; no pass deletes an object another pass owns, and this pass is over.
            tracing::warn!(pass, digest = %p.digest, error = %e, "could not abort a deletion mark");
        }
    }
}
