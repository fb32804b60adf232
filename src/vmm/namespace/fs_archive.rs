//! A tar of one path inside a sandbox, written by the agent in the sandbox's root: what a
//! multi-stage build's `COPY --from` carries from one stage's sandbox into the next one's.
//!
//! The agent runs in the source sandbox's root, so every path and every symlink it resolves is
//! that sandbox's: a link to `/etc/shadow` names the stage's own file, never the host's. The
//! requested path itself is followed (as Docker follows a `COPY --from` source); below it,
//! symlinks are archived as links. Sockets, FIFOs and devices are left out: a FIFO would block
//! the agent, and a template's files are for its sandboxes to create.

use std::fs::{self, Metadata, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use super::fs_ops::{FsError, FsErrorKind};

/// Writes a tar of `path` to `out`, its top entry named after the path's last component.
pub fn archive(path: &Path, out: &mut dyn Write) -> Result<(), FsError> {
    let name = path
        .file_name()
        .ok_or_else(|| {
            FsError::new(
                FsErrorKind::InvalidArgument,
                format!(
                    "'{}' names no file or directory to copy; name one below /",
                    path.display()
                ),
            )
        })?
        .to_owned();
    let meta = fs::metadata(path).map_err(|e| fail("reading", path, &e))?;
    let mut builder = tar::Builder::new(out);
    builder.mode(tar::HeaderMode::Complete);
    add(&mut builder, path, Path::new(&name), &meta)?;
    builder
        .into_inner()
        .and_then(|w| w.flush())
        .map_err(|e| fail("sending", path, &e))
}

fn add(
    builder: &mut tar::Builder<&mut dyn Write>,
    path: &Path,
    name: &Path,
    meta: &Metadata,
) -> Result<(), FsError> {
    let kind = meta.file_type();
    let mut header = tar::Header::new_gnu();
    header.set_metadata_in_mode(meta, tar::HeaderMode::Complete);
    if kind.is_dir() {
        header.set_size(0);
        builder
            .append_data(&mut header, name, io::empty())
            .map_err(|e| fail("sending", path, &e))?;
        let mut children: Vec<_> = fs::read_dir(path)
            .map_err(|e| fail("listing", path, &e))?
            .collect::<Result<_, _>>()
            .map_err(|e| fail("listing", path, &e))?;
        children.sort_by_key(|c| c.file_name());
        for child in children {
            let child_path = child.path();
            let child_meta =
                fs::symlink_metadata(&child_path).map_err(|e| fail("reading", &child_path, &e))?;
            add(
                builder,
                &child_path,
                &name.join(child.file_name()),
                &child_meta,
            )?;
        }
    } else if kind.is_symlink() {
        let target = fs::read_link(path).map_err(|e| fail("reading", path, &e))?;
        header.set_size(0);
        builder
            .append_link(&mut header, name, &target)
            .map_err(|e| fail("sending", path, &e))?;
    } else if kind.is_file() {
        // Opened without blocking, and checked again: the file may have been swapped for a
        // FIFO since it was listed.
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| fail("opening", path, &e))?;
        let opened = file.metadata().map_err(|e| fail("reading", path, &e))?;
        if !opened.is_file() {
            return Ok(());
        }
        // Read to exactly the length the header declares, even if the file grows meanwhile.
        header.set_size(opened.len());
        builder
            .append_data(&mut header, name, io::Read::take(file, opened.len()))
            .map_err(|e| fail("sending", path, &e))?;
    } else if kind.is_fifo() || kind.is_socket() || kind.is_block_device() || kind.is_char_device()
    {
        // Left out, as the module says.
    }
    Ok(())
}

fn fail(op: &str, path: &Path, e: &io::Error) -> FsError {
    let kind = match e.kind() {
        io::ErrorKind::NotFound => FsErrorKind::NotFound,
        io::ErrorKind::PermissionDenied => FsErrorKind::PermissionDenied,
        _ => FsErrorKind::Internal,
    };
    let message = match kind {
        FsErrorKind::NotFound => format!("path '{}' does not exist", path.display()),
        _ => format!("{op} '{}': {e}", path.display()),
    };
    FsError::new(kind, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    #[test]
    fn a_tree_is_archived_with_links_as_links_and_fifos_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("out");
        fs::create_dir_all(root.join("bin")).unwrap();
        fs::write(root.join("bin/app"), b"binary").unwrap();
        fs::set_permissions(root.join("bin/app"), fs::Permissions::from_mode(0o755)).unwrap();
        symlink("/etc/passwd", root.join("passwd")).unwrap();
        nix_mkfifo(&root.join("pipe"));
        let mut bytes = Vec::new();
        archive(&root, &mut bytes).unwrap();
        let mut tar = tar::Archive::new(bytes.as_slice());
        let entries: Vec<(String, tar::EntryType, u32)> = tar
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.path().unwrap().display().to_string(),
                    e.header().entry_type(),
                    e.header().mode().unwrap() & 0o7777,
                )
            })
            .collect();
        let names: Vec<&str> = entries.iter().map(|(n, _, _)| n.as_str()).collect();
        assert_eq!(names, vec!["out", "out/bin", "out/bin/app", "out/passwd"]);
        assert_eq!(entries[2].1, tar::EntryType::Regular);
        assert_eq!(entries[2].2, 0o755);
        assert_eq!(entries[3].1, tar::EntryType::Symlink);
        // A file alone is one entry named after it; the root names nothing to copy.
        let mut one = Vec::new();
        archive(&root.join("bin/app"), &mut one).unwrap();
        let names: Vec<String> = tar::Archive::new(one.as_slice())
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(names, vec!["app"]);
        assert_eq!(
            archive(Path::new("/"), &mut Vec::new()).unwrap_err().kind,
            FsErrorKind::InvalidArgument
        );
        assert_eq!(
            archive(&root.join("missing"), &mut Vec::new())
                .unwrap_err()
                .kind,
            FsErrorKind::NotFound
        );
    }

    fn nix_mkfifo(path: &Path) {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    }
}
