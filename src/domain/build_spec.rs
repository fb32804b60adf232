//! The E2B template-build request bodies as validated types, and what they mean for execution.
//!
//! Layout:
//! * [`SpecError`]: every way a request body is rejected, each saying what to fix.
//! * Registration (`POST /v3/templates`): [`TemplateBuildRequestV3`], the [`TemplateName`] /
//!   [`Tag`] rules (PROTOCOL §1.1) and [`Resources`].
//! * Build start (`POST /v2/templates/{id}/builds/{bid}`): [`TemplateBuildStartV2`], its
//!   [`BaseSource`], [`RegistryCredentials`] (redacted in `Debug`) and [`Step`] with the exact
//!   argument rules of PROTOCOL §3; [`TemplateBuildStartV2::request_digest`] for the freeze.
//! * Execution context (PROTOCOL §3.7): [`StepContext`] and [`fold_contexts`], which says which
//!   user, workdir and environment each step runs with.
//!
//! Both bodies deserialize through their validators (`#[serde(try_from)]`), so a value of these
//! types is valid by construction, and serialize back to the exact wire shape the SDK sends:
//! keys present only when the SDK sends them, step `type` in upper case.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::canonical::Encoder;
use super::ids::{Digest, FilesHash};

/// Why a registration or build-start body was rejected. Each message names the field and the rule
/// so that the HTTP layer can return it verbatim as a 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("template name {name:?} is invalid: {rule}")]
    InvalidName { name: String, rule: &'static str },
    #[error("tag {tag:?} is invalid: {rule}")]
    InvalidTag { tag: String, rule: &'static str },
    #[error("{field} = {value} is out of range: {rule}")]
    ResourceOutOfRange {
        field: &'static str,
        value: u64,
        rule: &'static str,
    },
    #[error(
        "{field} {value} is more than this service gives one build: at most {ceiling} ({setting})"
    )]
    OverCeiling {
        field: &'static str,
        value: u64,
        ceiling: u64,
        setting: &'static str,
    },
    #[error("the build must name exactly one base: send either 'fromImage' or 'fromTemplate'")]
    NoBase,
    #[error("'fromImage' and 'fromTemplate' are mutually exclusive; send only one of them")]
    BothBases,
    #[error("'{field}' must not be empty")]
    EmptyField { field: &'static str },
    #[error("'fromImageRegistry' applies to 'fromImage' only; remove it or build from an image")]
    RegistryWithoutImage,
    #[error("step {step}: unknown step type {kind:?}; expected one of RUN, COPY, ENV, WORKDIR, USER (upper case, as the SDK sends them)")]
    UnknownStepType { step: usize, kind: String },
    #[error("step {step} ({kind}): {rule}")]
    InvalidStepArgs {
        step: usize,
        kind: &'static str,
        rule: String,
    },
}

// ---------------------------------------------------------------------------------------------
// Registration: POST /v3/templates
// ---------------------------------------------------------------------------------------------

/// One name segment: lowercase ASCII letters and digits, inner `-`, `_` or `.`, 1 to 128
/// characters. The SDK sends the user's string verbatim; like E2B we trim and lowercase it first.
fn parse_segment(raw: &str, full: &str) -> Result<String, SpecError> {
    let invalid = |rule| SpecError::InvalidName {
        name: full.to_owned(),
        rule,
    };
    if raw.is_empty() {
        return Err(invalid("the name is empty"));
    }
    if raw.len() > 128 {
        return Err(invalid("a name may have at most 128 characters"));
    }
    let ok_char = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = raw.as_bytes();
    if !ok_char(bytes[0]) || !ok_char(bytes[bytes.len() - 1]) {
        return Err(invalid("a name must start and end with a letter or digit"));
    }
    if !bytes
        .iter()
        .all(|&b| ok_char(b) || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(invalid(
            "use only letters, digits, '-', '_' and '.', optionally prefixed by 'team-slug/'",
        ));
    }
    Ok(raw.to_owned())
}

/// A template name, optionally namespaced as `team-slug/name`. The namespace only ever names the
/// caller's own team (the API checks it against the team slug); the template is identified by
/// `(team, name)`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TemplateName {
    pub namespace: Option<String>,
    pub name: String,
}

impl TemplateName {
    /// Parses `name`, `team-slug/name` (no tag: see [`parse_name_and_tag`]).
    pub fn parse(raw: &str) -> Result<Self, SpecError> {
        let normalized = raw.trim().to_ascii_lowercase();
        match normalized.split_once('/') {
            None => Ok(Self {
                namespace: None,
                name: parse_segment(&normalized, raw)?,
            }),
            Some((namespace, name)) => {
                if name.contains('/') {
                    return Err(SpecError::InvalidName {
                        name: raw.to_owned(),
                        rule: "at most one '/' (team-slug/name) is allowed",
                    });
                }
                Ok(Self {
                    namespace: Some(parse_segment(namespace, raw)?),
                    name: parse_segment(name, raw)?,
                })
            }
        }
    }
}

impl std::fmt::Display for TemplateName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{ns}/{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// A tag: a letter or digit, then letters, digits, `-`, `_` or `.`; at most 128 characters.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Tag(String);

impl Tag {
    /// The tag E2B gives a build registered without any tag.
    pub fn default_tag() -> Self {
        Tag("default".to_owned())
    }
    pub fn parse(raw: &str) -> Result<Self, SpecError> {
        let invalid = |rule| SpecError::InvalidTag {
            tag: raw.to_owned(),
            rule,
        };
        let bytes = raw.as_bytes();
        if bytes.is_empty() {
            return Err(invalid("a tag must not be empty"));
        }
        if bytes.len() > 128 {
            return Err(invalid("a tag may have at most 128 characters"));
        }
        if !bytes[0].is_ascii_alphanumeric() {
            return Err(invalid("a tag must start with a letter or digit"));
        }
        if !bytes
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        {
            return Err(invalid("use only letters, digits, '-', '_' and '.'"));
        }
        Ok(Tag(raw.to_owned()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}
impl TryFrom<String> for Tag {
    type Error = SpecError;
    fn try_from(value: String) -> Result<Self, SpecError> {
        Tag::parse(&value)
    }
}
impl From<Tag> for String {
    fn from(tag: Tag) -> String {
        tag.0
    }
}

/// Splits the SDK's `name[:tag]` string. The SDK never splits it; E2B's server does, and so do we.
pub fn parse_name_and_tag(raw: &str) -> Result<(TemplateName, Option<Tag>), SpecError> {
    match raw.rsplit_once(':') {
        None => Ok((TemplateName::parse(raw)?, None)),
        Some((name, tag)) => Ok((TemplateName::parse(name)?, Some(Tag::parse(tag.trim())?))),
    }
}

/// The sandbox geometry a build asks for. `None` means the server default.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct Resources {
    pub cpu_count: Option<u32>,
    pub memory_mb: Option<u32>,
    pub min_free_disk_mb: Option<u32>,
}

impl Resources {
    /// E2B's template defaults, used when a build asks for no CPU count or memory: the build
    /// runs with them and the API reports them, as E2B does.
    pub const DEFAULT_CPU_COUNT: u32 = 2;
    pub const DEFAULT_MEMORY_MB: u32 = 1024;

    /// The CPU count the build runs with.
    pub fn effective_cpu_count(&self) -> u32 {
        self.cpu_count.unwrap_or(Self::DEFAULT_CPU_COUNT)
    }

    /// The memory (MiB) the build runs with.
    pub fn effective_memory_mb(&self) -> u32 {
        self.memory_mb.unwrap_or(Self::DEFAULT_MEMORY_MB)
    }

    fn validate(self) -> Result<Self, SpecError> {
        if let Some(cpu) = self.cpu_count {
            if !(1..=64).contains(&cpu) {
                return Err(SpecError::ResourceOutOfRange {
                    field: "cpuCount",
                    value: cpu.into(),
                    rule: "between 1 and 64",
                });
            }
        }
        if let Some(mem) = self.memory_mb {
            if !(128..=1 << 20).contains(&mem) {
                return Err(SpecError::ResourceOutOfRange {
                    field: "memoryMB",
                    value: mem.into(),
                    rule: "between 128 and 1048576",
                });
            }
        }
        Ok(self)
    }
}

/// The most one build may ask for on this service (`STRATA_BUILD_CPU_MAX`,
/// `STRATA_BUILD_MEMORY_MAX`): a request above is refused when the build is registered, as
/// E2B refuses resources over a team's limit, instead of waiting for a node that never comes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ceilings {
    pub cpu_count: u32,
    pub memory_mb: u32,
    /// What one build may write, in MiB (`STRATA_BUILD_DISK_MAX`): a `minFreeDiskMb` above it
    /// could never be granted. `None`: unbounded.
    pub disk_mb: Option<u64>,
}

impl Ceilings {
    pub const DEFAULT: Ceilings = Ceilings {
        cpu_count: 8,
        memory_mb: 8192,
        disk_mb: Some(20 << 10),
    };

    /// Refuses what `resources` asks (or gets by default) beyond the ceilings.
    pub fn check(&self, resources: &Resources) -> Result<(), SpecError> {
        let cpu = resources.effective_cpu_count();
        if cpu > self.cpu_count {
            return Err(SpecError::OverCeiling {
                field: "cpuCount",
                value: cpu.into(),
                ceiling: self.cpu_count.into(),
                setting: "STRATA_BUILD_CPU_MAX",
            });
        }
        let mem = resources.effective_memory_mb();
        if mem > self.memory_mb {
            return Err(SpecError::OverCeiling {
                field: "memoryMB",
                value: mem.into(),
                ceiling: self.memory_mb.into(),
                setting: "STRATA_BUILD_MEMORY_MAX",
            });
        }
        if let (Some(max), Some(asked)) = (self.disk_mb, resources.min_free_disk_mb) {
            if u64::from(asked) > max {
                return Err(SpecError::OverCeiling {
                    field: "minFreeDiskMb",
                    value: asked.into(),
                    ceiling: max,
                    setting: "STRATA_BUILD_DISK_MAX",
                });
            }
        }
        Ok(())
    }
}

/// The wire shape of `TemplateBuildRequestV3`, exactly as the SDK sends it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawBuildRequestV3 {
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tags: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cpu_count: Option<u32>,
    #[serde(rename = "memoryMB", default, skip_serializing_if = "Option::is_none")]
    memory_mb: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    min_free_disk_mb: Option<u32>,
}

/// A validated `POST /v3/templates` body.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawBuildRequestV3", into = "RawBuildRequestV3")]
pub struct TemplateBuildRequestV3 {
    /// The template name with any namespace, without the tag.
    pub name: TemplateName,
    /// The tag written as `name:tag`, kept apart so the body serializes back as sent.
    pub name_tag: Option<Tag>,
    /// The `tags` array, in the order sent.
    pub extra_tags: Vec<Tag>,
    pub resources: Resources,
}

impl TemplateBuildRequestV3 {
    /// The tags this build gets: the `name:tag` tag first, then `tags`, duplicates dropped;
    /// `default` when there are none (PROTOCOL §1.1).
    pub fn effective_tags(&self) -> Vec<Tag> {
        let mut tags: Vec<Tag> = Vec::new();
        for tag in self.name_tag.iter().chain(self.extra_tags.iter()) {
            if !tags.contains(tag) {
                tags.push(tag.clone());
            }
        }
        if tags.is_empty() {
            tags.push(Tag::default_tag());
        }
        tags
    }
}

impl TryFrom<RawBuildRequestV3> for TemplateBuildRequestV3 {
    type Error = SpecError;
    fn try_from(raw: RawBuildRequestV3) -> Result<Self, SpecError> {
        let (name, name_tag) = parse_name_and_tag(&raw.name)?;
        let extra_tags = raw
            .tags
            .unwrap_or_default()
            .iter()
            .map(|t| Tag::parse(t))
            .collect::<Result<_, _>>()?;
        let resources = Resources {
            cpu_count: raw.cpu_count,
            memory_mb: raw.memory_mb,
            min_free_disk_mb: raw.min_free_disk_mb,
        }
        .validate()?;
        Ok(Self {
            name,
            name_tag,
            extra_tags,
            resources,
        })
    }
}

impl From<TemplateBuildRequestV3> for RawBuildRequestV3 {
    fn from(r: TemplateBuildRequestV3) -> Self {
        let name = match &r.name_tag {
            Some(tag) => format!("{}:{}", r.name, tag.as_str()),
            None => r.name.to_string(),
        };
        Self {
            name,
            tags: (!r.extra_tags.is_empty())
                .then(|| r.extra_tags.into_iter().map(String::from).collect()),
            cpu_count: r.resources.cpu_count,
            memory_mb: r.resources.memory_mb,
            min_free_disk_mb: r.resources.min_free_disk_mb,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Build start: POST /v2/templates/{templateID}/builds/{buildID}
// ---------------------------------------------------------------------------------------------

/// Credentials for a private base-image registry, as the SDK sends them. `Debug` never prints a
/// secret: these bodies end up in logs and error reports.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum RegistryCredentials {
    Registry {
        username: String,
        password: String,
    },
    Aws {
        #[serde(rename = "awsAccessKeyId")]
        access_key_id: String,
        #[serde(rename = "awsSecretAccessKey")]
        secret_access_key: String,
        #[serde(rename = "awsRegion")]
        region: String,
    },
    Gcp {
        #[serde(rename = "serviceAccountJson")]
        service_account_json: String,
    },
}

impl std::fmt::Debug for RegistryCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Registry { username, .. } => f
                .debug_struct("Registry")
                .field("username", username)
                .field("password", &"<redacted>")
                .finish(),
            Self::Aws {
                access_key_id,
                region,
                ..
            } => f
                .debug_struct("Aws")
                .field("access_key_id", access_key_id)
                .field("secret_access_key", &"<redacted>")
                .field("region", region)
                .finish(),
            Self::Gcp { .. } => f
                .debug_struct("Gcp")
                .field("service_account_json", &"<redacted>")
                .finish(),
        }
    }
}

/// What the build starts from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BaseSource {
    /// An image reference (`fromImage`), optionally from a private registry.
    Image {
        reference: String,
        registry: Option<RegistryCredentials>,
    },
    /// Another template (`fromTemplate`): a name or id, possibly with `:tag`.
    Template { reference: String },
}

/// One build step, with the argument rules of PROTOCOL §3 enforced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// `RUN [cmd]` or `RUN [cmd, user]`; the user override lasts for this step only.
    Run {
        command: String,
        user: Option<String>,
        force: bool,
    },
    /// `COPY [src, dest, owner_or_"", mode_or_""]` plus `filesHash` and `forceUpload`.
    Copy {
        src: String,
        dest: String,
        owner: Option<String>,
        mode: Option<String>,
        files_hash: FilesHash,
        force: bool,
        force_upload: bool,
    },
    /// `ENV [k1, v1, k2, v2, ...]`, in order; values are shell-evaluated by the executor.
    Env {
        vars: Vec<(String, String)>,
        force: bool,
    },
    /// `WORKDIR [path]`; relative paths resolve against the previous workdir.
    Workdir { path: String, force: bool },
    /// `USER [name]` or `USER [name, "true"|"false"]` (the second argument grants sudo).
    User {
        name: String,
        sudo: Option<bool>,
        force: bool,
    },
    /// strata's extension, which the SDK never sends: `COPY_FROM [template, src, dest,
    /// owner_or_"", mode_or_""]` copies `src` out of another template of the team (its
    /// filesystem before finalization), with COPY's semantics, on the node: a multi-stage
    /// Dockerfile's `COPY --from=<stage>` (ADR 0029). `src` is a literal absolute path.
    CopyFrom {
        template: String,
        src: String,
        dest: String,
        owner: Option<String>,
        mode: Option<String>,
        force: bool,
    },
}

impl Step {
    /// The wire name of the step type.
    pub fn kind(&self) -> &'static str {
        match self {
            Step::Run { .. } => "RUN",
            Step::Copy { .. } => "COPY",
            Step::Env { .. } => "ENV",
            Step::Workdir { .. } => "WORKDIR",
            Step::User { .. } => "USER",
            Step::CopyFrom { .. } => "COPY_FROM",
        }
    }
    pub fn force(&self) -> bool {
        match self {
            Step::Run { force, .. }
            | Step::Copy { force, .. }
            | Step::Env { force, .. }
            | Step::Workdir { force, .. }
            | Step::User { force, .. }
            | Step::CopyFrom { force, .. } => *force,
        }
    }
    /// Whether the step changes the filesystem and so gets a checkpoint (RUN, COPY, and WORKDIR,
    /// which runs `mkdir -p`). ENV and USER only enter the key chain.
    pub fn is_mutating(&self) -> bool {
        matches!(
            self,
            Step::Run { .. } | Step::Copy { .. } | Step::CopyFrom { .. } | Step::Workdir { .. }
        )
    }
    /// The step's `args` exactly as the SDK sends them.
    pub fn args(&self) -> Vec<String> {
        match self {
            Step::Run { command, user, .. } => {
                let mut args = vec![command.clone()];
                args.extend(user.clone());
                args
            }
            Step::Copy {
                src,
                dest,
                owner,
                mode,
                ..
            } => vec![
                src.clone(),
                dest.clone(),
                owner.clone().unwrap_or_default(),
                mode.clone().unwrap_or_default(),
            ],
            Step::Env { vars, .. } => vars
                .iter()
                .flat_map(|(k, v)| [k.clone(), v.clone()])
                .collect(),
            Step::Workdir { path, .. } => vec![path.clone()],
            Step::User { name, sudo, .. } => {
                let mut args = vec![name.clone()];
                args.extend(sudo.map(|s| s.to_string()));
                args
            }
            Step::CopyFrom {
                template,
                src,
                dest,
                owner,
                mode,
                ..
            } => vec![
                template.clone(),
                src.clone(),
                dest.clone(),
                owner.clone().unwrap_or_default(),
                mode.clone().unwrap_or_default(),
            ],
        }
    }
}

/// The wire shape of one step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RawStep {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    files_hash: Option<String>,
    #[serde(default)]
    force: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    force_upload: bool,
}

fn is_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn is_mode(mode: &str) -> bool {
    (3..=4).contains(&mode.len()) && mode.bytes().all(|b| (b'0'..=b'7').contains(&b))
}

impl Step {
    /// Validates one wire step; `step` is its 1-based position, used in error messages.
    pub(crate) fn from_raw(step: usize, raw: RawStep) -> Result<Step, SpecError> {
        let bad =
            |kind: &'static str, rule: String| SpecError::InvalidStepArgs { step, kind, rule };
        let RawStep {
            kind,
            mut args,
            files_hash,
            force,
            force_upload,
        } = raw;
        let kind: &'static str = match kind.as_str() {
            "RUN" => "RUN",
            "COPY" => "COPY",
            "ENV" => "ENV",
            "WORKDIR" => "WORKDIR",
            "USER" => "USER",
            "COPY_FROM" => "COPY_FROM",
            _ => return Err(SpecError::UnknownStepType { step, kind }),
        };
        if kind != "COPY" && (files_hash.is_some() || force_upload) {
            return Err(bad(
                kind,
                "'filesHash' and 'forceUpload' belong to COPY steps only".into(),
            ));
        }
        match kind {
            "RUN" => {
                if !(1..=2).contains(&args.len()) {
                    return Err(bad(
                        kind,
                        format!(
                            "expected [command] or [command, user], got {} args",
                            args.len()
                        ),
                    ));
                }
                let user = (args.len() == 2).then(|| args.pop().unwrap_or_default());
                if user.as_deref() == Some("") {
                    return Err(bad(kind, "the user argument must not be empty".into()));
                }
                Ok(Step::Run {
                    command: args.pop().unwrap_or_default(),
                    user,
                    force,
                })
            }
            "COPY" => {
                if args.len() != 4 {
                    return Err(bad(
                        kind,
                        format!(
                            "expected exactly 4 args [src, dest, owner or \"\", mode or \"\"], got {}",
                            args.len()
                        ),
                    ));
                }
                let files_hash = files_hash
                    .ok_or_else(|| bad(kind, "'filesHash' is required on COPY".into()))?;
                let files_hash =
                    FilesHash::parse(&files_hash).map_err(|e| bad(kind, e.to_string()))?;
                let mode = args.pop().filter(|m| !m.is_empty());
                let owner = args.pop().filter(|o| !o.is_empty());
                let dest = args.pop().unwrap_or_default();
                let src = args.pop().unwrap_or_default();
                if src.is_empty() || dest.is_empty() {
                    return Err(bad(kind, "src and dest must not be empty".into()));
                }
                if let Some(mode) = &mode {
                    if !is_mode(mode) {
                        return Err(bad(
                            kind,
                            format!("mode {mode:?} must be 3 or 4 octal digits, e.g. \"0644\""),
                        ));
                    }
                }
                Ok(Step::Copy {
                    src,
                    dest,
                    owner,
                    mode,
                    files_hash,
                    // forceUpload implies force, as the SDK sends it.
                    force: force || force_upload,
                    force_upload,
                })
            }
            "ENV" => {
                if args.is_empty() || args.len() % 2 != 0 {
                    return Err(bad(
                        kind,
                        format!(
                            "expected key/value pairs [k1, v1, k2, v2, ...], got {} args",
                            args.len()
                        ),
                    ));
                }
                let mut vars = Vec::with_capacity(args.len() / 2);
                let mut it = args.into_iter();
                while let (Some(key), Some(value)) = (it.next(), it.next()) {
                    if !is_env_name(&key) {
                        return Err(bad(
                            kind,
                            format!(
                                "{key:?} is not a variable name (letters, digits, '_', not starting with a digit)"
                            ),
                        ));
                    }
                    vars.push((key, value));
                }
                Ok(Step::Env { vars, force })
            }
            "COPY_FROM" => {
                let Ok([template, src, dest, owner, mode]) = <[String; 5]>::try_from(args) else {
                    return Err(bad(
                        kind,
                        "expected exactly 5 args [template, src, dest, owner or \"\", mode or \"\"]"
                            .into(),
                    ));
                };
                if template.is_empty() || dest.is_empty() {
                    return Err(bad(kind, "template and dest must not be empty".into()));
                }
                if !src.starts_with('/') || src.contains(['*', '?', '[']) || src.contains('\0') {
                    return Err(bad(
                        kind,
                        format!("src {src:?} must be a literal absolute path (no globs)"),
                    ));
                }
                if !mode.is_empty() && !is_mode(&mode) {
                    return Err(bad(
                        kind,
                        format!("mode {mode:?} must be 3 or 4 octal digits, e.g. \"0644\""),
                    ));
                }
                Ok(Step::CopyFrom {
                    template,
                    src,
                    dest,
                    owner: Some(owner).filter(|o| !o.is_empty()),
                    mode: Some(mode).filter(|m| !m.is_empty()),
                    force,
                })
            }
            "WORKDIR" => match <[String; 1]>::try_from(args) {
                Ok([path]) if !path.is_empty() => Ok(Step::Workdir { path, force }),
                Ok(_) => Err(bad(kind, "the path must not be empty".into())),
                Err(args) => Err(bad(
                    kind,
                    format!("expected exactly 1 arg [path], got {}", args.len()),
                )),
            },
            _ => {
                if !(1..=2).contains(&args.len()) {
                    return Err(bad(
                        kind,
                        format!(
                            "expected [user] or [user, \"true\"], got {} args",
                            args.len()
                        ),
                    ));
                }
                let sudo = match args.get(1).map(String::as_str) {
                    None => None,
                    Some("true") => Some(true),
                    Some("false") => Some(false),
                    Some(other) => {
                        return Err(bad(
                            kind,
                            format!("the second arg must be \"true\" or \"false\", got {other:?}"),
                        ))
                    }
                };
                let name = args.swap_remove(0);
                if name.is_empty() {
                    return Err(bad(kind, "the user name must not be empty".into()));
                }
                Ok(Step::User { name, sudo, force })
            }
        }
    }

    pub(crate) fn to_raw(&self) -> RawStep {
        let (files_hash, force_upload) = match self {
            Step::Copy {
                files_hash,
                force_upload,
                ..
            } => (Some(files_hash.to_string()), *force_upload),
            _ => (None, false),
        };
        RawStep {
            kind: self.kind().to_owned(),
            args: self.args(),
            files_hash,
            force: self.force(),
            force_upload,
        }
    }
}

/// The wire shape of `TemplateBuildStartV2`. Keys the SDK never sends (`resolveSymlinks`, `gzip`)
/// and keys a newer SDK may add are ignored rather than rejected.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawBuildStartV2 {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    from_image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    from_template: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    from_image_registry: Option<RegistryCredentials>,
    #[serde(default)]
    force: bool,
    #[serde(default)]
    steps: Vec<RawStep>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    start_cmd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ready_cmd: Option<String>,
}

/// A validated `POST /v2/templates/{templateID}/builds/{buildID}` body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawBuildStartV2", into = "RawBuildStartV2")]
pub struct TemplateBuildStartV2 {
    pub base: BaseSource,
    /// Build-level `force` (`skip_cache`): bypass every cache read.
    pub force: bool,
    pub steps: Vec<Step>,
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
}

impl TryFrom<RawBuildStartV2> for TemplateBuildStartV2 {
    type Error = SpecError;
    fn try_from(raw: RawBuildStartV2) -> Result<Self, SpecError> {
        let base = match (raw.from_image, raw.from_template) {
            (Some(_), Some(_)) => return Err(SpecError::BothBases),
            (None, None) => return Err(SpecError::NoBase),
            (Some(reference), None) => {
                if reference.trim().is_empty() {
                    return Err(SpecError::EmptyField { field: "fromImage" });
                }
                BaseSource::Image {
                    reference,
                    registry: raw.from_image_registry,
                }
            }
            (None, Some(reference)) => {
                if raw.from_image_registry.is_some() {
                    return Err(SpecError::RegistryWithoutImage);
                }
                if reference.trim().is_empty() {
                    return Err(SpecError::EmptyField {
                        field: "fromTemplate",
                    });
                }
                BaseSource::Template { reference }
            }
        };
        let steps = raw
            .steps
            .into_iter()
            .enumerate()
            .map(|(i, step)| Step::from_raw(i + 1, step))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            base,
            force: raw.force,
            steps,
            start_cmd: raw.start_cmd,
            ready_cmd: raw.ready_cmd,
        })
    }
}

impl From<TemplateBuildStartV2> for RawBuildStartV2 {
    fn from(spec: TemplateBuildStartV2) -> Self {
        let (from_image, from_template, from_image_registry) = match spec.base {
            BaseSource::Image {
                reference,
                registry,
            } => (Some(reference), None, registry),
            BaseSource::Template { reference } => (None, Some(reference), None),
        };
        Self {
            from_image,
            from_template,
            from_image_registry,
            force: spec.force,
            steps: spec.steps.iter().map(Step::to_raw).collect(),
            start_cmd: spec.start_cmd,
            ready_cmd: spec.ready_cmd,
        }
    }
}

impl TemplateBuildStartV2 {
    /// The distinct `filesHash`es the COPY steps reference, in first-use order. Every one must
    /// have a binding when the build freezes.
    pub fn referenced_hashes(&self) -> Vec<FilesHash> {
        let mut hashes: Vec<FilesHash> = Vec::new();
        for step in &self.steps {
            if let Step::Copy { files_hash, .. } = step {
                if !hashes.contains(files_hash) {
                    hashes.push(files_hash.clone());
                }
            }
        }
        hashes
    }

    /// This request without private-registry credentials: the form that is stored in events,
    /// so that secrets never enter the audit history. The credentials still count in
    /// [`Self::request_digest`], which is computed from the full request.
    pub fn without_credentials(&self) -> Self {
        let mut spec = self.clone();
        if let BaseSource::Image { registry, .. } = &mut spec.base {
            *registry = None;
        }
        spec
    }

    /// Whether a private registry must be authenticated against to pull the base.
    pub fn has_registry_credentials(&self) -> bool {
        matches!(
            self.base,
            BaseSource::Image {
                registry: Some(_),
                ..
            }
        )
    }

    /// The sha256 of the canonical encoding of this request. A replayed start with the same
    /// digest is the same request (idempotent); a different digest after the freeze is a
    /// conflict. Canonical means: independent of JSON key order, whitespace and of keys we ignore;
    /// every field is length-delimited (see [`Encoder`]).
    pub fn request_digest(&self) -> Digest {
        self.request_digest_with(None)
    }

    /// The request digest with the registry credentials entering as `credentials` (a keyed
    /// digest the caller computed), else as the plain digest of their JSON form. The plain
    /// form distinguishes requests without holding the secret in the clear, but anyone who
    /// reads the event can test guesses against it offline; the keyed one needs the server
    /// secret. Without credentials in the request, both are the same.
    pub fn request_digest_with(&self, credentials: Option<&Digest>) -> Digest {
        let mut e = Encoder::new("strata.build-start-request.v1");
        match &self.base {
            BaseSource::Image {
                reference,
                registry,
            } => {
                e.u8(1).str(reference);
                e.opt(registry.as_ref(), |e, creds| match credentials {
                    Some(keyed) => {
                        e.digest_field(keyed);
                    }
                    None => {
                        let json = serde_json::to_vec(creds).unwrap_or_default();
                        e.digest_field(&Digest::of(&json));
                    }
                });
            }
            BaseSource::Template { reference } => {
                e.u8(2).str(reference);
            }
        }
        e.bool(self.force);
        e.list(self.steps.iter(), |e, step| {
            encode_step(e, step);
        });
        e.opt_str(self.start_cmd.as_deref());
        e.opt_str(self.ready_cmd.as_deref());
        e.digest()
    }
}

/// Encodes one step canonically: its kind, its wire args, and the COPY extras.
pub(crate) fn encode_step(e: &mut Encoder, step: &Step) {
    e.str(step.kind());
    e.list(step.args().into_iter(), |e, arg| {
        e.str(&arg);
    });
    e.bool(step.force());
    match step {
        Step::Copy {
            files_hash,
            force_upload,
            ..
        } => {
            e.u8(1).str(files_hash.as_str()).bool(*force_upload);
        }
        _ => {
            e.u8(0);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Command context (PROTOCOL §3.7)
// ---------------------------------------------------------------------------------------------

/// The logical state a step runs in: who, where, with which environment. Stored per checkpoint
/// so a resumed build restores exactly what a cold build would have had.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StepContext {
    pub user: String,
    pub workdir: String,
    /// Declared values, in declaration order of first assignment replaced in place. The executor
    /// shell-evaluates them (`printf "%s"` with `$VAR` expansion); that happens in the sandbox.
    pub env: BTreeMap<String, String>,
}

/// The default user E2B creates with the implicit `USER user true` step after the base.
pub const DEFAULT_USER: &str = "user";

/// The home directory useradd gives `user`: `/root` for root, `/home/<user>` otherwise.
pub fn home_of(user: &str) -> String {
    if user == "root" {
        "/root".to_owned()
    } else {
        format!("/home/{user}")
    }
}

impl StepContext {
    /// The context of a build from an image, after the implicit `USER user true` step: user
    /// `user`, workdir its home, no environment beyond the image's own.
    pub fn after_default_user() -> Self {
        Self {
            user: DEFAULT_USER.to_owned(),
            workdir: home_of(DEFAULT_USER),
            env: BTreeMap::new(),
        }
    }
}

/// Joins `path` onto `base` when relative and removes `.`, `..` and repeated slashes lexically
/// (`..` at the root stays at the root, as in the kernel).
pub fn resolve_path(base: &str, path: &str) -> String {
    let joined = if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("{base}/{path}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in joined.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
}

/// What one step runs with, as computed by [`fold_contexts`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EffectiveStep {
    /// 1-based, as E2B reports steps in logs and in `reason.step`.
    pub number: usize,
    /// The user the step executes as (RUN's override included).
    pub user: String,
    pub workdir: String,
    pub env: BTreeMap<String, String>,
    /// For COPY: the destination resolved against the workdir, and the `user:group` owner.
    pub copy_target: Option<CopyTarget>,
    /// The context in force after the step, for the next step and for the checkpoint.
    pub after: StepContext,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyTarget {
    pub dest: String,
    /// Keeps a trailing `/`: it means "into this directory" for a single file.
    pub dest_is_dir: bool,
    pub owner: String,
}

/// Folds the steps over the base context: ENV, USER and WORKDIR persist; RUN's user override does
/// not; relative WORKDIR and COPY destinations resolve against the current workdir.
pub fn fold_contexts(base: &StepContext, steps: &[Step]) -> Vec<EffectiveStep> {
    let mut ctx = base.clone();
    let mut out = Vec::with_capacity(steps.len());
    for (i, step) in steps.iter().enumerate() {
        let mut user = ctx.user.clone();
        let mut copy_target = None;
        match step {
            Step::Run {
                user: Some(over), ..
            } => user = over.clone(),
            Step::Run { user: None, .. } => {}
            Step::Copy { dest, owner, .. } | Step::CopyFrom { dest, owner, .. } => {
                let owner = match owner.as_deref() {
                    None => format!("{0}:{0}", ctx.user),
                    Some(o) if o.contains(':') => o.to_owned(),
                    Some(o) => format!("{o}:{o}"),
                };
                copy_target = Some(CopyTarget {
                    dest: resolve_path(&ctx.workdir, dest),
                    dest_is_dir: dest.ends_with('/'),
                    owner,
                });
            }
            Step::Env { vars, .. } => {
                for (k, v) in vars {
                    ctx.env.insert(k.clone(), v.clone());
                }
            }
            Step::Workdir { path, .. } => ctx.workdir = resolve_path(&ctx.workdir, path),
            Step::User { name, .. } => {
                ctx.user = name.clone();
                user = name.clone();
            }
        }
        out.push(EffectiveStep {
            number: i + 1,
            user,
            workdir: ctx.workdir.clone(),
            env: ctx.env.clone(),
            copy_target,
            after: ctx.clone(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn fixtures(file: &str) -> Vec<Value> {
        let text = match file {
            "register" => include_str!("testdata/e2b_register_bodies.json"),
            _ => include_str!("testdata/e2b_start_bodies.json"),
        };
        let all: Vec<Value> = serde_json::from_str(text).unwrap();
        all.into_iter().map(|v| v["body"].clone()).collect()
    }

    #[test]
    fn every_captured_registration_body_round_trips() {
        let bodies = fixtures("register");
        assert_eq!(bodies.len(), 12);
        for body in bodies {
            let parsed: TemplateBuildRequestV3 = serde_json::from_value(body.clone()).unwrap();
            assert_eq!(serde_json::to_value(&parsed).unwrap(), body);
        }
    }

    #[test]
    fn every_captured_start_body_round_trips() {
        let bodies = fixtures("start");
        assert_eq!(bodies.len(), 12);
        for body in bodies {
            let parsed: TemplateBuildStartV2 =
                serde_json::from_value(body.clone()).unwrap_or_else(|e| panic!("{e}: {body}"));
            assert_eq!(serde_json::to_value(&parsed).unwrap(), body);
        }
    }

    #[test]
    fn name_tag_comes_first_then_tags_and_default_when_none() {
        let r: TemplateBuildRequestV3 = serde_json::from_value(
            json!({"name": "extras-one:v1", "tags": ["stable","latest"], "cpuCount": 2, "memoryMB": 1024}),
        )
        .unwrap();
        assert_eq!(r.name.name, "extras-one");
        let tags: Vec<_> = r.effective_tags().iter().map(|t| t.0.clone()).collect();
        assert_eq!(tags, ["v1", "stable", "latest"]);
        assert_eq!(r.resources.cpu_count, Some(2));

        let r: TemplateBuildRequestV3 =
            serde_json::from_value(json!({"name": "conformance-demo"})).unwrap();
        assert_eq!(r.effective_tags(), vec![Tag::default_tag()]);

        let r: TemplateBuildRequestV3 =
            serde_json::from_value(json!({"name": "a:v1", "tags": ["v1", "x"]})).unwrap();
        let tags: Vec<_> = r.effective_tags().iter().map(|t| t.0.clone()).collect();
        assert_eq!(tags, ["v1", "x"]);
    }

    #[test]
    fn namespaced_names_parse_and_invalid_names_say_why() {
        let (name, tag) = parse_name_and_tag("acme/web-app:prod").unwrap();
        assert_eq!(name.namespace.as_deref(), Some("acme"));
        assert_eq!(name.name, "web-app");
        assert_eq!(tag.unwrap().as_str(), "prod");
        assert_eq!(TemplateName::parse(" MyApp ").unwrap().name, "myapp");

        for bad in ["", "a/b/c", "-lead", "trail-", "sp ace", "a:", "x:-t", "/x"] {
            let err = serde_json::from_value::<TemplateBuildRequestV3>(json!({"name": bad}))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("invalid"),
                "{bad:?} should be rejected, got {err}"
            );
        }
        let err =
            serde_json::from_value::<TemplateBuildRequestV3>(json!({"name": "a", "cpuCount": 0}))
                .unwrap_err();
        assert!(err.to_string().contains("cpuCount"));
    }

    #[test]
    fn resources_over_the_ceilings_are_refused_naming_the_setting() {
        let ceilings = Ceilings {
            cpu_count: 4,
            memory_mb: 2048,
            disk_mb: Some(1024),
        };
        let asks = |cpu, mem| Resources {
            cpu_count: cpu,
            memory_mb: mem,
            min_free_disk_mb: None,
        };
        assert_eq!(ceilings.check(&asks(Some(4), Some(2048))), Ok(()));
        assert_eq!(
            ceilings.check(&asks(None, None)),
            Ok(()),
            "E2B's defaults fit"
        );
        let err = ceilings
            .check(&asks(Some(5), None))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "cpuCount 5 is more than this service gives one build: at most 4 (STRATA_BUILD_CPU_MAX)"
        );
        let err = ceilings
            .check(&asks(None, Some(4096)))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("memoryMB 4096") && err.contains("STRATA_BUILD_MEMORY_MAX"),
            "{err}"
        );
        // A ceiling under the defaults refuses a request that names nothing.
        let tiny = Ceilings {
            cpu_count: 1,
            memory_mb: 512,
            disk_mb: None,
        };
        assert!(tiny.check(&asks(None, None)).is_err());
        // minFreeDiskMb is held to the disk one build may write.
        let disk = |mb| Resources {
            min_free_disk_mb: Some(mb),
            ..asks(None, None)
        };
        assert_eq!(ceilings.check(&disk(1024)), Ok(()));
        let err = ceilings.check(&disk(1025)).unwrap_err().to_string();
        assert!(
            err.contains("minFreeDiskMb 1025") && err.contains("STRATA_BUILD_DISK_MAX"),
            "{err}"
        );
        let unbounded = Ceilings {
            disk_mb: None,
            ..ceilings
        };
        assert_eq!(unbounded.check(&disk(1 << 30)), Ok(()));
    }

    fn start(body: Value) -> Result<TemplateBuildStartV2, String> {
        serde_json::from_value(body).map_err(|e| e.to_string())
    }

    #[test]
    fn base_must_be_exactly_one_of_image_or_template() {
        assert!(start(json!({"steps": []}))
            .unwrap_err()
            .contains("exactly one base"));
        assert!(
            start(json!({"fromImage": "a", "fromTemplate": "b", "steps": []}))
                .unwrap_err()
                .contains("mutually exclusive")
        );
        assert!(start(json!({"fromTemplate": "b", "fromImageRegistry": {"type":"registry","username":"u","password":"p"}}))
            .unwrap_err()
            .contains("fromImage' only"));
        let s =
            start(json!({"fromTemplate": "extras-one:v1", "force": true, "steps": []})).unwrap();
        assert_eq!(
            s.base,
            BaseSource::Template {
                reference: "extras-one:v1".into()
            }
        );
    }

    #[test]
    fn copy_from_is_strata_s_extension_with_literal_absolute_sources() {
        let s = start(json!({"fromImage": "busybox", "steps": [
            {"type": "COPY_FROM", "args": ["app-build:v1", "/out/app", "/usr/local/bin/", "", "0755"]}
        ]}))
        .unwrap();
        assert_eq!(
            s.steps[0],
            Step::CopyFrom {
                template: "app-build:v1".into(),
                src: "/out/app".into(),
                dest: "/usr/local/bin/".into(),
                owner: None,
                mode: Some("0755".into()),
                force: false,
            }
        );
        assert!(s.steps[0].is_mutating());
        // Stored and read back unchanged.
        let back = Step::from_raw(1, s.steps[0].to_raw()).unwrap();
        assert_eq!(back, s.steps[0]);
        for (args, says) in [
            (
                json!(["t", "out/app", "/d", "", ""]),
                "literal absolute path",
            ),
            (json!(["t", "/out/*.so", "/d", "", ""]), "no globs"),
            (json!(["", "/out", "/d", "", ""]), "must not be empty"),
            (json!(["t", "/out", "/d", ""]), "exactly 5 args"),
            (json!(["t", "/out", "/d", "", "rwx"]), "octal"),
        ] {
            let err =
                start(json!({"fromImage": "a", "steps": [{"type": "COPY_FROM", "args": args}]}))
                    .unwrap_err();
            assert!(err.contains(says), "{args}: {err}");
        }
    }

    #[test]
    fn step_argument_rules_are_enforced_with_the_step_number() {
        let hash = "a".repeat(64);
        let cases = [
            (json!({"type": "RUN", "args": []}), "RUN"),
            (json!({"type": "RUN", "args": ["a", "b", "c"]}), "RUN"),
            (
                json!({"type": "COPY", "args": ["a", "b"], "filesHash": hash}),
                "exactly 4",
            ),
            (
                json!({"type": "COPY", "args": ["a", "b", "", ""]}),
                "filesHash",
            ),
            (
                json!({"type": "COPY", "args": ["a", "b", "", ""], "filesHash": "ABC"}),
                "64 lowercase",
            ),
            (
                json!({"type": "COPY", "args": ["a", "b", "", "rwx"], "filesHash": hash}),
                "octal",
            ),
            (json!({"type": "ENV", "args": ["A"]}), "pairs"),
            (json!({"type": "ENV", "args": ["1A", "x"]}), "variable name"),
            (
                json!({"type": "WORKDIR", "args": ["/a", "/b"]}),
                "exactly 1",
            ),
            (json!({"type": "USER", "args": ["u", "maybe"]}), "\"true\""),
            (json!({"type": "run", "args": ["x"]}), "upper case"),
            (
                json!({"type": "RUN", "args": ["x"], "filesHash": hash}),
                "COPY steps only",
            ),
        ];
        for (step, expected) in cases {
            let err =
                start(json!({"fromImage": "x", "steps": [{"type": "RUN", "args": ["ok"]}, step]}))
                    .unwrap_err();
            assert!(err.contains(expected), "{step}: {err}");
            assert!(err.contains("step 2"), "{step}: {err}");
        }
    }

    #[test]
    fn force_upload_implies_force_and_is_sent_only_when_set() {
        let hash = "b".repeat(64);
        let s = start(json!({"fromImage": "x", "steps": [
            {"type": "COPY", "args": ["a", "/b", "", ""], "filesHash": hash, "forceUpload": true, "force": true},
            {"type": "COPY", "args": ["a", "/b", "", ""], "filesHash": hash, "force": false},
        ]}))
        .unwrap();
        assert!(s.steps[0].force());
        let raw = serde_json::to_value(&s).unwrap();
        assert_eq!(raw["steps"][0]["forceUpload"], json!(true));
        assert!(raw["steps"][1].get("forceUpload").is_none());
        assert_eq!(s.referenced_hashes().len(), 1);
    }

    #[test]
    fn registry_credentials_never_print() {
        let s = start(json!({"fromImage": "r/x:1", "fromImageRegistry": {"type":"aws","awsAccessKeyId":"AKIA","awsSecretAccessKey":"s3cr3t","awsRegion":"eu"}, "steps": []}))
            .unwrap();
        let debug = format!("{s:?}");
        assert!(!debug.contains("s3cr3t"), "{debug}");
        assert!(debug.contains("<redacted>"));
    }

    #[test]
    fn request_digest_ignores_key_order_but_not_content() {
        let a = start(json!({"fromImage": "ubuntu:22.04", "force": false, "steps": [{"type": "RUN", "args": ["true"], "force": false}]})).unwrap();
        let b = start(json!({"steps": [{"force": false, "args": ["true"], "type": "RUN"}], "force": false, "fromImage": "ubuntu:22.04"})).unwrap();
        let c = start(json!({"fromImage": "ubuntu:22.04", "force": true, "steps": [{"type": "RUN", "args": ["true"], "force": false}]})).unwrap();
        assert_eq!(a.request_digest(), b.request_digest());
        assert_ne!(a.request_digest(), c.request_digest());
        // Joining args would make these equal; the canonical encoding keeps them apart.
        let d = start(
            json!({"fromImage": "x", "steps": [{"type": "ENV", "args": ["A", "b C", "D", "e"]}]}),
        )
        .unwrap();
        let e = start(
            json!({"fromImage": "x", "steps": [{"type": "ENV", "args": ["A", "b", "C", "D e"]}]}),
        );
        assert!(e.is_err() || d.request_digest() != e.unwrap().request_digest());
    }

    #[test]
    fn context_fold_follows_e2b_semantics() {
        let hash = "c".repeat(64);
        let s = start(json!({"fromImage": "x", "steps": [
            {"type": "RUN", "args": ["id"]},
            {"type": "RUN", "args": ["apt-get install -y curl", "root"]},
            {"type": "ENV", "args": ["A", "1", "B", "2"]},
            {"type": "WORKDIR", "args": ["app"]},
            {"type": "WORKDIR", "args": ["../srv/./x"]},
            {"type": "USER", "args": ["root"]},
            {"type": "COPY", "args": ["a.txt", "./", "", ""], "filesHash": hash},
            {"type": "COPY", "args": ["a.txt", "/etc/a", "node", "0644"], "filesHash": hash},
            {"type": "ENV", "args": ["A", "3"]},
        ]}))
        .unwrap();
        let steps = fold_contexts(&StepContext::after_default_user(), &s.steps);
        assert_eq!(steps[0].user, "user");
        assert_eq!(steps[0].workdir, "/home/user");
        assert_eq!(
            steps[1].user, "root",
            "RUN's override applies to its own step"
        );
        assert_eq!(steps[2].user, "user", "and does not persist");
        assert_eq!(steps[3].workdir, "/home/user/app");
        assert_eq!(steps[4].workdir, "/home/user/srv/x");
        assert_eq!(steps[5].after.user, "root");
        let copy = steps[6].copy_target.as_ref().unwrap();
        assert_eq!(copy.dest, "/home/user/srv/x");
        assert!(copy.dest_is_dir);
        assert_eq!(copy.owner, "root:root");
        assert_eq!(steps[7].copy_target.as_ref().unwrap().owner, "node:node");
        assert_eq!(steps[8].env["A"], "3");
        assert_eq!(steps[8].env["B"], "2");
        assert_eq!(steps[8].number, 9);
    }

    #[test]
    fn resolve_path_is_lexical() {
        assert_eq!(resolve_path("/", "a/b"), "/a/b");
        assert_eq!(resolve_path("/a/b", "../../.."), "/");
        assert_eq!(resolve_path("/a", "/x//y/"), "/x/y");
    }

    fn arb_step() -> impl Strategy<Value = Step> {
        let text = "[a-z /$.]{0,12}";
        let name = "[a-z][a-z0-9]{0,6}";
        prop_oneof![
            (text, proptest::option::of(name), any::<bool>()).prop_map(|(command, user, force)| {
                Step::Run {
                    command,
                    user,
                    force,
                }
            }),
            (
                "[a-z]{1,6}",
                "[a-z/]{1,6}",
                proptest::option::of(name),
                proptest::option::of("0[0-7]{3}"),
                "[0-9a-f]{64}",
                any::<bool>()
            )
                .prop_map(|(src, dest, owner, mode, hash, force_upload)| Step::Copy {
                    src,
                    dest,
                    owner,
                    mode,
                    files_hash: FilesHash::parse(&hash).unwrap(),
                    force: force_upload,
                    force_upload
                }),
            proptest::collection::vec(("[A-Z_][A-Z0-9_]{0,4}", text), 1..3)
                .prop_map(|vars| Step::Env { vars, force: false }),
            "[a-z./]{1,8}".prop_map(|path| Step::Workdir { path, force: false }),
            (name, proptest::option::of(any::<bool>())).prop_map(|(name, sudo)| Step::User {
                name,
                sudo,
                force: true
            }),
        ]
    }

    proptest! {
        #[test]
        fn valid_steps_round_trip_through_the_wire_form(steps in proptest::collection::vec(arb_step(), 0..6)) {
            let spec = TemplateBuildStartV2 { base: BaseSource::Image { reference: "x".into(), registry: None }, force: false, steps, start_cmd: None, ready_cmd: None };
            let json = serde_json::to_value(&spec).unwrap();
            let back: TemplateBuildStartV2 = serde_json::from_value(json).unwrap();
            prop_assert_eq!(back.request_digest(), spec.request_digest());
            prop_assert_eq!(back, spec);
        }

        #[test]
        fn different_specs_have_different_digests(a in proptest::collection::vec(arb_step(), 0..4), b in proptest::collection::vec(arb_step(), 0..4)) {
            prop_assume!(a != b);
            let mk = |steps| TemplateBuildStartV2 { base: BaseSource::Template { reference: "t".into() }, force: false, steps, start_cmd: None, ready_cmd: None };
            prop_assert_ne!(mk(a).request_digest(), mk(b).request_digest());
        }

        #[test]
        fn workdir_is_always_absolute_and_normalized(paths in proptest::collection::vec("[a-z./]{1,8}", 0..6)) {
            let steps: Vec<Step> = paths.into_iter().map(|path| Step::Workdir { path, force: false }).collect();
            for s in fold_contexts(&StepContext::after_default_user(), &steps) {
                prop_assert!(s.workdir.starts_with('/'));
                prop_assert!(!s.workdir.contains("//") && !s.workdir.contains("/./") && !s.workdir.contains("/../"));
            }
        }
    }
}
