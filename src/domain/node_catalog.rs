//! A node's image catalog as the cluster sees it: the `catalog-{node}` aggregate.
//!
//! Base images live in a node's own catalog (`images/` in its data directory), but their layers
//! live in the shared blob store, and nothing can fetch a built-in base again: garbage collection
//! must root every layer any node's catalog names, whichever node runs the pass (ADR 0019). Each
//! node publishes its catalog when it starts and whenever it changes; the last publication is
//! what the node holds. A node that is gone keeps its catalog rooted: failing closed keeps bytes.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::ids::Digest;

/// One image of the catalog: its name and every blob it needs (layers, license notice).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct CatalogImage {
    pub name: String,
    pub digests: Vec<Digest>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    pub node: Option<String>,
    pub images: Vec<CatalogImage>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    Publish {
        node: String,
        images: Vec<CatalogImage>,
        now: DateTime<Utc>,
    },
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "type")]
pub enum Event {
    #[serde(rename = "NodeCatalogPublished.v1")]
    Published {
        node: String,
        images: Vec<CatalogImage>,
        at: DateTime<Utc>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {}

/// Publishes the catalog when it differs from the last publication (in any order).
pub fn decide(state: &State, command: &Command) -> Result<Vec<Event>, Error> {
    let Command::Publish { node, images, now } = command;
    let mut images = images.clone();
    images.sort();
    if state.node.as_deref() == Some(node.as_str()) && state.images == images {
        return Ok(vec![]);
    }
    Ok(vec![Event::Published {
        node: node.clone(),
        images,
        at: *now,
    }])
}

pub fn evolve(mut state: State, event: &Event) -> State {
    let Event::Published { node, images, .. } = event;
    state.node = Some(node.clone());
    state.images = images.clone();
    state
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(name: &str, seed: &str) -> CatalogImage {
        CatalogImage {
            name: name.into(),
            digests: vec![Digest::of(seed.as_bytes())],
        }
    }

    #[test]
    fn only_a_changed_catalog_is_published_again() {
        let now = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let publish = |images: Vec<CatalogImage>| Command::Publish {
            node: "worker-1".into(),
            images,
            now,
        };
        let first = decide(
            &State::default(),
            &publish(vec![image("b", "2"), image("a", "1")]),
        )
        .unwrap();
        let state = first.iter().fold(State::default(), evolve);
        assert_eq!(state.images, vec![image("a", "1"), image("b", "2")]);
        assert_eq!(
            decide(&state, &publish(vec![image("a", "1"), image("b", "2")])),
            Ok(vec![])
        );
        let changed = decide(&state, &publish(vec![image("a", "1")])).unwrap();
        assert_eq!(
            changed.iter().fold(state, evolve).images,
            vec![image("a", "1")]
        );
    }
}
