//! The one place that decides what an archive may contain and how it is written to disk.
//!
//! Two kinds of archives are extracted:
//! * [`ArchiveKind::Upload`]: a COPY context uploaded by a user. Extracted by the in-sandbox
//!   agent, never on the host.
//! * [`ArchiveKind::Layer`]: an OCI layer tar (built here or imported). Extracted on the host
//!   into the node's layer cache, with OCI whiteouts translated to overlay's format.
//!
//! Hostile-entry policy (both kinds unless noted):
//! * an absolute name or a `..` component: the archive is rejected, naming the entry;
//! * symlinks are stored as they are (any target); hardlinks must name an earlier entry by a
//!   relative, `..`-free path; nothing is ever written *through* a link: every parent directory
//!   is opened with `O_NOFOLLOW`, and the final name is created with `O_EXCL`/`O_NOFOLLOW`
//!   after removing what was there;
//! * device nodes, fifos, sparse files and other exotic types: rejected;
//! * setuid, setgid and sticky bits: stripped from uploads (kept in layers, where `sudo` needs
//!   them);
//! * per-entry size, total size and entry count each have a ceiling; exceeding one rejects the
//!   archive (this also bounds a decompression bomb); a long name, long link or PAX header
//!   over 1 MiB is refused before the parser reads it ([`super::tar_guard`]);
//! * ownership: uploads are written as root (COPY sets the owner afterwards); layers keep the
//!   numeric owners they store;
//! * layers only: a whiteout `.wh.<name>` must name one entry of its own directory, so
//!   `.wh.`, `.wh..` and `.wh...` (which would name the directory itself or its parent) are
//!   rejected, as is AUFS metadata (`.wh..wh.<x>` other than the opaque marker).
//!
//! Nothing reaches outside the destination: every name an `*at` call creates, opens or
//! removes is a [`Component`] (one normal name, never `.`, `..` or empty), and directories are
//! opened one component at a time with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`. The
//! `extract_tar` fuzz target (`fuzz/`, oracle in [`super::archive_fuzz`]) checks the whole
//! claim: no archive changes anything outside the destination.

use std::ffi::OsStr;
use std::io::{self, BufRead, BufReader, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::id_range::{IdRange, IdRangeError};
use super::tree_walk::open_dir;
pub use super::tree_walk::Component;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, Timestamps};

/// OCI whiteout prefix, and the marker of an opaque directory.
pub const WHITEOUT_PREFIX: &str = ".wh.";
pub const OPAQUE_MARKER: &str = ".wh..wh..opq";
/// AUFS's metadata prefix: the opaque marker is the only such name an OCI layer may hold.
pub const WHITEOUT_META_PREFIX: &str = ".wh..wh.";
/// The overlay xattr that marks a directory as replacing (not merging with) lower ones.
pub const OVERLAY_OPAQUE_XATTR: &str = "trusted.overlay.opaque";

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ArchiveKind {
    Upload,
    Layer,
}

/// Ceilings and the archive kind. Defaults are generous for real builds; tests lower them.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ArchivePolicy {
    pub kind: ArchiveKind,
    pub max_entries: u64,
    pub max_entry_bytes: u64,
    pub max_total_bytes: u64,
    /// Layers only: the host ids their owners are written as (sandbox id `n` as `base + n`,
    /// [`IdRange`]), for trees the node keeps for sandboxes. `None` writes the numbers the
    /// archive holds.
    #[serde(default)]
    pub owners: Option<IdRange>,
}

impl ArchivePolicy {
    pub fn upload() -> Self {
        ArchivePolicy {
            kind: ArchiveKind::Upload,
            max_entries: 1_000_000,
            max_entry_bytes: 8 << 30,
            max_total_bytes: 32 << 30,
            owners: None,
        }
    }
    pub fn layer() -> Self {
        ArchivePolicy {
            kind: ArchiveKind::Layer,
            max_entries: 4_000_000,
            max_entry_bytes: 64 << 30,
            max_total_bytes: 256 << 30,
            owners: None,
        }
    }

    /// A layer extracted into a tree the node keeps for sandboxes with ids in `owners`.
    pub fn layer_for(owners: IdRange) -> Self {
        ArchivePolicy {
            owners: Some(owners),
            ..Self::layer()
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("archive entry {entry:?} has an absolute path or a `..` component; archives must hold relative paths inside their root")]
    UnsafePath { entry: String },
    #[error(
        "archive entry {entry:?} is a {kind}, which is not allowed; remove it from the archive"
    )]
    UnsupportedType { entry: String, kind: String },
    #[error(
        "archive entry {entry:?} is a hardlink to {target:?}, which leads outside the archive root"
    )]
    LinkEscapes { entry: String, target: String },
    #[error("archive entry {entry:?} is a whiteout of {hidden:?}, which is not a file of its directory; a whiteout names one entry beside it (OCI image spec, whiteouts)")]
    BadWhiteout { entry: String, hidden: String },
    #[error("archive entry {entry:?} is AUFS whiteout metadata, which OCI layers do not carry; rebuild the image with a current builder")]
    WhiteoutMetadata { entry: String },
    #[error("archive entry {entry:?} would be written through a symlink or over a non-directory; refusing to follow links while extracting")]
    ThroughLink { entry: String },
    #[error("archive entry {entry:?} replaces a directory with a non-directory")]
    ReplacesDirectory { entry: String },
    #[error("archive entry {entry:?} is {size} bytes, over the per-entry limit of {limit} bytes")]
    EntryTooLarge {
        entry: String,
        size: u64,
        limit: u64,
    },
    #[error("archive expands to more than {limit} bytes (at entry {entry:?})")]
    TotalTooLarge { entry: String, limit: u64 },
    #[error("archive has more than {limit} entries")]
    TooManyEntries { limit: u64 },
    #[error("archive entry {entry:?}: {source}")]
    Owner {
        entry: String,
        #[source]
        source: IdRangeError,
    },
    #[error("archive is unreadable: {0}")]
    Corrupt(io::Error),
    #[error("writing archive entry {entry:?}: {source}")]
    Io {
        entry: String,
        #[source]
        source: io::Error,
    },
}

/// What an extraction wrote.
#[derive(Debug, Default, Clone, Copy)]
pub struct ExtractStats {
    pub entries: u64,
    pub bytes: u64,
}

/// Wraps `reader` in a gzip decoder when it starts with the gzip magic `1f 8b`.
pub fn sniff_gzip<'a>(reader: impl Read + 'a) -> io::Result<Box<dyn Read + 'a>> {
    let mut buffered = BufReader::with_capacity(1 << 16, reader);
    let head = buffered.fill_buf()?;
    if head.len() >= 2 && head[0] == 0x1f && head[1] == 0x8b {
        Ok(Box::new(flate2::read::MultiGzDecoder::new(buffered)))
    } else {
        Ok(Box::new(buffered))
    }
}

/// Splits an entry name into normal components, rejecting absolute paths and `..`.
pub fn safe_components(raw: &[u8], entry: &str) -> Result<Vec<Component>, ArchiveError> {
    let unsafe_path = || ArchiveError::UnsafePath {
        entry: entry.to_string(),
    };
    if raw.first() == Some(&b'/') {
        return Err(unsafe_path());
    }
    let mut out = Vec::new();
    for part in raw.split(|b| *b == b'/') {
        match part {
            b"" | b"." => continue,
            p => out.push(Component::new(p).ok_or_else(unsafe_path)?),
        }
    }
    Ok(out)
}

/// What a layer entry's name means besides a file: OCI's whiteouts, checked to name one
/// entry of their own directory.
enum Whiteout {
    /// `.wh..wh..opq`: the directory hides what lower layers hold in it.
    Opaque,
    /// `.wh.<name>`: `<name>` is deleted.
    Hides(Component),
}

fn whiteout(leaf: &Component, entry: &str) -> Result<Option<Whiteout>, ArchiveError> {
    let name = leaf.as_bytes();
    if name == OPAQUE_MARKER.as_bytes() {
        return Ok(Some(Whiteout::Opaque));
    }
    if name.starts_with(WHITEOUT_META_PREFIX.as_bytes()) {
        return Err(ArchiveError::WhiteoutMetadata {
            entry: entry.to_string(),
        });
    }
    let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX.as_bytes()) else {
        return Ok(None);
    };
    match Component::new(hidden) {
        Some(hidden) => Ok(Some(Whiteout::Hides(hidden))),
        None => Err(ArchiveError::BadWhiteout {
            entry: entry.to_string(),
            hidden: String::from_utf8_lossy(hidden).into_owned(),
        }),
    }
}

/// Extracts `archive` (plain tar or gzip, sniffed) under the directory `dest`.
pub fn extract(
    archive: impl Read,
    dest: &Path,
    policy: &ArchivePolicy,
) -> Result<ExtractStats, ArchiveError> {
    let reader = sniff_gzip(archive).map_err(ArchiveError::Corrupt)?;
    extract_tar(reader, dest, policy)
}

/// Extracts an uncompressed tar stream; see the module docs for the policy.
pub fn extract_tar(
    reader: impl Read,
    dest: &Path,
    policy: &ArchivePolicy,
) -> Result<ExtractStats, ArchiveError> {
    extract_tar_charged(reader, dest, policy, &mut || Ok(()))
}

/// [`extract_tar`], calling `charge` before each entry is written: its error (a budget beyond
/// this archive, such as a whole image's) stops the extraction at that entry.
pub fn extract_tar_charged(
    reader: impl Read,
    dest: &Path,
    policy: &ArchivePolicy,
    charge: &mut dyn FnMut() -> io::Result<()>,
) -> Result<ExtractStats, ArchiveError> {
    let root = rustix::fs::open(
        dest,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| ArchiveError::Io {
        entry: dest.display().to_string(),
        source: e.into(),
    })?;
    // Extension entries (long names, PAX headers) are capped before the parser reads them
    // whole into memory.
    let mut archive = tar::Archive::new(super::tar_guard::TarGuard::new(reader));
    let mut stats = ExtractStats::default();
    // A layer's directories get their times once everything inside them is written (each
    // entry written later changes its directory's mtime): a layer tree then seals again to the
    // very tar it came from, which republishing a blob from a node's tree relies on.
    let mut directory_times: Vec<(Vec<Component>, String, i64)> = Vec::new();
    let entries = archive.entries().map_err(ArchiveError::Corrupt)?;
    for entry in entries {
        let mut entry = entry.map_err(|e| match super::tar_guard::Refused::in_error(&e) {
            Some(super::tar_guard::Refused::Sparse { entry }) => ArchiveError::UnsupportedType {
                entry: entry.clone(),
                kind: "sparse file".into(),
            },
            _ => ArchiveError::Corrupt(e),
        })?;
        let header_type = entry.header().entry_type();
        if matches!(
            header_type,
            tar::EntryType::XGlobalHeader | tar::EntryType::XHeader
        ) {
            continue;
        }
        stats.entries += 1;
        if stats.entries > policy.max_entries {
            return Err(ArchiveError::TooManyEntries {
                limit: policy.max_entries,
            });
        }
        let raw_path = entry.path_bytes().into_owned();
        let name = String::from_utf8_lossy(&raw_path).into_owned();
        let components = safe_components(&raw_path, &name)?;
        charge().map_err(|source| ArchiveError::Io {
            entry: name.clone(),
            source,
        })?;
        let size = entry.header().size().map_err(ArchiveError::Corrupt)?;
        if size > policy.max_entry_bytes {
            return Err(ArchiveError::EntryTooLarge {
                entry: name,
                size,
                limit: policy.max_entry_bytes,
            });
        }
        if stats.bytes + size > policy.max_total_bytes {
            return Err(ArchiveError::TotalTooLarge {
                entry: name,
                limit: policy.max_total_bytes,
            });
        }
        let header = entry.header().clone();
        let raw_mode = header.mode().map_err(ArchiveError::Corrupt)?;
        let mode = match policy.kind {
            ArchiveKind::Upload => raw_mode & 0o777,
            ArchiveKind::Layer => raw_mode & 0o7777,
        };
        let owner = match policy.kind {
            ArchiveKind::Upload => None,
            ArchiveKind::Layer => {
                let uid = header.uid().map_err(ArchiveError::Corrupt)?;
                let gid = header.gid().map_err(ArchiveError::Corrupt)?;
                let owner_err = |source| ArchiveError::Owner {
                    entry: name.clone(),
                    source,
                };
                Some(match policy.owners {
                    Some(ids) => (
                        ids.to_host("uid", uid).map_err(owner_err)?,
                        ids.to_host("gid", gid).map_err(owner_err)?,
                    ),
                    None => (uid as u32, gid as u32),
                })
            }
        };
        let mtime = header.mtime().unwrap_or(0) as i64;
        let io_err = |e: io::Error| ArchiveError::Io {
            entry: name.clone(),
            source: e,
        };

        let Some((leaf, parents)) = components.split_last() else {
            // The root itself ("./"): layers carry its mode and owner, uploads ignore it.
            if header_type == tar::EntryType::Directory && policy.kind == ArchiveKind::Layer {
                apply_meta(&root, None, mode, owner, None).map_err(io_err)?;
                directory_times.push((Vec::new(), name, mtime));
            }
            continue;
        };
        // A directory the archive names only as a parent is the sandbox root's, as one made
        // by `mkdir -p` in the sandbox would be.
        let implied_owner = policy.owners.map(|ids| (ids.base(), ids.base()));
        let parent = open_dirs(&root, parents, true, implied_owner, &name)?;

        if policy.kind == ArchiveKind::Layer {
            match whiteout(leaf, &name)? {
                Some(Whiteout::Opaque) => {
                    set_opaque(&parent).map_err(io_err)?;
                    continue;
                }
                Some(Whiteout::Hides(hidden)) => {
                    remove_existing(&parent, &hidden, &name, true)?;
                    rustix::fs::mknodat(
                        &parent,
                        hidden.as_os_str(),
                        FileType::CharacterDevice,
                        Mode::empty(),
                        rustix::fs::makedev(0, 0),
                    )
                    .map_err(|e| io_err(e.into()))?;
                    continue;
                }
                None => {}
            }
        }

        match header_type {
            tar::EntryType::Directory => {
                match rustix::fs::statat(&parent, leaf.as_os_str(), AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {}
                    Ok(_) => {
                        remove_existing(&parent, leaf, &name, false)?;
                        mkdir(&parent, leaf).map_err(io_err)?;
                    }
                    Err(_) => mkdir(&parent, leaf).map_err(io_err)?,
                }
                let dir = open_dirs(&parent, std::slice::from_ref(leaf), false, None, &name)?;
                apply_meta(&dir, None, mode, owner, None).map_err(io_err)?;
                if policy.kind == ArchiveKind::Layer {
                    directory_times.push((components.clone(), name.clone(), mtime));
                }
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                remove_existing(&parent, leaf, &name, false)?;
                let file = rustix::fs::openat(
                    &parent,
                    leaf.as_os_str(),
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
                .map_err(|e| io_err(e.into()))?;
                let mut out = std::fs::File::from(file);
                let limit = policy
                    .max_entry_bytes
                    .min(policy.max_total_bytes - stats.bytes);
                let written =
                    io::copy(&mut (&mut entry).take(limit + 1), &mut out).map_err(io_err)?;
                if written > limit {
                    return Err(ArchiveError::EntryTooLarge {
                        entry: name,
                        size: written,
                        limit,
                    });
                }
                stats.bytes += written;
                apply_meta(&out.as_fd(), None, mode, owner, Some(mtime)).map_err(io_err)?;
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .map(|b| b.into_owned())
                    .unwrap_or_default();
                remove_existing(&parent, leaf, &name, false)?;
                rustix::fs::symlinkat(OsStr::from_bytes(&target), &parent, leaf.as_os_str())
                    .map_err(|e| io_err(e.into()))?;
                if let Some((uid, gid)) = owner {
                    rustix::fs::chownat(
                        &parent,
                        leaf.as_os_str(),
                        Some(rustix::fs::Uid::from_raw(uid)),
                        Some(rustix::fs::Gid::from_raw(gid)),
                        AtFlags::SYMLINK_NOFOLLOW,
                    )
                    .map_err(|e| io_err(e.into()))?;
                }
                set_mtime_at(&parent, leaf, mtime).map_err(io_err)?;
            }
            tar::EntryType::Link => {
                let target = entry
                    .link_name_bytes()
                    .map(|b| b.into_owned())
                    .unwrap_or_default();
                let target_name = String::from_utf8_lossy(&target).into_owned();
                let target_parts =
                    safe_components(&target, &name).map_err(|_| ArchiveError::LinkEscapes {
                        entry: name.clone(),
                        target: target_name.clone(),
                    })?;
                let Some((tleaf, tparents)) = target_parts.split_last() else {
                    return Err(ArchiveError::LinkEscapes {
                        entry: name,
                        target: target_name,
                    });
                };
                let tparent = open_dirs(&root, tparents, false, None, &name)?;
                remove_existing(&parent, leaf, &name, false)?;
                rustix::fs::linkat(
                    &tparent,
                    tleaf.as_os_str(),
                    &parent,
                    leaf.as_os_str(),
                    AtFlags::empty(),
                )
                .map_err(|e| io_err(e.into()))?;
            }
            other => {
                let kind = match other {
                    tar::EntryType::Char => "character device",
                    tar::EntryType::Block => "block device",
                    tar::EntryType::Fifo => "fifo",
                    tar::EntryType::GNUSparse => "sparse file",
                    _ => "entry of an unsupported type",
                };
                return Err(ArchiveError::UnsupportedType {
                    entry: name,
                    kind: kind.to_string(),
                });
            }
        }
    }
    // Reopened by name, never followed through a symlink, as every entry was; later entries
    // for one directory win, as they would have. A directory a later entry replaced (a
    // whiteout, a file, a link) has no time to set.
    for (parts, name, mtime) in directory_times {
        let dir = match open_dirs(&root, &parts, false, None, &name) {
            Ok(dir) => dir,
            Err(ArchiveError::ThroughLink { .. }) => continue,
            Err(e) => return Err(e),
        };
        set_mtime(&dir, mtime).map_err(|e| ArchiveError::Io {
            entry: name,
            source: e,
        })?;
    }
    Ok(stats)
}

fn mkdir(parent: &OwnedFd, name: &Component) -> io::Result<()> {
    rustix::fs::mkdirat(parent, name.as_os_str(), Mode::from_raw_mode(0o755)).map_err(Into::into)
}

/// Opens `parts` below `base` one component at a time, never following a symlink; missing
/// directories are created (0755, owned by `owner` when given) when `create` is set.
fn open_dirs(
    base: &OwnedFd,
    parts: &[Component],
    create: bool,
    owner: Option<(u32, u32)>,
    entry: &str,
) -> Result<OwnedFd, ArchiveError> {
    let io_err = |e: io::Error| ArchiveError::Io {
        entry: entry.to_string(),
        source: e,
    };
    let mut current = rustix::io::dup(base).map_err(|e| io_err(e.into()))?;
    for part in parts {
        let next = match open_dir(&current, part) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) if create => {
                mkdir(&current, part).map_err(io_err)?;
                let made = open_dir(&current, part).map_err(|e| io_err(e.into()))?;
                if let Some((uid, gid)) = owner {
                    rustix::fs::fchown(
                        &made,
                        Some(rustix::fs::Uid::from_raw(uid)),
                        Some(rustix::fs::Gid::from_raw(gid)),
                    )
                    .map_err(|e| io_err(e.into()))?;
                }
                made
            }
            // ELOOP: a symlink (O_NOFOLLOW, RESOLVE_NO_SYMLINKS); ENOTDIR: not a directory;
            // EXDEV: the kernel saw the path leave `current` (RESOLVE_BENEATH).
            Err(rustix::io::Errno::LOOP)
            | Err(rustix::io::Errno::NOTDIR)
            | Err(rustix::io::Errno::XDEV) => {
                return Err(ArchiveError::ThroughLink {
                    entry: entry.to_string(),
                })
            }
            Err(e) => return Err(io_err(e.into())),
        };
        current = next;
    }
    Ok(current)
}

/// Removes a non-directory at `name`. A directory there is an error, unless `recursive` (a
/// whiteout hides whatever was below, directories included).
fn remove_existing(
    parent: &OwnedFd,
    name: &Component,
    entry: &str,
    recursive: bool,
) -> Result<(), ArchiveError> {
    let io_err = |e: io::Error| ArchiveError::Io {
        entry: entry.to_string(),
        source: e,
    };
    match rustix::fs::statat(parent, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW) {
        Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(e) => Err(io_err(e.into())),
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
            if !recursive {
                return Err(ArchiveError::ReplacesDirectory {
                    entry: entry.to_string(),
                });
            }
            let dir = open_dirs(parent, std::slice::from_ref(name), false, None, entry)?;
            super::tree_walk::empty(&dir).map_err(io_err)?;
            rustix::fs::unlinkat(parent, name.as_os_str(), AtFlags::REMOVEDIR)
                .map_err(|e| io_err(e.into()))
        }
        Ok(_) => rustix::fs::unlinkat(parent, name.as_os_str(), AtFlags::empty())
            .map_err(|e| io_err(e.into())),
    }
}

fn apply_meta(
    fd: &impl AsFd,
    _unused: Option<()>,
    mode: u32,
    owner: Option<(u32, u32)>,
    mtime: Option<i64>,
) -> io::Result<()> {
    // chown first: it clears setuid/setgid bits, which chmod then restores.
    if let Some((uid, gid)) = owner {
        rustix::fs::fchown(
            fd,
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
        )?;
    }
    rustix::fs::fchmod(fd, Mode::from_raw_mode(mode))?;
    if let Some(secs) = mtime {
        set_mtime(fd, secs)?;
    }
    Ok(())
}

/// Sets an open file's access and modification times to `secs`.
fn set_mtime(fd: &impl AsFd, secs: i64) -> io::Result<()> {
    let t = rustix::fs::Timespec {
        tv_sec: secs,
        tv_nsec: 0,
    };
    rustix::fs::futimens(
        fd,
        &Timestamps {
            last_access: t,
            last_modification: t,
        },
    )?;
    Ok(())
}

fn set_mtime_at(parent: &OwnedFd, name: &Component, secs: i64) -> io::Result<()> {
    let t = rustix::fs::Timespec {
        tv_sec: secs,
        tv_nsec: 0,
    };
    rustix::fs::utimensat(
        parent,
        name.as_os_str(),
        &Timestamps {
            last_access: t,
            last_modification: t,
        },
        AtFlags::SYMLINK_NOFOLLOW,
    )
    .map_err(Into::into)
}

fn set_opaque(dir: &OwnedFd) -> io::Result<()> {
    rustix::fs::fsetxattr(
        dir,
        OVERLAY_OPAQUE_XATTR,
        b"y",
        rustix::fs::XattrFlags::empty(),
    )
    .map_err(Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_with(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        build(&mut b);
        b.into_inner().unwrap()
    }

    fn header(kind: tar::EntryType, size: u64, mode: u32) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h
    }

    /// Writes a raw name into the header, bypassing the tar crate's own path checks, the way a
    /// hostile archive would.
    fn raw_entry(
        b: &mut tar::Builder<Vec<u8>>,
        kind: tar::EntryType,
        name: &str,
        link: &str,
        data: &[u8],
    ) {
        let mut h = header(kind, data.len() as u64, 0o644);
        let gnu = h.as_gnu_mut().unwrap();
        gnu.name[..name.len()].copy_from_slice(name.as_bytes());
        gnu.linkname[..link.len()].copy_from_slice(link.as_bytes());
        // A well-formed sparse header (real size 0, empty map), so the type itself is judged.
        gnu.realsize.copy_from_slice(b"00000000000\0");
        for s in gnu.sparse.iter_mut() {
            s.offset.copy_from_slice(b"00000000000\0");
            s.numbytes.copy_from_slice(b"00000000000\0");
        }
        h.set_cksum();
        b.append(&h, data).unwrap();
    }

    fn run(
        archive: &[u8],
        policy: &ArchivePolicy,
    ) -> (tempfile::TempDir, Result<ExtractStats, ArchiveError>) {
        let outer = tempfile::tempdir().unwrap();
        std::fs::create_dir(outer.path().join("dest")).unwrap();
        let r = extract(archive, &outer.path().join("dest"), policy);
        (outer, r)
    }

    #[test]
    fn dotdot_and_absolute_names_are_rejected_by_name() {
        for name in ["../escape.txt", "a/../../escape.txt", "/etc/escape.txt"] {
            let a = tar_with(|b| raw_entry(b, tar::EntryType::Regular, name, "", b"x"));
            let (outer, r) = run(&a, &ArchivePolicy::upload());
            let err = r.unwrap_err();
            assert!(
                matches!(err, ArchiveError::UnsafePath { ref entry } if entry == name),
                "{err}"
            );
            assert!(err.to_string().contains(name));
            assert!(!outer.path().join("escape.txt").exists());
        }
    }

    #[test]
    fn writing_through_a_symlink_is_refused() {
        let outer = tempfile::tempdir().unwrap();
        let a = tar_with(|b| {
            raw_entry(
                b,
                tar::EntryType::Symlink,
                "link",
                outer.path().to_str().unwrap(),
                b"",
            );
            raw_entry(b, tar::EntryType::Regular, "link/canary", "", b"x");
        });
        std::fs::create_dir(outer.path().join("dest")).unwrap();
        let err =
            extract(&a[..], &outer.path().join("dest"), &ArchivePolicy::upload()).unwrap_err();
        assert!(matches!(err, ArchiveError::ThroughLink { .. }), "{err}");
        assert!(!outer.path().join("canary").exists());
        // The link itself is stored as it was.
        assert_eq!(
            std::fs::read_link(outer.path().join("dest/link")).unwrap(),
            outer.path()
        );
    }

    #[test]
    fn a_regular_file_over_a_symlink_replaces_the_link_instead_of_following_it() {
        let outer = tempfile::tempdir().unwrap();
        let canary = outer.path().join("canary");
        std::fs::write(&canary, b"host").unwrap();
        let a = tar_with(|b| {
            raw_entry(
                b,
                tar::EntryType::Symlink,
                "f",
                canary.to_str().unwrap(),
                b"",
            );
            raw_entry(b, tar::EntryType::Regular, "f", "", b"archive");
        });
        std::fs::create_dir(outer.path().join("dest")).unwrap();
        extract(&a[..], &outer.path().join("dest"), &ArchivePolicy::upload()).unwrap();
        assert_eq!(std::fs::read(&canary).unwrap(), b"host");
        assert_eq!(
            std::fs::read(outer.path().join("dest/f")).unwrap(),
            b"archive"
        );
    }

    #[test]
    fn hardlinks_outside_the_root_are_rejected() {
        for target in ["../../etc/passwd", "/etc/passwd"] {
            let a = tar_with(|b| raw_entry(b, tar::EntryType::Link, "h", target, b""));
            let (_o, r) = run(&a, &ArchivePolicy::upload());
            assert!(matches!(r.unwrap_err(), ArchiveError::LinkEscapes { .. }));
        }
        let a = tar_with(|b| {
            raw_entry(b, tar::EntryType::Regular, "a", "", b"data");
            raw_entry(b, tar::EntryType::Link, "b", "a", b"");
        });
        let (o, r) = run(&a, &ArchivePolicy::upload());
        r.unwrap();
        assert_eq!(std::fs::read(o.path().join("dest/b")).unwrap(), b"data");
    }

    #[test]
    fn devices_fifos_and_sparse_files_are_rejected() {
        for kind in [
            tar::EntryType::Char,
            tar::EntryType::Block,
            tar::EntryType::Fifo,
            tar::EntryType::GNUSparse,
        ] {
            let a = tar_with(|b| raw_entry(b, kind, "dev", "", b""));
            let (o, r) = run(&a, &ArchivePolicy::upload());
            assert!(
                matches!(r.unwrap_err(), ArchiveError::UnsupportedType { .. }),
                "{kind:?}"
            );
            assert!(!o.path().join("dest/dev").exists());
        }
    }

    #[test]
    fn setuid_setgid_and_sticky_bits_are_stripped_from_uploads_only() {
        use std::os::unix::fs::PermissionsExt;
        let a = tar_with(|b| {
            let mut h = header(tar::EntryType::Regular, 1, 0o7755);
            b.append_data(&mut h, "suid", &b"x"[..]).unwrap();
        });
        let (o, r) = run(&a, &ArchivePolicy::upload());
        r.unwrap();
        let m = std::fs::metadata(o.path().join("dest/suid"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(m & 0o7777, 0o755);
        let (o, r) = run(&a, &ArchivePolicy::layer());
        r.unwrap();
        let m = std::fs::metadata(o.path().join("dest/suid"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(m & 0o7777, 0o7755);
    }

    #[test]
    fn size_and_count_ceilings_hold() {
        let a = tar_with(|b| {
            for i in 0..5 {
                let mut h = header(tar::EntryType::Regular, 100, 0o644);
                b.append_data(&mut h, format!("f{i}"), &[0u8; 100][..])
                    .unwrap();
            }
        });
        let mut p = ArchivePolicy::upload();
        p.max_entry_bytes = 99;
        assert!(matches!(
            run(&a, &p).1.unwrap_err(),
            ArchiveError::EntryTooLarge { .. }
        ));
        let mut p = ArchivePolicy::upload();
        p.max_total_bytes = 250;
        assert!(matches!(
            run(&a, &p).1.unwrap_err(),
            ArchiveError::TotalTooLarge { .. }
        ));
        let mut p = ArchivePolicy::upload();
        p.max_entries = 4;
        assert!(matches!(
            run(&a, &p).1.unwrap_err(),
            ArchiveError::TooManyEntries { .. }
        ));
        let stats = run(&a, &ArchivePolicy::upload()).1.unwrap();
        assert_eq!((stats.entries, stats.bytes), (5, 500));
    }

    #[test]
    fn a_whiteout_must_name_an_entry_of_its_own_directory() {
        for name in [".wh...", "a/.wh...", ".wh..", ".wh.", "a/b/.wh.."] {
            let a = tar_with(|b| {
                raw_entry(b, tar::EntryType::Directory, "a/b/", "", b"");
                raw_entry(b, tar::EntryType::Regular, "a/b/keep", "", b"k");
                raw_entry(b, tar::EntryType::Regular, name, "", b"");
            });
            let outer = tempfile::tempdir().unwrap();
            std::fs::write(outer.path().join("sibling"), b"s").unwrap();
            std::fs::create_dir(outer.path().join("dest")).unwrap();
            let err =
                extract(&a[..], &outer.path().join("dest"), &ArchivePolicy::layer()).unwrap_err();
            assert!(
                matches!(err, ArchiveError::BadWhiteout { ref entry, .. } if entry == name),
                "{name}: {err}"
            );
            assert!(err.to_string().contains("whiteout"), "{err}");
            assert_eq!(std::fs::read(outer.path().join("sibling")).unwrap(), b"s");
            assert_eq!(
                std::fs::read(outer.path().join("dest/a/b/keep")).unwrap(),
                b"k"
            );
        }
        // In an upload, the same names are only files.
        let a = tar_with(|b| raw_entry(b, tar::EntryType::Regular, ".wh...", "", b"u"));
        let (o, r) = run(&a, &ArchivePolicy::upload());
        r.unwrap();
        assert_eq!(std::fs::read(o.path().join("dest/.wh...")).unwrap(), b"u");
    }

    #[test]
    fn whiteouts_and_the_opaque_marker_still_apply_and_aufs_metadata_is_refused() {
        let a = tar_with(|b| {
            raw_entry(b, tar::EntryType::Regular, "gone", "", b"x");
            raw_entry(b, tar::EntryType::Directory, "d/", "", b"");
            raw_entry(b, tar::EntryType::Regular, "d/inner", "", b"y");
            raw_entry(b, tar::EntryType::Regular, ".wh.gone", "", b"");
            raw_entry(b, tar::EntryType::Regular, ".wh.d", "", b"");
            raw_entry(b, tar::EntryType::Directory, "o/", "", b"");
            raw_entry(b, tar::EntryType::Regular, "o/.wh..wh..opq", "", b"");
        });
        let (o, r) = run(&a, &ArchivePolicy::layer());
        r.unwrap();
        for hidden in ["gone", "d"] {
            let meta = std::fs::symlink_metadata(o.path().join("dest").join(hidden)).unwrap();
            use std::os::unix::fs::{FileTypeExt, MetadataExt};
            assert!(
                meta.file_type().is_char_device() && meta.rdev() == 0,
                "{hidden}"
            );
        }
        let mut buf = [0u8; 4];
        let n = rustix::fs::getxattr(o.path().join("dest/o"), OVERLAY_OPAQUE_XATTR, &mut buf);
        assert_eq!(n.ok().map(|n| &buf[..n]), Some(&b"y"[..]));

        let a = tar_with(|b| raw_entry(b, tar::EntryType::Directory, ".wh..wh.plnk/", "", b""));
        let err = run(&a, &ArchivePolicy::layer()).1.unwrap_err();
        assert!(
            matches!(err, ArchiveError::WhiteoutMetadata { .. }),
            "{err}"
        );
    }

    #[test]
    fn a_component_is_one_normal_name() {
        for bad in [&b""[..], b".", b"..", b"a/b", b"/", b"a\0b"] {
            assert!(Component::new(bad).is_none(), "{bad:?}");
        }
        for good in [&b"a"[..], b"...", b".wh...", b"..a", b"\xff"] {
            assert_eq!(Component::new(good).unwrap().as_bytes(), good);
        }
    }

    #[test]
    fn gzip_is_sniffed() {
        let a = tar_with(|b| {
            let mut h = header(tar::EntryType::Regular, 2, 0o644);
            b.append_data(&mut h, "z", &b"hi"[..]).unwrap();
        });
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        std::io::Write::write_all(&mut gz, &a).unwrap();
        let (o, r) = run(&gz.finish().unwrap(), &ArchivePolicy::upload());
        r.unwrap();
        assert_eq!(std::fs::read(o.path().join("dest/z")).unwrap(), b"hi");
    }
}
