//! What a writer believes a stream's version is when it appends.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The version a write expects its stream to be at. Versions are 1-based: a stream's version is
/// the version of its last event, and a stream with no events has version 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpectedVersion {
    /// The stream is at exactly this version. `Exact(0)` is the same as [`Self::NoStream`].
    Exact(u64),
    /// The stream has no events yet.
    NoStream,
    /// No check: append after whatever is there. For facts that do not depend on state.
    Any,
}

impl ExpectedVersion {
    /// The version this expectation pins, if any (`NoStream` pins 0).
    pub fn pinned(self) -> Option<u64> {
        match self {
            Self::Exact(v) => Some(v),
            Self::NoStream => Some(0),
            Self::Any => None,
        }
    }

    /// Whether a stream at `actual` satisfies this expectation.
    pub fn admits(self, actual: u64) -> bool {
        self.pinned().is_none_or(|v| v == actual)
    }
}

impl fmt::Display for ExpectedVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exact(v) => write!(f, "version {v}"),
            Self::NoStream => f.write_str("no stream"),
            Self::Any => f.write_str("any version"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits() {
        assert!(ExpectedVersion::Exact(3).admits(3));
        assert!(!ExpectedVersion::Exact(3).admits(4));
        assert!(ExpectedVersion::NoStream.admits(0));
        assert!(!ExpectedVersion::NoStream.admits(1));
        assert!(ExpectedVersion::Exact(0).admits(0));
        assert!(ExpectedVersion::Any.admits(17));
    }
}
