//! Content-addressed blob storage: layers, image manifests and license notices, named by the
//! sha256 of their bytes.
//!
//! [`BlobStore`] is a trait because a node-local directory is one implementation and an object
//! store is the next. [`LocalBlobStore`] keeps `blobs/sha256/<hex>`; every write goes to a
//! temporary file and is published with `link(2)`, which fails if the name exists, so
//! concurrent puts of one digest store it exactly once and a reader never sees a partial blob.

use std::fmt;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use super::error::{Result, VmmError};

/// A sha256 content address, printed as `sha256:<hex>`.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "String", into = "String")]
pub struct Digest(String);

impl Digest {
    /// Parses `sha256:<64 lowercase hex>` (or bare hex).
    pub fn parse(text: &str) -> Result<Digest> {
        let hex = text.strip_prefix("sha256:").unwrap_or(text);
        if hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            Ok(Digest(hex.to_string()))
        } else {
            Err(VmmError::InvalidDigest(text.to_string()))
        }
    }

    pub fn from_hasher(hasher: Sha256) -> Digest {
        Digest(hex::encode(hasher.finalize()))
    }

    pub fn of_bytes(bytes: &[u8]) -> Digest {
        Digest(hex::encode(Sha256::digest(bytes)))
    }

    /// The 64 hex digits, for file names.
    pub fn hex(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.0)
    }
}

impl TryFrom<String> for Digest {
    type Error = VmmError;
    fn try_from(value: String) -> Result<Self> {
        Digest::parse(&value)
    }
}

impl From<Digest> for String {
    fn from(d: Digest) -> String {
        d.to_string()
    }
}

/// Where immutable blobs live. Implementations must make `put` atomic and idempotent.
pub trait BlobStore: Send + Sync {
    /// A writer that hashes as it goes; `commit` publishes the blob under its digest.
    fn writer(&self) -> Result<BlobWriter>;
    /// Opens a blob for reading, verifying its digest when the reader reaches the end.
    fn open_verified(&self, digest: &Digest) -> Result<VerifyingReader<File>>;
    /// Size in bytes, or `None` when absent.
    fn size(&self, digest: &Digest) -> Result<Option<u64>>;
    /// Re-reads the whole blob and checks its digest.
    fn verify(&self, digest: &Digest) -> Result<u64> {
        let mut reader = self.open_verified(digest)?;
        let n = io::copy(&mut reader, &mut io::sink())
            .map_err(|e| read_error(e, &format!("reading blob {digest}")))?;
        reader.finish()?;
        Ok(n)
    }
    /// Stores a byte slice.
    fn put_bytes(&self, bytes: &[u8]) -> Result<(Digest, u64)> {
        let mut w = self.writer()?;
        w.write_all(bytes).map_err(VmmError::io("writing blob"))?;
        w.commit()
    }
}

/// The node-local implementation: `<root>/sha256/<hex>`, temporary files in `<root>/tmp`.
#[derive(Debug, Clone)]
pub struct LocalBlobStore {
    root: PathBuf,
}

impl LocalBlobStore {
    pub fn open(root: impl Into<PathBuf>) -> Result<LocalBlobStore> {
        let root = root.into();
        for dir in [root.join("sha256"), root.join("tmp")] {
            std::fs::create_dir_all(&dir)
                .map_err(VmmError::io(format!("creating {}", dir.display())))?;
        }
        Ok(LocalBlobStore { root })
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
    /// bytes while writing it. Create-if-absent: when the digest is already stored, the existing
    /// copy wins, so concurrent identical uploads keep one copy.
    pub fn adopt(&self, staged: &Path, digest: &Digest) -> Result<()> {
        match std::fs::hard_link(staged, self.path_of(digest)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(VmmError::io(format!("publishing blob {digest}"))(e)),
        }
    }
}

impl BlobStore for LocalBlobStore {
    fn writer(&self) -> Result<BlobWriter> {
        let tmp = tempfile::Builder::new()
            .prefix("put-")
            .tempfile_in(self.root.join("tmp"))
            .map_err(VmmError::io("creating a temporary blob file"))?;
        Ok(BlobWriter {
            file: io::BufWriter::with_capacity(1 << 20, tmp),
            hasher: Sha256::new(),
            size: 0,
            store_root: self.root.clone(),
        })
    }

    fn open_verified(&self, digest: &Digest) -> Result<VerifyingReader<File>> {
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
        Ok(VerifyingReader::new(file, digest.clone()))
    }

    fn size(&self, digest: &Digest) -> Result<Option<u64>> {
        match std::fs::metadata(self.path_of(digest)) {
            Ok(m) => Ok(Some(m.len())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(VmmError::io("stat of a blob")(e)),
        }
    }
}

/// Streams bytes into a temporary file while hashing them.
pub struct BlobWriter {
    file: io::BufWriter<tempfile::NamedTempFile>,
    hasher: Sha256,
    size: u64,
    store_root: PathBuf,
}

impl Write for BlobWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.size += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl BlobWriter {
    /// Publishes the blob only if its content hashes to `expected` (bytes that arrived from
    /// elsewhere, such as a registry layer and its diff id); otherwise nothing is stored.
    pub fn commit_expecting(self, expected: &Digest) -> Result<(Digest, u64)> {
        let actual = Digest::from_hasher(self.hasher.clone());
        if &actual != expected {
            return Err(VmmError::DigestMismatch {
                expected: expected.to_string(),
                actual: actual.to_string(),
            });
        }
        self.commit()
    }

    /// Publishes the blob. If the digest already exists, the existing copy wins and this one is
    /// discarded: the bytes are identical by construction.
    pub fn commit(self) -> Result<(Digest, u64)> {
        let digest = Digest::from_hasher(self.hasher);
        let tmp = self
            .file
            .into_inner()
            .map_err(|e| VmmError::io("flushing a blob")(e.into_error()))?;
        // No fsync: every read verifies the digest, so a blob torn by a crash is detected
        // (DigestMismatch) rather than used, and the hot checkpoint path stays fast.
        let dest = self.store_root.join("sha256").join(digest.hex());
        match std::fs::hard_link(tmp.path(), &dest) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(VmmError::io(format!("publishing blob {digest}"))(e)),
        }
        // The temporary name is removed when `tmp` drops.
        Ok((digest, self.size))
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
            store.verify(&Digest::of_bytes(b"absent")).unwrap_err(),
            VmmError::BlobMissing { .. }
        ));
    }

    #[test]
    fn digests_parse_strictly() {
        assert!(Digest::parse("sha256:abc").is_err());
        let d = Digest::of_bytes(b"");
        assert_eq!(Digest::parse(&d.to_string()).unwrap(), d);
    }
}
