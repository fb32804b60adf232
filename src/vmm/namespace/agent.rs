//! The agent: the in-sandbox side of exec, COPY and user creation.
//!
//! Sandbox-init forks it for each request the host sends on the control socket
//! ([`control`](super::control)), so it starts inside every namespace of the sandbox, its cgroup
//! and its root. It forks once more, so the worker is inside the sandbox's pid namespace (and
//! a child of the agent), and reports the worker's fate on fd 3: `exit N`, `signal N`, or
//! `error MESSAGE` when the request itself failed (unknown user, missing working directory, a
//! rejected archive). All untrusted work happens here, inside the sandbox's root: archive
//! extraction and user switching never run on the host.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::Path;

use crate::vmm::copy::{self, CopySpec};
use crate::vmm::start_failure::StartFailure;
use crate::vmm::users::{self, UserDb};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub enum AgentRequest {
    Exec {
        argv: Vec<String>,
        user: String,
        env: Vec<(String, String)>,
        cwd: Option<String>,
        /// Report `pid N` (the pid inside the sandbox) on the status pipe before the command
        /// runs: a launched sandbox's commands are addressed by it.
        #[serde(default)]
        report_pid: bool,
        /// Run it on a terminal of (columns, rows), relayed over the agent's pipes
        /// ([`pty`](super::pty)).
        #[serde(default)]
        pty: Option<(u16, u16)>,
    },
    /// One file operation, as `user` (empty: root).
    Fs {
        request: super::fs_ops::FsRequest,
        user: String,
    },
    /// Sends `signal` to the process group `pid` leads (and to `pid` itself).
    Signal {
        pid: u32,
        signal: i32,
    },
    Copy(CopySpec),
    EnsureUser {
        name: String,
        sudo: bool,
    },
}

/// Where the agent reports the worker's fate.
pub const STATUS_FD: i32 = 3;
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

fn report(line: &str) {
    let msg = format!("{line}\n");
    // SAFETY: writing to the inherited status descriptor.
    unsafe { libc::write(STATUS_FD, msg.as_ptr().cast(), msg.len()) };
}

/// Runs one request in a freshly forked agent (stdin, stdout and stderr on 0–2, the status
/// pipe on [`STATUS_FD`]); returns the agent's exit code. The agent first becomes the
/// sandbox's root and nothing more ([`confine`](super::confine)), so COPY extraction, user
/// setup and every command run unprivileged on the host.
pub fn serve(request_json: &str, seccomp: &[u8]) -> i32 {
    if let Err(e) = super::confine::enter(seccomp) {
        report(&format!("error confining the sandbox agent: {e}"));
        return 1;
    }
    if let Err(e) = std::env::set_current_dir("/") {
        report(&format!("error chdir /: {e}"));
        return 1;
    }
    // The status descriptor must not leak into the user's command.
    // SAFETY: fcntl on an inherited descriptor.
    unsafe { libc::fcntl(STATUS_FD, libc::F_SETFD, libc::FD_CLOEXEC) };
    let request: AgentRequest = match serde_json::from_str(request_json) {
        Ok(r) => r,
        Err(e) => {
            report(&format!("error bad agent request: {e}"));
            return 2;
        }
    };
    // SAFETY: single-threaded process.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        report(&format!("error fork: {}", std::io::Error::last_os_error()));
        return 1;
    }
    if pid == 0 {
        let code = match work(request) {
            Ok(()) => 0,
            Err(e) => {
                report(&format!("error {}", e.replace('\n', " ")));
                127
            }
        };
        let _ = std::io::stdout().flush();
        // SAFETY: ending the child.
        unsafe { libc::_exit(code) };
    }
    loop {
        let mut status = 0;
        // SAFETY: waiting for our child.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            if libc::WIFEXITED(status) {
                report(&format!("exit {}", libc::WEXITSTATUS(status)));
            } else if libc::WIFSIGNALED(status) {
                report(&format!("signal {}", libc::WTERMSIG(status)));
            }
            return 0;
        }
        if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            report("error lost track of the command");
            return 1;
        }
    }
}

fn work(request: AgentRequest) -> Result<(), String> {
    match request {
        AgentRequest::Exec {
            argv,
            user,
            env,
            cwd,
            report_pid,
            pty,
        } => {
            // SAFETY: a new session makes the command and its children one process group.
            unsafe { libc::setsid() };
            let who = resolve_user(&user)?;
            let cwd = cwd.unwrap_or_else(|| who.home.clone());
            let mut vars: Vec<(String, String)> = vec![
                ("PATH".into(), DEFAULT_PATH.into()),
                ("HOME".into(), who.home.clone()),
                ("USER".into(), who.name.clone()),
                ("LOGNAME".into(), who.name.clone()),
            ];
            for (k, v) in env {
                vars.retain(|(old, _)| old != &k);
                vars.push((k, v));
            }
            become_user(&who)?;
            if let Err(e) = std::env::set_current_dir(&cwd) {
                return Err(StartFailure::Workdir {
                    missing: e.kind() == std::io::ErrorKind::NotFound,
                    dir: cwd,
                    detail: e.to_string(),
                }
                .encode());
            }
            let (program, args) = argv.split_first().ok_or("empty command")?;
            // The SDK runs every command as `/bin/bash -l -c …`; a template without bash (a
            // busybox one) runs it with its `sh`, which takes the same flags.
            let program = if report_pid && program == "/bin/bash" && !Path::new(program).exists() {
                &"/bin/sh".to_owned()
            } else {
                program
            };
            if let Some((cols, rows)) = pty {
                if let Some((master, child)) = super::pty::open_and_fork(cols, rows)? {
                    super::pty::relay(master, child);
                }
            }
            if report_pid {
                // Last, so a command that cannot start (user, directory) never reports a pid.
                // SAFETY: getpid has no preconditions; this child is inside the pid namespace.
                report(&format!("pid {}", unsafe { libc::getpid() }));
            }
            let err = std::process::Command::new(program)
                .args(args)
                .env_clear()
                .envs(vars)
                .exec();
            Err(StartFailure::Program {
                program: program.clone(),
                detail: err.to_string(),
            }
            .encode())
        }
        AgentRequest::Copy(spec) => copy::run_copy(Path::new("/"), std::io::stdin().lock(), &spec),
        AgentRequest::EnsureUser { name, sudo } => users::ensure_user(Path::new("/"), &name, sudo),
        AgentRequest::Fs { request, user } => {
            let who = resolve_user(&user)?;
            become_user(&who)?;
            let mut out = std::io::stdout().lock();
            let mut input = super::fs_ops::upload_frames::Unframed::new(std::io::stdin().lock());
            super::fs_ops::run(&request, &who.home, &mut input, &mut out)
                .map_err(|e| e.encode())?;
            out.flush().map_err(|e| format!("writing the answer: {e}"))
        }
        AgentRequest::Signal { pid, signal } => {
            let pid = libc::pid_t::try_from(pid).map_err(|_| format!("no process {pid}"))?;
            // SAFETY: kill(2) on a pid of this pid namespace; a group first, as envd kills a
            // command with whatever it started.
            let group = unsafe { libc::kill(-pid, signal) };
            let single = unsafe { libc::kill(pid, signal) };
            if group != 0 && single != 0 {
                return Err(format!(
                    "signalling process {pid}: {}",
                    std::io::Error::last_os_error()
                ));
            }
            Ok(())
        }
    }
}

/// The sandbox's user called `user` (empty: root), from the sandbox's own passwd.
fn resolve_user(user: &str) -> Result<users::ResolvedUser, String> {
    let db = UserDb::load(Path::new("/"));
    let name = if user.is_empty() { "root" } else { user };
    db.resolve(name).map_err(|detail| {
        StartFailure::User {
            user: name.to_owned(),
            detail,
        }
        .encode()
    })
}

/// Drops to `who` for good (in the forked worker, before it runs anything of the tenant's).
fn become_user(who: &users::ResolvedUser) -> Result<(), String> {
    let groups: Vec<libc::gid_t> = who.groups.clone();
    // SAFETY: dropping privileges in the forked worker.
    unsafe {
        if libc::setgroups(groups.len(), groups.as_ptr()) != 0
            || libc::setgid(who.gid) != 0
            || libc::setuid(who.uid) != 0
        {
            return Err(format!(
                "switching to {} ({}:{}): {}",
                who.name,
                who.uid,
                who.gid,
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}
