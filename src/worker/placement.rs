//! Cache-aware placement on the build node (ADR 0020): the order in which a free node tries
//! the queue. The rule is pure ([`crate::domain::placement`]); this module gathers its inputs:
//!
//! * the queue with each build's time in it ([`crate::projections::builds::queue`]);
//! * what each queued build would boot on: its frozen spec, its base resolved from this node's
//!   catalog or the database (never pulled), its key chain, and the deepest live checkpoint in
//!   the index ([`super::cache::resume_stack`]). Computed once per queued build and kept while
//!   it stays queued; a build whose stack cannot be told here prefers no node;
//! * which live nodes hold those layers ([`super::residency`]).
//!
//! Placement only orders the tries. Each try is the unchanged acquire (`AcquireAttempt`
//! decided on the build stream, compare-and-set on its version), so two nodes never both hold
//! a build whatever the hints say. With the wait set to zero, or no other live node, the
//! order is the queue's.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use crate::domain::ids::{self, BuildId};
use crate::domain::placement::{self, Candidate, Residency, Verdict};
use crate::events::command::load;
use crate::events::EventStore;
use crate::projections::builds::QueuedBuild;
use crate::streams::{build_stream, Build};
use crate::vmm::image::ImageCatalog;

use super::base;
use super::cache;
use super::error::WorkerError;
use super::job::BuildJob;
use super::residency;

/// The queue in the order this node tries it, and when a build left to another node becomes
/// this node's to take.
#[derive(Debug, Default)]
pub struct Order {
    /// Each with its verdict; `None` when placement had no choice to make.
    pub tries: Vec<(BuildId, Option<Verdict>)>,
    pub next_due: Option<Duration>,
}

/// What this node remembers between rounds.
#[derive(Default)]
pub struct Placer {
    /// What each queued build would boot on (`None`: unknown here), computed once per build.
    wants: Mutex<HashMap<BuildId, Option<Vec<ids::Digest>>>>,
    /// Builds already reported as left to another node, so each is logged and counted once.
    deferred: Mutex<HashSet<BuildId>>,
}

/// What the node needs to tell which layers a build would boot on.
pub struct Node<'a> {
    pub store: &'a EventStore,
    pub catalog: &'a ImageCatalog,
    pub backend: &'a str,
    pub id: &'a str,
    pub wait: Duration,
}

impl Placer {
    /// The order in which `node` tries `queue` (in fair-share order, see
    /// [`crate::projections::builds::queue`]).
    pub async fn order(
        &self,
        node: &Node<'_>,
        queue: Vec<QueuedBuild>,
    ) -> Result<Order, WorkerError> {
        let fifo = |queue: Vec<QueuedBuild>| Order {
            tries: queue.into_iter().map(|q| (q.build, None)).collect(),
            next_due: None,
        };
        if node.wait.is_zero() || queue.is_empty() {
            return Ok(fifo(queue));
        }
        let pool = node.store.pool();
        let live = residency::live_nodes(pool).await?;
        if !live.iter().any(|n| n != node.id) {
            return Ok(fifo(queue));
        }
        let mut candidates = Vec::with_capacity(queue.len());
        for q in &queue {
            let known = self.lock_wants().get(&q.build).cloned();
            let wants = match known {
                Some(w) => w,
                None => match wants_of(node, q.build).await {
                    Ok(w) => {
                        self.lock_wants().insert(q.build, w.clone());
                        w
                    }
                    Err(e) => {
                        tracing::debug!(build = %q.build, error = %e, "cannot tell which layers the build wants; no node preferred this round");
                        None
                    }
                },
            };
            candidates.push(Candidate {
                build: q.build,
                waited: q.waited,
                wants,
                round: q.round,
            });
        }
        let queued: HashSet<BuildId> = queue.iter().map(|q| q.build).collect();
        self.lock_wants().retain(|b, _| queued.contains(b));
        self.lock_deferred().retain(|b| queued.contains(b));
        let mut digests: Vec<ids::Digest> = candidates
            .iter()
            .filter_map(|c| c.wants.as_ref())
            .flatten()
            .copied()
            .collect();
        digests.sort();
        digests.dedup();
        let residency = Residency::from_rows(residency::holdings(pool, &digests).await?);
        let placed = placement::place(node.id, &candidates, &residency, node.wait);
        for (build, verdict) in &placed.deferred {
            if let Verdict::Deferred {
                preferred,
                remaining,
            } = verdict
            {
                if self.lock_deferred().insert(*build) {
                    crate::metrics::placement_deferred();
                    tracing::info!(
                        %build,
                        preferred = %preferred,
                        for_ms = remaining.as_millis() as u64,
                        "leaving a queued build to the node that holds more of its layers"
                    );
                }
            }
        }
        Ok(Order {
            tries: placed
                .claimable
                .into_iter()
                .map(|(b, v)| (b, Some(v)))
                .collect(),
            next_due: placed.next_due,
        })
    }

    fn lock_wants(&self) -> std::sync::MutexGuard<'_, HashMap<BuildId, Option<Vec<ids::Digest>>>> {
        self.wants.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_deferred(&self) -> std::sync::MutexGuard<'_, HashSet<BuildId>> {
        self.deferred.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The layers `build` would boot on if this node ran it now (see the module doc). `Ok(None)`:
/// this node cannot tell, or no sandbox is needed.
async fn wants_of(
    node: &Node<'_>,
    build: BuildId,
) -> Result<Option<Vec<ids::Digest>>, WorkerError> {
    let loaded = load::<Build>(node.store, &build_stream(&build))
        .await
        .map_err(WorkerError::store)?;
    let state = loaded.state;
    let (Some(registration), Some(freeze)) = (&state.registration, &state.freeze) else {
        return Ok(None);
    };
    let job = BuildJob {
        team: registration.team.clone(),
        spec: freeze.spec.clone(),
        bindings: freeze.bindings.clone(),
        resources: registration.resources,
        base_pin: state.base_pin.clone(),
        credentials: Ok(None),
        cache_mode: state.cache_mode.clone(),
        sandbox_backend: state.sandbox_backend.clone(),
    };
    let resolved =
        match base::resolve_locally(node.store, node.catalog, &job.team, &job.spec.base).await {
            Ok(Some(r)) => r,
            Ok(None) | Err(base::BaseError::Unavailable(_)) => return Ok(None),
            Err(base::BaseError::Worker(e)) => return Err(e),
        };
    // A build that copies from other templates resolves them when it runs; placement does not.
    let Ok(plan) = cache::Plan::new(&job, &resolved, &Default::default(), node.backend) else {
        return Ok(None);
    };
    cache::resume_stack(node.store, &plan, &resolved.layers)
        .await
        .map_err(|e| WorkerError::Store(e.to_string()))
}
