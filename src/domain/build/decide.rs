//! The build's single-stream commands and their decisions.
//!
//! Layout: [`Command`] (one variant per transition, in lifecycle order), [`Error`], [`decide`],
//! then one private function per command, then the shared fencing check ([`open_attempt`]) and the
//! terminal release.
//!
//! Idempotency: a command whose effect is already recorded returns no events rather than an error
//! (a replayed `StartBuild` with the same request digest, `MarkReady` on a build already Ready in
//! that epoch, `RegisterBuild` with the same facts), so a caller retrying after a lost response
//! converges. A command that would change a recorded fact is an error.

use chrono::{DateTime, Utc};

use std::collections::BTreeMap;

use super::{
    Binding, BindingSource, BuildResult, Event, FailedStep, FailureKind, FailureReason,
    IntentState, Phase, State, StepOutcome,
};
use crate::domain::build_spec::{Resources, Step, Tag, TemplateBuildStartV2};
use crate::domain::ids::{Digest, Epoch, FilesHash, IntentId, NodeId, TeamId, TemplateId};

/// A node's claim on a build: who runs it and until when the lease holds unless renewed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptGrant {
    pub node: NodeId,
    pub lease_expires_at: DateTime<Utc>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// `POST /v3/templates`: the build exists and waits for uploads and start until `deadline`.
    RegisterBuild {
        template: TemplateId,
        team: TeamId,
        tags: Vec<Tag>,
        resources: Resources,
        now: DateTime<Utc>,
        waiting_deadline: DateTime<Utc>,
    },
    /// `POST /v2/templates/{id}/builds/{bid}`: freeze bindings and record the request digest; with
    /// `attempt`, also acquire epoch 1 in the same decision (a node that starts work at once).
    StartBuild {
        spec: TemplateBuildStartV2,
        now: DateTime<Utc>,
        /// How long a frozen build may wait for a node before it fails.
        queue_deadline: DateTime<Utc>,
        attempt: Option<AttemptGrant>,
        /// The scope's latest present generation of COPY hashes this build has no binding for,
        /// as the caller read them (bytes still stored). The link call names only the template,
        /// so with two builds of one template waiting, one build's links and uploads bind the
        /// other; the freeze binds such a hash to what is present, as E2B, which scopes files
        /// per template, would copy.
        present: BTreeMap<FilesHash, Binding>,
        /// The request's registry credentials as a keyed digest (the API keys it with a key
        /// derived from the server secret, as it seals them for the worker), so the
        /// recorded request digest cannot be used to guess them offline. `None`: the plain
        /// digest of earlier versions (callers without the secret, such as tests).
        credentials_fingerprint: Option<Digest>,
        /// The cache mode resolved from the settings at start (`CacheModeResolved`); `None`
        /// records none, and the build runs the default.
        cache_mode: Option<crate::domain::cache_mode::ResolvedMode>,
        /// The sandbox backend resolved at start (`SandboxBackendResolved`); `None` records
        /// none, and the build runs the default.
        sandbox_backend: Option<crate::domain::backend_name::ResolvedBackend>,
    },
    /// A worker claims a queued build.
    AcquireAttempt {
        grant: AttemptGrant,
        now: DateTime<Utc>,
    },
    RenewLease {
        epoch: Epoch,
        now: DateTime<Utc>,
        lease_expires_at: DateTime<Utc>,
    },
    /// Step `step` (1-based) finished with `outcome`.
    RecordStepProgress {
        epoch: Epoch,
        step: u32,
        outcome: StepOutcome,
        now: DateTime<Utc>,
    },
    /// Steps `1..=upto` were answered from the cache by `snapshot`: one decision for the whole
    /// cached prefix (a `StepCompleted` per step, as one step at a time would record), so an
    /// unchanged rebuild records it in one append instead of one per step.
    RecordStepsCached {
        epoch: Epoch,
        upto: u32,
        snapshot: super::SnapshotId,
        now: DateTime<Utc>,
    },
    /// The attempt's cache keys and lookup verdict, for operators (ADR 0015).
    RecordCacheConsultation {
        epoch: Epoch,
        consultation: super::CacheConsultation,
        now: DateTime<Utc>,
    },
    /// The base image's tag resolved to `digest`: pins the base for this and every later
    /// attempt. Recording the same pin again is a no-op; another digest is a conflict.
    PinBaseImage {
        epoch: Epoch,
        reference: String,
        digest: Digest,
        now: DateTime<Utc>,
    },
    /// The irreversible commit: the candidate is complete, promotion takes over.
    BeginPublishing {
        epoch: Epoch,
        result: BuildResult,
        now: DateTime<Utc>,
    },
    /// Promotion made the result visible.
    MarkReady { epoch: Epoch, now: DateTime<Utc> },
    /// The worker (or, while Publishing, the promotion reconciler on a permanent error) gives up.
    FailBuild {
        epoch: Epoch,
        message: String,
        step: Option<FailedStep>,
        now: DateTime<Utc>,
    },
    /// Attempt reconciler: the lease passed, the node is lost.
    ExpireAttempt { now: DateTime<Utc> },
    /// Waiting-deadline reconciler: registered (or queued) too long without progress.
    ExpireWaiting { now: DateTime<Utc> },
    /// Intent reconciler: an upload link's grant lapsed unused.
    ExpireIntent {
        intent: IntentId,
        now: DateTime<Utc>,
    },
}

/// What a build refused to do. The HTTP mapping: `NotRegistered` is 404; `InvalidRequest` and
/// `MissingBinding` are 400; the conflicts are 409; fencing errors tell a worker to stop.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("build is not registered; register it with POST /v3/templates first")]
    NotRegistered,
    #[error("build is already registered with other facts (template, team, tags or resources); register a new build instead")]
    AlreadyRegistered,
    #[error("the build is {status}, not waiting: {what} is only possible before the build starts; register a new build")]
    NotWaiting {
        status: &'static str,
        what: &'static str,
    },
    #[error("the build's waiting deadline {deadline} has passed; register a new build")]
    DeadlinePassed { deadline: DateTime<Utc> },
    #[error("step {step} copies filesHash {hash} but no upload link was requested for it; call GET /templates/{{id}}/files/{hash} (and upload) before starting the build")]
    MissingBinding { step: usize, hash: FilesHash },
    #[error("the build was already started with a different request (digest {frozen}, this one {attempted}); a build starts once, register a new build to change it")]
    StartConflict { frozen: Digest, attempted: Digest },
    #[error("the build is not queued for a node (it is {status}); nothing to acquire")]
    NotQueued { status: &'static str },
    #[error(
        "epoch {given} is stale: the open attempt is epoch {current}; stop working on this build"
    )]
    StaleEpoch { given: Epoch, current: Epoch },
    #[error("attempt {epoch} is closed; stop working on this build")]
    AttemptClosed { epoch: Epoch },
    #[error("no attempt {epoch} was ever acquired on this build")]
    UnknownAttempt { epoch: Epoch },
    #[error("the lease of attempt {epoch} expired at {expired_at}; stop working, the reconciler will close the attempt")]
    LeaseExpired {
        epoch: Epoch,
        expired_at: DateTime<Utc>,
    },
    #[error("the new lease expiry {requested} is not after the current one {current}")]
    LeaseNotExtended {
        requested: DateTime<Utc>,
        current: DateTime<Utc>,
    },
    #[error("step {step} is out of range: the build has {steps} steps")]
    StepOutOfRange { step: u32, steps: usize },
    #[error("the base image was already pinned to {pinned}; a build's base resolves once")]
    BasePinConflict { pinned: Digest },
    #[error("step {step} was already recorded with a different outcome")]
    StepConflict { step: u32 },
    #[error("the build is {status}; terminal states never change")]
    Terminal { status: &'static str },
    #[error(
        "attempt {epoch} is already publishing with another result; publishing is entered once"
    )]
    PublishConflict { epoch: Epoch },
    #[error("attempt {epoch} is already publishing; steps and leases no longer change")]
    AlreadyPublishing { epoch: Epoch },
    #[error("the build is not publishing (it is {status}); only a publishing build becomes ready")]
    NotPublishing { status: &'static str },
    #[error("attempt {epoch} is publishing: promotion converges forward, a lapsed lease does not fail it; hand it to the promotion reconciler")]
    PublishingConvergesForward { epoch: Epoch },
    #[error("the lease of attempt {epoch} holds until {lease_expires_at}; it cannot be expired at {now}")]
    LeaseStillValid {
        epoch: Epoch,
        lease_expires_at: DateTime<Utc>,
        now: DateTime<Utc>,
    },
    #[error("the build has no open attempt (it is {status}); nothing to expire")]
    NoOpenAttempt { status: &'static str },
    #[error("the deadline {deadline} has not passed at {now}")]
    DeadlineNotPassed {
        deadline: DateTime<Utc>,
        now: DateTime<Utc>,
    },
    #[error("upload intent {intent} is unknown to this build; request a new upload link")]
    UnknownIntent { intent: IntentId },
    #[error("upload intent {intent} is no longer pending; nothing to expire")]
    IntentNotPending { intent: IntentId },
    #[error("upload intent {intent} holds until {expires_at}; it cannot be expired at {now}")]
    IntentStillValid {
        intent: IntentId,
        expires_at: DateTime<Utc>,
        now: DateTime<Utc>,
    },
    #[error("the reason message must not be empty: it is what the user sees")]
    EmptyMessage,
    #[error("the build's template is not deleted; a build ends for that reason only once it is")]
    TemplateNotDeleted,
    #[error("the build is not ready in epoch {epoch} (it is {status})")]
    NotReady { epoch: Epoch, status: &'static str },
}

/// The E2B status word of a phase, for error messages.
pub(super) fn status_word(phase: &Phase) -> &'static str {
    match phase {
        Phase::Unregistered => "unregistered",
        Phase::Waiting { .. } => "waiting",
        Phase::Queued { .. } | Phase::Active { .. } | Phase::Publishing { .. } => "building",
        Phase::Ready { .. } => "ready",
        Phase::Error { .. } => "error",
    }
}

pub fn decide(state: &State, command: &Command) -> Result<Vec<Event>, Error> {
    if let Command::RegisterBuild {
        template,
        team,
        tags,
        resources,
        now,
        waiting_deadline,
    } = command
    {
        return register(
            state,
            template,
            team,
            tags,
            resources,
            *now,
            *waiting_deadline,
        );
    }
    if state.registration.is_none() {
        return Err(Error::NotRegistered);
    }
    match command {
        Command::RegisterBuild { .. } => unreachable!("handled above"),
        Command::StartBuild {
            spec,
            now,
            queue_deadline,
            attempt,
            present,
            credentials_fingerprint,
            cache_mode,
            sandbox_backend,
        } => {
            let mut events = start(
                state,
                spec,
                credentials_fingerprint.as_ref(),
                *now,
                *queue_deadline,
                attempt.as_ref(),
                present,
            )?;
            // Right after the freeze, before any attempt: every attempt reads them.
            if let Some(at) = events
                .iter()
                .position(|e| matches!(e, Event::BuildFrozen { .. }))
            {
                let resolved = cache_mode
                    .iter()
                    .map(|r| Event::CacheModeResolved {
                        resolved: r.clone(),
                    })
                    .chain(
                        sandbox_backend
                            .iter()
                            .map(|r| Event::SandboxBackendResolved {
                                resolved: r.clone(),
                            }),
                    );
                events.splice(at + 1..at + 1, resolved);
            }
            Ok(events)
        }
        Command::AcquireAttempt { grant, now } => acquire(state, grant, *now),
        Command::RenewLease {
            epoch,
            now,
            lease_expires_at,
        } => renew(state, *epoch, *now, *lease_expires_at),
        Command::RecordStepProgress {
            epoch,
            step,
            outcome,
            now,
        } => record_step(state, *epoch, *step, outcome, *now),
        Command::RecordStepsCached {
            epoch,
            upto,
            snapshot,
            now,
        } => {
            let outcome = StepOutcome::Cached {
                snapshot: *snapshot,
            };
            let mut events = Vec::new();
            for step in 1..=*upto {
                events.extend(record_step(state, *epoch, step, &outcome, *now)?);
            }
            Ok(events)
        }
        Command::RecordCacheConsultation {
            epoch,
            consultation,
            now,
        } => {
            open_attempt(state, *epoch, *now, true, false)?;
            Ok(vec![Event::CacheConsulted {
                epoch: *epoch,
                consultation: consultation.clone(),
                consulted_at: *now,
            }])
        }
        Command::PinBaseImage {
            epoch,
            reference,
            digest,
            now,
        } => pin_base(state, *epoch, reference, digest, *now),
        Command::BeginPublishing { epoch, result, now } => {
            begin_publishing(state, *epoch, result, *now)
        }
        Command::MarkReady { epoch, now } => mark_ready(state, *epoch, *now),
        Command::FailBuild {
            epoch,
            message,
            step,
            now,
        } => fail(state, *epoch, message, *step, *now),
        Command::ExpireAttempt { now } => expire_attempt(state, *now),
        Command::ExpireWaiting { now } => expire_waiting(state, *now),
        Command::ExpireIntent { intent, now } => expire_intent(state, *intent, *now),
    }
}

fn register(
    state: &State,
    template: &TemplateId,
    team: &TeamId,
    tags: &[Tag],
    resources: &Resources,
    now: DateTime<Utc>,
    waiting_deadline: DateTime<Utc>,
) -> Result<Vec<Event>, Error> {
    if let Some(r) = &state.registration {
        let same = &r.template == template
            && &r.team == team
            && r.tags == tags
            && &r.resources == resources;
        return if same {
            Ok(vec![])
        } else {
            Err(Error::AlreadyRegistered)
        };
    }
    Ok(vec![Event::BuildRegistered {
        template: template.clone(),
        team: team.clone(),
        tags: tags.to_vec(),
        resources: *resources,
        registered_at: now,
        waiting_deadline,
    }])
}

/// Build start: one decision that freezes bindings, records the request digest and, when a node
/// is named, acquires epoch 1. Appended as one batch, it is the RFC's single CAS.
fn start(
    state: &State,
    spec: &TemplateBuildStartV2,
    credentials_fingerprint: Option<&Digest>,
    now: DateTime<Utc>,
    queue_deadline: DateTime<Utc>,
    attempt: Option<&AttemptGrant>,
    present: &BTreeMap<FilesHash, Binding>,
) -> Result<Vec<Event>, Error> {
    let request_digest = spec.request_digest_with(credentials_fingerprint);
    if let Some(freeze) = &state.freeze {
        // A build frozen before credentials were keyed recorded the plain digest: the same
        // request is still a replay of it.
        let same = freeze.request_digest == request_digest
            || (credentials_fingerprint.is_some()
                && freeze.request_digest == spec.request_digest());
        return if same {
            Ok(vec![])
        } else {
            Err(Error::StartConflict {
                frozen: freeze.request_digest,
                attempted: request_digest,
            })
        };
    }
    let deadline = match &state.phase {
        Phase::Waiting { deadline } => *deadline,
        other => {
            return Err(Error::NotWaiting {
                status: status_word(other),
                what: "starting",
            })
        }
    };
    if now >= deadline {
        return Err(Error::DeadlinePassed { deadline });
    }
    let mut bindings = BTreeMap::new();
    let mut bound_now = Vec::new();
    for (i, step) in spec.steps.iter().enumerate() {
        if let Step::Copy { files_hash, .. } = step {
            let binding = match (state.bindings.get(files_hash), present.get(files_hash)) {
                (Some(binding), _) => *binding,
                (None, Some(binding)) => {
                    if !bindings.contains_key(files_hash) {
                        bound_now.push(Event::ContextBound {
                            hash: files_hash.clone(),
                            binding: *binding,
                            source: BindingSource::Present,
                        });
                    }
                    *binding
                }
                (None, None) => {
                    return Err(Error::MissingBinding {
                        step: i + 1,
                        hash: files_hash.clone(),
                    })
                }
            };
            bindings.insert(files_hash.clone(), binding);
        }
    }
    let mut events = bound_now;
    events.push(Event::BuildFrozen {
        request_digest,
        spec: spec.without_credentials(),
        registry_credentials: spec.has_registry_credentials(),
        bindings,
        frozen_at: now,
        queue_deadline,
    });
    if let Some(grant) = attempt {
        events.push(Event::AttemptAcquired {
            epoch: Epoch::FIRST,
            node: grant.node.clone(),
            lease_expires_at: grant.lease_expires_at,
            acquired_at: now,
        });
    }
    Ok(events)
}

fn acquire(state: &State, grant: &AttemptGrant, now: DateTime<Utc>) -> Result<Vec<Event>, Error> {
    match &state.phase {
        Phase::Queued { deadline } if now < *deadline => Ok(vec![Event::AttemptAcquired {
            epoch: state.last_epoch.map_or(Epoch::FIRST, Epoch::next),
            node: grant.node.clone(),
            lease_expires_at: grant.lease_expires_at,
            acquired_at: now,
        }]),
        Phase::Queued { deadline } => Err(Error::DeadlinePassed {
            deadline: *deadline,
        }),
        other => Err(Error::NotQueued {
            status: status_word(other),
        }),
    }
}

/// The fencing check every worker write passes: `epoch` must be the open Active attempt (or, when
/// `allow_publishing`, the publishing one), and, when `need_lease`, its lease must not have passed
/// at `now`.
fn open_attempt(
    state: &State,
    epoch: Epoch,
    now: DateTime<Utc>,
    need_lease: bool,
    allow_publishing: bool,
) -> Result<(), Error> {
    match &state.phase {
        Phase::Publishing { epoch: current, .. } if *current == epoch => {
            if allow_publishing {
                Ok(())
            } else {
                Err(Error::AlreadyPublishing { epoch })
            }
        }
        Phase::Active {
            epoch: current,
            lease_expires_at,
            ..
        } => {
            if *current != epoch {
                return Err(stale_or_unknown(state, epoch, Some(*current)));
            }
            if need_lease && now >= *lease_expires_at {
                return Err(Error::LeaseExpired {
                    epoch,
                    expired_at: *lease_expires_at,
                });
            }
            Ok(())
        }
        Phase::Publishing { epoch: current, .. } if *current != epoch => {
            Err(stale_or_unknown(state, epoch, Some(*current)))
        }
        Phase::Ready { .. } | Phase::Error { .. } => Err(Error::Terminal {
            status: status_word(&state.phase),
        }),
        _ => Err(stale_or_unknown(state, epoch, None)),
    }
}

/// The fencing check alone: `epoch` is the open Active attempt and its lease holds at `now`. For
/// worker writes to *other* streams (a checkpoint's snapshot record) that must land only while the
/// attempt holds the build: the caller appends them together with a guard on the build stream at
/// the version it checked.
pub fn check_open_attempt(state: &State, epoch: Epoch, now: DateTime<Utc>) -> Result<(), Error> {
    open_attempt(state, epoch, now, true, false)
}

/// The guard of a promotion's flip to visible: the build is Publishing in `epoch`, or already
/// Ready in it (the flip is being repeated).
pub fn check_publishing(state: &State, epoch: Epoch) -> Result<(), Error> {
    match &state.phase {
        Phase::Publishing { epoch: e, .. } | Phase::Ready { epoch: e } if *e == epoch => Ok(()),
        Phase::Publishing { epoch: current, .. } => {
            Err(stale_or_unknown(state, epoch, Some(*current)))
        }
        Phase::Ready { .. } | Phase::Error { .. } => Err(Error::Terminal {
            status: status_word(&state.phase),
        }),
        other => Err(Error::NotPublishing {
            status: status_word(other),
        }),
    }
}

/// The guard of writes that need the build Ready in `epoch` (its final cache entry).
pub fn check_ready(state: &State, epoch: Epoch) -> Result<(), Error> {
    match &state.phase {
        Phase::Ready { epoch: e } if *e == epoch => Ok(()),
        other => Err(Error::NotReady {
            epoch,
            status: status_word(other),
        }),
    }
}

fn stale_or_unknown(state: &State, epoch: Epoch, current: Option<Epoch>) -> Error {
    match (current, state.last_epoch) {
        (Some(current), _) if epoch < current => Error::StaleEpoch {
            given: epoch,
            current,
        },
        (_, Some(last)) if epoch <= last => Error::AttemptClosed { epoch },
        _ => Error::UnknownAttempt { epoch },
    }
}

fn renew(
    state: &State,
    epoch: Epoch,
    now: DateTime<Utc>,
    lease_expires_at: DateTime<Utc>,
) -> Result<Vec<Event>, Error> {
    if let Phase::Publishing { epoch: current, .. } = &state.phase {
        if *current == epoch {
            // The lease stops mattering once publishing: promotion converges regardless.
            return Ok(vec![]);
        }
    }
    open_attempt(state, epoch, now, true, false)?;
    if let Phase::Active {
        lease_expires_at: current,
        ..
    } = &state.phase
    {
        if lease_expires_at <= *current {
            return Err(Error::LeaseNotExtended {
                requested: lease_expires_at,
                current: *current,
            });
        }
    }
    Ok(vec![Event::LeaseRenewed {
        epoch,
        lease_expires_at,
        renewed_at: now,
    }])
}

fn record_step(
    state: &State,
    epoch: Epoch,
    step: u32,
    outcome: &StepOutcome,
    now: DateTime<Utc>,
) -> Result<Vec<Event>, Error> {
    open_attempt(state, epoch, now, true, false)?;
    let steps = state.freeze.as_ref().map_or(0, |f| f.spec.steps.len());
    if step == 0 || step as usize > steps {
        return Err(Error::StepOutOfRange { step, steps });
    }
    match state.progress.get(&step) {
        Some(recorded) if recorded == outcome => Ok(vec![]),
        Some(_) => Err(Error::StepConflict { step }),
        None => Ok(vec![Event::StepCompleted {
            epoch,
            step,
            outcome: outcome.clone(),
            completed_at: now,
        }]),
    }
}

fn pin_base(
    state: &State,
    epoch: Epoch,
    reference: &str,
    digest: &Digest,
    now: DateTime<Utc>,
) -> Result<Vec<Event>, Error> {
    open_attempt(state, epoch, now, true, false)?;
    match &state.base_pin {
        Some(pin) if &pin.digest == digest => Ok(vec![]),
        Some(pin) => Err(Error::BasePinConflict { pinned: pin.digest }),
        None => Ok(vec![Event::BaseImageResolved {
            epoch,
            reference: reference.to_owned(),
            digest: *digest,
            resolved_at: now,
        }]),
    }
}

fn begin_publishing(
    state: &State,
    epoch: Epoch,
    result: &BuildResult,
    now: DateTime<Utc>,
) -> Result<Vec<Event>, Error> {
    if let Phase::Publishing { epoch: current, .. } = &state.phase {
        if *current == epoch {
            return if state.result.as_ref() == Some(result) {
                Ok(vec![])
            } else {
                Err(Error::PublishConflict { epoch })
            };
        }
    }
    open_attempt(state, epoch, now, true, false)?;
    Ok(vec![Event::PublishingStarted {
        epoch,
        result: result.clone(),
        started_at: now,
    }])
}

fn mark_ready(state: &State, epoch: Epoch, now: DateTime<Utc>) -> Result<Vec<Event>, Error> {
    match &state.phase {
        Phase::Ready { epoch: ready } if *ready == epoch => Ok(vec![]),
        Phase::Publishing { epoch: current, .. } if *current == epoch => {
            let mut events = vec![Event::BuildReady {
                epoch,
                ready_at: now,
            }];
            events.extend(release(state));
            Ok(events)
        }
        Phase::Publishing { epoch: current, .. } => {
            Err(stale_or_unknown(state, epoch, Some(*current)))
        }
        Phase::Ready { .. } | Phase::Error { .. } => Err(Error::Terminal {
            status: status_word(&state.phase),
        }),
        other => Err(Error::NotPublishing {
            status: status_word(other),
        }),
    }
}

fn fail(
    state: &State,
    epoch: Epoch,
    message: &str,
    step: Option<FailedStep>,
    now: DateTime<Utc>,
) -> Result<Vec<Event>, Error> {
    if message.trim().is_empty() {
        return Err(Error::EmptyMessage);
    }
    // Failing needs the open epoch but not a valid lease: a worker that knows its step failed may
    // say so even late, as long as no reconciler has closed the attempt yet.
    open_attempt(state, epoch, now, false, true)?;
    let kind = match state.phase {
        Phase::Publishing { .. } => FailureKind::PromotionFailed,
        _ => FailureKind::StepFailed,
    };
    let mut events = vec![Event::BuildFailed {
        epoch: Some(epoch),
        reason: FailureReason {
            kind,
            message: message.to_owned(),
            step,
        },
        failed_at: now,
    }];
    events.extend(release(state));
    Ok(events)
}

fn expire_attempt(state: &State, now: DateTime<Utc>) -> Result<Vec<Event>, Error> {
    match &state.phase {
        Phase::Active {
            epoch,
            node,
            lease_expires_at,
        } => {
            if now < *lease_expires_at {
                return Err(Error::LeaseStillValid {
                    epoch: *epoch,
                    lease_expires_at: *lease_expires_at,
                    now,
                });
            }
            // The step the attempt was on when it went silent: one past the last recorded.
            let step = state.progress.keys().next_back().map_or(1, |s| s + 1).min(
                state
                    .freeze
                    .as_ref()
                    .map_or(1, |f| f.spec.steps.len().max(1) as u32),
            );
            let mut events = vec![
                Event::AttemptExpired {
                    epoch: *epoch,
                    node: node.clone(),
                    lease_expires_at: *lease_expires_at,
                    expired_at: now,
                },
                Event::BuildFailed {
                    epoch: Some(*epoch),
                    reason: FailureReason {
                        kind: FailureKind::NodeLost,
                        message: format!(
                            "build node {node} stopped renewing its lease (expired at {lease_expires_at}); the build was abandoned, start it again"
                        ),
                        step: Some(FailedStep::Step(step)),
                    },
                    failed_at: now,
                },
            ];
            events.extend(release(state));
            Ok(events)
        }
        Phase::Publishing { epoch, .. } => Err(Error::PublishingConvergesForward { epoch: *epoch }),
        other => Err(Error::NoOpenAttempt {
            status: status_word(other),
        }),
    }
}

fn expire_waiting(state: &State, now: DateTime<Utc>) -> Result<Vec<Event>, Error> {
    let (deadline, kind, message) = match &state.phase {
        Phase::Waiting { deadline } => (
            *deadline,
            FailureKind::WaitingExpired,
            format!("the build was registered but not started before {deadline}; start builds promptly after registering them"),
        ),
        Phase::Queued { deadline } => (
            *deadline,
            FailureKind::QueueExpired,
            format!("no build node picked the build up before {deadline}; check that a worker is running and retry"),
        ),
        other => {
            return Err(Error::NotWaiting {
                status: status_word(other),
                what: "expiring the waiting deadline",
            })
        }
    };
    if now < deadline {
        return Err(Error::DeadlineNotPassed { deadline, now });
    }
    let mut events = vec![Event::BuildFailed {
        epoch: None,
        reason: FailureReason {
            kind,
            message,
            step: None,
        },
        failed_at: now,
    }];
    events.extend(release(state));
    Ok(events)
}

fn expire_intent(state: &State, intent: IntentId, now: DateTime<Utc>) -> Result<Vec<Event>, Error> {
    let i = state
        .intents
        .get(&intent)
        .ok_or(Error::UnknownIntent { intent })?;
    if i.state != IntentState::Pending {
        return Err(Error::IntentNotPending { intent });
    }
    if now < i.expires_at {
        return Err(Error::IntentStillValid {
            intent,
            expires_at: i.expires_at,
            now,
        });
    }
    Ok(vec![Event::IntentExpired {
        intent,
        expired_at: now,
    }])
}

/// The terminal release: every binding (live or frozen) and every pending intent.
pub(super) fn release(state: &State) -> Option<Event> {
    if state.context_released {
        return None;
    }
    let mut bindings: std::collections::BTreeMap<FilesHash, _> = state
        .bindings
        .iter()
        .map(|(h, b)| (h.clone(), b.generation))
        .collect();
    if let Some(freeze) = &state.freeze {
        bindings.extend(
            freeze
                .bindings
                .iter()
                .map(|(h, b)| (h.clone(), b.generation)),
        );
    }
    let intents = state
        .intents
        .iter()
        .filter(|(_, i)| i.state == IntentState::Pending)
        .map(|(id, _)| *id)
        .collect();
    Some(Event::ContextReleased { bindings, intents })
}
