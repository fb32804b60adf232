//! Exec: users from the sandbox's own account files, env, cwd, exit codes, signals, streamed
//! output, and what a sandboxed root can no longer do.

use crate::common;

use std::time::Duration;

use common::sandbox::*;
use strata::vmm::start_failure::StartFailure;
use strata::vmm::{CommandLine, ExecOutcome, ExecRequest, OutputStream, VmmError};

#[tokio::test]
async fn commands_run_as_the_requested_user_with_env_and_cwd() {
    let backend = backend();
    let base = busybox(&backend).await;
    let mut sb = boot(&backend, spec(base)).await;
    let id = sb.id().to_string();

    assert_eq!(
        sh(&mut sb, "id -u; id -g; echo $HOME; pwd").await,
        "0\n0\n/root\n/root\n"
    );

    // The E2B default user, created by editing passwd/group/shadow (busybox has no useradd).
    sb.ensure_user("user", true).await.unwrap();
    sh(&mut sb, "echo 'extra:x:2000:user' >> /etc/group").await;
    let out = exec(
        &mut sb,
        ExecRequest::shell("id -u; id -g; id -G; echo $HOME $USER; pwd").user("user"),
    )
    .await;
    assert_eq!(
        out.stdout, "1000\n1000\n1000 2000\n/home/user user\n/home/user\n",
        "{}",
        out.stderr
    );

    // A bare uid, and uid:gid, without accounts.
    let out = exec(
        &mut sb,
        ExecRequest::shell("id -u; id -g").user("4242:4343"),
    )
    .await;
    assert_eq!(out.stdout, "4242\n4343\n");
    let out = exec(&mut sb, ExecRequest::shell("touch /root/x").user("4242")).await;
    assert_eq!(
        out.outcome,
        ExecOutcome::Exited(1),
        "an unprivileged uid cannot write /root"
    );

    // Env and cwd, from the context and the request (the request wins).
    sb.context_mut().env = vec![
        ("FOO".into(), "context".into()),
        ("BAR".into(), "kept".into()),
    ];
    sb.context_mut().workdir = Some("/tmp".into());
    assert_eq!(
        sh(&mut sb, "echo $FOO $BAR; pwd").await,
        "context kept\n/tmp\n"
    );
    let out = exec(
        &mut sb,
        ExecRequest::shell("echo $FOO $BAR; pwd")
            .env("FOO", "request")
            .cwd("/etc"),
    )
    .await;
    assert_eq!(out.stdout, "request kept\n/etc\n");

    // argv without a shell, resolved in PATH.
    let mut req = ExecRequest::shell("");
    req.command = CommandLine::Argv(vec!["echo".into(), "a b".into(), "$FOO".into()]);
    assert_eq!(exec(&mut sb, req).await.stdout, "a b $FOO\n");

    // Exit codes and signals.
    assert_eq!(
        exec(&mut sb, ExecRequest::shell("exit 7")).await.outcome,
        ExecOutcome::Exited(7)
    );
    assert_eq!(
        exec(&mut sb, ExecRequest::shell("kill -TERM $$"))
            .await
            .outcome,
        ExecOutcome::Signaled(15)
    );

    // Output streams, in order, timestamped.
    let out = exec(
        &mut sb,
        ExecRequest::shell("for i in 1 2 3; do echo out$i; echo err$i >&2; done"),
    )
    .await;
    assert_eq!(out.stdout, "out1\nout2\nout3\n");
    assert_eq!(out.stderr, "err1\nerr2\nerr3\n");
    let outs: Vec<_> = out
        .lines
        .iter()
        .filter(|l| l.stream == OutputStream::Stdout)
        .collect();
    assert!(outs.windows(2).all(|w| w[0].at <= w[1].at));

    // Failures to start are errors, not exit codes.
    let err = sb
        .exec(
            ExecRequest::shell("true").user("nobody-here"),
            strata::vmm::OutputSink::discard(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            VmmError::CommandStart(StartFailure::User { ref user, ref detail })
                if user == "nobody-here" && detail.contains("/etc/passwd")
        ),
        "{err}"
    );
    let err = sb
        .exec(
            ExecRequest::shell("true").cwd("/no/such/dir"),
            strata::vmm::OutputSink::discard(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            VmmError::CommandStart(StartFailure::Workdir { ref dir, missing: true, .. })
                if dir == "/no/such/dir"
        ),
        "{err}"
    );

    // Isolation: own pid namespace and hostname, no host paths, no mounting, no device nodes.
    let ps = sh(
        &mut sb,
        "cat /proc/1/cmdline | tr '\\0' ' '; echo; hostname; ls /proc | grep -c '^[0-9]'",
    )
    .await;
    let lines: Vec<&str> = ps.lines().collect();
    assert!(lines[0].contains("sandbox-init"), "{ps}");
    assert_eq!(lines[1], "sandbox");
    assert!(
        lines[2].parse::<u32>().unwrap() < 10,
        "only the sandbox's processes are visible: {ps}"
    );
    let host_marker = common::sandbox::node_dir();
    let out = exec(
        &mut sb,
        ExecRequest::shell(format!("ls {}", host_marker.display())),
    )
    .await;
    assert!(
        !out.outcome.success(),
        "the host data directory is not visible inside"
    );
    for cmd in [
        "mknod /dev/sda b 8 0",
        "mount -t tmpfs none /mnt",
        "mount -t proc none /mnt",
    ] {
        sh(&mut sb, "mkdir -p /mnt").await;
        let out = exec(&mut sb, ExecRequest::shell(cmd)).await;
        assert!(
            !out.outcome.success(),
            "`{cmd}` must fail for a sandboxed root"
        );
    }

    // A background process does not outlive its command.
    sh(&mut sb, "sleep 1000 & echo started").await;
    assert_eq!(
        sh(&mut sb, "ps | grep -c '[s]leep 1000' || true").await,
        "0\n"
    );

    // Timeouts are per command.
    let out = exec(
        &mut sb,
        ExecRequest::shell("sleep 30").timeout(Duration::from_millis(300)),
    )
    .await;
    assert_eq!(out.outcome, ExecOutcome::TimedOut);
    sb.destroy().await.unwrap();
    assert_no_trace(&id);
}

/// A sandbox lives as long as the process that booted it, not the thread. Under tokio the
/// thread that forks sandbox-init is whichever one polled the boot, and blocking-pool threads
/// exit when idle; a parent-death signal tied to that thread would kill a healthy sandbox.
#[test]
fn a_sandbox_outlives_the_thread_that_booted_it() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_keep_alive(Duration::from_millis(50))
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let backend = backend();
        let base = busybox(&backend).await;
        let handle = tokio::runtime::Handle::current();
        let b = backend.clone();
        let (tid, mut sb) = tokio::task::spawn_blocking(move || {
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            (tid, handle.block_on(boot(&b, spec(base))))
        })
        .await
        .unwrap();
        let task = format!("/proc/self/task/{tid}");
        for _ in 0..100 {
            if !std::path::Path::new(&task).exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            !std::path::Path::new(&task).exists(),
            "the booting thread is gone"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(sh(&mut sb, "echo alive").await, "alive\n");
        let id = sb.id().to_string();
        sb.destroy().await.unwrap();
        assert_no_trace(&id);
    });
}

/// A request travels to the sandbox over its control socket, not as an argument of a new
/// process: a command whose environment is larger than one argument may be (128 KiB), and
/// larger than the socket's buffer, still runs, and the sandbox takes the next command.
#[tokio::test]
async fn a_command_larger_than_an_argument_and_the_socket_buffer_runs() {
    let backend = backend();
    let base = busybox(&backend).await;
    let mut sb = boot(&backend, spec(base)).await;
    let id = sb.id().to_string();
    // Each variable under the per-string limit, together over it and over the buffer.
    let big = "a".repeat(100_000);
    let out = exec(
        &mut sb,
        ExecRequest::shell("echo ${#A} ${#B} ${#C}")
            .env("A", big.clone())
            .env("B", big.clone())
            .env("C", big),
    )
    .await;
    assert_eq!(out.outcome, ExecOutcome::Exited(0), "{}", out.stderr);
    assert_eq!(out.stdout, "100000 100000 100000\n");
    assert_eq!(sh(&mut sb, "echo next").await, "next\n");
    sb.destroy().await.unwrap();
    assert_no_trace(&id);
}

fn backend_with_strata_at(strata: &std::path::Path) -> strata::vmm::NamespaceBackend {
    strata::vmm::NamespaceBackend::new(strata::vmm::NamespaceConfig {
        data_dir: common::sandbox::node_dir(),
        agent_binary: strata.to_path_buf(),
        depth: Default::default(),
        ids: Default::default(),
        network: Default::default(),
        disk: Default::default(),
    })
    .unwrap()
}

/// Sandboxes start the small `strata-sandbox-init` that `cargo build` puts beside strata, and
/// strata itself (`strata sandbox-init`) when there is none beside it or the one there was
/// built from other sources (a `cargo build --bin strata` leaves an older one in place): every
/// way boots a working sandbox.
#[tokio::test]
async fn sandboxes_start_the_small_init_built_from_the_same_sources_else_strata() {
    let beside = common::strata_bin().with_file_name("strata-sandbox-init");
    let backend = backend();
    assert_eq!(backend.init_program(), beside);
    let base = busybox(&backend).await;

    let lone = tempfile::tempdir().unwrap();
    let strata = lone.path().join("strata");
    std::os::unix::fs::symlink(common::strata_bin(), &strata).unwrap();
    let without = backend_with_strata_at(&strata);
    assert_eq!(without.init_program(), strata, "no small init beside it");

    let stale = tempfile::tempdir().unwrap();
    let strata_too = stale.path().join("strata");
    std::os::unix::fs::symlink(common::strata_bin(), &strata_too).unwrap();
    let older = stale.path().join("strata-sandbox-init");
    std::fs::write(&older, "#!/bin/sh\necho 0123456789abcdef\n").unwrap();
    std::fs::set_permissions(&older, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let with_stale = backend_with_strata_at(&strata_too);
    assert_eq!(with_stale.init_program(), strata_too, "a stale small init");

    for (backend, program) in [
        (&backend, "strata-sandbox-init"),
        (&without, "strata"),
        (&with_stale, "strata"),
    ] {
        let mut sb = boot(backend, spec(base.clone())).await;
        let id = sb.id().to_string();
        let cmdline = sh(&mut sb, "cat /proc/1/cmdline | tr '\\0' ' '").await;
        let first = cmdline.split(' ').next().unwrap();
        assert!(
            first.rsplit('/').next() == Some(program),
            "pid 1 runs {program}: {cmdline}"
        );
        assert!(cmdline.contains("sandbox-init"), "{cmdline}");
        assert_eq!(sh(&mut sb, "echo ok").await, "ok\n");
        sb.destroy().await.unwrap();
        assert_no_trace(&id);
    }
}
