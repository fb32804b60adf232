//! The base of a build (step `base`): an image from the node's catalog (`fromImage`) or another
//! template's result (`fromTemplate`), as a layer stack and the command context to start from.

use std::collections::BTreeMap;

use super::error::WorkerError;
use super::template_lookup::{self, LookupError};
use crate::domain::build_spec::{BaseSource, CommandContext};
use crate::domain::ids::{self, TeamId};
use crate::domain::start::StartCommands;
use crate::events::EventStore;
use crate::vmm::image::ImageCatalog;
use crate::vmm::{Digest, VmmError};

#[derive(Debug, Clone)]
pub struct ResolvedBase {
    /// Bottom first.
    pub layers: Vec<Digest>,
    /// The context before any user step. For an image: its config (root and `/` unless it says
    /// otherwise); the implicit default-user step comes after. For a template: its final context.
    pub context: CommandContext,
    pub image_digest: Option<ids::Digest>,
    /// `fromTemplate` bases already have the default user; the implicit step is skipped.
    pub from_template: bool,
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

pub fn to_vmm(d: &ids::Digest) -> Digest {
    Digest::parse(&d.to_string()).expect("a domain digest is a valid sha256 digest")
}

pub fn to_domain(d: &Digest) -> ids::Digest {
    ids::Digest::parse(&d.to_string()).expect("a sha256 digest is a valid domain digest")
}

pub async fn resolve(
    store: &EventStore,
    catalog: &ImageCatalog,
    team: &TeamId,
    base: &BaseSource,
) -> Result<ResolvedBase, BaseError> {
    match base {
        BaseSource::Image { reference, .. } => {
            let manifest = match catalog.get(reference) {
                Ok(m) => m,
                Err(VmmError::ImageNotFound(_)) => {
                    let available = catalog
                        .list()
                        .map_err(WorkerError::from)?
                        .into_iter()
                        .map(|m| m.name)
                        .collect::<Vec<_>>();
                    return Err(BaseError::Unavailable(format!(
                        "base image {reference:?} is not available on this build node; available images: {}. Use one of them, or import the image with `strata image import`",
                        if available.is_empty() { "none".to_owned() } else { available.join(", ") }
                    )));
                }
                Err(e) => return Err(BaseError::Worker(e.into())),
            };
            let env: BTreeMap<String, String> = manifest.config.env.iter().cloned().collect();
            Ok(ResolvedBase {
                layers: manifest.digests(),
                context: CommandContext {
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
                image_digest: Some(to_domain(&manifest.digest())),
                from_template: false,
                inherited_start: None,
            })
        }
        BaseSource::Template { reference } => {
            let found = template_lookup::resolve(store, team, reference)
                .await
                .map_err(|e| match e {
                    LookupError::NotFound(m) => BaseError::Unavailable(m),
                    LookupError::Worker(w) => BaseError::Worker(w),
                })?;
            Ok(ResolvedBase {
                layers: found.record.layers.iter().map(to_vmm).collect(),
                context: found.record.context.clone(),
                image_digest: found.record.base_image_digest,
                from_template: true,
                inherited_start: StartCommands::of(
                    found.record.start_cmd.as_deref(),
                    found.record.ready_cmd.as_deref(),
                ),
            })
        }
    }
}
