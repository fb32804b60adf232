//! Which paths a COPY source selects: the SDK's `get_all_files_in_path` with directories
//! included, which is the list both the files hash and the archive are made of.
//!
//! Two steps, each as the SDK takes it:
//! 1. Expand the source as `wcmatch.glob(src, GLOBSTAR | DOTMATCH, root_dir=context)` does,
//!    quirks included: the first segment must be an entry of the context, later `.`/`..`
//!    segments match even under a file or a dangling link, a trailing `**` also yields the
//!    directory it starts from, and `**` never enters a symlinked directory. Directory
//!    listings happen through the OS (so `link/..` is the link target's parent), but each match
//!    is then cleaned lexically.
//! 2. Keep each match that the ignore patterns do not exclude; a real directory (not a link to
//!    one) brings itself and everything under it, walked without following symlinks, skipping
//!    ignored entries but still descending into an ignored directory a `!` pattern could
//!    re-include something under.

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use super::{absolute_context, join, validate_source, ContextError};
use crate::domain::ignore_pattern::IgnoreMatcher;
use crate::domain::path_glob::{normpath, parse_source, SourcePart, SourceSegment};

/// The paths `src` selects in `context`, absolute and sorted by their bytes (the SDK sorts the
/// absolute path strings; for UTF-8 that is the same order). `ignore` should come from
/// [`super::load_ignore`] for this context, so absolute patterns are anchored as the SDK
/// anchors them. The source is validated first ([`validate_source`]), and a match that
/// cleans to a path outside the context (`**/..` at the top) is refused.
pub fn select_files(
    context: &Path,
    src: &str,
    ignore: &IgnoreMatcher,
) -> Result<Vec<PathBuf>, ContextError> {
    let selection = select(context, src, ignore)?;
    Ok(selection.files.into_keys().map(PathBuf::from).collect())
}

/// A selection: absolute path to context-relative path, in archive and hash order.
pub(super) struct Selection {
    pub files: BTreeMap<String, String>,
}

pub(super) fn select(
    context: &Path,
    src: &str,
    ignore: &IgnoreMatcher,
) -> Result<Selection, ContextError> {
    validate_source(src)?;
    let abs_context = absolute_context(context)?;
    let glob = parse_source(src);
    let mut raw_matches = Vec::new();
    Globber {
        root: Path::new(&abs_context),
    }
    .expand(&glob.parts, &mut raw_matches);

    let mut matches = Vec::with_capacity(raw_matches.len());
    for raw in raw_matches {
        let raw = String::from_utf8(raw).map_err(|e| ContextError::NonUtf8Path {
            path: Path::new(&abs_context)
                .join(OsStr::from_bytes(e.as_bytes()))
                .display()
                .to_string(),
        })?;
        let relative = normpath(&raw);
        if relative == ".." || relative.starts_with("../") {
            return Err(ContextError::MatchOutsideContext {
                src: src.into(),
                matched: raw,
                context: abs_context,
            });
        }
        matches.push(relative);
    }
    // Parents before children, so a path under a directory already walked is not walked
    // again.
    matches.sort_by_key(|m| {
        if m == "." {
            0
        } else {
            m.matches('/').count() + 1
        }
    });

    let mut walker = Walker {
        ignore,
        files: BTreeMap::new(),
    };
    let mut walked: HashSet<String> = HashSet::new();
    for relative in matches {
        if is_under(&walked, &relative) {
            continue;
        }
        if relative != "." && ignore.matches(&relative) {
            continue;
        }
        let abs = join(&abs_context, &relative);
        let is_real_dir = fs::symlink_metadata(&abs).is_ok_and(|m| m.is_dir());
        walker.files.insert(abs.clone(), relative.clone());
        if is_real_dir {
            walker.walk(&abs, &relative)?;
            walked.insert(relative);
        }
    }
    Ok(Selection {
        files: walker.files,
    })
}

/// Whether a parent of `relative` (or the context itself) was walked.
fn is_under(walked: &HashSet<String>, relative: &str) -> bool {
    if walked.contains(".") {
        return true;
    }
    let mut parent = relative;
    while let Some((up, _)) = parent.rsplit_once('/') {
        if walked.contains(up) {
            return true;
        }
        parent = up;
    }
    false
}

struct Walker<'a> {
    ignore: &'a IgnoreMatcher,
    files: BTreeMap<String, String>,
}

impl Walker<'_> {
    fn walk(&mut self, dir: &str, dir_relative: &str) -> Result<(), ContextError> {
        let entries = fs::read_dir(dir).map_err(ContextError::io("list the directory", dir))?;
        for entry in entries {
            let entry = entry.map_err(ContextError::io("list the directory", dir))?;
            let raw_name = entry.file_name();
            let name = String::from_utf8_lossy(raw_name.as_bytes());
            let relative = if dir_relative == "." {
                name.to_string()
            } else {
                format!("{dir_relative}/{name}")
            };
            let ignored = self.ignore.matches(&relative);
            let file_type = entry
                .file_type()
                .map_err(ContextError::io("read the type of", entry.path()))?;
            let descend =
                file_type.is_dir() && (!ignored || self.ignore.may_match_under(&relative));
            // The SDK fails on such a name only once it hashes it; an ignored one that is not
            // walked into is harmless.
            if raw_name.to_str().is_none() && (!ignored || descend) {
                return Err(ContextError::NonUtf8Path {
                    path: entry.path().display().to_string(),
                });
            }
            let abs = join(dir, &name);
            if !ignored {
                self.files.insert(abs.clone(), relative.clone());
            }
            if descend {
                self.walk(&abs, &relative)?;
            }
        }
        Ok(())
    }
}

/// The wcmatch expansion of a split source, relative to `root`, unnormalized (as wcmatch
/// returns them: `./app`, `app/`, `x/..`). Paths are bytes: a name that is not UTF-8 is
/// matched by its lossy form but kept intact, so that the refusal can name it.
struct Globber<'a> {
    root: &'a Path,
}

/// One directory entry as wcmatch sees it while globbing.
struct Entry {
    name: Vec<u8>,
    /// Following symlinks.
    is_dir: bool,
    /// A symlink to a directory (only asked of directories).
    is_dir_link: bool,
}

impl Globber<'_> {
    fn expand(&self, parts: &[SourcePart], out: &mut Vec<Vec<u8>>) {
        let Some(first) = parts.first() else {
            return;
        };
        let SourceSegment::Literal(start) = &first.segment else {
            self.glob(Vec::new(), parts, out);
            return;
        };
        // The first segment is looked up in the context's listing, so it must name an entry
        // (a dangling link counts); a source ending in `/` needs a directory there.
        let source_dir_only = parts.last().is_some_and(|p| p.dir_only);
        if start != "." && start != ".." {
            let path = self.root.join(start);
            let exists = fs::symlink_metadata(&path).is_ok();
            let is_dir = fs::metadata(&path).is_ok_and(|m| m.is_dir());
            if !exists || (source_dir_only && !is_dir) {
                return;
            }
        }
        let start = start.as_bytes().to_vec();
        if !first.dir_only {
            out.push(start);
        } else if parts.len() > 1 {
            self.glob(start, &parts[1..], out);
        } else {
            out.push(join_glob(&start, b""));
        }
    }

    fn glob(&self, curdir: Vec<u8>, parts: &[SourcePart], out: &mut Vec<Vec<u8>>) {
        let part = &parts[0];
        let rest = &parts[1..];
        match &part.segment {
            SourceSegment::Globstar => {
                let (target, dir_only, after) = match rest.split_first() {
                    Some((next, after)) => (Some(&next.segment), next.dir_only, after),
                    None => (None, part.dir_only, rest),
                };
                // `dir/**` also yields `dir/` itself (zero directories).
                if target.is_none() && !curdir.is_empty() {
                    out.push(join_glob(&curdir, b""));
                }
                let mut found = Vec::new();
                self.glob_dir(&curdir, target, dir_only, true, &mut found);
                for path in found {
                    if after.is_empty() {
                        out.push(path);
                    } else {
                        self.glob(path, after, out);
                    }
                }
            }
            segment if !part.dir_only => self.glob_dir(&curdir, Some(segment), false, false, out),
            segment => {
                let mut found = Vec::new();
                self.glob_dir(&curdir, Some(segment), true, false, &mut found);
                for path in found {
                    if rest.is_empty() {
                        out.push(path);
                    } else {
                        self.glob(path, rest, out);
                    }
                }
            }
        }
    }

    /// The entries of `curdir` that `matcher` accepts (every entry without one), `.` and `..`
    /// included when the matcher spells them, recursing into real directories when `deep`.
    fn glob_dir(
        &self,
        curdir: &[u8],
        matcher: Option<&SourceSegment>,
        dir_only: bool,
        deep: bool,
        out: &mut Vec<Vec<u8>>,
    ) {
        let accepts = |name: &[u8]| {
            let name = String::from_utf8_lossy(name);
            match matcher {
                None => true,
                Some(SourceSegment::Literal(literal)) => *literal == name,
                Some(SourceSegment::Pattern(pattern)) => pattern.matches(&name),
                Some(SourceSegment::Globstar) => false,
            }
        };
        // wcmatch offers `.` and `..` before it lists the directory, so they match even when
        // the listing fails (under a file or a dangling link).
        if matcher.is_some() {
            for special in [&b"."[..], b".."] {
                if accepts(special) {
                    out.push(join_glob(curdir, special));
                }
            }
        }
        for entry in self.list(curdir) {
            if dir_only && !entry.is_dir {
                continue;
            }
            let path = join_glob(curdir, &entry.name);
            if accepts(&entry.name) {
                out.push(path.clone());
            }
            if deep && entry.is_dir && !entry.is_dir_link {
                self.glob_dir(&path, matcher, dir_only, deep, out);
            }
        }
    }

    /// The listing of `curdir`; an unreadable directory is empty, as wcmatch treats it.
    fn list(&self, curdir: &[u8]) -> Vec<Entry> {
        let dir = self.root.join(OsStr::from_bytes(curdir));
        let Ok(entries) = fs::read_dir(dir) else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .map(|entry| {
                let is_dir = fs::metadata(entry.path()).is_ok_and(|m| m.is_dir());
                let is_dir_link = is_dir && entry.file_type().is_ok_and(|t| t.is_symlink());
                Entry {
                    name: entry.file_name().into_vec(),
                    is_dir,
                    is_dir_link,
                }
            })
            .collect()
    }
}

/// Python's `os.path.join(curdir, name)` for the relative paths wcmatch builds.
fn join_glob(curdir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut path = curdir.to_vec();
    if !curdir.is_empty() && !curdir.ends_with(b"/") {
        path.push(b'/');
    }
    path.extend_from_slice(name);
    path
}
