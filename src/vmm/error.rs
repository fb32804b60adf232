//! Errors of the sandbox layer.
//!
//! Policy: every fallible operation in `vmm` returns [`VmmError`]. Variants name what failed and,
//! where an operator can act, what to do. Archive rejections carry the offending entry's name,
//! because the person who uploaded it needs to know which file to fix.

use std::path::PathBuf;

use super::archive_policy::ArchiveError;

#[derive(Debug, thiserror::Error)]
pub enum VmmError {
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },

    #[error(
        "blob {digest} is not in the blob store; re-import or rebuild the image that references it"
    )]
    BlobMissing { digest: String },

    #[error("blob {expected} is corrupt: its content hashes to {actual}; delete it and re-import")]
    DigestMismatch { expected: String, actual: String },

    #[error("object store: {what}: {source}")]
    ObjectStore {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    #[error("STRATA_BLOB_URL {url:?}: {why}")]
    BlobUrl { url: String, why: String },

    #[error("invalid digest {0:?}: expected sha256:<64 hex digits>")]
    InvalidDigest(String),

    #[error(transparent)]
    Archive(#[from] ArchiveError),

    #[error("layer stack of {depth} layers does not fit the overlay depth budget of {budget} (overlay allows {overlay_max} lower layers, {reserved} reserved); compact the stack first")]
    StackTooDeep {
        depth: usize,
        budget: usize,
        overlay_max: usize,
        reserved: usize,
    },

    #[error("a sandbox needs at least one layer")]
    EmptyStack,

    #[error("sealing a layer: {0}")]
    Seal(String),

    #[error("sandbox boot failed: {0}")]
    Boot(String),

    #[error("sandbox disk: {0}")]
    Disk(String),

    #[error("sandbox network: {0}")]
    Network(String),

    #[error("sandbox command could not start: {0}")]
    Exec(String),

    /// The command could not start for a reason the caller may word itself.
    #[error("sandbox command could not start: {0}")]
    CommandStart(super::start_failure::StartFailure),

    #[error("COPY failed: {0}")]
    Copy(String),

    #[error("user setup failed: {0}")]
    User(String),

    #[error("cgroup {path}: {message}")]
    Cgroup { path: PathBuf, message: String },

    #[error(
        "the namespace backend needs root (uid 0); run strata as root or pick another backend"
    )]
    NotRoot,

    #[error("image {0:?} is not in the local catalog; {how}", how = super::image::how_to_get(.0))]
    ImageNotFound(String),

    #[error("image: {0}")]
    Image(String),

    #[error("compaction range {start}..{end} is not inside a stack of {len} layers")]
    BadRange {
        start: usize,
        end: usize,
        len: usize,
    },
}

impl VmmError {
    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> VmmError {
        let context = context.into();
        move |source| VmmError::Io { context, source }
    }
}

pub type Result<T, E = VmmError> = std::result::Result<T, E>;
