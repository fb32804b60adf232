//! One build as the inspectors see it: its stream's events (decoded, with their metadata and
//! commit times), the state they fold to, and its log lines. Loaded read-only from the event
//! store and `build_logs`; nothing here writes.

use chrono::{DateTime, Utc};

use crate::domain::build::{self, Event};
use crate::domain::ids::BuildId;
use crate::events::{EventStore, Metadata, ReadError};
use crate::projections::build_logs::{self, LogRow};
use crate::projections::builds;
use crate::streams::build_stream;

/// One decoded event of a build stream.
#[derive(Clone, Debug)]
pub struct BuildEvent {
    pub version: u64,
    pub recorded_at: DateTime<Utc>,
    pub metadata: Metadata,
    pub event: Event,
}

/// Everything the inspectors derive their answers from, for one build.
#[derive(Clone, Debug)]
pub struct BuildFacts {
    pub build: BuildId,
    pub events: Vec<BuildEvent>,
    pub state: build::State,
    pub logs: Vec<LogRow>,
    /// The pin the build's cache mode came from, when a pin chose it.
    pub mode_pin: Option<PinFacts>,
}

/// Who pinned a setting, where and when: the `SettingPinned` a build's resolution read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinFacts {
    /// `team acme` or `template web of team acme`.
    pub scope: String,
    /// `role/node` of whoever appended the pin.
    pub actor: String,
    pub at: DateTime<Utc>,
}

#[derive(Debug, thiserror::Error)]
pub enum FactsError {
    #[error("build {0} not found (no events in its stream); check the id with `strata history`")]
    NotFound(BuildId),
    #[error("reading build {build}'s events: {source}")]
    Read {
        build: BuildId,
        #[source]
        source: ReadError,
    },
    #[error("build {build}'s event at version {version} does not decode: {message}")]
    Decode {
        build: BuildId,
        version: u64,
        message: String,
    },
    #[error("reading from the database: {0}")]
    Database(#[from] sqlx::Error),
}

impl BuildFacts {
    /// Builds the facts from events and logs already read (pure; used by tests and loaders).
    pub fn new(build: BuildId, events: Vec<BuildEvent>, logs: Vec<LogRow>) -> Self {
        let state = build::replay(events.iter().map(|e| &e.event));
        Self {
            build,
            events,
            state,
            logs,
            mode_pin: None,
        }
    }

    /// The facts of the latest attempt's events only (progress, cache consultation).
    pub fn last_epoch(&self) -> Option<u64> {
        self.state.last_epoch.map(|e| e.0)
    }

    /// The cache consultation of the latest attempt that recorded one.
    pub fn consultation(&self) -> Option<&build::CacheConsultation> {
        self.events.iter().rev().find_map(|e| match &e.event {
            Event::CacheConsulted { consultation, .. } => Some(consultation),
            _ => None,
        })
    }

    /// When an event of this kind was last recorded.
    pub fn time_of(&self, pick: impl Fn(&Event) -> bool) -> Option<DateTime<Utc>> {
        self.events
            .iter()
            .rev()
            .find(|e| pick(&e.event))
            .map(|e| e.recorded_at)
    }
}

/// Reads one build's stream and logs.
pub async fn load(store: &EventStore, build: BuildId) -> Result<BuildFacts, FactsError> {
    let recorded = store
        .read_stream_all(&build_stream(&build))
        .await
        .map_err(|source| FactsError::Read { build, source })?;
    if recorded.is_empty() {
        return Err(FactsError::NotFound(build));
    }
    let mut events = Vec::with_capacity(recorded.len());
    for r in recorded {
        let event = r.decode::<Event>().map_err(|e| FactsError::Decode {
            build,
            version: r.version,
            message: e.to_string(),
        })?;
        events.push(BuildEvent {
            version: r.version,
            recorded_at: r.recorded_at,
            metadata: r.metadata,
            event,
        });
    }
    let logs = build_logs::lines_of(store.pool(), build).await?;
    let mut facts = BuildFacts::new(build, events, logs);
    facts.mode_pin = mode_pin(store, &facts).await?;
    Ok(facts)
}

/// The pin a build's cache mode resolved from: the last `cache.mode` pin of the level it
/// resolved at, recorded before the mode was (a later pin did not choose it).
async fn mode_pin(store: &EventStore, facts: &BuildFacts) -> Result<Option<PinFacts>, FactsError> {
    use crate::domain::cache_mode::Level;
    use crate::domain::settings::{self, SettingsScope, CACHE_MODE};
    let (Some(resolved), Some(reg)) = (&facts.state.cache_mode, &facts.state.registration) else {
        return Ok(None);
    };
    let scope = match resolved.level {
        Level::Team => SettingsScope::Team(reg.team.clone()),
        Level::Template => SettingsScope::Template(reg.team.clone(), reg.template.clone()),
        Level::Service | Level::Default => return Ok(None),
    };
    let Some(resolved_at) = facts.time_of(|e| matches!(e, Event::CacheModeResolved { .. })) else {
        return Ok(None);
    };
    let recorded = store
        .read_stream_all(&crate::streams::settings_stream(&scope))
        .await
        .map_err(|source| FactsError::Read {
            build: facts.build,
            source,
        })?;
    let pin = recorded.iter().rev().find(|r| {
        r.recorded_at <= resolved_at
            && matches!(r.decode::<settings::Event>(),
                Ok(settings::Event::SettingPinned { key, .. }) if key == CACHE_MODE)
    });
    Ok(pin.map(|r| PinFacts {
        scope: scope.to_string(),
        actor: format!(
            "{}/{}",
            r.metadata.actor.role.as_str(),
            r.metadata.actor.node
        ),
        at: r.recorded_at,
    }))
}

/// The builds of the same template registered before `facts`' build, newest first (at most
/// `limit`): the candidates `why` compares cache keys against.
pub async fn earlier_builds(
    store: &EventStore,
    facts: &BuildFacts,
    limit: i64,
) -> Result<Vec<BuildFacts>, FactsError> {
    let Some(reg) = &facts.state.registration else {
        return Ok(Vec::new());
    };
    let ids = builds::builds_of_template_before(
        store.pool(),
        &reg.template,
        facts.build,
        reg.registered_at,
        limit,
    )
    .await?;
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        out.push(load(store, id).await?);
    }
    Ok(out)
}
