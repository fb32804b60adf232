//! Reads the [`Inventory`] a pass classifies: every stream that can reference a stored object,
//! in one statement (one snapshot of the store), folded with the aggregates' own `evolve`.

use crate::domain::cache_key::CacheKey;
use crate::domain::ids::{self, BuildId, Digest, Scope, SnapshotId, TeamId, TemplateId};
use crate::domain::reachability::{CacheKeyState, Inventory};
use crate::domain::sandbox::SandboxId;
use crate::domain::snapshot;
use crate::events::{Aggregate, DomainEvent, EventStore, RecordedEvent};
use crate::streams::{
    Build, CacheEntry, Files, NodeCatalog, Object, SandboxStream, Snapshot, Template,
};

use super::super::ReconcileError;

/// The stream categories whose events reference objects.
const CATEGORIES: [&str; 8] = [
    "template", "build", "snapshot", "cachekey", "files", "object", "catalog", "sandbox",
];

pub async fn read(store: &EventStore) -> Result<Inventory, ReconcileError> {
    let events = store.read_categories(&CATEGORIES).await?;
    let mut inventory = Inventory::default();
    let mut start = 0;
    while start < events.len() {
        let stream = events[start].stream_id.as_str().to_owned();
        let end = start
            + events[start..]
                .iter()
                .take_while(|e| e.stream_id.as_str() == stream)
                .count();
        add_stream(&mut inventory, &stream, &events[start..end])?;
        start = end;
    }
    Ok(inventory)
}

fn fold<A: Aggregate>(events: &[RecordedEvent]) -> Result<A::State, ReconcileError> {
    let mut state = A::State::default();
    for e in events {
        state = A::evolve(
            state,
            &A::Event::decode(e).map_err(|e| ReconcileError::Store(e.to_string()))?,
        );
    }
    Ok(state)
}

fn malformed(stream: &str) -> ReconcileError {
    ReconcileError::Store(format!(
        "stream {stream:?} does not name what its category says; the pass deletes nothing"
    ))
}

fn add_stream(
    inv: &mut Inventory,
    stream: &str,
    events: &[RecordedEvent],
) -> Result<(), ReconcileError> {
    let (category, parts) = ids::stream::decode(stream).ok_or_else(|| malformed(stream))?;
    let one = |parts: &[String]| -> Result<String, ReconcileError> {
        match parts {
            [only] => Ok(only.clone()),
            _ => Err(malformed(stream)),
        }
    };
    match category.as_str() {
        "template" => {
            let id = TemplateId::parse(&one(&parts)?).map_err(|_| malformed(stream))?;
            inv.templates.insert(id, fold::<Template>(events)?);
        }
        "build" => {
            let id = BuildId::parse(&one(&parts)?).map_err(|_| malformed(stream))?;
            inv.builds.insert(id, fold::<Build>(events)?);
        }
        "snapshot" => {
            let id = SnapshotId::parse(&one(&parts)?).map_err(|_| malformed(stream))?;
            let state: snapshot::State = fold::<Snapshot>(events)?;
            if let (Some(record), false) = (state.record, state.tombstoned) {
                inv.snapshots.insert(id, record);
            }
        }
        "cachekey" => {
            let [scope, key] = parts.as_slice() else {
                return Err(malformed(stream));
            };
            let team = TeamId::parse(scope).map_err(|_| malformed(stream))?;
            let key = Digest::from_hex(key).map_err(|_| malformed(stream))?;
            inv.cache_keys.push(CacheKeyState {
                scope: Scope::team(&team),
                key: CacheKey(key),
                state: fold::<CacheEntry>(events)?,
            });
        }
        "files" => inv.files.push(fold::<Files>(events)?),
        "sandbox" => {
            let id = SandboxId::parse(&one(&parts)?).map_err(|_| malformed(stream))?;
            inv.sandboxes.insert(id, fold::<SandboxStream>(events)?);
        }
        "object" => {
            let digest = Digest::from_hex(&one(&parts)?).map_err(|_| malformed(stream))?;
            inv.objects.insert(digest, fold::<Object>(events)?);
        }
        // Every node's published image catalog: base layers nothing can fetch again.
        "catalog" => {
            let node = one(&parts)?;
            let state = fold::<NodeCatalog>(events)?;
            for image in state.images {
                for digest in image.digests {
                    inv.pinned.entry(digest).or_insert_with(|| {
                        format!("image {} in node {node}'s catalog", image.name)
                    });
                }
            }
        }
        _ => {}
    }
    Ok(())
}
