//! What one team may hold at once: the fair-share limits of a shared build service.
//!
//! Each limit counts something a team holds while it waits or works (builds waiting or queued,
//! builds running, upload links not yet used), what it keeps stored (the bytes of its uploads),
//! or the size of one request (steps per build).
//! The service applies the same limits to every team; `None` is no limit. The counting happens
//! where the rows are (`projections::team_usage`, inside the append's transaction, so a burst
//! of concurrent requests cannot slip past); this module says what the limits are, what each
//! one counts, and the sentence a refused caller reads.

use std::fmt;

use super::byte_size::human_bytes;
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
    /// Bytes of the team's uploaded context archives the blob store holds, each distinct
    /// archive once (`STRATA_TEAM_MAX_STORED_UPLOADS`). Garbage collection frees them.
    pub stored_upload_bytes: Option<u64>,
}

impl TeamLimits {
    pub const DEFAULT: TeamLimits = TeamLimits {
        running_builds: Some(8),
        queued_builds: Some(100),
        pending_uploads: Some(1000),
        steps_per_build: Some(500),
        stored_upload_bytes: Some(50 << 30),
    };

    /// No limit at all: what every setting at `none` gives.
    pub const NONE: TeamLimits = TeamLimits {
        running_builds: None,
        queued_builds: None,
        pending_uploads: None,
        steps_per_build: None,
        stored_upload_bytes: None,
    };

    pub fn max(&self, held: Held) -> Option<u64> {
        match held {
            Held::RunningBuilds => self.running_builds.map(u64::from),
            Held::QueuedBuilds => self.queued_builds.map(u64::from),
            Held::PendingUploads => self.pending_uploads.map(u64::from),
            Held::StoredUploadBytes => self.stored_upload_bytes,
        }
    }

    /// Refuses, before a byte is read, an upload of `declared` bytes that cannot fit beside the
    /// `stored` bytes the team's uploads already take. An upload whose bytes the team already
    /// stores would fit, but its digest is known only once it is read: near the limit such a
    /// repeat is refused too, and the SDK never sends one (the link says `present`).
    pub fn check_upload(
        &self,
        team: &TeamId,
        stored: u64,
        declared: u64,
    ) -> Result<(), UploadOverQuota> {
        match self.stored_upload_bytes {
            Some(max) if stored.saturating_add(declared) > max => Err(UploadOverQuota {
                team: team.clone(),
                stored,
                declared,
                max,
            }),
            _ => Ok(()),
        }
    }

    /// Refuses a start request of `steps` steps over the limit.
    pub fn check_steps(&self, steps: usize) -> Result<(), StepsOverLimit> {
        match self.steps_per_build {
            Some(max) if steps > max as usize => Err(StepsOverLimit { steps, max }),
            _ => Ok(()),
        }
    }

    /// The limits as `(setting, value)` rows, for `/ui` and `/metrics`; the stored-uploads
    /// value is in bytes.
    pub fn rows(&self) -> [(&'static str, Option<u64>); 5] {
        [
            (Held::RunningBuilds.setting(), self.max(Held::RunningBuilds)),
            (Held::QueuedBuilds.setting(), self.max(Held::QueuedBuilds)),
            (
                Held::PendingUploads.setting(),
                self.max(Held::PendingUploads),
            ),
            (
                "STRATA_BUILD_MAX_STEPS",
                self.steps_per_build.map(u64::from),
            ),
            (
                Held::StoredUploadBytes.setting(),
                self.max(Held::StoredUploadBytes),
            ),
        ]
    }
}

/// What a team holds that a limit counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Held {
    RunningBuilds,
    QueuedBuilds,
    PendingUploads,
    /// Counted in bytes, not items.
    StoredUploadBytes,
}

impl Held {
    pub fn setting(self) -> &'static str {
        match self {
            Held::RunningBuilds => "STRATA_TEAM_MAX_RUNNING_BUILDS",
            Held::QueuedBuilds => "STRATA_TEAM_MAX_QUEUED_BUILDS",
            Held::PendingUploads => "STRATA_TEAM_MAX_PENDING_UPLOADS",
            Held::StoredUploadBytes => "STRATA_TEAM_MAX_STORED_UPLOADS",
        }
    }

    /// `max` as the sentence says it: a count, or a size.
    fn amount(self, max: u64) -> String {
        match self {
            Held::StoredUploadBytes => human_bytes(max),
            _ => max.to_string(),
        }
    }

    fn noun(self) -> &'static str {
        match self {
            Held::RunningBuilds => "builds running",
            Held::QueuedBuilds => "builds waiting or queued",
            Held::PendingUploads => "upload links not yet used",
            Held::StoredUploadBytes => "of uploads stored",
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
            Held::StoredUploadBytes => STORED_UPLOADS_REMEDY,
        }
    }

    /// Whether `count` (the team's holding with the new one in it) is over `max`.
    pub fn over(self, team: &TeamId, count: u64, max: u64) -> Option<OverLimit> {
        (count > max).then(|| OverLimit {
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
    pub max: u64,
}

impl fmt::Display for OverLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "team {} already has {} {} (the limit, {}); {}",
            self.team.as_str(),
            self.held.amount(self.max),
            self.held.noun(),
            self.held.setting(),
            self.held.remedy()
        )
    }
}

/// What frees room under `STRATA_TEAM_MAX_STORED_UPLOADS`.
const STORED_UPLOADS_REMEDY: &str = "garbage collection removes uploads no build has used for \
     STRATA_GC_KEEP (and sooner under STRATA_STORAGE_BUDGET); upload again once it has, or ask \
     the operator for a larger limit";

/// An upload that cannot fit in what its team may store (HTTP 413, before a byte is read).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "team {} stores {} of uploads; this upload of {} would pass its limit of {} \
     (STRATA_TEAM_MAX_STORED_UPLOADS); {STORED_UPLOADS_REMEDY}",
    team.as_str(),
    human_bytes(*stored),
    human_bytes(*declared),
    human_bytes(*max)
)]
pub struct UploadOverQuota {
    pub team: TeamId,
    pub stored: u64,
    pub declared: u64,
    pub max: u64,
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
    fn an_upload_is_refused_when_it_cannot_fit_beside_what_the_team_stores() {
        let limits = TeamLimits {
            stored_upload_bytes: Some(10 << 20),
            ..TeamLimits::NONE
        };
        assert_eq!(limits.check_upload(&team(), 4 << 20, 6 << 20), Ok(()));
        let err = limits
            .check_upload(&team(), 4 << 20, (6 << 20) + 1)
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("team acme stores 4.0 MiB of uploads; this upload of 6.0 MiB would pass its limit of 10.0 MiB (STRATA_TEAM_MAX_STORED_UPLOADS)"),
            "{text}"
        );
        assert_eq!(
            TeamLimits::NONE.check_upload(&team(), u64::MAX, u64::MAX),
            Ok(())
        );
        // Counted after the fact (inside the completion's append), the limit is a size.
        let over = Held::StoredUploadBytes
            .over(&team(), (10 << 20) + 1, 10 << 20)
            .unwrap();
        assert!(
            over.to_string()
                .starts_with("team acme already has 10.0 MiB of uploads stored"),
            "{over}"
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
        assert_eq!(limits.max(Held::StoredUploadBytes), Some(50 << 30));
        let settings: Vec<_> = limits.rows().iter().map(|(s, _)| *s).collect();
        assert_eq!(settings.len(), 5);
        assert!(settings.iter().all(|s| s.starts_with("STRATA_")));
    }
}
