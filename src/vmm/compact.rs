//! Compaction: flatten a run of layers into one layer with the same filesystem result.
//!
//! The run's extracted directories are applied in order onto a staging directory with
//! overlay's own rules, so the staging directory is exactly the upper directory that the
//! run's changes would have produced in one go: a whiteout removes what was staged and hides
//! the layers below the run; an opaque directory, or a directory that replaces a staged
//! non-directory or whiteout, becomes opaque; anything else replaces what was staged. The
//! staging directory is then sealed like any upper.

use std::fs;
use std::ops::Range;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, Timestamps};

use super::archive_policy::OVERLAY_OPAQUE_XATTR;
use super::blob_store::BlobStore;
use super::error::{Result, VmmError};
use super::id_range::Owners;
use super::layer::{self, LayerCache, LayerRef};
use crate::domain::ids::Digest;

/// Flattens `stack[range]` into one layer; returns the new stack and the new layer.
pub fn compact(
    blobs: &dyn BlobStore,
    cache: &LayerCache,
    stack: &[Digest],
    range: Range<usize>,
    scratch: &Path,
) -> Result<(Vec<Digest>, LayerRef)> {
    if range.start >= range.end || range.end > stack.len() {
        return Err(VmmError::BadRange {
            start: range.start,
            end: range.end,
            len: stack.len(),
        });
    }
    let staging = tempfile::Builder::new()
        .prefix("compact-")
        .tempdir_in(scratch)
        .map_err(VmmError::io("creating a compaction directory"))?;
    for digest in &stack[range.clone()] {
        let dir = cache.ensure(blobs, digest)?;
        merge(&dir, staging.path())?;
    }
    let layer = layer::seal_dir(staging.path(), blobs, Owners::Mapped(cache.ids()))?;
    let mut new_stack = stack[..range.start].to_vec();
    new_stack.push(layer.digest);
    new_stack.extend_from_slice(&stack[range.end..]);
    Ok((new_stack, layer))
}

fn io_at(path: &Path) -> impl FnOnce(std::io::Error) -> VmmError + '_ {
    move |e| VmmError::io(format!("compacting {}", path.display()))(e)
}

fn is_whiteout(meta: &fs::Metadata) -> bool {
    meta.file_type().is_char_device() && meta.rdev() == 0
}

fn is_opaque(path: &Path) -> bool {
    let mut buf = [0u8; 8];
    matches!(rustix::fs::lgetxattr(path, OVERLAY_OPAQUE_XATTR, &mut buf), Ok(1) if buf[0] == b'y')
}

fn remove_any(path: &Path) -> Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path).map_err(io_at(path)),
        Ok(_) => fs::remove_file(path).map_err(io_at(path)),
        Err(_) => Ok(()),
    }
}

fn copy_meta(meta: &fs::Metadata, dst: &Path) -> Result<()> {
    std::os::unix::fs::lchown(dst, Some(meta.uid()), Some(meta.gid())).map_err(io_at(dst))?;
    if !meta.file_type().is_symlink() {
        fs::set_permissions(dst, fs::Permissions::from_mode(meta.mode() & 0o7777))
            .map_err(io_at(dst))?;
    }
    let t = rustix::fs::Timespec {
        tv_sec: meta.mtime(),
        tv_nsec: 0,
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        dst,
        &Timestamps {
            last_access: t,
            last_modification: t,
        },
        AtFlags::SYMLINK_NOFOLLOW,
    )
    .map_err(|e| io_at(dst)(e.into()))
}

fn merge(src: &Path, dst: &Path) -> Result<()> {
    for entry in fs::read_dir(src).map_err(io_at(src))? {
        let entry = entry.map_err(io_at(src))?;
        let s = entry.path();
        let d = dst.join(entry.file_name());
        let smeta = fs::symlink_metadata(&s).map_err(io_at(&s))?;
        let dmeta = fs::symlink_metadata(&d).ok();
        if is_whiteout(&smeta) {
            remove_any(&d)?;
            rustix::fs::mknodat(
                rustix::fs::CWD,
                &d,
                FileType::CharacterDevice,
                Mode::empty(),
                rustix::fs::makedev(0, 0),
            )
            .map_err(|e| io_at(&d)(e.into()))?;
        } else if smeta.is_dir() {
            let make_opaque = is_opaque(&s) || matches!(&dmeta, Some(m) if !m.is_dir());
            let keep = matches!(&dmeta, Some(m) if m.is_dir()) && !is_opaque(&s);
            if !keep {
                remove_any(&d)?;
                fs::create_dir(&d).map_err(io_at(&d))?;
            }
            if make_opaque {
                rustix::fs::setxattr(
                    &d,
                    OVERLAY_OPAQUE_XATTR,
                    b"y",
                    rustix::fs::XattrFlags::empty(),
                )
                .map_err(|e| io_at(&d)(e.into()))?;
            }
            copy_meta(&smeta, &d)?;
            merge(&s, &d)?;
        } else {
            remove_any(&d)?;
            let ft = smeta.file_type();
            if ft.is_symlink() {
                let target = fs::read_link(&s).map_err(io_at(&s))?;
                std::os::unix::fs::symlink(target, &d).map_err(io_at(&d))?;
            } else if ft.is_fifo() {
                rustix::fs::mknodat(
                    rustix::fs::CWD,
                    &d,
                    FileType::Fifo,
                    Mode::from_raw_mode(0o600),
                    0,
                )
                .map_err(|e| io_at(&d)(e.into()))?;
            } else {
                fs::copy(&s, &d).map_err(io_at(&d))?;
            }
            copy_meta(&smeta, &d)?;
        }
    }
    Ok(())
}
