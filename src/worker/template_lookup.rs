//! From a template reference to the snapshot of its build: used by `fromTemplate` and by
//! `strata template export`.
//!
//! A reference is a name (looked up through the team's `templatename-{team}:{name}` claim) or a
//! template id, either with an optional `:tag`. The tag (default `default`) points at the build
//! that last became Ready with it (promotion assigns a build's tags when it makes the build
//! visible), and that build's result names the snapshot.

use super::error::WorkerError;
use crate::domain::build::Phase;
use crate::domain::build_spec::{parse_name_and_tag, Tag};
use crate::domain::ids::{self, BuildId, SnapshotId, TeamId, TemplateId};
use crate::domain::snapshot::SnapshotRecord;
use crate::events::command::load;
use crate::events::{EventStore, StreamId};
use crate::streams::{build_stream, snapshot_stream, Build, Snapshot, Template, TemplateName};

/// A template's current result.
#[derive(Debug, Clone)]
pub struct TemplateSnapshot {
    pub template: TemplateId,
    pub build: BuildId,
    pub snapshot: SnapshotId,
    pub record: SnapshotRecord,
}

#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    /// Shown to the user as the build's failure reason.
    #[error("{0}")]
    NotFound(String),
    #[error(transparent)]
    Worker(#[from] WorkerError),
}

fn stream(name: String) -> Result<StreamId, LookupError> {
    StreamId::parse(name)
        .map_err(|e| LookupError::NotFound(format!("invalid template reference: {e}")))
}

fn read_err<E: std::fmt::Display>(e: crate::events::CommandError<E>) -> LookupError {
    LookupError::Worker(WorkerError::store(e))
}

/// Resolves `reference` within `team` to the snapshot of its tagged Ready build.
pub async fn resolve(
    store: &EventStore,
    team: &TeamId,
    reference: &str,
) -> Result<TemplateSnapshot, LookupError> {
    let (name, tag) = parse_name_and_tag(reference)
        .map_err(|e| LookupError::NotFound(format!("template reference {reference:?}: {e}")))?;
    let tag = tag.unwrap_or_else(Tag::default_tag);
    if name
        .namespace
        .as_deref()
        .is_some_and(|ns| ns != team.as_str())
    {
        return Err(LookupError::NotFound(format!(
            "template {reference:?} does not exist in team {team}; a namespace names the \
             template's own team"
        )));
    }
    let claim = load::<TemplateName>(
        store,
        &stream(ids::stream::template_name(team, &name.name))?,
    )
    .await
    .map_err(read_err)?;
    let template = match claim.state.holder {
        Some(t) => t,
        None => TemplateId::parse(&name.name).map_err(|_| {
            LookupError::NotFound(format!(
                "template {reference:?} does not exist in team {team}; build it first"
            ))
        })?,
    };
    let tpl = load::<Template>(store, &stream(ids::stream::template(&template))?)
        .await
        .map_err(read_err)?
        .state;
    if tpl.team.as_ref() != Some(team) || tpl.deleted {
        return Err(LookupError::NotFound(format!(
            "template {reference:?} does not exist in team {team}; build it first"
        )));
    }
    let build = *tpl.tags.get(&tag).ok_or_else(|| {
        LookupError::NotFound(format!(
            "template {reference:?} has no ready build tagged {:?}; wait for its build to finish",
            tag.as_str()
        ))
    })?;
    let state = load::<Build>(store, &build_stream(&build))
        .await
        .map_err(read_err)?
        .state;
    let snapshot = match (&state.phase, &state.result) {
        (Phase::Ready { .. }, Some(result)) => result.candidate,
        _ => {
            return Err(LookupError::NotFound(format!(
                "build {build} of template {reference:?} is not ready"
            )))
        }
    };
    let record = load::<Snapshot>(store, &snapshot_stream(&snapshot))
        .await
        .map_err(read_err)?
        .state
        .record
        .ok_or_else(|| {
            LookupError::Worker(WorkerError::Corrupt {
                build,
                message: format!("its result snapshot {snapshot} has no record"),
            })
        })?;
    Ok(TemplateSnapshot {
        template,
        build,
        snapshot,
        record,
    })
}
