//! A build whose template was deleted: it can never be published (the template refuses
//! `PromoteBuild` and a name lookup no longer finds it), so it ends in `error` with a reason that
//! says so, whoever notices first: the delete itself for builds not yet publishing, the promotion
//! driver (worker or reconciler) for a publishing build that was not yet made visible.
//!
//! One decision over both states, so the outcome rests on the template stream actually saying
//! `deleted` (the caller appends with that stream read at the same version, or writes the
//! deletion in the same append).

use chrono::{DateTime, Utc};

use super::decide::release;
use super::{Event, FailureKind, FailureReason, Phase, State};
use crate::domain::template;

/// Ends `build` because `template` (its template's state) is deleted. Nothing to do for a build
/// already terminal: a Ready build stays Ready (its result existed before the deletion), an
/// Error keeps its reason.
pub fn end_for_deleted_template(
    build: &State,
    template: &template::State,
    now: DateTime<Utc>,
) -> Result<Vec<Event>, super::Error> {
    let Some(registration) = &build.registration else {
        return Err(super::Error::NotRegistered);
    };
    if !template.deleted {
        return Err(super::Error::TemplateNotDeleted);
    }
    let epoch = match &build.phase {
        Phase::Unregistered => return Err(super::Error::NotRegistered),
        Phase::Ready { .. } | Phase::Error { .. } => return Ok(vec![]),
        Phase::Waiting { .. } | Phase::Queued { .. } => None,
        Phase::Active { epoch, .. } | Phase::Publishing { epoch, .. } => Some(*epoch),
    };
    let stage = match &build.phase {
        Phase::Waiting { .. } => "waiting to start",
        Phase::Queued { .. } => "queued for a build node",
        Phase::Active { .. } => "running",
        _ => "publishing",
    };
    let mut events = vec![Event::BuildFailed {
        epoch,
        reason: FailureReason {
            kind: FailureKind::TemplateDeleted,
            message: format!(
                "the template {} was deleted while this build was {stage}; nothing was published. \
                 Build it again under a name that exists",
                registration.template
            ),
            step: None,
        },
        failed_at: now,
    }];
    events.extend(release(build));
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::build::{evolve, Error};
    use crate::domain::ids::{Epoch, NodeId, TeamId, TemplateId};
    use chrono::TimeZone;

    fn t(s: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_800_000_000 + s, 0).unwrap()
    }

    fn registered() -> State {
        evolve(
            State::default(),
            &Event::BuildRegistered {
                template: TemplateId::parse("tpl-one").unwrap(),
                team: TeamId::parse("team").unwrap(),
                tags: vec![],
                resources: Default::default(),
                registered_at: t(0),
                waiting_deadline: t(600),
            },
        )
    }

    fn deleted() -> template::State {
        template::State {
            deleted: true,
            ..Default::default()
        }
    }

    fn active(state: State) -> State {
        evolve(
            state,
            &Event::AttemptAcquired {
                epoch: Epoch(2),
                node: NodeId::parse("n1").unwrap(),
                lease_expires_at: t(30),
                acquired_at: t(1),
            },
        )
    }

    #[test]
    fn a_live_template_ends_nothing() {
        assert_eq!(
            end_for_deleted_template(&registered(), &template::State::default(), t(2)),
            Err(Error::TemplateNotDeleted)
        );
    }

    #[test]
    fn waiting_and_running_builds_end_in_error_saying_the_template_was_deleted() {
        for (state, epoch) in [(registered(), None), (active(registered()), Some(Epoch(2)))] {
            let events = end_for_deleted_template(&state, &deleted(), t(2)).unwrap();
            let after = events.iter().fold(state, evolve);
            match &after.phase {
                Phase::Error { epoch: e, reason } => {
                    assert_eq!(*e, epoch);
                    assert_eq!(reason.kind, FailureKind::TemplateDeleted);
                    assert!(
                        reason.message.contains("tpl-one was deleted"),
                        "{}",
                        reason.message
                    );
                }
                other => panic!("{other:?}"),
            }
            assert!(after.context_released);
            // The attempt is fenced: nothing of its epoch is accepted any more.
            assert!(crate::domain::build::check_open_attempt(&after, Epoch(2), t(3)).is_err());
            // And ending it again is nothing to do.
            assert_eq!(
                end_for_deleted_template(&after, &deleted(), t(4)),
                Ok(vec![])
            );
        }
    }

    #[test]
    fn a_ready_build_stays_ready() {
        let ready = evolve(
            active(registered()),
            &Event::BuildReady {
                epoch: Epoch(2),
                ready_at: t(5),
            },
        );
        assert_eq!(
            end_for_deleted_template(&ready, &deleted(), t(6)),
            Ok(vec![])
        );
    }
}
