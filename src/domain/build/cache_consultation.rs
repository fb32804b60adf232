//! What a worker recorded about its step-cache lookup, so that "why was this (not) a cache hit"
//! can be answered from the build stream alone (ADR 0015).
//!
//! The key chain is computed from the frozen request plus facts only the node knows at run time:
//! the resolved base image digest and the launch fingerprint. Without this record an operator
//! could compare two builds' specs but not tell a changed base image from an absent entry.

use serde::{Deserialize, Serialize};

use crate::domain::cache_key::CacheKey;
use crate::domain::ids::Digest;

/// The cache identity one attempt computed and what its lookup found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheConsultation {
    /// The resolved base image's manifest digest (`None` for a `fromTemplate` base resolved to
    /// a stack without one).
    pub base_image_digest: Option<Digest>,
    /// The key of the base: fingerprint (backend, version, architecture, resources, semantics)
    /// and base identity together.
    pub base_key: CacheKey,
    /// `step_keys[i]` is the key after step `i + 1`.
    pub step_keys: Vec<CacheKey>,
    pub final_key: CacheKey,
    /// The first step whose reads were bypassed by `force` (1 for a build-level force).
    pub force_from: Option<u32>,
    pub found: CacheFound,
}

/// Where the lookup let the build start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CacheFound {
    /// The final result was cached: no step ran.
    Final,
    /// Resumed after this (1-based) step's checkpoint.
    Checkpoint { step: u32 },
    /// No usable entry: every step ran.
    Nothing,
    /// Reading the index failed; the build ran without the cache.
    Bypassed { reason: String },
}
