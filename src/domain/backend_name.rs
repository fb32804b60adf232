//! Which sandbox backend runs a build's steps or a launched sandbox, as a setting resolves it
//! (`sandbox.backend`: a template's pin, the team's, `STRATA_SANDBOX_BACKEND`, the default).
//! Today there is one, `namespace` (Linux namespaces, ADR 0005); a second is a new variant
//! here and a node that runs it, and pins move a tenant onto it without a deploy.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::setting_levels::{self, Level, LevelValues};

/// The service-wide setting's variable.
pub const SERVICE_VARIABLE: &str = "STRATA_SANDBOX_BACKEND";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendName {
    Namespace,
}

impl BackendName {
    pub const DEFAULT: BackendName = BackendName::Namespace;

    pub fn as_str(self) -> &'static str {
        match self {
            BackendName::Namespace => "namespace",
        }
    }
}

impl fmt::Display for BackendName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for BackendName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "namespace" => Ok(BackendName::Namespace),
            other => Err(format!("{other:?} is not a sandbox backend (namespace)")),
        }
    }
}

/// What a build or sandbox resolved: the backend, the level it came from, the values skipped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResolvedBackend {
    pub backend: BackendName,
    pub level: Level,
    pub skipped: Vec<(Level, String)>,
}

impl ResolvedBackend {
    /// `namespace (default)`, as the build log and `strata why` say it.
    pub fn describe(&self) -> String {
        format!(
            "{} ({})",
            self.backend,
            self.level.describe(SERVICE_VARIABLE)
        )
    }
}

pub fn resolve(values: &LevelValues) -> ResolvedBackend {
    let r = setting_levels::resolve(values, BackendName::DEFAULT);
    ResolvedBackend {
        backend: r.value,
        level: r.level,
        skipped: r.skipped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_one_backend_resolves_from_any_level_and_an_unknown_one_is_skipped() {
        let r = resolve(&LevelValues {
            template: Some("firecracker".into()),
            team: Some("Namespace".into()),
            service: None,
        });
        assert_eq!((r.backend, r.level), (BackendName::Namespace, Level::Team));
        assert_eq!(r.skipped.len(), 1);
        assert!(
            r.skipped[0].1.contains("\"firecracker\""),
            "{:?}",
            r.skipped
        );
        let r = resolve(&LevelValues::default());
        assert_eq!(r.describe(), "namespace (default)");
        let r = resolve(&LevelValues {
            service: Some("namespace".into()),
            ..Default::default()
        });
        assert_eq!(
            r.describe(),
            "namespace (service setting STRATA_SANDBOX_BACKEND)"
        );
    }
}
