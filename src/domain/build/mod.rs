//! The build aggregate: the `build-{id}` stream, from registration to a terminal state.
//!
//! Layout:
//! * this file: [`State`] and [`Phase`], the [`Event`]s and [`evolve`];
//! * [`decide`](mod@decide): the single-stream [`Command`]s, their [`Error`]s and [`decide()`];
//! * [`template_deleted`]: ending a build whose template was deleted, over the build and its
//!   template;
//! * [`upload`]: the two transitions that span the build and its `files-…` stream (reserving an
//!   upload link, completing an upload), as pure functions over both states;
//! * [`status`]: the E2B view (`waiting|building|ready|error`, `reason`) and log paging.
//!
//! The lifecycle (RFC §Failure contract, Phase 0 + Publishing):
//!
//! ```text
//! Waiting{deadline} --StartBuild(freeze + digest [+ acquire epoch 1])--> Active{epoch, lease}
//!                   \-StartBuild without a node--> Queued{deadline} --AcquireAttempt--> Active
//! Active  --BeginPublishing(epoch, lease valid)--> Publishing{epoch} --MarkReady(epoch)--> Ready
//! Active  --FailBuild(epoch) | ExpireAttempt(lease passed)--> Error
//! Waiting | Queued --ExpireWaiting(deadline passed)--> Error
//! Waiting | Queued | Active | Publishing (not yet visible) --template deleted--> Error
//! ```
//!
//! Fencing lives here: every worker command names its epoch; only the one open attempt's epoch is
//! accepted, and closing an attempt (expiry, failure, ready) makes every later write of that epoch
//! fail. Ready and Error are terminal: nothing demotes Ready and Error never becomes Ready. Both
//! release the build's bindings and pending intents (`ContextReleased`).
//!
//! Logs are not events of this stream: they are high-volume, decide nothing, and appending them
//! here would make every log line race lease renewals for the stream version. They live in their
//! own append-only store (`build_logs`), paged by the status handler.

pub mod cache_consultation;
pub mod decide;
pub mod status;
pub mod template_deleted;
pub mod upload;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

pub use cache_consultation::{CacheConsultation, CacheFound};
pub use decide::{
    check_open_attempt, check_publishing, check_ready, decide, AttemptGrant, Command, Error,
};
pub use template_deleted::end_for_deleted_template;

use super::build_spec::{Resources, Tag, TemplateBuildStartV2};
use super::cache_mode::{CacheMode, ResolvedMode};
use super::ids::{
    Digest, Epoch, FilesHash, Generation, IntentId, NodeId, Scope, SnapshotId, TeamId, TemplateId,
};

/// Which generation of a context archive a build uses for one `filesHash`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    pub generation: Generation,
    pub blob_digest: Digest,
    pub size: u64,
}

/// How a binding came to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum BindingSource {
    /// A link request found a published generation and the build had no binding yet.
    Present,
    /// This build's own upload completed.
    Upload { intent: IntentId },
}

/// The grant behind one upload link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Intent {
    pub hash: FilesHash,
    pub generation: Generation,
    /// The binding the build had right after the link was handed out. Completion replaces the
    /// binding only if it still is this one: a later upload never silently rebinds.
    pub expected_binding: Option<Generation>,
    pub expires_at: DateTime<Utc>,
    pub state: IntentState,
    /// The upload receiving this intent's body now, if one does: another PUT to the same URL
    /// is refused before a byte of it is read (see [`upload::claim_upload`]).
    pub receiving: Option<uuid::Uuid>,
    /// Uploads to this URL that ended without completing: each cost two events, so only
    /// [`upload::MAX_FAILED_UPLOADS`] are taken before the URL is refused.
    pub failed_uploads: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IntentState {
    Pending,
    Completed { blob_digest: Digest },
    Expired,
}

/// Why a build ended in Error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The worker reported a failing step (base, a user step, or finalize).
    StepFailed,
    /// The attempt's lease expired: the node died or lost contact.
    NodeLost,
    /// The build was registered but never started before its deadline.
    WaitingExpired,
    /// The build was started but no node claimed it before its deadline.
    QueueExpired,
    /// Promotion hit an authoritative, permanent error.
    PromotionFailed,
    /// The build's template was deleted before the build was published
    /// ([`template_deleted`]).
    TemplateDeleted,
}

/// Where a build failed, as E2B reports it in `reason.step`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum FailedStep {
    /// The base (`FROM`) phase.
    Base,
    /// A user step, 1-based.
    Step(u32),
    /// Start and ready commands.
    Finalize,
}

impl From<FailedStep> for String {
    fn from(step: FailedStep) -> String {
        match step {
            FailedStep::Base => "base".into(),
            FailedStep::Step(n) => n.to_string(),
            FailedStep::Finalize => "finalize".into(),
        }
    }
}
impl TryFrom<String> for FailedStep {
    type Error = String;
    fn try_from(value: String) -> Result<Self, String> {
        match value.as_str() {
            "base" => Ok(FailedStep::Base),
            "finalize" => Ok(FailedStep::Finalize),
            n => match n.parse::<u32>() {
                Ok(n) if n >= 1 => Ok(FailedStep::Step(n)),
                _ => Err(format!(
                    "step {value:?} must be 'base', 'finalize' or a 1-based step number"
                )),
            },
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureReason {
    pub kind: FailureKind,
    /// Shown to the user verbatim: the SDK raises it as the exception text.
    pub message: String,
    pub step: Option<FailedStep>,
}

/// What a step's execution produced, recorded on the attempt for progress and resume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StepOutcome {
    /// Executed with no checkpoint (metadata-only step, or past the depth budget).
    Executed,
    /// Executed and sealed as a checkpoint.
    Checkpointed { snapshot: SnapshotId },
    /// Skipped: the build resumed from a cached checkpoint at or after this step.
    Cached { snapshot: SnapshotId },
}

/// What the worker hands to promotion when it enters Publishing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildResult {
    /// The complete, immutable candidate snapshot to promote.
    pub candidate: SnapshotId,
    /// The checkpoint after the default user and before finalization, for `fromTemplate`.
    pub build_base_checkpoint: Option<SnapshotId>,
}

/// Where the build is in its lifecycle.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Phase {
    /// No `BuildRegistered` yet: the stream is empty.
    #[default]
    Unregistered,
    /// Registered; accepting link requests and uploads until started or the deadline.
    Waiting {
        deadline: DateTime<Utc>,
    },
    /// Frozen and started, but no node has acquired an attempt yet.
    Queued {
        deadline: DateTime<Utc>,
    },
    /// An attempt holds the build under a lease.
    Active {
        epoch: Epoch,
        node: NodeId,
        lease_expires_at: DateTime<Utc>,
    },
    /// The irreversible commit: promotion converges forward to Ready.
    Publishing {
        epoch: Epoch,
        node: NodeId,
    },
    Ready {
        epoch: Epoch,
    },
    Error {
        epoch: Option<Epoch>,
        reason: FailureReason,
    },
}

impl Phase {
    pub fn is_terminal(&self) -> bool {
        matches!(self, Phase::Ready { .. } | Phase::Error { .. })
    }
}

/// Registration facts, fixed for the life of the build.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    pub template: TemplateId,
    pub team: TeamId,
    pub tags: Vec<Tag>,
    pub resources: Resources,
    pub registered_at: DateTime<Utc>,
}

/// What build start froze: the request and the bindings every COPY reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Freeze {
    pub request_digest: Digest,
    /// Without registry credentials (see `BuildFrozen`).
    pub spec: TemplateBuildStartV2,
    pub registry_credentials: bool,
    pub bindings: BTreeMap<FilesHash, Binding>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct State {
    pub registration: Option<Registration>,
    pub phase: Phase,
    /// Live bindings while Waiting; emptied at freeze (the frozen set lives in `freeze`) and at
    /// the terminal release.
    pub bindings: BTreeMap<FilesHash, Binding>,
    pub intents: BTreeMap<IntentId, Intent>,
    pub freeze: Option<Freeze>,
    /// The highest epoch ever acquired; the next attempt takes the one after it.
    pub last_epoch: Option<Epoch>,
    /// Step outcomes recorded by the current attempt, by 1-based step number.
    pub progress: BTreeMap<u32, StepOutcome>,
    pub result: Option<BuildResult>,
    /// Set once `ContextReleased` is recorded: nothing of this build pins context any more.
    pub context_released: bool,
    /// The manifest digest the base image's tag resolved to, once per build: every later
    /// attempt pulls this digest, whatever the tag points at by then.
    pub base_pin: Option<BasePin>,
    /// The cache mode resolved at freeze, and from which setting; `None` for builds frozen
    /// before modes existed, which ran the per-step cache (`steps`).
    pub cache_mode: Option<ResolvedMode>,
    /// The sandbox backend resolved at freeze; `None` for builds frozen before the setting
    /// existed, which ran the only backend there was (`namespace`).
    pub sandbox_backend: Option<crate::domain::backend_name::ResolvedBackend>,
}

impl State {
    /// The cache mode every attempt of this build runs.
    pub fn cache_mode(&self) -> CacheMode {
        self.cache_mode
            .as_ref()
            .map_or(CacheMode::DEFAULT, |r| r.mode)
    }
}

/// A registry base image, pinned.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct BasePin {
    /// The reference as the build named it, normalized (`docker.io/library/debian:stable`).
    pub reference: String,
    pub digest: Digest,
}

impl State {
    /// The scope of the build's context: the `files-{scope}-{hash}` streams it reads and writes.
    pub fn scope(&self) -> Option<Scope> {
        self.registration.as_ref().map(|r| Scope::team(&r.team))
    }

    /// The binding a COPY of `hash` reads: the frozen one after start, the live one before.
    pub fn binding(&self, hash: &FilesHash) -> Option<&Binding> {
        match &self.freeze {
            Some(freeze) => freeze.bindings.get(hash),
            None => self.bindings.get(hash),
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "type")]
pub enum Event {
    #[serde(rename = "BuildRegistered.v1")]
    BuildRegistered {
        template: TemplateId,
        team: TeamId,
        tags: Vec<Tag>,
        resources: Resources,
        registered_at: DateTime<Utc>,
        waiting_deadline: DateTime<Utc>,
    },
    /// A link was handed out for `hash`, reserving `generation` (also when present).
    #[serde(rename = "UploadReserved.v1")]
    UploadReserved {
        intent: IntentId,
        hash: FilesHash,
        generation: Generation,
        expected_binding: Option<Generation>,
        expires_at: DateTime<Utc>,
    },
    #[serde(rename = "ContextBound.v1")]
    ContextBound {
        hash: FilesHash,
        binding: Binding,
        source: BindingSource,
    },
    #[serde(rename = "UploadCompleted.v1")]
    UploadCompleted {
        intent: IntentId,
        blob_digest: Digest,
        size: u64,
        completed_at: DateTime<Utc>,
    },
    #[serde(rename = "IntentExpired.v1")]
    IntentExpired {
        intent: IntentId,
        expired_at: DateTime<Utc>,
    },
    /// An upload to the intent's URL began receiving its body, as `claim`: until it completes
    /// or releases the claim, no other PUT to that URL is read.
    #[serde(rename = "UploadClaimed.v1")]
    UploadClaimed {
        intent: IntentId,
        claim: uuid::Uuid,
        claimed_at: DateTime<Utc>,
    },
    /// The upload `claim` ended without completing (a broken body, a wrong size, a store
    /// failure): the URL may be used again.
    #[serde(rename = "UploadClaimReleased.v1")]
    UploadClaimReleased {
        intent: IntentId,
        claim: uuid::Uuid,
        reason: String,
    },
    /// Build start: the request, its digest and the bindings every COPY will read. The spec is
    /// stored without registry credentials; `registry_credentials` says the base needs them, and
    /// the API keeps them outside the event store for the worker.
    #[serde(rename = "BuildFrozen.v1")]
    BuildFrozen {
        request_digest: Digest,
        spec: TemplateBuildStartV2,
        registry_credentials: bool,
        bindings: BTreeMap<FilesHash, Binding>,
        frozen_at: DateTime<Utc>,
        queue_deadline: DateTime<Utc>,
    },
    /// The cache mode the build runs for its whole life, with the setting it came from and
    /// the values skipped on the way; appended with `BuildFrozen`.
    #[serde(rename = "CacheModeResolved.v1")]
    CacheModeResolved { resolved: ResolvedMode },
    /// The sandbox backend every attempt runs the build's steps on, with the setting it came
    /// from; appended with `BuildFrozen`, after `CacheModeResolved`.
    #[serde(rename = "SandboxBackendResolved.v1")]
    SandboxBackendResolved {
        resolved: crate::domain::backend_name::ResolvedBackend,
    },
    #[serde(rename = "AttemptAcquired.v1")]
    AttemptAcquired {
        epoch: Epoch,
        node: NodeId,
        lease_expires_at: DateTime<Utc>,
        acquired_at: DateTime<Utc>,
    },
    #[serde(rename = "LeaseRenewed.v1")]
    LeaseRenewed {
        epoch: Epoch,
        lease_expires_at: DateTime<Utc>,
        renewed_at: DateTime<Utc>,
    },
    #[serde(rename = "StepCompleted.v1")]
    StepCompleted {
        epoch: Epoch,
        step: u32,
        outcome: StepOutcome,
        completed_at: DateTime<Utc>,
    },
    /// The attempt computed the build's cache keys and looked them up (recorded before any
    /// step of that attempt). Informational: it changes no state.
    #[serde(rename = "CacheConsulted.v1")]
    CacheConsulted {
        epoch: Epoch,
        consultation: CacheConsultation,
        consulted_at: DateTime<Utc>,
    },
    /// The base image's tag resolved to `digest` in the registry (recorded once per build).
    #[serde(rename = "BaseImageResolved.v1")]
    BaseImageResolved {
        epoch: Epoch,
        reference: String,
        digest: Digest,
        resolved_at: DateTime<Utc>,
    },
    #[serde(rename = "PublishingStarted.v1")]
    PublishingStarted {
        epoch: Epoch,
        result: BuildResult,
        started_at: DateTime<Utc>,
    },
    #[serde(rename = "BuildReady.v1")]
    BuildReady {
        epoch: Epoch,
        ready_at: DateTime<Utc>,
    },
    /// The reconciler closed an attempt whose lease passed; its epoch is fenced from here on.
    #[serde(rename = "AttemptExpired.v1")]
    AttemptExpired {
        epoch: Epoch,
        node: NodeId,
        lease_expires_at: DateTime<Utc>,
        expired_at: DateTime<Utc>,
    },
    #[serde(rename = "BuildFailed.v1")]
    BuildFailed {
        epoch: Option<Epoch>,
        reason: FailureReason,
        failed_at: DateTime<Utc>,
    },
    /// Terminal release: these bindings no longer pin their generations and these pending
    /// intents can no longer complete.
    #[serde(rename = "ContextReleased.v1")]
    ContextReleased {
        bindings: BTreeMap<FilesHash, Generation>,
        intents: Vec<IntentId>,
    },
}

pub fn evolve(mut state: State, event: &Event) -> State {
    match event {
        Event::BaseImageResolved {
            reference, digest, ..
        } => {
            state.base_pin = Some(BasePin {
                reference: reference.clone(),
                digest: *digest,
            });
        }
        Event::BuildRegistered {
            template,
            team,
            tags,
            resources,
            registered_at,
            waiting_deadline,
        } => {
            state.registration = Some(Registration {
                template: template.clone(),
                team: team.clone(),
                tags: tags.clone(),
                resources: *resources,
                registered_at: *registered_at,
            });
            state.phase = Phase::Waiting {
                deadline: *waiting_deadline,
            };
        }
        Event::UploadReserved {
            intent,
            hash,
            generation,
            expected_binding,
            expires_at,
        } => {
            state.intents.insert(
                *intent,
                Intent {
                    hash: hash.clone(),
                    generation: *generation,
                    expected_binding: *expected_binding,
                    expires_at: *expires_at,
                    state: IntentState::Pending,
                    receiving: None,
                    failed_uploads: 0,
                },
            );
        }
        Event::ContextBound { hash, binding, .. } => {
            state.bindings.insert(hash.clone(), *binding);
        }
        Event::UploadCompleted {
            intent,
            blob_digest,
            ..
        } => {
            if let Some(i) = state.intents.get_mut(intent) {
                i.state = IntentState::Completed {
                    blob_digest: *blob_digest,
                };
                i.receiving = None;
            }
        }
        Event::UploadClaimed { intent, claim, .. } => {
            if let Some(i) = state.intents.get_mut(intent) {
                i.receiving = Some(*claim);
            }
        }
        Event::UploadClaimReleased { intent, claim, .. } => {
            if let Some(i) = state.intents.get_mut(intent) {
                if i.receiving == Some(*claim) {
                    i.receiving = None;
                    i.failed_uploads += 1;
                }
            }
        }
        Event::IntentExpired { intent, .. } => {
            if let Some(i) = state.intents.get_mut(intent) {
                i.state = IntentState::Expired;
            }
        }
        Event::BuildFrozen {
            request_digest,
            spec,
            registry_credentials,
            bindings,
            queue_deadline,
            ..
        } => {
            state.freeze = Some(Freeze {
                request_digest: *request_digest,
                spec: spec.clone(),
                registry_credentials: *registry_credentials,
                bindings: bindings.clone(),
            });
            state.bindings.clear();
            state.phase = Phase::Queued {
                deadline: *queue_deadline,
            };
        }
        Event::CacheModeResolved { resolved } => state.cache_mode = Some(resolved.clone()),
        Event::SandboxBackendResolved { resolved } => {
            state.sandbox_backend = Some(resolved.clone())
        }
        Event::AttemptAcquired {
            epoch,
            node,
            lease_expires_at,
            ..
        } => {
            state.last_epoch = Some(*epoch);
            state.progress.clear();
            state.phase = Phase::Active {
                epoch: *epoch,
                node: node.clone(),
                lease_expires_at: *lease_expires_at,
            };
        }
        Event::LeaseRenewed {
            lease_expires_at: new_expiry,
            ..
        } => {
            if let Phase::Active {
                lease_expires_at, ..
            } = &mut state.phase
            {
                *lease_expires_at = *new_expiry;
            }
        }
        Event::StepCompleted { step, outcome, .. } => {
            state.progress.insert(*step, outcome.clone());
        }
        Event::CacheConsulted { .. } => {}
        Event::PublishingStarted { epoch, result, .. } => {
            let node = match &state.phase {
                Phase::Active { node, .. } => node.clone(),
                Phase::Publishing { node, .. } => node.clone(),
                _ => return state,
            };
            state.result = Some(result.clone());
            state.phase = Phase::Publishing {
                epoch: *epoch,
                node,
            };
        }
        Event::BuildReady { epoch, .. } => {
            state.phase = Phase::Ready { epoch: *epoch };
        }
        Event::AttemptExpired { .. } => {
            // The attempt is closed; the BuildFailed that follows sets the terminal phase. Until
            // then nothing may act on the closed epoch, so the phase leaves Active at once.
            if let Phase::Active { epoch, .. } = state.phase {
                state.phase = Phase::Error {
                    epoch: Some(epoch),
                    reason: FailureReason {
                        kind: FailureKind::NodeLost,
                        message: String::new(),
                        step: None,
                    },
                };
            }
        }
        Event::BuildFailed { epoch, reason, .. } => {
            state.phase = Phase::Error {
                epoch: *epoch,
                reason: reason.clone(),
            };
        }
        Event::ContextReleased { intents, .. } => {
            state.bindings.clear();
            for id in intents {
                if let Some(i) = state.intents.get_mut(id) {
                    i.state = IntentState::Expired;
                }
            }
            state.context_released = true;
        }
    }
    state
}

/// Replays a stream into its state.
pub fn replay<'a>(events: impl IntoIterator<Item = &'a Event>) -> State {
    events.into_iter().fold(State::default(), evolve)
}
