//! The build node: claims queued builds and executes them in sandboxes.
//!
//! * [`node`]: the loop ([`Worker`]): find queued builds, acquire, renew leases, run, shut down.
//! * [`attempt`]: one attempt's writes to the build stream, each fenced by its epoch.
//! * [`job`]: a frozen build as the node runs it (shared by [`cache`] and [`executor`]).
//! * [`executor`]: the steps of one build in a sandbox (PROTOCOL §3.7), checkpoints included.
//! * [`base`], [`template_lookup`]: what a build starts from (`fromImage`, `fromTemplate`).
//! * [`shell`]: the shell text run inside sandboxes (ENV evaluation, WORKDIR, start/ready).
//! * [`cache`]: the step cache: key chain, lookup, entry publication, single-flight.
//! * [`layer_hold`]: reader leases on the layers an attempt boots on; storing deleted ones again.
//! * [`publish`]: result snapshot, Publishing, promotion outbox, Ready.
//! * [`build_log`]: log lines to `build_logs`, batched and fenced.
//! * [`export`]: a template's result as an OCI image layout.
//! * [`residency`], [`placement`]: which layers this node's cache holds, reported for all
//!   nodes to see, and the order in which this node tries the queue because of it (ADR 0020).
//! * [`sandbox_host`]: launched sandboxes (the SDK's `Sandbox.create`): place, boot, answer
//!   through the agent, end.
//! * [`settings`], [`error`].
//!
//! Design: docs/adr/0005-build-executor.md.

pub mod attempt;
pub mod base;
pub mod build_log;
pub mod cache;
pub mod cache_consultation;
pub mod catalog_publisher;
pub mod copy_from;
pub mod error;
pub mod executor;
pub mod export;
pub mod job;
pub mod layer_hold;
pub mod node;
pub mod placement;
pub mod publish;
pub mod residency;
pub mod sandbox_host;
pub mod settings;
pub mod shell;
pub mod store_retry;
pub mod template_lookup;

pub use error::WorkerError;
pub use node::Worker;
pub use settings::WorkerSettings;
