//! Pinned settings of one scope, a team or one template of a team: the `settings-{scope}`
//! aggregate. A pin is the operator's rollback lever: it moves one tenant between values (the
//! cache mode, the sandbox backend) without a deploy, and its events are the audit trail of who moved whom
//! (the actor is in each event's metadata).
//!
//! Only known keys with valid values are pinned; a value stored under an older meaning is
//! still skipped at resolution (`cache_mode::resolve`), never trusted.

use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::cache_mode::CacheMode;
use super::ids::{TeamId, TemplateId};

/// The setting that picks a build's cache mode.
pub const CACHE_MODE: &str = "cache.mode";
/// The setting that picks the sandbox backend of a build or a launched sandbox.
pub const SANDBOX_BACKEND: &str = "sandbox.backend";

/// `value` as the setting `key` stores it (normalized), or why it is not one of its values.
fn normalize(key: &str, value: &str) -> Result<String, Error> {
    let invalid = |reason| Error::InvalidValue {
        key: key.to_owned(),
        reason,
    };
    match key {
        CACHE_MODE => Ok(value
            .parse::<CacheMode>()
            .map_err(invalid)?
            .as_str()
            .to_owned()),
        SANDBOX_BACKEND => Ok(value
            .parse::<super::backend_name::BackendName>()
            .map_err(invalid)?
            .as_str()
            .to_owned()),
        _ => Err(Error::UnknownKey {
            key: key.to_owned(),
        }),
    }
}

/// Where a pin applies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SettingsScope {
    Team(TeamId),
    Template(TeamId, TemplateId),
}

impl SettingsScope {
    /// The components of the scope's stream name.
    pub fn components(&self) -> Vec<&str> {
        match self {
            SettingsScope::Team(team) => vec!["team", team.as_str()],
            SettingsScope::Template(team, template) => {
                vec!["template", team.as_str(), template.as_str()]
            }
        }
    }
}

impl fmt::Display for SettingsScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SettingsScope::Team(team) => write!(f, "team {team}"),
            SettingsScope::Template(team, template) => {
                write!(f, "template {template} of team {team}")
            }
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// The pinned values, by key.
    pub pins: BTreeMap<String, Pin>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pin {
    pub value: String,
    pub pinned_at: DateTime<Utc>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum Event {
    #[serde(rename = "SettingPinned.v1")]
    SettingPinned {
        key: String,
        value: String,
        pinned_at: DateTime<Utc>,
    },
    #[serde(rename = "SettingUnpinned.v1")]
    SettingUnpinned {
        key: String,
        unpinned_at: DateTime<Utc>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    Pin {
        key: String,
        value: String,
        now: DateTime<Utc>,
    },
    Unpin {
        key: String,
        now: DateTime<Utc>,
    },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error(
        "{key:?} is not a setting that can be pinned (known: {CACHE_MODE}, {SANDBOX_BACKEND})"
    )]
    UnknownKey { key: String },
    #[error("{key}: {reason}")]
    InvalidValue { key: String, reason: String },
}

fn check_key(key: &str) -> Result<(), Error> {
    match key {
        CACHE_MODE | SANDBOX_BACKEND => Ok(()),
        _ => Err(Error::UnknownKey {
            key: key.to_owned(),
        }),
    }
}

pub fn decide(state: &State, command: &Command) -> Result<Vec<Event>, Error> {
    match command {
        Command::Pin { key, value, now } => {
            let value = normalize(key, value)?;
            if state.pins.get(key).is_some_and(|p| p.value == value) {
                return Ok(vec![]);
            }
            Ok(vec![Event::SettingPinned {
                key: key.clone(),
                value,
                pinned_at: *now,
            }])
        }
        Command::Unpin { key, now } => {
            check_key(key)?;
            if !state.pins.contains_key(key) {
                return Ok(vec![]);
            }
            Ok(vec![Event::SettingUnpinned {
                key: key.clone(),
                unpinned_at: *now,
            }])
        }
    }
}

pub fn evolve(mut state: State, event: &Event) -> State {
    match event {
        Event::SettingPinned {
            key,
            value,
            pinned_at,
        } => {
            state.pins.insert(
                key.clone(),
                Pin {
                    value: value.clone(),
                    pinned_at: *pinned_at,
                },
            );
        }
        Event::SettingUnpinned { key, .. } => {
            state.pins.remove(key);
        }
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
    }

    fn run(state: State, command: Command) -> (State, Vec<Event>) {
        let events = decide(&state, &command).unwrap();
        let state = events.iter().fold(state, evolve);
        (state, events)
    }

    #[test]
    fn pins_and_unpins_a_valid_mode_idempotently() {
        let pin = |v: &str, s| Command::Pin {
            key: CACHE_MODE.into(),
            value: v.into(),
            now: t(s),
        };
        let (state, events) = run(State::default(), pin("Final", 1));
        assert_eq!(events.len(), 1);
        assert_eq!(state.pins[CACHE_MODE].value, "final", "stored normalized");
        let (state, again) = run(state, pin("final", 2));
        assert!(again.is_empty(), "the same pin again changes nothing");
        let (state, moved) = run(state, pin("off", 3));
        assert_eq!(moved.len(), 1);
        assert_eq!(state.pins[CACHE_MODE].value, "off");
        let unpin = |s| Command::Unpin {
            key: CACHE_MODE.into(),
            now: t(s),
        };
        let (state, gone) = run(state, unpin(4));
        assert_eq!(gone.len(), 1);
        assert!(state.pins.is_empty());
        let (_, nothing) = run(state, unpin(5));
        assert!(nothing.is_empty());
    }

    #[test]
    fn unknown_keys_and_invalid_values_are_refused_naming_them() {
        let state = State::default();
        let err = decide(
            &state,
            &Command::Pin {
                key: "cache.speed".into(),
                value: "fast".into(),
                now: t(1),
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("cache.speed"), "{err}");
        let err = decide(
            &state,
            &Command::Pin {
                key: CACHE_MODE.into(),
                value: "fast".into(),
                now: t(1),
            },
        )
        .unwrap_err();
        assert!(
            matches!(&err, Error::InvalidValue { reason, .. } if reason.contains("\"fast\"")),
            "{err}"
        );
    }

    #[test]
    fn events_round_trip_through_json_with_versioned_types() {
        let e = Event::SettingPinned {
            key: CACHE_MODE.into(),
            value: "final".into(),
            pinned_at: t(1),
        };
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json["type"], "SettingPinned.v1");
        assert_eq!(serde_json::from_value::<Event>(json).unwrap(), e);
    }
}
