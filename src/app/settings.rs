//! Pinned settings of a team or a template: pin, unpin, read, and what a build's cache mode
//! resolves to at start.
//!
//! Rules and events: `domain/settings.rs` (`Pin` → `SettingPinned`, `Unpin` →
//! `SettingUnpinned`) on `settings-{scope}` streams; no read model: a start reads the two
//! streams of its build's team and template, each a handful of events.

use chrono::{DateTime, Utc};

use super::{CommandContext, Error};
use crate::domain::backend_name::{self, ResolvedBackend};
use crate::domain::cache_mode::{self, ResolvedMode};
use crate::domain::ids::{TeamId, TemplateId};
use crate::domain::setting_levels::LevelValues;
use crate::domain::settings::{self, SettingsScope, CACHE_MODE, SANDBOX_BACKEND};
use crate::events::command::{execute, load};
use crate::events::{CommandError, EventStore};
use crate::streams::{settings_stream, template_name_stream, Settings, TemplateName};

/// Why a scope named by an operator is not one.
#[derive(Debug, thiserror::Error)]
pub enum ScopeError {
    #[error("team name {name:?}: {reason}")]
    Team { name: String, reason: String },
    #[error("team {team} has no template named {name:?} (build it first, or check the name)")]
    NoTemplate { team: TeamId, name: String },
    #[error(transparent)]
    Store(#[from] CommandError<settings::Error>),
}

/// The scope `team` (and, when given, its template called `template`, with or without a
/// `:tag`) names, as the CLI and the operator API take it.
pub async fn scope_of(
    store: &EventStore,
    team: &str,
    template: Option<&str>,
) -> Result<SettingsScope, ScopeError> {
    let team = TeamId::parse(team).map_err(|e| ScopeError::Team {
        name: team.to_owned(),
        reason: e.to_string(),
    })?;
    let Some(name) = template else {
        return Ok(SettingsScope::Team(team));
    };
    let name = name.split_once(':').map_or(name, |(n, _)| n);
    let holder = load::<TemplateName>(store, &template_name_stream(&team, name))
        .await
        .map_err(|e| ScopeError::Store(e.into_other()))?
        .state
        .holder;
    match holder {
        Some(template) => Ok(SettingsScope::Template(team, template)),
        None => Err(ScopeError::NoTemplate {
            team,
            name: name.to_owned(),
        }),
    }
}

/// The pins a build of `scope` started now resolves its settings over.
pub async fn pins_in(
    store: &EventStore,
    scope: &SettingsScope,
) -> Result<PinsInForce, CommandError<settings::Error>> {
    match scope {
        SettingsScope::Team(team) => PinsInForce::read(store, team, None).await,
        SettingsScope::Template(team, template) => {
            PinsInForce::read(store, team, Some(template)).await
        }
    }
}

/// Pins `key` to `value` for `scope`; pinning the value it has already changes nothing.
pub async fn pin(
    store: &EventStore,
    ctx: &CommandContext,
    scope: &SettingsScope,
    key: &str,
    value: &str,
    now: DateTime<Utc>,
) -> Result<(), Error<settings::Error>> {
    let command = settings::Command::Pin {
        key: key.to_owned(),
        value: value.to_owned(),
        now,
    };
    execute::<Settings>(store, &settings_stream(scope), &command, ctx).await?;
    Ok(())
}

/// Removes the pin of `key` for `scope`, if there is one.
pub async fn unpin(
    store: &EventStore,
    ctx: &CommandContext,
    scope: &SettingsScope,
    key: &str,
    now: DateTime<Utc>,
) -> Result<(), Error<settings::Error>> {
    let command = settings::Command::Unpin {
        key: key.to_owned(),
        now,
    };
    execute::<Settings>(store, &settings_stream(scope), &command, ctx).await?;
    Ok(())
}

/// The pins of `scope`.
pub async fn read(
    store: &EventStore,
    scope: &SettingsScope,
) -> Result<settings::State, CommandError<settings::Error>> {
    Ok(load::<Settings>(store, &settings_stream(scope))
        .await?
        .state)
}

/// The pins a build of `template` in `team` resolves its settings over (each stream read once).
pub struct PinsInForce {
    template: settings::State,
    team: settings::State,
}

impl PinsInForce {
    /// The pins of `team` and of its `template` (of no template of the team, when `None`).
    pub async fn read(
        store: &EventStore,
        team: &TeamId,
        template: Option<&TemplateId>,
    ) -> Result<PinsInForce, CommandError<settings::Error>> {
        let template = match template {
            Some(t) => read(store, &SettingsScope::Template(team.clone(), t.clone())).await?,
            None => settings::State::default(),
        };
        let team = read(store, &SettingsScope::Team(team.clone())).await?;
        Ok(PinsInForce { template, team })
    }

    /// The pins of `scope` itself (the template's for a template scope, else the team's).
    pub fn own(&self, scope: &SettingsScope) -> &settings::State {
        match scope {
            SettingsScope::Team(_) => &self.team,
            SettingsScope::Template(..) => &self.template,
        }
    }

    fn values(&self, key: &str, service: Option<&str>) -> LevelValues {
        let value = |s: &settings::State| s.pins.get(key).map(|p| p.value.clone());
        LevelValues {
            template: value(&self.template),
            team: value(&self.team),
            service: service.map(str::to_owned),
        }
    }

    /// The cache mode: the template's pin, the team's, the service's setting, the default.
    pub fn cache_mode(&self, service: Option<&str>) -> ResolvedMode {
        cache_mode::resolve(&self.values(CACHE_MODE, service))
    }

    /// The sandbox backend, resolved the same way.
    pub fn sandbox_backend(&self, service: Option<&str>) -> ResolvedBackend {
        backend_name::resolve(&self.values(SANDBOX_BACKEND, service))
    }
}

/// A pin in force, with who pinned it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinInForce {
    pub scope: SettingsScope,
    pub key: String,
    pub value: String,
    pub pinned_at: DateTime<Utc>,
    /// `role/node` of the append that pinned it.
    pub by: String,
}

/// Every pin in force, of every team and template (the settings streams hold only pins, a few
/// events each), ordered by scope and key.
pub async fn all_pins(store: &EventStore) -> Result<Vec<PinInForce>, crate::events::ReadError> {
    use crate::domain::ids::stream;
    let events = store.read_categories(&["settings"]).await?;
    let mut pins: std::collections::BTreeMap<(String, String), PinInForce> = Default::default();
    for e in &events {
        let Some((_, parts)) = stream::decode(e.stream_id.as_str()) else {
            continue;
        };
        let scope = match parts.as_slice() {
            [kind, team] if kind == "team" => TeamId::parse(team).ok().map(SettingsScope::Team),
            [kind, team, template] if kind == "template" => TeamId::parse(team)
                .ok()
                .zip(TemplateId::parse(template).ok())
                .map(|(team, template)| SettingsScope::Template(team, template)),
            _ => None,
        };
        let (Some(scope), Ok(event)) = (scope, e.decode::<settings::Event>()) else {
            continue;
        };
        match event {
            settings::Event::SettingPinned {
                key,
                value,
                pinned_at,
            } => {
                let by = format!(
                    "{}/{}",
                    e.metadata.actor.role.as_str(),
                    e.metadata.actor.node
                );
                pins.insert(
                    (e.stream_id.as_str().to_owned(), key.clone()),
                    PinInForce {
                        scope,
                        key,
                        value,
                        pinned_at,
                        by,
                    },
                );
            }
            settings::Event::SettingUnpinned { key, .. } => {
                pins.remove(&(e.stream_id.as_str().to_owned(), key));
            }
        }
    }
    Ok(pins.into_values().collect())
}
