//! Fair share across teams (ADR 0024), with a real worker and the real read models: the queue
//! goes round by round across teams, and a team's running-build limit holds even when nodes
//! claim at the same moment.

use crate::common;

use std::time::Duration;

use common::build_api::Api;
use common::worker_fixture::{self, step, Fixture};
use serde_json::json;
use strata::domain::ids::{BuildId, TeamId};
use strata::projections::builds::queue;
use strata::worker::{attempt, Worker};

fn team(name: &str) -> TeamId {
    TeamId::parse(name).unwrap()
}

fn api_of(f: &Fixture, name: &str) -> Api {
    Api {
        store: f.store.clone(),
        team: team(name),
    }
}

/// A queued build of `api`'s team: one step, so it runs in well under a second.
async fn queued(api: &Api, name: &str) -> BuildId {
    let (_, build) = api.register(name).await;
    api.start(
        build,
        json!({"fromImage": "busybox", "force": false,
               "steps": [step("RUN", &[&format!("echo {name} > /tmp/built")])]}),
    )
    .await;
    build
}

/// The builds of `among` in the order their first attempt was acquired.
async fn acquisition_order(f: &Fixture, among: &[BuildId]) -> Vec<BuildId> {
    let streams: Vec<String> = among.iter().map(|b| format!("build-{b}")).collect();
    let rows: Vec<String> = sqlx::query_scalar(
        "SELECT stream_id FROM events
         WHERE type = 'AttemptAcquired.v1' AND stream_id = ANY($1)
         ORDER BY position",
    )
    .bind(&streams)
    .fetch_all(&f.db.pool)
    .await
    .unwrap();
    let mut seen = Vec::new();
    for stream in rows {
        let b = among[streams.iter().position(|s| *s == stream).unwrap()];
        if !seen.contains(&b) {
            seen.push(b);
        }
    }
    seen
}

/// The issue: queued builds were taken oldest first across all teams, so team B's one build,
/// queued behind team A's twenty, waited for all twenty on a one-slot node. Now B's build is
/// the second one the node takes: A's first (older, nobody served yet), then B's (A was just
/// served), then A's again.
#[tokio::test]
async fn one_teams_burst_delays_another_teams_build_by_at_most_one_slot() {
    let mut f = Fixture::with_worker(None).await;
    let a = api_of(&f, "team-burst");
    let b = api_of(&f, "team-single");
    let mut a_builds = Vec::new();
    for i in 0..20 {
        a_builds.push(queued(&a, &format!("burst-{i}")).await);
    }
    let lone = queued(&b, "lone").await;

    let mut settings = worker_fixture::settings();
    settings.max_builds = 1;
    let worker = Worker::new(f.store.clone(), settings).unwrap();
    let token = f.shutdown.clone();
    f.worker = Some(tokio::spawn(async move {
        worker.run_until(token).await.unwrap()
    }));
    worker_fixture::assert_ready(&f.wait_terminal(lone).await);
    // Let the node take one more, to see whose turn follows B's.
    let third = a_builds[1];
    f.wait_terminal(third).await;
    f.stop().await;

    let mut all = a_builds.clone();
    all.push(lone);
    let order = acquisition_order(&f, &all).await;
    assert_eq!(
        &order[..3],
        &[a_builds[0], lone, a_builds[1]],
        "team A's first build, then team B's, then A's next"
    );
}

/// The queue as the read model orders it: round by round across teams (the oldest registered
/// first among teams never served), and a team at its running limit left out entirely.
#[tokio::test]
async fn the_queue_takes_teams_in_turn_and_leaves_out_a_team_at_its_limit() {
    let f = Fixture::with_worker(None).await;
    let (a, b, c) = (
        api_of(&f, "team-a"),
        api_of(&f, "team-b"),
        api_of(&f, "team-c"),
    );
    let a1 = queued(&a, "a1").await;
    let a2 = queued(&a, "a2").await;
    let a3 = queued(&a, "a3").await;
    let b1 = queued(&b, "b1").await;
    let b2 = queued(&b, "b2").await;
    let c1 = queued(&c, "c1").await;

    let order = |q: Vec<strata::projections::builds::QueuedBuild>| {
        q.into_iter()
            .map(|q| (q.build, q.round))
            .collect::<Vec<_>>()
    };
    let q = queue(&f.db.pool, 100, None).await.unwrap();
    assert_eq!(
        order(q),
        vec![(a1, 0), (b1, 0), (c1, 0), (a2, 1), (b2, 1), (a3, 2)]
    );

    // Team A's oldest starts: its others move back a round (and within a round, behind the
    // teams served longer ago), and with a limit of one running build they are not offered.
    let running = attempt::acquire(&f.store, a1, "node-x", Duration::from_secs(30), Some(1))
        .await
        .unwrap();
    assert!(running.is_some());
    let q = queue(&f.db.pool, 100, None).await.unwrap();
    assert_eq!(order(q), vec![(b1, 0), (c1, 0), (b2, 1), (a2, 1), (a3, 2)]);
    let q = queue(&f.db.pool, 100, Some(1)).await.unwrap();
    assert_eq!(order(q), vec![(b1, 0), (c1, 0), (b2, 1)]);
    // The window is the fair order's prefix, not the oldest builds'.
    let q = queue(&f.db.pool, 2, None).await.unwrap();
    assert_eq!(order(q), vec![(b1, 0), (c1, 0)]);
}

/// Two nodes claiming two builds of one team at the same moment, with a limit of one running
/// build: exactly one acquire commits, whatever the interleaving (the limit is counted inside
/// each acquire's transaction). Another team's build is not held back by it.
#[tokio::test]
async fn a_teams_running_limit_holds_when_nodes_claim_at_once() {
    let f = Fixture::with_worker(None).await;
    let a = api_of(&f, "team-racing");
    let other = api_of(&f, "team-other");
    let lease = Duration::from_secs(30);
    for round in 0..5 {
        let x = queued(&a, &format!("x{round}")).await;
        let y = queued(&a, &format!("y{round}")).await;
        let (got_x, got_y) = tokio::join!(
            attempt::acquire(&f.store, x, "node-1", lease, Some(round + 1)),
            attempt::acquire(&f.store, y, "node-2", lease, Some(round + 1)),
        );
        let won = [got_x.unwrap(), got_y.unwrap()]
            .into_iter()
            .filter(Option::is_some)
            .count();
        assert_eq!(
            won,
            1,
            "round {round}: the team may run {} builds",
            round + 1
        );
        let running: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM builds WHERE team_id = $1 AND phase = 'active'",
        )
        .bind(a.team.as_str())
        .fetch_one(&f.db.pool)
        .await
        .unwrap();
        assert_eq!(running, i64::from(round) + 1);
    }
    let theirs = queued(&other, "theirs").await;
    assert!(
        attempt::acquire(&f.store, theirs, "node-1", lease, Some(1))
            .await
            .unwrap()
            .is_some(),
        "another team's limit is its own"
    );
}
