//! strata's envd-compatible agent protocol: the Connect RPC protocol with the JSON codec over
//! HTTP/1.1, which is all the stock E2B SDK speaks to the daemon inside a sandbox
//! (`SANDBOX-PROTOCOL.md` §4–§6).
//!
//! * [`connect`]: envelopes, error codes and the request/response plumbing of Connect.
//! * [`messages`]: the `process.Process` and `filesystem.Filesystem` messages, mapped the way
//!   protojson maps them (camelCase names, omitted defaults, base64 bytes, enum names).
//! * [`agent`]: the sandboxes a node's agent answers for; [`server`]: its routes and the
//!   `process.Process` service; [`files`]: `/files` and `filesystem.Filesystem`;
//!   [`processes`]: the processes it started, by pid; [`watches`]: directory watches
//!   (ADR 0028); [`metrics`]: what a sandbox uses now; [`budget`]: what one sandbox's
//!   clients can make the node hold.

pub mod agent;
pub mod budget;
pub mod connect;
pub mod files;
pub mod messages;
pub mod metrics;
pub mod ports;
pub mod processes;
pub mod server;
pub mod watches;

/// The envd version strata reports as `envdVersion`. The SDK gates features on it: from 0.4.0 it
/// sends the user (`Authorization: Basic`) only when the caller asks for one, from 0.5.2 it
/// closes stdin, from 0.5.7 it uploads octet-stream and gzip bodies (all of which strata's agent
/// serves); 0.6.2 would have it send file metadata, which is not kept yet. Below 0.1.0 it kills
/// the sandbox it just created. Raise it only together with what the newer gates require.
pub const ENVD_VERSION: &str = "0.5.7";
