//! Stream ids: `{category}-{rest}`, e.g. `build-0191…`, `template-abc`, `files-team1:9f2c…`.

use std::fmt;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Longest stream id accepted; ids are keys in a btree and appear in URLs.
pub const MAX_STREAM_ID_LEN: usize = 256;

/// A validated stream id. Past [`StreamId::parse`], an id always has a non-empty category of
/// lowercase letters, digits or `_`, then `-`, then a non-empty rest of printable ASCII without
/// whitespace, `/`, `?`, `#` or `%` (so it is one URL path segment as is).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct StreamId(String);

#[derive(Debug, Error, PartialEq, Eq)]
pub enum StreamIdError {
    #[error("stream id is empty")]
    Empty,
    #[error("stream id is {0} bytes long; the limit is {MAX_STREAM_ID_LEN}")]
    TooLong(usize),
    #[error("stream id {0:?} has no category: expected `category-rest`, e.g. `build-123`")]
    NoCategory(String),
    #[error(
        "stream id {0:?} has an invalid category: use lowercase letters, digits and `_` before the first `-`"
    )]
    InvalidCategory(String),
    #[error(
        "stream id {0:?} contains {1:?}: use printable ASCII without whitespace, `/`, `?`, `#` or `%`"
    )]
    InvalidCharacter(String, char),
}

impl StreamId {
    pub fn parse(id: impl Into<String>) -> Result<Self, StreamIdError> {
        let id = id.into();
        if id.is_empty() {
            return Err(StreamIdError::Empty);
        }
        if id.len() > MAX_STREAM_ID_LEN {
            return Err(StreamIdError::TooLong(id.len()));
        }
        if let Some(bad) = id
            .chars()
            .find(|c| !c.is_ascii_graphic() || matches!(c, '/' | '?' | '#' | '%'))
        {
            return Err(StreamIdError::InvalidCharacter(id, bad));
        }
        let Some((category, rest)) = id.split_once('-') else {
            return Err(StreamIdError::NoCategory(id));
        };
        if rest.is_empty() {
            return Err(StreamIdError::NoCategory(id));
        }
        if category.is_empty()
            || !category
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            return Err(StreamIdError::InvalidCategory(id));
        }
        Ok(Self(id))
    }

    /// Builds `{category}-{rest}` and validates it.
    pub fn new(category: &str, rest: impl fmt::Display) -> Result<Self, StreamIdError> {
        Self::parse(format!("{category}-{rest}"))
    }

    /// The part before the first `-`: `build` for `build-123`.
    pub fn category(&self) -> &str {
        self.0
            .split_once('-')
            .map(|(category, _)| category)
            .expect("a parsed stream id has a category")
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for StreamId {
    type Err = StreamIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl<'de> Deserialize<'de> for StreamId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        Self::parse(raw).map_err(serde::de::Error::custom)
    }
}

impl AsRef<str> for StreamId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn category_is_the_part_before_the_first_dash() {
        let id = StreamId::parse("files-team1:9f2c").unwrap();
        assert_eq!(id.category(), "files");
        assert_eq!(id.as_str(), "files-team1:9f2c");
        assert_eq!(StreamId::new("build", 42).unwrap().as_str(), "build-42");
    }

    #[test]
    fn rejects_malformed_ids() {
        assert_eq!(StreamId::parse(""), Err(StreamIdError::Empty));
        assert!(matches!(
            StreamId::parse("build"),
            Err(StreamIdError::NoCategory(_))
        ));
        assert!(matches!(
            StreamId::parse("build-"),
            Err(StreamIdError::NoCategory(_))
        ));
        assert!(matches!(
            StreamId::parse("-123"),
            Err(StreamIdError::InvalidCategory(_))
        ));
        assert!(matches!(
            StreamId::parse("Build-1"),
            Err(StreamIdError::InvalidCategory(_))
        ));
        assert!(matches!(
            StreamId::parse("build-a/b"),
            Err(StreamIdError::InvalidCharacter(_, '/'))
        ));
        assert!(matches!(
            StreamId::parse("build-a b"),
            Err(StreamIdError::InvalidCharacter(_, ' '))
        ));
        assert!(matches!(
            StreamId::parse("x-".to_string() + &"a".repeat(MAX_STREAM_ID_LEN)),
            Err(StreamIdError::TooLong(_))
        ));
    }

    #[test]
    fn deserializing_validates() {
        assert!(serde_json::from_str::<StreamId>("\"build-1\"").is_ok());
        assert!(serde_json::from_str::<StreamId>("\"nope\"").is_err());
    }

    proptest! {
        #[test]
        fn parsed_ids_round_trip(category in "[a-z0-9_]{1,12}", rest in "[A-Za-z0-9._:@-]{1,40}") {
            let id = StreamId::new(&category, &rest).unwrap();
            prop_assert_eq!(id.category(), category.as_str());
            prop_assert_eq!(StreamId::parse(id.to_string()).unwrap(), id);
        }
    }
}
