//! `strata why build ID`: why a build failed, and for each step why it was or was not a cache
//! hit, derived from the build's events and logs alone (ADR 0015).
//!
//! Layout: the answer ([`Why`], [`FailureWhy`], [`CacheWhy`], [`StepWhy`], [`KeyPart`]); [`why`],
//! which composes [`failure`] and [`cache`]; [`closest`], which picks the earlier build of the
//! same template to compare against; then the text rendering ([`Why::to_text`]).
//!
//! The cache explanation compares recorded key chains (`CacheConsulted`): a step key chains
//! through its parent, so the first key that differs names the change and every later miss
//! follows from it. Which part of that key changed is read from the frozen requests (command,
//! COPY blob digest) and the consultation (base image digest); an unchanged key that still
//! missed is explained by the lookup's own verdict in the log (no entry, invalid, unapplied).

use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::facts::BuildFacts;
use crate::domain::build::{
    CacheConsultation, CacheFound, Event, FailedStep, FailureKind, Phase, StepOutcome,
};
use crate::domain::build_spec::{BaseSource, Step};

/// How many log lines of the failing step the answer quotes.
pub const LOG_TAIL: usize = 10;

/// The whole answer.
#[derive(Clone, Debug, Serialize)]
pub struct Why {
    pub build: String,
    pub template: Option<String>,
    /// `waiting`, `queued`, `building`, `publishing`, `ready` or `error`.
    pub status: &'static str,
    /// Set when the build ended in error.
    pub failure: Option<FailureWhy>,
    /// Set once the build was frozen (its steps are known).
    pub cache: Option<CacheWhy>,
}

/// Why a build ended in error.
#[derive(Clone, Debug, Serialize)]
pub struct FailureWhy {
    pub kind: FailureKind,
    pub message: String,
    /// `base`, `finalize` or the 1-based step number.
    pub step: Option<String>,
    /// The failing instruction, e.g. `RUN make test`.
    pub instruction: Option<String>,
    /// The exit code of a failed command, as the worker reported it.
    pub exit_code: Option<i32>,
    /// The last lines the failing step logged, oldest first.
    pub last_log_lines: Vec<String>,
    /// Who ended the build: `worker/<node>` or `reconciler/<node>`.
    pub ended_by: String,
    pub epoch: Option<u64>,
    /// For a build a reconciler ended: the facts it acted on.
    pub evidence: Option<String>,
}

/// Per-step cache explanation.
#[derive(Clone, Debug, Serialize)]
pub struct CacheWhy {
    /// The earlier build of the same template the keys were compared with.
    pub compared_with: Option<String>,
    /// What the lookup let the build do (`None`: the cache was never consulted).
    pub found: Option<CacheFound>,
    /// Why the final result was or was not cached.
    pub final_result: String,
    pub steps: Vec<StepWhy>,
    /// The cache mode the build ran and the setting it came from (`final (service setting
    /// STRATA_CACHE_MODE)`, or for a pin `final, pinned for team acme by cli/ops at …`); `None`
    /// for builds started before modes, which ran `steps`.
    pub mode: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct StepWhy {
    pub step: u32,
    pub instruction: String,
    /// `cached`, `checkpointed`, `executed` or `not_run`.
    pub outcome: &'static str,
    pub hit: bool,
    pub reason: String,
    /// The key part that changed against the compared build, when one did.
    pub changed: Option<KeyPart>,
}

/// A part of a cache key that differs between two builds.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(tag = "part", rename_all = "snake_case")]
pub enum KeyPart {
    /// The resolved base image (or the parent template's result).
    BaseImage { before: String, after: String },
    /// The base key changed with the same image: resources or the launch fingerprint
    /// (backend version, architecture, builder semantics).
    LaunchConfiguration { detail: String },
    /// The step's instruction.
    Command {
        step: u32,
        before: String,
        after: String,
    },
    /// A COPY's files: the client's filesHash and the uploaded blob's digest.
    FileHash {
        step: u32,
        files_hash_before: String,
        files_hash_after: String,
        blob_before: Option<String>,
        blob_after: Option<String>,
    },
    /// An earlier step's key changed; keys chain, so this one changed with it.
    EarlierStep { step: u32 },
    /// `force` bypassed the cache from this step on (1 with the build-level `force`).
    Force { from_step: u32 },
}

/// Answers for `target`, comparing with the closest of `earlier` (same template, registered
/// before it).
pub fn why(target: &BuildFacts, earlier: &[BuildFacts]) -> Why {
    let status = status_of(&target.state.phase);
    Why {
        build: target.build.to_string(),
        template: target
            .state
            .registration
            .as_ref()
            .map(|r| r.template.to_string()),
        status,
        failure: failure(target),
        cache: cache(target, closest(target, earlier)),
    }
}

fn status_of(phase: &Phase) -> &'static str {
    match phase {
        Phase::Unregistered => "unregistered",
        Phase::Waiting { .. } => "waiting",
        Phase::Queued { .. } => "queued",
        Phase::Active { .. } => "building",
        Phase::Publishing { .. } => "publishing",
        Phase::Ready { .. } => "ready",
        Phase::Error { .. } => "error",
    }
}

// ---------------------------------------------------------------------------------------------
// Failure
// ---------------------------------------------------------------------------------------------

/// Why the build ended in error, from its `BuildFailed` (and `AttemptExpired`) events.
pub fn failure(facts: &BuildFacts) -> Option<FailureWhy> {
    let Phase::Error { epoch, reason } = &facts.state.phase else {
        return None;
    };
    let failed = facts
        .events
        .iter()
        .rev()
        .find(|e| matches!(e.event, Event::BuildFailed { .. }));
    let ended_by = failed
        .map(|e| {
            format!(
                "{}/{}",
                e.metadata.actor.role.as_str(),
                e.metadata.actor.node
            )
        })
        .unwrap_or_else(|| "unknown".into());
    let step_tag = reason.step.map(String::from);
    let instruction = match reason.step {
        Some(FailedStep::Step(n)) => step_of(facts, n).map(instruction_of),
        Some(FailedStep::Base) => facts.state.freeze.as_ref().map(|f| match &f.spec.base {
            BaseSource::Image { reference, .. } => format!("FROM {reference}"),
            BaseSource::Template { reference } => format!("FROM TEMPLATE {reference}"),
        }),
        Some(FailedStep::Finalize) => facts
            .state
            .freeze
            .as_ref()
            .and_then(|f| f.spec.start_cmd.clone())
            .map(|s| format!("START {s}")),
        None => None,
    };
    let last_log_lines = match &step_tag {
        Some(tag) => {
            let lines: Vec<&str> = facts
                .logs
                .iter()
                .filter(|l| l.step.as_deref() == Some(tag.as_str()))
                .filter(|l| !l.message.starts_with("Build failed: "))
                .map(|l| l.message.as_str())
                .collect();
            let from = lines.len().saturating_sub(LOG_TAIL);
            lines[from..].iter().map(|s| s.to_string()).collect()
        }
        None => Vec::new(),
    };
    let evidence = match reason.kind {
        FailureKind::NodeLost => node_lost_evidence(facts),
        FailureKind::WaitingExpired | FailureKind::QueueExpired => {
            deadline_evidence(facts, reason.kind)
        }
        _ => None,
    };
    Some(FailureWhy {
        kind: reason.kind,
        message: if reason.message.is_empty() {
            default_message(reason.kind).into()
        } else {
            reason.message.clone()
        },
        step: step_tag,
        instruction,
        exit_code: exit_code(&reason.message),
        last_log_lines,
        ended_by,
        epoch: epoch.map(|e| e.0),
        evidence,
    })
}

fn default_message(kind: FailureKind) -> &'static str {
    match kind {
        FailureKind::StepFailed => "a step failed",
        FailureKind::NodeLost => "the node running the build stopped renewing its lease",
        FailureKind::WaitingExpired => "the build was never started before its deadline",
        FailureKind::QueueExpired => "no node claimed the build before its deadline",
        FailureKind::PromotionFailed => "promotion failed",
        FailureKind::TemplateDeleted => "the template was deleted before the build was published",
    }
}

/// The exit code the worker wrote into a step failure ("… with exit code 2: …").
fn exit_code(message: &str) -> Option<i32> {
    let (_, rest) = message.split_once("with exit code ")?;
    let digits: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '-')
        .collect();
    digits.parse().ok()
}

fn node_lost_evidence(facts: &BuildFacts) -> Option<String> {
    let (expired, meta) = facts.events.iter().rev().find_map(|e| match &e.event {
        Event::AttemptExpired {
            epoch,
            node,
            lease_expires_at,
            expired_at,
        } => Some((
            (*epoch, node.clone(), *lease_expires_at, *expired_at),
            &e.metadata,
        )),
        _ => None,
    })?;
    let (epoch, node, lease_expires_at, expired_at) = expired;
    let last_contact = facts
        .events
        .iter()
        .rev()
        .find_map(|e| match &e.event {
            Event::LeaseRenewed {
                epoch: ep,
                renewed_at,
                ..
            } if *ep == epoch => Some(format!("last lease renewal at {}", ts(*renewed_at))),
            Event::AttemptAcquired {
                epoch: ep,
                acquired_at,
                ..
            } if *ep == epoch => Some(format!(
                "acquired at {} and never renewed",
                ts(*acquired_at)
            )),
            _ => None,
        })
        .unwrap_or_else(|| "no renewal recorded".into());
    let steps_done = facts
        .events
        .iter()
        .filter(|e| matches!(&e.event, Event::StepCompleted { epoch: ep, .. } if *ep == epoch))
        .count();
    let total = facts
        .state
        .freeze
        .as_ref()
        .map_or(0, |f| f.spec.steps.len());
    Some(format!(
        "attempt {epoch} on node {node}: {last_contact}; the lease expired at {}; \
         reconciler {} closed the attempt at {} ({} after expiry, by the database clock); \
         {steps_done} of {total} steps had completed",
        ts(lease_expires_at),
        meta.actor.node,
        ts(expired_at),
        human((expired_at - lease_expires_at).to_std().unwrap_or_default()),
    ))
}

fn deadline_evidence(facts: &BuildFacts, kind: FailureKind) -> Option<String> {
    let reg = facts.state.registration.as_ref()?;
    let failed_at = facts.time_of(|e| matches!(e, Event::BuildFailed { .. }))?;
    Some(match kind {
        FailureKind::WaitingExpired => format!(
            "registered at {}, never started; failed at {}",
            ts(reg.registered_at),
            ts(failed_at)
        ),
        _ => format!(
            "started at {}, no node acquired it; failed at {}",
            facts
                .time_of(|e| matches!(e, Event::BuildFrozen { .. }))
                .map(ts)
                .unwrap_or_else(|| "?".into()),
            ts(failed_at)
        ),
    })
}

// ---------------------------------------------------------------------------------------------
// Cache
// ---------------------------------------------------------------------------------------------

/// The earlier build whose recorded key chain shares the longest prefix with `target`'s (base
/// key first, then step keys); the most recent one among equals. Without a consultation on the
/// target, the most recent earlier build that was frozen.
pub fn closest<'a>(target: &BuildFacts, earlier: &'a [BuildFacts]) -> Option<&'a BuildFacts> {
    let mine = target.consultation();
    let mut best: Option<(usize, &BuildFacts)> = None;
    for candidate in earlier {
        if candidate.state.freeze.is_none() {
            continue;
        }
        let score = match (mine, candidate.consultation()) {
            (Some(a), Some(b)) => 1 + shared_prefix(a, b),
            _ => 0,
        };
        // `earlier` is newest first: a later candidate replaces only with a longer prefix.
        if best.is_none_or(|(s, _)| score > s) {
            best = Some((score, candidate));
        }
    }
    best.map(|(_, b)| b)
}

/// Keys equal from the base on: 0 when the base keys differ, 1 + n when the base and the
/// first n step keys agree.
fn shared_prefix(a: &CacheConsultation, b: &CacheConsultation) -> usize {
    if a.base_key != b.base_key {
        return 0;
    }
    1 + a
        .step_keys
        .iter()
        .zip(&b.step_keys)
        .take_while(|(x, y)| x == y)
        .count()
}

pub fn cache(target: &BuildFacts, prev: Option<&BuildFacts>) -> Option<CacheWhy> {
    let freeze = target.state.freeze.as_ref()?;
    let steps = &freeze.spec.steps;
    let consultation = target.consultation();
    let prev_consultation = prev.and_then(|p| p.consultation());
    // The first divergent position: 0 is the base, n the n-th step; None when all agree.
    let divergence = match (consultation, prev_consultation) {
        (Some(a), Some(b)) => first_divergence(a, b),
        _ => None,
    };
    let mut out = Vec::with_capacity(steps.len());
    for (i, step) in steps.iter().enumerate() {
        let n = i as u32 + 1;
        let outcome = target.state.progress.get(&n);
        let (outcome_name, hit) = match outcome {
            Some(StepOutcome::Cached { .. }) => ("cached", true),
            Some(StepOutcome::Checkpointed { .. }) => ("checkpointed", false),
            Some(StepOutcome::Executed) => ("executed", false),
            None => ("not_run", false),
        };
        let (reason, changed) = if hit {
            (hit_reason(consultation, n), None)
        } else {
            miss_reason(target, prev, consultation, divergence, n, step, outcome)
        };
        out.push(StepWhy {
            step: n,
            instruction: instruction_of(step),
            outcome: outcome_name,
            hit,
            reason,
            changed,
        });
    }
    Some(CacheWhy {
        compared_with: prev.map(|p| p.build.to_string()),
        found: consultation.map(|c| c.found.clone()),
        final_result: final_reason(target, prev, consultation, divergence),
        steps: out,
        mode: target
            .state
            .cache_mode
            .as_ref()
            .map(|m| match &target.mode_pin {
                Some(pin) => format!(
                    "{}, pinned for {} by {} at {}",
                    m.mode,
                    pin.scope,
                    pin.actor,
                    pin.at.format("%Y-%m-%d %H:%M:%S UTC")
                ),
                None => format!("{} ({})", m.mode, m.level.as_str()),
            }),
    })
}

/// Position of the first differing key: `Some(0)` for the base, `Some(n)` for step n, `None`
/// when every key of the shorter chain agrees and the lengths match.
fn first_divergence(a: &CacheConsultation, b: &CacheConsultation) -> Option<u32> {
    if a.base_key != b.base_key {
        return Some(0);
    }
    for (i, (x, y)) in a.step_keys.iter().zip(&b.step_keys).enumerate() {
        if x != y {
            return Some(i as u32 + 1);
        }
    }
    if a.step_keys.len() != b.step_keys.len() {
        return Some(a.step_keys.len().min(b.step_keys.len()) as u32 + 1);
    }
    None
}

fn hit_reason(consultation: Option<&CacheConsultation>, n: u32) -> String {
    match consultation.map(|c| &c.found) {
        Some(CacheFound::Final) => {
            "cache hit: the final result of an identical build was reused; no step ran".into()
        }
        Some(CacheFound::Checkpoint { step }) if *step == n => {
            "cache hit: the build resumed from this step's checkpoint (its key and every key \
             before it were unchanged)"
                .into()
        }
        Some(CacheFound::Checkpoint { step }) => format!(
            "cache hit: covered by the checkpoint of step {step}, which the build resumed from"
        ),
        _ => "cache hit".into(),
    }
}

#[allow(clippy::too_many_arguments)]
fn miss_reason(
    target: &BuildFacts,
    prev: Option<&BuildFacts>,
    consultation: Option<&CacheConsultation>,
    divergence: Option<u32>,
    n: u32,
    step: &Step,
    outcome: Option<&StepOutcome>,
) -> (String, Option<KeyPart>) {
    let Some(c) = consultation else {
        return (
            "the cache was not consulted: the build stopped before its lookup, or its keys \
             could not be computed (see the build log)"
                .into(),
            None,
        );
    };
    if outcome.is_none() {
        let why = match &target.state.phase {
            Phase::Error { .. } => "not run: the build ended before this step",
            _ => "not run yet",
        };
        return (why.into(), None);
    }
    if let Some(from) = c.force_from {
        if n >= from {
            let by = if from == 1 && target.state.freeze.as_ref().is_some_and(|f| f.spec.force) {
                "the build's force (skip_cache)".to_string()
            } else {
                format!("step {from}'s force flag")
            };
            return (
                format!("forced: {by} bypasses the cache from step {from} on"),
                Some(KeyPart::Force { from_step: from }),
            );
        }
    }
    if let CacheFound::Bypassed { reason } = &c.found {
        return (
            format!("the cache was bypassed for this build: {reason}"),
            None,
        );
    }
    let Some(prev) = prev else {
        return (
            format!(
                "cache miss: no earlier build of this template to share an entry with{}",
                verdict_suffix(target, n)
            ),
            None,
        );
    };
    match divergence {
        Some(d) if d <= n => {
            let part = if d == 0 {
                base_change(target, prev, c)
            } else if d == n {
                step_change(target, prev, n)
            } else {
                KeyPart::EarlierStep { step: d }
            };
            let text = describe_part(&part, n, prev);
            (text, Some(part))
        }
        _ => {
            // Key unchanged since `prev`: the entry was absent, unusable, or never written.
            let prev_outcome = prev.state.progress.get(&n);
            let why = if !step.is_mutating() {
                format!(
                    "{} steps are never checkpoints: they only enter the key chain, and are run \
                     again after the deepest checkpoint hit",
                    step.kind()
                )
            } else {
                match prev_outcome {
                    Some(StepOutcome::Checkpointed { .. }) => format!(
                        "the key is unchanged since build {}, which checkpointed this step, but \
                         the entry was not usable{}",
                        prev.build,
                        verdict_suffix(target, n)
                    ),
                    Some(StepOutcome::Executed) => format!(
                        "the key is unchanged since build {}, but that build ran this step \
                         without a checkpoint (past its depth budget), so there was no entry",
                        prev.build
                    ),
                    Some(StepOutcome::Cached { .. }) => format!(
                        "the key is unchanged since build {}, which reused an entry for it, but \
                         the entry was not usable for this build{}",
                        prev.build,
                        verdict_suffix(target, n)
                    ),
                    None => format!(
                        "the key is unchanged since build {}, but that build never completed \
                         this step ({}), so no entry existed",
                        prev.build,
                        status_of(&prev.state.phase)
                    ),
                }
            };
            (format!("cache miss: {why}"), None)
        }
    }
}

/// " (lookup: cache miss (invalid entry: …))" from the build log's verdict for step `n`.
fn verdict_suffix(facts: &BuildFacts, n: u32) -> String {
    let tag = n.to_string();
    facts
        .logs
        .iter()
        .rfind(|l| {
            l.step.as_deref() == Some(tag.as_str()) && l.message.starts_with("[cache] step ")
        })
        .and_then(|l| l.message.rsplit_once(": ").map(|(_, v)| v.to_owned()))
        .map(|v| format!(" (lookup said: {v})"))
        .unwrap_or_default()
}

fn base_change(target: &BuildFacts, prev: &BuildFacts, c: &CacheConsultation) -> KeyPart {
    let before = prev.consultation().and_then(|p| p.base_image_digest);
    let after = c.base_image_digest;
    let base_name = |f: &BuildFacts| {
        f.state.freeze.as_ref().map(|f| match &f.spec.base {
            BaseSource::Image { reference, .. } => reference.clone(),
            BaseSource::Template { reference } => format!("template {reference}"),
        })
    };
    if before != after || base_name(target) != base_name(prev) {
        let show = |name: Option<String>, d: Option<crate::domain::ids::Digest>| {
            format!(
                "{} ({})",
                name.unwrap_or_else(|| "?".into()),
                d.map(|d| d.to_string())
                    .unwrap_or_else(|| "no image digest".into())
            )
        };
        return KeyPart::BaseImage {
            before: show(base_name(prev), before),
            after: show(base_name(target), after),
        };
    }
    let resources = |f: &BuildFacts| f.state.registration.as_ref().map(|r| r.resources);
    let detail = if resources(target) != resources(prev) {
        format!(
            "resources changed: {:?} -> {:?}",
            resources(prev),
            resources(target)
        )
    } else {
        "same base image and resources: the node's launch fingerprint differs (strata version, \
         sandbox backend, architecture or builder semantics), or a parent template's result \
         changed"
            .into()
    };
    KeyPart::LaunchConfiguration { detail }
}

fn step_change(target: &BuildFacts, prev: &BuildFacts, n: u32) -> KeyPart {
    let (Some(now), Some(then)) = (step_of(target, n), step_of(prev, n)) else {
        return KeyPart::Command {
            step: n,
            before: step_of(prev, n)
                .map(instruction_of)
                .unwrap_or_else(|| "(no such step)".into()),
            after: step_of(target, n)
                .map(instruction_of)
                .unwrap_or_else(|| "(no such step)".into()),
        };
    };
    if let (
        Step::Copy {
            files_hash: h_now, ..
        },
        Step::Copy {
            files_hash: h_then, ..
        },
    ) = (now, then)
    {
        let blob = |f: &BuildFacts, h| {
            f.state
                .freeze
                .as_ref()
                .and_then(|fr| fr.bindings.get(h))
                .map(|b| b.blob_digest.to_string())
        };
        let (b_now, b_then) = (blob(target, h_now), blob(prev, h_then));
        if h_now != h_then || b_now != b_then {
            return KeyPart::FileHash {
                step: n,
                files_hash_before: h_then.to_string(),
                files_hash_after: h_now.to_string(),
                blob_before: b_then,
                blob_after: b_now,
            };
        }
    }
    KeyPart::Command {
        step: n,
        before: instruction_of(then),
        after: instruction_of(now),
    }
}

fn describe_part(part: &KeyPart, n: u32, prev: &BuildFacts) -> String {
    match part {
        KeyPart::BaseImage { before, after } => format!(
            "cache miss: the base changed since build {}: {before} -> {after}; every key chains \
             from the base",
            prev.build
        ),
        KeyPart::LaunchConfiguration { detail } => format!(
            "cache miss: the base key changed since build {}: {detail}",
            prev.build
        ),
        KeyPart::Command {
            step,
            before,
            after,
        } => format!(
            "cache miss: step {step}'s instruction changed since build {}: `{before}` -> `{after}`",
            prev.build
        ),
        KeyPart::FileHash {
            step,
            files_hash_before,
            files_hash_after,
            blob_before,
            blob_after,
        } => {
            let what = if files_hash_before != files_hash_after {
                format!("filesHash {files_hash_before} -> {files_hash_after}")
            } else {
                "same filesHash".into()
            };
            format!(
                "cache miss: step {step} copies different files than build {}: {what}, blob {} -> {}",
                prev.build,
                blob_before.as_deref().unwrap_or("?"),
                blob_after.as_deref().unwrap_or("?"),
            )
        }
        KeyPart::EarlierStep { step } => format!(
            "cache miss: step {step} changed (see there); keys chain, so step {n}'s key changed too"
        ),
        KeyPart::Force { from_step } => format!("forced from step {from_step}"),
    }
}

fn final_reason(
    target: &BuildFacts,
    prev: Option<&BuildFacts>,
    consultation: Option<&CacheConsultation>,
    divergence: Option<u32>,
) -> String {
    let Some(c) = consultation else {
        return "the cache was not consulted".into();
    };
    match &c.found {
        CacheFound::Final => return "cache hit: the final result was reused".into(),
        CacheFound::Bypassed { reason } => return format!("the cache was bypassed: {reason}"),
        _ => {}
    }
    if c.force_from.is_some() {
        return "not read: the build is forced".into();
    }
    let Some(prev) = prev else {
        return "cache miss: no earlier build of this template".into();
    };
    match divergence {
        Some(0) => "cache miss: the base changed (see the steps)".into(),
        Some(n) => format!("cache miss: step {n} changed (see the steps)"),
        None if prev.consultation().map(|p| p.final_key) != Some(c.final_key) => {
            let cmds = |f: &BuildFacts| {
                f.state
                    .freeze
                    .as_ref()
                    .map(|f| (f.spec.start_cmd.clone(), f.spec.ready_cmd.clone()))
            };
            if cmds(target) != cmds(prev) {
                format!(
                    "cache miss: the start/ready commands changed since build {}: {:?} -> {:?}",
                    prev.build,
                    cmds(prev).unwrap_or_default(),
                    cmds(target).unwrap_or_default()
                )
            } else {
                format!(
                    "cache miss: the final context (user, workdir, env) differs from build {}",
                    prev.build
                )
            }
        }
        None => match &prev.state.phase {
            Phase::Ready { .. } => format!(
                "cache miss: the final key equals build {}'s, but its entry was not usable{}",
                prev.build,
                target
                    .logs
                    .iter()
                    .find(|l| l.message.starts_with("[cache] final result: "))
                    .map(|l| format!(
                        " (lookup said: {})",
                        &l.message["[cache] final result: ".len()..]
                    ))
                    .unwrap_or_default()
            ),
            other => format!(
                "cache miss: the final key equals build {}'s, but that build did not become \
                 ready ({}), so no final entry was written",
                prev.build,
                status_of(other)
            ),
        },
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers and rendering
// ---------------------------------------------------------------------------------------------

fn step_of(facts: &BuildFacts, n: u32) -> Option<&Step> {
    facts
        .state
        .freeze
        .as_ref()
        .and_then(|f| f.spec.steps.get(n as usize - 1))
}

pub fn instruction_of(step: &Step) -> String {
    format!("{} {}", step.kind(), step.args().join(" "))
        .trim_end()
        .to_owned()
}

fn ts(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S%.3f UTC").to_string()
}

pub fn human(d: std::time::Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 60.0 {
        format!("{}m{:02}s", (s / 60.0) as u64, (s % 60.0) as u64)
    } else if s >= 1.0 {
        format!("{s:.1}s")
    } else {
        format!("{}ms", d.as_millis())
    }
}

impl Why {
    /// The answer as the CLI prints it.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "build {} (template {}): {}",
            self.build,
            self.template.as_deref().unwrap_or("?"),
            self.status
        );
        if let Some(f) = &self.failure {
            let _ = writeln!(out, "\nwhy it failed: {:?}", f.kind);
            if let Some(step) = &f.step {
                let _ = writeln!(
                    out,
                    "  step:      {step}{}",
                    f.instruction
                        .as_ref()
                        .map(|i| format!(" ({i})"))
                        .unwrap_or_default()
                );
            }
            if let Some(code) = f.exit_code {
                let _ = writeln!(out, "  exit code: {code}");
            }
            let _ = writeln!(out, "  message:   {}", f.message);
            let _ = writeln!(
                out,
                "  ended by:  {}{}",
                f.ended_by,
                f.epoch.map(|e| format!(" (epoch {e})")).unwrap_or_default()
            );
            if let Some(ev) = &f.evidence {
                let _ = writeln!(out, "  evidence:  {ev}");
            }
            if !f.last_log_lines.is_empty() {
                let _ = writeln!(out, "  last log lines:");
                for l in &f.last_log_lines {
                    let _ = writeln!(out, "    | {l}");
                }
            }
        }
        if let Some(c) = &self.cache {
            let _ = writeln!(
                out,
                "\ncache (compared with {}):",
                c.compared_with
                    .as_deref()
                    .map(|b| format!("build {b}"))
                    .unwrap_or_else(|| "no earlier build".into())
            );
            for s in &c.steps {
                let _ = writeln!(
                    out,
                    "  [{}] {:<12} {}\n        {}",
                    s.step, s.outcome, s.instruction, s.reason
                );
            }
            let _ = writeln!(out, "  final result: {}", c.final_result);
            if let Some(mode) = &c.mode {
                let _ = writeln!(out, "  cache mode: {mode}");
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_code_is_read_from_the_worker_message() {
        assert_eq!(exit_code("RUN failed with exit code 3: boom"), Some(3));
        assert_eq!(exit_code("RUN failed with exit code 127"), Some(127));
        assert_eq!(exit_code("RUN failed (killed by signal 9)"), None);
        assert_eq!(exit_code("RUN timed out after 5 s"), None);
    }

    #[test]
    fn human_durations() {
        assert_eq!(human(std::time::Duration::from_millis(250)), "250ms");
        assert_eq!(human(std::time::Duration::from_millis(2500)), "2.5s");
        assert_eq!(human(std::time::Duration::from_secs(125)), "2m05s");
    }
}
