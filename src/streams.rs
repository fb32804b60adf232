//! The domain's state machines bound to their streams: one [`Aggregate`] adapter per stream
//! kind, and the stream ids built from validated domain ids.
//!
//! Handlers, workers and reconcilers load with [`crate::events::command::load`], call the
//! domain's pure `decide`, and append; these adapters are the only place that says which
//! `evolve` folds which stream.

use chrono::{DateTime, Utc};

use crate::domain::cache_key::CacheKey;
use crate::domain::ids::{self, BuildId, Epoch, FilesHash, Scope, SnapshotId, TeamId, TemplateId};
use crate::domain::{build, cache_entry, files, promotion, snapshot, team, template};
use crate::events::{Aggregate, StreamId};

/// A stream id from a name built by [`ids::stream`]: those are valid by construction.
fn id(name: String) -> StreamId {
    StreamId::parse(name).expect("stream names built from validated ids are valid")
}

pub fn build_stream(build: &BuildId) -> StreamId {
    id(ids::stream::build(build))
}
pub fn template_stream(template: &TemplateId) -> StreamId {
    id(ids::stream::template(template))
}
pub fn template_name_stream(team: &TeamId, name: &str) -> StreamId {
    id(ids::stream::template_name(team, name))
}
pub fn files_stream(scope: &Scope, hash: &FilesHash) -> StreamId {
    id(ids::stream::files(scope, hash))
}
pub fn team_stream(team: &TeamId) -> StreamId {
    id(ids::stream::team(team))
}
pub fn snapshot_stream(snapshot: &SnapshotId) -> StreamId {
    id(ids::stream::snapshot(snapshot))
}
pub fn promotion_stream(build: &BuildId, epoch: Epoch) -> StreamId {
    id(ids::stream::promotion(build, epoch))
}
pub fn cache_key_stream(scope: &Scope, key: &CacheKey) -> StreamId {
    id(ids::stream::cache_key(scope, &key.0))
}

pub struct Build;
impl Aggregate for Build {
    type State = build::State;
    type Event = build::Event;
    type Command = build::Command;
    type Error = build::Error;
    fn evolve(state: Self::State, event: &Self::Event) -> Self::State {
        build::evolve(state, event)
    }
    fn decide(
        state: &Self::State,
        command: &Self::Command,
    ) -> Result<Vec<Self::Event>, Self::Error> {
        build::decide(state, command)
    }
}

pub struct Template;
impl Aggregate for Template {
    type State = template::State;
    type Event = template::Event;
    type Command = template::Command;
    type Error = template::Error;
    fn evolve(state: Self::State, event: &Self::Event) -> Self::State {
        template::evolve(state, event)
    }
    fn decide(
        state: &Self::State,
        command: &Self::Command,
    ) -> Result<Vec<Self::Event>, Self::Error> {
        template::decide(state, command)
    }
}

/// The name claim: its command is the candidate template id for an unclaimed name.
pub struct TemplateName;
impl Aggregate for TemplateName {
    type State = template::NameState;
    type Event = template::NameEvent;
    type Command = TemplateId;
    type Error = std::convert::Infallible;
    fn evolve(state: Self::State, event: &Self::Event) -> Self::State {
        template::evolve_name(state, event)
    }
    fn decide(
        state: &Self::State,
        candidate: &TemplateId,
    ) -> Result<Vec<Self::Event>, Self::Error> {
        Ok(template::decide_name(state, candidate).1)
    }
}

pub struct Files;
impl Aggregate for Files {
    type State = files::State;
    type Event = files::Event;
    type Command = files::Command;
    type Error = files::Error;
    fn evolve(state: Self::State, event: &Self::Event) -> Self::State {
        files::evolve(state, event)
    }
    fn decide(
        state: &Self::State,
        command: &Self::Command,
    ) -> Result<Vec<Self::Event>, Self::Error> {
        files::decide(state, command)
    }
}

pub struct Team;
impl Aggregate for Team {
    type State = team::State;
    type Event = team::Event;
    type Command = team::Command;
    type Error = team::Error;
    fn evolve(state: Self::State, event: &Self::Event) -> Self::State {
        team::evolve(state, event)
    }
    fn decide(
        state: &Self::State,
        command: &Self::Command,
    ) -> Result<Vec<Self::Event>, Self::Error> {
        team::decide(state, command)
    }
}

pub struct Promotion;
impl Aggregate for Promotion {
    type State = promotion::State;
    type Event = promotion::Event;
    type Command = promotion::Command;
    type Error = promotion::Error;
    fn evolve(state: Self::State, event: &Self::Event) -> Self::State {
        promotion::evolve(state, event)
    }
    fn decide(
        state: &Self::State,
        command: &Self::Command,
    ) -> Result<Vec<Self::Event>, Self::Error> {
        promotion::decide(state, command)
    }
}

pub struct Snapshot;
impl Aggregate for Snapshot {
    type State = snapshot::State;
    type Event = snapshot::Event;
    type Command = snapshot::Command;
    type Error = snapshot::Error;
    fn evolve(state: Self::State, event: &Self::Event) -> Self::State {
        snapshot::evolve(state, event)
    }
    fn decide(
        state: &Self::State,
        command: &Self::Command,
    ) -> Result<Vec<Self::Event>, Self::Error> {
        snapshot::decide(state, command)
    }
}

pub struct CacheEntry;
impl Aggregate for CacheEntry {
    type State = cache_entry::State;
    type Event = cache_entry::Event;
    type Command = cache_entry::Command;
    type Error = cache_entry::Error;
    fn evolve(state: Self::State, event: &Self::Event) -> Self::State {
        cache_entry::evolve(state, event)
    }
    fn decide(
        state: &Self::State,
        command: &Self::Command,
    ) -> Result<Vec<Self::Event>, Self::Error> {
        cache_entry::decide(state, command)
    }
}

/// The database's clock: leases and deadlines are judged by one clock for every node.
pub async fn database_now(pool: &sqlx::PgPool) -> Result<DateTime<Utc>, sqlx::Error> {
    sqlx::query_scalar("SELECT now()").fetch_one(pool).await
}
