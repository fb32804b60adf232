//! What a caller hands to [`EventStore::append`](super::EventStore::append).

use uuid::Uuid;

use super::{ExpectedVersion, Metadata, StreamId};

/// An event to append. The id comes from the command that produced it, so that an append
/// retried after a lost reply is recognised as the same append and not stored twice.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    pub event_id: Uuid,
    /// Versioned type name, e.g. `AttemptAcquired.v1`.
    pub event_type: String,
    pub data: serde_json::Value,
    pub metadata: Metadata,
}

/// One stream's part of an append: "this stream is at `expected`; add `events`". With no events
/// it is a guard: the append fails unless the stream is still at `expected`, which is how a
/// decision that read several streams makes sure none of them moved.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamWrite {
    pub stream: StreamId,
    pub expected: ExpectedVersion,
    pub events: Vec<NewEvent>,
}

impl StreamWrite {
    pub fn new(stream: StreamId, expected: ExpectedVersion, events: Vec<NewEvent>) -> Self {
        Self {
            stream,
            expected,
            events,
        }
    }

    /// A guard: no events, only the version check.
    pub fn guard(stream: StreamId, expected: ExpectedVersion) -> Self {
        Self::new(stream, expected, Vec::new())
    }

    pub fn is_guard(&self) -> bool {
        self.events.is_empty()
    }
}
