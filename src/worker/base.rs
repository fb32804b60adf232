//! The base of a build (step `base`): an image (`fromImage`) from the node's catalog or, when the
//! catalog lacks it, pulled from its registry; or another template's build-base checkpoint
//! (`fromTemplate`: its steps, not what its start command did); as a layer stack and the command
//! context to start from.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::build_log::BuildLog;
use super::error::WorkerError;
use super::template_lookup::{self, Checkpoint, LookupError};
use crate::domain::build::BasePin;
use crate::domain::build_spec::{BaseSource, RegistryCredentials, StepContext};
use crate::domain::ids::{self, TeamId};
use crate::domain::image_ref::ImageRef;
use crate::domain::start::StartCommands;
use crate::events::EventStore;
use crate::registry::pull::ProgressFn;
use crate::registry::{credentials, PullError, Puller};
use crate::vmm::image::ImageCatalog;
use crate::vmm::VmmError;

#[derive(Debug, Clone)]
pub struct ResolvedBase {
    /// Bottom first.
    pub layers: Vec<ids::Digest>,
    /// The context before any user step. For an image: its config (root and `/` unless it says
    /// otherwise); the implicit default-user step comes after. For a template: its final context
    /// (finalization does not change it).
    pub context: StepContext,
    pub image_digest: Option<ids::Digest>,
    /// `fromTemplate` bases already have the default user; the implicit step is skipped.
    pub from_template: bool,
    /// For a base pulled from a registry: what its reference resolved to, to record once.
    pub pin: Option<BasePin>,
    /// The parent template's start and ready commands: a `fromTemplate` build that sets
    /// neither finalizes with these, in the parent's final context, as E2B does.
    pub inherited_start: Option<StartCommands>,
}

/// Why the base could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum BaseError {
    /// Fails the build at step `base` with this message.
    #[error("{0}")]
    Unavailable(String),
    #[error(transparent)]
    Worker(#[from] WorkerError),
}

/// How a registry base is reached: the node's puller, the build's credentials, its pin.
pub struct Registry<'a> {
    pub puller: &'a Puller,
    pub credentials: Result<Option<RegistryCredentials>, String>,
    /// The digest an earlier attempt of this build resolved the tag to.
    pub pin: Option<&'a BasePin>,
    pub log: &'a BuildLog,
}

pub async fn resolve(
    store: &EventStore,
    catalog: &ImageCatalog,
    registry: Registry<'_>,
    team: &TeamId,
    base: &BaseSource,
) -> Result<ResolvedBase, BaseError> {
    match base {
        BaseSource::Image { reference, .. } => {
            let parsed =
                ImageRef::parse(reference).map_err(|e| BaseError::Unavailable(format!("{e}")))?;
            let manifest = match catalog.get(reference) {
                Ok(m) => m,
                Err(VmmError::ImageNotFound(_)) => return pull(catalog, registry, &parsed).await,
                Err(e) => return Err(BaseError::Worker(e.into())),
            };
            Ok(from_catalog(&manifest))
        }
        BaseSource::Template { reference } => from_template(store, team, reference).await,
    }
}

/// The base as [`resolve`] would give it, from what this node and the database hold, without
/// pulling anything: `None` for an image this node's catalog lacks. For placement, which only
/// wants to know which layers a build would boot on.
pub async fn resolve_locally(
    store: &EventStore,
    catalog: &ImageCatalog,
    team: &TeamId,
    base: &BaseSource,
) -> Result<Option<ResolvedBase>, BaseError> {
    match base {
        BaseSource::Image { reference, .. } => match catalog.get(reference) {
            Ok(manifest) => Ok(Some(from_catalog(&manifest))),
            Err(VmmError::ImageNotFound(_)) => Ok(None),
            Err(e) => Err(BaseError::Worker(e.into())),
        },
        BaseSource::Template { reference } => from_template(store, team, reference).await.map(Some),
    }
}

/// An image of the node's catalog as a base.
fn from_catalog(manifest: &crate::vmm::image::ImageManifest) -> ResolvedBase {
    let env: BTreeMap<String, String> = manifest.config.env.iter().cloned().collect();
    ResolvedBase {
        layers: manifest.digests(),
        context: StepContext {
            user: manifest
                .config
                .user
                .clone()
                .unwrap_or_else(|| "root".into()),
            workdir: manifest
                .config
                .workdir
                .clone()
                .unwrap_or_else(|| "/".into()),
            env,
        },
        image_digest: Some(manifest.digest()),
        from_template: false,
        pin: None,
        inherited_start: None,
    }
}

/// Another template's build-base checkpoint as a base.
async fn from_template(
    store: &EventStore,
    team: &TeamId,
    reference: &str,
) -> Result<ResolvedBase, BaseError> {
    let found = template_lookup::resolve(store, team, reference, Checkpoint::BuildBase)
        .await
        .map_err(|e| match e {
            LookupError::NotFound(m) => BaseError::Unavailable(m),
            LookupError::Worker(w) => BaseError::Worker(w),
        })?;
    Ok(ResolvedBase {
        layers: found.record.layers.clone(),
        context: found.record.context.clone(),
        image_digest: found.record.base_image_digest,
        from_template: true,
        pin: None,
        inherited_start: StartCommands::of(
            found.record.start_cmd.as_deref(),
            found.record.ready_cmd.as_deref(),
        ),
    })
}

/// Pulls a base that is not in the node catalog. The context is what E2B starts an image
/// build with: root in `/`, and the image's ENV (entries with an empty name or value dropped,
/// names and values trimmed); the image's USER and WORKDIR are not applied (ADR 0014).
async fn pull(
    catalog: &ImageCatalog,
    registry: Registry<'_>,
    reference: &ImageRef,
) -> Result<ResolvedBase, BaseError> {
    let target = match registry.pin {
        Some(pin) => {
            registry.log.info(
                Some("base"),
                format!("[base] using {} as pinned by this build", pin.digest),
            );
            reference.pinned(pin.digest)
        }
        None => reference.clone(),
    };
    let credentials = match &registry.credentials {
        Ok(None) => None,
        Ok(Some(c)) => Some(
            credentials::basic_auth(registry.puller.http(), &reference.familiar(), c)
                .await
                .map_err(|e| {
                    BaseError::Unavailable(format!("pulling the base image failed: {e}"))
                })?,
        ),
        Err(why) => {
            return Err(BaseError::Unavailable(format!(
            "pulling the base image failed: the build's registry credentials cannot be read: {why}"
        )))
        }
    };
    let log = registry.log.clone();
    let progress: ProgressFn = Arc::new(move |p| log.info(Some("base"), format!("[base] {p}")));
    let (pulled, stats) = match registry
        .puller
        .pull(&target, credentials, Some(progress))
        .await
    {
        Ok(p) => p,
        Err(e) if e.is_node_fault() => {
            return Err(BaseError::Worker(WorkerError::Sandbox(match e {
                PullError::Store { source, .. } => source,
                _ => unreachable!("node faults are store errors"),
            })))
        }
        Err(e) => {
            let available = catalog
                .list()
                .map(|l| l.into_iter().map(|m| m.name).collect::<Vec<_>>().join(", "))
                .unwrap_or_default();
            let hint = match e {
                PullError::NotFound { .. } | PullError::Transport { .. } => format!(
                    " Images on this node: {}; `strata image pull REF` or `strata image import` adds one.",
                    if available.is_empty() { "none".into() } else { available }
                ),
                _ => String::new(),
            };
            return Err(BaseError::Unavailable(format!(
                "pulling the base image failed: {e}.{hint}"
            )));
        }
    };
    registry.log.info(
        Some("base"),
        format!(
            "[base] {} resolved to {} ({} layers, {} downloaded)",
            reference.familiar(),
            pulled.digest,
            pulled.layers.len(),
            stats.layers_downloaded
        ),
    );
    let env = pulled
        .config
        .env
        .iter()
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .filter(|(k, v)| !k.is_empty() && !v.is_empty())
        .collect();
    Ok(ResolvedBase {
        layers: pulled.layers.iter().map(|l| l.digest).collect(),
        context: StepContext {
            user: "root".into(),
            workdir: "/".into(),
            env,
        },
        image_digest: Some(pulled.digest),
        from_template: false,
        inherited_start: None,
        pin: Some(BasePin {
            reference: reference.unpinned().to_string(),
            digest: pulled.digest,
        }),
    })
}
