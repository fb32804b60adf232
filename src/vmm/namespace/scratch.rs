//! A sandbox's scratch disk: the filesystem its writes land on, of a fixed size, so that a build
//! step that writes without end fills its own disk and never the node's (ADR 0023).
//!
//! Each sandbox's uppers live on an ext4 filesystem in a sparse image file of
//! `STRATA_BUILD_DISK_MAX` bytes, attached to a loop device and mounted at
//! `sandboxes/<id>/disk`. The kernel refuses a write past its end (`ENOSPC`); nothing polls.
//! Sealed uppers stay on it until the sandbox ends, so a build's layers count against its limit
//! and one limit bounds the whole build, not each step.
//!
//! The image is a sparse copy of one formatted template per size (`sandboxes/.scratch-<bytes>.img`,
//! made once with `mkfs.ext4`), so a boot costs a few hundred kilobytes of copy, a loop ioctl and
//! a mount. Without a journal: a scratch disk is never used again after a crash, the sweep
//! removes it.
//!
//! The node's reserve: a sandbox gets at most what the data directory's filesystem has free,
//! less `STRATA_NODE_DISK_RESERVE`, less what the other live scratch disks may still grow by; a
//! smaller grant is enforced by a preallocated file on the scratch disk (`.held`), and a grant
//! under the build's `minFreeDiskMb` (or under [`FLOOR`]) refuses the boot.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};

use crate::metrics::storage::human_bytes;
use crate::vmm::error::{Result, VmmError};

/// The name of a sandbox's scratch mount point inside its directory.
pub const MOUNT_DIR: &str = "disk";
const IMAGE_FILE: &str = "disk.img";
/// The preallocated file that keeps a scratch disk's grant under its size.
const HELD_FILE: &str = ".held";
/// The smallest grant a sandbox boots with when its build asks for no free space.
pub const FLOOR: u64 = 64 << 20;

/// How much a sandbox may write, and what the node never lends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskConfig {
    /// Size of each sandbox's scratch disk; `None`: uppers on the data disk, unbounded.
    pub max: Option<u64>,
    /// Free space on the data directory's filesystem no sandbox is granted.
    pub reserve: u64,
}

impl DiskConfig {
    pub const DEFAULT_MAX: u64 = 20 << 30;
    pub const DEFAULT_RESERVE: u64 = 4 << 30;
}

impl Default for DiskConfig {
    fn default() -> Self {
        DiskConfig {
            max: Some(Self::DEFAULT_MAX),
            reserve: Self::DEFAULT_RESERVE,
        }
    }
}

/// What a new scratch disk may hold: the node's free space less its reserve and less what the
/// live scratch disks may still grow by, capped at the disk's own free space. `None` when that
/// is under what the build needs (`need`).
pub fn grant(
    free_on_node: u64,
    reserve: u64,
    others_may_grow: u64,
    disk_free: u64,
    need: u64,
) -> Option<u64> {
    let lendable = free_on_node
        .saturating_sub(reserve)
        .saturating_sub(others_may_grow);
    let granted = lendable.min(disk_free);
    (granted >= need).then_some(granted)
}

/// Disks kept mounted ahead of need: copying the template and mounting it take about 5 ms,
/// which a boot then does not wait for.
const SPARES: usize = 2;

/// Every scratch disk of one backend: the template image, spares, and the live disks' grants.
pub struct ScratchDisks {
    config: DiskConfig,
    /// The data directory's `sandboxes/`.
    dir: PathBuf,
    /// The formatted image new disks copy, when disks are bounded.
    template: Option<PathBuf>,
    /// Names a new sandbox (the owner's id generator): a spare is a sandbox directory made
    /// ahead, so a dead owner's spares are swept like its sandboxes.
    new_id: Arc<dyn Fn() -> String + Send + Sync>,
    spares: Arc<Mutex<Spares>>,
    /// Live disks by sandbox id: image file and grant.
    live: Mutex<HashMap<String, (PathBuf, u64)>>,
    /// Removals of destroyed sandboxes' disks still running in the background.
    removing: Arc<(Mutex<usize>, Condvar)>,
}

#[derive(Default)]
struct Spares {
    ready: Vec<Prepared>,
    making: bool,
    /// The thread making spares, joined on close so none is left half made.
    maker: Option<std::thread::JoinHandle<()>>,
    closed: bool,
}

/// A disk removal under way in the background: [`ScratchDisks::close`] waits for it.
pub struct Removal {
    removing: Arc<(Mutex<usize>, Condvar)>,
}

impl Drop for Removal {
    fn drop(&mut self) {
        let (count, done) = &*self.removing;
        *count.lock().expect("scratch removals") -= 1;
        done.notify_all();
    }
}

/// How long closing waits for background removals of destroyed sandboxes' disks (each takes
/// about 8 ms; a stuck one is left to the next start's sweep).
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// A sandbox directory with a mounted, empty scratch disk.
struct Prepared {
    id: String,
    dir: PathBuf,
    /// Free bytes on the disk.
    free: u64,
}

impl Prepared {
    fn make(template: &Path, dir: PathBuf, id: String) -> io::Result<Prepared> {
        let made = (|| {
            std::fs::create_dir_all(&dir)?;
            copy_sparse(template, &dir.join(IMAGE_FILE))?;
            let mount = dir.join(MOUNT_DIR);
            std::fs::create_dir_all(&mount)?;
            mount_image(&dir.join(IMAGE_FILE), &mount)?;
            statvfs(&mount).map(|(free, _)| free)
        })();
        match made {
            Ok(free) => Ok(Prepared { id, dir, free }),
            Err(e) => {
                unmount(&dir.join(MOUNT_DIR));
                let _ = std::fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    fn discard(self) {
        unmount(&self.dir.join(MOUNT_DIR));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl ScratchDisks {
    /// Makes the template image (once per size and data directory) when disks are bounded.
    /// `new_id` names sandboxes: a disk comes with its sandbox's directory.
    pub fn open(
        config: DiskConfig,
        sandboxes: &Path,
        new_id: Arc<dyn Fn() -> String + Send + Sync>,
    ) -> Result<ScratchDisks> {
        let template = match config.max {
            Some(size) => Some(ensure_template(sandboxes, size)?),
            None => None,
        };
        Ok(ScratchDisks {
            config,
            dir: sandboxes.to_path_buf(),
            template,
            new_id,
            spares: Default::default(),
            live: Mutex::new(HashMap::new()),
            removing: Default::default(),
        })
    }

    pub fn config(&self) -> DiskConfig {
        self.config
    }

    /// A new sandbox's id and directory (made), with its scratch disk mounted in it, granting
    /// at least `need` bytes (the build's `minFreeDiskMb`, else [`FLOOR`]) and at most `cap`;
    /// no disk when disks are unbounded.
    pub fn create(
        &self,
        need: Option<u64>,
        cap: Option<u64>,
    ) -> Result<(String, PathBuf, Option<ScratchDisk>)> {
        let (Some(template), Some(size)) = (&self.template, self.config.max) else {
            let id = (self.new_id)();
            let dir = self.dir.join(&id);
            std::fs::create_dir_all(&dir)
                .map_err(VmmError::io("creating the sandbox directory"))?;
            return Ok((id, dir, None));
        };
        let need = need.unwrap_or(0).max(FLOOR.min(size));
        if need > size {
            return Err(VmmError::Disk(format!(
                "the build asks for {} of free disk (minFreeDiskMb), more than this node's limit \
                 of {} per build (STRATA_BUILD_DISK_MAX)",
                human_bytes(need),
                human_bytes(size)
            )));
        }
        let spare = self.take_spare();
        let prepared = match spare {
            Some(p) => p,
            None => {
                let id = (self.new_id)();
                Prepared::make(template, self.dir.join(&id), id).map_err(|e| {
                    VmmError::io(format!(
                        "making a sandbox's scratch disk in {} (a loop device and ext4; set \
                         STRATA_BUILD_DISK_MAX=none where there are none)",
                        self.dir.display()
                    ))(e)
                })?
            }
        };
        let (id, dir, disk_free) = (prepared.id.clone(), prepared.dir.clone(), prepared.free);
        let mount = dir.join(MOUNT_DIR);
        // The disk's own metadata takes a little of its size: a need up to the size is met by
        // all the disk has.
        let need = need.min(disk_free);
        let mut live = self.live.lock().expect("scratch registry");
        let others: u64 = live.values().map(|(image, g)| may_grow(image, *g)).sum();
        let running = live.len();
        let node_free = statvfs(&self.dir).map(|(f, _)| f).unwrap_or(0);
        let room = cap.map_or(disk_free, |c| c.max(need).min(disk_free));
        let Some(granted) = grant(node_free, self.config.reserve, others, room, need) else {
            drop(live);
            prepared.discard();
            return Err(VmmError::Disk(format!(
                "this node has {} free for sandboxes beyond its reserve of {} \
                 (STRATA_NODE_DISK_RESERVE), less than the {} this build needs ({} free on the \
                 data disk, of which the {running} running sandboxes' disks may still take {}); \
                 free space on the data disk or wait for running builds to end",
                human_bytes(
                    node_free
                        .saturating_sub(self.config.reserve)
                        .saturating_sub(others)
                ),
                human_bytes(self.config.reserve),
                human_bytes(need),
                human_bytes(node_free),
                human_bytes(others),
            )));
        };
        let mut disk = ScratchDisk {
            mount: mount.clone(),
            granted: disk_free,
            limit: size,
            trimmed: false,
        };
        if granted < disk_free {
            if let Err(e) = hold(&mount.join(HELD_FILE), disk_free - granted) {
                drop(live);
                prepared.discard();
                return Err(VmmError::io("holding back part of the scratch disk")(e));
            }
            disk.granted = granted;
            disk.limit = granted;
            disk.trimmed = true;
        }
        live.insert(id.clone(), (dir.join(IMAGE_FILE), granted));
        drop(live);
        self.replenish();
        Ok((id, dir, Some(disk)))
    }

    fn take_spare(&self) -> Option<Prepared> {
        self.spares.lock().expect("scratch spares").ready.pop()
    }

    /// Makes spares in the background up to [`SPARES`]; called after a disk was granted, so a
    /// node without room makes none.
    fn replenish(&self) {
        let Some(template) = self.template.clone() else {
            return;
        };
        let mut spares = self.spares.lock().expect("scratch spares");
        if !spares.closed && !spares.making && spares.ready.len() < SPARES {
            spares.making = true;
            let (shared, dir, new_id) =
                (self.spares.clone(), self.dir.clone(), self.new_id.clone());
            let spawned = std::thread::Builder::new()
                .name("scratch-spares".into())
                .spawn(move || loop {
                    let id = new_id();
                    let made = Prepared::make(&template, dir.join(&id), id);
                    let mut spares = shared.lock().expect("scratch spares");
                    match made {
                        Ok(p) if !spares.closed => spares.ready.push(p),
                        Ok(p) => p.discard(),
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot make a spare scratch disk; sandboxes make their own");
                            spares.making = false;
                            return;
                        }
                    }
                    if spares.closed || spares.ready.len() >= SPARES {
                        spares.making = false;
                        return;
                    }
                });
            match spawned {
                Ok(maker) => spares.maker = Some(maker),
                Err(_) => spares.making = false,
            }
        }
    }

    /// Removes sandbox `id`'s disk (see [`ScratchDisk::remove`]) and forgets its grant.
    pub fn remove(&self, id: &str, disk: ScratchDisk) {
        self.forget(id);
        disk.remove();
    }

    /// Forgets sandbox `id`'s grant: nothing writes to its disk any more, so it may grow by
    /// nothing, whether or not its removal (an unlink of a large image can take a while) has
    /// run yet. Counted until then, destroyed sandboxes' grants refused the boots that followed
    /// them for room the node had.
    pub fn forget(&self, id: &str) {
        self.live.lock().expect("scratch registry").remove(id);
    }

    /// Counts a removal about to run in the background until the returned value is dropped,
    /// so that [`ScratchDisks::close`] can wait for it.
    pub fn removal(&self) -> Removal {
        *self.removing.0.lock().expect("scratch removals") += 1;
        Removal {
            removing: self.removing.clone(),
        }
    }

    /// Leaves nothing mounted: no new spares are made, the one being made is waited for, every
    /// spare is unmounted and removed, and background removals of destroyed sandboxes' disks
    /// are waited for (up to [`CLOSE_WAIT`]). A process that made disks calls this before it
    /// exits, signals and errors included; dropping the disks calls it too. Idempotent.
    pub fn close(&self) {
        let maker = {
            let mut spares = self.spares.lock().expect("scratch spares");
            spares.closed = true;
            spares.maker.take()
        };
        if let Some(maker) = maker {
            let _ = maker.join();
        }
        let ready: Vec<Prepared> = self
            .spares
            .lock()
            .expect("scratch spares")
            .ready
            .drain(..)
            .collect();
        for p in ready {
            p.discard();
        }
        let (count, done) = &*self.removing;
        let pending = count.lock().expect("scratch removals");
        let (pending, waited) = done
            .wait_timeout_while(pending, CLOSE_WAIT, |n| *n > 0)
            .expect("scratch removals");
        if waited.timed_out() {
            tracing::warn!(
                pending = *pending,
                "scratch disks of destroyed sandboxes are still being removed; the next start \
                 on this data directory sweeps what they leave"
            );
        }
    }
}

impl Drop for ScratchDisks {
    fn drop(&mut self) {
        self.close();
    }
}

/// How many more bytes a live disk's image may take on the node: its grant less what it holds.
fn may_grow(image: &Path, granted: u64) -> u64 {
    let held = std::fs::metadata(image)
        .map(|m| m.blocks() * 512)
        .unwrap_or(0);
    granted.saturating_sub(held)
}

/// One sandbox's mounted scratch disk.
#[derive(Debug)]
pub struct ScratchDisk {
    mount: PathBuf,
    /// What it may hold: the disk's free space, less what `.held` keeps back.
    granted: u64,
    /// The limit a full disk is said to have hit: `STRATA_BUILD_DISK_MAX`, or the grant when
    /// the node's reserve made it smaller.
    limit: u64,
    trimmed: bool,
}

impl ScratchDisk {
    /// Where the sandbox's upper and work directories go.
    pub fn path(&self) -> &Path {
        &self.mount
    }

    /// What the sandbox may write in all, as said to its build: `STRATA_BUILD_DISK_MAX`, or
    /// less when the node's reserve left less.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Whether the node's reserve made the limit smaller than `STRATA_BUILD_DISK_MAX`.
    pub fn trimmed(&self) -> bool {
        self.trimmed
    }

    /// Whether the disk is (nearly) out of space or inodes: said beside a failed step.
    pub fn is_full(&self) -> bool {
        match statvfs(&self.mount) {
            Ok((free, files)) => free < (1 << 20).max(self.granted / 200) || files < 16,
            Err(_) => false,
        }
    }

    /// Unmounts the disk (lazily: a dying sandbox's namespace may still hold it) and removes
    /// its image; the kernel frees the loop device when the last mount goes.
    fn remove(&self) {
        unmount(&self.mount);
        if let Some(dir) = self.mount.parent() {
            let _ = std::fs::remove_file(dir.join(IMAGE_FILE));
        }
    }
}

/// Unmounts `mount` if something is mounted there.
fn unmount(mount: &Path) {
    let Ok(target) = std::ffi::CString::new(mount.as_os_str().as_encoded_bytes()) else {
        return;
    };
    // SAFETY: umount2 on a path string we own; failing (nothing mounted) changes nothing.
    unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
}

/// Free bytes (for an unprivileged writer) and free inodes of the filesystem at `path`.
fn statvfs(path: &Path) -> io::Result<(u64, u64)> {
    let s = rustix::fs::statvfs(path)?;
    Ok((s.f_bavail * s.f_frsize, s.f_favail))
}

/// Preallocates `bytes` in a new file at `path` (unwritten extents: nothing is written).
fn hold(path: &Path, bytes: u64) -> io::Result<()> {
    let file = OpenOptions::new().write(true).create_new(true).open(path)?;
    rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, bytes)?;
    Ok(())
}

/// The formatted template for disks of `size` bytes, made under a temporary name and renamed,
/// so two backends on one data directory never see a half-made one.
fn ensure_template(sandboxes: &Path, size: u64) -> Result<PathBuf> {
    let path = sandboxes.join(format!(".scratch-{size}.img"));
    if path.exists() {
        return Ok(path);
    }
    let staging = sandboxes.join(format!(".scratch-{size}.img.{}", std::process::id()));
    let made = (|| -> io::Result<()> {
        std::fs::create_dir_all(sandboxes)?;
        File::create(&staging)?.set_len(size)?;
        let out = std::process::Command::new(mkfs())
            // No journal (a scratch disk never outlives a crash), no room kept for growing,
            // inode tables initialised lazily and never by a background thread (the mount's
            // `noinit_itable`): a 20 GiB image holds about 300 KiB after this.
            .args(["-q", "-F", "-O", "^has_journal,^resize_inode", "-m", "0"])
            .args(["-E", "lazy_itable_init=1,nodiscard"])
            .arg(&staging)
            .output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "mkfs.ext4 failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        std::fs::rename(&staging, &path)
    })();
    made.map_err(|e| {
        let _ = std::fs::remove_file(&staging);
        VmmError::io(format!(
            "formatting the scratch disk template {} (needs mkfs.ext4, from e2fsprogs)",
            path.display()
        ))(e)
    })?;
    Ok(path)
}

/// `mkfs.ext4` from PATH, else where Debian puts it (root's PATH may lack `/usr/sbin`).
fn mkfs() -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("mkfs.ext4"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain(["/usr/sbin/mkfs.ext4".into(), "/sbin/mkfs.ext4".into()])
        .find(|p| p.exists())
        .unwrap_or_else(|| "mkfs.ext4".into())
}

/// Copies only the allocated ranges of `src` into a new sparse file `dst` of the same length.
fn copy_sparse(src: &Path, dst: &Path) -> io::Result<()> {
    use rustix::fs::SeekFrom;
    let from = File::open(src)?;
    let to = OpenOptions::new().write(true).create_new(true).open(dst)?;
    let len = from.metadata()?.len();
    to.set_len(len)?;
    let mut at = 0u64;
    while at < len {
        let data = match rustix::fs::seek(&from, SeekFrom::Data(at)) {
            Ok(d) => d,
            Err(rustix::io::Errno::NXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let hole = rustix::fs::seek(&from, SeekFrom::Hole(data))?;
        let (mut off_in, mut off_out) = (data, data);
        while off_in < hole {
            let left = (hole - off_in) as usize;
            let n = rustix::fs::copy_file_range(
                &from,
                Some(&mut off_in),
                &to,
                Some(&mut off_out),
                left,
            )?;
            if n == 0 {
                break;
            }
        }
        at = hole;
    }
    Ok(())
}

/// Attaches `image` to a free loop device (detached by the kernel once unmounted) and mounts
/// its ext4 at `target`.
fn mount_image(image: &Path, target: &Path) -> io::Result<()> {
    // Held open until the mount holds the device: with autoclear, the last close detaches it.
    let (device, _open) = loop_attach(image)?;
    let dev = std::ffi::CString::new(device.as_os_str().as_encoded_bytes())?;
    let at = std::ffi::CString::new(target.as_os_str().as_encoded_bytes())?;
    // SAFETY: mount(2) with NUL-terminated strings we own.
    let r = unsafe {
        libc::mount(
            dev.as_ptr(),
            at.as_ptr(),
            c"ext4".as_ptr(),
            // What a tenant writes is never a setuid program or a device to the host (its
            // sandbox sees the disk through overlay, whose own mount decides that inside).
            libc::MS_NOSUID | libc::MS_NODEV,
            c"noinit_itable".as_ptr().cast(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// `struct loop_info64` of `<linux/loop.h>`.
#[repr(C)]
struct LoopInfo64 {
    device: u64,
    inode: u64,
    rdevice: u64,
    offset: u64,
    sizelimit: u64,
    number: u32,
    encrypt_type: u32,
    encrypt_key_size: u32,
    flags: u32,
    file_name: [u8; 64],
    crypt_name: [u8; 64],
    encrypt_key: [u8; 32],
    init: [u64; 2],
}

/// `struct loop_config` of `<linux/loop.h>`.
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// Binds `image` to a free loop device with autoclear and answers the device's path and an
/// open descriptor of it: the kernel detaches the device at its last close, so the caller
/// keeps it until the mount holds the device (and once that goes, the device goes).
fn loop_attach(image: &Path) -> io::Result<(PathBuf, File)> {
    let control = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")?;
    let backing = OpenOptions::new().read(true).write(true).open(image)?;
    // Another process may bind the device we were told is free first: ask again.
    for _ in 0..32 {
        // SAFETY: an ioctl without arguments on a descriptor we own.
        let n = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let path = PathBuf::from(format!("/dev/loop{n}"));
        let device = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let config = LoopConfig {
            fd: backing.as_raw_fd() as u32,
            block_size: 0,
            info: LoopInfo64 {
                device: 0,
                inode: 0,
                rdevice: 0,
                offset: 0,
                sizelimit: 0,
                number: 0,
                encrypt_type: 0,
                encrypt_key_size: 0,
                flags: LO_FLAGS_AUTOCLEAR,
                file_name: [0; 64],
                crypt_name: [0; 64],
                encrypt_key: [0; 32],
                init: [0; 2],
            },
            reserved: [0; 8],
        };
        // SAFETY: LOOP_CONFIGURE reads a `struct loop_config` we own for the call's length.
        let r = unsafe { libc::ioctl(device.as_raw_fd(), LOOP_CONFIGURE, &config) };
        if r == 0 {
            return Ok((path, device));
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EBUSY) {
            return Err(e);
        }
    }
    Err(io::Error::other("no free loop device after 32 tries"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    #[test]
    fn a_grant_never_lends_the_reserve_or_what_live_disks_may_still_use() {
        // 10 GiB free, 4 reserved, 3 promised to live disks: 3 left, under a 20 GiB disk.
        assert_eq!(grant(10 * G, 4 * G, 3 * G, 20 * G, FLOOR), Some(3 * G));
        // Plenty free: the disk's own size is the grant.
        assert_eq!(grant(100 * G, 4 * G, 0, 20 * G, FLOOR), Some(20 * G));
        // Less than the build needs, or nothing at all beyond the reserve: refused.
        assert_eq!(grant(10 * G, 4 * G, 3 * G, 20 * G, 5 * G), None);
        assert_eq!(grant(3 * G, 4 * G, 0, 20 * G, FLOOR), None);
    }

    #[test]
    fn a_sparse_copy_keeps_length_and_content_and_stays_sparse() {
        use std::io::{Seek, Write};
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        let mut f = File::create(&src).unwrap();
        f.set_len(64 << 20).unwrap();
        f.write_all(b"head").unwrap();
        f.seek(io::SeekFrom::Start(32 << 20)).unwrap();
        f.write_all(b"middle").unwrap();
        drop(f);
        let dst = dir.path().join("dst");
        copy_sparse(&src, &dst).unwrap();
        assert_eq!(std::fs::read(&src).unwrap(), std::fs::read(&dst).unwrap());
        let allocated = std::fs::metadata(&dst).unwrap().blocks() * 512;
        assert!(allocated < 1 << 20, "{allocated} bytes allocated");
    }
}
