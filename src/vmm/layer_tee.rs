//! A layer tar written to the blob store and extracted into the layer cache at once, from one
//! read of the sealed directory: for uppers on a sandbox's scratch disk, which cannot be
//! renamed into the cache (ADR 0023).
//!
//! The extraction runs on its own thread, fed through a bounded channel (so the tar is never
//! held whole in memory and a slow disk slows the seal, not the other way round), with the
//! policy every layer extraction has.

use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread::JoinHandle;

use super::archive_policy::{self, ArchivePolicy};
use super::blob_store::BlobWriter;
use super::error::{Result, VmmError};
use super::id_range::IdRange;
use super::layer::TarOut;

/// Chunks in flight between the seal and the extraction.
const DEPTH: usize = 16;
/// Size of the chunks a file's contents are read in.
const CHUNK: usize = 1 << 20;

/// Writes to a blob and to an extraction thread.
pub(super) struct Tee<'a> {
    blob: &'a mut BlobWriter,
    to_extractor: Option<SyncSender<Vec<u8>>>,
    extractor: Option<JoinHandle<Result<()>>>,
}

impl<'a> Tee<'a> {
    /// Starts extracting into `dest` (an empty staging directory) what is written to `blob`.
    pub(super) fn start(blob: &'a mut BlobWriter, dest: &Path, ids: IdRange) -> Result<Tee<'a>> {
        let (tx, rx) = sync_channel(DEPTH);
        let dest = dest.to_path_buf();
        let extractor = std::thread::Builder::new()
            .name("layer-extract".into())
            .spawn(move || {
                let mut reader = ChannelReader {
                    rx,
                    chunk: Vec::new(),
                    at: 0,
                };
                archive_policy::extract_tar(&mut reader, &dest, &ArchivePolicy::layer_for(ids))?;
                // The tar's end-of-archive padding, which the extraction stops before.
                io::copy(&mut reader, &mut io::sink())
                    .map_err(VmmError::io("reading the rest of a layer tar"))?;
                Ok(())
            })
            .map_err(VmmError::io("starting a layer extraction thread"))?;
        Ok(Tee {
            blob,
            to_extractor: Some(tx),
            extractor: Some(extractor),
        })
    }

    /// Waits for the extraction to have read everything written; its error if it failed.
    pub(super) fn finish(mut self) -> Result<()> {
        self.join()
    }

    fn join(&mut self) -> Result<()> {
        drop(self.to_extractor.take());
        match self.extractor.take() {
            Some(handle) => handle.join().expect("layer extraction thread"),
            None => Ok(()),
        }
    }

    fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        let sent = self
            .to_extractor
            .as_ref()
            .map(|tx| tx.send(bytes.to_vec()).is_ok())
            .unwrap_or(false);
        if sent {
            return Ok(());
        }
        // The extraction stopped early: its own error says why.
        let why = match self.join() {
            Err(e) => e.to_string(),
            Ok(()) => "it ended before the tar did".into(),
        };
        Err(io::Error::other(format!(
            "extracting the layer into the cache: {why}"
        )))
    }
}

impl Write for Tee<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.blob.write_all(buf)?;
        self.send(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.blob.flush()
    }
}

impl TarOut for Tee<'_> {
    fn file_contents(&mut self, file: &std::fs::File, len: u64) -> io::Result<()> {
        let mut left = len;
        let mut buf = vec![0u8; CHUNK.min(len as usize).max(1)];
        let mut file = file;
        while left > 0 {
            let want = buf.len().min(left as usize);
            file.read_exact(&mut buf[..want])?;
            self.write_all(&buf[..want])?;
            left -= want as u64;
        }
        Ok(())
    }
}

impl Drop for Tee<'_> {
    fn drop(&mut self) {
        let _ = self.join();
    }
}

/// Reads the chunks a [`Tee`] sends, in order, until it is dropped.
struct ChannelReader {
    rx: Receiver<Vec<u8>>,
    chunk: Vec<u8>,
    at: usize,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.at == self.chunk.len() {
            match self.rx.recv() {
                Ok(chunk) => {
                    self.chunk = chunk;
                    self.at = 0;
                }
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len() - self.at);
        buf[..n].copy_from_slice(&self.chunk[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}
