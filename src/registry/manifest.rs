//! The registry documents a pull reads: image indexes (manifest lists), image manifests and
//! image configs, in their OCI and Docker v2 spellings, and the choice of a platform.

use serde::Deserialize;

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";

/// The `Accept` header of a manifest request: every kind this client reads.
pub const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json";

#[derive(Debug, Clone, Deserialize)]
pub struct Descriptor {
    #[serde(rename = "mediaType", default)]
    pub media_type: String,
    pub digest: String,
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub platform: Option<Platform>,
    #[serde(default)]
    pub urls: Vec<String>,
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Platform {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub variant: Option<String>,
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

/// A manifest document, by what it holds (the media type field is optional in OCI).
#[derive(Debug, Clone, Deserialize)]
pub struct Document {
    #[serde(rename = "schemaVersion", default)]
    pub schema_version: u32,
    #[serde(rename = "mediaType", default)]
    pub media_type: Option<String>,
    #[serde(default)]
    pub manifests: Option<Vec<Descriptor>>,
    #[serde(default)]
    pub config: Option<Descriptor>,
    #[serde(default)]
    pub layers: Option<Vec<Descriptor>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ImageConfigFile {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub variant: Option<String>,
    #[serde(default)]
    pub config: Option<RuntimeConfig>,
    pub rootfs: RootFs,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct RuntimeConfig {
    #[serde(rename = "Env", default)]
    pub env: Option<Vec<String>>,
    #[serde(rename = "User", default)]
    pub user: Option<String>,
    #[serde(rename = "WorkingDir", default)]
    pub working_dir: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct RootFs {
    #[serde(default)]
    pub diff_ids: Vec<String>,
}

/// How a layer blob is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

/// The compression of a layer media type, or `None` for a type that is not a layer tar.
pub fn layer_compression(media_type: &str) -> Option<Compression> {
    match media_type {
        "application/vnd.oci.image.layer.v1.tar"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar"
        | "application/vnd.docker.image.rootfs.diff.tar" => Some(Compression::None),
        "application/vnd.oci.image.layer.v1.tar+gzip"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
        | "application/vnd.docker.image.rootfs.diff.tar.gzip"
        | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => Some(Compression::Gzip),
        "application/vnd.oci.image.layer.v1.tar+zstd"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd" => Some(Compression::Zstd),
        _ => None,
    }
}

/// This node's platform in OCI terms.
pub fn node_platform() -> Platform {
    let architecture = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    };
    Platform {
        architecture: architecture.to_owned(),
        os: "linux".to_owned(),
        variant: None,
    }
}

/// The entry of an index that runs on `node`: matching os and architecture, preferring the
/// arm64 `v8` variant (or no variant) where several exist. Attestation manifests
/// (`unknown/unknown`) never match.
pub fn select<'a>(entries: &'a [Descriptor], node: &Platform) -> Option<&'a Descriptor> {
    let candidates: Vec<&Descriptor> = entries
        .iter()
        .filter(|d| {
            d.platform
                .as_ref()
                .is_some_and(|p| p.os == node.os && p.architecture == node.architecture)
        })
        .collect();
    candidates
        .iter()
        .find(|d| {
            let v = d.platform.as_ref().and_then(|p| p.variant.as_deref());
            v.is_none() || v == Some("v8")
        })
        .or(candidates.first())
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(os: &str, arch: &str, variant: Option<&str>, digest: &str) -> Descriptor {
        Descriptor {
            media_type: OCI_MANIFEST.into(),
            digest: digest.into(),
            size: 1,
            platform: Some(Platform {
                architecture: arch.into(),
                os: os.into(),
                variant: variant.map(Into::into),
            }),
            urls: vec![],
        }
    }

    #[test]
    fn the_node_platform_is_chosen_from_an_index() {
        let entries = vec![
            entry("unknown", "unknown", None, "att"),
            entry("linux", "arm", Some("v7"), "armv7"),
            entry("linux", "arm64", Some("v8"), "arm64"),
            entry("linux", "amd64", None, "amd64"),
            entry("windows", "amd64", None, "win"),
        ];
        let amd = Platform {
            architecture: "amd64".into(),
            os: "linux".into(),
            variant: None,
        };
        assert_eq!(select(&entries, &amd).unwrap().digest, "amd64");
        let arm = Platform {
            architecture: "arm64".into(),
            ..amd.clone()
        };
        assert_eq!(select(&entries, &arm).unwrap().digest, "arm64");
        let s390 = Platform {
            architecture: "s390x".into(),
            ..amd
        };
        assert!(select(&entries, &s390).is_none());
    }

    #[test]
    fn layer_media_types() {
        assert_eq!(
            layer_compression("application/vnd.docker.image.rootfs.diff.tar.gzip"),
            Some(Compression::Gzip)
        );
        assert_eq!(
            layer_compression("application/vnd.oci.image.layer.v1.tar+zstd"),
            Some(Compression::Zstd)
        );
        assert_eq!(
            layer_compression("application/vnd.oci.image.layer.v1.tar"),
            Some(Compression::None)
        );
        assert_eq!(
            layer_compression("application/vnd.cncf.helm.chart.content.v1.tar+gzip"),
            None
        );
    }
}
