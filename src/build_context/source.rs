//! The SDK refuses, before anything is read, a COPY source that is absolute or climbs out of
//! the context; refusing the same ones keeps a template that fails under the SDK failing here
//! rather than uploading files from outside the directory the user named.

use super::ContextError;
use crate::domain::path_glob::normpath;

/// Checks `src` lexically, as the SDK's `validate_relative_path` does: `foo/../bar` is fine,
/// `foo/../../bar` and `/etc` are not, and `..myconfig` is a plain name.
pub fn validate_source(src: &str) -> Result<(), ContextError> {
    if src.starts_with('/') {
        return Err(ContextError::AbsoluteSource { src: src.into() });
    }
    let normalized = normpath(src);
    if normalized == ".." || normalized.starts_with("../") {
        return Err(ContextError::SourceEscapes { src: src.into() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_sources_inside_the_context_are_accepted() {
        for src in [
            "app",
            "./app",
            "app/",
            "a/../b",
            "..myconfig",
            "**/*.py",
            ".",
            "",
        ] {
            validate_source(src).unwrap_or_else(|e| panic!("{src}: {e}"));
        }
    }

    #[test]
    fn absolute_and_escaping_sources_are_refused() {
        assert!(matches!(
            validate_source("/etc"),
            Err(ContextError::AbsoluteSource { .. })
        ));
        for src in ["..", "../x", "a/../../b", "./a/../../../b"] {
            let err = validate_source(src).unwrap_err();
            assert!(matches!(err, ContextError::SourceEscapes { .. }), "{src}");
            assert!(err.to_string().contains(src), "{err}");
        }
    }
}
