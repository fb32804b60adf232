//! Typed payloads: domain event enums in and out of the store.
//!
//! The convention domain code follows:
//!
//! ```
//! #[derive(serde::Serialize, serde::Deserialize)]
//! #[serde(tag = "type")]
//! enum BuildEvent {
//!     #[serde(rename = "AttemptAcquired.v1")]
//!     AttemptAcquired { epoch: u64, node: String },
//! }
//! ```
//!
//! The tag becomes the `type` column and the remaining fields the `data` column; decoding puts
//! the tag back. Event types are versioned in the tag: a changed shape is a new variant
//! (`….v2`), and the old one stays decodable for as long as streams hold it.

use thiserror::Error;
use uuid::Uuid;

use super::{Metadata, NewEvent, RecordedEvent};

#[derive(Debug, Error)]
pub enum EncodeError {
    #[error("event does not serialize to JSON: {0}")]
    Serialize(#[source] serde_json::Error),
    #[error(
        "event does not serialize to an object with a string `type` tag; \
         derive it with #[serde(tag = \"type\")] and rename each variant to `Name.vN`"
    )]
    NotTagged,
}

#[derive(Debug, Error)]
pub enum DecodeError {
    #[error("event {event_id} has type {event_type:?}, which {target} does not know")]
    UnknownType {
        event_id: Uuid,
        event_type: String,
        target: &'static str,
    },
    #[error("event {event_id} of type {event_type:?} does not decode as {target}: {source}")]
    Malformed {
        event_id: Uuid,
        event_type: String,
        target: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

/// A typed event payload. Implemented for every internally tagged serde type; domain code
/// implements nothing, it only derives.
pub trait DomainEvent: Sized {
    /// The type tag (the `type` column), e.g. `AttemptAcquired.v1`.
    fn event_type(&self) -> Result<String, EncodeError>;
    /// Builds the event to append.
    fn encode(&self, event_id: Uuid, metadata: Metadata) -> Result<NewEvent, EncodeError>;
    /// Decodes a stored event; an unknown type is [`DecodeError::UnknownType`].
    fn decode(event: &RecordedEvent) -> Result<Self, DecodeError>;
}

impl<T> DomainEvent for T
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    fn event_type(&self) -> Result<String, EncodeError> {
        let value = serde_json::to_value(self).map_err(EncodeError::Serialize)?;
        match value.get("type") {
            Some(serde_json::Value::String(tag)) => Ok(tag.clone()),
            _ => Err(EncodeError::NotTagged),
        }
    }

    fn encode(&self, event_id: Uuid, metadata: Metadata) -> Result<NewEvent, EncodeError> {
        let value = serde_json::to_value(self).map_err(EncodeError::Serialize)?;
        let serde_json::Value::Object(mut fields) = value else {
            return Err(EncodeError::NotTagged);
        };
        let Some(serde_json::Value::String(event_type)) = fields.remove("type") else {
            return Err(EncodeError::NotTagged);
        };
        Ok(NewEvent {
            event_id,
            event_type,
            data: serde_json::Value::Object(fields),
            metadata,
        })
    }

    fn decode(event: &RecordedEvent) -> Result<Self, DecodeError> {
        let target = std::any::type_name::<T>();
        let mut fields = match &event.data {
            serde_json::Value::Object(fields) => fields.clone(),
            _ => {
                return Err(DecodeError::Malformed {
                    event_id: event.event_id,
                    event_type: event.event_type.clone(),
                    target,
                    source: <serde_json::Error as serde::de::Error>::custom(
                        "data is not a JSON object",
                    ),
                })
            }
        };
        fields.insert(
            "type".into(),
            serde_json::Value::String(event.event_type.clone()),
        );
        serde_json::from_value(serde_json::Value::Object(fields)).map_err(|source| {
            // serde reports a tag outside the enum as "unknown variant `X`, expected …"; that is
            // the one failure a reader should treat differently (an event from a newer version).
            if source.to_string().starts_with("unknown variant") {
                DecodeError::UnknownType {
                    event_id: event.event_id,
                    event_type: event.event_type.clone(),
                    target,
                }
            } else {
                DecodeError::Malformed {
                    event_id: event.event_id,
                    event_type: event.event_type.clone(),
                    target,
                    source,
                }
            }
        })
    }
}

impl RecordedEvent {
    /// Decodes this event as `E`; see [`DomainEvent::decode`].
    pub fn decode<E: DomainEvent>(&self) -> Result<E, DecodeError> {
        E::decode(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{Actor, ActorRole, StreamId};
    use serde::{Deserialize, Serialize};

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    #[serde(tag = "type")]
    enum Sample {
        #[serde(rename = "Started.v1")]
        Started { epoch: u64 },
        #[serde(rename = "Stopped.v1")]
        Stopped,
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Untagged {
        x: u32,
    }

    fn recorded(new: NewEvent) -> RecordedEvent {
        RecordedEvent {
            position: 1,
            stream_id: StreamId::parse("sample-1").unwrap(),
            version: 1,
            event_id: new.event_id,
            event_type: new.event_type,
            data: new.data,
            metadata: new.metadata,
            recorded_at: chrono::Utc::now(),
            tx_id: 1,
        }
    }

    fn meta() -> Metadata {
        Metadata::new(Actor::new(ActorRole::Cli, "test"))
    }

    #[test]
    fn tag_goes_to_the_type_column_and_comes_back() {
        let new = Sample::Started { epoch: 7 }
            .encode(Uuid::nil(), meta())
            .unwrap();
        assert_eq!(new.event_type, "Started.v1");
        assert_eq!(new.data, serde_json::json!({"epoch": 7}));
        assert_eq!(
            recorded(new).decode::<Sample>().unwrap(),
            Sample::Started { epoch: 7 }
        );
        let unit = Sample::Stopped.encode(Uuid::nil(), meta()).unwrap();
        assert_eq!(unit.data, serde_json::json!({}));
        assert_eq!(recorded(unit).decode::<Sample>().unwrap(), Sample::Stopped);
    }

    #[test]
    fn unknown_type_and_bad_data_are_distinct_errors() {
        let mut new = Sample::Stopped.encode(Uuid::nil(), meta()).unwrap();
        new.event_type = "Started.v2".into();
        assert!(matches!(
            recorded(new.clone()).decode::<Sample>(),
            Err(DecodeError::UnknownType { event_type, .. }) if event_type == "Started.v2"
        ));
        new.event_type = "Started.v1".into();
        new.data = serde_json::json!({"epoch": "seven"});
        assert!(matches!(
            recorded(new).decode::<Sample>(),
            Err(DecodeError::Malformed { .. })
        ));
    }

    #[test]
    fn untagged_types_are_refused() {
        assert!(matches!(
            Untagged { x: 1 }.encode(Uuid::nil(), meta()),
            Err(EncodeError::NotTagged)
        ));
    }
}
