//! Base images from OCI registries (ADR 0014).
//!
//! * [`settings`]: mirrors, insecure registries, the size ceiling.
//! * [`challenge`], [`session`]: the distribution API's `WWW-Authenticate` flow over reqwest.
//! * [`manifest`]: indexes, manifests, configs, platform choice.
//! * [`unpack`]: one layer, verified and unpacked while it downloads.
//! * [`pull`]: the engine: [`Puller::pull`].
//! * [`reach`]: which hosts a pull may reach (no loopback, private or metadata addresses
//!   unless listed; realms on the registry's site).
//! * [`error`]: [`PullError`], which never carries a credential.
//! * [`layout`], [`local`]: OCI layouts and a loopback registry, for `strata bench pull` and tests.

pub mod challenge;
pub mod credentials;
pub mod error;
pub mod expansion;
pub mod layout;
pub mod local;
pub mod manifest;
pub mod provenance;
pub mod pull;
pub mod reach;
pub mod sealed;
pub mod session;
pub mod settings;
pub mod unpack;

pub use error::PullError;
pub use pull::{Progress, PullStats, PulledImage, Puller};
pub use session::BasicAuth;
pub use settings::RegistrySettings;
