//! The start and ready commands a build finalizes with, by E2B's rules (ADR 0012).
//!
//! Layout: [`StartCommands`] (what finalization runs) and [`effective`] (which commands a build
//! ends up with: its own, or those of the template it extends).
//!
//! E2B's template builder (finalize phase) runs finalization when a build sets either command:
//! * start and ready: the start command runs in the background, the ready command is retried
//!   until it succeeds;
//! * start only: the ready command defaults to `sleep 20`;
//! * ready only: nothing is started, the ready command is retried until it succeeds;
//! * neither: a build `fromTemplate` keeps the parent template's commands (and runs them); any
//!   other build has none, and finalization runs nothing.
//!
//! An empty string counts as not set, as in E2B.

use serde::{Deserialize, Serialize};

/// What the ready command is when only a start command is set: E2B's `sleep 20`.
pub const DEFAULT_READY_AFTER_START: &str = "sleep 20";
/// What the ready command is when neither command is set but finalization runs: `sleep 0`.
pub const DEFAULT_READY_ALONE: &str = "sleep 0";

/// The commands finalization runs. At least one of the two is set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartCommands {
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
}

impl StartCommands {
    /// `None` when neither command is set (empty strings count as not set).
    pub fn of(start_cmd: Option<&str>, ready_cmd: Option<&str>) -> Option<StartCommands> {
        let set = |c: Option<&str>| c.filter(|c| !c.is_empty()).map(str::to_owned);
        let (start_cmd, ready_cmd) = (set(start_cmd), set(ready_cmd));
        if start_cmd.is_none() && ready_cmd.is_none() {
            None
        } else {
            Some(StartCommands {
                start_cmd,
                ready_cmd,
            })
        }
    }

    /// The ready command finalization retries: the one set, else E2B's default.
    pub fn ready(&self) -> &str {
        match (&self.ready_cmd, &self.start_cmd) {
            (Some(ready), _) => ready,
            (None, Some(_)) => DEFAULT_READY_AFTER_START,
            (None, None) => DEFAULT_READY_ALONE,
        }
    }
}

/// Which commands a build finalizes with: its own when it sets either, else `inherited` (the
/// commands of the template a `fromTemplate` build extends; `None` for an image base).
pub fn effective(
    start_cmd: Option<&str>,
    ready_cmd: Option<&str>,
    inherited: Option<StartCommands>,
) -> Option<StartCommands> {
    StartCommands::of(start_cmd, ready_cmd).or(inherited)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmds(start: Option<&str>, ready: Option<&str>) -> StartCommands {
        StartCommands {
            start_cmd: start.map(str::to_owned),
            ready_cmd: ready.map(str::to_owned),
        }
    }

    #[test]
    fn either_command_alone_finalizes_with_e2b_defaults() {
        let both = effective(Some("serve"), Some("check"), None).unwrap();
        assert_eq!(
            (both.start_cmd.as_deref(), both.ready()),
            (Some("serve"), "check")
        );
        let start = effective(Some("serve"), None, None).unwrap();
        assert_eq!(
            (start.start_cmd.as_deref(), start.ready()),
            (Some("serve"), "sleep 20")
        );
        let ready = effective(None, Some("check"), None).unwrap();
        assert_eq!((ready.start_cmd.as_deref(), ready.ready()), (None, "check"));
        assert_eq!(effective(None, None, None), None);
        assert_eq!(effective(Some(""), Some(""), None), None);
        assert_eq!(
            effective(Some(""), Some("check"), None),
            Some(cmds(None, Some("check")))
        );
    }

    #[test]
    fn a_derived_build_keeps_its_parents_commands_unless_it_sets_its_own() {
        let parent = cmds(Some("serve"), Some("check"));
        assert_eq!(
            effective(None, None, Some(parent.clone())),
            Some(parent.clone())
        );
        assert_eq!(
            effective(None, Some("mine"), Some(parent)),
            Some(cmds(None, Some("mine"))),
            "a build's own ready command replaces both of the parent's commands"
        );
        assert_eq!(cmds(None, None).ready(), "sleep 0");
    }
}
