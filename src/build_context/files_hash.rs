//! The `filesHash` of a COPY step: the key the server caches the step's files under, and the
//! question "have you got these files?" it answers before asking for an upload. It has to be
//! the SDK's to the byte (PROTOCOL.md section 2): a different hash for the same tree is a cache
//! miss and a needless upload on every build.
//!
//! The bytes hashed, with no separators: `COPY <src> <dest>` as written, then for each
//! selected path in order its context-relative path, the decimal `st_mode`, and
//! * for a symlink (never followed): its size and its target;
//! * for a directory: nothing more (its size depends on the file system, not on the files);
//! * for a regular file: its size and content;
//! * for anything else: its size.
//!
//! uid, gid and mtime are left out so a checkout hashes the same on every machine.

use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::select::select;
use super::ContextError;
use crate::domain::ignore_pattern::IgnoreMatcher;

const CHUNK: usize = 1024 * 1024;

/// The SDK's `calculate_files_hash(src, dest, context, patterns, resolve_symlinks=False)`:
/// 64 lowercase hex digits. [`ContextError::NoFiles`] when `src` selects nothing.
pub fn files_hash(
    context: &Path,
    src: &str,
    dest: &str,
    ignore: &IgnoreMatcher,
) -> Result<String, ContextError> {
    let selection = select(context, src, ignore)?;
    if selection.files.is_empty() {
        return Err(ContextError::NoFiles {
            path: context.join(src).display().to_string(),
        });
    }
    let mut hasher = Sha256::new();
    hasher.update(format!("COPY {src} {dest}").as_bytes());
    let mut buffer = vec![0u8; CHUNK];
    for (abs, relative) in &selection.files {
        hasher.update(relative.as_bytes());
        let meta = std::fs::symlink_metadata(abs)
            .map_err(ContextError::io("read the metadata of", abs))?;
        hasher.update(meta.mode().to_string().as_bytes());
        let file_type = meta.file_type();
        if file_type.is_symlink() {
            hasher.update(meta.size().to_string().as_bytes());
            let target =
                std::fs::read_link(abs).map_err(ContextError::io("read the symlink", abs))?;
            // The SDK encodes the target as UTF-8, failing on anything else.
            if target.to_str().is_none() {
                return Err(ContextError::NonUtf8Path {
                    path: format!("{abs} -> {}", target.display()),
                });
            }
            hasher.update(target.as_os_str().as_bytes());
            continue;
        }
        if file_type.is_dir() {
            continue;
        }
        hasher.update(meta.size().to_string().as_bytes());
        if file_type.is_file() {
            let mut file = super::archive::open_regular(abs)?;
            loop {
                let n = file
                    .read(&mut buffer)
                    .map_err(ContextError::io("read", abs))?;
                if n == 0 {
                    break;
                }
                hasher.update(&buffer[..n]);
            }
        }
    }
    Ok(hex::encode(hasher.finalize()))
}
