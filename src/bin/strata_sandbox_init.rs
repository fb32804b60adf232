//! `strata-sandbox-init`: the first process of a sandbox, started by the strata worker beside
//! which it is installed (see `strata::vmm::namespace::init`). It links only the sandbox side
//! of the library, so the kernel and the dynamic loader map and relocate a small binary at
//! every boot, not the whole service. Arguments as for the hidden `strata sandbox-init`.

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(strata::vmm::namespace::init::main(std::env::args_os()))
}
