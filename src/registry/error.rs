//! Why a pull failed. Every message names the image and says what to do; none ever carries a
//! credential (they are never formatted into an error, and registry bodies are cut short).

use crate::vmm::VmmError;

#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("image {image} was not found in its registry ({detail}); check the name and tag")]
    NotFound { image: String, detail: String },
    #[error("the registry refused access to {image} ({detail}); check the registry credentials (fromImageRegistry) and that they may pull this repository")]
    Unauthorized { image: String, detail: String },
    #[error("the registry is rate-limiting pulls of {image}: {message}; retry later or configure a mirror (STRATA_REGISTRY_MIRRORS)")]
    RateLimited { image: String, message: String },
    #[error("image {image} has no variant for this node's platform {platform} (it offers: {offered}); pick an image built for {platform}")]
    UnsupportedPlatform {
        image: String,
        platform: String,
        offered: String,
    },
    #[error("image {image}: {what} {expected} arrived with digest {actual}; the registry or something between it and this node altered it, nothing was stored")]
    DigestMismatch {
        image: String,
        what: &'static str,
        expected: String,
        actual: String,
    },
    #[error("image {image} is {size} bytes, above this node's pull ceiling of {limit} bytes (STRATA_PULL_MAX_BYTES)")]
    TooLarge {
        image: String,
        size: u64,
        limit: u64,
    },
    #[error("image {image} has a layer that expands to more than {limit} bytes, more than one build may write (STRATA_BUILD_DISK_MAX); nothing was kept")]
    LayerTooLarge { image: String, limit: u64 },
    #[error("image {image}: {detail}")]
    Unsupported { image: String, detail: String },
    #[error("image {image}: {detail}")]
    Refused { image: String, detail: String },
    #[error("reaching the registry for {image} failed: {detail}; check the registry address, the network and STRATA_REGISTRY_MIRRORS / STRATA_INSECURE_REGISTRIES")]
    Transport { image: String, detail: String },
    #[error("the registry answered {status} for {image}: {detail}")]
    Registry {
        image: String,
        status: u16,
        detail: String,
    },
    #[error("image {image}: the registry sent an invalid {what}: {detail}")]
    Malformed {
        image: String,
        what: &'static str,
        detail: String,
    },
    #[error("image {image}: exchanging the {provider} credentials for a registry token failed: {detail}")]
    TokenExchange {
        image: String,
        provider: &'static str,
        detail: String,
    },
    #[error("image {image}: storing a layer failed: {source}")]
    Store {
        image: String,
        #[source]
        source: VmmError,
    },
}

impl PullError {
    /// Whether the failure is the image's or the user's (fail the build) rather than the
    /// node's own storage (abandon the attempt, as for any other node fault).
    pub fn is_node_fault(&self) -> bool {
        matches!(self, PullError::Store { source, .. } if !matches!(source, VmmError::DigestMismatch { .. } | VmmError::Archive(_)))
    }
}

/// The first line of a registry's error body, short and free of control characters.
pub fn summarize_body(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(2048)]);
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
        if let Some(errors) = v["errors"].as_array() {
            let parts: Vec<String> = errors
                .iter()
                .map(|e| {
                    let code = e["code"].as_str().unwrap_or_default();
                    let msg = e["message"].as_str().unwrap_or_default();
                    match (code.is_empty(), msg.is_empty()) {
                        (false, false) => format!("{code}: {msg}"),
                        (false, true) => code.to_owned(),
                        _ => msg.to_owned(),
                    }
                })
                .filter(|s| !s.is_empty())
                .collect();
            if !parts.is_empty() {
                return clip(&parts.join("; "));
            }
        }
    }
    clip(text.lines().next().unwrap_or_default())
}

fn clip(s: &str) -> String {
    let cleaned: String = s.chars().filter(|c| !c.is_control()).take(300).collect();
    if cleaned.is_empty() {
        "no details".to_owned()
    } else {
        cleaned
    }
}
