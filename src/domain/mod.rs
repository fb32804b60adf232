//! Pure domain logic: state machines as `decide(state, command) -> Result<Vec<Event>, Error>` and
//! `evolve(state, event) -> state`, key encodings and validation. Nothing here performs I/O or
//! reads a clock: time is passed in by the caller.
//!
//! Layout:
//! * [`ids`]: validated identifiers and the stream-name helpers.
//! * [`canonical`]: the length-delimited encoding behind every digest we compute.
//! * [`build_spec`]: the E2B request bodies as validated types, the request digest, and the
//!   command-context fold.
//! * [`team`]: tenants and their API keys.
//! * [`team_limits`]: what one team may hold at once (fair share of a shared service);
//!   [`byte_size`]: sizes as its messages say them.
//! * [`template`]: the template aggregate and the team-scoped name claim.
//! * [`build`]: the build aggregate (upload bindings and intents, freeze, attempts, fencing,
//!   publishing, terminal states) and its E2B status view.
//! * [`files`]: published generations of one `(scope, filesHash)`.
//! * [`promotion`]: the promotion outbox of one `(build, epoch)`.
//! * [`snapshot`]: immutable snapshot records (layer list + command context).
//! * [`start`]: the start and ready commands a build finalizes with (E2B's rules).
//! * [`upload_url`]: signed upload URLs.
//! * [`cache_key`]: fingerprint, base, step and final keys.
//! * [`cache_entry`]: the `cachekey-…` index entries (create-if-absent, CAS replace, retire)
//!   and lineage validation.
//! * [`object`]: the `object-{digest}` lifecycle (reader leases, the Deleting barrier).
//! * [`reachability`]: roots and tiers of stored objects, from the folded streams.
//! * [`retention`]: which unreferenced objects a GC pass deletes, in which order, and why.
//! * [`sandbox`]: a launched template, from the create call to its end (placement, fencing,
//!   deadline).
//! * [`setting_levels`]: one setting over its levels (template pin, team pin, service,
//!   default); [`cache_mode`] and [`backend_name`] are the settings it resolves; [`settings`]:
//!   the pins.
//! * [`placement`]: which queued builds a free node claims first, given which nodes hold
//!   their layers (cache-aware placement, with a bounded wait), fair across teams.
//!
//! Every aggregate follows one shape: `State` (Default), `Command`, `Event` (versioned, serde
//! tagged by `type`), `Error`, `decide` and `evolve`. Where one transition spans several streams,
//! a pure function over all their states returns the events per stream; the caller appends them
//! in one transaction with the versions it read.

pub mod backend_name;
pub mod build;
pub mod build_spec;
pub mod byte_size;
pub mod cache_entry;
pub mod cache_key;
pub mod cache_mode;
pub mod canonical;
pub mod dockerfile;
pub mod egress;
pub mod egress_policy;
pub mod files;
pub mod gc_pass;
pub mod ids;
pub mod ignore_pattern;
pub mod image_ref;
pub mod node_catalog;
pub mod object;
pub mod path_glob;
pub mod placement;
pub mod promotion;
pub mod reachability;
pub mod retention;
pub mod sandbox;
pub mod sandbox_address;
pub mod setting_levels;
pub mod settings;
pub mod snapshot;
pub mod start;
pub mod team;
pub mod team_limits;
pub mod template;
pub mod token;
pub mod upload_url;
