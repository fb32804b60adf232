//! Layers: OCI layer tars built from overlay upper directories, and the node's cache of
//! extracted layers that overlay mounts as lower directories.
//!
//! Format of a sealed layer (deterministic: one directory always gives the same sha256):
//! * uncompressed tar, GNU headers, depth first with each directory's entries in byte order
//!   of their names on disk (a whiteout sorts by the name it hides), no entry for the root;
//! * numeric owners only (no user or group names), no atime or ctime;
//! * mtime policy: the file's own mtime truncated to whole seconds (whiteouts carry 0), so an
//!   unchanged tree reseals to the same digest while tools that compare mtimes keep working;
//! * overlay deletions (0/0 character devices) become OCI whiteouts `.wh.<name>`, and an
//!   opaque directory (`trusted.overlay.opaque=y`) is followed by a `.wh..wh..opq` entry;
//! * hardlinked files inside one layer are stored once plus link entries;
//! * extended attributes are not carried (a known limit: file capabilities are lost).
//!
//! A layer's digest is the sha256 of that tar (the OCI "diff id"). [`LayerCache`] extracts a
//! blob once per node into `layers/<hex>/`, translating whiteouts back to overlay's format;
//! the extraction goes to a locked staging directory ([`super::layer_staging`]), is synced,
//! renamed into place and then marked complete, so concurrent extractions of one layer are safe
//! and a half-extracted layer (or one torn by a host crash) is never mounted: an unmarked tree
//! is extracted again. What a crash leaves in staging is swept once its owner is dead.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::archive_policy::{
    self, ArchivePolicy, OPAQUE_MARKER, OVERLAY_OPAQUE_XATTR, WHITEOUT_PREFIX,
};
use super::blob_store::{BlobStore, BlobWriter};
use super::error::{Result, VmmError};
use super::id_range::{IdRange, Owners};
use super::layer_staging::{self, Staging};
use crate::domain::ids::Digest;

/// A sealed layer: its digest and the size of its tar.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LayerRef {
    pub digest: Digest,
    pub size: u64,
}

/// Writes the deterministic layer tar of an overlay-format directory to `out`.
pub fn write_layer_tar(dir: &Path, owners: Owners, out: impl Write) -> Result<()> {
    write_tar(dir, AnyWriter(out), Tidy::Leave, owners)
}

/// Where a layer tar goes. File contents go through [`TarOut::file_contents`], so that a blob
/// writer can read them straight into its chunks in whole MiBs instead of through the tar
/// crate's 8 KiB copies.
pub(super) trait TarOut: Write {
    /// Appends exactly `len` bytes of `file` (the entry's header is already written).
    fn file_contents(&mut self, file: &fs::File, len: u64) -> io::Result<()>;
}

impl TarOut for BlobWriter {
    fn file_contents(&mut self, file: &fs::File, len: u64) -> io::Result<()> {
        self.copy_file(file, len)
    }
}

impl<T: TarOut + ?Sized> TarOut for &mut T {
    fn file_contents(&mut self, file: &fs::File, len: u64) -> io::Result<()> {
        (**self).file_contents(file, len)
    }
}

/// Any writer, fed by plain copies.
struct AnyWriter<W>(W);

impl<W: Write> Write for AnyWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl<W: Write> TarOut for AnyWriter<W> {
    fn file_contents(&mut self, file: &fs::File, len: u64) -> io::Result<()> {
        let copied = io::copy(&mut io::Read::take(file, len), &mut self.0)?;
        if copied < len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the file is shorter than when it was listed",
            ));
        }
        Ok(())
    }
}

/// Zeroes after `len` bytes of contents, up to the next 512-byte block, as tar entries end.
fn pad_to_block(out: &mut impl Write, len: u64) -> io::Result<()> {
    let tail = (len % 512) as usize;
    if tail != 0 {
        out.write_all(&[0u8; 512][tail..])?;
    }
    Ok(())
}

/// Whether sealing also makes the directory itself equal to the tree an extraction of its tar
/// would give ([`seal_into_cache`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tidy {
    Leave,
    /// Drops what the tar does not carry: device nodes and sockets, extended attributes other
    /// than the opaque marker, sub-second file mtimes.
    AsExtracted,
}

fn write_tar(dir: &Path, out: impl TarOut, tidy: Tidy, owners: Owners) -> Result<()> {
    let mut builder = tar::Builder::new(out);
    builder.mode(tar::HeaderMode::Complete);
    let mut links = HashMap::new();
    let mut walk_state = Walk {
        builder: &mut builder,
        links: &mut links,
        tidy,
        owners,
    };
    walk_state.tree(dir)?;
    builder
        .into_inner()
        .and_then(|mut w| w.flush())
        .map_err(VmmError::io("finishing a layer tar"))?;
    Ok(())
}

/// Whether an overlay upper directory holds no change at all (no entry, not even a whiteout).
pub fn is_empty_dir(dir: &Path) -> Result<bool> {
    let mut entries =
        fs::read_dir(dir).map_err(VmmError::io(format!("reading {}", dir.display())))?;
    Ok(entries.next().is_none())
}

/// Seals `dir` into the blob store and returns the layer; `owners` says whether its owners are
/// in-sandbox ids already (a root filesystem made on the host) or a sandbox tree's host ids.
pub fn seal_dir(dir: &Path, blobs: &dyn BlobStore, owners: Owners) -> Result<LayerRef> {
    seal(dir, blobs, Tidy::Leave, owners)
}

fn seal(dir: &Path, blobs: &dyn BlobStore, tidy: Tidy, owners: Owners) -> Result<LayerRef> {
    let started = std::time::Instant::now();
    let mut writer = blobs.writer()?;
    write_tar(dir, &mut writer, tidy, owners)?;
    let written = started.elapsed();
    let (digest, size) = writer.commit()?;
    tracing::debug!(
        write_ms = written.as_secs_f64() * 1e3,
        commit_ms = (started.elapsed() - written).as_secs_f64() * 1e3,
        "layer tar written and committed"
    );
    Ok(LayerRef { digest, size })
}

/// Seals an overlay upper directory into the blob store and makes that same directory the
/// layer's tree in `cache`, instead of extracting the tar just written back out of the blob:
/// the directory is read once (hashed as the tar is written), tidied in place to exactly what an
/// extraction would give, and renamed into the cache, where it is synced and marked complete in
/// the background (`src/vmm/layer_sync.rs`): the blob is durable when this returns, the tree is a
/// cache of it. `dir` is consumed either way.
/// Falls back to extracting when `dir` is on another filesystem than the cache.
pub fn seal_into_cache(dir: &Path, blobs: &dyn BlobStore, cache: &LayerCache) -> Result<LayerRef> {
    let started = std::time::Instant::now();
    let layer = seal(dir, blobs, Tidy::AsExtracted, Owners::Mapped(cache.ids()))?;
    tracing::debug!(
        seal_ms = started.elapsed().as_secs_f64() * 1e3,
        bytes = layer.size,
        "layer sealed"
    );
    if cache.contains(&layer.digest) {
        let _ = fs::remove_dir_all(dir);
        return Ok(layer);
    }
    let adopting = std::time::Instant::now();
    match cache.adopt(dir, &layer.digest)? {
        Adopted::Yes => tracing::debug!(
            adopt_ms = adopting.elapsed().as_secs_f64() * 1e3,
            "sealed tree adopted"
        ),
        Adopted::OtherFilesystem => {
            let _ = fs::remove_dir_all(dir);
            cache.ensure(blobs, &layer.digest)?;
        }
    }
    Ok(layer)
}

/// Seals `dir` into the blob store and, from the same tar stream as it is written, extracts
/// the layer's tree into a staging directory of `cache`, which is then adopted as
/// [`seal_into_cache`] adopts an upper (synced in the background). `dir` is left as it is: an
/// upper on a sandbox's scratch disk (another filesystem than the cache), where the sealed
/// upper keeps counting against the build's limit until the sandbox ends. The tree never comes
/// from the blob store: a GC pass may delete the blob before the checkpoint is recorded (the
/// tree republishes it then), and on an object store it would be a download.
pub fn seal_beside_cache(
    dir: &Path,
    blobs: &dyn BlobStore,
    cache: &LayerCache,
) -> Result<LayerRef> {
    let started = std::time::Instant::now();
    let staging = cache.unsealed_staging()?;
    let mut writer = blobs.writer()?;
    let tee = super::layer_tee::Tee::start(&mut writer, staging.path(), cache.ids());
    let written = tee.and_then(|mut tee| {
        let wrote = write_tar(dir, &mut tee, Tidy::Leave, Owners::Mapped(cache.ids()));
        let extracted = tee.finish();
        wrote.and(extracted)
    });
    written?;
    let (digest, size) = writer.commit()?;
    let layer = LayerRef { digest, size };
    tracing::debug!(
        seal_ms = started.elapsed().as_secs_f64() * 1e3,
        bytes = layer.size,
        "layer sealed and extracted beside it"
    );
    if !cache.contains(&layer.digest) {
        cache.adopt_staged(staging, &layer.digest)?;
    }
    Ok(layer)
}

/// Whether [`LayerCache::adopt`] could move a tree into the cache.
enum Adopted {
    Yes,
    OtherFilesystem,
}

/// Makes `path` (not followed if a symlink) hold no extended attribute except overlay's opaque
/// marker, as a tree extracted from a layer tar holds none.
fn strip_xattrs(path: &Path) -> io::Result<()> {
    let mut names = vec![0u8; 1024];
    let n = loop {
        match rustix::fs::llistxattr(path, &mut names) {
            Ok(n) => break n,
            Err(rustix::io::Errno::RANGE) => names.resize(names.len() * 4, 0),
            Err(rustix::io::Errno::NOTSUP) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    };
    for name in names[..n].split(|&b| b == 0).filter(|n| !n.is_empty()) {
        if name != OVERLAY_OPAQUE_XATTR.as_bytes() {
            let name = std::ffi::OsStr::from_bytes(name);
            rustix::fs::lremovexattr(path, name)?;
        }
    }
    Ok(())
}

/// Truncates `path`'s mtime (not followed) to whole seconds, as a tar records it.
fn whole_second_mtime(path: &Path, meta: &fs::Metadata) -> io::Result<()> {
    if meta.mtime_nsec() == 0 {
        return Ok(());
    }
    let at = rustix::fs::Timestamps {
        last_access: rustix::fs::Timespec {
            tv_sec: meta.atime(),
            tv_nsec: meta.atime_nsec() as _,
        },
        last_modification: rustix::fs::Timespec {
            tv_sec: meta.mtime(),
            tv_nsec: 0,
        },
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        path,
        &at,
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .map_err(Into::into)
}

fn base_header(
    meta: &fs::Metadata,
    kind: tar::EntryType,
    owners: Owners,
    rel_path: &Path,
) -> Result<tar::Header> {
    let owner_err = |e| VmmError::Seal(format!("{}: {e}", rel_path.display()));
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_uid(owners.to_sandbox("uid", meta.uid()).map_err(owner_err)? as u64);
    h.set_gid(owners.to_sandbox("gid", meta.gid()).map_err(owner_err)? as u64);
    h.set_mode(meta.mode() & 0o7777);
    h.set_mtime(meta.mtime().max(0) as u64);
    h.set_size(0);
    Ok(h)
}

/// A tenant's file named `.wh.<x>` would be a whiteout in the layer tar, deleting `<x>` (or,
/// for `.wh..`, `.wh...`, a whole directory) wherever the layer is extracted: the OCI image
/// spec reserves the prefix, so the checkpoint refuses the name and says which file it is
/// (docs/adr/0034).
fn reserved_name(rel_path: &Path) -> VmmError {
    VmmError::Seal(format!(
        "/{}: a file name beginning with \".wh.\" is reserved for layer whiteouts (OCI image \
         spec) and cannot be kept in a layer; rename or remove it before the step ends",
        rel_path.display()
    ))
}

/// The header of a whiteout or an opaque marker: an empty file owned by root, mode 0600, time 0.
fn marker_header() -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o600);
    h.set_size(0);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h
}

fn is_opaque(path: &Path) -> bool {
    let mut buf = [0u8; 8];
    matches!(rustix::fs::lgetxattr(path, OVERLAY_OPAQUE_XATTR, &mut buf), Ok(1) if buf[0] == b'y')
}

/// One sealing walk: where the tar goes, the hardlinks seen so far, and how the tree is tidied
/// and its owners recorded.
struct Walk<'a, W: TarOut> {
    builder: &'a mut tar::Builder<W>,
    links: &'a mut HashMap<(u64, u64), PathBuf>,
    tidy: Tidy,
    owners: Owners,
}

/// A directory being walked: where it is, where it goes in the layer, and its entries not yet
/// walked (sorted, so the tar does not depend on the order the filesystem lists them in).
struct Level {
    dir: PathBuf,
    rel: PathBuf,
    names: std::vec::IntoIter<std::ffi::OsString>,
}

impl Level {
    fn read(dir: PathBuf, rel: PathBuf) -> Result<Level> {
        let mut names: Vec<_> = fs::read_dir(&dir)
            .map_err(VmmError::io(format!("reading {}", dir.display())))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<io::Result<_>>()
            .map_err(VmmError::io(format!("reading {}", dir.display())))?;
        names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        Ok(Level {
            dir,
            rel,
            names: names.into_iter(),
        })
    }
}

impl<W: TarOut> Walk<'_, W> {
    /// Writes the tree under `root`, depth first, with a stack of [`Level`]s instead of a
    /// call per level: a tenant decides how deep the tree is, and a thread's stack must not
    /// (issue 46).
    fn tree(&mut self, root: &Path) -> Result<()> {
        let mut stack = vec![Level::read(root.to_path_buf(), PathBuf::new())?];
        while let Some(level) = stack.last_mut() {
            let Some(name) = level.names.next() else {
                stack.pop();
                continue;
            };
            let (path, rel_path) = (level.dir.join(&name), level.rel.join(&name));
            if self.entry(&name, &path, &rel_path)? {
                stack.push(Level::read(path, rel_path)?);
            }
        }
        Ok(())
    }

    /// Writes one entry; true when it is a directory whose entries come next.
    fn entry(&mut self, name: &std::ffi::OsStr, path: &Path, rel_path: &Path) -> Result<bool> {
        let (tidy, owners) = (self.tidy, self.owners);
        let meta = fs::symlink_metadata(path)
            .map_err(VmmError::io(format!("stat of {}", path.display())))?;
        let ft = meta.file_type();
        let err =
            |what: &str| VmmError::io(format!("adding {} ({what}) to a layer", rel_path.display()));
        let whiteout = ft.is_char_device() && meta.rdev() == 0;
        if name.as_bytes().starts_with(WHITEOUT_PREFIX.as_bytes()) {
            return Err(reserved_name(rel_path));
        }
        if tidy == Tidy::AsExtracted && !whiteout {
            strip_xattrs(path).map_err(err("removing extended attributes"))?;
            if !ft.is_dir() {
                whole_second_mtime(path, &meta).map_err(err("truncating its mtime"))?;
            }
        }
        if whiteout {
            let mut wh_name = std::ffi::OsString::from(WHITEOUT_PREFIX);
            wh_name.push(name);
            self.builder
                .append_data(
                    &mut marker_header(),
                    rel_path.with_file_name(wh_name),
                    io::empty(),
                )
                .map_err(err("whiteout"))?;
        } else if ft.is_dir() {
            let mut h = base_header(&meta, tar::EntryType::Directory, owners, rel_path)?;
            self.builder
                .append_data(&mut h, rel_path, io::empty())
                .map_err(err("directory"))?;
            if is_opaque(path) {
                self.builder
                    .append_data(
                        &mut marker_header(),
                        rel_path.join(OPAQUE_MARKER),
                        io::empty(),
                    )
                    .map_err(err("opaque marker"))?;
            }
            return Ok(true);
        } else if ft.is_file() {
            if meta.nlink() > 1 {
                if let Some(first) = self.links.get(&(meta.dev(), meta.ino())) {
                    let mut h = base_header(&meta, tar::EntryType::Link, owners, rel_path)?;
                    self.builder
                        .append_link(&mut h, rel_path, first)
                        .map_err(err("hardlink"))?;
                    return Ok(false);
                }
                self.links
                    .insert((meta.dev(), meta.ino()), rel_path.to_path_buf());
            }
            let mut h = base_header(&meta, tar::EntryType::Regular, owners, rel_path)?;
            h.set_size(meta.len());
            let file = fs::File::open(path).map_err(err("open"))?;
            // The header (and a long-name entry if needed) through the builder, then the
            // contents and their padding straight into the output.
            self.builder
                .append_data(&mut h, rel_path, io::empty())
                .map_err(err("file header"))?;
            let out = self.builder.get_mut();
            out.file_contents(&file, meta.len())
                .and_then(|()| pad_to_block(out, meta.len()))
                .map_err(err("file"))?;
            // No writeback is started for the tree here: only the blob must reach the disk
            // before the checkpoint returns, and the tree is synced in the background
            // (`src/vmm/layer_sync.rs`), so the walk's disk writes are the blob's alone.
        } else if ft.is_symlink() {
            let target = fs::read_link(path).map_err(err("readlink"))?;
            let mut h = base_header(&meta, tar::EntryType::Symlink, owners, rel_path)?;
            self.builder
                .append_link(&mut h, rel_path, target)
                .map_err(err("symlink"))?;
        } else if ft.is_fifo() {
            let mut h = base_header(&meta, tar::EntryType::Fifo, owners, rel_path)?;
            self.builder
                .append_data(&mut h, rel_path, io::empty())
                .map_err(err("fifo"))?;
        } else {
            // Device nodes (other than whiteouts) and sockets do not travel in layers: a device
            // node in a lower directory would give every later sandbox access to that device.
            tracing::warn!(path = %rel_path.display(), "skipping a device node or socket while sealing a layer");
            if tidy == Tidy::AsExtracted {
                fs::remove_file(path).map_err(err("removing a device node or socket"))?;
            }
        }
        Ok(false)
    }
}

/// The node's extracted layers: `<root>/<hex>/`, overlay-format (whiteouts are 0/0 devices).
///
/// A tree is used only when its completion mark `<root>/<hex>.complete` exists. Extraction
/// writes a temporary tree, syncs the filesystem, renames the tree into place, and only then
/// writes the mark (each step fsynced), so after a host crash a tree is either marked and whole
/// or unmarked and replaced by a fresh extraction (an adopted checkpoint tree is put in place
/// first and synced and marked in the background: `src/vmm/layer_sync.rs`). The mark lives
/// beside the tree, not in it, because the tree is a lower directory of every sandbox on that
/// layer.
/// The node's extracted layers, `<data-dir>/layers/<hex>/`: a cache of the blob store. It may
/// be wiped at any time (every layer is extracted again from its blob on next use) and may be
/// bounded ([`LayerCache::set_budget`], `src/vmm/layer_budget.rs`).
#[derive(Debug, Clone)]
pub struct LayerCache {
    pub(super) root: PathBuf,
    pub(super) budget: super::layer_budget::Budget,
    /// Bumped whenever this process completes or evicts a layer, so the node's residency
    /// report (`src/worker/residency.rs`) follows its cache promptly without rescanning it
    /// all the time. A wipe from outside does not bump it; the report's periodic rescan sees it.
    pub(super) changes: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Trees this process adopted and is syncing in the background (`src/vmm/layer_sync.rs`).
    pub(super) syncing: super::layer_sync::Syncing,
    /// The host ids the trees' owners are written as (ADR 0021).
    ids: IdRange,
}

/// The file in a layer cache's root that names the id range its trees are written for.
const OWNERS_FILE: &str = ".owners";

impl LayerCache {
    /// Opens the cache at `root` for sandboxes with ids `ids`. Trees an older strata extracted
    /// with in-sandbox owners are unmarked (and so extracted again on next use); a cache written
    /// for another range is refused, since its trees would give every file to the wrong owner.
    pub fn open(root: impl Into<PathBuf>, ids: IdRange) -> Result<LayerCache> {
        let root = root.into();
        fs::create_dir_all(&root).map_err(VmmError::io(format!("creating {}", root.display())))?;
        check_owners(&root, ids)?;
        Ok(LayerCache {
            root,
            budget: Default::default(),
            changes: Default::default(),
            syncing: Default::default(),
            ids,
        })
    }

    /// The sandbox id range this cache's trees are written for.
    pub fn ids(&self) -> IdRange {
        self.ids
    }

    /// How many times this process completed or evicted a layer in this cache.
    pub fn changes(&self) -> u64 {
        self.changes.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(super) fn changed(&self) {
        self.changes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The directory the trees are in (on the disk they fill).
    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn path(&self, digest: &Digest) -> PathBuf {
        self.root.join(digest.hex())
    }

    /// Whether `digest` is extracted (and marked complete) on this node, or adopted by this
    /// process and being synced.
    pub fn contains(&self, digest: &Digest) -> bool {
        self.is_complete(digest) || self.is_syncing_here(digest)
    }

    /// A fresh staging directory to extract `digest` into, on the cache's filesystem, locked
    /// (so no sweep removes it) until dropped; hand it to [`Self::publish_staged`] once its
    /// content is verified, or drop it to remove it.
    pub fn staging(&self, digest: &Digest) -> Result<Staging> {
        self.recreate_root()?;
        Staging::create(&self.root, digest)
    }

    /// A fresh staging directory for a tree whose digest is known only once it is sealed
    /// ([`seal_beside_cache`]); locked until dropped or adopted.
    fn unsealed_staging(&self) -> Result<Staging> {
        self.recreate_root()?;
        Staging::create_labelled(&self.root, "unsealed")
    }

    /// Publishes a staged tree written from layer `digest`'s own tar stream, synced in the
    /// background as an adopted upper is.
    fn adopt_staged(&self, staged: Staging, digest: &Digest) -> Result<()> {
        self.publish_syncing_later(staged.path(), digest)?;
        drop(staged);
        Ok(())
    }

    /// Publishes a verified extraction made in [`Self::staging`] as [`Self::ensure`] publishes
    /// its own (synced, renamed, marked complete); a concurrent identical one may have won.
    pub fn publish_staged(&self, staged: Staging, digest: &Digest) -> Result<PathBuf> {
        sync_tree(staged.path()).and_then(|()| self.publish(staged.path(), digest))?;
        drop(staged);
        self.enforce_budget();
        Ok(self.path(digest))
    }

    /// Removes what extractions of dead processes left in the cache (staging directories no
    /// live process holds, torn trees moved aside); run when a backend starts on the node.
    pub fn sweep_leftovers(&self) -> layer_staging::Swept {
        layer_staging::sweep(&self.root)
    }

    /// Moves `tree`, an overlay-format directory whose layer tar hashes to `digest`, into the
    /// cache as that layer's tree (through a locked staging directory), synced and marked
    /// complete in the background (`src/vmm/layer_sync.rs`). The caller
    /// vouches for the content (it wrote the tar from this very tree). On error `tree` is gone.
    fn adopt(&self, tree: &Path, digest: &Digest) -> Result<Adopted> {
        self.recreate_root()?;
        let staged = match Staging::adopt(&self.root, tree, digest) {
            Ok(Some(staged)) => staged,
            Ok(None) => return Ok(Adopted::OtherFilesystem),
            Err(e) => {
                let _ = fs::remove_dir_all(tree);
                return Err(VmmError::io(format!(
                    "moving {} into the layer cache",
                    tree.display()
                ))(e));
            }
        };
        // An extracted tree's root is a fresh directory: the upper's own root carries nothing
        // a layer records.
        let _ = fs::set_permissions(
            staged.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        );
        // On error the staging directory is dropped, which removes it.
        self.publish_syncing_later(staged.path(), digest)?;
        drop(staged);
        Ok(Adopted::Yes)
    }

    /// The cache directory may have been wiped while the node runs: make it again.
    fn recreate_root(&self) -> Result<()> {
        fs::create_dir_all(&self.root)
            .map_err(VmmError::io(format!("creating {}", self.root.display())))
    }

    pub(super) fn mark(&self, digest: &Digest) -> PathBuf {
        self.root.join(format!("{}.complete", digest.hex()))
    }

    pub(super) fn is_complete(&self, digest: &Digest) -> bool {
        self.mark(digest).is_file() && self.path(digest).is_dir()
    }

    /// Returns the extracted directory of `digest`, extracting and verifying it first if it is
    /// absent or was never completed.
    pub fn ensure(&self, blobs: &dyn BlobStore, digest: &Digest) -> Result<PathBuf> {
        let dest = self.path(digest);
        if self.is_complete(digest) {
            self.touch(digest);
            return Ok(dest);
        }
        // One this process is syncing is whole in the page cache: used at once. One another
        // process is syncing is waited for.
        if self.is_syncing_here(digest) {
            return Ok(dest);
        }
        self.wait_for_other_sync(digest);
        if self.is_complete(digest) {
            self.touch(digest);
            return Ok(dest);
        }
        self.recreate_root()?;
        let staging = Staging::create(&self.root, digest)?;
        crate::fault::stop_point("layers:staged");
        let tmp = staging.path();
        let result = (|| {
            let mut reader = blobs.open_verified(digest)?;
            archive_policy::extract_tar(&mut reader, tmp, &ArchivePolicy::layer_for(self.ids))?;
            reader.finish()?;
            sync_tree(tmp)
        })();
        if let Err(e) = result {
            drop(staging);
            if matches!(e, VmmError::DigestMismatch { .. }) {
                // Absent from now on, so a put of the same bytes repairs it.
                let _ = blobs.intact_size(digest);
            }
            return Err(e);
        }
        self.publish(tmp, digest)?;
        drop(staging);
        self.enforce_budget();
        Ok(dest)
    }

    /// Puts a synced temporary tree in place and marks it complete, under a lock so that two
    /// extractions never move aside a tree the other one just completed.
    fn publish(&self, tmp: &Path, digest: &Digest) -> Result<()> {
        let lock = self.publish_lock()?;
        if self.published_meanwhile(tmp, digest) {
            return Ok(());
        }
        let torn = self.move_aside_unmarked(digest)?;
        fs::rename(tmp, self.path(digest))
            .map_err(VmmError::io(format!("publishing layer {digest}")))?;
        self.write_mark(digest)?;
        drop(lock);
        self.changed();
        if let Some(aside) = torn {
            let _ = fs::remove_dir_all(aside);
        }
        Ok(())
    }

    /// The cache's publish lock: whoever holds it may put a tree in place or move one aside.
    pub(super) fn publish_lock(&self) -> Result<fs::File> {
        publish_lock(&self.root)
    }

    /// Whether `digest`'s tree is already in place, complete or being synced (here, or by
    /// another process, which this waits for): then `staged`, an identical tree, is removed.
    /// Under the publish lock.
    pub(super) fn published_meanwhile(&self, staged: &Path, digest: &Digest) -> bool {
        self.wait_for_other_sync(digest);
        let published = self.is_complete(digest) || self.is_syncing_here(digest);
        if published {
            let _ = fs::remove_dir_all(staged);
        }
        published
    }

    /// Moves an unmarked tree of `digest` out of the way (a crash left it, or its sync failed);
    /// returns where, for the caller to remove once the new tree is in place. Under the publish
    /// lock, after [`Self::wait_for_other_sync`].
    pub(super) fn move_aside_unmarked(&self, digest: &Digest) -> Result<Option<PathBuf>> {
        let dest = self.path(digest);
        if fs::symlink_metadata(&dest).is_err() {
            return Ok(None);
        }
        let aside = self.root.join(format!(
            ".torn-{}-{}",
            digest.hex(),
            uuid::Uuid::new_v4().simple()
        ));
        fs::rename(&dest, &aside).map_err(VmmError::io(format!(
            "moving aside incomplete layer {digest}"
        )))?;
        tracing::warn!(%digest, "an extracted layer was never marked complete (a crash during extraction?); extracted it again");
        Ok(Some(aside))
    }
}

/// The publish lock of the layer cache at `root` (see [`LayerCache::publish_lock`]).
/// Makes sure the trees under `root` are written for `ids` ([`LayerCache::open`]).
fn check_owners(root: &Path, ids: IdRange) -> Result<()> {
    let file = root.join(OWNERS_FILE);
    let wanted = format!("{ids}\n");
    match fs::read_to_string(&file) {
        Ok(found) if found == wanted => return Ok(()),
        Ok(found) => {
            return Err(VmmError::Boot(format!(
                "the layer cache {} holds trees for sandbox ids {}, and this node is set to {ids} \
                 (STRATA_SANDBOX_ID_RANGE): set the range it was made with, or remove the \
                 directory (it is a cache of the blob store)",
                root.display(),
                found.trim()
            )))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(VmmError::io(format!("reading {}", file.display()))(e)),
    }
    // Written before ids were mapped: every tree holds in-sandbox owners. Unmarked, each is
    // moved aside and extracted again when next used, as a torn one is.
    let _lock = publish_lock(root)?;
    let entries =
        fs::read_dir(root).map_err(VmmError::io(format!("reading {}", root.display())))?;
    for entry in entries.flatten() {
        if entry.file_name().as_bytes().ends_with(b".complete") {
            fs::remove_file(entry.path()).map_err(VmmError::io(format!(
                "unmarking {}",
                entry.path().display()
            )))?;
        }
    }
    let dir = fs::File::open(root).map_err(VmmError::io(format!("opening {}", root.display())))?;
    dir.sync_all()
        .map_err(VmmError::io(format!("syncing {}", root.display())))?;
    let tmp = root.join(format!("{OWNERS_FILE}.tmp"));
    fs::write(&tmp, &wanted)
        .and_then(|()| fs::File::open(&tmp)?.sync_all())
        .and_then(|()| fs::rename(&tmp, &file))
        .and_then(|()| dir.sync_all())
        .map_err(VmmError::io(format!("writing {}", file.display())))
}

pub(super) fn publish_lock(root: &Path) -> Result<fs::File> {
    lock_exclusive(&root.join(".publish.lock"), "the layer cache")
}

/// Syncs a tree's filesystem: one `syncfs` instead of an fsync per file (a base tree has
/// thousands).
pub(super) fn sync_tree(tree: &Path) -> Result<()> {
    let dir = fs::File::open(tree).map_err(VmmError::io(format!("opening {}", tree.display())))?;
    rustix::fs::syncfs(&dir)
        .map_err(|e| VmmError::io(format!("syncing {}", tree.display()))(e.into()))
}

/// Opens (creating) `path` and takes an exclusive flock on it, waiting for it.
pub(super) fn lock_exclusive(path: &Path, what: &str) -> Result<fs::File> {
    let lock = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(VmmError::io(format!("opening {}", path.display())))?;
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| VmmError::io(format!("locking {what}"))(e.into()))?;
    Ok(lock)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vmm::blob_store::LocalBlobStore;
    use crate::vmm::id_range::IdRange;

    fn sample(dir: &Path) {
        fs::create_dir_all(dir.join("a/b")).unwrap();
        fs::write(dir.join("a/b/file"), "content").unwrap();
        fs::write(dir.join("z"), "z").unwrap();
        std::os::unix::fs::symlink("a/b/file", dir.join("link")).unwrap();
        fs::hard_link(dir.join("z"), dir.join("z-hard")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            dir.join("a/deleted"),
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::empty(),
            rustix::fs::makedev(0, 0),
        )
        .unwrap();
        rustix::fs::setxattr(
            dir.join("a/b"),
            OVERLAY_OPAQUE_XATTR,
            b"y",
            rustix::fs::XattrFlags::empty(),
        )
        .unwrap();
    }

    /// File contents bypass the tar crate (read straight into the blob writer's chunks): the
    /// bytes must still be exactly the tar crate's, for files that span several chunks, end
    /// mid-block, are empty, or need a long-name entry.
    #[test]
    fn file_contents_written_directly_are_the_tar_crates_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("tree");
        fs::create_dir_all(&tree).unwrap();
        let long = "n".repeat(150);
        let files: Vec<(String, Vec<u8>)> = vec![
            (
                "big".into(),
                (0..(3 << 20) + 777).map(|i| (i * 7 % 251) as u8).collect(),
            ),
            ("empty".into(), Vec::new()),
            (long.clone(), b"a file with a long name".to_vec()),
            ("one-block".into(), vec![9u8; 512]),
        ];
        for (name, bytes) in &files {
            fs::write(tree.join(name), bytes).unwrap();
        }
        let mut expected = tar::Builder::new(Vec::new());
        expected.mode(tar::HeaderMode::Complete);
        let mut names: Vec<&(String, Vec<u8>)> = files.iter().collect();
        names.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        for (name, bytes) in names {
            let path = tree.join(name);
            let meta = fs::symlink_metadata(&path).unwrap();
            let mut h = base_header(
                &meta,
                tar::EntryType::Regular,
                Owners::AsSandbox,
                Path::new(name),
            )
            .unwrap();
            h.set_size(bytes.len() as u64);
            expected.append_data(&mut h, name, &bytes[..]).unwrap();
        }
        let expected = expected.into_inner().unwrap();

        let mut plain = Vec::new();
        write_layer_tar(&tree, Owners::AsSandbox, &mut plain).unwrap();
        assert!(plain == expected, "plain writer: tar bytes differ");
        let store = LocalBlobStore::open(dir.path().join("blobs")).unwrap();
        let sealed = seal_dir(&tree, &store, Owners::AsSandbox).unwrap();
        assert_eq!(sealed.digest, Digest::of(&expected));
        assert_eq!(sealed.size, expected.len() as u64);
        let mut stored = Vec::new();
        io::Read::read_to_end(
            &mut store.open_verified(&sealed.digest).unwrap(),
            &mut stored,
        )
        .unwrap();
        assert!(stored == expected, "blob writer: stored bytes differ");
    }

    #[test]
    fn a_tenants_file_named_like_a_whiteout_is_refused_naming_it() {
        let store_dir = tempfile::tempdir().unwrap();
        let blobs = LocalBlobStore::open(store_dir.path().join("blobs")).unwrap();
        for (path, dir) in [
            ("a/.wh...", false),
            (".wh..", false),
            (".wh.", false),
            ("x/.wh..wh..opq", false),
            ("etc/.wh.passwd", true),
        ] {
            let src = tempfile::tempdir().unwrap();
            let full = src.path().join(path);
            fs::create_dir_all(full.parent().unwrap()).unwrap();
            if dir {
                fs::create_dir(&full).unwrap();
            } else {
                fs::write(&full, b"").unwrap();
            }
            let err = seal_dir(src.path(), &blobs, Owners::AsSandbox).unwrap_err();
            assert!(
                err.to_string().contains(&format!(
                    "/{path}: a file name beginning with \".wh.\" is reserved"
                )),
                "{err}"
            );
            let mut out = Vec::new();
            assert!(write_layer_tar(src.path(), Owners::AsSandbox, &mut out).is_err());
        }
    }

    #[test]
    fn sealing_is_deterministic_and_survives_a_round_trip() {
        let store_dir = tempfile::tempdir().unwrap();
        let blobs = LocalBlobStore::open(store_dir.path().join("blobs")).unwrap();
        let cache = LayerCache::open(store_dir.path().join("layers"), IdRange::default()).unwrap();
        let src = tempfile::tempdir().unwrap();
        sample(src.path());
        let first = seal_dir(src.path(), &blobs, Owners::AsSandbox).unwrap();
        assert_eq!(
            seal_dir(src.path(), &blobs, Owners::AsSandbox).unwrap(),
            first
        );
        // The tar holds OCI whiteouts, not device nodes.
        let mut names = Vec::new();
        let mut r = blobs.open_verified(&first.digest).unwrap();
        for e in tar::Archive::new(&mut r).entries().unwrap() {
            names.push(e.unwrap().path().unwrap().display().to_string());
        }
        assert!(names.contains(&"a/.wh.deleted".to_string()), "{names:?}");
        assert!(names.contains(&"a/b/.wh..wh..opq".to_string()), "{names:?}");
        assert_eq!(
            names,
            [
                "a",
                "a/b",
                "a/b/.wh..wh..opq",
                "a/b/file",
                "a/.wh.deleted",
                "link",
                "z",
                "z-hard"
            ],
            "depth first, each directory in byte order of the names on disk"
        );
        // Extracting gives back overlay's format, which seals to the same digest.
        let extracted = cache.ensure(&blobs, &first.digest).unwrap();
        assert_eq!(
            seal_dir(&extracted, &blobs, Owners::Mapped(cache.ids())).unwrap(),
            first
        );
        let m = fs::symlink_metadata(extracted.join("a/deleted")).unwrap();
        assert!(m.file_type().is_char_device() && m.rdev() == 0);
    }

    /// Gives every entry under `dir` the host ids sandbox files have (`base + id`), keeping
    /// modes: what an upper directory written by a sandbox looks like.
    fn owned_by_sandbox(dir: &Path, ids: IdRange) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let m = fs::symlink_metadata(&path).unwrap();
            // A second link to a file already given; or a whiteout, which overlay makes with
            // its mounter's (the host's) ids.
            if m.uid() >= ids.base() || m.file_type().is_char_device() {
                continue;
            }
            std::os::unix::fs::lchown(
                &path,
                Some(ids.to_host("uid", m.uid() as u64).unwrap()),
                Some(ids.to_host("gid", m.gid() as u64).unwrap()),
            )
            .unwrap();
            if !m.file_type().is_symlink() {
                fs::set_permissions(
                    &path,
                    std::os::unix::fs::PermissionsExt::from_mode(m.mode()),
                )
                .unwrap();
            }
            if m.is_dir() {
                owned_by_sandbox(&path, ids);
            }
        }
    }

    #[test]
    fn trees_hold_host_ids_and_layers_hold_the_sandboxs() {
        let store_dir = tempfile::tempdir().unwrap();
        let blobs = LocalBlobStore::open(store_dir.path().join("blobs")).unwrap();
        let ids = IdRange::new(300_000).unwrap();
        let cache = LayerCache::open(store_dir.path().join("layers"), ids).unwrap();
        let src = tempfile::tempdir().unwrap();
        fs::write(src.path().join("root-file"), "r").unwrap();
        fs::write(src.path().join("user-file"), "u").unwrap();
        std::os::unix::fs::lchown(src.path().join("user-file"), Some(1000), Some(1000)).unwrap();
        fs::set_permissions(
            src.path().join("root-file"),
            std::os::unix::fs::PermissionsExt::from_mode(0o4755),
        )
        .unwrap();
        let layer = seal_dir(src.path(), &blobs, Owners::AsSandbox).unwrap();
        let tree = cache.ensure(&blobs, &layer.digest).unwrap();
        let owner = |p: &str| {
            let m = fs::symlink_metadata(tree.join(p)).unwrap();
            (m.uid(), m.gid(), m.mode() & 0o7777)
        };
        // No setuid-root file on the host: the setuid file belongs to the sandbox's root.
        assert_eq!(owner("root-file"), (300_000, 300_000, 0o4755));
        assert_eq!(owner("user-file"), (301_000, 301_000, 0o644));
        // Sealing the tree maps the owners back: the same layer, byte for byte.
        assert_eq!(seal_dir(&tree, &blobs, Owners::Mapped(ids)).unwrap(), layer);
        // A file of a host account is not a sandbox file, and no layer records it.
        let stray = tempfile::tempdir().unwrap();
        fs::write(stray.path().join("host-file"), "h").unwrap();
        let err = seal_dir(stray.path(), &blobs, Owners::Mapped(ids)).unwrap_err();
        assert!(
            err.to_string().contains("outside the sandbox id range"),
            "{err}"
        );
    }

    /// Stores a layer of one file at `path` owned by sandbox uid `uid`, and returns its digest.
    fn one_file_layer(blobs: &LocalBlobStore, path: &str, uid: u64) -> Digest {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(2);
        h.set_mode(0o644);
        h.set_uid(uid);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_cksum();
        b.append_data(&mut h, path, &b"x\n"[..]).unwrap();
        let mut w = blobs.writer().unwrap();
        io::Write::write_all(&mut w, &b.into_inner().unwrap()).unwrap();
        w.commit().unwrap().0
    }

    #[test]
    fn a_layer_owner_beyond_the_sandboxs_ids_is_refused() {
        let store_dir = tempfile::tempdir().unwrap();
        let blobs = LocalBlobStore::open(store_dir.path().join("blobs")).unwrap();
        let cache = LayerCache::open(store_dir.path().join("layers"), IdRange::default()).unwrap();
        let digest = one_file_layer(&blobs, "far", 70_000);
        let err = cache.ensure(&blobs, &digest).unwrap_err();
        assert!(err.to_string().contains("uid id 70000 is outside"), "{err}");
        assert!(!cache.contains(&digest));
    }

    /// Registry layers often name a file without its directories: those directories belong to
    /// the sandbox's root, not to the host's (a later checkpoint that copies one up records it).
    #[test]
    fn directories_a_layer_only_implies_belong_to_the_sandboxs_root() {
        let store_dir = tempfile::tempdir().unwrap();
        let blobs = LocalBlobStore::open(store_dir.path().join("blobs")).unwrap();
        let ids = IdRange::default();
        let cache = LayerCache::open(store_dir.path().join("layers"), ids).unwrap();
        let digest = one_file_layer(&blobs, "etc/app/conf", 0);
        let tree = cache.ensure(&blobs, &digest).unwrap();
        for p in ["etc", "etc/app", "etc/app/conf"] {
            let m = fs::symlink_metadata(tree.join(p)).unwrap();
            assert_eq!((m.uid(), m.gid()), (ids.base(), ids.base()), "{p}");
        }
        assert!(seal_dir(&tree, &blobs, Owners::Mapped(ids)).is_ok());
    }

    #[test]
    fn a_cache_of_an_older_strata_is_extracted_again_and_another_range_is_refused() {
        let store_dir = tempfile::tempdir().unwrap();
        let blobs = LocalBlobStore::open(store_dir.path().join("blobs")).unwrap();
        let root = store_dir.path().join("layers");
        let src = tempfile::tempdir().unwrap();
        fs::write(src.path().join("f"), "f").unwrap();
        let layer = seal_dir(src.path(), &blobs, Owners::AsSandbox).unwrap();
        // What an older strata left: the tree with in-sandbox owners, marked complete.
        fs::create_dir_all(root.join(layer.digest.hex())).unwrap();
        fs::write(root.join(layer.digest.hex()).join("f"), "f").unwrap();
        fs::write(root.join(format!("{}.complete", layer.digest.hex())), "1").unwrap();
        let cache = LayerCache::open(&root, IdRange::default()).unwrap();
        assert!(!cache.contains(&layer.digest), "unmarked");
        let tree = cache.ensure(&blobs, &layer.digest).unwrap();
        let m = fs::metadata(tree.join("f")).unwrap();
        assert_eq!(m.uid(), IdRange::default().base());
        // Reopening with the same range keeps it; another range is refused with what to do.
        assert!(LayerCache::open(&root, IdRange::default())
            .unwrap()
            .contains(&layer.digest));
        let err = LayerCache::open(&root, IdRange::new(200_000).unwrap()).unwrap_err();
        assert!(err.to_string().contains("STRATA_SANDBOX_ID_RANGE"), "{err}");
    }

    /// Everything a sandbox can observe of a tree, path by path.
    fn observed(root: &Path) -> Vec<String> {
        fn visit(root: &Path, dir: &Path, out: &mut Vec<String>) {
            let mut names: Vec<_> = fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            names.sort();
            for name in names {
                let path = dir.join(&name);
                let m = fs::symlink_metadata(&path).unwrap();
                let mut xattrs = vec![0u8; 1024];
                let n = rustix::fs::llistxattr(&path, &mut xattrs).unwrap_or(0);
                let mut line = format!(
                    "{} mode={:o} uid={} gid={} rdev={} nlink={} xattrs={:?}",
                    path.strip_prefix(root).unwrap().display(),
                    m.mode(),
                    m.uid(),
                    m.gid(),
                    m.rdev(),
                    m.nlink(),
                    String::from_utf8_lossy(&xattrs[..n]),
                );
                if m.file_type().is_file() {
                    line += &format!(
                        " mtime={}.{} content={:?}",
                        m.mtime(),
                        m.mtime_nsec(),
                        fs::read(&path).unwrap()
                    );
                } else if m.file_type().is_symlink() {
                    line += &format!(" -> {}", fs::read_link(&path).unwrap().display());
                }
                out.push(line);
                if m.is_dir() {
                    visit(root, &path, out);
                }
            }
        }
        let mut out = Vec::new();
        visit(root, root, &mut out);
        out
    }

    #[test]
    fn a_tree_extracted_while_sealing_is_the_tree_an_extraction_gives_and_reseals_alike() {
        let store_dir = tempfile::tempdir().unwrap();
        let blobs = LocalBlobStore::open(store_dir.path().join("blobs")).unwrap();
        let teed_cache =
            LayerCache::open(store_dir.path().join("layers"), IdRange::default()).unwrap();
        let extracted_cache =
            LayerCache::open(store_dir.path().join("layers-2"), IdRange::default()).unwrap();
        let upper = store_dir.path().join("upper");
        sample(&upper);
        owned_by_sandbox(&upper, teed_cache.ids());
        // Sealed in a later second than the directories were made: the tar keeps their times.
        std::thread::sleep(std::time::Duration::from_millis(1100));
        let layer = seal_beside_cache(&upper, &blobs, &teed_cache).unwrap();
        assert!(upper.exists(), "the upper stays where it is");
        assert!(teed_cache.contains(&layer.digest));
        let teed = teed_cache.path(&layer.digest);
        let extracted = extracted_cache.ensure(&blobs, &layer.digest).unwrap();
        assert_eq!(observed(&teed), observed(&extracted));
        // What republishing a layer from the node's copy relies on, whichever way the copy
        // was made.
        for tree in [&teed, &extracted] {
            assert_eq!(
                seal_dir(tree, &blobs, Owners::Mapped(teed_cache.ids())).unwrap(),
                layer,
                "{}",
                tree.display()
            );
        }
    }

    #[test]
    fn a_tree_sealed_into_the_cache_is_the_tree_an_extraction_gives() {
        let store_dir = tempfile::tempdir().unwrap();
        let blobs = LocalBlobStore::open(store_dir.path().join("blobs")).unwrap();
        let adopted_cache =
            LayerCache::open(store_dir.path().join("layers"), IdRange::default()).unwrap();
        let extracted_cache =
            LayerCache::open(store_dir.path().join("layers-2"), IdRange::default()).unwrap();
        let upper = store_dir.path().join("upper");
        sample(&upper);
        owned_by_sandbox(&upper, adopted_cache.ids());
        // What a tar does not carry: a sub-second mtime, an xattr, a socket.
        rustix::fs::setxattr(
            upper.join("z"),
            "user.note",
            b"x",
            rustix::fs::XattrFlags::empty(),
        )
        .unwrap();
        let _socket = std::os::unix::net::UnixListener::bind(upper.join("a/sock")).unwrap();
        assert_ne!(
            fs::metadata(upper.join("a/b/file")).unwrap().mtime_nsec(),
            0
        );

        let layer = seal_into_cache(&upper, &blobs, &adopted_cache).unwrap();
        assert!(
            !upper.exists(),
            "the upper directory became the layer's tree"
        );
        assert!(adopted_cache.contains(&layer.digest));
        let adopted = adopted_cache.path(&layer.digest);
        let extracted = extracted_cache.ensure(&blobs, &layer.digest).unwrap();
        assert_eq!(observed(&adopted), observed(&extracted));
        assert_eq!(
            seal_dir(&adopted, &blobs, Owners::Mapped(adopted_cache.ids())).unwrap(),
            layer
        );
        assert_eq!(
            fs::metadata(&adopted).unwrap().mode() & 0o7777,
            fs::metadata(&extracted).unwrap().mode() & 0o7777
        );
    }

    #[test]
    fn a_torn_extracted_tree_is_extracted_again() {
        let store_dir = tempfile::tempdir().unwrap();
        let blobs = LocalBlobStore::open(store_dir.path().join("blobs")).unwrap();
        let cache = LayerCache::open(store_dir.path().join("layers"), IdRange::default()).unwrap();
        let src = tempfile::tempdir().unwrap();
        sample(src.path());
        let layer = seal_dir(src.path(), &blobs, Owners::AsSandbox).unwrap();
        let tree = cache.ensure(&blobs, &layer.digest).unwrap();
        assert_eq!(fs::read(tree.join("a/b/file")).unwrap(), b"content");
        // What a crash between the rename and the data reaching the disk leaves: the tree in
        // place, a file in it empty, no completion mark.
        fs::write(tree.join("a/b/file"), b"").unwrap();
        fs::remove_file(tree.join("z")).unwrap();
        fs::remove_file(
            store_dir
                .path()
                .join("layers")
                .join(format!("{}.complete", layer.digest.hex())),
        )
        .unwrap();
        let again = cache.ensure(&blobs, &layer.digest).unwrap();
        assert_eq!(again, tree);
        assert_eq!(fs::read(tree.join("a/b/file")).unwrap(), b"content");
        assert_eq!(fs::read(tree.join("z")).unwrap(), b"z");
        assert_eq!(
            fs::read_link(tree.join("link")).unwrap(),
            Path::new("a/b/file")
        );
        // Nothing is left beside it but the tree, its mark and the lock.
        let mut names: Vec<String> = fs::read_dir(store_dir.path().join("layers"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let hex = layer.digest.hex();
        assert_eq!(
            names,
            [
                ".owners".to_string(),
                ".publish.lock".to_string(),
                hex.to_string(),
                format!("{hex}.complete")
            ]
        );
        // A marked tree is used as it is.
        assert_eq!(cache.ensure(&blobs, &layer.digest).unwrap(), tree);
    }

    #[test]
    fn a_corrupt_blob_is_never_extracted() {
        let store_dir = tempfile::tempdir().unwrap();
        let blobs = LocalBlobStore::open(store_dir.path().join("blobs")).unwrap();
        let cache = LayerCache::open(store_dir.path().join("layers"), IdRange::default()).unwrap();
        let src = tempfile::tempdir().unwrap();
        fs::write(src.path().join("f"), "original").unwrap();
        let layer = seal_dir(src.path(), &blobs, Owners::AsSandbox).unwrap();
        let path = blobs.path_of(&layer.digest);
        let mut bytes = fs::read(&path).unwrap();
        let at = bytes.windows(8).position(|w| w == b"original").unwrap();
        bytes[at] = b'O';
        fs::write(&path, bytes).unwrap();
        let err = cache.ensure(&blobs, &layer.digest).unwrap_err();
        assert!(matches!(err, VmmError::DigestMismatch { .. }), "{err}");
        assert!(!cache.path(&layer.digest).exists());
        let names: Vec<_> = fs::read_dir(store_dir.path().join("layers"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            names,
            [".owners", ".publish.lock"],
            "nothing but the cache's id range and its lock is left"
        );
        // The torn blob is absent now, and sealing the same content again repairs it.
        assert!(!path.exists());
        assert_eq!(
            seal_dir(src.path(), &blobs, Owners::AsSandbox).unwrap(),
            layer
        );
        cache.ensure(&blobs, &layer.digest).unwrap();
    }
}
