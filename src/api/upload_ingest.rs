//! Streaming an upload body to a temporary object while the server computes its digest.
//!
//! The client's `filesHash` is only a name; what a build consumes is identified by the sha256
//! the server computes here, over exactly the bytes it stored. The body is never trusted for
//! its length either: it must match the declared `Content-Length` exactly and stay under the
//! ceiling the signed URL granted, or nothing is kept.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures::{Stream, StreamExt};
use sha2::{Digest, Sha256};
use std::io::Write;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum IngestError {
    #[error("upload of {declared} bytes exceeds the {ceiling}-byte limit of this upload URL; request a new link or split the context")]
    TooLarge { declared: u64, ceiling: u64 },
    #[error("upload body has {received} bytes but Content-Length declared {declared}; resend the whole archive")]
    LengthMismatch { declared: u64, received: u64 },
    #[error("reading the upload body failed: {0}")]
    Body(String),
    #[error("writing the upload to {path} failed: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// An upload fully received and hashed, waiting to be published. The temporary file is
/// removed when this is dropped unless it was moved away first.
#[derive(Debug)]
pub struct StagedUpload {
    pub file: tempfile::TempPath,
    /// Lowercase hex sha256 of the bytes in `file`.
    pub digest: String,
    pub size: u64,
}

/// Chunks in flight between the body reader and the writer thread (hyper's chunks are up to a
/// few hundred KiB, so this bounds buffered memory to a few MiB per upload).
const CHANNEL_CHUNKS: usize = 16;

/// The writer asks the kernel to start writeback after this many new bytes, so the final
/// fsync finds little left to do and the disk works while the network is still receiving.
const WRITEBACK_EVERY: u64 = 8 << 20;

/// Receives `body` into a new temporary file in `tmp_dir`, hashing as it goes.
///
/// `declared` is the request's `Content-Length`; `ceiling` is the size limit signed into the
/// upload URL. A declared length over the ceiling is refused before a byte is read.
///
/// Hashing and writing run on a blocking thread fed by a bounded channel, so the executor only
/// moves chunks (no copy: `Bytes` is shared) and receiving overlaps hashing and disk writes.
pub async fn stage_upload<S, E>(
    body: S,
    declared: u64,
    ceiling: u64,
    tmp_dir: &Path,
) -> Result<StagedUpload, IngestError>
where
    S: Stream<Item = Result<Bytes, E>>,
    E: std::fmt::Display,
{
    if declared > ceiling {
        return Err(IngestError::TooLarge { declared, ceiling });
    }
    let io = |source| IngestError::Io {
        path: tmp_dir.to_path_buf(),
        source,
    };
    let named = tempfile::Builder::new()
        .prefix("upload-")
        .tempfile_in(tmp_dir)
        .map_err(io)?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(CHANNEL_CHUNKS);
    let writer = tokio::task::spawn_blocking(move || write_and_hash(named, rx));

    let mut received: u64 = 0;
    let mut outcome = Ok(());
    futures::pin_mut!(body);
    while let Some(chunk) = body.next().await {
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(e) => {
                outcome = Err(IngestError::Body(e.to_string()));
                break;
            }
        };
        received += chunk.len() as u64;
        if received > declared {
            outcome = Err(IngestError::LengthMismatch { declared, received });
            break;
        }
        if tx.send(chunk).await.is_err() {
            break; // the writer stopped on an error; it is reported below
        }
    }
    drop(tx);
    let written = writer
        .await
        .map_err(|e| io(std::io::Error::other(e.to_string())))?;
    outcome?;
    let (file, path, digest) = written.map_err(io)?;
    if received != declared {
        return Err(IngestError::LengthMismatch { declared, received });
    }
    tokio::task::spawn_blocking(move || file.sync_data())
        .await
        .map_err(|e| io(std::io::Error::other(e.to_string())))?
        .map_err(io)?;
    Ok(StagedUpload {
        file: path,
        digest,
        size: received,
    })
}

/// The writer thread: hashes and writes every chunk until the channel closes; returns the file
/// (not yet synced), its path and the hex digest. Dropping the path on error removes the file.
fn write_and_hash(
    named: tempfile::NamedTempFile,
    mut rx: tokio::sync::mpsc::Receiver<Bytes>,
) -> std::io::Result<(std::fs::File, tempfile::TempPath, String)> {
    let (mut file, path) = named.into_parts();
    let mut hasher = Sha256::new();
    let (mut written, mut flushed) = (0u64, 0u64);
    while let Some(chunk) = rx.blocking_recv() {
        hasher.update(&chunk);
        file.write_all(&chunk)?;
        written += chunk.len() as u64;
        if written - flushed >= WRITEBACK_EVERY {
            start_writeback(&file, flushed, written - flushed);
            flushed = written;
        }
    }
    Ok((file, path, hex::encode(hasher.finalize())))
}

/// Starts (does not wait for) writeback of a written range. Only a hint: the fsync at the end
/// is what makes the upload durable, so a failure here is ignored.
fn start_writeback(file: &std::fs::File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: sync_file_range only reads its integer arguments; the fd is open for the call.
    unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            offset as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(parts: &[&'static [u8]]) -> impl Stream<Item = Result<Bytes, std::io::Error>> {
        futures::stream::iter(
            parts
                .iter()
                .map(|p| Ok(Bytes::from_static(p)))
                .collect::<Vec<_>>(),
        )
    }

    fn files_in(dir: &Path) -> usize {
        std::fs::read_dir(dir).unwrap().count()
    }

    #[tokio::test]
    async fn stages_exact_bytes_with_their_digest() {
        let dir = tempfile::tempdir().unwrap();
        let staged = stage_upload(chunks(&[b"hello ", b"world"]), 11, 100, dir.path())
            .await
            .unwrap();
        assert_eq!(staged.size, 11);
        assert_eq!(std::fs::read(&staged.file).unwrap(), b"hello world");
        assert_eq!(
            staged.digest,
            "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9"
        );
    }

    #[tokio::test]
    async fn refuses_declared_length_over_ceiling_before_reading() {
        let dir = tempfile::tempdir().unwrap();
        let err = stage_upload(chunks(&[b"x"]), 101, 100, dir.path())
            .await
            .unwrap_err();
        assert!(matches!(
            err,
            IngestError::TooLarge {
                declared: 101,
                ceiling: 100
            }
        ));
        assert_eq!(files_in(dir.path()), 0);
    }

    #[tokio::test]
    async fn body_longer_than_declared_is_rejected_and_nothing_kept() {
        let dir = tempfile::tempdir().unwrap();
        let err = stage_upload(chunks(&[b"abc", b"def"]), 4, 100, dir.path())
            .await
            .unwrap_err();
        assert!(matches!(
            err,
            IngestError::LengthMismatch {
                declared: 4,
                received: 6
            }
        ));
        assert_eq!(files_in(dir.path()), 0, "the temporary object was removed");
    }

    #[tokio::test]
    async fn body_shorter_than_declared_is_rejected_and_nothing_kept() {
        let dir = tempfile::tempdir().unwrap();
        let err = stage_upload(chunks(&[b"abc"]), 10, 100, dir.path())
            .await
            .unwrap_err();
        assert!(matches!(
            err,
            IngestError::LengthMismatch {
                declared: 10,
                received: 3
            }
        ));
        assert_eq!(files_in(dir.path()), 0);
    }

    #[tokio::test]
    async fn a_broken_body_stream_is_an_error_and_nothing_kept() {
        let dir = tempfile::tempdir().unwrap();
        let body = futures::stream::iter(vec![
            Ok(Bytes::from_static(b"abc")),
            Err(std::io::Error::other("connection reset")),
        ]);
        let err = stage_upload(body, 10, 100, dir.path()).await.unwrap_err();
        assert!(matches!(err, IngestError::Body(ref m) if m.contains("connection reset")));
        assert_eq!(files_in(dir.path()), 0);
    }
}
