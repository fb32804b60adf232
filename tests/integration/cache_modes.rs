//! Cache modes end to end (`STRATA_CACHE_MODE`, resolved at start as the start handler does):
//! `off` reads and writes nothing and checkpoints nothing, `final` caches only the final
//! result and resumes from no checkpoint, an unknown value is skipped for the default, and a
//! build records its mode with the level it came from.

use crate::common;

use common::build_api::stream;
use common::sandbox::sh;
use common::worker_fixture::*;
use serde_json::json;
use strata::domain::build::{self, CacheFound, Event, StepOutcome};
use strata::domain::cache_entry::EntryKind;
use strata::domain::cache_mode::{CacheMode, Level};
use uuid::Uuid;

impl Fixture {
    /// The kinds of the team's live cache entries.
    async fn entry_kinds(&self) -> Vec<EntryKind> {
        live_kinds(&self.entries().await)
    }

    async fn events_of(&self, build: strata::domain::ids::BuildId) -> Vec<Event> {
        self.store
            .read_stream_all(&stream(strata::domain::ids::stream::build(&build)))
            .await
            .unwrap()
            .iter()
            .map(|e| e.decode::<Event>().unwrap())
            .collect()
    }

    async fn lines(&self, build: strata::domain::ids::BuildId) -> Vec<String> {
        self.logs(build).await.into_iter().map(|l| l.2).collect()
    }

    /// The kinds of the live entries once there are `n` (the final entry is written after the
    /// build is Ready).
    async fn entries_settle_at(&self, n: usize) -> Vec<EntryKind> {
        live_kinds(&self.entries_when(|e| live_kinds(e).len() == n).await)
    }
}

fn live_kinds(
    entries: &std::collections::BTreeMap<
        strata::domain::cache_key::CacheKey,
        strata::domain::cache_entry::State,
    >,
) -> Vec<EntryKind> {
    entries
        .values()
        .filter_map(|s| s.live().map(|(e, _)| e.target.kind()))
        .collect()
}

fn recipe(nonce: Uuid, last: &str) -> serde_json::Value {
    json!({
        "fromImage": "busybox",
        "force": false,
        "steps": [
            step("RUN", &[&format!("echo {nonce} > /tmp/first")]),
            step("ENV", &["A", "1"]),
            step("RUN", &["echo second > /tmp/second"]),
            step("RUN", &[last]),
        ],
    })
}

fn outcomes(state: &build::State) -> Vec<&'static str> {
    state
        .progress
        .values()
        .map(|o| match o {
            StepOutcome::Executed => "executed",
            StepOutcome::Checkpointed { .. } => "checkpointed",
            StepOutcome::Cached { .. } => "cached",
        })
        .collect()
}

fn ready(state: &build::State) {
    assert!(
        matches!(state.phase, build::Phase::Ready { .. }),
        "{:?}",
        state.phase
    );
}

#[tokio::test]
async fn mode_off_runs_every_step_and_reads_and_writes_no_cache() {
    let mut fx = Fixture::new(settings()).await;
    let nonce = Uuid::new_v4();
    for round in 0..2 {
        let (b, s) = fx
            .build_in_mode("off", &[], recipe(nonce, "echo last > /tmp/last"), "off")
            .await;
        ready(&s);
        assert_eq!(
            outcomes(&s),
            ["executed"; 4],
            "round {round}: every step runs and none is checkpointed"
        );
        let resolved = s.cache_mode.clone().expect("the mode is recorded");
        assert_eq!(
            (resolved.mode, resolved.level),
            (CacheMode::Off, Level::Service)
        );
        let lines = fx.lines(b).await;
        assert!(
            lines
                .iter()
                .any(|l| l == "[cache] mode off (service setting STRATA_CACHE_MODE)"),
            "{lines:#?}"
        );
        let events = fx.events_of(b).await;
        assert!(
            events.iter().any(|e| matches!(e, Event::CacheConsulted { consultation, .. }
                if matches!(&consultation.found, CacheFound::Bypassed { reason } if reason.contains("cache mode off")))),
            "{events:#?}"
        );
    }
    assert!(fx.entry_kinds().await.is_empty(), "nothing was written");
    let mut sb = boot_on(&fx.result("off").await.record.layers).await;
    assert_eq!(
        sh(&mut sb, "cat /tmp/second /tmp/last").await,
        "second\nlast\n"
    );
    sb.destroy().await.unwrap();
    fx.stop().await;
}

#[tokio::test]
async fn mode_final_caches_only_the_final_result_and_resumes_from_no_checkpoint() {
    let mut fx = Fixture::new(settings()).await;
    let nonce = Uuid::new_v4();
    let (_, cold) = fx
        .build_in_mode("final", &[], recipe(nonce, "echo one > /tmp/last"), "final")
        .await;
    ready(&cold);
    assert_eq!(outcomes(&cold), ["executed"; 4], "no checkpoints");
    assert_eq!(
        fx.entries_settle_at(1).await,
        [EntryKind::FinalResult],
        "only the final result is cached"
    );

    let (b, again) = fx
        .build_in_mode("final", &[], recipe(nonce, "echo one > /tmp/last"), "final")
        .await;
    ready(&again);
    assert_eq!(
        outcomes(&again),
        ["cached"; 4],
        "the unchanged rebuild hits"
    );
    assert!(fx
        .lines(b)
        .await
        .iter()
        .any(|l| l.contains("[cache] final result: cache hit")));

    // The last step changed: with no checkpoints there is nothing to resume from.
    let (b, changed) = fx
        .build_in_mode("final", &[], recipe(nonce, "echo two > /tmp/last"), "final")
        .await;
    ready(&changed);
    assert_eq!(outcomes(&changed), ["executed"; 4]);
    let lines = fx.lines(b).await;
    assert!(
        !lines.iter().any(|l| l.starts_with("[cache] step ")),
        "no checkpoint is probed: {lines:#?}"
    );
    // `strata why` says which mode the build ran, and from which setting.
    let facts = strata::inspect::facts::load(&fx.store, b).await.unwrap();
    let why = strata::inspect::why::why(&facts, &[]).to_text();
    assert!(
        why.contains("cache mode: final (service setting STRATA_CACHE_MODE)"),
        "{why}"
    );
    let mut sb = boot_on(&fx.result("final").await.record.layers).await;
    assert_eq!(
        sh(&mut sb, "cat /tmp/second /tmp/last").await,
        "second\ntwo\n"
    );
    sb.destroy().await.unwrap();
    fx.stop().await;
}

#[tokio::test]
async fn a_final_result_cached_by_the_step_cache_serves_a_final_mode_build_and_an_unknown_mode_is_skipped(
) {
    let mut fx = Fixture::new(settings()).await;
    let nonce = Uuid::new_v4();
    // An unknown value is skipped, said in the log, and the default (steps) runs.
    let (b, steps) = fx
        .build_in_mode("switch", &[], recipe(nonce, "echo one > /tmp/last"), "fast")
        .await;
    ready(&steps);
    let resolved = steps.cache_mode.clone().unwrap();
    assert_eq!(
        (resolved.mode, resolved.level),
        (CacheMode::Steps, Level::Default)
    );
    let lines = fx.lines(b).await;
    assert!(
        lines.iter().any(|l| l.starts_with(
            "[cache] service setting STRATA_CACHE_MODE: \"fast\" is not a cache mode"
        )),
        "{lines:#?}"
    );
    assert_eq!(
        outcomes(&steps),
        ["checkpointed", "executed", "checkpointed", "checkpointed"]
    );
    assert_eq!(
        fx.entries_settle_at(4).await.len(),
        4,
        "three checkpoints and the result"
    );

    // Moved to `final`: the step cache's final result is valid there too.
    let (_, hit) = fx
        .build_in_mode(
            "switch",
            &[],
            recipe(nonce, "echo one > /tmp/last"),
            "final",
        )
        .await;
    ready(&hit);
    assert_eq!(outcomes(&hit), ["cached"; 4]);
    fx.stop().await;
}
