//! The E2B view of a build: `GET /templates/{id}/builds/{bid}/status`.
//!
//! Layout: [`BuildStatus`] and [`status_of`]; [`ErrorReason`] and [`reason_of`]; [`LogEntry`]
//! and [`LogLevel`]; [`StatusResponse`], the whole response body. The SDK's offset paging over
//! the logs is `projections::build_logs::page_of`, called by the status handler.
//!
//! The SDK accepts exactly `waiting|building|ready|error`. As on E2B, only a registered build
//! that was never started is `waiting`; a started build is `building` from the moment it is
//! started, whether it is queued for a node or running, and publishing is still `building`.
//! Only Ready is `ready`: the status never says ready before the result is visible.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{FailedStep, Phase, State};
use crate::domain::ids::BuildId;

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
        Phase::Waiting { .. } => Some(BuildStatus::Waiting),
        Phase::Queued { .. } | Phase::Active { .. } | Phase::Publishing { .. } => {
            Some(BuildStatus::Building)
        }
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

/// Ordered by severity: a minimum level keeps itself and everything after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

impl LogLevel {
    pub const ALL: [LogLevel; 4] = [
        LogLevel::Debug,
        LogLevel::Info,
        LogLevel::Warn,
        LogLevel::Error,
    ];

    /// The stored and wire spelling (`build_logs.level`, `logEntries[].level`).
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        }
    }

    /// A stored level; anything unknown reads as `info`.
    pub fn from_stored(level: &str) -> LogLevel {
        LogLevel::ALL
            .into_iter()
            .find(|l| l.as_str() == level)
            .unwrap_or(LogLevel::Info)
    }
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

/// The `200` body of the status endpoint. `logs` is legacy and always empty, but the SDK
/// requires the key (PROTOCOL §1.5).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusResponse {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    pub status: BuildStatus,
    pub log_entries: Vec<LogEntry>,
    pub logs: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<ErrorReason>,
}

impl StatusResponse {
    /// The response for a registered build and one page of its logs; `None` when the build
    /// stream is empty (answer 404).
    pub fn of(state: &State, build_id: &BuildId, page: Vec<LogEntry>) -> Option<Self> {
        let registration = state.registration.as_ref()?;
        Some(Self {
            template_id: registration.template.to_string(),
            build_id: build_id.to_string(),
            status: status_of(state)?,
            log_entries: page,
            logs: vec![],
            reason: reason_of(state),
        })
    }

    /// Whether a status request that would answer this may wait for news instead: the build is
    /// in flight (started, not ended: a waiting build has no news coming until its client acts)
    /// and the page past the client's offset is empty.
    pub fn nothing_new(&self) -> bool {
        self.status == BuildStatus::Building && self.log_entries.is_empty()
    }

    /// Whether nothing more can be added to this answer by waiting: the build has ended, or
    /// the page holds `limit` lines already.
    pub fn is_complete(&self, limit: i64) -> bool {
        matches!(self.status, BuildStatus::Ready | BuildStatus::Error)
            || self.log_entries.len() as i64 >= limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn only_an_in_flight_build_with_nothing_past_the_offset_waits_and_only_an_end_or_a_full_page_completes(
    ) {
        let at = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let answer = |status, lines: usize, reason: Option<&str>| StatusResponse {
            template_id: "t".into(),
            build_id: "b".into(),
            status,
            log_entries: (0..lines)
                .map(|i| LogEntry {
                    timestamp: at,
                    level: LogLevel::Info,
                    message: format!("line {i}"),
                    step: None,
                })
                .collect(),
            logs: vec![],
            reason: reason.map(|m| ErrorReason {
                message: m.into(),
                step: None,
            }),
        };
        let quiet = answer(BuildStatus::Building, 0, None);
        assert!(quiet.nothing_new());
        assert!(!answer(BuildStatus::Waiting, 0, None).nothing_new());
        assert!(!answer(BuildStatus::Building, 1, None).nothing_new());
        assert!(!answer(BuildStatus::Ready, 0, None).nothing_new());
        assert!(!answer(BuildStatus::Error, 0, Some("boom")).nothing_new());

        assert!(!answer(BuildStatus::Building, 3, None).is_complete(100));
        assert!(answer(BuildStatus::Building, 3, None).is_complete(3));
        assert!(answer(BuildStatus::Ready, 0, None).is_complete(100));
        assert!(answer(BuildStatus::Error, 1, Some("boom")).is_complete(100));
    }

    #[test]
    fn status_response_has_every_required_key() {
        use crate::domain::build::{evolve, Event};
        use crate::domain::build_spec::Resources;
        use crate::domain::ids::{TeamId, TemplateId};
        let at = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let build = BuildId::parse("6b44026b-52e0-4514-9034-f764fec84928").unwrap();
        assert!(StatusResponse::of(&State::default(), &build, vec![]).is_none());
        let state = evolve(
            State::default(),
            &Event::BuildRegistered {
                template: TemplateId::parse("tpl00eba6899868497d8").unwrap(),
                team: TeamId::parse("t").unwrap(),
                tags: vec![],
                resources: Resources::default(),
                registered_at: at,
                waiting_deadline: at,
            },
        );
        let body =
            serde_json::to_value(StatusResponse::of(&state, &build, vec![]).unwrap()).unwrap();
        // Exactly the captured waiting response.
        assert_eq!(
            body,
            serde_json::json!({"templateID": "tpl00eba6899868497d8", "buildID": "6b44026b-52e0-4514-9034-f764fec84928", "status": "waiting", "logEntries": [], "logs": []})
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
}
