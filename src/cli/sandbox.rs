//! Hidden subcommands that run inside sandboxes. They dispatch before the async runtime starts:
//! both fork, which is only sound in a single-threaded process.

use clap::Args;

#[derive(Debug, Args)]
pub struct SandboxInitArgs {
    /// The init spec, as JSON.
    pub spec: String,
}

#[derive(Debug, Args)]
pub struct SandboxAgentArgs {
    /// The agent request, as JSON.
    pub request: String,
}

pub fn init(args: &SandboxInitArgs) -> std::process::ExitCode {
    std::process::ExitCode::from(strata::vmm::namespace::init::run(&args.spec) as u8)
}

pub fn agent(args: &SandboxAgentArgs) -> std::process::ExitCode {
    std::process::ExitCode::from(strata::vmm::namespace::agent::run(&args.request) as u8)
}
