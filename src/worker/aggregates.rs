//! The domain's aggregates as [`Aggregate`]s of the event store, so the worker can load their
//! streams and run their commands with [`crate::events::execute`]. Pure glue: each one only
//! names the domain's own `State`, `Event`, `Command`, `decide` and `evolve`.

use std::convert::Infallible;

use crate::domain::ids::TemplateId;
use crate::domain::{build, promotion, snapshot, template};
use crate::events::Aggregate;

/// `build-{id}`.
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

/// `template-{id}`.
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

/// `templatename-{team}-{name}`; its command is the candidate template id of a claim.
pub struct TemplateName;
impl Aggregate for TemplateName {
    type State = template::NameState;
    type Event = template::NameEvent;
    type Command = TemplateId;
    type Error = Infallible;
    fn evolve(state: Self::State, event: &Self::Event) -> Self::State {
        template::evolve_name(state, event)
    }
    fn decide(state: &Self::State, candidate: &TemplateId) -> Result<Vec<Self::Event>, Infallible> {
        Ok(template::decide_name(state, candidate).1)
    }
}

/// `promotion-{build}-{epoch}`.
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

/// `snapshot-{id}`.
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
