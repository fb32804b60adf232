//! Content-addressed blob storage: layers, image manifests, license notices and uploaded
//! contexts, named by the sha256 of their bytes.
//!
//! [`BlobStore`] is a trait because a node-local directory is one implementation and an object
//! store (S3 and compatible servers, [`super::object_blob_store`]) is the other; `STRATA_BLOB_URL`
//! picks one ([`super::blob_url`]). Bytes go in through a [`BlobSink`], which knows nothing of
//! the digest until the caller, having hashed exactly what it wrote, publishes them under it.
//! [`LocalBlobStore`] keeps `blobs/sha256/<hex>`; every write goes to a
//! temporary file, is fsynced, and is published with `rename(2)` followed by an fsync of the
//! directory, so a reader never sees a partial blob and a published blob survives a host crash.
//!
//! A name that exists is not proof of its content (RFC: a digest-mismatched object is absent and
//! repairable, never permanently present). A put of bytes whose digest is already stored
//! therefore replaces the stored file instead of trusting it: the new copy is known good (it was
//! hashed as it was written), and replacing costs a rename where checking would cost a read of
//! the whole old file. Readers that decide on presence ([`BlobStore::intact_size`]) verify the
//! digest, once per file identity per process, and move a mismatched file to `quarantine/`.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use sha2::{Digest as _, Sha256};

use super::error::{Result, VmmError};
use crate::domain::ids::Digest;

/// A blob's bytes as read from a store, before verification.
pub type BlobRead = Box<dyn Read + Send>;

/// Where a blob's bytes go while its digest is not yet known. Nothing is visible under any
/// digest until [`publish`](BlobSink::publish); dropping a sink unpublished discards what it
/// received (a temporary file is removed, a multipart upload is aborted).
pub trait BlobSink: Write + Send {
    /// Appends a chunk the caller already owns (no copy where the backend can keep it).
    fn append(&mut self, chunk: Bytes) -> io::Result<()> {
        self.write_all(&chunk)
    }
    /// Appends chunks in order; a backend may hand them to the system in one call.
    fn append_all(&mut self, chunks: Vec<Bytes>) -> io::Result<()> {
        chunks.into_iter().try_for_each(|chunk| self.append(chunk))
    }
    /// Makes the received bytes durable and visible under `digest`, which the caller computed
    /// over exactly those bytes. Create-if-absent: a blob already stored under the digest is the
    /// same content, or torn and then found and removed by the next verified read.
    fn publish(self: Box<Self>, digest: &Digest) -> Result<()>;
}

/// Where immutable blobs live. Implementations must make `put` atomic and idempotent.
pub trait BlobStore: Send + Sync {
    /// Where to stream a blob whose digest the caller computes (uploads hash on their own
    /// thread); most callers want [`writer`](Self::writer), which hashes for them.
    fn sink(&self) -> Result<Box<dyn BlobSink>>;
    /// A writer that hashes as it goes; `commit` publishes the blob under its digest.
    fn writer(&self) -> Result<BlobWriter> {
        Ok(BlobWriter::new(self.sink()?))
    }
    /// Opens a blob for reading, verifying its digest when the reader reaches the end.
    fn open_verified(&self, digest: &Digest) -> Result<VerifyingReader<BlobRead>>;
    /// Where the blobs are, for logs and errors: never credentials or signed URLs.
    fn describe(&self) -> String;
    /// The node-local store behind this one, when it is one (tests tear its files).
    fn as_local(&self) -> Option<&LocalBlobStore> {
        None
    }
    /// The object store behind this one, when it is one (tests inspect its objects).
    fn as_object(&self) -> Option<&super::object_blob_store::ObjectBlobStore> {
        None
    }
    /// Size in bytes, or `None` when absent. Says nothing about the content: decisions that
    /// trust the blob use [`intact_size`](Self::intact_size).
    fn size(&self, digest: &Digest) -> Result<Option<u64>>;
    /// Size in bytes when the blob is present and its content matches its digest; `None` when it
    /// is absent or torn. A torn blob is removed from the store (it is absent from then on, and
    /// the next put of the same bytes repairs it).
    fn intact_size(&self, digest: &Digest) -> Result<Option<u64>> {
        match self.verify(digest) {
            Ok(n) => Ok(Some(n)),
            Err(VmmError::BlobMissing { .. } | VmmError::DigestMismatch { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
    /// Re-reads the whole blob and checks its digest.
    fn verify(&self, digest: &Digest) -> Result<u64> {
        let mut reader = self.open_verified(digest)?;
        let n = io::copy(&mut reader, &mut io::sink())
            .map_err(|e| read_error(e, &format!("reading blob {digest}")))?;
        reader.finish()?;
        Ok(n)
    }
    /// Every blob stored under a digest, with its size and when it was written: what a
    /// garbage-collection pass weighs. Names that are not digests are left out.
    fn list(&self) -> Result<Vec<StoredBlob>>;
    /// Removes the blob. Absent is success: a concurrent pass may have removed it already.
    fn delete(&self, digest: &Digest) -> Result<()>;
    /// Removes temporary files or objects written before `before` by writers that never
    /// published (a crashed process); answers how many went.
    fn sweep_temporary(&self, before: std::time::SystemTime) -> Result<usize>;
    /// Removes blobs moved to quarantine (they failed verification) before `before`: kept
    /// until then as evidence for an operator, then deleted by garbage collection. Answers how
    /// many went.
    fn sweep_quarantine(&self, before: std::time::SystemTime) -> Result<usize>;
    /// Where the owner marker is (a path or an object URL, never credentials): what an operator
    /// removes to hand the store to another database.
    fn owner_marker(&self) -> String;
    /// The identity recorded as this store's owner: the one database whose references decide
    /// what garbage collection deletes here (docs/adr/0019). `None` when no database has
    /// claimed it. The marker is not a blob: [`list`](Self::list) never shows it.
    fn owner(&self) -> Result<Option<String>>;
    /// Records `owner` as the store's owner unless one is recorded already (create-if-absent,
    /// durable), and answers the owner recorded after the call: `owner` itself, or whoever
    /// claimed the store first. Two claims of the same identity at once both answer it.
    fn claim_owner(&self, owner: &str) -> Result<String>;
    /// Stores a byte slice.
    fn put_bytes(&self, bytes: &[u8]) -> Result<(Digest, u64)> {
        let mut w = self.writer()?;
        w.write_all(bytes).map_err(VmmError::io("writing blob"))?;
        w.commit()
    }
}

/// One blob as a listing sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBlob {
    pub digest: Digest,
    pub size: u64,
    pub written_at: std::time::SystemTime,
}

/// What identifies one version of a file without reading it. A file whose identity is unchanged
/// since it was verified (or written) by this process has unchanged content: any write changes
/// its mtime and ctime, a replacement changes its inode. A host crash ends the process, so every
/// blob is verified again by the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileIdentity {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl FileIdentity {
    fn of(meta: &std::fs::Metadata) -> FileIdentity {
        FileIdentity {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.len(),
            mtime_ns: meta.mtime() as i128 * 1_000_000_000 + meta.mtime_nsec() as i128,
            ctime_ns: meta.ctime() as i128 * 1_000_000_000 + meta.ctime_nsec() as i128,
        }
    }
}

/// Blobs this process knows to be intact, by digest hex.
type Verified = Arc<Mutex<HashMap<String, FileIdentity>>>;

/// The node-local implementation: `<root>/sha256/<hex>`, temporary files in `<root>/tmp`, torn
/// blobs moved aside to `<root>/quarantine`.
#[derive(Debug, Clone)]
pub struct LocalBlobStore {
    root: PathBuf,
    verified: Verified,
}

impl LocalBlobStore {
    pub fn open(root: impl Into<PathBuf>) -> Result<LocalBlobStore> {
        let root = root.into();
        for dir in [root.join("sha256"), root.join("tmp")] {
            std::fs::create_dir_all(&dir)
                .map_err(VmmError::io(format!("creating {}", dir.display())))?;
        }
        Ok(LocalBlobStore {
            root,
            verified: Default::default(),
        })
    }

    /// `<root>/owner`: beside `sha256/`, so no listing of blobs meets it.
    pub fn owner_path(&self) -> PathBuf {
        self.root.join("owner")
    }

    /// `<root>/quarantine`: blobs that failed verification, until garbage collection removes
    /// them ([`BlobStore::sweep_quarantine`]).
    pub fn quarantine_dir(&self) -> PathBuf {
        self.root.join("quarantine")
    }

    pub fn path_of(&self, digest: &Digest) -> PathBuf {
        self.root.join("sha256").join(digest.hex())
    }

    /// Where callers stage files they will [`adopt`](Self::adopt): on the store's filesystem,
    /// so adoption is a link, not a copy.
    pub fn staging_dir(&self) -> PathBuf {
        self.root.join("tmp")
    }

    /// Publishes a staged file under `digest`, which the caller computed over exactly the file's
    /// bytes while writing it and has already fsynced. The staged name is consumed. A stored
    /// copy of the digest is replaced, not trusted: it may be torn, and ours is known good.
    pub fn adopt(&self, staged: &Path, digest: &Digest) -> Result<()> {
        publish(&self.root, &self.verified, staged, digest)
    }

    /// Moves a torn blob out of the store, unless the name was replaced since `seen` was read
    /// (a concurrent put repaired it).
    fn quarantine(&self, digest: &Digest, seen: FileIdentity) -> Result<()> {
        let path = self.path_of(digest);
        match std::fs::symlink_metadata(&path) {
            Ok(m) if FileIdentity::of(&m) == seen => {}
            _ => return Ok(()),
        }
        let dir = self.quarantine_dir();
        std::fs::create_dir_all(&dir)
            .map_err(VmmError::io(format!("creating {}", dir.display())))?;
        let aside = dir.join(format!(
            "{}-{}",
            digest.hex(),
            uuid::Uuid::new_v4().simple()
        ));
        match std::fs::rename(&path, &aside) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(VmmError::io(format!("quarantining torn blob {digest}"))(e)),
        }
        sync_dir(&self.root.join("sha256"))?;
        tracing::warn!(%digest, quarantined = %aside.display(), "a stored blob did not match its digest; moved it aside, the next put of its content repairs it");
        Ok(())
    }
}

/// Makes the blob at `tmp` (fsynced by the caller) visible as `digest`, durably: rename over
/// whatever is stored under that name, then fsync the directory so the name survives a crash.
fn publish(root: &Path, verified: &Verified, tmp: &Path, digest: &Digest) -> Result<()> {
    let dir = root.join("sha256");
    let dest = dir.join(digest.hex());
    std::fs::rename(tmp, &dest).map_err(VmmError::io(format!("publishing blob {digest}")))?;
    sync_dir(&dir)?;
    if let Ok(meta) = std::fs::metadata(&dest) {
        remember(verified, digest, FileIdentity::of(&meta));
    }
    Ok(())
}

fn remember(verified: &Verified, digest: &Digest, identity: FileIdentity) {
    verified
        .lock()
        .expect("the verified-blob map is never poisoned")
        .insert(digest.hex(), identity);
}

/// The digest a stored name spells (`<hex>`), if it is one.
pub(super) fn digest_of_name(name: &str) -> Option<Digest> {
    Digest::from_hex(name).ok()
}

/// fsyncs a directory, so the names created, renamed or removed in it survive a crash.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(VmmError::io(format!("syncing directory {}", dir.display())))
}

/// Removes the files in `dir` whose time (`stamp` of their metadata) is before `before`;
/// answers how many went. A missing directory holds nothing; a file gone meanwhile is skipped.
fn remove_files_older(
    dir: &Path,
    before: std::time::SystemTime,
    stamp: impl Fn(&std::fs::Metadata) -> std::time::SystemTime,
) -> Result<usize> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(VmmError::io(format!("listing {}", dir.display()))(e)),
    };
    let mut removed = 0;
    for entry in entries {
        let entry = entry.map_err(VmmError::io(format!("listing {}", dir.display())))?;
        let meta = match entry.metadata() {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(VmmError::io(format!("stat of {}", entry.path().display()))(
                    e,
                ))
            }
        };
        if stamp(&meta) >= before {
            continue;
        }
        match std::fs::remove_file(entry.path()) {
            Ok(()) => removed += 1,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(VmmError::io(format!("removing {}", entry.path().display()))(e)),
        }
    }
    if removed > 0 {
        sync_dir(dir)?;
    }
    Ok(removed)
}

impl BlobStore for LocalBlobStore {
    fn sink(&self) -> Result<Box<dyn BlobSink>> {
        let tmp = tempfile::Builder::new()
            .prefix("put-")
            .tempfile_in(self.root.join("tmp"))
            .map_err(VmmError::io("creating a temporary blob file"))?;
        Ok(Box::new(LocalSink {
            file: io::BufWriter::with_capacity(1 << 20, tmp),
            written: 0,
            flushed: 0,
            store_root: self.root.clone(),
            verified: self.verified.clone(),
        }))
    }

    fn describe(&self) -> String {
        format!("file://{}", self.root.display())
    }

    fn list(&self) -> Result<Vec<StoredBlob>> {
        let dir = self.root.join("sha256");
        let entries =
            std::fs::read_dir(&dir).map_err(VmmError::io(format!("listing {}", dir.display())))?;
        let mut blobs = Vec::new();
        for entry in entries {
            let entry = entry.map_err(VmmError::io(format!("listing {}", dir.display())))?;
            let Some(digest) = entry.file_name().to_str().and_then(digest_of_name) else {
                continue;
            };
            let meta = match entry.metadata() {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(VmmError::io(format!("stat of blob {digest}"))(e)),
            };
            blobs.push(StoredBlob {
                digest,
                size: meta.len(),
                written_at: meta.modified().unwrap_or(std::time::UNIX_EPOCH),
            });
        }
        Ok(blobs)
    }

    fn delete(&self, digest: &Digest) -> Result<()> {
        match std::fs::remove_file(self.path_of(digest)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(VmmError::io(format!("deleting blob {digest}"))(e)),
        }
        self.verified
            .lock()
            .expect("the verified-blob map is never poisoned")
            .remove(&digest.hex());
        sync_dir(&self.root.join("sha256"))
    }

    /// A temporary file's mtime is its last write.
    fn sweep_temporary(&self, before: std::time::SystemTime) -> Result<usize> {
        remove_files_older(&self.staging_dir(), before, |m| {
            m.modified()
                .unwrap_or_else(|_| std::time::SystemTime::now())
        })
    }

    /// A file's ctime is when it was moved to quarantine (the rename sets it; its mtime is
    /// still when its bytes were written, which may be long before).
    fn sweep_quarantine(&self, before: std::time::SystemTime) -> Result<usize> {
        remove_files_older(&self.quarantine_dir(), before, |m| {
            std::time::UNIX_EPOCH
                + std::time::Duration::new(m.ctime().max(0) as u64, m.ctime_nsec() as u32)
        })
    }

    fn as_local(&self) -> Option<&LocalBlobStore> {
        Some(self)
    }

    fn owner_marker(&self) -> String {
        self.owner_path().display().to_string()
    }

    fn owner(&self) -> Result<Option<String>> {
        let path = self.owner_path();
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(Some(text.trim().to_owned())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(VmmError::io(format!("reading {}", path.display()))(e)),
        }
    }

    /// Writes the marker to a temporary file, fsyncs it and links it under `owner`: `link(2)`
    /// fails if the name exists, so exactly one claim creates the marker and every other one
    /// reads it. The directory is fsynced so the claim survives a host crash.
    fn claim_owner(&self, owner: &str) -> Result<String> {
        let path = self.owner_path();
        let mut tmp = tempfile::Builder::new()
            .prefix("owner-")
            .tempfile_in(self.staging_dir())
            .map_err(VmmError::io("creating a temporary owner marker"))?;
        tmp.write_all(format!("{owner}\n").as_bytes())
            .and_then(|()| tmp.as_file().sync_all())
            .map_err(VmmError::io("writing a temporary owner marker"))?;
        match std::fs::hard_link(tmp.path(), &path) {
            Ok(()) => {
                sync_dir(&self.root)?;
                Ok(owner.to_owned())
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => self.owner()?.ok_or_else(|| {
                VmmError::io(format!("reading {}", path.display()))(io::Error::other(
                    "the owner marker vanished while it was claimed",
                ))
            }),
            Err(e) => Err(VmmError::io(format!("creating {}", path.display()))(e)),
        }
        // Dropping `tmp` removes the temporary name; the marker keeps its own link.
    }

    fn open_verified(&self, digest: &Digest) -> Result<VerifyingReader<BlobRead>> {
        let path = self.path_of(digest);
        let file = File::open(&path).map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                VmmError::BlobMissing {
                    digest: digest.to_string(),
                }
            } else {
                VmmError::io(format!("opening {}", path.display()))(e)
            }
        })?;
        Ok(VerifyingReader::new(Box::new(file), *digest))
    }

    fn size(&self, digest: &Digest) -> Result<Option<u64>> {
        match std::fs::metadata(self.path_of(digest)) {
            Ok(m) => Ok(Some(m.len())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(VmmError::io("stat of a blob")(e)),
        }
    }

    /// One stat when this process already verified (or wrote) this version of the file; a full
    /// read and hash otherwise.
    fn intact_size(&self, digest: &Digest) -> Result<Option<u64>> {
        let path = self.path_of(digest);
        let meta = match std::fs::metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(VmmError::io(format!("stat of {}", path.display()))(e)),
        };
        let identity = FileIdentity::of(&meta);
        let known = self
            .verified
            .lock()
            .expect("the verified-blob map is never poisoned")
            .get(&digest.hex())
            == Some(&identity);
        if known {
            return Ok(Some(identity.size));
        }
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(VmmError::io(format!("opening {}", path.display()))(e)),
        };
        // The identity of what is actually read, not of what the name pointed at earlier.
        let identity = FileIdentity::of(
            &file
                .metadata()
                .map_err(VmmError::io(format!("stat of {}", path.display())))?,
        );
        let mut reader = VerifyingReader::new(file, *digest);
        let checked = io::copy(&mut reader, &mut io::sink())
            .map_err(|e| read_error(e, &format!("reading blob {digest}")));
        match checked {
            Ok(n) => {
                remember(&self.verified, digest, identity);
                Ok(Some(n))
            }
            Err(VmmError::DigestMismatch { .. }) => {
                self.quarantine(digest, identity)?;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

/// The local store's sink: a temporary file in `<root>/tmp`, renamed into place on publish.
struct LocalSink {
    file: io::BufWriter<tempfile::NamedTempFile>,
    written: u64,
    flushed: u64,
    store_root: PathBuf,
    verified: Verified,
}

/// The sink asks the kernel to start writeback after this many new bytes, so the final fsync
/// finds little left to do and the disk works while bytes are still arriving.
const WRITEBACK_EVERY: u64 = 8 << 20;

impl Write for LocalSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.written += n as u64;
        if self.written - self.flushed >= WRITEBACK_EVERY {
            self.file.flush()?;
            start_writeback(
                self.file.get_ref().as_file(),
                self.flushed,
                self.written - self.flushed,
            );
            self.flushed = self.written;
        }
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl BlobSink for LocalSink {
    /// Chunks the caller owns go straight to the file: the buffer would only copy them again.
    fn append(&mut self, chunk: Bytes) -> io::Result<()> {
        self.append_all(vec![chunk])
    }

    /// One `writev` for many chunks, without copying them.
    fn append_all(&mut self, chunks: Vec<Bytes>) -> io::Result<()> {
        self.file.flush()?;
        let file = self.file.get_mut().as_file_mut();
        let mut slices: Vec<io::IoSlice<'_>> = chunks.iter().map(|c| io::IoSlice::new(c)).collect();
        let mut pending = &mut slices[..];
        while !pending.is_empty() {
            let n = file.write_vectored(pending)?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            self.written += n as u64;
            io::IoSlice::advance_slices(&mut pending, n);
        }
        if self.written - self.flushed >= WRITEBACK_EVERY {
            start_writeback(
                self.file.get_ref().as_file(),
                self.flushed,
                self.written - self.flushed,
            );
            self.flushed = self.written;
        }
        Ok(())
    }

    /// Publishes durably. If the digest is already stored, this copy replaces it: the stored
    /// one may be torn by a crash, this one was hashed as it was written.
    fn publish(self: Box<Self>, digest: &Digest) -> Result<()> {
        let LocalSink {
            file,
            store_root,
            verified,
            ..
        } = *self;
        let tmp = file
            .into_inner()
            .map_err(|e| VmmError::io("flushing a blob")(e.into_error()))?;
        tmp.as_file()
            .sync_data()
            .map_err(VmmError::io(format!("syncing blob {digest}")))?;
        let (_, path) = tmp.into_parts();
        publish(&store_root, &verified, &path, digest)
        // The temporary name was consumed by the rename; dropping `path` finds nothing to remove.
    }
}

/// Starts (does not wait for) writeback of a written range. Only a hint: the fsync at publish
/// is what makes the blob durable, so a failure here is ignored.
fn start_writeback(file: &File, offset: u64, len: u64) {
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

/// Bytes per chunk a [`BlobWriter`] hands to its sink and to its hasher.
const CHUNK: usize = 1 << 20;

/// Whole chunks queued for the hashing thread at most (bounds the memory a writer holds).
const HASH_QUEUE: usize = 8;

/// Streams bytes into a store's sink while hashing them.
///
/// Bytes are gathered into whole-MiB chunks. From the first whole chunk on, SHA-256 runs on a
/// thread of its own while the writer's thread goes on reading and writing: one core of
/// SHA-256 is as fast as the disk here, so hashing in the writer's thread added the hash time
/// to the write time. A blob smaller than one chunk is hashed in place (no thread).
pub struct BlobWriter {
    sink: Box<dyn BlobSink>,
    pending: BytesMut,
    hashing: Hashing,
    size: u64,
}

enum Hashing {
    Here(Sha256),
    Beside {
        chunks: std::sync::mpsc::SyncSender<Bytes>,
        done: std::thread::JoinHandle<Sha256>,
    },
}

impl Hashing {
    fn update(&mut self, chunk: &Bytes) -> io::Result<()> {
        if let Hashing::Here(hasher) = self {
            if chunk.len() < CHUNK {
                hasher.update(chunk);
                return Ok(());
            }
            let (tx, rx) = std::sync::mpsc::sync_channel::<Bytes>(HASH_QUEUE);
            let mut beside = hasher.clone();
            match std::thread::Builder::new()
                .name("blob-hash".into())
                .spawn(move || {
                    for chunk in rx {
                        beside.update(&chunk);
                    }
                    beside
                }) {
                Ok(done) => *self = Hashing::Beside { chunks: tx, done },
                // No thread to be had: hash here, as before.
                Err(_) => {
                    hasher.update(chunk);
                    return Ok(());
                }
            }
        }
        match self {
            Hashing::Beside { chunks, .. } => chunks
                .send(chunk.clone())
                .map_err(|_| io::Error::other("the blob hashing thread ended early")),
            Hashing::Here(_) => unreachable!("switched above"),
        }
    }

    fn finish(self) -> Result<Sha256> {
        match self {
            Hashing::Here(hasher) => Ok(hasher),
            Hashing::Beside { chunks, done } => {
                drop(chunks);
                done.join().map_err(|_| {
                    VmmError::io("hashing a blob")(io::Error::other("the hashing thread panicked"))
                })
            }
        }
    }
}

impl Write for BlobWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len().min(CHUNK - self.pending.len());
        self.pending.extend_from_slice(&buf[..n]);
        if self.pending.len() == CHUNK {
            self.ship()?;
        }
        Ok(n)
    }
    /// Bytes short of a whole chunk stay gathered until [`BlobWriter::commit`]: nothing reads
    /// a sink before it is published.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl BlobWriter {
    fn new(sink: Box<dyn BlobSink>) -> BlobWriter {
        BlobWriter {
            sink,
            pending: BytesMut::with_capacity(CHUNK),
            hashing: Hashing::Here(Sha256::new()),
            size: 0,
        }
    }

    /// Hands the gathered bytes to the hasher and the sink.
    fn ship(&mut self) -> io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.pending, BytesMut::with_capacity(CHUNK)).freeze();
        self.size += chunk.len() as u64;
        self.hashing.update(&chunk)?;
        self.sink.append(chunk)
    }

    /// Appends exactly `len` bytes read from `file`, read straight into the writer's chunks
    /// (no intermediate buffer, whole-MiB reads). Fails if the file is shorter.
    pub fn copy_file(&mut self, file: &File, mut len: u64) -> io::Result<()> {
        while len > 0 {
            let room = (CHUNK - self.pending.len()).min(len as usize);
            let spare = &mut self.pending.spare_capacity_mut()[..room];
            let (read, _) = rustix::io::read(file, spare)?;
            let n = read.len();
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the file is shorter than when it was listed",
                ));
            }
            // SAFETY: `read` initialised the first `n` bytes of the spare capacity.
            unsafe { self.pending.set_len(self.pending.len() + n) };
            len -= n as u64;
            if self.pending.len() == CHUNK {
                self.ship()?;
            }
        }
        Ok(())
    }

    /// Ships what is gathered and waits for the digest.
    fn finish(mut self) -> Result<(Box<dyn BlobSink>, Digest, u64)> {
        self.ship().map_err(VmmError::io("writing blob"))?;
        let hasher = self.hashing.finish()?;
        Ok((self.sink, Digest::from_hasher(hasher), self.size))
    }

    /// Publishes the blob only if its content hashes to `expected` (bytes that arrived from
    /// elsewhere, such as a registry layer and its diff id); otherwise nothing is stored.
    pub fn commit_expecting(self, expected: &Digest) -> Result<(Digest, u64)> {
        let (sink, actual, size) = self.finish()?;
        if &actual != expected {
            return Err(VmmError::DigestMismatch {
                expected: expected.to_string(),
                actual: actual.to_string(),
            });
        }
        sink.publish(&actual)?;
        Ok((actual, size))
    }

    /// Publishes the blob durably under the digest of what was written.
    pub fn commit(self) -> Result<(Digest, u64)> {
        let (sink, digest, size) = self.finish()?;
        sink.publish(&digest)?;
        Ok((digest, size))
    }
}

/// Hashes what passes through; [`VerifyingReader::finish`] (or reaching EOF) compares.
pub struct VerifyingReader<R> {
    inner: R,
    hasher: Sha256,
    expected: Digest,
    checked: bool,
}

impl<R: Read> VerifyingReader<R> {
    pub fn new(inner: R, expected: Digest) -> Self {
        VerifyingReader {
            inner,
            hasher: Sha256::new(),
            expected,
            checked: false,
        }
    }

    /// Drains what is left and checks the digest.
    pub fn finish(mut self) -> Result<()> {
        io::copy(&mut self, &mut io::sink()).map_err(|e| read_error(e, "reading a blob"))?;
        Ok(())
    }
}

impl<R: Read> Read for VerifyingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 && !buf.is_empty() {
            if !self.checked {
                self.checked = true;
                let actual = Digest::from_hasher(std::mem::take(&mut self.hasher));
                if actual != self.expected {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        VmmError::DigestMismatch {
                            expected: self.expected.to_string(),
                            actual: actual.to_string(),
                        },
                    ));
                }
            }
            return Ok(0);
        }
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// Turns a read error back into the digest mismatch a [`VerifyingReader`] raised, if it was one.
pub fn read_error(e: io::Error, context: &str) -> VmmError {
    let is_ours = e
        .get_ref()
        .is_some_and(|inner| inner.downcast_ref::<VmmError>().is_some());
    if is_ours {
        match e.into_inner().map(|b| b.downcast::<VmmError>()) {
            Some(Ok(v)) => *v,
            _ => unreachable!("checked above"),
        }
    } else {
        VmmError::io(context)(e)
    }
}

/// Hashes a file's content.
pub fn digest_file(path: &Path) -> Result<(Digest, u64)> {
    let mut f = File::open(path).map_err(VmmError::io(format!("opening {}", path.display())))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = f
            .read(&mut buf)
            .map_err(VmmError::io(format!("reading {}", path.display())))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok((Digest::from_hasher(hasher), size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrent_puts_of_one_digest_store_it_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalBlobStore::open(dir.path()).unwrap();
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let s = store.clone();
                std::thread::spawn(move || s.put_bytes(b"same bytes").unwrap())
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(results.windows(2).all(|w| w[0] == w[1]));
        let blobs: Vec<_> = std::fs::read_dir(dir.path().join("sha256"))
            .unwrap()
            .collect();
        assert_eq!(blobs.len(), 1);
        let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("tmp")).unwrap().collect();
        assert!(leftovers.is_empty(), "temporary files are cleaned up");
    }

    #[test]
    fn a_corrupted_blob_fails_verification() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalBlobStore::open(dir.path()).unwrap();
        let (digest, _) = store.put_bytes(b"original").unwrap();
        std::fs::write(store.path_of(&digest), b"tampered").unwrap();
        let err = store.verify(&digest).unwrap_err();
        assert!(matches!(err, VmmError::DigestMismatch { .. }), "{err}");
        assert!(matches!(
            store.verify(&Digest::of(b"absent")).unwrap_err(),
            VmmError::BlobMissing { .. }
        ));
    }

    /// What a host crash leaves under a digest name: the file cut short, or with a changed byte.
    fn tear(path: &Path, how: &str) {
        let mut bytes = std::fs::read(path).unwrap();
        match how {
            "truncated" => bytes.truncate(bytes.len() / 2),
            _ => bytes[3] ^= 0x01,
        }
        std::fs::write(path, bytes).unwrap();
    }

    #[test]
    fn a_put_of_the_same_bytes_repairs_a_torn_blob() {
        for how in ["truncated", "bit-flipped"] {
            let dir = tempfile::tempdir().unwrap();
            let store = LocalBlobStore::open(dir.path()).unwrap();
            let content = vec![7u8; 100_000];
            let (digest, _) = store.put_bytes(&content).unwrap();
            tear(&store.path_of(&digest), how);
            assert!(store.verify(&digest).is_err(), "{how}: the blob is torn");
            assert_eq!(store.put_bytes(&content).unwrap().0, digest);
            assert_eq!(store.verify(&digest).unwrap(), 100_000, "{how}: repaired");

            // The same through `adopt`, as an upload publishes.
            tear(&store.path_of(&digest), how);
            let staged = store.staging_dir().join("staged");
            std::fs::write(&staged, &content).unwrap();
            store.adopt(&staged, &digest).unwrap();
            assert_eq!(store.verify(&digest).unwrap(), 100_000, "{how}: repaired");
            assert!(!staged.exists());
        }
    }

    #[test]
    fn a_torn_blob_is_absent_to_intact_size_and_moved_aside() {
        for how in ["truncated", "bit-flipped"] {
            let dir = tempfile::tempdir().unwrap();
            let store = LocalBlobStore::open(dir.path()).unwrap();
            let (digest, size) = store.put_bytes(b"some layer bytes").unwrap();
            assert_eq!(store.intact_size(&digest).unwrap(), Some(size));
            // File timestamps advance by the kernel's coarse clock tick: let one pass so the
            // in-place change is visible in the file's identity, as any real one is.
            std::thread::sleep(std::time::Duration::from_millis(20));
            tear(&store.path_of(&digest), how);
            // A fresh process knows nothing; this one must notice the change too.
            for s in [store.clone(), LocalBlobStore::open(dir.path()).unwrap()] {
                assert_eq!(s.intact_size(&digest).unwrap(), None, "{how}");
            }
            assert!(!store.path_of(&digest).exists(), "{how}: moved aside");
            assert_eq!(
                std::fs::read_dir(dir.path().join("quarantine"))
                    .unwrap()
                    .count(),
                1
            );
            store.put_bytes(b"some layer bytes").unwrap();
            assert_eq!(store.intact_size(&digest).unwrap(), Some(size));
        }
    }
}
