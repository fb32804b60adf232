//! Metadata recorded with every event: who appended it and why. This is the operators' audit
//! trail; the time is the `recorded_at` column, set by the database.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Which kind of process appended an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActorRole {
    Api,
    Worker,
    Reconciler,
    Cli,
}

impl ActorRole {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Api => "api",
            Self::Worker => "worker",
            Self::Reconciler => "reconciler",
            Self::Cli => "cli",
        }
    }
}

/// The process that appended an event: its role and node id (`STRATA_NODE_ID`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Actor {
    pub role: ActorRole,
    pub node: String,
}

impl Actor {
    pub fn new(role: ActorRole, node: impl Into<String>) -> Self {
        Self {
            role,
            node: node.into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metadata {
    pub actor: Actor,
    /// The attempt epoch a worker or reconciler wrote under, where one applies: lets an operator
    /// see which attempt a write belonged to after a lease moved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
    /// Trace id of the request or job, to jump from the audit history to the trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// The span (within `trace_id`) that appended the event: later work on the same build
    /// parents its spans on the registration's span (see `crate::trace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub span_id: Option<String>,
    /// The command (or event) that caused this event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub causation_id: Option<Uuid>,
    /// The user-visible operation this event is part of (e.g. one build request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<Uuid>,
}

impl Metadata {
    /// Metadata for `actor`, with the trace and span of the current span when it has one.
    pub fn new(actor: Actor) -> Self {
        let trace = crate::trace::current();
        Self {
            actor,
            epoch: None,
            span_id: trace.as_ref().map(|t| t.span_id.clone()),
            trace_id: trace.map(|t| t.trace_id),
            causation_id: None,
            correlation_id: None,
        }
    }

    pub fn with_epoch(mut self, epoch: u64) -> Self {
        self.epoch = Some(epoch);
        self
    }

    pub fn with_trace_id(mut self, trace_id: impl Into<String>) -> Self {
        self.trace_id = Some(trace_id.into());
        self
    }

    pub fn with_causation(mut self, causation_id: Uuid) -> Self {
        self.causation_id = Some(causation_id);
        self
    }

    pub fn with_correlation(mut self, correlation_id: Uuid) -> Self {
        self.correlation_id = Some(correlation_id);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serializes_compactly_and_round_trips() {
        let m = Metadata::new(Actor::new(ActorRole::Worker, "node-a")).with_epoch(3);
        let json = serde_json::to_value(&m).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"actor": {"role": "worker", "node": "node-a"}, "epoch": 3})
        );
        assert_eq!(serde_json::from_value::<Metadata>(json).unwrap(), m);
    }
}
