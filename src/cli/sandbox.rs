//! The hidden subcommand that runs inside sandboxes. It dispatches before argument parsing and
//! before the async runtime starts: it forks, which is only sound in a single-threaded
//! process. Sandboxes start the small `strata-sandbox-init` instead when it is installed beside
//! strata and built from the same sources; this is the fallback.

/// `strata sandbox-init < SPEC`: runs a sandbox's first process.
pub fn init() -> std::process::ExitCode {
    std::process::ExitCode::from(strata::vmm::namespace::init::main(std::env::args_os()))
}
