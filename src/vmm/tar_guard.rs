//! A tar stream's extension entries, capped before the tar parser reads them.
//!
//! The `tar` crate reads a GNU long name (`L`), long link (`K`) or PAX header (`x`) whole into
//! memory before it yields the entry they describe, so an archive's own size checks
//! ([`super::archive_policy`]) come too late: a gzip layer of a few MiB can expand into a
//! "long name" of many GiB. [`TarGuard`] sits between the bytes and the parser and follows
//! the archive's block structure as it passes (each header, the size of the data after it, a
//! PAX `size` that overrides the next header's, exactly as the parser reads them), refusing an
//! extension entry larger than [`MAX_EXTENSION_BYTES`] before a byte of it reaches the parser.
//! After the end-of-archive block the rest passes unexamined, as the parser stops reading
//! there.

use std::io::{self, Read};

/// Largest extension entry accepted: a path or link target of this many bytes, or PAX records
/// totalling this much, is far beyond any filesystem's (`PATH_MAX` is 4 KiB).
pub const MAX_EXTENSION_BYTES: u64 = 1 << 20;

const BLOCK: usize = 512;

/// Why the guard stopped a stream; carried inside the `io::Error` the parser passes on, so the
/// extraction can report it in its own terms ([`Refused::in_error`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("a tar {what} entry of {size} bytes is larger than the {MAX_EXTENSION_BYTES} bytes an extension may hold")]
    Extension { what: &'static str, size: u64 },
    /// A GNU sparse entry: its extra header blocks are not followed here, and extraction
    /// refuses sparse files anyway.
    #[error("{entry}: sparse files are not accepted in archives")]
    Sparse { entry: String },
}

impl Refused {
    fn into_io(self) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, self)
    }

    /// The refusal `err` carries, if the guard raised it.
    pub fn in_error(err: &io::Error) -> Option<&Refused> {
        err.get_ref()?.downcast_ref::<Refused>()
    }
}

/// A reader of a tar stream that refuses oversized extension entries.
pub struct TarGuard<R> {
    inner: R,
    header: [u8; BLOCK],
    filled: usize,
    /// Data and padding of the current entry still to pass before the next header.
    skip: u64,
    /// The current entry's data, when it is a PAX header: parsed for `size` once complete.
    pax: Option<(Vec<u8>, u64)>,
    /// A PAX `size` for the next entry that is not itself an extension.
    next_size: Option<u64>,
    /// The end-of-archive block was seen: what follows is not parsed.
    ended: bool,
}

impl<R: Read> TarGuard<R> {
    pub fn new(inner: R) -> Self {
        TarGuard {
            inner,
            header: [0; BLOCK],
            filled: 0,
            skip: 0,
            pax: None,
            next_size: None,
            ended: false,
        }
    }

    /// Follows `bytes`, which have just been read, through the archive's structure.
    fn follow(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() && !self.ended {
            if self.skip > 0 {
                let n = bytes.len().min(self.skip.min(usize::MAX as u64) as usize);
                if let Some((data, wanted)) = &mut self.pax {
                    let take = n.min((*wanted - data.len() as u64) as usize);
                    data.extend_from_slice(&bytes[..take]);
                    if data.len() as u64 == *wanted {
                        self.next_size = pax_size(data);
                        self.pax = None;
                    }
                }
                self.skip -= n as u64;
                bytes = &bytes[n..];
                continue;
            }
            let n = bytes.len().min(BLOCK - self.filled);
            self.header[self.filled..self.filled + n].copy_from_slice(&bytes[..n]);
            self.filled += n;
            bytes = &bytes[n..];
            if self.filled == BLOCK {
                self.filled = 0;
                self.enter_header()?;
            }
        }
        Ok(())
    }

    fn enter_header(&mut self) -> io::Result<()> {
        if self.header.iter().all(|b| *b == 0) {
            self.ended = true;
            return Ok(());
        }
        let mut header = tar::Header::new_old();
        header.as_mut_bytes().copy_from_slice(&self.header);
        let kind = header.entry_type();
        let recognized = header.as_ustar().is_some() || header.as_gnu().is_some();
        let size = header.entry_size()?;
        let extension = match kind {
            tar::EntryType::GNULongName => Some("GNU long name"),
            tar::EntryType::GNULongLink => Some("GNU long link"),
            tar::EntryType::XHeader => Some("PAX header"),
            _ => None,
        };
        if let Some(what) = extension {
            if size > MAX_EXTENSION_BYTES {
                return Err(Refused::Extension { what, size }.into_io());
            }
        }
        if kind.is_gnu_sparse() {
            let entry = String::from_utf8_lossy(&header.path_bytes()).into_owned();
            return Err(Refused::Sparse { entry }.into_io());
        }
        let is_extension = extension.is_some() || kind == tar::EntryType::XGlobalHeader;
        let size = if is_extension {
            size
        } else {
            self.next_size.take().unwrap_or(size)
        };
        if kind == tar::EntryType::XHeader && recognized && size > 0 {
            self.pax = Some((Vec::with_capacity(size as usize), size));
        }
        self.skip = size.checked_add(BLOCK as u64 - 1).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, "tar entry size overflows")
        })? & !(BLOCK as u64 - 1);
        Ok(())
    }
}

/// The `size` record of PAX data, as the tar parser reads it.
fn pax_size(data: &[u8]) -> Option<u64> {
    tar::PaxExtensions::new(data)
        .filter_map(Result::ok)
        .find(|e| e.key_bytes() == b"size")
        .and_then(|e| e.value().ok()?.parse().ok())
}

impl<R: Read> Read for TarGuard<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.follow(&buf[..n])?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(kind: tar::EntryType, size: u64, path: &str) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_path(path).unwrap();
        h.set_mode(0o644);
        h.set_cksum();
        h
    }

    /// Reads `bytes` through the guard in reads of `chunk` bytes.
    fn through(bytes: &[u8], chunk: usize) -> io::Result<Vec<u8>> {
        struct Chunks<'a>(&'a [u8], usize);
        impl Read for Chunks<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let n = self.0.len().min(self.1).min(buf.len());
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let mut out = Vec::new();
        TarGuard::new(Chunks(bytes, chunk)).read_to_end(&mut out)?;
        Ok(out)
    }

    fn archive_with_long_name(name_len: usize) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        let long = "d/".repeat(name_len / 2) + "f";
        let mut h = tar::Header::new_gnu();
        h.set_size(5);
        h.set_mode(0o644);
        b.append_data(&mut h, &long, &b"hello"[..]).unwrap();
        let h = header(tar::EntryType::Regular, 3, "short");
        b.append(&h, &b"abc"[..]).unwrap();
        b.into_inner().unwrap()
    }

    #[test]
    fn ordinary_archives_pass_unchanged_whatever_the_read_sizes() {
        let bytes = archive_with_long_name(300);
        for chunk in [1, 7, 512, 513, 100_000] {
            assert_eq!(through(&bytes, chunk).unwrap(), bytes, "chunk {chunk}");
        }
        // And the parser reads through the guard what it reads without it.
        let mut names = Vec::new();
        let mut archive = tar::Archive::new(TarGuard::new(&bytes[..]));
        for e in archive.entries().unwrap() {
            names.push(e.unwrap().path().unwrap().display().to_string().len());
        }
        assert_eq!(names, vec![301, 5]);
    }

    #[test]
    fn an_oversized_long_name_is_refused_before_the_parser_reads_it() {
        // The header announces 64 MiB of long name; only its first block follows, so a
        // parser that trusted it would wait for (and allocate) the rest.
        let mut h = header(tar::EntryType::GNULongName, 64 << 20, "././@LongLink");
        h.set_cksum();
        let mut bytes = h.as_bytes().to_vec();
        bytes.extend_from_slice(&[b'a'; 512]);
        let err = through(&bytes, 4096).unwrap_err();
        assert!(
            err.to_string()
                .contains("GNU long name entry of 67108864 bytes"),
            "{err}"
        );
        let mut archive = tar::Archive::new(TarGuard::new(&bytes[..]));
        let first = archive.entries().unwrap().next().unwrap();
        assert!(first.is_err());
    }

    #[test]
    fn a_pax_size_moves_the_next_header_as_the_parser_does() {
        // A PAX header says the next file holds 700 bytes although its own header says 0:
        // the guard must find the header after those 700 bytes, where the parser does.
        let record = "12 size=700\n";
        let mut pax = header(tar::EntryType::XHeader, record.len() as u64, "pax");
        pax.set_cksum();
        let mut raw = pax.as_bytes().to_vec();
        let mut block = record.as_bytes().to_vec();
        block.resize(512, 0);
        raw.extend_from_slice(&block);
        let mut file = header(tar::EntryType::Regular, 0, "big");
        file.set_cksum();
        raw.extend_from_slice(file.as_bytes());
        raw.extend_from_slice(&[b'x'; 1024]); // 700 bytes of data, padded to two blocks
                                              // Where the parser expects the next header: a long name over the cap.
        let mut long = header(tar::EntryType::GNULongName, 2 << 20, "././@LongLink");
        long.set_cksum();
        raw.extend_from_slice(long.as_bytes());
        let err = through(&raw, 333).unwrap_err();
        assert!(err.to_string().contains("GNU long name"), "{err}");
    }

    #[test]
    fn sparse_entries_are_refused() {
        let mut h = header(tar::EntryType::GNUSparse, 0, "holes");
        h.set_cksum();
        let err = through(h.as_bytes(), 512).unwrap_err();
        assert_eq!(
            Refused::in_error(&err),
            Some(&Refused::Sparse {
                entry: "holes".into()
            })
        );
    }
}
