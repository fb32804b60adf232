//! Retention: which stored objects a garbage-collection pass may delete, and in what order.
//!
//! Input is what the mark phase found: every object no root reaches (a root is the current
//! result of a live template or tag with its lineage, anything an in-flight build froze or
//! checkpointed, upload bindings of waiting builds), each placed in a [`Tier`] by how cheaply it
//! is rebuilt, with its size and last use. Rooted objects never reach this module. The plan:
//!
//! 1. Everything unreferenced past the grace period (orphans: a fenced writer's layers, uploads
//!    no build bound) and every cache object unused for longer than the keep duration goes,
//!    whatever the budget.
//! 2. While the total is over the budget, more goes: tier by tier, cheapest to rebuild first
//!    (superseded checkpoints, then cache checkpoints, then final results beyond the per-template
//!    count), oldest first within a tier. Nothing inside the grace period goes: an object that
//!    was just written may be about to be referenced.
//!
//! The plan says why each object goes, for the audit history, and how far over budget the store
//! stays if the rules cannot reach it. BuildKit's gcpolicy (keep duration, then size budget,
//! cheapest records first) is the anchor.

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

/// How cheaply an unreferenced object is rebuilt; lower tiers go first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Tier {
    /// Referenced by nothing at all.
    Orphan,
    /// An upload no in-flight build binds: the client sends it again when it is gone.
    Upload,
    /// A layer of a registry image a node pulled: pulled again when next needed.
    PulledImage,
    /// A checkpoint of a build whose template has a newer result.
    SupersededCheckpoint,
    /// A checkpoint a cache entry still points at.
    CacheCheckpoint,
    /// A final result a cache entry points at, beyond the newest `finals_per_template`.
    SurplusFinalResult,
    /// One of a template's newest cached final results: kept unless the budget cannot be met
    /// otherwise.
    FinalResult,
}

impl Tier {
    pub const ALL: [Tier; 7] = [
        Tier::Orphan,
        Tier::Upload,
        Tier::PulledImage,
        Tier::SupersededCheckpoint,
        Tier::CacheCheckpoint,
        Tier::SurplusFinalResult,
        Tier::FinalResult,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Tier::Orphan => "orphan",
            Tier::Upload => "upload",
            Tier::PulledImage => "pulled-image",
            Tier::SupersededCheckpoint => "superseded-checkpoint",
            Tier::CacheCheckpoint => "cache-checkpoint",
            Tier::SurplusFinalResult => "surplus-final-result",
            Tier::FinalResult => "final-result",
        }
    }
}

/// One unreferenced object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The object's id (a digest).
    pub id: String,
    pub size: u64,
    pub tier: Tier,
    /// When it was last written, leased or hit.
    pub last_used: DateTime<Utc>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Total bytes the store should stay under; `None`: no budget, only the keep rules.
    pub budget: Option<u64>,
    /// Cache objects unused for longer than this go regardless of the budget.
    pub keep: Duration,
    /// Nothing younger than this goes (it may be about to be referenced).
    pub grace: Duration,
}

/// Why an object goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Why {
    /// Referenced by nothing, past the grace period.
    Unreferenced,
    /// Unused for longer than the keep duration.
    PastKeep { unused_for: Duration },
    /// Needed to bring the store under its budget.
    OverBudget { total_before: u64, budget: u64 },
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Why::Unreferenced => write!(f, "referenced by nothing past the grace period"),
            Why::PastKeep { unused_for } => {
                write!(
                    f,
                    "unused for {}h, past the keep duration",
                    unused_for.num_hours()
                )
            }
            Why::OverBudget {
                total_before,
                budget,
            } => write!(
                f,
                "the store held {total_before} bytes against a budget of {budget}"
            ),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deletion {
    pub candidate: Candidate,
    pub why: Why,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// In the order they should go.
    pub deletions: Vec<Deletion>,
    /// Total bytes once the plan is carried out.
    pub total_after: u64,
    /// Bytes still over the budget after the plan (0 when it is met).
    pub over_budget_by: u64,
}

/// The plan for one pass. `total` is every stored byte (rooted objects included).
pub fn plan(candidates: &[Candidate], total: u64, policy: &Policy, now: DateTime<Utc>) -> Plan {
    let mut order: Vec<&Candidate> = candidates
        .iter()
        .filter(|c| now - c.last_used >= policy.grace)
        .collect();
    order.sort_by(|a, b| (a.tier, a.last_used, &a.id).cmp(&(b.tier, b.last_used, &b.id)));
    let mut deletions = Vec::new();
    let mut kept = Vec::new();
    let mut remaining = total;
    for c in order {
        let unused_for = now - c.last_used;
        let why = match c.tier {
            Tier::Orphan => Some(Why::Unreferenced),
            _ if unused_for > policy.keep => Some(Why::PastKeep { unused_for }),
            _ => None,
        };
        match why {
            Some(why) => {
                remaining = remaining.saturating_sub(c.size);
                deletions.push(Deletion {
                    candidate: c.clone(),
                    why,
                });
            }
            None => kept.push(c),
        }
    }
    if let Some(budget) = policy.budget {
        let total_before = remaining;
        for c in kept {
            if remaining <= budget {
                break;
            }
            remaining = remaining.saturating_sub(c.size);
            deletions.push(Deletion {
                candidate: c.clone(),
                why: Why::OverBudget {
                    total_before,
                    budget,
                },
            });
        }
    }
    Plan {
        deletions,
        total_after: remaining,
        over_budget_by: policy
            .budget
            .map(|b| remaining.saturating_sub(b))
            .unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn t(hours: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).unwrap() + Duration::hours(hours)
    }

    fn c(id: &str, size: u64, tier: Tier, last_used_h: i64) -> Candidate {
        Candidate {
            id: id.into(),
            size,
            tier,
            last_used: t(last_used_h),
        }
    }

    fn policy(budget: Option<u64>) -> Policy {
        Policy {
            budget,
            keep: Duration::hours(48),
            grace: Duration::hours(1),
        }
    }

    fn ids(p: &Plan) -> Vec<&str> {
        p.deletions
            .iter()
            .map(|d| d.candidate.id.as_str())
            .collect()
    }

    #[test]
    fn orphans_and_objects_past_keep_go_whatever_the_budget() {
        let now = t(100);
        let cands = [
            c("orphan-old", 5, Tier::Orphan, 90),
            c("orphan-fresh", 5, Tier::Orphan, 100),
            c("ckpt-stale", 7, Tier::CacheCheckpoint, 10),
            c("ckpt-recent", 7, Tier::CacheCheckpoint, 80),
        ];
        let p = plan(&cands, 1000, &policy(None), now);
        assert_eq!(ids(&p), ["orphan-old", "ckpt-stale"]);
        assert_eq!(p.deletions[0].why, Why::Unreferenced);
        assert!(matches!(p.deletions[1].why, Why::PastKeep { .. }));
        assert_eq!((p.total_after, p.over_budget_by), (988, 0));
    }

    #[test]
    fn over_budget_goes_cheapest_tier_first_then_oldest_and_stops_at_the_budget() {
        let now = t(100);
        let cands = [
            c("final-a", 10, Tier::FinalResult, 60),
            c("ckpt-new", 10, Tier::CacheCheckpoint, 90),
            c("ckpt-old", 10, Tier::CacheCheckpoint, 70),
            c("superseded", 10, Tier::SupersededCheckpoint, 95),
            c("surplus", 10, Tier::SurplusFinalResult, 61),
        ];
        // 100 stored, budget 75: three objects of 10 must go.
        let p = plan(&cands, 100, &policy(Some(75)), now);
        assert_eq!(ids(&p), ["superseded", "ckpt-old", "ckpt-new"]);
        assert_eq!((p.total_after, p.over_budget_by), (70, 0));
        assert!(p.deletions.iter().all(|d| matches!(
            d.why,
            Why::OverBudget {
                total_before: 100,
                budget: 75
            }
        )));
    }

    #[test]
    fn an_unreachable_budget_is_reported_and_the_grace_period_is_never_crossed() {
        let now = t(100);
        let cands = [
            c("just-written", 50, Tier::SupersededCheckpoint, 100),
            c("old", 10, Tier::CacheCheckpoint, 90),
        ];
        let p = plan(&cands, 200, &policy(Some(100)), now);
        assert_eq!(ids(&p), ["old"]);
        assert_eq!((p.total_after, p.over_budget_by), (190, 90));
    }

    fn candidate() -> impl Strategy<Value = Candidate> {
        (
            0u32..1000,
            1u64..100,
            proptest::sample::select(Tier::ALL.to_vec()),
            0i64..200,
        )
            .prop_map(|(id, size, tier, h)| c(&format!("o{id}"), size, tier, h))
    }

    proptest! {
        /// Nothing inside the grace period goes, every orphan past it goes, the budget is met
        /// whenever the eligible objects could meet it, and no object goes twice.
        #[test]
        fn plans_respect_grace_budget_and_uniqueness(
            mut cands in proptest::collection::vec(candidate(), 0..40),
            rooted in 0u64..500,
            budget in proptest::option::of(0u64..2000),
        ) {
            cands.sort_by(|a, b| a.id.cmp(&b.id));
            cands.dedup_by(|a, b| a.id == b.id);
            let now = t(200);
            let pol = policy(budget);
            let total = rooted + cands.iter().map(|c| c.size).sum::<u64>();
            let p = plan(&cands, total, &pol, now);
            let mut seen = std::collections::BTreeSet::new();
            for d in &p.deletions {
                prop_assert!(seen.insert(d.candidate.id.clone()));
                prop_assert!(now - d.candidate.last_used >= pol.grace);
            }
            for c in &cands {
                if c.tier == Tier::Orphan && now - c.last_used >= pol.grace {
                    prop_assert!(seen.contains(&c.id));
                }
            }
            let deleted: u64 = p.deletions.iter().map(|d| d.candidate.size).sum();
            prop_assert_eq!(p.total_after, total - deleted);
            if let Some(b) = budget {
                let eligible: u64 = cands
                    .iter()
                    .filter(|c| now - c.last_used >= pol.grace)
                    .map(|c| c.size)
                    .sum();
                if total - eligible <= b {
                    prop_assert!(p.total_after <= b);
                    prop_assert_eq!(p.over_budget_by, 0);
                }
            }
        }
    }
}
