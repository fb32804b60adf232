//! The blob store in an object store (S3 and S3-compatible servers), for nodes that share no
//! filesystem: `<prefix>/sha256/<hex>` per blob, `<prefix>/tmp/<uuid>` while a large blob's
//! digest is not yet known, `<prefix>/quarantine/` for objects that did not match their name
//! (deleted by garbage collection once older than `STRATA_GC_KEEP`).
//!
//! * A blob that fits one part is published with one conditional put (`If-None-Match: *`):
//!   create-if-absent, so sixteen concurrent puts of one digest write one object.
//! * A larger blob streams into a multipart upload of a temporary object while the caller hashes
//!   it; once the digest is known, the temporary object is copied under it with a
//!   copy-if-not-exists and deleted. A sink dropped before it publishes aborts its multipart
//!   upload (and deletes a completed temporary object), so nothing is visible. A process that
//!   dies mid-upload leaves an incomplete multipart upload: the bucket's
//!   `AbortIncompleteMultipartUpload` lifecycle rule is what reclaims those (docs/adr/0017).
//! * Every read verifies the digest; [`BlobStore::intact_size`] moves a mismatched object to
//!   `quarantine/` so the next put of the same bytes repairs it, as the local store does.
//!
//! The rest of strata reads and writes blobs from blocking code (layer extraction, tar
//! writing), so this store runs its requests on a small runtime of its own and the blocking
//! side waits on channels: that works from any thread, inside an async runtime or not.
//! Credentials come from `object_store`'s standard `AWS_*` variables and are never printed:
//! [`BlobStore::describe`] shows only the bucket and prefix.

use std::collections::HashMap;
use std::future::Future;
use std::io::{self, Read, Write};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload, WriteMultipart};

use super::blob_store::{
    digest_of_name, BlobRead, BlobSink, BlobStore, StoredBlob, VerifyingReader,
};
use super::error::{Result, VmmError};
use crate::domain::ids::Digest;

/// Size of each multipart part, and the most a blob may have before its sink starts a
/// multipart upload (smaller blobs are one conditional put).
pub const PART_SIZE: usize = 8 << 20;

/// Parts in flight per upload: bounds the memory one upload holds to a few parts.
const PARTS_IN_FLIGHT: usize = 4;

/// Chunks buffered between a reader and the task that fetches them.
const READ_AHEAD_CHUNKS: usize = 32;

/// An [`ObjectStore`] as a [`BlobStore`].
#[derive(Clone)]
pub struct ObjectBlobStore {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    /// For logs: scheme, bucket and prefix only.
    described: String,
    runtime: BackgroundRuntime,
    /// Objects this process has read in full and found intact: digest hex → e-tag.
    verified: Mutex<HashMap<String, Option<String>>>,
}

impl ObjectBlobStore {
    /// Wraps `store`, keeping blobs under `prefix`. `described` names the store in logs and
    /// must hold no secret.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        described: String,
    ) -> Result<ObjectBlobStore> {
        Ok(ObjectBlobStore {
            inner: Arc::new(Inner {
                store,
                prefix: ObjectPath::from(prefix.trim_matches('/')),
                described,
                runtime: BackgroundRuntime::start()?,
                verified: Default::default(),
            }),
        })
    }

    /// `<prefix>/<dir>`.
    fn dir(&self, dir: &str) -> ObjectPath {
        let mut parts: Vec<_> = self.inner.prefix.parts().collect();
        parts.push(dir.into());
        ObjectPath::from_iter(parts)
    }

    fn key(&self, dir: &str, name: &str) -> ObjectPath {
        self.dir(dir).child(name)
    }

    /// The object a blob lives in (tests corrupt it through the raw store).
    pub fn key_of(&self, digest: &Digest) -> ObjectPath {
        self.key("sha256", &digest.hex())
    }

    /// `<prefix>/owner`: beside `sha256/`, so no listing of blobs meets it.
    pub fn owner_key(&self) -> ObjectPath {
        let mut parts: Vec<_> = self.inner.prefix.parts().collect();
        parts.push("owner".into());
        ObjectPath::from_iter(parts)
    }

    /// The object store underneath, for tests that inspect or damage objects directly.
    pub fn raw(&self) -> Arc<dyn ObjectStore> {
        self.inner.store.clone()
    }

    /// Where temporary objects live, relative to the store root.
    pub fn tmp_prefix(&self) -> ObjectPath {
        self.dir("tmp")
    }

    /// Where objects that failed verification are moved, relative to the store root, until
    /// garbage collection removes them ([`BlobStore::sweep_quarantine`]).
    pub fn quarantine_prefix(&self) -> ObjectPath {
        self.dir("quarantine")
    }

    fn run<F>(&self, fut: F) -> F::Output
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.inner.runtime.run(fut)
    }

    fn store_error(&self, what: impl std::fmt::Display, e: object_store::Error) -> VmmError {
        VmmError::ObjectStore {
            what: format!("{what} in {}", self.inner.described),
            source: Box::new(e),
        }
    }

    /// Moves a mismatched object aside, unless it was replaced since it was read (a concurrent
    /// put repaired it). Object stores have no conditional delete: a repair landing between the
    /// check and the delete is lost, and the next put of the blob makes it again.
    fn quarantine(&self, digest: &Digest, seen: Option<String>) -> Result<()> {
        let store = self.inner.store.clone();
        let key = self.key_of(digest);
        let aside = self.quarantine_prefix().child(format!(
            "{}-{}",
            digest.hex(),
            uuid::Uuid::new_v4().simple()
        ));
        let outcome = self.run(async move {
            match store.head(&key).await {
                Ok(meta) if meta.e_tag == seen => {}
                Ok(_) | Err(object_store::Error::NotFound { .. }) => return Ok(()),
                Err(e) => return Err(e),
            }
            store.copy(&key, &aside).await?;
            match store.delete(&key).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(e),
            }
        });
        outcome.map_err(|e| self.store_error(format!("quarantining torn blob {digest}"), e))?;
        tracing::warn!(%digest, store = %self.inner.described, "a stored blob did not match its digest; moved it to quarantine/, the next put of its content repairs it");
        Ok(())
    }

    /// Deletes every object under `dir` last modified before `before`; answers how many went.
    fn remove_older(
        &self,
        dir: ObjectPath,
        before: std::time::SystemTime,
    ) -> std::result::Result<usize, object_store::Error> {
        let store = self.inner.store.clone();
        let before: chrono::DateTime<chrono::Utc> = before.into();
        self.run(async move {
            let mut stale = Vec::new();
            let mut objects = store.list(Some(&dir));
            while let Some(meta) = objects.next().await {
                let meta = meta?;
                if meta.last_modified < before {
                    stale.push(meta.location);
                }
            }
            let mut removed = 0;
            for key in stale {
                match store.delete(&key).await {
                    Ok(()) => removed += 1,
                    Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(removed)
        })
    }
}

impl BlobStore for ObjectBlobStore {
    fn sink(&self) -> Result<Box<dyn BlobSink>> {
        let (tx, rx) = tokio::sync::mpsc::channel(PARTS_IN_FLIGHT * 4);
        let failure = Arc::new(Mutex::new(None));
        let task = UploadTask {
            store: self.inner.store.clone(),
            tmp: self.key("tmp", &uuid::Uuid::new_v4().simple().to_string()),
            final_dir: self.dir("sha256"),
            described: self.inner.described.clone(),
            failure: failure.clone(),
        };
        self.inner.runtime.spawn(task.run(rx));
        Ok(Box::new(ObjectSink {
            tx: Some(tx),
            failure,
            pending: Vec::new(),
        }))
    }

    fn open_verified(&self, digest: &Digest) -> Result<VerifyingReader<BlobRead>> {
        let store = self.inner.store.clone();
        let key = self.key_of(digest);
        let got = self.run(async move { store.get(&key).await });
        let got = match got {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(VmmError::BlobMissing {
                    digest: digest.to_string(),
                })
            }
            Err(e) => return Err(self.store_error(format!("reading blob {digest}"), e)),
        };
        let (tx, rx) = tokio::sync::mpsc::channel(READ_AHEAD_CHUNKS);
        let described = self.inner.described.clone();
        self.inner.runtime.spawn(async move {
            let mut stream = got.into_stream();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| {
                    io::Error::other(format!("reading an object from {described}: {e}"))
                });
                let stop = chunk.is_err();
                if tx.send(chunk).await.is_err() || stop {
                    return; // the reader was dropped, or this was the last word
                }
            }
        });
        let reader = ChannelReader {
            rx,
            current: Bytes::new(),
        };
        Ok(VerifyingReader::new(Box::new(reader), *digest))
    }

    fn size(&self, digest: &Digest) -> Result<Option<u64>> {
        let store = self.inner.store.clone();
        let key = self.key_of(digest);
        match self.run(async move { store.head(&key).await }) {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.store_error(format!("looking up blob {digest}"), e)),
        }
    }

    /// One HEAD when this process already read this version of the object in full; a full
    /// read and hash otherwise.
    fn intact_size(&self, digest: &Digest) -> Result<Option<u64>> {
        let store = self.inner.store.clone();
        let key = self.key_of(digest);
        let meta = match self.run(async move { store.head(&key).await }) {
            Ok(meta) => meta,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.store_error(format!("looking up blob {digest}"), e)),
        };
        let known = meta.e_tag.is_some()
            && self
                .inner
                .verified
                .lock()
                .expect("the verified-blob map is never poisoned")
                .get(&digest.hex())
                == Some(&meta.e_tag);
        if known {
            return Ok(Some(meta.size));
        }
        let checked = match self.open_verified(digest) {
            Ok(mut reader) => io::copy(&mut reader, &mut io::sink())
                .map_err(|e| super::blob_store::read_error(e, &format!("reading blob {digest}"))),
            Err(e) => Err(e),
        };
        match checked {
            Ok(n) => {
                self.inner
                    .verified
                    .lock()
                    .expect("the verified-blob map is never poisoned")
                    .insert(digest.hex(), meta.e_tag);
                Ok(Some(n))
            }
            Err(VmmError::BlobMissing { .. }) => Ok(None),
            Err(VmmError::DigestMismatch { .. }) => {
                self.quarantine(digest, meta.e_tag)?;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    fn describe(&self) -> String {
        self.inner.described.clone()
    }

    fn list(&self) -> Result<Vec<StoredBlob>> {
        let store = self.inner.store.clone();
        let dir = self.dir("sha256");
        let listed = self.run(async move {
            let mut out = Vec::new();
            let mut objects = store.list(Some(&dir));
            while let Some(meta) = objects.next().await {
                out.push(meta?);
            }
            Ok::<_, object_store::Error>(out)
        });
        let listed = listed.map_err(|e| self.store_error("listing blobs", e))?;
        Ok(listed
            .into_iter()
            .filter_map(|meta| {
                let digest = meta.location.filename().and_then(digest_of_name)?;
                Some(StoredBlob {
                    digest,
                    size: meta.size,
                    written_at: meta.last_modified.into(),
                })
            })
            .collect())
    }

    fn delete(&self, digest: &Digest) -> Result<()> {
        let store = self.inner.store.clone();
        let key = self.key_of(digest);
        match self.run(async move { store.delete(&key).await }) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(self.store_error(format!("deleting blob {digest}"), e)),
        }
        self.inner
            .verified
            .lock()
            .expect("the verified-blob map is never poisoned")
            .remove(&digest.hex());
        Ok(())
    }

    fn sweep_temporary(&self, before: std::time::SystemTime) -> Result<usize> {
        self.remove_older(self.tmp_prefix(), before)
            .map_err(|e| self.store_error("removing stale temporary objects", e))
    }

    /// An object's last-modified time is when it was copied to quarantine.
    fn sweep_quarantine(&self, before: std::time::SystemTime) -> Result<usize> {
        self.remove_older(self.quarantine_prefix(), before)
            .map_err(|e| self.store_error("removing quarantined objects past their retention", e))
    }

    fn as_object(&self) -> Option<&ObjectBlobStore> {
        Some(self)
    }

    fn owner_marker(&self) -> String {
        format!("{}/owner", self.inner.described.trim_end_matches('/'))
    }

    fn owner(&self) -> Result<Option<String>> {
        let store = self.inner.store.clone();
        let key = self.owner_key();
        let read = self.run(async move {
            match store.get(&key).await {
                Ok(got) => got.bytes().await.map(Some),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        });
        let read = read.map_err(|e| self.store_error("reading the owner marker", e))?;
        Ok(read.map(|b| String::from_utf8_lossy(&b).trim().to_owned()))
    }

    /// One conditional put (`If-None-Match: *`): exactly one claim creates the marker, every
    /// other one reads it. A store without conditional puts is looked at first, then written:
    /// two databases claiming such a store in the same instant could both believe they won,
    /// which the object stores strata supports (S3 and compatible servers) rule out.
    fn claim_owner(&self, owner: &str) -> Result<String> {
        let store = self.inner.store.clone();
        let key = self.owner_key();
        let body = Bytes::from(format!("{owner}\n"));
        let created = self.run(async move {
            let opts = PutOptions {
                mode: PutMode::Create,
                ..Default::default()
            };
            match store.put_opts(&key, body.clone().into(), opts).await {
                Ok(_) => Ok(true),
                Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
                Err(
                    object_store::Error::NotSupported { .. } | object_store::Error::NotImplemented,
                ) => match store.head(&key).await {
                    Ok(_) => Ok(false),
                    Err(object_store::Error::NotFound { .. }) => {
                        store.put(&key, body.into()).await.map(|_| true)
                    }
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            }
        });
        let created = created.map_err(|e| self.store_error("claiming the store", e))?;
        if created {
            return Ok(owner.to_owned());
        }
        self.owner()?.ok_or_else(|| {
            VmmError::io(format!("reading {}", self.owner_marker()))(io::Error::other(
                "the owner marker vanished while it was claimed",
            ))
        })
    }
}

/// What the blocking side of a sink sends to its upload task.
enum Upload {
    Chunk(Bytes),
    Publish(Digest, tokio::sync::oneshot::Sender<Result<()>>),
}

/// The blocking half of an upload: hands chunks to the task, which uploads them.
struct ObjectSink {
    tx: Option<tokio::sync::mpsc::Sender<Upload>>,
    failure: Arc<Mutex<Option<String>>>,
    /// Bytes written through `Write` (borrowed slices), gathered into chunks worth sending.
    pending: Vec<u8>,
}

/// Slices written through `Write` are gathered to this size before they are sent.
const GATHER: usize = 1 << 20;

impl ObjectSink {
    fn failed(&self) -> io::Error {
        let why = self
            .failure
            .lock()
            .expect("the upload failure slot is never poisoned")
            .clone()
            .unwrap_or_else(|| "the upload task stopped".to_owned());
        io::Error::other(why)
    }

    fn send(&mut self, message: Upload) -> io::Result<()> {
        let tx = self
            .tx
            .as_ref()
            .expect("a sink sends only before it publishes");
        // `futures`' executor, not tokio's: this may run on a thread of some other runtime.
        futures::executor::block_on(tx.send(message)).map_err(|_| self.failed())
    }

    fn send_pending(&mut self) -> io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::take(&mut self.pending));
        self.send(Upload::Chunk(chunk))
    }
}

impl Write for ObjectSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.pending.capacity() == 0 {
            self.pending.reserve_exact(GATHER);
        }
        let n = buf.len().min(GATHER - self.pending.len());
        self.pending.extend_from_slice(&buf[..n]);
        if self.pending.len() == GATHER {
            self.send_pending()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl BlobSink for ObjectSink {
    fn append(&mut self, chunk: Bytes) -> io::Result<()> {
        self.send_pending()?;
        self.send(Upload::Chunk(chunk))
    }

    fn publish(mut self: Box<Self>, digest: &Digest) -> Result<()> {
        let io_err = |e| VmmError::io(format!("uploading blob {digest}"))(e);
        self.send_pending().map_err(io_err)?;
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.send(Upload::Publish(*digest, reply)).map_err(io_err)?;
        self.tx = None;
        match futures::executor::block_on(answer) {
            Ok(outcome) => outcome,
            Err(_) => Err(io_err(self.failed())),
        }
    }
}

/// The async half of an upload: buffers the first part in memory, turns into a multipart upload
/// of a temporary object past it, and publishes or aborts.
struct UploadTask {
    store: Arc<dyn ObjectStore>,
    tmp: ObjectPath,
    final_dir: ObjectPath,
    described: String,
    failure: Arc<Mutex<Option<String>>>,
}

impl UploadTask {
    async fn run(self, mut rx: tokio::sync::mpsc::Receiver<Upload>) {
        let mut first: Vec<Bytes> = Vec::new();
        let mut first_len = 0usize;
        let mut multipart: Option<WriteMultipart> = None;
        let outcome: std::result::Result<(), object_store::Error> = async {
            while let Some(message) = rx.recv().await {
                match message {
                    Upload::Chunk(chunk) => match multipart.as_mut() {
                        Some(w) => {
                            w.wait_for_capacity(PARTS_IN_FLIGHT).await?;
                            w.put(chunk);
                        }
                        None => {
                            first_len += chunk.len();
                            first.push(chunk);
                            if first_len > PART_SIZE {
                                let upload = self.store.put_multipart(&self.tmp).await?;
                                let mut w = WriteMultipart::new_with_chunk_size(upload, PART_SIZE);
                                for chunk in first.drain(..) {
                                    w.put(chunk);
                                }
                                multipart = Some(w);
                            }
                        }
                    },
                    Upload::Publish(digest, reply) => {
                        let published = match multipart.take() {
                            None => self.put_whole(&digest, std::mem::take(&mut first)).await,
                            Some(w) => self.publish_multipart(&digest, w).await,
                        };
                        let _ = reply.send(published.map_err(|e| VmmError::ObjectStore {
                            what: format!("publishing blob {digest} in {}", self.described),
                            source: Box::new(e),
                        }));
                        return Ok(());
                    }
                }
            }
            // The sink was dropped unpublished: nothing may become visible.
            Ok(())
        }
        .await;
        if let Err(e) = &outcome {
            *self
                .failure
                .lock()
                .expect("the upload failure slot is never poisoned") =
                Some(format!("uploading to {}: {e}", self.described));
        }
        if let Some(w) = multipart {
            if let Err(e) = w.abort().await {
                tracing::warn!(store = %self.described, error = %e, "aborting an abandoned multipart upload failed; the bucket's lifecycle rule for incomplete uploads reclaims it");
            }
        }
    }

    fn final_key(&self, digest: &Digest) -> ObjectPath {
        self.final_dir.child(digest.hex())
    }

    /// One conditional put: create-if-absent. An object already under the name is the same
    /// content or torn; a torn one is quarantined by the next verified read, and then this
    /// put's successor repairs it.
    async fn put_whole(
        &self,
        digest: &Digest,
        chunks: Vec<Bytes>,
    ) -> std::result::Result<(), object_store::Error> {
        let payload = PutPayload::from_iter(chunks);
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match self
            .store
            .put_opts(&self.final_key(digest), payload, opts)
            .await
        {
            Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Completes the temporary object, copies it under its digest if absent, deletes it.
    async fn publish_multipart(
        &self,
        digest: &Digest,
        mut w: WriteMultipart,
    ) -> std::result::Result<(), object_store::Error> {
        if let Err(e) = w.wait_for_capacity(0).await {
            let _ = w.abort().await;
            return Err(e);
        }
        w.finish().await?; // aborts the upload itself when completing fails
        let dest = self.final_key(digest);
        let copied = match self.store.copy_if_not_exists(&self.tmp, &dest).await {
            Ok(()) | Err(object_store::Error::AlreadyExists { .. }) => Ok(()),
            // Stores without an atomic copy-if-absent: look, then copy. Two racing copies write
            // the same bytes, so the loser's overwrite changes nothing a reader can see.
            Err(object_store::Error::NotSupported { .. } | object_store::Error::NotImplemented) => {
                match self.store.head(&dest).await {
                    Ok(_) => Ok(()),
                    Err(object_store::Error::NotFound { .. }) => {
                        self.store.copy(&self.tmp, &dest).await
                    }
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        };
        let removed = self.store.delete(&self.tmp).await;
        copied?;
        if let Err(e) = removed {
            tracing::warn!(store = %self.described, error = %e, "removing a temporary upload object failed; it holds no published blob");
        }
        Ok(())
    }
}

/// Reads chunks a fetch task sends.
struct ChannelReader {
    rx: tokio::sync::mpsc::Receiver<io::Result<Bytes>>,
    current: Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match futures::executor::block_on(self.rx.recv()) {
                Some(chunk) => self.current = chunk?,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        let _ = self.current.split_to(n);
        Ok(n)
    }
}

/// A runtime of the store's own, shut down without waiting when the store goes (a runtime
/// dropped the ordinary way inside another runtime panics).
struct BackgroundRuntime {
    runtime: Option<tokio::runtime::Runtime>,
}

impl BackgroundRuntime {
    fn start() -> Result<BackgroundRuntime> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("strata-blobs")
            .enable_all()
            .build()
            .map_err(VmmError::io("starting the object store's runtime"))?;
        Ok(BackgroundRuntime {
            runtime: Some(runtime),
        })
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        self.runtime
            .as_ref()
            .expect("the runtime lives as long as the store")
            .handle()
    }

    fn spawn<F>(&self, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.handle().spawn(fut);
    }

    /// Runs `fut` on the store's runtime and waits for it from any thread.
    fn run<F>(&self, fut: F) -> F::Output
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let task = self.handle().spawn(fut);
        match futures::executor::block_on(task) {
            Ok(out) => out,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => panic!("an object store request was cancelled: {e}"),
        }
    }
}

impl Drop for BackgroundRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
