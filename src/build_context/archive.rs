//! The upload archive of a COPY step: what the SDK's `tar_file_stream` sends (PROTOCOL.md
//! section 4), made reproducible.
//!
//! Members are the selected paths in selection order, named relative to the context (`app/`,
//! `app/bin/run.sh`, `.` for the context itself), each added on its own so the archive holds
//! exactly what was hashed. Directories are directory entries, symlinks keep their literal
//! target (dangling or absolute included), regular files their content, all their permission
//! bits. Owners are root and every mtime is 0, so one tree always gives the same bytes: the
//! archive's digest then identifies the tree as well as the files hash does.
//!
//! Sockets, fifos and devices are refused rather than skipped or recreated: the SDK's tar
//! would silently drop a socket and store a fifo the server refuses to extract anyway.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use flate2::write::GzEncoder;
use flate2::Compression;

use super::{absolute_context, relative_to, ContextError};
use crate::domain::path_glob::normpath;

/// Where the GNU format keeps a link target that does not fit the 100-byte header field.
const GNU_LONG_LINK_NAME: &[u8] = b"././@LongLink";
/// The size of a tar header's link name field.
const LINK_NAME_FIELD: usize = 100;

/// Writes `files` (absolute paths inside `context`, as [`super::select_files`] returns them)
/// as a gzip tar to `out` and returns the number of compressed bytes written.
pub fn write_archive(
    context: &Path,
    files: &[PathBuf],
    out: impl Write,
) -> Result<u64, ContextError> {
    let abs_context = absolute_context(context)?;
    let counter = CountingWriter {
        inner: out,
        count: 0,
    };
    // The default level: the SDK's level 9 costs much more CPU for a few percent of size.
    let mut builder = tar::Builder::new(GzEncoder::new(counter, Compression::default()));
    for file in files {
        let display = file.display().to_string();
        let text = file.to_str().ok_or_else(|| ContextError::NonUtf8Path {
            path: display.clone(),
        })?;
        let relative = relative_to(&abs_context, &normpath(text)).ok_or_else(|| {
            ContextError::OutsideContext {
                path: display.clone(),
                context: abs_context.clone(),
            }
        })?;
        append(&mut builder, file, &relative)?;
    }
    let gz = builder
        .into_inner()
        .map_err(ContextError::io("write the archive for", context))?;
    let mut counter = gz
        .finish()
        .map_err(ContextError::io("write the archive for", context))?;
    counter
        .flush()
        .map_err(ContextError::io("write the archive for", context))?;
    Ok(counter.count)
}

fn append<W: Write>(
    builder: &mut tar::Builder<W>,
    path: &Path,
    relative: &str,
) -> Result<(), ContextError> {
    let write_err = || ContextError::io("write the archive entry for", path);
    let meta =
        std::fs::symlink_metadata(path).map_err(ContextError::io("read the metadata of", path))?;
    let file_type = meta.file_type();
    let unsupported = |kind| ContextError::UnsupportedFileType {
        path: path.display().to_string(),
        kind,
    };
    if file_type.is_dir() {
        let mut header = header(&meta, tar::EntryType::Directory, 0);
        builder
            .append_data(&mut header, format!("{relative}/"), io::empty())
            .map_err(write_err())?;
    } else if file_type.is_symlink() {
        let target =
            std::fs::read_link(path).map_err(ContextError::io("read the symlink", path))?;
        let mut header = header(&meta, tar::EntryType::Symlink, 0);
        set_link_target(builder, &mut header, target.as_os_str().as_bytes()).map_err(write_err())?;
        builder
            .append_data(&mut header, relative, io::empty())
            .map_err(write_err())?;
    } else if file_type.is_file() {
        // The header comes from the opened file, so its size is the size of what is read.
        let file = open_regular(path)?;
        let meta = file
            .metadata()
            .map_err(ContextError::io("read the metadata of", path))?;
        let size = meta.size();
        let mut header = header(&meta, tar::EntryType::Regular, size);
        let mut reader = ExactReader {
            inner: file.take(size),
            remaining: size,
        };
        builder
            .append_data(&mut header, relative, &mut reader)
            .map_err(|e| {
                if e.kind() == io::ErrorKind::UnexpectedEof {
                    ContextError::ChangedWhileArchiving {
                        path: path.display().to_string(),
                    }
                } else {
                    write_err()(e)
                }
            })?;
    } else if file_type.is_fifo() {
        return Err(unsupported("fifo"));
    } else if file_type.is_socket() {
        return Err(unsupported("socket"));
    } else if file_type.is_char_device() {
        return Err(unsupported("character device"));
    } else if file_type.is_block_device() {
        return Err(unsupported("block device"));
    } else {
        return Err(unsupported("file of an unknown type"));
    }
    Ok(())
}

fn header(meta: &std::fs::Metadata, kind: tar::EntryType, size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(meta.mode() & 0o7777);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_size(size);
    header
}

/// Stores the target byte for byte: the tar crate's own setter rebuilds it from path
/// components, which turns `a//b` into `a/b` and drops `./` segments.
fn set_link_target<W: Write>(
    builder: &mut tar::Builder<W>,
    header: &mut tar::Header,
    target: &[u8],
) -> io::Result<()> {
    if target.contains(&0) {
        return Err(io::Error::other("a symlink target cannot hold a NUL byte"));
    }
    if target.len() > LINK_NAME_FIELD {
        let mut long = tar::Header::new_gnu();
        long.as_gnu_mut().expect("a GNU header").name[..GNU_LONG_LINK_NAME.len()]
            .copy_from_slice(GNU_LONG_LINK_NAME);
        long.set_entry_type(tar::EntryType::GNULongLink);
        long.set_mode(0o644);
        long.set_uid(0);
        long.set_gid(0);
        long.set_mtime(0);
        let mut data = target.to_vec();
        data.push(0);
        long.set_size(data.len() as u64);
        long.set_cksum();
        builder.append(&long, data.as_slice())?;
    }
    let field = &mut header.as_old_mut().linkname;
    let n = target.len().min(LINK_NAME_FIELD);
    field.fill(0);
    field[..n].copy_from_slice(&target[..n]);
    Ok(())
}

/// Opens a file the caller found to be regular, without following a symlink swapped in since
/// nor blocking on a fifo, and checks it still is one.
pub(super) fn open_regular(path: impl AsRef<Path>) -> Result<File, ContextError> {
    let path = path.as_ref();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(ContextError::io("open", path))?;
    let meta = file
        .metadata()
        .map_err(ContextError::io("read the metadata of", path))?;
    if !meta.file_type().is_file() {
        return Err(ContextError::ChangedWhileArchiving {
            path: path.display().to_string(),
        });
    }
    Ok(file)
}

/// Yields exactly `remaining` bytes or fails: the header already promised that many, and the
/// tar writer would otherwise pad a shrunk file into a corrupt archive without a word.
struct ExactReader<R> {
    inner: R,
    remaining: u64,
}

impl<R: Read> Read for ExactReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.remaining == 0 {
            return Ok(0);
        }
        let n = self.inner.read(buf)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the file shrank while it was read",
            ));
        }
        self.remaining -= n as u64;
        Ok(n)
    }
}

struct CountingWriter<W> {
    inner: W,
    count: u64,
}

impl<W: Write> Write for CountingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.count += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
