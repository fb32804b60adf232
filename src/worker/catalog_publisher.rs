//! Publishes the node's image catalog to the cluster (`domain/node_catalog.rs`) when the node
//! starts and whenever the catalog changes, so that garbage collection on any node, with any
//! data directory, roots the base layers this node's catalog names.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::app;
use crate::domain::node_catalog::CatalogImage;
use crate::events::{Actor, ActorRole, CommandContext, EventStore, Metadata};
use crate::vmm::image::ImageCatalog;

/// The catalog's images as published: every blob each one needs, sorted.
fn current(catalog: &ImageCatalog) -> crate::vmm::error::Result<Vec<CatalogImage>> {
    let mut images: Vec<CatalogImage> = catalog
        .list()?
        .into_iter()
        .map(|m| CatalogImage {
            name: m.name.clone(),
            digests: m.digests().into_iter().chain(m.license_notice).collect(),
        })
        .collect();
    images.sort();
    Ok(images)
}

/// Publishes now, then checks every `every` until `stop`.
pub async fn run(
    store: EventStore,
    node: String,
    catalog: Arc<ImageCatalog>,
    every: Duration,
    stop: CancellationToken,
) {
    let mut published: Option<Vec<CatalogImage>> = None;
    loop {
        match current(&catalog) {
            Ok(images) if published.as_ref() != Some(&images) => {
                let ctx = CommandContext::new(Metadata::new(Actor::new(ActorRole::Worker, &node)));
                match app::catalog::publish_catalog(&store, &ctx, &node, images.clone()).await {
                    Ok(()) => {
                        tracing::info!(node = %node, images = images.len(), "published the node's image catalog");
                        published = Some(images);
                    }
                    Err(e) => {
                        tracing::warn!(node = %node, error = %e, "could not publish the node's image catalog; retrying")
                    }
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(node = %node, error = %e, "could not read the node's image catalog")
            }
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(every) => {}
        }
    }
}
