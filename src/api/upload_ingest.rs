//! Streaming an upload body into the blob store while the server computes its digest.
//!
//! The client's `filesHash` is only a name; what a build consumes is identified by the sha256
//! the server computes here, over exactly the bytes it stored. The body is never trusted for
//! its length either: it must match the declared `Content-Length` exactly and stay under the
//! ceiling the signed URL granted, or nothing is kept.
//!
//! Each chunk goes to two threads: one hashes, one writes to the store's sink (a temporary file
//! in the local store, one `writev` per batch; a multipart upload in an object store). Chunks are
//! `Bytes`, shared by reference count: neither thread copies them. The sink is published under the digest only
//! once both have finished and the length is right; any failure drops it unpublished, which
//! removes what it held (the temporary file, the multipart upload).

use std::sync::Arc;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use sha2::{Digest as _, Sha256};
use thiserror::Error;

use crate::domain::ids::Digest;
use crate::vmm::{BlobSink, BlobStore, VmmError};

#[derive(Debug, Error)]
pub enum IngestError {
    #[error("upload of {declared} bytes exceeds the {ceiling}-byte limit of this upload URL; request a new link or split the context")]
    TooLarge { declared: u64, ceiling: u64 },
    #[error("upload body has {received} bytes but Content-Length declared {declared}; resend the whole archive")]
    LengthMismatch { declared: u64, received: u64 },
    #[error("reading the upload body failed: {0}")]
    Body(String),
    /// The upload's content could not be referenced before publishing (see `ingest_upload`).
    #[error("{0}")]
    Refused(String),
    #[error("storing the upload in {store} failed: {source}")]
    Store {
        store: String,
        #[source]
        source: VmmError,
    },
}

/// An upload received, hashed and published in the blob store.
#[derive(Debug)]
pub struct IngestedUpload {
    /// The sha256 of the bytes stored, computed by the server as they arrived.
    pub digest: Digest,
    pub size: u64,
}

/// Chunks are handed to the threads in batches of about this many bytes: hyper's chunks are
/// often a few KiB, and waking two threads per chunk costs more than hashing it. A batch is a
/// list of the same `Bytes`, not a copy.
const BATCH_BYTES: usize = 1 << 20;

/// Batches in flight between the body reader and each of the hashing and writing threads: a few
/// MiB per upload, on top of what the store's sink holds (a few parts for an object store).
const CHANNEL_BATCHES: usize = 8;

/// Receives `body` into `blobs`, hashing as it goes, and publishes it under its digest.
///
/// `declared` is the request's `Content-Length`; `ceiling` is the size limit signed into the
/// upload URL. A declared length over the ceiling is refused before a byte is read.
/// `before_publish` runs with the digest once the bytes are received and before they become
/// visible under it: the API references the object there (the Deleting barrier), so bytes it
/// publishes are never ones a garbage-collection pass is about to delete.
pub async fn ingest_upload<S, E, F, Fut>(
    body: S,
    declared: u64,
    ceiling: u64,
    blobs: Arc<dyn BlobStore>,
    before_publish: F,
) -> Result<IngestedUpload, IngestError>
where
    S: Stream<Item = Result<Bytes, E>>,
    E: std::fmt::Display,
    F: FnOnce(Digest) -> Fut,
    Fut: std::future::Future<Output = Result<(), IngestError>>,
{
    if declared > ceiling {
        return Err(IngestError::TooLarge { declared, ceiling });
    }
    let described = blobs.describe();
    let store_error = |source| IngestError::Store {
        store: described.clone(),
        source,
    };
    let joined = |e: tokio::task::JoinError| {
        store_error(VmmError::io("an upload thread")(std::io::Error::other(
            e.to_string(),
        )))
    };
    let sink = tokio::task::spawn_blocking(move || blobs.sink())
        .await
        .map_err(joined)?
        .map_err(store_error)?;
    let (to_hasher, hasher_rx) = tokio::sync::mpsc::channel::<Vec<Bytes>>(CHANNEL_BATCHES);
    let (to_writer, writer_rx) = tokio::sync::mpsc::channel::<Vec<Bytes>>(CHANNEL_BATCHES);
    let hasher = tokio::task::spawn_blocking(move || hash(hasher_rx));
    let writer = tokio::task::spawn_blocking(move || write(sink, writer_rx));

    let mut received: u64 = 0;
    let mut outcome = Ok(());
    let mut batch = Vec::new();
    let mut batched = 0;
    futures::pin_mut!(body);
    loop {
        let chunk = match body.next().await {
            Some(Ok(chunk)) => Some(chunk),
            Some(Err(e)) => {
                outcome = Err(IngestError::Body(e.to_string()));
                break;
            }
            None => None,
        };
        let last = chunk.is_none();
        if let Some(chunk) = chunk {
            received += chunk.len() as u64;
            if received > declared {
                outcome = Err(IngestError::LengthMismatch { declared, received });
                break;
            }
            batched += chunk.len();
            batch.push(chunk);
        }
        if batch.is_empty() || (batched < BATCH_BYTES && !last) {
            if last {
                break;
            }
            continue;
        }
        let full = std::mem::take(&mut batch);
        batched = 0;
        if to_hasher.send(full.clone()).await.is_err() || to_writer.send(full).await.is_err() {
            break; // the writer stopped on an error; it is reported below
        }
        if last {
            break;
        }
    }
    drop((to_hasher, to_writer));
    let digest = hasher.await.map_err(joined)?;
    let written = writer.await.map_err(joined)?;
    outcome?;
    let sink = written.map_err(|e| store_error(VmmError::io("writing the upload")(e)))?;
    if received != declared {
        return Err(IngestError::LengthMismatch { declared, received });
    }
    before_publish(digest).await?;
    tokio::task::spawn_blocking(move || sink.publish(&digest))
        .await
        .map_err(joined)?
        .map_err(store_error)?;
    Ok(IngestedUpload {
        digest,
        size: received,
    })
}

/// The hashing thread: hashes every chunk until the channel closes; returns their digest.
fn hash(mut rx: tokio::sync::mpsc::Receiver<Vec<Bytes>>) -> Digest {
    let mut hasher = Sha256::new();
    while let Some(batch) = rx.blocking_recv() {
        for chunk in &batch {
            hasher.update(chunk);
        }
    }
    Digest::from_hasher(hasher)
}

/// The writing thread: appends every chunk to the sink until the channel closes. On error the
/// sink is dropped here, unpublished, and the receiver with it, which stops the body reader.
fn write(
    mut sink: Box<dyn BlobSink>,
    mut rx: tokio::sync::mpsc::Receiver<Vec<Bytes>>,
) -> std::io::Result<Box<dyn BlobSink>> {
    while let Some(batch) = rx.blocking_recv() {
        sink.append_all(batch)?;
    }
    Ok(sink)
}

#[cfg(test)]
mod tests {
    /// No reference before publishing: these tests are about the bytes.
    fn no_hook(_: Digest) -> std::future::Ready<Result<(), IngestError>> {
        std::future::ready(Ok(()))
    }

    use super::*;
    use crate::vmm::LocalBlobStore;
    use std::path::Path;

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

    fn store() -> (tempfile::TempDir, Arc<dyn BlobStore>) {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(LocalBlobStore::open(dir.path()).unwrap());
        (dir, store)
    }

    /// Nothing published and nothing left in the staging area.
    fn nothing_kept(dir: &Path) {
        assert_eq!(files_in(&dir.join("sha256")), 0, "nothing published");
        assert_eq!(
            files_in(&dir.join("tmp")),
            0,
            "the temporary object was removed"
        );
    }

    #[tokio::test]
    async fn stores_exact_bytes_under_their_digest() {
        let (dir, blobs) = store();
        let ingested = ingest_upload(
            chunks(&[b"hello ", b"world"]),
            11,
            100,
            blobs.clone(),
            no_hook,
        )
        .await
        .unwrap();
        assert_eq!(ingested.size, 11);
        assert_eq!(
            ingested.digest.hex(),
            "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9"
        );
        assert_eq!(blobs.verify(&ingested.digest).unwrap(), 11);
        assert_eq!(files_in(&dir.path().join("tmp")), 0);
    }

    #[tokio::test]
    async fn refuses_declared_length_over_ceiling_before_reading() {
        let (dir, blobs) = store();
        let err = ingest_upload(chunks(&[b"x"]), 101, 100, blobs, no_hook)
            .await
            .unwrap_err();
        assert!(matches!(
            err,
            IngestError::TooLarge {
                declared: 101,
                ceiling: 100
            }
        ));
        nothing_kept(dir.path());
    }

    #[tokio::test]
    async fn body_longer_than_declared_is_rejected_and_nothing_kept() {
        let (dir, blobs) = store();
        let err = ingest_upload(chunks(&[b"abc", b"def"]), 4, 100, blobs, no_hook)
            .await
            .unwrap_err();
        assert!(matches!(
            err,
            IngestError::LengthMismatch {
                declared: 4,
                received: 6
            }
        ));
        nothing_kept(dir.path());
    }

    #[tokio::test]
    async fn body_shorter_than_declared_is_rejected_and_nothing_kept() {
        let (dir, blobs) = store();
        let err = ingest_upload(chunks(&[b"abc"]), 10, 100, blobs, no_hook)
            .await
            .unwrap_err();
        assert!(matches!(
            err,
            IngestError::LengthMismatch {
                declared: 10,
                received: 3
            }
        ));
        nothing_kept(dir.path());
    }

    #[tokio::test]
    async fn a_broken_body_stream_is_an_error_and_nothing_kept() {
        let (dir, blobs) = store();
        let body = futures::stream::iter(vec![
            Ok(Bytes::from_static(b"abc")),
            Err(std::io::Error::other("connection reset")),
        ]);
        let err = ingest_upload(body, 10, 100, blobs, no_hook)
            .await
            .unwrap_err();
        assert!(matches!(err, IngestError::Body(ref m) if m.contains("connection reset")));
        nothing_kept(dir.path());
    }
}
