//! The execution cache's mode, and which setting chose it (RFC: Phase 0, 0.5 and 1).
//!
//! * `off`: every step executes; the cache is neither read nor written, and a build is one
//!   capture (no per-step checkpoints).
//! * `final`: only the final result's entry is consulted and published; no per-step
//!   checkpoints, so a build is one capture.
//! * `steps`: the per-step cache (checkpoints after mutating steps, resume from the deepest).
//!
//! A build resolves its mode once, when it is frozen, from the most specific setting that
//! holds a valid value: the template's pin, the team's, the service's (`STRATA_CACHE_MODE`),
//! then the default. A value that is not a mode is skipped at its level, and the build log
//! says so. A build keeps what it resolved for its whole life.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheMode {
    Off,
    Final,
    Steps,
}

impl CacheMode {
    pub const DEFAULT: CacheMode = CacheMode::Steps;

    pub fn as_str(self) -> &'static str {
        match self {
            CacheMode::Off => "off",
            CacheMode::Final => "final",
            CacheMode::Steps => "steps",
        }
    }

    /// Whether a lookup reads entries at all.
    pub fn reads(self) -> bool {
        self != CacheMode::Off
    }

    /// Whether mutating steps get checkpoints (and checkpoint entries).
    pub fn checkpoints(self) -> bool {
        self == CacheMode::Steps
    }
}

impl fmt::Display for CacheMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CacheMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" => Ok(CacheMode::Off),
            "final" => Ok(CacheMode::Final),
            "steps" => Ok(CacheMode::Steps),
            other => Err(format!(
                "{other:?} is not a cache mode (off, final or steps)"
            )),
        }
    }
}

pub use super::setting_levels::{Level, LevelValues as ModeSettings};

/// The service-wide setting's variable.
pub const SERVICE_VARIABLE: &str = "STRATA_CACHE_MODE";

impl Level {
    /// The level's name for the cache mode (`service setting STRATA_CACHE_MODE`).
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Template => "template pin",
            Level::Team => "team pin",
            Level::Service => "service setting STRATA_CACHE_MODE",
            Level::Default => "default",
        }
    }
}

/// What a build resolved: the mode, the level it came from, and the values skipped on the
/// way (each a level and why its value was not used).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResolvedMode {
    pub mode: CacheMode,
    pub level: Level,
    pub skipped: Vec<(Level, String)>,
}

/// The most specific valid setting, else the default.
pub fn resolve(settings: &ModeSettings) -> ResolvedMode {
    let r = super::setting_levels::resolve(settings, CacheMode::DEFAULT);
    ResolvedMode {
        mode: r.value,
        level: r.level,
        skipped: r.skipped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn settings(template: Option<&str>, team: Option<&str>, service: Option<&str>) -> ModeSettings {
        ModeSettings {
            template: template.map(str::to_string),
            team: team.map(str::to_string),
            service: service.map(str::to_string),
        }
    }

    #[test]
    fn the_most_specific_valid_level_wins() {
        let r = resolve(&settings(Some("off"), Some("final"), Some("steps")));
        assert_eq!((r.mode, r.level), (CacheMode::Off, Level::Template));
        let r = resolve(&settings(None, Some("final"), Some("steps")));
        assert_eq!((r.mode, r.level), (CacheMode::Final, Level::Team));
        let r = resolve(&settings(None, None, Some("OFF")));
        assert_eq!((r.mode, r.level), (CacheMode::Off, Level::Service));
        let r = resolve(&ModeSettings::default());
        assert_eq!((r.mode, r.level), (CacheMode::Steps, Level::Default));
        assert!(r.skipped.is_empty());
    }

    #[test]
    fn an_unknown_value_is_skipped_at_its_level_and_said() {
        let r = resolve(&settings(Some("fast"), None, Some("final")));
        assert_eq!((r.mode, r.level), (CacheMode::Final, Level::Service));
        assert_eq!(r.skipped.len(), 1);
        assert_eq!(r.skipped[0].0, Level::Template);
        assert!(r.skipped[0].1.contains("\"fast\""), "{:?}", r.skipped);
        let r = resolve(&settings(Some("x"), Some("y"), Some("z")));
        assert_eq!((r.mode, r.level), (CacheMode::Steps, Level::Default));
        assert_eq!(r.skipped.len(), 3);
        // An empty value sets nothing.
        let r = resolve(&settings(Some(" "), None, None));
        assert_eq!(
            (r.mode, r.level, r.skipped.len()),
            (CacheMode::Steps, Level::Default, 0)
        );
    }

    #[test]
    fn a_pin_moves_a_team_both_ways_while_the_service_says_final() {
        let off = resolve(&settings(None, Some("off"), Some("final")));
        assert_eq!(off.mode, CacheMode::Off);
        let back = resolve(&settings(None, Some("steps"), Some("final")));
        assert_eq!(back.mode, CacheMode::Steps);
        let unpinned = resolve(&settings(None, None, Some("final")));
        assert_eq!(unpinned.mode, CacheMode::Final);
    }

    fn value() -> impl Strategy<Value = Option<String>> {
        prop_oneof![
            Just(None),
            Just(Some("off".to_string())),
            Just(Some("final".to_string())),
            Just(Some("steps".to_string())),
            "[a-z]{0,6}".prop_map(Some),
        ]
    }

    proptest! {
        /// The result is the first level, in order, whose value parses; values above it are
        /// exactly the skipped ones.
        #[test]
        fn resolution_is_the_first_valid_level(t in value(), m in value(), s in value()) {
            let given = settings(t.as_deref(), m.as_deref(), s.as_deref());
            let r = resolve(&given);
            let levels = [(Level::Template, &t), (Level::Team, &m), (Level::Service, &s)];
            let first = levels.iter().find(|(_, v)| {
                v.as_deref().is_some_and(|v| v.parse::<CacheMode>().is_ok())
            });
            match first {
                Some((level, v)) => {
                    prop_assert_eq!(r.level, *level);
                    prop_assert_eq!(r.mode, v.as_deref().unwrap().parse::<CacheMode>().unwrap());
                }
                None => prop_assert_eq!((r.mode, r.level), (CacheMode::DEFAULT, Level::Default)),
            }
            let above = levels.iter().take_while(|(l, _)| Some(*l) != first.map(|f| f.0));
            let invalid = above
                .filter(|(_, v)| v.as_deref().is_some_and(|v| !v.trim().is_empty()))
                .count();
            prop_assert_eq!(r.skipped.len(), invalid);
        }
    }
}
