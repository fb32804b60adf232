//! strata: a self-hosted template-build service that speaks the E2B build protocol.
//!
//! Layout:
//! * [`domain`]: pure state machines (`decide`/`evolve`), cache-key encoding, validation. No I/O.
//! * [`events`]: versioned event types and the Postgres event store.
//! * [`projections`]: read models fed inline or from the global feed, and their queries.
//! * [`app`]: the write side: one function per use case (load, decide, append); the only
//!   caller of the command loop. Layers and their directions: `layers.rs`, ADR 0016.
//! * [`reconcilers`]: workers that drive every build to a terminal state.
//! * [`build_context`]: COPY sources selected, hashed and archived as the E2B Python SDK does.
//! * [`api`]: the E2B-compatible HTTP API and the operator (audit) API.
//! * [`vmm`]: sandbox backends, layers and images.
//! * [`registry`]: pulling base images from OCI registries.
//! * [`worker`]: the build node: claims builds, runs their steps in sandboxes, publishes results.
//! * [`metrics`]: Prometheus families and `/metrics`; [`inspect`]: read-only operator queries
//!   (`strata why`, `/ui`).
//! * [`config`], [`telemetry`], [`embedded_postgres`], [`serve`]: process plumbing shared by the
//!   subcommands.

pub mod api;
pub mod app;
pub mod build_context;
pub mod clock;
pub mod config;
pub mod db;
pub mod domain;
pub mod embedded_postgres;
pub mod envd;
pub mod events;
pub mod fault;
pub mod host_apt;
pub mod host_interfaces;
pub mod http_relay;
pub mod inspect;
mod layers;
pub mod metrics;
pub mod open_files;
pub mod projections;
pub mod reconcilers;
pub mod registry;
pub mod serve;
pub mod serve_tls;
pub mod streams;
pub mod telemetry;
pub mod trace;
pub mod vmm;
pub mod worker;
