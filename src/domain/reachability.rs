//! Reachability: which stored objects a garbage-collection pass must keep, and how cheaply each
//! of the others is rebuilt (its [`Tier`]), from the folded state of every stream that can
//! reference an object.
//!
//! Roots, never deleted (RFC §Lifecycle and bounded storage):
//! * the current result of every live template's tags: the candidate snapshot and the
//!   build-base checkpoint a `fromTemplate` child boots on, with every layer below them;
//! * everything an in-flight build (not Ready, not Error) bound, checkpointed, resumed from,
//!   recorded a snapshot of, or is publishing;
//! * the layers of every launched sandbox that has not ended: a paused one's stored stack (what
//!   a resume boots on, whether or not its template lives), a running one's template snapshot;
//! * objects under an unexpired reader lease;
//! * pinned objects (the layers of a node's image catalog, which cannot be fetched again).
//!
//! Everything else is a candidate, in the most expensive tier any reference gives it: a
//! template's newest cached final results, other cached final results, cached checkpoints,
//! results a newer build superseded, uploads the client would send again, and orphans.
//! [`super::retention::plan`] then decides which candidates go.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};

use super::build::{self, StepOutcome};
use super::cache_entry::{self, Target};
use super::cache_key::CacheKey;
use super::files;
use super::ids::{BuildId, Digest, Scope, SnapshotId, TemplateId};
use super::object::{self, Lifecycle};
use super::retention::Tier;
use super::sandbox::{self, SandboxId};
use super::snapshot::SnapshotRecord;
use super::template;

/// One cache key's stream, folded.
#[derive(Clone, Debug)]
pub struct CacheKeyState {
    pub scope: Scope,
    pub key: CacheKey,
    pub state: cache_entry::State,
}

/// The folded state of every stream that references objects, read at one instant.
#[derive(Clone, Debug, Default)]
pub struct Inventory {
    pub templates: BTreeMap<TemplateId, template::State>,
    pub builds: BTreeMap<BuildId, build::State>,
    pub snapshots: BTreeMap<SnapshotId, SnapshotRecord>,
    pub sandboxes: BTreeMap<SandboxId, sandbox::State>,
    pub cache_keys: Vec<CacheKeyState>,
    pub files: Vec<files::State>,
    pub objects: BTreeMap<Digest, object::State>,
    /// Objects kept whatever references them, with why (a node's image catalog).
    pub pinned: BTreeMap<Digest, String>,
    /// Layers of registry images a node pulled, with the image.
    pub pulled: BTreeMap<Digest, String>,
}

/// An object as the store lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    pub digest: Digest,
    pub size: u64,
    pub written_at: DateTime<Utc>,
}

/// Why an object is kept whatever the policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Root {
    TemplateResult {
        template: TemplateId,
        tag: String,
        build: BuildId,
    },
    InFlightBuild {
        build: BuildId,
    },
    Sandbox {
        sandbox: SandboxId,
    },
    Leased {
        holder: String,
        until: DateTime<Utc>,
    },
    Pinned {
        by: String,
    },
}

impl std::fmt::Display for Root {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Root::TemplateResult {
                template,
                tag,
                build,
            } => write!(f, "result of template {template} tag {tag} (build {build})"),
            Root::InFlightBuild { build } => write!(f, "in-flight build {build}"),
            Root::Sandbox { sandbox } => write!(f, "sandbox {sandbox}"),
            Root::Leased { holder, until } => write!(f, "leased by {holder} until {until}"),
            Root::Pinned { by } => write!(f, "pinned by {by}"),
        }
    }
}

/// Where one stored object stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    Rooted(Root),
    Candidate(Tier),
}

/// A stored object, classified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Classified {
    pub stored: Stored,
    pub standing: Standing,
    /// The later of its store write and its last registration, reference or lease.
    pub last_used: DateTime<Utc>,
    /// What referenced it last (for the audit answer), if anything does.
    pub referenced_by: Option<String>,
    /// Live cache entries whose target holds it, with their pointer generation: a deletion
    /// retires them in the same append.
    pub entries: Vec<(Scope, CacheKey, u64)>,
}

/// How many of a template's newest cached final results are [`Tier::FinalResult`]; older ones
/// are [`Tier::SurplusFinalResult`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keep {
    pub finals_per_template: usize,
}

/// Classifies every stored object at `now`.
pub fn classify(
    inventory: &Inventory,
    stored: &[Stored],
    keep: Keep,
    now: DateTime<Utc>,
) -> Vec<Classified> {
    let refs = References::collect(inventory, keep);
    stored
        .iter()
        .map(|s| {
            let object = inventory.objects.get(&s.digest);
            let lease = object.and_then(|o| {
                o.leased_at(now)
                    .into_iter()
                    .next()
                    .map(|(holder, until)| Root::Leased {
                        holder: holder.to_owned(),
                        until,
                    })
            });
            let standing = match refs.roots.get(&s.digest).cloned().or(lease) {
                Some(root) => Standing::Rooted(root),
                None => Standing::Candidate(
                    refs.tiers
                        .get(&s.digest)
                        .map(|(tier, _)| *tier)
                        .unwrap_or(Tier::Orphan),
                ),
            };
            let last_used = object
                .and_then(|o| o.last_used)
                .map_or(s.written_at, |used| used.max(s.written_at));
            let referenced_by = match &standing {
                Standing::Rooted(root) => Some(root.to_string()),
                Standing::Candidate(_) => refs.tiers.get(&s.digest).map(|(_, by)| by.clone()),
            };
            Classified {
                stored: s.clone(),
                standing,
                last_used,
                referenced_by,
                entries: refs.entries.get(&s.digest).cloned().unwrap_or_default(),
            }
        })
        .collect()
}

/// Live cache entries whose target lists a layer the store no longer holds, with the first
/// missing layer: a lookup would only find them broken, so cache repair retires them.
pub fn broken_entries(
    inventory: &Inventory,
    stored: &BTreeSet<Digest>,
) -> Vec<(Scope, CacheKey, u64, Digest)> {
    let mut out = Vec::new();
    for ck in &inventory.cache_keys {
        let Some((entry, generation)) = ck.state.live() else {
            continue;
        };
        let mut snaps = vec![entry.target.snapshot()];
        if let Target::FinalResult {
            build_base_checkpoint: Some(base),
            ..
        } = &entry.target
        {
            snaps.push(*base);
        }
        let missing = snaps
            .iter()
            .filter_map(|s| inventory.snapshots.get(s))
            .flat_map(|r| r.layers.iter())
            .find(|d| !stored.contains(d));
        if let Some(d) = missing {
            out.push((ck.scope.clone(), ck.key, generation, *d));
        }
    }
    out
}

/// Whether a writer may take the object as stored: not while a pass deletes it, and not once
/// deleted (its bytes are gone until written again).
pub fn usable(object: Option<&object::State>) -> bool {
    object.is_none_or(|o| matches!(o.lifecycle, Lifecycle::Live | Lifecycle::Absent))
}

#[derive(Default)]
struct References {
    roots: BTreeMap<Digest, Root>,
    /// The most expensive tier a non-root reference gives, and what gave it.
    tiers: BTreeMap<Digest, (Tier, String)>,
    entries: BTreeMap<Digest, Vec<(Scope, CacheKey, u64)>>,
}

impl References {
    fn collect(inv: &Inventory, keep: Keep) -> References {
        let mut refs = References::default();
        for (digest, by) in &inv.pinned {
            refs.roots.insert(*digest, Root::Pinned { by: by.clone() });
        }
        let layers = |snapshot: &SnapshotId| -> Vec<Digest> {
            inv.snapshots
                .get(snapshot)
                .map(|r| r.layers.clone())
                .unwrap_or_default()
        };

        for (template_id, template) in &inv.templates {
            if template.deleted {
                continue;
            }
            for (tag, build_id) in &template.tags {
                let Some(result) = inv.builds.get(build_id).and_then(|b| b.result.as_ref()) else {
                    continue;
                };
                let root = Root::TemplateResult {
                    template: template_id.clone(),
                    tag: tag.as_str().to_owned(),
                    build: *build_id,
                };
                for snap in std::iter::once(&result.candidate).chain(&result.build_base_checkpoint)
                {
                    for d in layers(snap) {
                        refs.roots.entry(d).or_insert_with(|| root.clone());
                    }
                }
            }
        }

        for (build_id, build) in &inv.builds {
            if build.phase.is_terminal() || build.registration.is_none() {
                if let (Some(result), true) = (&build.result, build.phase.is_terminal()) {
                    // A finished build's result that no tag holds: superseded, unless its
                    // template was deleted, which makes its results garbage.
                    let deleted = build
                        .registration
                        .as_ref()
                        .and_then(|r| inv.templates.get(&r.template))
                        .is_none_or(|t| t.deleted);
                    let tier = if deleted {
                        Tier::Orphan
                    } else {
                        Tier::SupersededCheckpoint
                    };
                    for snap in
                        std::iter::once(&result.candidate).chain(&result.build_base_checkpoint)
                    {
                        for d in layers(snap) {
                            refs.tier(d, tier, format!("build {build_id}"));
                        }
                    }
                }
                continue;
            }
            let root = Root::InFlightBuild { build: *build_id };
            let mut digests: BTreeSet<Digest> = BTreeSet::new();
            for outcome in build.progress.values() {
                if let StepOutcome::Checkpointed { snapshot } | StepOutcome::Cached { snapshot } =
                    outcome
                {
                    digests.extend(layers(snapshot));
                }
            }
            if let Some(result) = &build.result {
                for snap in std::iter::once(&result.candidate).chain(&result.build_base_checkpoint)
                {
                    digests.extend(layers(snap));
                }
            }
            let frozen = build.freeze.iter().flat_map(|f| f.bindings.values());
            digests.extend(build.bindings.values().chain(frozen).map(|b| b.blob_digest));
            for d in digests {
                refs.roots.entry(d).or_insert_with(|| root.clone());
            }
        }

        for (id, sandbox) in &inv.sandboxes {
            if sandbox.is_ended() {
                continue;
            }
            let digests = match (sandbox.boot_layers(), &sandbox.request) {
                (Some(stored), _) => stored.to_vec(),
                (None, Some(request)) => layers(&request.snapshot),
                (None, None) => Vec::new(),
            };
            let root = Root::Sandbox {
                sandbox: id.clone(),
            };
            for d in digests {
                refs.roots.entry(d).or_insert_with(|| root.clone());
            }
        }

        // Snapshots an in-flight build wrote but has not referenced yet (the candidate between
        // its record and `PublishingStarted`, a checkpoint between its seal and its step).
        for record in inv.snapshots.values() {
            let in_flight = inv
                .builds
                .get(&record.build)
                .is_some_and(|b| b.registration.is_some() && !b.phase.is_terminal());
            if in_flight {
                let root = Root::InFlightBuild {
                    build: record.build,
                };
                for d in &record.layers {
                    refs.roots.entry(*d).or_insert_with(|| root.clone());
                }
            }
        }

        // Cached final results, newest first per template (by the registration of the build
        // that made them).
        let mut finals: BTreeMap<Option<TemplateId>, Vec<(DateTime<Utc>, &CacheKeyState)>> =
            BTreeMap::new();
        for ck in &inv.cache_keys {
            let Some((entry, generation)) = ck.state.live() else {
                continue;
            };
            let snapshot = entry.target.snapshot();
            let by = format!("cache entry {} in {}", ck.key.0, ck.scope.as_str());
            match &entry.target {
                Target::Checkpoint { .. } => {
                    for d in layers(&snapshot) {
                        refs.tier(d, Tier::CacheCheckpoint, by.clone());
                    }
                }
                Target::FinalResult { .. } => {
                    let made_by = inv
                        .snapshots
                        .get(&snapshot)
                        .and_then(|r| inv.builds.get(&r.build));
                    let template = made_by
                        .and_then(|b| b.registration.as_ref())
                        .map(|r| r.template.clone());
                    let at = made_by
                        .and_then(|b| b.registration.as_ref())
                        .map_or(DateTime::<Utc>::MIN_UTC, |r| r.registered_at);
                    finals.entry(template).or_default().push((at, ck));
                }
            }
            let mut snaps = vec![snapshot];
            if let Target::FinalResult {
                build_base_checkpoint: Some(base),
                ..
            } = &entry.target
            {
                snaps.push(*base);
            }
            for snap in snaps {
                for d in layers(&snap) {
                    refs.entries
                        .entry(d)
                        .or_default()
                        .push((ck.scope.clone(), ck.key, generation));
                }
            }
        }
        for (_, mut list) in finals {
            list.sort_by_key(|b| std::cmp::Reverse(b.0));
            for (i, (_, ck)) in list.into_iter().enumerate() {
                let tier = if i < keep.finals_per_template {
                    Tier::FinalResult
                } else {
                    Tier::SurplusFinalResult
                };
                let Some((entry, _)) = ck.state.live() else {
                    continue;
                };
                let by = format!("cache entry {} in {}", ck.key.0, ck.scope.as_str());
                if let Target::FinalResult {
                    candidate,
                    build_base_checkpoint,
                } = &entry.target
                {
                    for snap in std::iter::once(candidate).chain(build_base_checkpoint) {
                        for d in layers(snap) {
                            refs.tier(d, tier, by.clone());
                        }
                    }
                }
            }
        }

        for (digest, image) in &inv.pulled {
            refs.tier(*digest, Tier::PulledImage, format!("pulled image {image}"));
        }
        for files in &inv.files {
            if let Some(present) = files.present() {
                refs.tier(
                    present.blob_digest,
                    Tier::Upload,
                    format!("upload generation {}", present.generation),
                );
            }
        }
        refs
    }

    fn tier(&mut self, digest: Digest, tier: Tier, by: String) {
        let slot = self.tiers.entry(digest).or_insert((tier, by.clone()));
        if tier > slot.0 {
            *slot = (tier, by);
        }
    }
}

#[cfg(test)]
mod tests;
