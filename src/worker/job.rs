//! A frozen build as the node runs it: read from the build stream at claim time, consumed by
//! the cache plan and the executor (neither of which imports the other).

use std::collections::BTreeMap;

use crate::domain::build::Binding;
use crate::domain::build_spec::{Resources, TemplateBuildStartV2};
use crate::domain::ids::{FilesHash, TeamId};

/// What the executor needs to know about a frozen build.
#[derive(Debug, Clone)]
pub struct BuildJob {
    pub team: TeamId,
    pub spec: TemplateBuildStartV2,
    pub bindings: BTreeMap<FilesHash, Binding>,
    pub resources: Resources,
    /// What an earlier attempt resolved the base image's tag to.
    pub base_pin: Option<crate::domain::build::BasePin>,
    /// Credentials for the base image's registry, when the build brought some; `Err` says why
    /// they could not be read (the build then fails at `base` if it needs them).
    pub credentials: Result<Option<crate::domain::build_spec::RegistryCredentials>, String>,
    /// The cache mode the build was started with; `None`: started before modes, `steps`.
    pub cache_mode: Option<crate::domain::cache_mode::ResolvedMode>,
    /// The sandbox backend the build was started with; `None`: started before the setting,
    /// `namespace`.
    pub sandbox_backend: Option<crate::domain::backend_name::ResolvedBackend>,
}

impl BuildJob {
    pub fn cache_mode(&self) -> crate::domain::cache_mode::CacheMode {
        self.cache_mode
            .as_ref()
            .map_or(crate::domain::cache_mode::CacheMode::DEFAULT, |r| r.mode)
    }
}
