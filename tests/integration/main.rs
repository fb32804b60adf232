//! Every integration test, in one binary.
//!
//! One binary links the library once instead of once per file: the suite builds in a fraction
//! of the disk and link time. `cargo nextest run` still runs each test in its own process; pick
//! a group by its module, e.g. `cargo nextest run -E 'test(/^sandbox_/)'`.
//! Shared setup lives in `common` (see its docs).

mod common;

mod admin_api;
mod architecture;
mod blob_conformance;
mod build_context;
mod cache_modes;
mod cli_history;
mod commands;
mod copy_from;
mod deleted_template;
mod e2b_api;
mod event_feed;
mod event_store;
mod fair_share;
mod gc;
mod group_commit;
mod intent_index;
mod launched_sandboxes;
mod lost_reply;
mod multi_node;
mod ops_metrics;
mod ops_progress;
mod ops_readme;
mod ops_traces;
mod ops_ui;
mod ops_why;
mod over_time_migration;
mod placement;
mod projections;
mod reconcilers;
mod registry_pull;
mod sandbox_boundary;
mod sandbox_checkpoint;
mod sandbox_depth;
mod sandbox_disk;
mod sandbox_exec;
mod sandbox_hostile;
mod sandbox_images;
mod sandbox_limits;
mod sandbox_network;
mod status_hold;
mod store_outage;
mod stream_name_migration;
mod up;
mod worker_builds;
mod worker_cache;
