//! Sandboxes: backends, layers, base images and the build executor.
//!
//! * [`backend`]: the `SandboxBackend` / `Sandbox` contract every backend implements.
//! * [`namespace`]: the default backend (namespaces + overlayfs + cgroups), with its pid 1
//!   and in-sandbox agent.
//! * [`archive_policy`]: what an archive may contain; the one place that writes archives
//!   (with [`tar_guard`], which caps extension entries before the tar parser reads them);
//!   `archive_fuzz` (tests and fuzzing only): the oracle that no archive writes outside its
//!   destination.
//! * [`copy`], [`users`]: COPY semantics and user resolution, run inside sandboxes;
//!   [`start_failure`]: why a command could not start, as the agent reports it.
//! * [`layer`] (with [`layer_staging`], [`layer_sync`], [`layer_budget`]), [`blob_store`]
//!   (with [`blob_url`], [`object_blob_store`]), [`depth`], [`compact`]: layer tars,
//!   content-addressed storage, the overlay depth budget and compaction.
//! * [`tree_walk`]: host access to a tree a tenant shaped: one-name `Component`s, directories
//!   opened only beneath their parent, and walks by descriptor at any depth (usage walks,
//!   whiteout removal; the extractor opens its directories through it).
//! * [`process`]: lasting processes, file operations and signals of a launched sandbox.
//! * [`image`]: the local image catalog, built-in base images and imports.

#[cfg(any(test, fuzzing))]
pub mod archive_fuzz;
pub mod archive_policy;
pub mod backend;
pub mod blob_store;
pub mod blob_url;
pub mod compact;
pub mod copy;
pub mod depth;
pub mod error;
pub mod id_range;
pub mod image;
pub mod layer;
pub mod layer_budget;
pub mod layer_staging;
pub mod layer_sync;
pub(crate) mod layer_tee;
pub mod local_s3;
pub mod namespace;
pub mod object_blob_store;
pub mod output;
pub mod port_door;
pub mod process;
pub mod start_failure;
pub mod tar_guard;
pub mod tree_walk;
pub mod users;

pub use backend::{
    BootSpec, CommandLine, CopyRequest, ExecDefaults, ExecOutcome, ExecRequest, Limits, Network,
    OutputLine, OutputSink, OutputStream, Sandbox, SandboxBackend, Usage,
};
pub use blob_store::{BlobSink, BlobStore, LocalBlobStore, StoredBlob};
pub use blob_url::open_blob_store;
pub use error::VmmError;
pub use layer::{LayerCache, LayerRef};
pub use namespace::network::NetworkConfig;
pub use namespace::{NamespaceBackend, NamespaceConfig};
pub use object_blob_store::ObjectBlobStore;
