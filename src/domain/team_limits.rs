//! What one team may hold at once: the fair-share limits of a shared build service.
//!
//! Each limit counts something a team holds while it waits or works (builds waiting or queued,
//! builds running, upload links not yet used) or the size of one request (steps per build).
//! The service applies the same limits to every team; `None` is no limit. The counting happens
//! where the rows are (`projections::team_usage`, inside the append's transaction, so a burst
//! of concurrent requests cannot slip past); this module says what the limits are, what each
//! one counts, and the sentence a refused caller reads.

use std::fmt;

use super::ids::TeamId;

/// The limits one team is held to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TeamLimits {
    /// Builds of the team holding a worker slot at once (`STRATA_TEAM_MAX_RUNNING_BUILDS`).
    pub running_builds: Option<u32>,
    /// Builds of the team registered but not yet running: waiting for uploads or queued
    /// (`STRATA_TEAM_MAX_QUEUED_BUILDS`).
    pub queued_builds: Option<u32>,
    /// Upload links of the team's waiting builds not yet used (`STRATA_TEAM_MAX_PENDING_UPLOADS`).
    pub pending_uploads: Option<u32>,
    /// Steps in one build's start request (`STRATA_BUILD_MAX_STEPS`).
    pub steps_per_build: Option<u32>,
}

impl TeamLimits {
    pub const DEFAULT: TeamLimits = TeamLimits {
        running_builds: Some(8),
        queued_builds: Some(100),
        pending_uploads: Some(1000),
        steps_per_build: Some(500),
    };

    /// No limit at all: what every setting at `none` gives.
    pub const NONE: TeamLimits = TeamLimits {
        running_builds: None,
        queued_builds: None,
        pending_uploads: None,
        steps_per_build: None,
    };

    pub fn max(&self, held: Held) -> Option<u32> {
        match held {
            Held::RunningBuilds => self.running_builds,
            Held::QueuedBuilds => self.queued_builds,
            Held::PendingUploads => self.pending_uploads,
        }
    }

    /// Refuses a start request of `steps` steps over the limit.
    pub fn check_steps(&self, steps: usize) -> Result<(), StepsOverLimit> {
        match self.steps_per_build {
            Some(max) if steps > max as usize => Err(StepsOverLimit { steps, max }),
            _ => Ok(()),
        }
    }

    /// The limits as `(setting, value)` rows, for `/ui` and `/metrics`.
    pub fn rows(&self) -> [(&'static str, Option<u32>); 4] {
        [
            (Held::RunningBuilds.setting(), self.running_builds),
            (Held::QueuedBuilds.setting(), self.queued_builds),
            (Held::PendingUploads.setting(), self.pending_uploads),
            ("STRATA_BUILD_MAX_STEPS", self.steps_per_build),
        ]
    }
}

/// What a team holds that a limit counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Held {
    RunningBuilds,
    QueuedBuilds,
    PendingUploads,
}

impl Held {
    pub fn setting(self) -> &'static str {
        match self {
            Held::RunningBuilds => "STRATA_TEAM_MAX_RUNNING_BUILDS",
            Held::QueuedBuilds => "STRATA_TEAM_MAX_QUEUED_BUILDS",
            Held::PendingUploads => "STRATA_TEAM_MAX_PENDING_UPLOADS",
        }
    }

    fn noun(self) -> &'static str {
        match self {
            Held::RunningBuilds => "builds running",
            Held::QueuedBuilds => "builds waiting or queued",
            Held::PendingUploads => "upload links not yet used",
        }
    }

    fn remedy(self) -> &'static str {
        match self {
            Held::RunningBuilds => "the build stays queued until one of them ends",
            Held::QueuedBuilds => {
                "start or let some of them finish (a build left waiting expires), then register again"
            }
            Held::PendingUploads => {
                "finish or abandon the builds waiting for uploads, then ask for the link again"
            }
        }
    }

    /// Whether `count` (the team's holding with the new one in it) is over `max`.
    pub fn over(self, team: &TeamId, count: u64, max: u32) -> Option<OverLimit> {
        (count > u64::from(max)).then(|| OverLimit {
            team: team.clone(),
            held: self,
            max,
        })
    }
}

/// A team at one of its limits: the sentence the caller reads (HTTP 429).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverLimit {
    pub team: TeamId,
    pub held: Held,
    pub max: u32,
}

impl fmt::Display for OverLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "team {} already has {} {} (the limit, {}); {}",
            self.team.as_str(),
            self.max,
            self.held.noun(),
            self.held.setting(),
            self.held.remedy()
        )
    }
}

/// A start request with more steps than one build may have.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the build has {steps} steps, more than the {max} one build may have (STRATA_BUILD_MAX_STEPS); split it into a base template and templates built from it")]
pub struct StepsOverLimit {
    pub steps: usize,
    pub max: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn team() -> TeamId {
        TeamId::parse("acme").unwrap()
    }

    #[test]
    fn the_limit_itself_is_allowed_and_one_more_is_not() {
        assert_eq!(Held::QueuedBuilds.over(&team(), 3, 3), None);
        let over = Held::QueuedBuilds.over(&team(), 4, 3).unwrap();
        assert_eq!(
            over.to_string(),
            "team acme already has 3 builds waiting or queued (the limit, \
             STRATA_TEAM_MAX_QUEUED_BUILDS); start or let some of them finish (a build left \
             waiting expires), then register again"
        );
    }

    #[test]
    fn a_zero_limit_refuses_the_first() {
        assert!(Held::PendingUploads.over(&team(), 1, 0).is_some());
    }

    #[test]
    fn steps_are_counted_against_their_own_limit() {
        let limits = TeamLimits {
            steps_per_build: Some(2),
            ..TeamLimits::NONE
        };
        assert_eq!(limits.check_steps(2), Ok(()));
        let err = limits.check_steps(3).unwrap_err();
        assert!(
            err.to_string().contains("3 steps, more than the 2"),
            "{err}"
        );
        assert_eq!(TeamLimits::NONE.check_steps(100_000), Ok(()));
    }

    #[test]
    fn each_holding_has_its_own_setting() {
        let limits = TeamLimits::DEFAULT;
        assert_eq!(limits.max(Held::RunningBuilds), Some(8));
        assert_eq!(limits.max(Held::QueuedBuilds), Some(100));
        assert_eq!(limits.max(Held::PendingUploads), Some(1000));
        let settings: Vec<_> = limits.rows().iter().map(|(s, _)| *s).collect();
        assert_eq!(settings.len(), 4);
        assert!(settings.iter().all(|s| s.starts_with("STRATA_")));
    }
}
