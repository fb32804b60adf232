//! A node's image catalog published to the cluster (`domain/node_catalog.rs`), so garbage
//! collection on any node roots the layers every node's catalog names.

use super::{CommandContext, Error};
use crate::events::command::load;
use crate::events::{CommandError, EventStore};
use crate::streams::database_now;

/// Publishes `node`'s image catalog (`domain/node_catalog.rs`) when it changed since the last
/// publication, so that garbage collection on any node roots its layers.
pub async fn publish_catalog(
    store: &EventStore,
    ctx: &CommandContext,
    node: &str,
    images: Vec<crate::domain::node_catalog::CatalogImage>,
) -> Result<(), Error<crate::domain::node_catalog::Error>> {
    use crate::domain::node_catalog;
    use crate::streams::{node_catalog_stream, NodeCatalog};
    let stream = node_catalog_stream(node);
    let (stream, images) = (&stream, &images);
    crate::events::command::execute_writes(store, 8, move || async move {
        let now = database_now(store.pool()).await?;
        let loaded = load::<NodeCatalog>(store, stream).await?;
        let events = node_catalog::decide(
            &loaded.state,
            &node_catalog::Command::Publish {
                node: node.to_owned(),
                images: images.clone(),
                now,
            },
        )
        .map_err(CommandError::Rejected)?;
        Ok(vec![ctx.write(stream, loaded.expected(), &events)?])
    })
    .await?;
    Ok(())
}
