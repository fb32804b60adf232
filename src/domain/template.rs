//! The template aggregate (`template-{id}`) and the name claim (`templatename-{team}:{name}`).
//!
//! Layout: the name claim ([`NameState`], [`NameEvent`], [`decide_name`], [`evolve_name`]); the
//! template ([`State`], [`Command`], [`Event`], [`Error`], [`decide`], [`evolve`]); and
//! [`register_build`], the `POST /v3/templates` decision over both streams.
//!
//! E2B semantics: the same name in the same team is the same template; every registration adds a
//! new build to it. The name claim is its own stream so that two concurrent first registrations of
//! one name cannot create two templates: the claim is appended at expected version 0 and the
//! loser re-decides, finds the claim, and joins the winner's template. A deleted template rejects
//! new builds and releases its names.
//!
//! Tags point at builds: a build's requested tags are recorded with it, and assigned (moved to
//! it) when it becomes Ready, or by `POST /templates/tags`.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::build_spec::{Tag, TemplateName};
use super::ids::{BuildId, TeamId, TemplateId};

// ---------------------------------------------------------------------------------------------
// Name claim
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug, Default, PartialEq)]
pub struct NameState {
    /// The template that holds the name, while it does.
    pub holder: Option<TemplateId>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "type")]
pub enum NameEvent {
    #[serde(rename = "NameClaimed.v1")]
    NameClaimed { template: TemplateId },
    #[serde(rename = "NameReleased.v1")]
    NameReleased { template: TemplateId },
}

/// Resolves `name` to its template: the holder if claimed, otherwise a claim for `candidate`.
pub fn decide_name(state: &NameState, candidate: &TemplateId) -> (TemplateId, Vec<NameEvent>) {
    match &state.holder {
        Some(holder) => (holder.clone(), vec![]),
        None => (
            candidate.clone(),
            vec![NameEvent::NameClaimed {
                template: candidate.clone(),
            }],
        ),
    }
}

pub fn evolve_name(mut state: NameState, event: &NameEvent) -> NameState {
    match event {
        NameEvent::NameClaimed { template } => state.holder = Some(template.clone()),
        NameEvent::NameReleased { template } => {
            if state.holder.as_ref() == Some(template) {
                state.holder = None;
            }
        }
    }
    state
}

// ---------------------------------------------------------------------------------------------
// Template
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug, Default, PartialEq)]
pub struct State {
    /// `None` until registered.
    pub team: Option<TeamId>,
    pub names: BTreeSet<String>,
    /// Builds in registration order, with the tags each asked for.
    pub builds: Vec<(BuildId, Vec<Tag>)>,
    /// Where each tag points now.
    pub tags: BTreeMap<Tag, BuildId>,
    /// Tags removed and not assigned since: removing one again is the retry of a request whose
    /// reply was lost, and succeeds without a new event.
    pub removed_tags: BTreeSet<Tag>,
    pub deleted: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    RegisterTemplate {
        team: TeamId,
        name: String,
        now: DateTime<Utc>,
    },
    AppendBuild {
        build: BuildId,
        tags: Vec<Tag>,
        now: DateTime<Utc>,
    },
    /// Points `tags` at `build` (on Ready, or `POST /templates/tags`).
    AssignTags {
        build: BuildId,
        tags: Vec<Tag>,
        now: DateTime<Utc>,
    },
    /// Promotion made `build` visible: its tags move to it, except where a tag already
    /// points at a build registered after it (a late promotion of an older build must not
    /// take a tag back from a newer one).
    PromoteBuild {
        build: BuildId,
        tags: Vec<Tag>,
        now: DateTime<Utc>,
    },
    RemoveTags {
        tags: Vec<Tag>,
        now: DateTime<Utc>,
    },
    DeleteTemplate {
        now: DateTime<Utc>,
    },
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "type")]
pub enum Event {
    #[serde(rename = "TemplateRegistered.v1")]
    TemplateRegistered {
        team: TeamId,
        name: String,
        registered_at: DateTime<Utc>,
    },
    #[serde(rename = "BuildAppended.v1")]
    BuildAppended {
        build: BuildId,
        tags: Vec<Tag>,
        appended_at: DateTime<Utc>,
    },
    #[serde(rename = "TagsAssigned.v1")]
    TagsAssigned {
        build: BuildId,
        tags: Vec<Tag>,
        assigned_at: DateTime<Utc>,
    },
    #[serde(rename = "TagsRemoved.v1")]
    TagsRemoved {
        tags: Vec<Tag>,
        removed_at: DateTime<Utc>,
    },
    #[serde(rename = "TemplateDeleted.v1")]
    TemplateDeleted {
        names: Vec<String>,
        deleted_at: DateTime<Utc>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("template is not registered; register a build with POST /v3/templates")]
    NotRegistered,
    #[error("template belongs to another team; use a name of your own team")]
    OtherTeam,
    #[error("template was deleted; register a build under a new name")]
    Deleted,
    #[error("build {build} is not a build of this template")]
    UnknownBuild { build: BuildId },
    #[error("tag {tag:?} is not assigned on this template; nothing to remove")]
    UnknownTag { tag: String },
}

pub fn decide(state: &State, command: &Command) -> Result<Vec<Event>, Error> {
    if state.deleted {
        return Err(Error::Deleted);
    }
    match command {
        Command::RegisterTemplate { team, name, now } => match &state.team {
            Some(t) if t != team => Err(Error::OtherTeam),
            Some(_) if state.names.contains(name) => Ok(vec![]),
            _ => Ok(vec![Event::TemplateRegistered {
                team: team.clone(),
                name: name.clone(),
                registered_at: *now,
            }]),
        },
        _ if state.team.is_none() => Err(Error::NotRegistered),
        Command::AppendBuild { build, tags, now } => {
            if state.builds.iter().any(|(b, _)| b == build) {
                return Ok(vec![]);
            }
            Ok(vec![Event::BuildAppended {
                build: *build,
                tags: tags.clone(),
                appended_at: *now,
            }])
        }
        Command::AssignTags { build, tags, now } => {
            if !state.builds.iter().any(|(b, _)| b == build) {
                return Err(Error::UnknownBuild { build: *build });
            }
            if tags.iter().all(|t| state.tags.get(t) == Some(build)) {
                return Ok(vec![]);
            }
            Ok(vec![Event::TagsAssigned {
                build: *build,
                tags: tags.clone(),
                assigned_at: *now,
            }])
        }
        Command::PromoteBuild { build, tags, now } => {
            let position = |b: &BuildId| state.builds.iter().position(|(x, _)| x == b);
            let Some(mine) = position(build) else {
                return Err(Error::UnknownBuild { build: *build });
            };
            let moving: Vec<Tag> = tags
                .iter()
                .filter(|tag| match state.tags.get(*tag) {
                    None => true,
                    Some(current) => current != build && position(current).is_none_or(|p| p < mine),
                })
                .cloned()
                .collect();
            if moving.is_empty() {
                return Ok(vec![]);
            }
            Ok(vec![Event::TagsAssigned {
                build: *build,
                tags: moving,
                assigned_at: *now,
            }])
        }
        Command::RemoveTags { tags, now } => {
            if let Some(missing) = tags
                .iter()
                .find(|t| !state.tags.contains_key(*t) && !state.removed_tags.contains(*t))
            {
                return Err(Error::UnknownTag {
                    tag: missing.as_str().to_owned(),
                });
            }
            let present: Vec<Tag> = tags
                .iter()
                .filter(|t| state.tags.contains_key(*t))
                .cloned()
                .collect();
            if present.is_empty() {
                return Ok(vec![]);
            }
            Ok(vec![Event::TagsRemoved {
                tags: present,
                removed_at: *now,
            }])
        }
        Command::DeleteTemplate { now } => Ok(vec![Event::TemplateDeleted {
            names: state.names.iter().cloned().collect(),
            deleted_at: *now,
        }]),
    }
}

pub fn evolve(mut state: State, event: &Event) -> State {
    match event {
        Event::TemplateRegistered { team, name, .. } => {
            state.team = Some(team.clone());
            state.names.insert(name.clone());
        }
        Event::BuildAppended { build, tags, .. } => state.builds.push((*build, tags.clone())),
        Event::TagsAssigned { build, tags, .. } => {
            for tag in tags {
                state.tags.insert(tag.clone(), *build);
                state.removed_tags.remove(tag);
            }
        }
        Event::TagsRemoved { tags, .. } => {
            for tag in tags {
                state.tags.remove(tag);
                state.removed_tags.insert(tag.clone());
            }
        }
        Event::TemplateDeleted { .. } => state.deleted = true,
    }
    state
}

/// The events of `POST /v3/templates` per stream: the name claim, the template and (decided
/// separately with [`crate::domain::build::decide`]) the new build stream.
#[derive(Clone, Debug, PartialEq)]
pub struct Registration {
    pub template: TemplateId,
    pub name_events: Vec<NameEvent>,
    pub template_events: Vec<Event>,
}

/// Decides a registration. `name_state` is the claim stream of `(team, name.name)`;
/// `template_state` is the stream of the template it resolves to (the caller loads the holder's
/// stream, or an empty state when unclaimed), `candidate` a fresh id used only when unclaimed.
#[allow(clippy::too_many_arguments)]
pub fn register_build(
    name_state: &NameState,
    template_state: &State,
    team: &TeamId,
    name: &TemplateName,
    candidate: &TemplateId,
    build: BuildId,
    tags: &[Tag],
    now: DateTime<Utc>,
) -> Result<Registration, Error> {
    let (template, name_events) = decide_name(name_state, candidate);
    let mut template_events = decide(
        template_state,
        &Command::RegisterTemplate {
            team: team.clone(),
            name: name.name.clone(),
            now,
        },
    )?;
    let registered = template_events.iter().fold(template_state.clone(), evolve);
    template_events.extend(decide(
        &registered,
        &Command::AppendBuild {
            build,
            tags: tags.to_vec(),
            now,
        },
    )?);
    Ok(Registration {
        template,
        name_events,
        template_events,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use uuid::Uuid;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 29, 12, 0, 0).unwrap()
    }
    fn team(n: &str) -> TeamId {
        TeamId::parse(n).unwrap()
    }
    fn build(n: u128) -> BuildId {
        BuildId::from_uuid(Uuid::from_u128(n))
    }
    fn tag(t: &str) -> Tag {
        Tag::parse(t).unwrap()
    }

    #[test]
    fn same_name_same_team_is_the_same_template() {
        let name = TemplateName::parse("web").unwrap();
        let first = register_build(
            &NameState::default(),
            &State::default(),
            &team("t1"),
            &name,
            &TemplateId::parse("tplA").unwrap(),
            build(1),
            &[Tag::default_tag()],
            now(),
        )
        .unwrap();
        assert_eq!(first.name_events.len(), 1);
        let names = first
            .name_events
            .iter()
            .fold(NameState::default(), evolve_name);
        let tpl = first.template_events.iter().fold(State::default(), evolve);

        let second = register_build(
            &names,
            &tpl,
            &team("t1"),
            &name,
            &TemplateId::parse("tplB").unwrap(),
            build(2),
            &[tag("v2")],
            now(),
        )
        .unwrap();
        assert_eq!(
            second.template.as_str(),
            "tplA",
            "the claimed template wins"
        );
        assert!(second.name_events.is_empty());
        assert!(matches!(
            second.template_events.as_slice(),
            [Event::BuildAppended { .. }]
        ));
        let tpl = second.template_events.iter().fold(tpl, evolve);
        assert_eq!(tpl.builds.len(), 2);
    }

    #[test]
    fn tags_move_between_builds_and_deletion_is_final() {
        let mut s = State::default();
        for cmd in [
            Command::RegisterTemplate {
                team: team("t1"),
                name: "web".into(),
                now: now(),
            },
            Command::AppendBuild {
                build: build(1),
                tags: vec![tag("v1")],
                now: now(),
            },
            Command::AppendBuild {
                build: build(2),
                tags: vec![tag("v1")],
                now: now(),
            },
            Command::AssignTags {
                build: build(1),
                tags: vec![tag("v1"), tag("default")],
                now: now(),
            },
            Command::AssignTags {
                build: build(2),
                tags: vec![tag("v1")],
                now: now(),
            },
        ] {
            s = decide(&s, &cmd).unwrap().iter().fold(s, evolve);
        }
        assert_eq!(s.tags[&tag("v1")], build(2));
        assert_eq!(s.tags[&tag("default")], build(1));
        assert!(matches!(
            decide(
                &s,
                &Command::AssignTags {
                    build: build(9),
                    tags: vec![tag("x")],
                    now: now()
                }
            ),
            Err(Error::UnknownBuild { .. })
        ));
        assert!(matches!(
            decide(
                &s,
                &Command::RemoveTags {
                    tags: vec![tag("nope")],
                    now: now()
                }
            ),
            Err(Error::UnknownTag { .. })
        ));
        assert!(matches!(
            decide(
                &s,
                &Command::RegisterTemplate {
                    team: team("t2"),
                    name: "web".into(),
                    now: now()
                }
            ),
            Err(Error::OtherTeam)
        ));

        let events = decide(&s, &Command::DeleteTemplate { now: now() }).unwrap();
        assert!(
            matches!(&events[0], Event::TemplateDeleted { names, .. } if names == &vec!["web".to_string()])
        );
        let s = events.iter().fold(s, evolve);
        assert_eq!(
            decide(
                &s,
                &Command::AppendBuild {
                    build: build(3),
                    tags: vec![],
                    now: now()
                }
            ),
            Err(Error::Deleted)
        );
        let released = evolve_name(
            NameState {
                holder: Some(TemplateId::parse("tplA").unwrap()),
            },
            &NameEvent::NameReleased {
                template: TemplateId::parse("tplA").unwrap(),
            },
        );
        assert_eq!(released.holder, None);
    }

    /// Issue 9: a `DELETE /templates/tags` retried after its reply was lost must succeed; a tag
    /// the template never had is still unknown.
    #[test]
    fn removing_a_removed_tag_again_is_a_no_op() {
        let mut s = State::default();
        for cmd in [
            Command::RegisterTemplate {
                team: team("t1"),
                name: "web".into(),
                now: now(),
            },
            Command::AppendBuild {
                build: build(1),
                tags: vec![],
                now: now(),
            },
            Command::AssignTags {
                build: build(1),
                tags: vec![tag("v1")],
                now: now(),
            },
        ] {
            s = decide(&s, &cmd).unwrap().iter().fold(s, evolve);
        }
        let remove = |tags: Vec<Tag>| Command::RemoveTags { tags, now: now() };
        let removed = decide(&s, &remove(vec![tag("v1")])).unwrap();
        assert_eq!(removed.len(), 1);
        let s = removed.iter().fold(s, evolve);
        assert_eq!(decide(&s, &remove(vec![tag("v1")])), Ok(vec![]));
        assert!(matches!(
            decide(&s, &remove(vec![tag("v1"), tag("never")])),
            Err(Error::UnknownTag { tag }) if tag == "never"
        ));
        // Assigned again, it is removable again, and then unknown to nobody.
        let s = decide(
            &s,
            &Command::AssignTags {
                build: build(1),
                tags: vec![tag("v1")],
                now: now(),
            },
        )
        .unwrap()
        .iter()
        .fold(s, evolve);
        assert_eq!(decide(&s, &remove(vec![tag("v1")])).unwrap().len(), 1);
    }

    #[test]
    fn events_carry_versioned_types() {
        let e = Event::BuildAppended {
            build: build(1),
            tags: vec![tag("v1")],
            appended_at: now(),
        };
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["type"], "BuildAppended.v1");
        assert_eq!(serde_json::from_value::<Event>(v).unwrap(), e);
    }

    #[test]
    fn a_late_promotion_of_an_older_build_never_takes_a_tag_back() {
        let name = TemplateName::parse("web").unwrap();
        let mut tpl = State::default();
        let mut names = NameState::default();
        for n in [1, 2] {
            let reg = register_build(
                &names,
                &tpl,
                &team("t1"),
                &name,
                &TemplateId::parse("tplA").unwrap(),
                build(n),
                &[Tag::default_tag()],
                now(),
            )
            .unwrap();
            names = reg.name_events.iter().fold(names, evolve_name);
            tpl = reg.template_events.iter().fold(tpl, evolve);
        }
        let promote = |b, tags: Vec<Tag>| Command::PromoteBuild {
            build: build(b),
            tags,
            now: now(),
        };
        // The newer build is promoted first and takes `default`.
        tpl = decide(&tpl, &promote(2, vec![Tag::default_tag()]))
            .unwrap()
            .iter()
            .fold(tpl, evolve);
        assert_eq!(tpl.tags[&Tag::default_tag()], build(2));
        // The older one finishes late: it gets only the tag nobody newer holds.
        let late = decide(&tpl, &promote(1, vec![Tag::default_tag(), tag("only-old")])).unwrap();
        assert_eq!(
            late,
            vec![Event::TagsAssigned {
                build: build(1),
                tags: vec![tag("only-old")],
                assigned_at: now()
            }]
        );
        tpl = late.iter().fold(tpl, evolve);
        assert_eq!(tpl.tags[&Tag::default_tag()], build(2));
        // Promoting again is a no-op; an unknown build is refused.
        assert!(decide(&tpl, &promote(2, vec![Tag::default_tag()]))
            .unwrap()
            .is_empty());
        assert!(matches!(
            decide(&tpl, &promote(9, vec![Tag::default_tag()])),
            Err(Error::UnknownBuild { .. })
        ));
    }
}
