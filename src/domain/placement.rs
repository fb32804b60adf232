//! Cache-aware placement (ADR 0020): which of the queued builds a free build node claims, and
//! in which order, given which live nodes hold which of their layers.
//!
//! A build "wants" the layer stack it would boot on: its deepest cached checkpoint's, else its
//! base's. Each live node holds some bytes of that stack in its local layer cache. The nodes
//! holding the most are the build's preferred nodes (all of them on a tie). A node:
//! * claims a build it is preferred for (`hit`);
//! * claims a build no live node holds any of, or whose stack it could not tell (`none`);
//! * leaves a build preferred for another node to that node, but only for `wait` after the
//!   build was queued; past that it claims it like any other (`miss`): nobody waits longer
//!   for a cache, whether the preferred node is busy, stopped or gone.
//!
//! Order of the claimable builds: fair share first, then cache. The queue comes in fair-share
//! rounds across teams (`projections::builds::queue`, ADR 0024), and a lower round always goes
//! first, so a team whose builds the cache favours cannot jump another team's turn. Within a
//! round: the ones past the wait first (oldest queued first), then hits, then the rest, each in
//! queue order. Past-the-wait first keeps the bound a bound: a node with a steady stream of
//! hits still takes an overdue build before its next hit.
//!
//! Residency is a hint: every input here may be stale, and the worst a wrong answer does is
//! make a node fetch layers from the blob store or leave a build queued for at most `wait`.

use std::collections::HashMap;
use std::time::Duration;

use super::ids::{BuildId, Digest};

/// One queued build as a node sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub build: BuildId,
    /// Time since it was queued, by the database clock.
    pub waited: Duration,
    /// The layers it would boot on, bottom first; `None` when this node cannot tell (a
    /// registry base it never pulled, an unreadable index) or when no sandbox is needed (a
    /// final cache hit): no node is preferred.
    pub wants: Option<Vec<Digest>>,
    /// Its fair-share round: lower rounds are claimed first, whatever the cache says.
    pub round: u32,
}

/// Which live node holds which layers, and how many bytes of each.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Residency {
    by_layer: HashMap<Digest, Vec<(String, u64)>>,
}

impl Residency {
    /// `rows`: `(node, layer, bytes)` of live nodes only.
    pub fn from_rows(rows: impl IntoIterator<Item = (String, Digest, u64)>) -> Residency {
        let mut by_layer: HashMap<Digest, Vec<(String, u64)>> = HashMap::new();
        for (node, digest, bytes) in rows {
            by_layer.entry(digest).or_default().push((node, bytes));
        }
        Residency { by_layer }
    }

    /// Bytes of `wants` each node holds (a layer counted once even if wanted twice).
    fn held(&self, wants: &[Digest]) -> HashMap<&str, u64> {
        let mut held: HashMap<&str, u64> = HashMap::new();
        let mut seen = std::collections::HashSet::new();
        for digest in wants.iter().filter(|d| seen.insert(*d)) {
            for (node, bytes) in self.by_layer.get(digest).into_iter().flatten() {
                *held.entry(node.as_str()).or_default() += bytes.max(&1);
            }
        }
        held
    }
}

/// What a node makes of one queued build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// This node holds at least as much of the build's stack as any live node.
    Hit { bytes: u64 },
    /// Another node holds more, and the build has waited `wait` for it: claimed anyway.
    Miss { preferred: String },
    /// No live node holds any of its stack, or the stack is unknown here.
    None,
    /// Left to `preferred` for `remaining` more.
    Deferred {
        preferred: String,
        remaining: Duration,
    },
}

impl Verdict {
    /// The metric label and log field of a claimed build.
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Hit { .. } => "hit",
            Verdict::Miss { .. } => "miss",
            Verdict::None => "none",
            Verdict::Deferred { .. } => "deferred",
        }
    }
}

/// The verdict of `node` on `candidate`.
pub fn judge(node: &str, candidate: &Candidate, residency: &Residency, wait: Duration) -> Verdict {
    let Some(wants) = candidate.wants.as_deref() else {
        return Verdict::None;
    };
    let held = residency.held(wants);
    let mine = held.get(node).copied().unwrap_or(0);
    // The preferred node: most bytes, then the smallest id, so every node names the same one.
    let best = held
        .iter()
        .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
        .map(|(n, b)| (n.to_string(), *b));
    match best {
        None => Verdict::None,
        Some((_, most)) if mine >= most => Verdict::Hit { bytes: mine },
        Some((preferred, _)) if candidate.waited >= wait => Verdict::Miss { preferred },
        Some((preferred, _)) => Verdict::Deferred {
            preferred,
            remaining: wait - candidate.waited,
        },
    }
}

/// The builds `node` may claim now, in the order to try them, and when the first deferred
/// build becomes claimable (when one is deferred).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub claimable: Vec<(BuildId, Verdict)>,
    pub deferred: Vec<(BuildId, Verdict)>,
    pub next_due: Option<Duration>,
}

/// Orders `queue` (in fair-share order: by round, oldest first) for `node`.
pub fn place(node: &str, queue: &[Candidate], residency: &Residency, wait: Duration) -> Placement {
    let mut placed = Placement {
        claimable: Vec::new(),
        deferred: Vec::new(),
        next_due: None,
    };
    let mut start = 0;
    while start < queue.len() {
        let round = queue[start].round;
        let len = queue[start..]
            .iter()
            .take_while(|c| c.round == round)
            .count();
        let one = place_round(node, &queue[start..start + len], residency, wait);
        placed.claimable.extend(one.claimable);
        placed.deferred.extend(one.deferred);
        placed.next_due = match (placed.next_due, one.next_due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        start += len;
    }
    placed
}

/// Orders the builds of one fair-share round.
fn place_round(
    node: &str,
    queue: &[Candidate],
    residency: &Residency,
    wait: Duration,
) -> Placement {
    let mut overdue = Vec::new();
    let mut hits = Vec::new();
    let mut rest = Vec::new();
    let mut deferred = Vec::new();
    let mut next_due: Option<Duration> = None;
    for candidate in queue {
        let verdict = judge(node, candidate, residency, wait);
        match &verdict {
            Verdict::Deferred { remaining, .. } => {
                next_due = Some(next_due.map_or(*remaining, |d| d.min(*remaining)));
                deferred.push((candidate.build, verdict));
            }
            _ if candidate.waited >= wait => overdue.push((candidate.build, verdict)),
            Verdict::Hit { .. } => hits.push((candidate.build, verdict)),
            _ => rest.push((candidate.build, verdict)),
        }
    }
    overdue.extend(hits);
    overdue.extend(rest);
    Placement {
        claimable: overdue,
        deferred,
        next_due,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(n: u8) -> Digest {
        Digest::from_bytes([n; 32])
    }

    fn build(n: u128) -> BuildId {
        BuildId::from_uuid(uuid::Uuid::from_u128(n))
    }

    fn candidate(n: u128, waited_ms: u64, wants: Option<&[u8]>) -> Candidate {
        Candidate {
            build: build(n),
            waited: Duration::from_millis(waited_ms),
            wants: wants.map(|w| w.iter().map(|d| digest(*d)).collect()),
            round: 0,
        }
    }

    fn residency(rows: &[(&str, u8, u64)]) -> Residency {
        Residency::from_rows(rows.iter().map(|(n, d, b)| (n.to_string(), digest(*d), *b)))
    }

    const WAIT: Duration = Duration::from_secs(5);

    #[test]
    fn the_node_holding_the_most_of_the_stack_is_preferred() {
        // Both hold the base (1); only a holds the checkpoint (2).
        let r = residency(&[("a", 1, 100), ("b", 1, 100), ("a", 2, 10)]);
        let c = candidate(1, 0, Some(&[1, 2]));
        assert_eq!(judge("a", &c, &r, WAIT), Verdict::Hit { bytes: 110 });
        assert_eq!(
            judge("b", &c, &r, WAIT),
            Verdict::Deferred {
                preferred: "a".into(),
                remaining: WAIT
            }
        );
    }

    #[test]
    fn a_tie_prefers_every_node_that_ties() {
        let r = residency(&[("a", 1, 100), ("b", 1, 100)]);
        let c = candidate(1, 0, Some(&[1, 2]));
        assert_eq!(judge("a", &c, &r, WAIT), Verdict::Hit { bytes: 100 });
        assert_eq!(judge("b", &c, &r, WAIT), Verdict::Hit { bytes: 100 });
    }

    #[test]
    fn past_the_wait_any_node_takes_it_and_overdue_builds_go_first() {
        let r = residency(&[("a", 2, 10), ("b", 3, 10)]);
        // 1: preferred for a, overdue; 2: a hit for b, fresh; 3: nobody's, fresh.
        let queue = [
            candidate(1, 5_000, Some(&[2])),
            candidate(2, 0, Some(&[3])),
            candidate(3, 0, Some(&[9])),
        ];
        let p = place("b", &queue, &r, WAIT);
        assert_eq!(
            p.claimable,
            vec![
                (
                    build(1),
                    Verdict::Miss {
                        preferred: "a".into()
                    }
                ),
                (build(2), Verdict::Hit { bytes: 10 }),
                (build(3), Verdict::None),
            ]
        );
        assert_eq!(p.next_due, None);
    }

    #[test]
    fn hits_go_before_builds_nobody_holds_and_deferral_names_when_it_ends() {
        let r = residency(&[("a", 2, 10), ("b", 3, 10)]);
        let queue = [
            candidate(1, 1_000, Some(&[9])),
            candidate(2, 3_000, Some(&[2])),
            candidate(3, 0, Some(&[3])),
            candidate(4, 0, None),
        ];
        let p = place("b", &queue, &r, WAIT);
        assert_eq!(
            p.claimable.iter().map(|(b, _)| *b).collect::<Vec<_>>(),
            vec![build(3), build(1), build(4)]
        );
        assert_eq!(p.deferred.len(), 1);
        assert_eq!(p.next_due, Some(Duration::from_secs(2)));
    }

    #[test]
    fn a_node_with_nothing_resident_defers_until_the_bound_and_never_longer() {
        let r = residency(&[("a", 1, 10)]);
        for waited in [0, 1_000, 4_999] {
            let c = candidate(1, waited, Some(&[1]));
            assert!(matches!(judge("b", &c, &r, WAIT), Verdict::Deferred { .. }));
        }
        for waited in [5_000, 60_000] {
            let c = candidate(1, waited, Some(&[1]));
            assert_eq!(
                judge("b", &c, &r, WAIT),
                Verdict::Miss {
                    preferred: "a".into()
                }
            );
        }
    }

    #[test]
    fn an_unknown_stack_or_an_empty_residency_prefers_nobody() {
        let c = candidate(1, 0, None);
        assert_eq!(
            judge("b", &c, &residency(&[("a", 1, 10)]), WAIT),
            Verdict::None
        );
        let c = candidate(1, 0, Some(&[1]));
        assert_eq!(judge("b", &c, &Residency::default(), WAIT), Verdict::None);
    }

    #[test]
    fn every_node_names_the_same_preferred_node_on_a_tie() {
        let r = residency(&[("b", 1, 10), ("a", 1, 10)]);
        let c = candidate(1, 0, Some(&[1]));
        assert_eq!(
            judge("c", &c, &r, WAIT),
            Verdict::Deferred {
                preferred: "a".into(),
                remaining: WAIT
            }
        );
    }

    #[test]
    fn a_lower_round_goes_first_even_when_a_later_one_is_a_hit() {
        // Build 1 (round 0, another team's first) wants nothing anyone holds; builds 2 and 3
        // are the busy team's next builds (round 1), hits on this node.
        let r = residency(&[("a", 1, 100)]);
        let mut first = candidate(1, 0, Some(&[9]));
        first.round = 0;
        let mut hit = candidate(2, 0, Some(&[1]));
        hit.round = 1;
        let mut overdue = candidate(3, 60_000, Some(&[1]));
        overdue.round = 1;
        let placed = place("a", &[first, hit, overdue], &r, WAIT);
        let order: Vec<BuildId> = placed.claimable.iter().map(|(b, _)| *b).collect();
        assert_eq!(order, vec![build(1), build(3), build(2)]);
    }
}
