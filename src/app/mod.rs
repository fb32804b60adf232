//! The write side: every use case that loads streams, asks the domain to decide, and appends.
//!
//! The API handlers, the worker, the reconcilers, the CLI, the benchmarks and the test helpers
//! call these functions; none of them builds a stream write or runs the decide loop itself. A
//! function takes the event store, a [`CommandContext`] (who writes, under which command id)
//! and the command with its time already read, and answers with the domain's value or an
//! [`Error`].
//!
//! Layers, each depending only on those below it (docs/adr/0016-application-layer.md):
//! `domain` (pure) · `events` (the store) · `projections` (read models) · `app` (this) ·
//! `api`, `worker`, `reconcilers`, `cli` (callers).
//!
//! Layout:
//! * [`event_store`]: the store with strata's exact read models wired in.
//! * [`registration`]: register a build (name claim, template, build).
//! * [`upload`]: link an upload, complete an upload (build and files stream).
//! * [`build`]: start a build; expire a waiting build, an attempt, an intent.
//! * [`team`]: issue and revoke API keys.
//! * [`template`]: delete a template, assign and remove tags.
//! * [`attempt`]: acquire an attempt, record its progress, record a snapshot.
//! * [`publish`]: enter Publishing, promote (commit layers, make visible, finish, abandon).
//! * [`cache`]: publish a cache entry guarded by the build.
//! * [`sandbox`]: request, place, run, time out and end a launched sandbox.
//! * [`object`]: reference, lease and release stored objects; mark, confirm or abort a deletion.
//!
//! # Error policy
//!
//! Every function fails with [`Error<E>`] (the store's [`CommandError`]), `E` being what the
//! domain may refuse. Callers sort it three ways, and only three:
//! * **rejected by the domain** ([`CommandError::Rejected`]): an answer from current state. The
//!   API maps it to a 4xx naming the rule, a worker treats its build's refusal as fencing and
//!   stops writing, a reconciler counts it as nothing to do. Never retried as is.
//! * **lost a race on a fenced stream** ([`CommandError::Contended`]): every round lost a
//!   version race after deciding again on fresh state. The API answers 409 "retry", the
//!   reconciler tries at its next tick.
//! * **store unavailable** ([`CommandError::is_unavailable`]): the database could not be
//!   reached or kept failing serialization. Retried with the same command id (so a lost reply
//!   is a replay), within a lease for the worker; 503 for the API.
//!
//! Anything else (an event that does not decode, ids reused with other payloads) is a defect:
//! logged and answered 500, never retried.

pub mod attempt;
pub mod build;
pub mod cache;
pub mod catalog;
pub mod gc_pass;
pub mod object;
pub mod publish;
mod refusal;
pub mod registration;
pub mod sandbox;
pub mod settings;
pub mod team;
pub mod template;
pub mod upload;

pub use crate::events::command::{CommandContext, CommandError, Executed};
pub use refusal::Refusal;

/// The error of every use case: see the policy above.
pub type Error<E> = CommandError<E>;

/// The event store strata runs on: every append also applies the standing inline projections
/// (`builds`, `api_keys`, `templates`) in its transaction, whoever makes it. The store itself
/// knows no read model; this is where they are wired in.
pub fn event_store(pool: sqlx::PgPool) -> crate::events::EventStore {
    crate::events::EventStore::with_standing_projections(
        pool,
        crate::projections::standing_inline(),
    )
}
