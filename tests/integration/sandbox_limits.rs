//! Limits: the pids limit stops a fork bomb, the memory limit a memory hog, the host's
//! timeout a busy loop; the sandbox stays usable, the host healthy, and destroy leaves nothing.

use crate::common;

use std::time::Duration;

use common::sandbox::*;
use strata::vmm::{ExecOutcome, ExecRequest};

#[tokio::test]
async fn the_pids_limit_stops_a_fork_bomb() {
    let backend = backend();
    let mut s = spec(busybox(&backend).await);
    s.limits.pids = Some(64);
    let mut sb = boot(&backend, s).await;
    let id = sb.id().to_string();

    // Forks past the limit fail inside the sandbox; the count never passes it.
    let out = exec(
        &mut sb,
        ExecRequest::shell(
            // The loop's shell dies at the first failed fork; counting uses builtins only.
            "(i=0; while [ $i -lt 200 ]; do sleep 30 & i=$((i+1)); done) 2>/dev/null; \
         n=0; for p in /proc/[0-9]*; do n=$((n+1)); done; echo $n",
        )
        .timeout(Duration::from_secs(30)),
    )
    .await;
    let running: u32 = out.stdout.trim().parse().unwrap_or(0);
    assert!(
        running > 32 && running <= 64,
        "{} processes ran under a pids limit of 64 ({:?})",
        running,
        out.outcome
    );
    let pids_max = std::fs::read_to_string(format!("/sys/fs/cgroup/pids/strata/{id}/pids.max"))
        .or_else(|_| std::fs::read_to_string(format!("/sys/fs/cgroup/strata/{id}/pids.max")))
        .unwrap();
    assert_eq!(pids_max.trim(), "64");

    // A real fork bomb: contained, then cleaned up by the timeout.
    let out = exec(
        &mut sb,
        ExecRequest::shell("bomb() { bomb | bomb & }; bomb; sleep 5")
            .timeout(Duration::from_secs(3)),
    )
    .await;
    assert!(
        matches!(out.outcome, ExecOutcome::TimedOut | ExecOutcome::Exited(_)),
        "{:?}",
        out.outcome
    );
    // The sandbox works again, and the host can still fork.
    assert_eq!(sh(&mut sb, "echo alive").await, "alive\n");
    assert!(std::process::Command::new("true")
        .status()
        .unwrap()
        .success());
    sb.destroy().await.unwrap();
    assert_no_trace(&id);
}

#[tokio::test]
async fn the_memory_limit_stops_a_memory_hog() {
    let backend = backend();
    let mut s = spec(busybox(&backend).await);
    s.limits.memory_bytes = Some(64 << 20);
    let mut sb = boot(&backend, s).await;
    let id = sb.id().to_string();
    // dd's buffer is 512 MiB, filled from /dev/zero: far past 64 MiB.
    let out = exec(
        &mut sb,
        ExecRequest::shell("dd if=/dev/zero of=/dev/null bs=512M count=1 && echo survived")
            .timeout(Duration::from_secs(60)),
    )
    .await;
    assert!(
        !out.stdout.contains("survived"),
        "the hog ran to completion: {:?}",
        out.outcome
    );
    assert!(
        matches!(
            out.outcome,
            ExecOutcome::Signaled(9) | ExecOutcome::Exited(137)
        ),
        "{:?} {}",
        out.outcome,
        out.stderr
    );
    // A modest allocation still works.
    sh(
        &mut sb,
        "dd if=/dev/zero of=/dev/null bs=8M count=1 2>/dev/null && echo ok",
    )
    .await;
    sb.destroy().await.unwrap();
    assert_no_trace(&id);
}

#[tokio::test]
async fn the_timeout_stops_a_busy_loop() {
    let backend = backend();
    let mut s = spec(busybox(&backend).await);
    s.limits.cpus = Some(0.5);
    s.limits.timeout = Duration::from_secs(2);
    let mut sb = boot(&backend, s).await;
    let id = sb.id().to_string();
    // The loop ignores SIGTERM; only the host's SIGKILL stops it.
    let out = exec(
        &mut sb,
        ExecRequest::shell("trap '' TERM; while :; do :; done"),
    )
    .await;
    assert_eq!(out.outcome, ExecOutcome::TimedOut);
    assert_eq!(sh(&mut sb, "ps | grep -c '[w]hile' || true").await, "0\n");
    sb.destroy().await.unwrap();
    assert_no_trace(&id);
}

#[tokio::test]
async fn destroy_cleans_up_a_sandbox_that_misbehaves() {
    let backend = backend();
    let mut sb = boot(&backend, spec(busybox(&backend).await)).await;
    let id = sb.id().to_string();
    // Processes that escape their command's session and ignore SIGTERM.
    let out = exec(
        &mut sb,
        ExecRequest::shell("setsid sh -c \"trap '' TERM HUP; sleep 1000\" & sleep 0.2; echo ok"),
    )
    .await;
    assert!(out.outcome.success());
    sb.destroy().await.unwrap();
    assert_no_trace(&id);
}
