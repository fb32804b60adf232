//! The E2B view of a build: `GET /templates/{id}/builds/{bid}/status`.
//!
//! Layout: [`BuildStatus`] and [`status_of`]; [`ErrorReason`] and [`reason_of`]; [`LogEntry`],
//! [`LogLevel`] and [`page_logs`].
//!
//! The SDK accepts exactly `waiting|building|ready|error`; a queued build is `waiting` (as E2B
//! reports builds that are not yet triggered), publishing is still `building`, and only Ready is
//! `ready`: the status never says ready before the result is visible.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{FailedStep, Phase, State};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BuildStatus {
    Waiting,
    Building,
    Ready,
    Error,
}

/// The status of a registered build; `None` for an empty stream (the API answers 404).
pub fn status_of(state: &State) -> Option<BuildStatus> {
    match state.phase {
        Phase::Unregistered => None,
        Phase::Waiting { .. } | Phase::Queued { .. } => Some(BuildStatus::Waiting),
        Phase::Active { .. } | Phase::Publishing { .. } => Some(BuildStatus::Building),
        Phase::Ready { .. } => Some(BuildStatus::Ready),
        Phase::Error { .. } => Some(BuildStatus::Error),
    }
}

/// The `reason` object: `message` becomes the SDK's exception text, `step` is `"<n>"` (1-based),
/// `"base"` or `"finalize"`. The API adds `logEntries` from the log store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorReason {
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<FailedStep>,
}

pub fn reason_of(state: &State) -> Option<ErrorReason> {
    match &state.phase {
        Phase::Error { reason, .. } => Some(ErrorReason {
            message: reason.message.clone(),
            step: reason.step,
        }),
        _ => None,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

/// One `logEntries[]` item as the SDK parses it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    pub timestamp: DateTime<Utc>,
    pub level: LogLevel,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

/// The SDK pages with `logsOffset` (an index into the append-only list) and `limit` (Python sends
/// 100, JS none). Past the end the page must be empty, or the SDK's drain loop never ends.
pub fn page_logs<T>(entries: &[T], offset: usize, limit: Option<usize>) -> &[T] {
    let limit = limit.unwrap_or(100).min(100);
    let start = offset.min(entries.len());
    let end = start.saturating_add(limit).min(entries.len());
    &entries[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reason_serializes_as_e2b_expects() {
        let r = ErrorReason {
            message: "boom".into(),
            step: Some(FailedStep::Step(2)),
        };
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            serde_json::json!({"message": "boom", "step": "2"})
        );
        let r = ErrorReason {
            message: "pull failed".into(),
            step: Some(FailedStep::Base),
        };
        assert_eq!(serde_json::to_value(&r).unwrap()["step"], "base");
        assert_eq!(
            serde_json::to_value(BuildStatus::Building).unwrap(),
            "building"
        );
    }

    #[test]
    fn log_entry_matches_the_wire_shape() {
        let e: LogEntry = serde_json::from_str(
            r#"{"timestamp":"2026-11-29T15:19:43.389Z","level":"info","message":"m","step":"1"}"#,
        )
        .unwrap();
        assert_eq!(e.level, LogLevel::Info);
        assert!(serde_json::from_str::<LogEntry>(
            r#"{"timestamp":"2026-11-29T15:19:43Z","level":"warning","message":"m"}"#
        )
        .is_err());
    }

    proptest! {
        #[test]
        fn pages_tile_the_log_and_end_empty(len in 0usize..350, limit in proptest::option::of(1usize..150)) {
            let entries: Vec<usize> = (0..len).collect();
            let mut offset = 0;
            let mut seen = Vec::new();
            loop {
                let page = page_logs(&entries, offset, limit);
                if page.is_empty() { break; }
                prop_assert!(page.len() <= 100);
                offset += page.len();
                seen.extend_from_slice(page);
            }
            prop_assert_eq!(seen, entries);
            prop_assert!(page_logs(&(0..len).collect::<Vec<_>>(), len + 5, limit).is_empty());
        }
    }
}
