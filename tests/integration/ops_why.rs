//! `strata why` on real builds: a failing RUN, a build whose node was lost and which the
//! attempt-expiry reconciler ended, and a rebuild in which one COPY's files changed. Builds run
//! on the in-process worker in real sandboxes; the answers are read back from the events and
//! logs only, through the library and through the `strata why` binary.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::worker_fixture::*;
use serde_json::json;
use strata::domain::build::{FailureKind, Phase};
use strata::domain::ids::{BuildId, FilesHash};
use strata::inspect::why::{KeyPart, Why};
use strata::reconcilers::{attempt_expiry, ReconcileEnv};

impl Fixture {
    async fn why(&self, build: BuildId) -> Why {
        strata::inspect::why_build(&self.store, build)
            .await
            .unwrap()
    }

    /// `strata why build ID --json` as a child process against this test's database.
    fn why_cli(&self, build: BuildId) -> serde_json::Value {
        let out = std::process::Command::new(common::strata_bin())
            .args(["why", "build", &build.to_string(), "--json"])
            .env("DATABASE_URL", &self.db.url)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_run_is_explained_by_its_step_exit_code_and_last_log_lines() {
    let mut fx = Fixture::new(settings()).await;
    let (build, state) = fx
        .build(
            "why-fails",
            &[],
            json!({"fromImage": "busybox", "force": false, "steps": [
                step("RUN", &["echo preparing"]),
                step("RUN", &["echo compiling; echo 'error: missing semicolon' >&2; exit 3"]),
                step("RUN", &["echo never"]),
            ]}),
        )
        .await;
    assert!(
        matches!(state.phase, Phase::Error { .. }),
        "{:?}",
        state.phase
    );

    let why = fx.why(build).await;
    assert_eq!(why.status, "error");
    let f = why.failure.as_ref().expect("a failure explanation");
    assert_eq!(f.kind, FailureKind::StepFailed);
    assert_eq!(f.step.as_deref(), Some("2"));
    assert_eq!(
        f.instruction.as_deref(),
        Some("RUN echo compiling; echo 'error: missing semicolon' >&2; exit 3")
    );
    assert_eq!(f.exit_code, Some(3));
    assert_eq!(f.ended_by, "worker/test-node");
    assert_eq!(f.epoch, Some(1));
    assert!(
        f.last_log_lines.iter().any(|l| l == "compiling"),
        "{:?}",
        f.last_log_lines
    );
    assert!(
        f.last_log_lines
            .iter()
            .any(|l| l == "error: missing semicolon"),
        "{:?}",
        f.last_log_lines
    );
    // Only the failing step's lines.
    assert!(!f.last_log_lines.iter().any(|l| l == "preparing"));
    let cache = why.cache.as_ref().unwrap();
    assert_eq!(cache.steps[2].outcome, "not_run");
    assert!(cache.steps[2].reason.contains("ended before this step"));

    // The CLI prints the same answer.
    let cli = fx.why_cli(build);
    assert_eq!(cli["failure"]["exit_code"], 3);
    assert_eq!(cli["failure"]["step"], "2");
    assert_eq!(cli, serde_json::to_value(&why).unwrap());
    fx.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_node_is_explained_by_the_reconciler_and_its_evidence() {
    let mut fx = Fixture::new(settings()).await;
    let build = fx
        .start_build(
            "why-lost",
            &[],
            json!({"fromImage": "busybox", "force": false, "steps": [
                step("RUN", &["echo first"]),
                step("RUN", &["sleep 60"]),
            ]}),
        )
        .await;
    // Wait until the node is inside the long step, then stop it: it abandons the attempt
    // without another write, as a dead node would.
    for _ in 0..600 {
        if fx
            .logs(build)
            .await
            .iter()
            .any(|l| l.2.starts_with("[2/2] RUN sleep 60"))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    fx.stop().await;
    assert!(matches!(fx.state(build).await.phase, Phase::Active { .. }));

    let env = ReconcileEnv {
        store: fx.store.clone(),
        node: "reconciler-a".into(),
        blobs: Arc::new(
            strata::vmm::LocalBlobStore::open(common::sandbox::node_dir().join("blobs")).unwrap(),
        ),
        gc: Default::default(),
        catalog: None,
    };
    let mut applied = false;
    for _ in 0..200 {
        if attempt_expiry::pass(&env).await.unwrap().applied == 1 {
            applied = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(applied, "the reconciler never closed the attempt");

    let why = fx.why(build).await;
    let f = why.failure.as_ref().expect("a failure explanation");
    assert_eq!(f.kind, FailureKind::NodeLost);
    assert_eq!(f.ended_by, "reconciler/reconciler-a");
    assert_eq!(f.epoch, Some(1));
    let evidence = f.evidence.as_deref().unwrap();
    assert!(
        evidence.contains("attempt 1 on node test-node"),
        "{evidence}"
    );
    assert!(evidence.contains("the lease expired at"), "{evidence}");
    assert!(
        evidence.contains("reconciler reconciler-a closed the attempt"),
        "{evidence}"
    );
    assert!(
        evidence.contains("1 of 2 steps had completed"),
        "{evidence}"
    );
    assert!(why.to_text().contains("NodeLost"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rebuild_with_one_changed_copy_names_the_file_hash_and_the_chained_misses() {
    let mut fx = Fixture::new(settings()).await;
    let v1 = files_hash("config v1");
    let v2 = files_hash("config v2");
    let recipe = |hash: &FilesHash| {
        json!({"fromImage": "busybox", "force": false, "steps": [
            step("RUN", &["echo base > base.txt"]),
            step("ENV", &["MODE", "prod"]),
            copy("config.txt", "./", "", "", hash),
            step("RUN", &["cat config.txt > seen.txt"]),
        ]})
    };
    let (first, s1) = fx
        .build(
            "why-cache",
            &[(&v1, single_file_tar("config.txt", b"v1\n"))],
            recipe(&v1),
        )
        .await;
    assert_ready(&s1);
    let (second, s2) = fx
        .build(
            "why-cache",
            &[(&v2, single_file_tar("config.txt", b"v2\n"))],
            recipe(&v2),
        )
        .await;
    assert_ready(&s2);

    // The first build: no earlier build to share entries with.
    let why1 = fx.why(first).await;
    let c1 = why1.cache.as_ref().unwrap();
    assert_eq!(c1.compared_with, None);
    assert!(c1.steps.iter().all(|s| !s.hit));
    assert!(
        c1.steps[0].reason.contains("no earlier build"),
        "{}",
        c1.steps[0].reason
    );

    let why2 = fx.why(second).await;
    assert!(why2.failure.is_none());
    let c = why2.cache.as_ref().unwrap();
    assert_eq!(c.compared_with.as_deref(), Some(first.to_string().as_str()));
    // Step 1 is unchanged: resumed from its checkpoint.
    assert!(c.steps[0].hit, "{:?}", c.steps[0]);
    assert_eq!(c.steps[0].outcome, "cached");
    // Step 2 (ENV) has an unchanged key but is never a checkpoint: replayed after step 1.
    assert!(!c.steps[1].hit);
    assert!(
        c.steps[1].reason.contains("never checkpoints"),
        "{}",
        c.steps[1].reason
    );
    // Step 3: the COPY's files changed, by filesHash and blob digest.
    match &c.steps[2].changed {
        Some(KeyPart::FileHash {
            step,
            files_hash_before,
            files_hash_after,
            blob_before,
            blob_after,
        }) => {
            assert_eq!(*step, 3);
            assert_eq!(files_hash_before, v1.as_str());
            assert_eq!(files_hash_after, v2.as_str());
            assert_ne!(blob_before, blob_after);
            assert!(blob_after.as_deref().unwrap().starts_with("sha256:"));
        }
        other => panic!("expected a file-hash change at step 3, got {other:?}"),
    }
    assert_eq!(c.steps[2].outcome, "checkpointed");
    // Step 4 changed only because step 3 did.
    assert_eq!(c.steps[3].changed, Some(KeyPart::EarlierStep { step: 3 }));
    assert!(
        c.final_result.contains("step 3 changed"),
        "{}",
        c.final_result
    );

    // An unchanged rebuild of the first recipe is a final hit, explained as such.
    let (third, s3) = fx
        .build(
            "why-cache",
            &[(&v1, single_file_tar("config.txt", b"v1\n"))],
            recipe(&v1),
        )
        .await;
    assert_ready(&s3);
    let c3 = fx.why(third).await.cache.unwrap();
    assert_eq!(
        c3.compared_with.as_deref(),
        Some(first.to_string().as_str())
    );
    assert!(c3.steps.iter().all(|s| s.hit), "{:?}", c3.steps);
    assert!(
        c3.final_result.starts_with("cache hit"),
        "{}",
        c3.final_result
    );

    // Text form, as the CLI prints it.
    let text = why2.to_text();
    assert!(text.contains("copies different files"), "{text}");
    fx.stop().await;
}
