//! One layer from the wire to the node: the compressed bytes are hashed (the descriptor's
//! digest) as they arrive, decompressed, hashed again (the config's diff id) while being
//! written to the blob store and extracted into the layer cache, all in one pass on a blocking
//! thread fed by the download. Nothing is published until both digests match: the blob is
//! committed only with the expected diff id, and the extraction is renamed into the layer
//! cache only after that; on any failure both are discarded.

use super::expansion::{Charged, ExpansionBudget};
use std::io::{self, BufReader, Read, Write};
use tokio::sync::mpsc::Receiver;

use bytes::Bytes;
use sha2::{Digest as _, Sha256};

use super::manifest::Compression;
use crate::domain::ids::Digest;
use crate::vmm::archive_policy::{self, ArchivePolicy};
use crate::vmm::blob_store::read_error;
use crate::vmm::layer::LayerCache;
use crate::vmm::{BlobStore, LayerRef, VmmError};

/// Why unpacking stopped.
#[derive(Debug)]
pub enum UnpackError {
    /// The compressed stream did not hash to the descriptor's digest.
    Compressed {
        actual: String,
    },
    /// The uncompressed tar did not hash to the config's diff id.
    Uncompressed {
        actual: String,
    },
    /// The download failed; the async side holds the reason.
    Aborted,
    Store(VmmError),
}

/// A chunk of the download, or the end of it with an error.
pub type Chunk = Result<Bytes, ()>;

struct ChannelReader {
    rx: Receiver<Chunk>,
    current: Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(chunk)) => self.current = chunk,
                Some(Err(())) => return Err(io::Error::other(Aborted)),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        let _ = self.current.split_to(n);
        Ok(n)
    }
}

#[derive(Debug)]
struct Aborted;
impl std::fmt::Display for Aborted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the download was aborted")
    }
}
impl std::error::Error for Aborted {}

struct Hashing<R> {
    inner: R,
    hasher: Sha256,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

struct Tee<R, W> {
    inner: R,
    copy: W,
}

impl<R: Read, W: Write> Read for Tee<R, W> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.copy.write_all(&buf[..n])?;
        Ok(n)
    }
}

fn is_abort(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<Aborted>())
}

fn archive_is_abort(e: &archive_policy::ArchiveError) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<io::Error>() {
            if is_abort(io) {
                return true;
            }
        }
        source = s.source();
    }
    false
}

/// Unpacks one layer from `rx`; runs on a blocking thread.
/// The policy of a pulled layer: a layer's, its entries' total held to `max_expanded`.
fn layer_policy(ids: crate::vmm::id_range::IdRange, max_expanded: Option<u64>) -> ArchivePolicy {
    let mut policy = ArchivePolicy::layer_for(ids);
    if let Some(max) = max_expanded {
        policy.max_total_bytes = policy.max_total_bytes.min(max);
    }
    policy
}

/// `max_expanded`: most bytes the layer's tar may hold (its entries' total); `budget`: what the
/// whole pull may still expand to, charged as the tar is read.
#[allow(clippy::too_many_arguments)]
pub fn unpack(
    rx: Receiver<Chunk>,
    compression: Compression,
    compressed_digest: &Digest,
    diff_id: &Digest,
    blobs: &dyn BlobStore,
    layers: &LayerCache,
    max_expanded: Option<u64>,
    budget: &ExpansionBudget,
) -> Result<LayerRef, UnpackError> {
    let staging = layers.staging(diff_id).map_err(UnpackError::Store)?;
    // On error the staging directory is dropped, which removes it.
    let layer = unpack_into(
        rx,
        compression,
        compressed_digest,
        diff_id,
        blobs,
        staging.path(),
        &layer_policy(layers.ids(), max_expanded),
        budget,
    )?;
    layers
        .publish_staged(staging, diff_id)
        .map_err(UnpackError::Store)?;
    Ok(layer)
}

/// What a layer read fails with: the pull stopping it, or the read itself.
fn io_err(e: io::Error, what: &str) -> UnpackError {
    if is_abort(&e) {
        UnpackError::Aborted
    } else {
        UnpackError::Store(read_error(e, what))
    }
}

/// The layer's compressed bytes from `rx`, hashed as they are read.
fn wire(rx: Receiver<Chunk>) -> Hashing<ChannelReader> {
    Hashing {
        inner: ChannelReader {
            rx,
            current: Bytes::new(),
        },
        hasher: Sha256::new(),
    }
}

/// The layer's tar, decompressed from `wire`.
fn decoder<'a, R: Read + 'a>(
    compression: Compression,
    wire: &'a mut R,
) -> Result<Box<dyn Read + 'a>, UnpackError> {
    Ok(match compression {
        Compression::None => Box::new(wire),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(BufReader::with_capacity(
            1 << 16,
            wire,
        ))),
        Compression::Zstd => Box::new(
            zstd::stream::read::Decoder::new(wire)
                .map_err(|e| io_err(e, "starting a zstd decoder"))?,
        ),
    })
}

/// Reads a layer from `rx` and checks it against both its digests, storing nothing: how a
/// repository proves it holds a layer this node already has from another one
/// ([`super::provenance`]). The stored layer is `size` bytes, so decompression stops one byte
/// past that: a bomb costs no more than the real layer would. Runs on a blocking thread.
pub fn verify(
    rx: Receiver<Chunk>,
    compression: Compression,
    compressed_digest: &Digest,
    diff_id: &Digest,
    size: u64,
) -> Result<(), UnpackError> {
    let mut wire = wire(rx);
    let uncompressed = {
        let decoded = decoder(compression, &mut wire)?;
        let mut hashed = Hashing {
            inner: decoded.take(size.saturating_add(1)),
            hasher: Sha256::new(),
        };
        let drained = io::copy(&mut hashed, &mut io::sink());
        (drained, Digest::from_hasher(hashed.hasher))
    };
    io::copy(&mut wire, &mut io::sink()).map_err(|e| io_err(e, "reading a layer"))?;
    let actual = Digest::from_hasher(wire.hasher);
    if &actual != compressed_digest {
        return Err(UnpackError::Compressed {
            actual: actual.to_string(),
        });
    }
    let (drained, decoded) = uncompressed;
    let read = drained.map_err(|e| io_err(e, "decompressing a layer"))?;
    if read > size {
        return Err(UnpackError::Uncompressed {
            actual: format!("more than the stored layer's {size} bytes"),
        });
    }
    if &decoded != diff_id {
        return Err(UnpackError::Uncompressed {
            actual: decoded.to_string(),
        });
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn unpack_into(
    rx: Receiver<Chunk>,
    compression: Compression,
    compressed_digest: &Digest,
    diff_id: &Digest,
    blobs: &dyn BlobStore,
    staging: &std::path::Path,
    policy: &ArchivePolicy,
    budget: &ExpansionBudget,
) -> Result<LayerRef, UnpackError> {
    let mut wire = wire(rx);
    let mut writer = blobs.writer().map_err(UnpackError::Store)?;
    let extracted = {
        let decoded = decoder(compression, &mut wire)?;
        let mut tee = Tee {
            inner: Charged {
                inner: decoded,
                budget,
            },
            copy: &mut writer,
        };
        let extracted = archive_policy::extract_tar_charged(&mut tee, staging, policy, &mut || {
            budget.charge_entry()
        });
        // The tar's end-of-archive padding and anything after it belong to the diff id too.
        let drained = io::copy(&mut tee, &mut io::sink());
        match (extracted, drained) {
            (Err(e), _) if archive_is_abort(&e) => return Err(UnpackError::Aborted),
            (_, Err(e)) if is_abort(&e) => return Err(UnpackError::Aborted),
            (r, d) => (r, d.err()),
        }
    };
    // Whatever the decoder left unread still counts toward the compressed digest.
    io::copy(&mut wire, &mut io::sink()).map_err(|e| io_err(e, "reading a layer"))?;
    let actual = Digest::from_hasher(wire.hasher);
    if &actual != compressed_digest {
        return Err(UnpackError::Compressed {
            actual: actual.to_string(),
        });
    }
    // Only bytes that match their digest are judged as archives: a tar error on verified bytes
    // is the image's own.
    let (extracted, drain_error) = extracted;
    if let Some(e) = drain_error {
        return Err(UnpackError::Store(VmmError::io("decompressing a layer")(e)));
    }
    extracted.map_err(|e| UnpackError::Store(e.into()))?;
    let (digest, size) = writer.commit_expecting(diff_id).map_err(|e| match e {
        VmmError::DigestMismatch { actual, .. } => UnpackError::Uncompressed { actual },
        other => UnpackError::Store(other),
    })?;
    Ok(LayerRef { digest, size })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn sha(b: &[u8]) -> Digest {
        Digest::of(b)
    }

    /// `bytes` through the channel the download fills, as one chunk.
    fn channel(bytes: Vec<u8>) -> Receiver<Chunk> {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.try_send(Ok(Bytes::from(bytes))).unwrap();
        rx
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(bytes).unwrap();
        enc.finish().unwrap()
    }

    #[test]
    fn verifying_checks_both_digests_and_stops_past_the_stored_size() {
        let tar = vec![7u8; 4096];
        let gz = gzip(&tar);
        verify(
            channel(gz.clone()),
            Compression::Gzip,
            &sha(&gz),
            &sha(&tar),
            4096,
        )
        .unwrap();
        // Wrong wire bytes, wrong tar: each digest is named.
        assert!(matches!(
            verify(
                channel(gz.clone()),
                Compression::Gzip,
                &sha(b"x"),
                &sha(&tar),
                4096
            ),
            Err(UnpackError::Compressed { .. })
        ));
        assert!(matches!(
            verify(
                channel(gz.clone()),
                Compression::Gzip,
                &sha(&gz),
                &sha(b"x"),
                4096
            ),
            Err(UnpackError::Uncompressed { .. })
        ));
        // A stream that expands past the stored layer (16 MiB of zeros against 4 KiB) is cut
        // there, not decompressed to its end.
        let bomb = gzip(&vec![0u8; 16 << 20]);
        let err = verify(
            channel(bomb.clone()),
            Compression::Gzip,
            &sha(&bomb),
            &sha(&tar),
            4096,
        )
        .unwrap_err();
        assert!(
            matches!(&err, UnpackError::Uncompressed { actual } if actual.contains("4096 bytes")),
            "{err:?}"
        );
    }
}
