//! The ignore patterns of a COPY: the context's `.dockerignore` first, then the template's own
//! patterns, so that the latter win (last match wins), as the SDK orders them.

use std::path::Path;

use super::{absolute_context, ContextError};
use crate::domain::ignore_pattern::{parse_dockerignore, IgnoreMatcher};

/// Reads `<context>/.dockerignore` (absent, or a dangling link, means no patterns), appends
/// `extra`, and anchors absolute patterns that point into the context, as the SDK does.
pub fn load_ignore(context: &Path, extra: &[String]) -> Result<IgnoreMatcher, ContextError> {
    load_ignore_file(context, &context.join(".dockerignore"), extra)
}

/// [`load_ignore`] with the patterns read from `path` (absent: none), for BuildKit's
/// `<Dockerfile>.dockerignore`, which takes the place of the context's `.dockerignore`.
pub fn load_ignore_file(
    context: &Path,
    path: &Path,
    extra: &[String],
) -> Result<IgnoreMatcher, ContextError> {
    let abs_context = absolute_context(context)?;
    let mut patterns = if path.exists() {
        let bytes = std::fs::read(path).map_err(ContextError::io("read", path))?;
        let text = String::from_utf8(bytes).map_err(|_| ContextError::DockerignoreNotUtf8 {
            path: path.display().to_string(),
        })?;
        parse_dockerignore(&text)
    } else {
        Vec::new()
    };
    patterns.extend(extra.iter().cloned());
    Ok(IgnoreMatcher::for_context(&patterns, &abs_context)?)
}
