//! How a setting resolves over its levels: the template's pin, the team's, the service's
//! setting, then the default. One pure function for every setting (the cache mode, the sandbox
//! backend), so a new setting or a new value of one is a type, not new plumbing.
//!
//! The most specific level holding a valid value wins; a value that does not parse is skipped
//! at its level and reported; an empty value sets nothing.

use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Where a resolved value came from, most specific first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    Template,
    Team,
    Service,
    Default,
}

impl Level {
    /// The level's name; a service setting is named by its variable (`STRATA_CACHE_MODE`).
    pub fn describe(self, service_variable: &str) -> String {
        match self {
            Level::Template => "template pin".into(),
            Level::Team => "team pin".into(),
            Level::Service => format!("service setting {service_variable}"),
            Level::Default => "default".into(),
        }
    }
}

/// The values one setting has at each level; `None` where a level sets nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LevelValues {
    pub template: Option<String>,
    pub team: Option<String>,
    pub service: Option<String>,
}

/// The value chosen, the level it came from, and the values skipped on the way (each a level
/// and why its value was not used).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved<T> {
    pub value: T,
    pub level: Level,
    pub skipped: Vec<(Level, String)>,
}

/// The most specific valid value of `values`, else `default`.
pub fn resolve<T: FromStr<Err = String>>(values: &LevelValues, default: T) -> Resolved<T> {
    let mut skipped = Vec::new();
    for (level, value) in [
        (Level::Template, &values.template),
        (Level::Team, &values.team),
        (Level::Service, &values.service),
    ] {
        let Some(value) = value.as_deref().filter(|v| !v.trim().is_empty()) else {
            continue;
        };
        match value.parse() {
            Ok(value) => {
                return Resolved {
                    value,
                    level,
                    skipped,
                }
            }
            Err(why) => skipped.push((level, why)),
        }
    }
    Resolved {
        value: default,
        level: Level::Default,
        skipped,
    }
}
