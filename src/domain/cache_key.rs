//! Cache identity (RFC §Cache identity): the fingerprint, and the `base_key`, chained `step_key`
//! and `final_key` of a frozen build.
//!
//! Layout: [`HASHING_VERSION`]; [`Fingerprint`]; [`BaseIdentity`]; [`CacheKey`]; the three key
//! functions; [`KeyChain`] and [`key_chain`], which computes every key of a build statically
//! from the frozen request and bindings, before any sandbox exists.
//!
//! Every key is the sha256 of a versioned, length-delimited canonical encoding ([`Encoder`]): no
//! string joins, so distinct inputs cannot collide by concatenation. A step key chains through
//! its parent, so a change at step *i* changes the keys of *i* and everything after it, and
//! nothing before. COPY keys carry the client's `filesHash` *and* the server-computed blob digest
//! of the frozen binding: the client hash is a name the server cannot verify, the blob digest is
//! what was actually uploaded. `force` flags never enter a key: forcing bypasses reads and
//! replaces the entry under the same key.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::build::Binding;
use super::build_spec::{encode_step, Step, StepContext};
use super::canonical::Encoder;
use super::ids::{Digest, FilesHash, SnapshotId};

/// The global lever: bumping it invalidates every key at once, with no migration.
pub const HASHING_VERSION: u64 = 1;

/// The effective launch configuration a checkpoint depends on. Two builds may share a cache
/// entry only if their fingerprints are equal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    /// Sandbox backend and its version (each sandbox keeps the backend it started with).
    pub backend: String,
    pub backend_version: String,
    /// The resolved base image's manifest digest.
    pub base_image_digest: Digest,
    pub architecture: String,
    pub cpu_count: u32,
    pub memory_mb: u32,
    pub disk_mb: u64,
    /// Bumped whenever step execution semantics change (how USER, ENV, COPY behave).
    pub builder_semantics_version: u64,
    pub hashing_version: u64,
}

impl Fingerprint {
    fn encode(&self, e: &mut Encoder) {
        e.str(&self.backend)
            .str(&self.backend_version)
            .digest_field(&self.base_image_digest)
            .str(&self.architecture)
            .u64(self.cpu_count.into())
            .u64(self.memory_mb.into())
            .u64(self.disk_mb)
            .u64(self.builder_semantics_version)
            .u64(self.hashing_version);
    }
}

/// What the first step builds on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BaseIdentity {
    /// A fresh image base, by manifest digest.
    Image { digest: Digest },
    /// A `fromTemplate` build: the parent's build-base checkpoint.
    TemplateCheckpoint { snapshot: SnapshotId },
    /// A `fromTemplate` build on the parent's result, by content ([`stack_identity`]): an
    /// unchanged rebuild of the parent (a new snapshot id over the same layers) keeps the keys
    /// of every template derived from it.
    Stack { digest: Digest },
}

/// The content identity of a stack a build boots on: its layers, bottom first, and the command
/// context it starts with.
pub fn stack_identity(layers: &[Digest], context: &StepContext) -> BaseIdentity {
    let mut e = Encoder::new("strata.cache.stack.v1");
    e.list(layers.iter(), |e, d| {
        e.digest_field(d);
    })
    .str(&context.user)
    .str(&context.workdir)
    .list(context.env.iter(), |e, (k, v)| {
        e.str(k).str(v);
    });
    BaseIdentity::Stack { digest: e.digest() }
}

/// A cache key: the sha256 of a canonical encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CacheKey(pub Digest);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("step {step} copies filesHash {hash}, which has no frozen binding; keys are computed only for frozen builds")]
    UnboundCopy { step: usize, hash: FilesHash },
    #[error("step {step} copies from template {template:?}, which was not resolved; resolve every COPY_FROM source before computing keys")]
    UnresolvedSource { step: usize, template: String },
}

pub fn base_key(fingerprint: &Fingerprint, base: &BaseIdentity) -> CacheKey {
    let mut e = Encoder::new("strata.cache.base.v1");
    e.u64(HASHING_VERSION);
    fingerprint.encode(&mut e);
    match base {
        BaseIdentity::Image { digest } => e.u8(1).digest_field(digest),
        BaseIdentity::TemplateCheckpoint { snapshot } => e.u8(2).str(&snapshot.to_string()),
        BaseIdentity::Stack { digest } => e.u8(3).digest_field(digest),
    };
    CacheKey(e.digest())
}

/// The canonical bytes a step key hashes; exposed so tests can check the encoding is prefix-free.
pub fn step_encoding(parent: &CacheKey, step: &Step, blob: Option<&Digest>) -> Vec<u8> {
    let mut e = Encoder::new("strata.cache.step.v1");
    e.u64(HASHING_VERSION).digest_field(&parent.0);
    // The step without its force flags: forcing changes whether we read, not what the key is.
    let unforced = unforce(step);
    encode_step(&mut e, &unforced);
    e.opt(blob, |e, d| {
        e.digest_field(d);
    });
    e.as_bytes().to_vec()
}

fn unforce(step: &Step) -> Step {
    let mut s = step.clone();
    match &mut s {
        Step::Run { force, .. }
        | Step::Env { force, .. }
        | Step::Workdir { force, .. }
        | Step::User { force, .. }
        | Step::CopyFrom { force, .. } => *force = false,
        Step::Copy {
            force,
            force_upload,
            ..
        } => {
            *force = false;
            *force_upload = false;
        }
    }
    s
}

/// The key of `step` after `parent`. COPY steps take the frozen blob digest of their filesHash.
pub fn step_key(parent: &CacheKey, step: &Step, blob: Option<&Digest>) -> CacheKey {
    CacheKey(Digest::of(&step_encoding(parent, step, blob)))
}

/// What finalization depends on: the start and ready commands, the final command context, and
/// the finalization semantics.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finalization {
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
    pub context: StepContext,
    pub semantics_version: u64,
}

pub fn final_key(last: &CacheKey, finalization: &Finalization) -> CacheKey {
    let mut e = Encoder::new("strata.cache.final.v1");
    e.u64(HASHING_VERSION)
        .digest_field(&last.0)
        .opt_str(finalization.start_cmd.as_deref())
        .opt_str(finalization.ready_cmd.as_deref())
        .str(&finalization.context.user)
        .str(&finalization.context.workdir)
        .list(finalization.context.env.iter(), |e, (k, v)| {
            e.str(k).str(v);
        })
        .u64(finalization.semantics_version);
    CacheKey(e.digest())
}

/// Every key of a build: `steps[i]` is the key after step `i + 1`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyChain {
    pub base: CacheKey,
    pub steps: Vec<CacheKey>,
    pub final_key: CacheKey,
}

impl KeyChain {
    /// The resumable checkpoint keys: those of mutating steps, with their 1-based step numbers,
    /// deepest first (the order a lookup probes them).
    pub fn checkpoints_deepest_first<'a>(&'a self, steps: &'a [Step]) -> Vec<(usize, CacheKey)> {
        steps
            .iter()
            .zip(&self.steps)
            .enumerate()
            .filter(|(_, (s, _))| s.is_mutating())
            .map(|(i, (_, k))| (i + 1, *k))
            .rev()
            .collect()
    }
}

/// Computes the whole chain from the frozen request. `finalization.context` is the context after
/// the last step (see [`crate::domain::build_spec::fold_contexts`]). For a build without
/// COPY_FROM steps; see [`key_chain_with_sources`].
pub fn key_chain(
    fingerprint: &Fingerprint,
    base: &BaseIdentity,
    steps: &[Step],
    frozen: &BTreeMap<FilesHash, Binding>,
    finalization: &Finalization,
) -> Result<KeyChain, KeyError> {
    key_chain_with_sources(
        fingerprint,
        base,
        steps,
        frozen,
        &BTreeMap::new(),
        finalization,
    )
}

/// [`key_chain`] where COPY_FROM steps take `sources[template]`: the content identity of the
/// stack the step copies out of (as a `fromTemplate` base is keyed), so a source rebuilt with
/// other contents misses and one rebuilt unchanged hits.
pub fn key_chain_with_sources(
    fingerprint: &Fingerprint,
    base: &BaseIdentity,
    steps: &[Step],
    frozen: &BTreeMap<FilesHash, Binding>,
    sources: &BTreeMap<String, Digest>,
    finalization: &Finalization,
) -> Result<KeyChain, KeyError> {
    let base_key = base_key(fingerprint, base);
    let mut keys = Vec::with_capacity(steps.len());
    let mut parent = base_key;
    for (i, step) in steps.iter().enumerate() {
        let blob =
            match step {
                Step::Copy { files_hash, .. } => Some(
                    frozen
                        .get(files_hash)
                        .ok_or_else(|| KeyError::UnboundCopy {
                            step: i + 1,
                            hash: files_hash.clone(),
                        })?
                        .blob_digest,
                ),
                Step::CopyFrom { template, .. } => Some(*sources.get(template).ok_or_else(
                    || KeyError::UnresolvedSource {
                        step: i + 1,
                        template: template.clone(),
                    },
                )?),
                _ => None,
            };
        parent = step_key(&parent, step, blob.as_ref());
        keys.push(parent);
    }
    Ok(KeyChain {
        base: base_key,
        final_key: final_key(&parent, finalization),
        steps: keys,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ids::Generation;
    use proptest::prelude::*;

    fn fingerprint() -> Fingerprint {
        Fingerprint {
            backend: "namespaces".into(),
            backend_version: "1".into(),
            base_image_digest: Digest::of(b"ubuntu"),
            architecture: "x86_64".into(),
            cpu_count: 2,
            memory_mb: 1024,
            disk_mb: 4096,
            builder_semantics_version: 1,
            hashing_version: HASHING_VERSION,
        }
    }
    fn finalization() -> Finalization {
        Finalization {
            start_cmd: None,
            ready_cmd: None,
            context: StepContext::after_default_user(),
            semantics_version: 1,
        }
    }
    fn hash(c: char) -> FilesHash {
        FilesHash::parse(&c.to_string().repeat(64)).unwrap()
    }
    fn copy(h: &FilesHash) -> Step {
        Step::Copy {
            src: "app".into(),
            dest: "/app".into(),
            owner: None,
            mode: None,
            files_hash: h.clone(),
            force: false,
            force_upload: false,
        }
    }
    fn run(cmd: &str) -> Step {
        Step::Run {
            command: cmd.into(),
            user: None,
            force: false,
        }
    }
    fn frozen(h: &FilesHash, bytes: &[u8]) -> BTreeMap<FilesHash, Binding> {
        BTreeMap::from([(
            h.clone(),
            Binding {
                generation: Generation(1),
                blob_digest: Digest::of(bytes),
                size: bytes.len() as u64,
            },
        )])
    }
    fn image() -> BaseIdentity {
        BaseIdentity::Image {
            digest: Digest::of(b"ubuntu"),
        }
    }

    #[test]
    fn copy_keys_follow_the_uploaded_bytes_not_just_the_hash() {
        let h = hash('a');
        let steps = [copy(&h), run("make")];
        let a = key_chain(
            &fingerprint(),
            &image(),
            &steps,
            &frozen(&h, b"v1"),
            &finalization(),
        )
        .unwrap();
        let b = key_chain(
            &fingerprint(),
            &image(),
            &steps,
            &frozen(&h, b"v2"),
            &finalization(),
        )
        .unwrap();
        assert_eq!(a.base, b.base);
        assert_ne!(a.steps[0], b.steps[0]);
        assert_ne!(a.final_key, b.final_key);
        assert_eq!(
            key_chain(
                &fingerprint(),
                &image(),
                &steps,
                &BTreeMap::new(),
                &finalization()
            ),
            Err(KeyError::UnboundCopy { step: 1, hash: h })
        );
    }

    #[test]
    fn force_does_not_change_keys_but_fingerprint_does() {
        let plain = step_key(&base_key(&fingerprint(), &image()), &run("x"), None);
        let forced = step_key(
            &base_key(&fingerprint(), &image()),
            &Step::Run {
                command: "x".into(),
                user: None,
                force: true,
            },
            None,
        );
        assert_eq!(plain, forced);
        let mut fp = fingerprint();
        fp.backend_version = "2".into();
        assert_ne!(base_key(&fp, &image()), base_key(&fingerprint(), &image()));
        let template_base = BaseIdentity::TemplateCheckpoint {
            snapshot: SnapshotId::from_uuid(uuid::Uuid::from_u128(1)),
        };
        assert_ne!(
            base_key(&fingerprint(), &template_base),
            base_key(&fingerprint(), &image())
        );
    }

    #[test]
    fn a_stack_is_identified_by_its_layers_and_context() {
        let layers = [Digest::of(b"l1"), Digest::of(b"l2")];
        let ctx = StepContext::after_default_user();
        assert_eq!(stack_identity(&layers, &ctx), stack_identity(&layers, &ctx));
        assert_ne!(
            stack_identity(&layers, &ctx),
            stack_identity(&layers[..1], &ctx)
        );
        let mut other = ctx.clone();
        other.env.insert("A".into(), "1".into());
        assert_ne!(
            stack_identity(&layers, &ctx),
            stack_identity(&layers, &other)
        );
        assert_ne!(
            base_key(&fingerprint(), &stack_identity(&layers, &ctx)),
            base_key(&fingerprint(), &image())
        );
    }

    #[test]
    fn checkpoints_are_the_mutating_steps_deepest_first() {
        let steps = [
            run("a"),
            Step::Env {
                vars: vec![("A".into(), "1".into())],
                force: false,
            },
            Step::Workdir {
                path: "/x".into(),
                force: false,
            },
            Step::User {
                name: "root".into(),
                sudo: None,
                force: false,
            },
        ];
        let chain = key_chain(
            &fingerprint(),
            &image(),
            &steps,
            &BTreeMap::new(),
            &finalization(),
        )
        .unwrap();
        let numbers: Vec<usize> = chain
            .checkpoints_deepest_first(&steps)
            .iter()
            .map(|(n, _)| *n)
            .collect();
        assert_eq!(numbers, [3, 1]);
    }

    fn arb_step() -> impl Strategy<Value = Step> {
        prop_oneof![
            ("[a-z &]{0,6}", proptest::option::of("[a-z]{1,3}")).prop_map(|(command, user)| {
                Step::Run {
                    command,
                    user,
                    force: false,
                }
            }),
            proptest::collection::vec(("[A-Z]{1,2}", "[a-z ]{0,3}"), 1..3)
                .prop_map(|vars| Step::Env { vars, force: false }),
            "[a-z/]{1,4}".prop_map(|path| Step::Workdir { path, force: false }),
            "[a-z]{1,3}".prop_map(|name| Step::User {
                name,
                sudo: None,
                force: false
            }),
        ]
    }

    proptest! {
        /// A change at step i changes keys i.. and nothing before it.
        #[test]
        fn the_chain_changes_exactly_from_the_first_difference(
            a in proptest::collection::vec(arb_step(), 1..6),
            b in proptest::collection::vec(arb_step(), 1..6),
        ) {
            let ka = key_chain(&fingerprint(), &image(), &a, &BTreeMap::new(), &finalization()).unwrap();
            let kb = key_chain(&fingerprint(), &image(), &b, &BTreeMap::new(), &finalization()).unwrap();
            let first_diff = a.iter().zip(&b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
            for i in 0..a.len().min(b.len()) {
                if i < first_diff {
                    prop_assert_eq!(ka.steps[i], kb.steps[i]);
                } else {
                    prop_assert_ne!(ka.steps[i], kb.steps[i]);
                }
            }
            prop_assert_eq!(a == b, ka.final_key == kb.final_key);
        }

        /// Step encodings over the same parent are prefix-free, hence injective.
        #[test]
        fn step_encoding_is_prefix_free(a in arb_step(), b in arb_step(), blob_a in proptest::option::of(any::<[u8; 4]>()), blob_b in proptest::option::of(any::<[u8; 4]>())) {
            let da = blob_a.map(|x| Digest::of(&x));
            let db = blob_b.map(|x| Digest::of(&x));
            prop_assume!(a != b || da != db);
            let parent = base_key(&fingerprint(), &image());
            let ea = step_encoding(&parent, &a, da.as_ref());
            let eb = step_encoding(&parent, &b, db.as_ref());
            prop_assert!(!ea.starts_with(&eb) && !eb.starts_with(&ea));
        }
    }

    #[test]
    fn a_copy_from_step_is_keyed_by_its_source_stack() {
        let step = Step::CopyFrom {
            template: "build".into(),
            src: "/out".into(),
            dest: "/srv/".into(),
            owner: None,
            mode: None,
            force: false,
        };
        let steps = vec![step];
        let chain = |identity: &str| {
            let sources = BTreeMap::from([("build".to_string(), Digest::of(identity.as_bytes()))]);
            key_chain_with_sources(
                &fingerprint(),
                &image(),
                &steps,
                &BTreeMap::new(),
                &sources,
                &finalization(),
            )
            .unwrap()
        };
        assert_eq!(chain("stack-a"), chain("stack-a"));
        assert_ne!(chain("stack-a").steps[0], chain("stack-b").steps[0]);
        assert_eq!(
            key_chain(
                &fingerprint(),
                &image(),
                &steps,
                &BTreeMap::new(),
                &finalization()
            ),
            Err(KeyError::UnresolvedSource {
                step: 1,
                template: "build".into()
            })
        );
    }
}
