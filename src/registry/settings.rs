//! Where registries are reached and how much may be pulled: the node's pull settings.
//!
//! Each has a flag and an environment variable (see `strata worker --help`):
//! * `STRATA_REGISTRY_MIRRORS`: comma-separated `registry=url`, e.g.
//!   `docker.io=http://127.0.0.1:5000`. A mirrored registry is reached only through its mirror
//!   (no fallback to the upstream: a node behind a pull-through cache usually has no other way
//!   out, and a silent fallback would hide a broken mirror).
//! * `STRATA_INSECURE_REGISTRIES`: comma-separated hosts (`host` or `host:port`) that are
//!   reached over plain HTTP, and may be at loopback or private addresses ([`super::reach`]).
//!   Nothing is listed by default, loopback included: a build must not make the node fetch from
//!   its own services.
//! * `STRATA_PULL_MAX_BYTES`: a ceiling on the compressed bytes of one image, counted as they
//!   arrive; a build node also holds each layer's expansion to `STRATA_BUILD_DISK_MAX`.
//! * `STRATA_PULL_MAX_EXPANDED_BYTES` and `STRATA_PULL_MAX_ENTRIES`: ceilings on what one
//!   image's layers expand to together, in bytes and in entries; a node never lets a pull take
//!   its disk below `STRATA_NODE_DISK_RESERVE`, nor its inodes below the same share
//!   ([`super::expansion`]).

use std::collections::BTreeMap;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegistrySettings {
    /// Registry host (normalized: `docker.io`) to the base URL that serves it.
    pub mirrors: BTreeMap<String, String>,
    pub insecure: Vec<String>,
    pub max_bytes: Option<u64>,
    /// Most bytes one layer may expand to (its tar): a build node sets what one build may
    /// write (`STRATA_BUILD_DISK_MAX`), so a small compressed layer cannot fill the node's disk.
    /// `None`: the archive policy's own ceiling.
    pub max_layer_bytes: Option<u64>,
    /// Most bytes one image's layers may expand to together (`STRATA_PULL_MAX_EXPANDED_BYTES`),
    /// counted as they stream. `None`: no ceiling of its own.
    pub max_expanded_bytes: Option<u64>,
    /// Most entries (files, directories, links) one image's layers may hold together
    /// (`STRATA_PULL_MAX_ENTRIES`), counted as they stream. `None`: no ceiling of its own.
    pub max_entries: Option<u64>,
    /// Free space a pull must leave on the disk its layers go to (`STRATA_NODE_DISK_RESERVE`,
    /// set by the processes that keep a node's disk). `None`: not checked.
    pub disk_reserve: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    #[error(
        "registry mirror {0:?} must be `registry=url`, e.g. `docker.io=http://127.0.0.1:5000`"
    )]
    Mirror(String),
}

impl RegistrySettings {
    /// Parses the comma-separated forms of the flags.
    pub fn parse(
        mirrors: Option<&str>,
        insecure: Option<&str>,
        max_bytes: Option<u64>,
    ) -> Result<RegistrySettings, SettingsError> {
        let mut out = RegistrySettings {
            max_bytes,
            ..Default::default()
        };
        for item in split(mirrors) {
            let (registry, url) = item
                .split_once('=')
                .ok_or_else(|| SettingsError::Mirror(item.to_owned()))?;
            let url = url.trim().trim_end_matches('/');
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(SettingsError::Mirror(item.to_owned()));
            }
            let registry = match registry.trim() {
                "index.docker.io" | "registry-1.docker.io" => "docker.io",
                r => r,
            };
            out.mirrors.insert(registry.to_owned(), url.to_owned());
        }
        out.insecure = split(insecure).map(str::to_owned).collect();
        Ok(out)
    }

    /// The base URL (`scheme://host[:port]`) that serves `registry`.
    pub fn endpoint(&self, registry: &str) -> String {
        if let Some(url) = self.mirrors.get(registry) {
            return url.clone();
        }
        if registry == crate::domain::image_ref::DEFAULT_REGISTRY {
            return "https://registry-1.docker.io".to_owned();
        }
        let scheme = if self.is_insecure(registry) {
            "http"
        } else {
            "https"
        };
        format!("{scheme}://{registry}")
    }

    fn is_insecure(&self, registry: &str) -> bool {
        let host = host_of(registry);
        self.insecure.iter().any(|h| h == registry || h == host)
    }
}

fn split(list: Option<&str>) -> impl Iterator<Item = &str> {
    list.unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// `host` of `host[:port]` or `[v6]:port`.
pub(crate) fn host_of(registry: &str) -> &str {
    if let Some(rest) = registry.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    registry.split(':').next().unwrap_or(registry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirrors_insecure_hosts_and_defaults() {
        let s = RegistrySettings::parse(
            Some("docker.io=http://127.0.0.1:5000/, ghcr.io=https://mirror.example"),
            Some("reg.internal:8080"),
            Some(10),
        )
        .unwrap();
        assert_eq!(s.endpoint("docker.io"), "http://127.0.0.1:5000");
        assert_eq!(s.endpoint("ghcr.io"), "https://mirror.example");
        assert_eq!(s.endpoint("reg.internal:8080"), "http://reg.internal:8080");
        // Loopback is not listed by default (it is refused by `reach`, and would be HTTPS).
        assert_eq!(s.endpoint("127.0.0.1:5001"), "https://127.0.0.1:5001");
        assert_eq!(s.endpoint("[::1]:5001"), "https://[::1]:5001");
        assert_eq!(s.endpoint("quay.io"), "https://quay.io");
        let d = RegistrySettings::default();
        assert_eq!(d.endpoint("docker.io"), "https://registry-1.docker.io");
        assert!(RegistrySettings::parse(Some("docker.io"), None, None).is_err());
        assert!(RegistrySettings::parse(Some("docker.io=ftp://x"), None, None).is_err());
    }
}
