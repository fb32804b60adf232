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
    #[error("the upload sent nothing for {idle_secs} s after {received} bytes (STRATA_UPLOAD_IDLE_TIMEOUT_SECS); resend the whole archive")]
    Idle { idle_secs: u64, received: u64 },
    /// The upload's content could not be referenced before publishing (see `ingest_upload`).
    #[error("{0}")]
    Refused(String),
    /// The received bytes are not the ones this upload may publish (see `ingest_upload`).
    #[error("{0}")]
    Conflict(String),
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

/// What a body must be: exactly `declared` bytes (the request's `Content-Length`), at most
/// `ceiling` (the size signed into the upload URL), with no gap longer than `idle` between
/// chunks (a client that stops sending does not hold the upload's threads and claim forever).
#[derive(Clone, Copy, Debug)]
pub struct BodyLimits {
    pub declared: u64,
    pub ceiling: u64,
    pub idle: std::time::Duration,
}

/// Receives `body` into `blobs`, hashing as it goes, and publishes it under its digest.
///
/// A declared length over the ceiling is refused before a byte is read.
/// `before_publish` runs with the digest once the bytes are received and before they become
/// visible under it: the API references the object there (the Deleting barrier), so bytes it
/// publishes are never ones a garbage-collection pass is about to delete.
pub async fn ingest_upload<S, E, F, Fut>(
    body: S,
    limits: BodyLimits,
    blobs: Arc<dyn BlobStore>,
    before_publish: F,
) -> Result<IngestedUpload, IngestError>
where
    S: Stream<Item = Result<Bytes, E>>,
    E: std::fmt::Display,
    F: FnOnce(Digest) -> Fut,
    Fut: std::future::Future<Output = Result<(), IngestError>>,
{
    limits.check_declared()?;
    let described = blobs.describe();
    let store_error = |source| IngestError::Store {
        store: described.clone(),
        source,
    };
    let sink = tokio::task::spawn_blocking(move || blobs.sink())
        .await
        .map_err(|e| store_error(joined(e)))?
        .map_err(store_error)?;
    let (to_hasher, hasher_rx) = tokio::sync::mpsc::channel::<Vec<Bytes>>(CHANNEL_BATCHES);
    let (to_writer, writer_rx) = tokio::sync::mpsc::channel::<Vec<Bytes>>(CHANNEL_BATCHES);
    let hasher = tokio::task::spawn_blocking(move || hash(hasher_rx));
    let writer = tokio::task::spawn_blocking(move || write(sink, writer_rx));

    let read = read_body(body, limits, &[to_hasher, to_writer]).await;
    let digest = hasher.await.map_err(|e| store_error(joined(e)))?;
    let written = writer.await.map_err(|e| store_error(joined(e)))?;
    let read = read?;
    let sink = written.map_err(|e| store_error(VmmError::io("writing the upload")(e)))?;
    let Some(received) = read else {
        // A writer that stops early returns its error, reported above; this is a defect.
        return Err(store_error(VmmError::io("writing the upload")(
            std::io::Error::other("the writer stopped before the body ended"),
        )));
    };
    before_publish(digest).await?;
    tokio::task::spawn_blocking(move || sink.publish(&digest))
        .await
        .map_err(|e| store_error(joined(e)))?
        .map_err(store_error)?;
    Ok(IngestedUpload {
        digest,
        size: received,
    })
}

/// Reads `body` under `limits` and computes its digest, storing nothing: how a PUT to a URL
/// whose upload already completed is told apart from a replay of the same bytes.
pub async fn digest_body<S, E>(body: S, limits: BodyLimits) -> Result<IngestedUpload, IngestError>
where
    S: Stream<Item = Result<Bytes, E>>,
    E: std::fmt::Display,
{
    limits.check_declared()?;
    let (to_hasher, hasher_rx) = tokio::sync::mpsc::channel::<Vec<Bytes>>(CHANNEL_BATCHES);
    let hasher = tokio::task::spawn_blocking(move || hash(hasher_rx));
    let read = read_body(body, limits, &[to_hasher]).await;
    let digest = hasher.await.map_err(|e| IngestError::Body(e.to_string()))?;
    let Some(received) = read? else {
        return Err(IngestError::Body(
            "the hashing thread stopped before the body ended".into(),
        ));
    };
    Ok(IngestedUpload {
        digest,
        size: received,
    })
}

impl BodyLimits {
    fn check_declared(&self) -> Result<(), IngestError> {
        if self.declared > self.ceiling {
            return Err(IngestError::TooLarge {
                declared: self.declared,
                ceiling: self.ceiling,
            });
        }
        Ok(())
    }
}

fn joined(e: tokio::task::JoinError) -> VmmError {
    VmmError::io("an upload thread")(std::io::Error::other(e.to_string()))
}

/// Reads the body in batches to every one of `to` (closed when it returns), enforcing the
/// exact length and the idle limit; answers the bytes received, or `None` when a receiver went
/// away first (the writer stopped on an error, which its thread reports).
async fn read_body<S, E>(
    body: S,
    limits: BodyLimits,
    to: &[tokio::sync::mpsc::Sender<Vec<Bytes>>],
) -> Result<Option<u64>, IngestError>
where
    S: Stream<Item = Result<Bytes, E>>,
    E: std::fmt::Display,
{
    let mismatch = |received| IngestError::LengthMismatch {
        declared: limits.declared,
        received,
    };
    let mut received: u64 = 0;
    let mut batch = Vec::new();
    let mut batched = 0;
    futures::pin_mut!(body);
    loop {
        let next = tokio::time::timeout(limits.idle, body.next())
            .await
            .map_err(|_| IngestError::Idle {
                idle_secs: limits.idle.as_secs(),
                received,
            })?;
        let last = match next {
            Some(Err(e)) => return Err(IngestError::Body(e.to_string())),
            Some(Ok(chunk)) => {
                received += chunk.len() as u64;
                if received > limits.declared {
                    return Err(mismatch(received));
                }
                batched += chunk.len();
                batch.push(chunk);
                if batched < BATCH_BYTES {
                    continue;
                }
                false
            }
            None if received != limits.declared => return Err(mismatch(received)),
            None => true,
        };
        if !batch.is_empty() {
            let full = std::mem::take(&mut batch);
            batched = 0;
            for tx in to {
                if tx.send(full.clone()).await.is_err() {
                    return Ok(None);
                }
            }
        }
        if last {
            return Ok(Some(received));
        }
    }
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

    fn limits(declared: u64, ceiling: u64) -> BodyLimits {
        BodyLimits {
            declared,
            ceiling,
            idle: std::time::Duration::from_secs(30),
        }
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
            limits(11, 100),
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
        let err = ingest_upload(chunks(&[b"x"]), limits(101, 100), blobs, no_hook)
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
        let err = ingest_upload(chunks(&[b"abc", b"def"]), limits(4, 100), blobs, no_hook)
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
        let err = ingest_upload(chunks(&[b"abc"]), limits(10, 100), blobs, no_hook)
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
        let err = ingest_upload(body, limits(10, 100), blobs, no_hook)
            .await
            .unwrap_err();
        assert!(matches!(err, IngestError::Body(ref m) if m.contains("connection reset")));
        nothing_kept(dir.path());
    }

    /// A client that sends part of its body and then nothing: the upload ends after the idle
    /// limit, saying so, and keeps nothing. (The pause is a stream that never yields: the
    /// fault of a stalled client, which a real socket could only show by waiting.)
    #[tokio::test]
    async fn a_body_that_stalls_ends_at_the_idle_limit_and_nothing_kept() {
        let (dir, blobs) = store();
        let body = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from_static(b"abc"))])
            .chain(futures::stream::pending());
        let limits = BodyLimits {
            idle: std::time::Duration::from_millis(200),
            ..limits(10, 100)
        };
        let err = ingest_upload(body, limits, blobs, no_hook)
            .await
            .unwrap_err();
        assert!(
            matches!(err, IngestError::Idle { received: 3, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("STRATA_UPLOAD_IDLE_TIMEOUT_SECS"));
        nothing_kept(dir.path());
    }

    #[tokio::test]
    async fn a_digest_of_a_body_reads_it_under_the_same_limits_and_stores_nothing() {
        let got = digest_body(chunks(&[b"hello ", b"world"]), limits(11, 100))
            .await
            .unwrap();
        assert_eq!(
            got.digest.hex(),
            "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9"
        );
        assert!(matches!(
            digest_body(chunks(&[b"hello"]), limits(11, 100)).await,
            Err(IngestError::LengthMismatch {
                declared: 11,
                received: 5
            })
        ));
        assert!(matches!(
            digest_body(chunks(&[b"x"]), limits(101, 100)).await,
            Err(IngestError::TooLarge { .. })
        ));
    }
}
