//! The hidden subcommand that runs inside sandboxes. It dispatches before argument parsing and
//! before the async runtime starts: it forks, which is only sound in a single-threaded
//! process, and every sandbox boot starts it, so it skips building the whole command line.

/// `strata sandbox-init SPEC`: runs a sandbox's first process.
pub fn init(spec: Option<std::ffi::OsString>) -> std::process::ExitCode {
    let Some(spec) = spec.and_then(|s| s.into_string().ok()) else {
        eprintln!(
            "usage: strata sandbox-init SPEC-JSON (started by the strata worker, not by hand)"
        );
        return std::process::ExitCode::from(2);
    };
    std::process::ExitCode::from(strata::vmm::namespace::init::run(&spec) as u8)
}
