//! COPY_FROM, strata's step for `COPY --from=<stage>`: files copied out of another template of
//! the team on the node, with COPY's semantics, keyed by the source's content.

use crate::common;

use common::sandbox::sh;
use common::worker_fixture::*;
use serde_json::json;
use strata::domain::build::{FailedStep, Phase};
use strata::domain::ids::TeamId;

fn copy_from(template: &str, src: &str, dest: &str, owner: &str, mode: &str) -> serde_json::Value {
    step("COPY_FROM", &[template, src, dest, owner, mode])
}

async fn build(fx: &Fixture, name: &str, spec: serde_json::Value) -> strata::domain::build::State {
    let (_, build) = fx.api.register(name).await;
    fx.api.start(build, spec).await;
    fx.wait_terminal(build).await
}

fn error_of(state: &strata::domain::build::State) -> (Option<FailedStep>, String) {
    let Phase::Error { reason, .. } = &state.phase else {
        panic!("expected error, got {:?}", state.phase)
    };
    (reason.step, reason.message.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stage_s_files_are_copied_into_another_template_on_the_node() {
    let mut fx = Fixture::new(settings()).await;
    let stage = |message: &str| {
        json!({"fromImage": "busybox", "force": false, "steps": [step("RUN", &[&format!(
            "mkdir -p /out/bin /out/share && echo {message} > /out/share/msg \
             && printf '#!/bin/sh\\necho app\\n' > /out/bin/app && chmod 0750 /out/bin/app \
             && ln -s ../share/msg /out/bin/msg-link && ln -s /etc/shadow /out/escape"
        ), "root"]), step("USER", &["user"]), step("WORKDIR", &["/home/user"])]})
    };
    assert_ready(&build(&fx, "stage-build", stage("first")).await);
    let final_spec = json!({"fromImage": "busybox", "force": false, "steps": [
        copy_from("stage-build", "/out", "/srv/", "", ""),
        copy_from("stage-build", "/out/bin/app", "/usr/local/bin/", "root:root", "0755"),
    ]});
    assert_ready(&build(&fx, "final", final_spec.clone()).await);
    let result = fx.result("final").await;
    let mut sb = boot_on(&result.record.layers).await;
    let got = sh(
        &mut sb,
        "cat /srv/share/msg; /srv/bin/app; readlink /srv/bin/msg-link; readlink /srv/escape; \
         stat -c '%a %U' /srv/bin/app /usr/local/bin/app /srv/share/msg; \
         test -e /srv/out && echo nested-wrongly; true",
    )
    .await;
    sb.destroy().await.unwrap();
    // A directory's contents merge into the destination, as COPY's do; a symlink is copied as
    // the link, so one naming /etc/shadow names the final template's own file (a FIFO, which a
    // checkpoint never holds, is left out: `fs_archive`'s tests). Owners default to the current
    // user, as with COPY.
    assert_eq!(
        got,
        "first\napp\n../share/msg\n/etc/shadow\n750 user\n755 root\n644 user\n"
    );

    // Unchanged source, unchanged steps: the same result from the cache.
    assert_ready(&build(&fx, "final", final_spec.clone()).await);
    assert_eq!(fx.result("final").await.record.layers, result.record.layers);
    // The source rebuilt unchanged (a new build from the cache, its steps after the last
    // mutating one included): still the same key.
    assert_ready(&build(&fx, "stage-build", stage("first")).await);
    assert_ready(&build(&fx, "final", final_spec.clone()).await);
    assert_eq!(fx.result("final").await.record.layers, result.record.layers);
    // A source rebuilt with other contents is another key: the copy runs again.
    assert_ready(&build(&fx, "stage-build", stage("second")).await);
    assert_ready(&build(&fx, "final", final_spec).await);
    let rebuilt = fx.result("final").await;
    assert_ne!(rebuilt.record.layers, result.record.layers);
    let mut sb = boot_on(&rebuilt.record.layers).await;
    assert_eq!(sh(&mut sb, "cat /srv/share/msg").await, "second\n");
    sb.destroy().await.unwrap();
    fx.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_missing_path_or_another_team_s_template_fails_the_step_by_name() {
    let mut fx = Fixture::new(settings()).await;
    assert_ready(
        &build(
            &fx,
            "source",
            json!({"fromImage": "busybox", "force": false, "steps": [step("RUN", &["mkdir -p /out", "root"])]}),
        )
        .await,
    );
    let (at, message) = error_of(
        &build(
            &fx,
            "copies-nothing",
            json!({"fromImage": "busybox", "force": false, "steps": [
                step("RUN", &["true"]),
                copy_from("source", "/out/missing", "/x", "", ""),
            ]}),
        )
        .await,
    );
    assert_eq!(at, Some(FailedStep::Step(2)));
    assert!(
        message.contains("/out/missing") && message.contains("does not exist"),
        "{message}"
    );

    // Another team's build of the same name is not this team's template.
    let other = common::build_api::Api {
        store: fx.store.clone(),
        team: TeamId::parse("otherteam1").unwrap(),
    };
    let (_, theirs) = other.register("private").await;
    other
        .start(
            theirs,
            json!({"fromImage": "busybox", "force": false, "steps": [step("RUN", &["mkdir -p /secret", "root"])]}),
        )
        .await;
    assert_ready(&fx.wait_terminal(theirs).await);
    let (at, message) = error_of(
        &build(
            &fx,
            "steals",
            json!({"fromImage": "busybox", "force": false, "steps": [
                copy_from("private", "/secret", "/x", "", ""),
            ]}),
        )
        .await,
    );
    assert_eq!(at, Some(FailedStep::Step(1)));
    assert!(message.contains("does not exist in team"), "{message}");
    fx.stop().await;
}
