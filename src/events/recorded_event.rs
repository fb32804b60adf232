//! Events as stored, and the cursor of the global feed.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use uuid::Uuid;

use super::{Metadata, StreamId};

/// An event read back from the store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedEvent {
    /// Insertion order, unique. Not a safe cursor alone; see [`FeedPosition`].
    pub position: u64,
    pub stream_id: StreamId,
    /// 1-based version within the stream.
    pub version: u64,
    pub event_id: Uuid,
    #[serde(rename = "type")]
    pub event_type: String,
    pub data: serde_json::Value,
    pub metadata: Metadata,
    pub recorded_at: DateTime<Utc>,
    /// Id of the transaction that appended the event.
    pub tx_id: u64,
}

impl RecordedEvent {
    /// This event's place in the global feed.
    pub fn feed_position(&self) -> FeedPosition {
        FeedPosition {
            tx_id: self.tx_id,
            position: self.position,
        }
    }
}

/// A cursor in the global feed: the `(tx_id, position)` pair of the last event a subscriber
/// processed. The feed is ordered by this pair and only ever returns events of transactions
/// older than every transaction still running, so no later-committing event can sort before a
/// cursor already handed out. Written `tx_id:position` in URLs and on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct FeedPosition {
    pub tx_id: u64,
    pub position: u64,
}

impl FeedPosition {
    /// Before the first event.
    pub const START: FeedPosition = FeedPosition {
        tx_id: 0,
        position: 0,
    };
}

#[derive(Debug, Error, PartialEq, Eq)]
#[error("feed position {0:?} is not `tx_id:position` (two unsigned integers, e.g. `812:40`)")]
pub struct FeedPositionError(pub String);

impl fmt::Display for FeedPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.tx_id, self.position)
    }
}

impl std::str::FromStr for FeedPosition {
    type Err = FeedPositionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || FeedPositionError(s.to_string());
        let (tx, pos) = s.split_once(':').ok_or_else(err)?;
        Ok(Self {
            tx_id: tx.parse().map_err(|_| err())?,
            position: pos.parse().map_err(|_| err())?,
        })
    }
}

impl Serialize for FeedPosition {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for FeedPosition {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        raw.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feed_position_round_trips_and_orders_by_transaction_first() {
        let p: FeedPosition = "812:40".parse().unwrap();
        assert_eq!(
            p,
            FeedPosition {
                tx_id: 812,
                position: 40
            }
        );
        assert_eq!(p.to_string(), "812:40");
        assert!(
            FeedPosition {
                tx_id: 811,
                position: 99
            } < p
        );
        assert!("812".parse::<FeedPosition>().is_err());
        assert!("a:1".parse::<FeedPosition>().is_err());
        assert!("1:-1".parse::<FeedPosition>().is_err());
    }
}
