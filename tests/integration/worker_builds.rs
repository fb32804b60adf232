//! The build node end to end: builds registered, uploaded and started through the domain's own
//! decisions (as the API appends them), real tar archives in the blob store, a worker running
//! in-process on real sandboxes, and the results booted and inspected.

use crate::common;

use std::time::Duration;

use chrono::Utc;
use common::sandbox::{exec, node_dir, sh};
use serde_json::json;
use strata::domain::build::{self, FailedStep, FailureKind, Phase};
use strata::domain::ids::{self};
use strata::events::{Actor, ActorRole, CommandContext, Metadata};
use strata::vmm::{BootSpec, ExecRequest, Network, SandboxBackend};
use strata::worker::template_lookup;
use uuid::Uuid;

use common::build_api::stream;

use common::worker_fixture::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_recipe_of_every_step_type_builds_and_boots_with_its_files_and_context() {
    let mut fx = Fixture::new(settings()).await;
    let (_, build) = fx.api.register("recipe").await;
    let app = files_hash("app");
    let single = files_hash("single");
    fx.api
        .upload(&fx.blobs, build, &app, &gzip(&app_tar()))
        .await;
    fx.api
        .upload(
            &fx.blobs,
            build,
            &single,
            &single_file_tar("single.txt", b"single\n"),
        )
        .await;
    fx.api
        .start(
            build,
            json!({
                "fromImage": "busybox",
                "force": false,
                "steps": [
                    step("ENV", &["A", "/opt/app", "B", "$A/bin", "C", "$(echo no)"]),
                    step("WORKDIR", &["/opt/app"]),
                    copy("app", "./app", "", "", &app),
                    copy("single.txt", "/etc/single.txt", "root", "0600", &single),
                    step("USER", &["builder"]),
                    step("RUN", &["echo run-as-$(id -un) > out.txt; echo $B >> out.txt; cat app/config.txt >> out.txt; echo to-stdout; echo to-stderr >&2", "root"]),
                    step("RUN", &["id -un > /tmp/who.txt; pwd >> /tmp/who.txt"]),
                    step("WORKDIR", &["sub"]),
                ],
            }),
        )
        .await;
    let state = fx.wait_terminal(build).await;
    assert_ready(&state);
    // One step record per step, checkpoints for RUN, COPY and WORKDIR.
    assert_eq!(state.progress.len(), 8);
    let checkpointed = state
        .progress
        .values()
        .filter(|o| matches!(o, build::StepOutcome::Checkpointed { .. }))
        .count();
    assert_eq!(checkpointed, 6, "{:?}", state.progress);

    let result = fx.result("recipe").await;
    assert_eq!(result.build, build);
    let ctx = &result.record.context;
    assert_eq!(ctx.user, "builder");
    assert_eq!(ctx.workdir, "/opt/app/sub");
    assert_eq!(ctx.env["A"], "/opt/app");
    assert_eq!(
        ctx.env["B"], "/opt/app/bin",
        "ENV values expand earlier variables"
    );
    assert_eq!(
        ctx.env["C"], "$(echo no)",
        "command substitution stays literal"
    );
    assert!(ctx.env.contains_key("PATH"), "the image's env is kept");
    assert!(result.record.base_image_digest.is_some());

    let mut sb = boot_on(&result.record.layers).await;
    let stat = sh(&mut sb, "stat -c '%n %a %U %G' /opt /opt/app/app/bin/run.sh /opt/app/app/config.txt /opt/app/app/nested/deep/data.txt /etc/single.txt /opt/app/sub").await;
    assert_eq!(
        stat,
        "/opt 755 user user\n/opt/app/app/bin/run.sh 755 user user\n/opt/app/app/config.txt 644 user user\n/opt/app/app/nested/deep/data.txt 644 user user\n/etc/single.txt 600 root root\n/opt/app/sub 755 builder builder\n"
    );
    assert_eq!(
        sh(&mut sb, "readlink /opt/app/app/link.txt").await,
        "config.txt\n"
    );
    assert_eq!(
        sh(&mut sb, "cat /opt/app/app/link.txt").await,
        "config-line\n"
    );
    assert_eq!(sh(&mut sb, "/opt/app/app/bin/run.sh").await, "running\n");
    assert_eq!(
        sh(&mut sb, "cat /opt/app/out.txt").await,
        "run-as-root\n/opt/app/bin\nconfig-line\n",
        "RUN with a user override runs as that user, in the workdir, with the env"
    );
    assert_eq!(
        sh(&mut sb, "cat /tmp/who.txt").await,
        "builder\n/opt/app\n",
        "the override does not persist: the next RUN is the current USER"
    );
    assert!(sh(&mut sb, "grep -c '^user:' /etc/passwd")
        .await
        .starts_with('1'));
    sb.destroy().await.unwrap();

    let logs = fx.logs(build).await;
    let seqs: Vec<i64> = logs.iter().map(|l| l.0).collect();
    assert_eq!(
        seqs,
        (0..logs.len() as i64).collect::<Vec<_>>(),
        "seq is the log index"
    );
    let find = |m: &str| {
        logs.iter()
            .find(|l| l.2 == m)
            .unwrap_or_else(|| panic!("no log {m:?} in {logs:#?}"))
    };
    assert_eq!(find("to-stdout").1, "info");
    assert_eq!(find("to-stdout").3.as_deref(), Some("6"));
    assert_eq!(find("to-stderr").1, "error");
    assert_eq!(find("[base] FROM busybox").3.as_deref(), Some("base"));
    assert_eq!(find("[5/8] USER builder").3.as_deref(), Some("5"));
    assert_eq!(logs.last().unwrap().2, "Template created");
    fx.stop().await;
}

/// Issue: a RUN whose user or working directory could not be used failed in strata's own
/// words, where code written against E2B matches on envd's. Each now reads as E2B's builder
/// reports it, with strata's detail after it in parentheses.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_that_cannot_start_fails_in_e2bs_words_with_strata_detail_after() {
    let mut fx = Fixture::new(settings()).await;
    let cases = [
        (
            "unknown-user",
            json!([step("RUN", &["whoami", "ghost"])]),
            1,
            "failed to run command 'whoami': command failed: unauthenticated: invalid username: \
             'ghost' (user \"ghost\" is not in the sandbox's /etc/passwd)",
        ),
        (
            "missing-workdir",
            json!([
                step("USER", &["root"]),
                step("WORKDIR", &["/srv/gone"]),
                step("RUN", &["rmdir /srv/gone"]),
                step("RUN", &["true"]),
            ]),
            4,
            "failed to run command 'true': command failed: invalid_argument: cwd '/srv/gone' \
             does not exist (working directory /srv/gone: No such file or directory (os error 2))",
        ),
    ];
    for (name, steps, at, expected) in cases {
        let (_, build) = fx.api.register(name).await;
        fx.api
            .start(
                build,
                json!({"fromImage": "busybox", "force": false, "steps": steps}),
            )
            .await;
        let state = fx.wait_terminal(build).await;
        let Phase::Error { reason, .. } = &state.phase else {
            panic!("{name}: expected error, got {:?}", state.phase)
        };
        assert_eq!(reason.step, Some(FailedStep::Step(at)), "{name}");
        assert_eq!(reason.message, expected, "{name}");
    }
    fx.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_run_ends_the_build_in_error_at_its_step_with_the_exit_code() {
    let mut fx = Fixture::new(settings()).await;
    let (_, build) = fx.api.register("failing").await;
    fx.api
        .start(
            build,
            json!({
                "fromImage": "busybox",
                "force": false,
                "steps": [
                    step("ENV", &["X", "1"]),
                    step("RUN", &["echo before; echo first-problem >&2; echo oops >&2; exit 3"]),
                    step("RUN", &["echo never"]),
                ],
            }),
        )
        .await;
    let state = fx.wait_terminal(build).await;
    let Phase::Error { reason, .. } = &state.phase else {
        panic!("expected error, got {:?}", state.phase)
    };
    assert_eq!(reason.kind, FailureKind::StepFailed);
    assert_eq!(reason.step, Some(FailedStep::Step(2)));
    assert_eq!(reason.message, "RUN failed with exit code 3: oops");
    let logs = fx.logs(build).await;
    let messages: Vec<&str> = logs.iter().map(|l| l.2.as_str()).collect();
    let pos = |m: &str| {
        messages
            .iter()
            .position(|x| *x == m)
            .unwrap_or_else(|| panic!("no {m:?} in {messages:?}"))
    };
    let header = pos("[2/3] RUN echo before; echo first-problem >&2; echo oops >&2; exit 3");
    let (before, first, oops) = (pos("before"), pos("first-problem"), pos("oops"));
    // Order holds within each stream; stdout and stderr are separate pipes, so their
    // interleaving is as read.
    assert!(pos("[1/3] ENV X 1") < header, "{messages:?}");
    assert!(header < before.min(first), "{messages:?}");
    assert!(first < oops, "stderr lines keep their order: {messages:?}");
    assert!(before.max(oops) < messages.len() - 1, "{messages:?}");
    assert_eq!(logs[before].3.as_deref(), Some("2"));
    assert!(!messages.contains(&"never"));
    assert!(!messages.iter().any(|m| m.starts_with("[3/3]")));
    let last = logs.last().unwrap();
    assert_eq!(
        (last.1.as_str(), last.2.as_str(), last.3.as_deref()),
        (
            "error",
            "Build failed: RUN failed with exit code 3: oops",
            Some("2")
        )
    );
    assert!(
        template_lookup::resolve(
            &fx.store,
            &fx.api.team,
            "failing",
            template_lookup::Checkpoint::Result
        )
        .await
        .is_err(),
        "a failed build is never the template's result"
    );

    // An unknown base image fails at `base`, naming the image and what is available.
    let (_, build) = fx.api.register("unknown-base").await;
    fx.api
        .start(build, json!({"fromImage": "no-such-image:1", "force": false, "steps": [step("RUN", &["true"])]}))
        .await;
    let state = fx.wait_terminal(build).await;
    let Phase::Error { reason, .. } = &state.phase else {
        panic!("expected error, got {:?}", state.phase)
    };
    assert_eq!(reason.step, Some(FailedStep::Base));
    assert!(
        reason.message.contains("no-such-image:1") && reason.message.contains("strata image"),
        "{}",
        reason.message
    );
    assert!(reason.message.contains("busybox"), "{}", reason.message);
    fx.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn from_template_builds_on_the_previous_templates_result() {
    let mut fx = Fixture::new(settings()).await;
    let (_, first) = fx.api.register("parent").await;
    fx.api
        .start(
            first,
            json!({"fromImage": "busybox", "force": false, "steps": [
                step("ENV", &["LEVEL", "parent"]),
                step("RUN", &["echo from-parent > ~/parent.txt"]),
            ]}),
        )
        .await;
    assert_ready(&fx.wait_terminal(first).await);
    let parent = fx.result("parent").await;

    let (_, second) = fx.api.register("child").await;
    fx.api
        .start(
            second,
            json!({"fromTemplate": "parent", "force": false, "steps": [
                step("ENV", &["LEVEL", "$LEVEL-child"]),
                step("RUN", &["cat ~/parent.txt > ~/child.txt; echo $LEVEL >> ~/child.txt; id -un >> ~/child.txt"]),
            ]}),
        )
        .await;
    assert_ready(&fx.wait_terminal(second).await);
    let child = fx.result("child").await;
    assert_eq!(
        &child.record.layers[..parent.record.layers.len()],
        &parent.record.layers[..],
        "the child's stack extends the parent's"
    );
    assert!(child.record.layers.len() > parent.record.layers.len());
    assert_eq!(child.record.context.env["LEVEL"], "parent-child");
    assert_eq!(
        child.record.base_image_digest,
        parent.record.base_image_digest
    );
    let mut sb = boot_on(&child.record.layers).await;
    assert_eq!(
        sh(&mut sb, "cat /home/user/child.txt").await,
        "from-parent\nparent-child\nuser\n"
    );
    sb.destroy().await.unwrap();

    // A template that does not exist fails the build at `base`.
    let (_, third) = fx.api.register("orphan").await;
    fx.api
        .start(
            third,
            json!({"fromTemplate": "missing", "force": false, "steps": []}),
        )
        .await;
    let state = fx.wait_terminal(third).await;
    let Phase::Error { reason, .. } = &state.phase else {
        panic!("expected error, got {:?}", state.phase)
    };
    assert_eq!(reason.step, Some(FailedStep::Base));
    assert!(reason.message.contains("\"missing\""), "{}", reason.message);
    fx.stop().await;
}

/// A derived template extends the parent's build-base checkpoint, the stack before its start
/// command ran (DESIGN.md, RFC): the child's steps see the parent's step files, not the file the
/// parent's start command wrote, though the parent's result holds it. The child inherits the
/// start command, so its own finalize writes that file again, with a token of its own run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn from_template_extends_the_parents_build_base_not_what_its_start_command_wrote() {
    let mut fx = Fixture::new(settings()).await;
    let (_, first) = fx.api.register("served-parent").await;
    // A token unique to each run of the start command.
    let start_cmd = "od -An -N8 -tx8 /dev/urandom > /home/user/started.txt; sleep 1000";
    fx.api
        .start(
            first,
            json!({"fromImage": "busybox", "force": false, "steps": [
                step("RUN", &["echo from-step > /home/user/step.txt"]),
            ],
            "startCmd": start_cmd,
            "readyCmd": "[ -s /home/user/started.txt ]"}),
        )
        .await;
    let parent_state = fx.wait_terminal(first).await;
    assert_ready(&parent_state);
    let parent = fx.result("served-parent").await;
    let mut sb = boot_on(&parent.record.layers).await;
    assert_eq!(sh(&mut sb, "cat /home/user/step.txt").await, "from-step\n");
    let parent_token = sh(&mut sb, "cat /home/user/started.txt").await;
    assert!(
        !parent_token.trim().is_empty(),
        "the parent's result holds what its start command wrote"
    );
    sb.destroy().await.unwrap();
    assert!(
        parent_state.result.unwrap().build_base_checkpoint.is_some(),
        "a started parent records its build base"
    );

    let (_, second) = fx.api.register("served-child").await;
    fx.api
        .start(
            second,
            json!({"fromTemplate": "served-parent", "force": false, "steps": [
                step("RUN", &["cd /home/user; cat step.txt > child.txt; if [ -e started.txt ]; then echo start-file-seen; else echo no-start-file; fi >> child.txt"]),
            ]}),
        )
        .await;
    assert_ready(&fx.wait_terminal(second).await);
    let child = fx.result("served-child").await;
    assert_eq!(child.record.start_cmd.as_deref(), Some(start_cmd));
    let mut sb = boot_on(&child.record.layers).await;
    assert_eq!(
        sh(&mut sb, "cat /home/user/child.txt").await,
        "from-step\nno-start-file\n",
        "the child's steps see the parent's steps, not its start command's side effects"
    );
    let child_token = sh(&mut sb, "cat /home/user/started.txt").await;
    assert_ne!(
        child_token, parent_token,
        "the child's file is its own finalize's, not the parent's baked in"
    );
    sb.destroy().await.unwrap();
    assert!(
        !child.record.layers.starts_with(&parent.record.layers[..]),
        "the child's stack does not extend the parent's final snapshot"
    );
    fx.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_start_command_whose_ready_command_succeeds_is_ready() {
    let mut fx = Fixture::new(settings()).await;
    let (_, build) = fx.api.register("server").await;
    fx.api
        .start(
            build,
            json!({"fromImage": "busybox", "force": false, "steps": [],
                   "startCmd": "sleep 1; echo up > /tmp/started; echo server-started; sleep 1000",
                   "readyCmd": "[ -f /tmp/started ]"}),
        )
        .await;
    let state = fx.wait_terminal(build).await;
    assert_ready(&state);
    assert!(state
        .result
        .as_ref()
        .unwrap()
        .build_base_checkpoint
        .is_some());
    let result = fx.result("server").await;
    assert_eq!(
        result.record.start_cmd.as_deref(),
        Some("sleep 1; echo up > /tmp/started; echo server-started; sleep 1000")
    );
    assert_eq!(
        result.record.ready_cmd.as_deref(),
        Some("[ -f /tmp/started ]")
    );
    let mut sb = boot_on(&result.record.layers).await;
    assert_eq!(
        sh(&mut sb, "cat /tmp/started; stat -c %U /tmp/started").await,
        "up\nuser\n",
        "the start command ran as the final user and its files are in the result"
    );
    sb.destroy().await.unwrap();
    let logs = fx.logs(build).await;
    assert!(
        logs.iter()
            .any(|l| l.2 == "server-started" && l.3.as_deref() == Some("finalize")),
        "{logs:#?}"
    );
    fx.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_ready_command_that_never_succeeds_fails_at_finalize_after_the_timeout() {
    let mut s = settings();
    s.ready_timeout = Duration::from_secs(3);
    let mut fx = Fixture::new(s).await;
    let (_, build) = fx.api.register("never-ready").await;
    fx.api
        .start(
            build,
            json!({"fromImage": "busybox", "force": false, "steps": [step("RUN", &["true"])],
                   "startCmd": "sleep 1000", "readyCmd": "echo not-yet; false"}),
        )
        .await;
    let state = fx.wait_terminal(build).await;
    let Phase::Error { reason, .. } = &state.phase else {
        panic!("expected error, got {:?}", state.phase)
    };
    assert_eq!(reason.step, Some(FailedStep::Finalize));
    assert_eq!(
        reason.message,
        "the ready command `echo not-yet; false` did not succeed within 3 s"
    );
    let logs = fx.logs(build).await;
    let polls = logs
        .iter()
        .filter(|l| l.2 == "not-yet" && l.3.as_deref() == Some("finalize"))
        .count();
    assert!(
        polls >= 2,
        "the ready command is polled until the timeout: {logs:#?}"
    );
    fx.stop().await;
}

/// Processes on this host whose command line is exactly `argv`.
fn processes_running(argv: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| String::from_utf8_lossy(&c).replace('\0', " ").trim() == argv)
                .unwrap_or(false)
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_closed_attempt_stops_its_worker_without_another_write() {
    let mut s = settings();
    s.lease = Duration::from_secs(3);
    let mut fx = Fixture::new(s).await;
    let (_, build) = fx.api.register("fenced").await;
    let marker = format!("sleep {}.5", 600 + (Uuid::new_v4().as_u128() % 1000));
    fx.api
        .start(
            build,
            json!({"fromImage": "busybox", "force": false, "steps": [
                step("RUN", &[&format!("echo started; {marker}; echo never")]),
                step("RUN", &["echo never-either"]),
            ]}),
        )
        .await;
    // Wait (bounded) until the long RUN is running.
    let mut started = false;
    for _ in 0..600 {
        if fx.logs(build).await.iter().any(|l| l.2 == "started") && processes_running(&marker) == 1
        {
            started = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        started,
        "the long RUN never started: {:#?}",
        fx.logs(build).await
    );

    // The attempt-expiry reconciler's decision, as if the lease had passed.
    let bstream = stream(ids::stream::build(&build));
    let expired = strata::app::build::expire_attempt(
        &fx.store,
        &CommandContext::new(Metadata::new(Actor::new(
            ActorRole::Reconciler,
            "test-reconciler",
        ))),
        &build,
        Utc::now() + chrono::Duration::hours(1),
    )
    .await
    .unwrap();
    let version_after_expiry = expired.version;
    let logs_after_expiry = fx.logs(build).await.len();

    // The next renewal is refused; the worker kills the RUN and destroys the sandbox.
    let mut stopped = false;
    for _ in 0..300 {
        if processes_running(&marker) == 0 {
            stopped = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(stopped, "the worker kept running the fenced build's RUN");
    fx.stop().await;

    assert_eq!(
        fx.store.stream_version(&bstream).await.unwrap(),
        version_after_expiry,
        "no build event after the attempt was closed"
    );
    let logs = fx.logs(build).await;
    assert_eq!(
        logs.len(),
        logs_after_expiry,
        "no log line after the attempt was closed: {logs:#?}"
    );
    assert!(!logs
        .iter()
        .any(|l| l.2 == "never" || l.2 == "never-either" || l.2.starts_with("[2/2]")));
    let state = fx.state(build).await;
    let Phase::Error { reason, .. } = &state.phase else {
        panic!("expected error, got {:?}", state.phase)
    };
    assert_eq!(reason.kind, FailureKind::NodeLost);
    let phase: String = sqlx::query_scalar("SELECT phase FROM builds WHERE build_id = $1")
        .bind(build.as_uuid())
        .fetch_one(&fx.db.pool)
        .await
        .unwrap();
    assert_eq!(phase, "error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn template_export_round_trips_through_image_import() {
    let mut fx = Fixture::new(settings()).await;
    let (_, build) = fx.api.register("exported").await;
    let app = files_hash("export-app");
    fx.api.upload(&fx.blobs, build, &app, &app_tar()).await;
    fx.api
        .start(
            build,
            json!({"fromImage": "busybox", "force": false, "steps": [
                step("ENV", &["GREETING", "hello"]),
                step("WORKDIR", &["/srv"]),
                copy("app", "app", "", "", &app),
                step("RUN", &["echo exported > made.txt"]),
            ], "startCmd": "sleep 100", "readyCmd": "true"}),
        )
        .await;
    assert_ready(&fx.wait_terminal(build).await);
    fx.stop().await;
    let result = fx.result("exported").await;

    let out = common::data_dir();
    let layout = out.path().join("layout");
    let export = std::process::Command::new(common::strata_bin())
        .args(["template", "export", "exported"])
        .arg(&layout)
        .args(["--team", fx.api.team.as_str()])
        .env("DATABASE_URL", &fx.db.url)
        .env("STRATA_DATA_DIR", node_dir())
        .output()
        .unwrap();
    assert!(
        export.status.success(),
        "{}",
        String::from_utf8_lossy(&export.stderr)
    );
    assert!(layout.join("oci-layout").is_file() && layout.join("index.json").is_file());

    // Import into a fresh data directory and boot it there.
    let fresh = common::data_dir();
    let import = std::process::Command::new(common::strata_bin())
        .args(["image", "import"])
        .arg(&layout)
        .args(["--name", "exported:latest", "--data-dir"])
        .arg(fresh.path())
        .output()
        .unwrap();
    assert!(
        import.status.success(),
        "{}",
        String::from_utf8_lossy(&import.stderr)
    );
    let catalog = strata::vmm::image::ImageCatalog::open(fresh.path()).unwrap();
    let manifest = catalog.get("exported:latest").unwrap();
    let imported: Vec<String> = manifest.digests().iter().map(|d| d.to_string()).collect();
    let built: Vec<String> = result.record.layers.iter().map(|d| d.to_string()).collect();
    assert_eq!(imported, built, "the same layers, in the same order");
    assert_eq!(manifest.config.user.as_deref(), Some("user"));
    assert_eq!(manifest.config.workdir.as_deref(), Some("/srv"));
    // ENV is build-time only (ADR 0012): not in the image's Env, only in the start command's.
    assert!(
        !manifest.config.env.iter().any(|(k, _)| k == "GREETING"),
        "{:?}",
        manifest.config.env
    );
    let cmd = exported_cmd(&layout);
    assert_eq!(cmd[..2], ["/bin/sh", "-c"], "{cmd:?}");
    assert!(
        cmd[2].starts_with("export GREETING='hello'; ")
            && cmd[2].ends_with("; exec /bin/sh -c 'sleep 100'"),
        "{cmd:?}"
    );

    let fresh_backend = strata::vmm::NamespaceBackend::new(strata::vmm::NamespaceConfig {
        data_dir: fresh.path().to_path_buf(),
        agent_binary: common::strata_bin(),
        depth: Default::default(),
        ids: Default::default(),
        network: Default::default(),
        disk: Default::default(),
    })
    .unwrap();
    let mut spec = BootSpec::new(manifest.digests());
    spec.limits.network = Network::None;
    let mut sb = fresh_backend.boot(spec).await.unwrap();
    let out = exec(
        &mut sb,
        ExecRequest::shell("cat /srv/made.txt /srv/app/config.txt; stat -c '%a %U' /srv/app/bin/run.sh; readlink /srv/app/link.txt"),
    )
    .await;
    assert!(out.outcome.success(), "{}", out.stderr);
    assert_eq!(out.stdout, "exported\nconfig-line\n755 user\nconfig.txt\n");
    sb.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_e2b_base_gives_the_default_user_sudo_and_a_login_bash() {
    let mut fx = Fixture::new(settings()).await;
    let (_, build) = fx.api.register("on-e2b-base").await;
    fx.api
        .start(
            build,
            json!({"fromImage": "e2bdev/base", "force": false, "steps": [
                step("RUN", &["echo \"shell=$BASH_VERSION\" > ~/facts.txt; id -un >> ~/facts.txt; sudo -n id -un >> ~/facts.txt; pwd >> ~/facts.txt"]),
            ]}),
        )
        .await;
    assert_ready(&fx.wait_terminal(build).await);
    let result = fx.result("on-e2b-base").await;
    assert_eq!(result.record.context.user, "user");
    assert_eq!(result.record.context.workdir, "/home/user");
    let mut sb = boot_on(&result.record.layers).await;
    let facts = sh(&mut sb, "cat /home/user/facts.txt").await;
    let lines: Vec<&str> = facts.lines().collect();
    assert!(
        lines[0].starts_with("shell=5."),
        "RUN goes through bash: {facts}"
    );
    assert_eq!(&lines[1..], ["user", "root", "/home/user"], "{facts}");
    sb.destroy().await.unwrap();
    fx.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_runs_at_most_max_builds_at_once_and_renews_their_leases() {
    let mut s = settings();
    s.max_builds = 1;
    s.lease = Duration::from_secs(3);
    let mut fx = Fixture::new(s).await;
    let mut builds = Vec::new();
    for name in ["one-at-a-time-a", "one-at-a-time-b"] {
        let (_, build) = fx.api.register(name).await;
        fx.api
            .start(
                build,
                // Distinct recipes: identical ones would reuse each other through the step cache.
                json!({"fromImage": "busybox", "force": false, "steps": [step("RUN", &[&format!("sleep 2 # {name}")])]}),
            )
            .await;
        builds.push(build);
    }
    let ids: Vec<Uuid> = builds.iter().map(|b| b.as_uuid()).collect();
    let mut most_at_once = 0;
    for _ in 0..1200 {
        let phases: Vec<String> =
            sqlx::query_scalar("SELECT phase FROM builds WHERE build_id = ANY($1)")
                .bind(&ids)
                .fetch_all(&fx.db.pool)
                .await
                .unwrap();
        let running = phases
            .iter()
            .filter(|p| *p == "active" || *p == "publishing")
            .count();
        most_at_once = most_at_once.max(running);
        if phases.iter().all(|p| p == "ready" || p == "error") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(most_at_once, 1, "max_builds = 1 runs one build at a time");
    for build in &builds {
        let state = fx.wait_terminal(*build).await;
        assert_ready(&state);
        let events = fx
            .store
            .read_stream_all(&stream(ids::stream::build(build)))
            .await
            .unwrap();
        let renewals: Vec<_> = events
            .iter()
            .filter(|e| e.event_type == "LeaseRenewed.v1")
            .collect();
        assert!(
            !renewals.is_empty(),
            "a 2 s RUN under a 3 s lease is renewed at least once"
        );
        for e in events
            .iter()
            .filter(|e| e.metadata.actor.role == ActorRole::Worker)
        {
            if e.event_type != "AttemptAcquired.v1" {
                assert_eq!(
                    e.metadata.epoch,
                    Some(1),
                    "{} names its epoch",
                    e.event_type
                );
            }
        }
    }
    fx.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_past_the_step_timeout_fails_its_step() {
    let mut s = settings();
    s.step_timeout = Duration::from_secs(1);
    let mut fx = Fixture::new(s).await;
    let (_, build) = fx.api.register("slow-step").await;
    fx.api
        .start(
            build,
            json!({"fromImage": "busybox", "force": false, "steps": [
                step("RUN", &["true"]),
                step("RUN", &["echo waiting; sleep 30"]),
            ]}),
        )
        .await;
    let state = fx.wait_terminal(build).await;
    let Phase::Error { reason, .. } = &state.phase else {
        panic!("expected error, got {:?}", state.phase)
    };
    assert_eq!(reason.step, Some(FailedStep::Step(2)));
    assert_eq!(reason.message, "RUN timed out after 1 s");
    fx.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_strata_worker_binary_builds_queued_builds_and_stops_on_sigterm() {
    let fx = Fixture::with_worker(None).await;
    let (_, build) = fx.api.register("via-binary").await;
    fx.api
        .start(
            build,
            json!({"fromImage": "busybox", "force": false, "steps": [step("RUN", &["echo from-the-binary"])]}),
        )
        .await;
    let mut child = std::process::Command::new(common::strata_bin())
        .arg("worker")
        .env("DATABASE_URL", &fx.db.url)
        .env("STRATA_DATA_DIR", node_dir())
        .env("STRATA_NODE_ID", "binary-node")
        .env("STRATA_MAX_BUILDS", "1")
        .env("STRATA_QUEUE_POLL_MS", "200")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let state = fx.wait_terminal(build).await;
    assert_ready(&state);
    let logs = fx.logs(build).await;
    assert!(logs
        .iter()
        .any(|l| l.2 == "from-the-binary" && l.3.as_deref() == Some("1")));
    let acquired = fx
        .store
        .read_stream_all(&stream(ids::stream::build(&build)))
        .await
        .unwrap()
        .into_iter()
        .find(|e| e.event_type == "AttemptAcquired.v1")
        .unwrap();
    assert_eq!(acquired.metadata.actor.node, "binary-node");
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "{status}: {stderr}");
    // Its spare scratch disks went with it: no mount or loop device of its sandboxes is left.
    let plain = strip_ansi(&stderr);
    let owner = plain
        .split("sandbox_owner=")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_hexdigit()).next())
        .unwrap_or_else(|| panic!("no sandbox_owner in {stderr}"));
    common::sandbox::assert_no_trace(&format!("sbx-{owner}-"));
}

/// `text` without its terminal colour sequences (`ESC [ … m`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The `Cmd` of the image config in an OCI layout with one manifest.
fn exported_cmd(layout: &std::path::Path) -> Vec<String> {
    let read = |digest: &str| -> serde_json::Value {
        let hex = digest.strip_prefix("sha256:").unwrap();
        serde_json::from_slice(&std::fs::read(layout.join("blobs/sha256").join(hex)).unwrap())
            .unwrap()
    };
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let manifest = read(index["manifests"][0]["digest"].as_str().unwrap());
    let config = read(manifest["config"]["digest"].as_str().unwrap());
    serde_json::from_value(config["config"]["Cmd"].clone()).unwrap()
}

/// Sealed registry credentials live from the start until the event that ends the build, whether
/// it ends ready or in error (ADR 0014): the start handler stores them, the builds projection
/// deletes them in the terminal event's transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sealed_credentials_are_destroyed_when_the_build_ends_ready_or_in_error() {
    use strata::domain::build_spec::RegistryCredentials;
    use strata::registry::sealed;
    let mut fx = Fixture::new(settings()).await;
    let seal = sealed::CredentialSeal::from_secret(b"worker-builds-test-secret");
    let credentials = RegistryCredentials::Registry {
        username: "builder".into(),
        password: "s3cret-for-the-test".into(),
    };
    for (name, run, ready) in [("creds-ok", "true", true), ("creds-fail", "exit 7", false)] {
        let (_, build) = fx.api.register(name).await;
        let stored = sealed::store(&fx.db.pool, &build, &seal.seal(&build, &credentials))
            .await
            .unwrap();
        assert!(stored);
        fx.api
            .start(
                build,
                json!({"fromImage": "busybox", "force": false, "steps": [step("RUN", &[run])]}),
            )
            .await;
        let state = fx.wait_terminal(build).await;
        assert_eq!(
            matches!(state.phase, Phase::Ready { .. }),
            ready,
            "{name}: {:?}",
            state.phase
        );
        assert!(
            !sealed::is_stored(&fx.db.pool, &build).await.unwrap(),
            "{name}: the credentials outlived the build"
        );
    }
    fx.stop().await;
}

/// Found in review: whether a context is `present` is decided from its bytes. The stored
/// archive of a name's latest generation is torn (its bytes replaced behind the store's back, as
/// a failing disk would). Before, every link still answered `present: true` (the object's
/// lifecycle said Live), the SDK skipped its upload, and every build copying it failed with
/// "upload it again". Now a link checks the bytes and answers `present: false`, so the upload
/// comes and the build succeeds. When the bytes tear after a link said present, the build that
/// fetches them fails, but its failed fetch moves the blob to quarantine and retires the
/// generation, so the next link asks for the upload again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_torn_context_is_not_present_and_a_failed_fetch_retires_its_generation() {
    use strata::domain::build::upload::ReserveUpload;
    use strata::domain::ids::{Digest, IntentId, Scope};

    let node = common::sandbox::private_node(&["busybox"]);
    let mut fx = Fixture::on_node(node.path()).await;
    let hash = files_hash(&format!("torn-context-{}", Uuid::new_v4()));
    let archive = single_file_tar("hello.txt", b"hello from an intact archive\n");
    let digest = Digest::of(&archive);
    let spec = json!({"fromImage": "busybox", "force": false, "steps": [
        copy("hello.txt", "/srv/", "root", "0644", &hash),
    ]});
    let present = |build| {
        let (store, hash) = (fx.store.clone(), hash.clone());
        let blobs = fx.blobs.clone();
        async move {
            let now = Utc::now();
            strata::app::upload::link_upload(
                &store,
                &common::build_api::api_context(),
                &blobs,
                &ReserveUpload {
                    build,
                    intent: IntentId::from_uuid(Uuid::new_v4()),
                    hash,
                    now,
                    expires_at: now + chrono::Duration::hours(1),
                },
            )
            .await
            .unwrap()
            .present
        }
    };

    let (_, first) = fx.api.register("torn-context").await;
    fx.api.upload(&fx.blobs, first, &hash, &archive).await;
    fx.api.start(first, spec.clone()).await;
    assert_ready(&fx.wait_terminal(first).await);

    // Torn at rest: the next link says absent, the SDK uploads again, and the build succeeds.
    common::torn_blob::tear(fx.blobs.as_ref(), &digest, &archive).await;
    let (_, second) = fx.api.register("torn-context").await;
    assert!(!present(second).await, "a torn archive is not present");
    fx.api.upload(&fx.blobs, second, &hash, &archive).await;
    fx.api.start(second, spec.clone()).await;
    assert_ready(&fx.wait_terminal(second).await);

    // Torn after a link said present: that build fails, and its fetch retires the generation.
    let (_, third) = fx.api.register("torn-context").await;
    assert!(present(third).await, "the re-uploaded archive is present");
    common::torn_blob::tear(fx.blobs.as_ref(), &digest, &archive).await;
    // Forced, so that the COPY runs instead of the cached result being promoted.
    let mut forced = spec.clone();
    forced["force"] = json!(true);
    fx.api.start(third, forced).await;
    match fx.wait_terminal(third).await.phase {
        Phase::Error { reason, .. } => {
            assert!(
                reason.message.contains("upload it again"),
                "{}",
                reason.message
            )
        }
        other => panic!("expected an error, got {other:?}"),
    }
    let stored = node.path().join("blobs/sha256").join(digest.hex());
    assert!(!stored.exists(), "the torn archive was moved to quarantine");
    let scope = Scope::team(&fx.api.team);
    let files: Vec<String> = fx
        .store
        .read_stream_all(&stream(ids::stream::files(&scope, &hash)))
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.event_type)
        .collect();
    assert!(
        files.iter().any(|t| t == "GenerationRetired.v1"),
        "{files:?}"
    );
    let (_, fourth) = fx.api.register("torn-context").await;
    assert!(
        !present(fourth).await,
        "the retired generation is not present"
    );
    fx.stop().await;
}

/// A chatty RUN (2 MB of output) stores at most the build's output budget and one line saying
/// the rest was not kept; the command runs to its end, and strata's own lines for the next
/// step still reach the log.
#[tokio::test]
async fn a_chatty_step_stores_at_most_the_output_budget_and_says_so() {
    let mut s = settings();
    s.build_log_max_bytes = 64 << 10;
    let mut fx = Fixture::new(s).await;
    let (build, state) = fx
        .build(
            "chatty",
            &[],
            json!({
                "fromImage": "busybox",
                "force": true,
                "steps": [
                    step("RUN", &["yes 0123456789abcdef0123456789abcdef0123456789abcdef | head -c 2000000; echo done > /tmp/done"]),
                    step("RUN", &["cat /tmp/done"]),
                ],
            }),
        )
        .await;
    assert_ready(&state);
    let logs = fx.logs(build).await;
    let chatty: Vec<&str> = logs
        .iter()
        .filter(|l| l.3.as_deref() == Some("1") && !l.2.starts_with('['))
        .map(|l| l.2.as_str())
        .collect();
    let stored: usize = chatty.iter().map(|m| m.len() + 1).sum();
    assert!(stored <= 64 << 10, "{stored} bytes of output stored");
    assert!(
        stored > 60 << 10,
        "the budget is used, not refused: {stored}"
    );
    let notices: Vec<&str> = logs
        .iter()
        .map(|l| l.2.as_str())
        .filter(|m| m.contains("STRATA_BUILD_LOG_MAX_BYTES"))
        .collect();
    assert_eq!(notices.len(), 1, "{notices:?}");
    // The next step ran (it reads what the chatty command wrote after its output) and its
    // header, strata's own line, is logged; its output, past the budget, is not.
    assert!(
        logs.iter().any(|l| l.2.ends_with("RUN cat /tmp/done")),
        "{:?}",
        &logs[logs.len().saturating_sub(5)..]
    );
    assert!(!logs.iter().any(|l| l.2 == "done"));
    fx.stop().await;
}

/// This process's peak resident memory since the last [`reset_peak_rss`], in bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .expect("VmHWM in /proc/self/status");
    kib << 10
}

/// Starts a new peak: `5` to `clear_refs` sets VmHWM to the current RSS (proc(5)).
fn reset_peak_rss() {
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
}

/// Issue 46: a `yes` of 60 KB lines grew the server's resident memory by 189 MiB: output
/// queued without bound between the sandbox's pipes, the worker and the log writer whenever
/// the database took longer to store it than the command took to write it. Here the database
/// is made slow for real: the test locks `build_logs` against inserts for 8 s while the RUN
/// writes 300 MB of long lines. Every hop is bounded now and waits for the next (the command
/// waits in its write), so the node's memory grows by a bounded amount; the old code queued
/// the whole 64 MiB budget (157 MiB of growth measured here).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_step_that_writes_long_lines_while_the_database_is_slow_holds_bounded_memory() {
    let mut fx = Fixture::new(settings()).await;
    // Warm up: the first build pays for the base, the pools and the allocator's arenas.
    let (_, warm) = fx
        .build(
            "rss-warm",
            &[],
            json!({"fromImage": "busybox", "force": true, "steps": [step("RUN", &["yes | head -c 1000000"])]}),
        )
        .await;
    assert_ready(&warm);
    reset_peak_rss();
    let before = peak_rss();
    let build = fx
        .start_build(
            "rss",
            &[],
            json!({
                "fromImage": "busybox",
                "force": true,
                "steps": [step("RUN", &["yes \"$(head -c 60000 /dev/zero | tr '\\0' a)\" | head -c 300000000"])],
            }),
        )
        .await;
    // Once the RUN's output is being stored, the database stalls for 8 s.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let started: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM build_logs WHERE build_id = $1 AND step = '1' AND message LIKE 'aaaa%')",
        )
        .bind(build.as_uuid())
        .fetch_one(&fx.db.pool)
        .await
        .unwrap();
        if started {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the RUN never wrote");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut stall = fx.db.pool.begin().await.unwrap();
    // SHARE conflicts with the log writer's insert and nothing else the build does.
    sqlx::query("LOCK TABLE build_logs IN SHARE MODE")
        .execute(&mut *stall)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(8)).await;
    stall.commit().await.unwrap();
    let state = fx.wait_terminal(build).await;
    let grown = peak_rss().saturating_sub(before);
    eprintln!("peak resident memory grew by {} MiB", grown >> 20);
    assert_ready(&state);
    assert!(
        grown < 48 << 20,
        "the node's peak resident memory grew by {} MiB while one RUN wrote 300 MB",
        grown >> 20
    );
    // What was stored is the budget.
    let stored: i64 = sqlx::query_scalar(
        "SELECT COALESCE(SUM(length(message) + 1), 0)::bigint FROM build_logs
         WHERE build_id = $1 AND step = '1' AND message NOT LIKE '[strata]%'",
    )
    .bind(build.as_uuid())
    .fetch_one(&fx.db.pool)
    .await
    .unwrap();
    assert!(
        stored <= 64 << 20 && stored > 60 << 20,
        "{stored} bytes stored"
    );
    fx.stop().await;
}

/// Issue: a RUN that writes without end filled the node's data disk, which under `strata up`
/// also holds Postgres. Now the step fills only its own sandbox's disk and the build fails at
/// that step saying which limit it hit (ADR 0023).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_step_that_fills_its_disk_fails_at_that_step_naming_the_limit() {
    let mut s = settings();
    s.sandbox_disk.max = Some(64 << 20);
    let mut fx = Fixture::new(s).await;
    let (build, state) = fx
        .build(
            "disk-filler",
            &[],
            json!({
                "fromImage": "busybox",
                "force": true,
                "steps": [
                    step("RUN", &["dd if=/dev/zero of=/tmp/small bs=1M count=8"]),
                    step("RUN", &["cat /dev/zero > /tmp/fill"]),
                    step("RUN", &["echo never"]),
                ],
            }),
        )
        .await;
    let Phase::Error { reason, .. } = &state.phase else {
        panic!("expected error, got {:?}", state.phase)
    };
    assert_eq!(reason.kind, FailureKind::StepFailed);
    assert_eq!(reason.step, Some(FailedStep::Step(2)), "{}", reason.message);
    assert!(
        reason.message.starts_with("RUN failed with exit code 1")
            && reason.message.contains("No space left on device")
            && reason
                .message
                .contains("it may write 64.0 MiB in all (STRATA_BUILD_DISK_MAX)"),
        "{}",
        reason.message
    );
    let logs = fx.logs(build).await;
    assert!(!logs.iter().any(|l| l.2 == "never"));
    fx.stop().await;
}
