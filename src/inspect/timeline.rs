//! One build's timeline for the operator page: its phases with their durations, its attempts,
//! each step of the latest attempt (duration, cache verdict, checkpoint, log excerpt), and the
//! actions reconcilers took on it. Derived purely from [`BuildFacts`].

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::facts::BuildFacts;
use super::why::instruction_of;
use crate::domain::build::{Event, StepOutcome};
use crate::events::ActorRole;

/// Lines of a step's log the timeline quotes.
pub const EXCERPT_LINES: usize = 3;

#[derive(Clone, Debug, Serialize)]
pub struct Timeline {
    pub phases: Vec<PhaseSpan>,
    pub attempts: Vec<AttemptRow>,
    pub steps: Vec<StepRow>,
    pub reconciler_actions: Vec<EventRow>,
    pub events: Vec<EventRow>,
}

/// A stretch of the lifecycle: `waiting` (registered -> started), `queued` (-> acquired),
/// `building` (-> publishing or the end), `publishing` (-> ready).
#[derive(Clone, Debug, Serialize)]
pub struct PhaseSpan {
    pub phase: &'static str,
    pub from: DateTime<Utc>,
    pub to: Option<DateTime<Utc>>,
    pub seconds: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct AttemptRow {
    pub epoch: u64,
    pub node: String,
    pub acquired_at: DateTime<Utc>,
    pub renewals: usize,
    pub last_lease_expiry: DateTime<Utc>,
    /// How the attempt ended: `publishing`, `ready`, `failed`, `expired`, or `open`.
    pub ended: &'static str,
}

#[derive(Clone, Debug, Serialize)]
pub struct StepRow {
    pub step: u32,
    pub instruction: String,
    /// `cached`, `checkpointed`, `executed` or `not_run`.
    pub outcome: &'static str,
    pub epoch: Option<u64>,
    pub seconds: Option<f64>,
    /// When the step began (its log header, else the previous step's end) and ended (its
    /// `StepCompleted`); a cached step begins and ends at once.
    pub started: Option<DateTime<Utc>>,
    pub ended: Option<DateTime<Utc>>,
    /// The lookup's verdict for this step's key, from the build log.
    pub cache_verdict: Option<String>,
    pub checkpoint: Option<String>,
    /// The bytes of the layer this step's checkpoint added, when the page looked it up in the
    /// blob store (the events do not carry it).
    pub checkpoint_bytes: Option<u64>,
    pub log_excerpt: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct EventRow {
    pub version: u64,
    pub at: DateTime<Utc>,
    pub actor: String,
    pub epoch: Option<u64>,
    pub event_type: String,
    pub summary: String,
}

pub fn timeline(facts: &BuildFacts) -> Timeline {
    let events: Vec<EventRow> = facts.events.iter().map(event_row).collect();
    let reconciler_actions = facts
        .events
        .iter()
        .filter(|e| e.metadata.actor.role == ActorRole::Reconciler)
        .map(event_row)
        .collect();
    Timeline {
        phases: phases(facts),
        attempts: attempts(facts),
        steps: steps(facts),
        reconciler_actions,
        events,
    }
}

fn secs(from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    (to - from).num_milliseconds() as f64 / 1000.0
}

fn phases(facts: &BuildFacts) -> Vec<PhaseSpan> {
    let at = |pick: fn(&Event) -> bool| facts.time_of(pick);
    let registered = at(|e| matches!(e, Event::BuildRegistered { .. }));
    let frozen = at(|e| matches!(e, Event::BuildFrozen { .. }));
    let acquired = facts
        .events
        .iter()
        .find(|e| matches!(e.event, Event::AttemptAcquired { .. }))
        .map(|e| e.recorded_at);
    let publishing = at(|e| matches!(e, Event::PublishingStarted { .. }));
    let ended = at(|e| {
        matches!(
            e,
            Event::BuildReady { .. } | Event::BuildFailed { .. } | Event::AttemptExpired { .. }
        )
    });
    let mut out = Vec::new();
    let mut push = |phase, from: Option<DateTime<Utc>>, to: Option<DateTime<Utc>>| {
        if let Some(from) = from {
            out.push(PhaseSpan {
                phase,
                from,
                to,
                seconds: to.map(|t| secs(from, t)),
            });
        }
    };
    push("waiting", registered, frozen.or(ended));
    push("queued", frozen, acquired.or(ended));
    push("building", acquired, publishing.or(ended));
    push("publishing", publishing, ended);
    out
}

fn attempts(facts: &BuildFacts) -> Vec<AttemptRow> {
    let mut out: Vec<AttemptRow> = Vec::new();
    for e in &facts.events {
        match &e.event {
            Event::AttemptAcquired {
                epoch,
                node,
                lease_expires_at,
                acquired_at,
            } => out.push(AttemptRow {
                epoch: epoch.0,
                node: node.to_string(),
                acquired_at: *acquired_at,
                renewals: 0,
                last_lease_expiry: *lease_expires_at,
                ended: "open",
            }),
            Event::LeaseRenewed {
                epoch,
                lease_expires_at,
                ..
            } => {
                if let Some(a) = out.iter_mut().find(|a| a.epoch == epoch.0) {
                    a.renewals += 1;
                    a.last_lease_expiry = *lease_expires_at;
                }
            }
            Event::PublishingStarted { epoch, .. } => set_end(&mut out, epoch.0, "publishing"),
            Event::BuildReady { epoch, .. } => set_end(&mut out, epoch.0, "ready"),
            Event::AttemptExpired { epoch, .. } => set_end(&mut out, epoch.0, "expired"),
            Event::BuildFailed {
                epoch: Some(epoch), ..
            } if out.iter().any(|a| a.epoch == epoch.0 && a.ended == "open") => {
                set_end(&mut out, epoch.0, "failed");
            }
            _ => {}
        }
    }
    out
}

fn set_end(out: &mut [AttemptRow], epoch: u64, ended: &'static str) {
    if let Some(a) = out.iter_mut().find(|a| a.epoch == epoch) {
        a.ended = ended;
    }
}

fn steps(facts: &BuildFacts) -> Vec<StepRow> {
    let Some(freeze) = &facts.state.freeze else {
        return Vec::new();
    };
    let epoch = facts.last_epoch();
    let acquired = facts
        .events
        .iter()
        .rev()
        .find(|e| matches!(e.event, Event::AttemptAcquired { .. }))
        .map(|e| e.recorded_at);
    let mut boundary = acquired;
    let mut out = Vec::with_capacity(freeze.spec.steps.len());
    for (i, step) in freeze.spec.steps.iter().enumerate() {
        let n = i as u32 + 1;
        let tag = n.to_string();
        let completed = facts.events.iter().rev().find_map(|e| match &e.event {
            Event::StepCompleted {
                epoch: ep,
                step,
                outcome,
                completed_at,
            } if *step == n && Some(ep.0) == epoch => Some((outcome.clone(), *completed_at)),
            _ => None,
        });
        let lines: Vec<&str> = facts
            .logs
            .iter()
            .filter(|l| l.step.as_deref() == Some(tag.as_str()))
            .filter(|l| epoch.is_none() || l.epoch.map(|e| e as u64) == epoch)
            .map(|l| l.message.as_str())
            .collect();
        let started = facts
            .logs
            .iter()
            .find(|l| {
                l.step.as_deref() == Some(tag.as_str())
                    && l.message.starts_with(&format!("[{n}/"))
                    && !l.message.contains("] CACHED ")
            })
            .map(|l| l.logged_at)
            .or(boundary);
        let cache_verdict = lines
            .iter()
            .rev()
            .find(|m| m.starts_with("[cache] step "))
            .and_then(|m| m.rsplit_once(": ").map(|(_, v)| v.to_owned()));
        let ended = completed.as_ref().map(|(_, at)| *at);
        let began = match &completed {
            Some((StepOutcome::Cached { .. }, at)) => Some(*at),
            _ => started,
        };
        let (outcome, checkpoint, seconds) = match &completed {
            Some((o, at)) => {
                let seconds = started.map(|s| secs(s, *at).max(0.0));
                boundary = Some(*at);
                match o {
                    StepOutcome::Cached { snapshot } => {
                        ("cached", Some(snapshot.to_string()), Some(0.0))
                    }
                    StepOutcome::Checkpointed { snapshot } => {
                        ("checkpointed", Some(snapshot.to_string()), seconds)
                    }
                    StepOutcome::Executed => ("executed", None, seconds),
                }
            }
            None => ("not_run", None, None),
        };
        let body: Vec<&str> = lines
            .iter()
            .copied()
            .filter(|m| !m.starts_with("[cache] ") && !m.starts_with(&format!("[{n}/")))
            .collect();
        let from = body.len().saturating_sub(EXCERPT_LINES);
        out.push(StepRow {
            step: n,
            instruction: instruction_of(step),
            outcome,
            epoch: completed.as_ref().and(epoch),
            seconds,
            started: began,
            ended,
            cache_verdict: cache_verdict.or_else(|| (outcome == "cached").then(|| "cached".into())),
            checkpoint,
            checkpoint_bytes: None,
            log_excerpt: body[from..].iter().map(|s| s.to_string()).collect(),
        });
    }
    out
}

fn event_row(e: &super::facts::BuildEvent) -> EventRow {
    let event_type = serde_json::to_value(&e.event)
        .ok()
        .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(str::to_owned))
        .unwrap_or_default();
    EventRow {
        version: e.version,
        at: e.recorded_at,
        actor: format!(
            "{}/{}",
            e.metadata.actor.role.as_str(),
            e.metadata.actor.node
        ),
        epoch: e.metadata.epoch,
        event_type,
        summary: summary(&e.event),
    }
}

fn summary(event: &Event) -> String {
    match event {
        Event::BuildRegistered { template, team, .. } => {
            format!("template {template}, team {team}")
        }
        Event::UploadReserved {
            hash, generation, ..
        } => {
            format!("upload link for {hash} (generation {generation:?})")
        }
        Event::ContextBound { hash, binding, .. } => {
            format!("{hash} bound to {}", binding.blob_digest)
        }
        Event::UploadCompleted {
            blob_digest, size, ..
        } => format!("{size} bytes, {blob_digest}"),
        Event::IntentExpired { intent, .. } => format!("intent {intent:?} expired"),
        Event::UploadClaimed { intent, .. } => format!("receiving the upload of intent {intent:?}"),
        Event::UploadClaimReleased { intent, reason, .. } => {
            format!("upload of intent {intent:?} ended without completing: {reason}")
        }
        Event::BuildFrozen { spec, .. } => format!("{} steps frozen", spec.steps.len()),
        Event::AttemptAcquired { epoch, node, .. } => format!("epoch {epoch} on {node}"),
        Event::BaseImageResolved {
            reference, digest, ..
        } => format!("{reference} pinned to {digest}"),
        Event::LeaseRenewed {
            lease_expires_at, ..
        } => {
            format!("lease until {}", lease_expires_at.format("%H:%M:%S"))
        }
        Event::StepCompleted { step, outcome, .. } => format!(
            "step {step}: {}",
            match outcome {
                StepOutcome::Executed => "executed".to_string(),
                StepOutcome::Checkpointed { snapshot } => format!("checkpoint {snapshot}"),
                StepOutcome::Cached { snapshot } => format!("cached {snapshot}"),
            }
        ),
        Event::CacheModeResolved { resolved } => {
            format!("cache mode {} ({})", resolved.mode, resolved.level.as_str())
        }
        Event::SandboxBackendResolved { resolved } => {
            format!("sandbox backend {}", resolved.describe())
        }
        Event::CacheConsulted { consultation, .. } => {
            format!("cache lookup: {:?}", consultation.found)
        }
        Event::PublishingStarted { result, .. } => format!("candidate {}", result.candidate),
        Event::BuildReady { .. } => "ready".into(),
        Event::AttemptExpired {
            node,
            lease_expires_at,
            ..
        } => format!(
            "node {node} lost: lease expired at {}",
            lease_expires_at.format("%H:%M:%S%.3f")
        ),
        Event::BuildFailed { reason, .. } => format!("{:?}: {}", reason.kind, reason.message),
        Event::ContextReleased { bindings, intents } => format!(
            "released {} bindings, {} intents",
            bindings.len(),
            intents.len()
        ),
    }
}
