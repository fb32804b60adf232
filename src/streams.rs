//! The domain's state machines bound to their streams: one [`Aggregate`] adapter per stream
//! kind, and the stream ids built from validated domain ids.
//!
//! The application layer ([`crate::app`]) loads with [`crate::events::command::load`], calls
//! the domain's pure `decide`, and appends; these adapters are the only place that says which
//! `evolve` folds which stream.

use chrono::{DateTime, Utc};

use crate::domain::cache_key::CacheKey;
use crate::domain::ids::{
    self, BuildId, Digest, Epoch, FilesHash, Scope, SnapshotId, TeamId, TemplateId,
};
use crate::domain::{
    build, cache_entry, files, gc_pass, node_catalog, object, promotion, sandbox, settings,
    snapshot, team, template,
};
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
pub fn object_stream(digest: &Digest) -> StreamId {
    id(ids::stream::object(digest))
}

pub fn node_catalog_stream(node: &str) -> StreamId {
    id(ids::stream::node_catalog(node))
}

pub fn sandbox_stream(sandbox: &sandbox::SandboxId) -> StreamId {
    id(ids::stream::sandbox(sandbox))
}

pub fn settings_stream(scope: &settings::SettingsScope) -> StreamId {
    id(ids::stream::settings(scope))
}

pub fn gc_pass_stream(pass: &str) -> StreamId {
    id(ids::stream::gc_pass(pass))
}

/// Binds a domain module's `State`, `Event`, `Command`, `Error`, `evolve` and `decide` to a
/// stream kind: the adapters are this one line each.
macro_rules! aggregate {
    ($(#[$doc:meta])* $name:ident => $module:ident) => {
        $(#[$doc])*
        pub struct $name;
        impl Aggregate for $name {
            type State = $module::State;
            type Event = $module::Event;
            type Command = $module::Command;
            type Error = $module::Error;
            fn evolve(state: Self::State, event: &Self::Event) -> Self::State {
                $module::evolve(state, event)
            }
            fn decide(
                state: &Self::State,
                command: &Self::Command,
            ) -> Result<Vec<Self::Event>, Self::Error> {
                $module::decide(state, command)
            }
        }
    };
}

aggregate!(Build => build);
aggregate!(Template => template);
aggregate!(Files => files);
aggregate!(Team => team);
aggregate!(Promotion => promotion);
aggregate!(Snapshot => snapshot);
aggregate!(CacheEntry => cache_entry);
aggregate!(Object => object);
aggregate!(GcPass => gc_pass);
aggregate!(NodeCatalog => node_catalog);
aggregate!(
    /// `settings-team:{team}` or `settings-template:{team}:{template}`: pinned settings.
    Settings => settings
);
aggregate!(
    /// `sandbox-{id}`: a launched template.
    SandboxStream => sandbox
);

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

/// The database's clock: leases and deadlines are judged by one clock for every node.
pub async fn database_now(pool: &sqlx::PgPool) -> Result<DateTime<Utc>, sqlx::Error> {
    sqlx::query_scalar("SELECT now()").fetch_one(pool).await
}
