//! The client side of a COPY step: which files of the build context a source selects, the
//! `filesHash` the build request carries for them, and the archive uploaded when the server
//! does not have that hash yet.
//!
//! The server only ever sees the hash and the archive, so both must be exactly what the stock
//! E2B Python SDK produces for the same tree: a CLI build and an SDK build of one template then
//! share cache entries, and the protocol's "do you have these files?" check answers the same.
//! The behaviour is pinned in `tests/integration/build_context.rs` against the SDK itself
//! (PROTOCOL.md sections 2 and 4).
//!
//! * [`validate_source`]: the SDK's refusal of absolute and escaping sources.
//! * [`load_ignore`]: `.dockerignore` plus extra patterns, as the SDK reads them.
//! * [`select_files`]: the SDK's `get_all_files_in_path` (glob, directory walk, ignores).
//! * [`files_hash`]: the SDK's `calculate_files_hash` (symlinks not resolved).
//! * [`write_archive`]: a reproducible gzip tar of the selection.

mod archive;
mod files_hash;
mod ignore;
mod select;
mod source;

pub use archive::write_archive;
pub use files_hash::files_hash;
pub use ignore::{load_ignore, load_ignore_file};
pub use select::select_files;
pub use source::validate_source;

use crate::domain::ignore_pattern::IgnorePatternError;

/// What went wrong preparing a COPY source, naming the path and what to change.
#[derive(Debug, thiserror::Error)]
pub enum ContextError {
    #[error(
        "invalid source path \"{src}\": absolute paths are not allowed; use a path relative to \
         the context directory"
    )]
    AbsoluteSource { src: String },
    #[error(
        "invalid source path \"{src}\": it escapes the context directory; keep COPY sources \
         inside the context, or build from a directory that contains them"
    )]
    SourceEscapes { src: String },
    #[error(
        "source \"{src}\" matched \"{matched}\", which is outside the context directory \
         {context}; narrow the pattern so every match stays inside the context"
    )]
    MatchOutsideContext {
        src: String,
        matched: String,
        context: String,
    },
    /// Worded as the SDK words it, so both tools fail the same way on the same template.
    #[error(
        "No files found in {path}: check the COPY source and the ignore patterns \
         (.dockerignore) of the context"
    )]
    NoFiles { path: String },
    #[error(
        "{path}: the name is not valid UTF-8, which the E2B files hash cannot encode; rename it \
         or add it to .dockerignore"
    )]
    NonUtf8Path { path: String },
    #[error(
        "{path} is a {kind}: only regular files, directories and symlinks can be uploaded; \
         remove it from the context or add it to .dockerignore"
    )]
    UnsupportedFileType { path: String, kind: &'static str },
    #[error(
        "{path} is not inside the context directory {context}: archive only paths that \
         select_files returned for this context"
    )]
    OutsideContext { path: String, context: String },
    #[error(
        "{path} changed size while it was being archived; retry once nothing is writing to \
         the context"
    )]
    ChangedWhileArchiving { path: String },
    #[error("{path} is not valid UTF-8: save it as UTF-8 text")]
    DockerignoreNotUtf8 { path: String },
    #[error(transparent)]
    Ignore(#[from] IgnorePatternError),
    #[error("could not {action} {path}: {source}; check that it exists and is readable")]
    Io {
        action: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl ContextError {
    fn io(
        action: &'static str,
        path: impl AsRef<std::path::Path>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.as_ref().display().to_string();
        move |source| Self::Io {
            action,
            path,
            source,
        }
    }
}

/// The context as Python's `os.path.abspath` gives it: absolute and lexically clean, which
/// every path the SDK hashes or archives is relative to.
fn absolute_context(context: &std::path::Path) -> Result<String, ContextError> {
    let text = context.to_str().ok_or_else(|| ContextError::NonUtf8Path {
        path: context.display().to_string(),
    })?;
    if text.starts_with('/') {
        return Ok(crate::domain::path_glob::normpath(text));
    }
    let cwd =
        std::env::current_dir().map_err(ContextError::io("read the current directory", "."))?;
    let cwd = cwd.to_str().ok_or_else(|| ContextError::NonUtf8Path {
        path: cwd.display().to_string(),
    })?;
    Ok(crate::domain::path_glob::normpath(&format!("{cwd}/{text}")))
}

/// `abs` relative to `context` (both clean and absolute), `.` for the context itself.
fn relative_to(context: &str, abs: &str) -> Option<String> {
    if abs == context {
        return Some(".".into());
    }
    let rest = if context == "/" {
        abs.strip_prefix('/')?
    } else {
        abs.strip_prefix(context)?.strip_prefix('/')?
    };
    (!rest.is_empty()).then(|| rest.to_owned())
}

/// `context` joined with a clean relative path.
fn join(context: &str, relative: &str) -> String {
    match (context, relative) {
        (_, ".") => context.to_owned(),
        ("/", _) => format!("/{relative}"),
        _ => format!("{context}/{relative}"),
    }
}
