//! Walking a directory tree a tenant shaped: by descriptor, never through a link, and in two
//! descriptors and no recursion whatever its depth or width. With the two pieces every host
//! access to such a tree goes through (the archive extractor too): [`Component`], the only
//! kind of name passed to an `*at` call, and [`open_dir`], which opens one beneath its parent.
//!
//! A tenant picks the depth of what it writes (`mkdir` in a loop, `cd` into each), and a path
//! to its bottom is longer than any path the kernel takes; it may also swap a directory for a
//! symlink between a listing and an open. So every directory is opened relative to its parent's
//! descriptor with `O_NOFOLLOW` ([`Component`] names only, [`open_dir`]), the walk
//! climbs back with `..`, and each level's device and inode are kept on the way down and
//! checked on the way up: a tree moved while it is walked stops the walk with an error.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};

/// One name inside a directory: not empty, not `.` or `..`, without `/` or NUL. The only
/// kind of name the extractor passes to an `*at` call, so no call made relative to a
/// directory's descriptor reaches anything but that directory's own entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Component(OsString);

impl Component {
    /// `bytes` as a component, or `None` when they are not one normal name.
    pub fn new(bytes: &[u8]) -> Option<Component> {
        match bytes {
            b"" | b"." | b".." => None,
            b if b.contains(&b'/') || b.contains(&0) => None,
            b => Some(Component(OsString::from_vec(b.to_vec()))),
        }
    }

    pub fn as_os_str(&self) -> &OsStr {
        &self.0
    }

    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// Opens the directory `name` in `dir`: never through a symlink, never outside `dir` (the
/// kernel checks it as well as [`Component`] does, where it has `openat2`).
pub fn open_dir(dir: &OwnedFd, name: &Component) -> rustix::io::Result<OwnedFd> {
    match rustix::fs::openat2(
        dir,
        name.as_os_str(),
        DIR_FLAGS,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    ) {
        // Kernels before 5.6, or a seccomp profile that hides the call (ENOSYS, or EPERM
        // under older container profiles): the Component already keeps the name beneath.
        Err(rustix::io::Errno::NOSYS) | Err(rustix::io::Errno::PERM) => {
            rustix::fs::openat(dir, name.as_os_str(), DIR_FLAGS, Mode::empty())
        }
        other => other,
    }
}

/// What to do with an entry that is a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visit {
    Descend,
    Skip,
}

/// What a walk does at each entry.
pub trait Visitor {
    /// An entry of `dir` (its type not followed through a link). Each directory's entries are
    /// listed before any is visited, so the visitor may remove them. `Descend` on a directory
    /// walks into it after this directory's other entries.
    fn entry(&mut self, dir: &OwnedFd, name: &Component, kind: FileType) -> io::Result<Visit>;

    /// A directory walked into is done; `parent` is its parent's descriptor.
    fn left(&mut self, _parent: &OwnedFd, _name: &Component) -> io::Result<()> {
        Ok(())
    }

    /// Ends the walk early (a budget spent).
    fn done(&self) -> bool {
        false
    }
}

type Identity = (u64, u64);

fn identity(fd: &OwnedFd) -> io::Result<Identity> {
    let st = rustix::fs::fstat(fd)?;
    Ok((st.st_dev, st.st_ino))
}

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Walks the tree below `root` (not `root` itself), depth first.
pub fn walk(root: &OwnedFd, visitor: &mut impl Visitor) -> io::Result<()> {
    struct Level {
        /// Directories of this level still to walk into, the next last.
        pending: Vec<Component>,
        id: Identity,
    }
    let mut current = rustix::io::dup(root)?;
    let mut levels = vec![Level {
        pending: visit_level(&current, visitor)?,
        id: identity(&current)?,
    }];
    // The names of the levels below the root, down to `current`.
    let mut names: Vec<Component> = Vec::new();
    while let Some(level) = levels.last_mut() {
        if visitor.done() {
            return Ok(());
        }
        if let Some(name) = level.pending.pop() {
            let next = match open_dir(&current, &name) {
                Ok(fd) => fd,
                // Gone, or no longer a directory since it was listed: nothing to walk.
                Err(rustix::io::Errno::NOENT)
                | Err(rustix::io::Errno::LOOP)
                | Err(rustix::io::Errno::NOTDIR) => continue,
                Err(e) => return Err(e.into()),
            };
            levels.push(Level {
                pending: visit_level(&next, visitor)?,
                id: identity(&next)?,
            });
            names.push(name);
            current = next;
            continue;
        }
        levels.pop();
        let (Some(name), Some(above)) = (names.pop(), levels.last()) else {
            return Ok(());
        };
        let parent = rustix::fs::openat(&current, "..", DIR_FLAGS, Mode::empty())?;
        if identity(&parent)? != above.id {
            return Err(io::Error::other(
                "a directory moved out of the tree while it was walked; stopped there",
            ));
        }
        visitor.left(&parent, &name)?;
        current = parent;
    }
    Ok(())
}

/// Removes everything below `root` (not `root` itself), never through a link, at any depth.
pub fn empty(root: &OwnedFd) -> io::Result<()> {
    struct Remove;
    impl Visitor for Remove {
        fn entry(&mut self, dir: &OwnedFd, name: &Component, kind: FileType) -> io::Result<Visit> {
            if kind == FileType::Directory {
                return Ok(Visit::Descend);
            }
            rustix::fs::unlinkat(dir, name.as_os_str(), AtFlags::empty())?;
            Ok(Visit::Skip)
        }
        fn left(&mut self, parent: &OwnedFd, name: &Component) -> io::Result<()> {
            rustix::fs::unlinkat(parent, name.as_os_str(), AtFlags::REMOVEDIR).map_err(Into::into)
        }
    }
    walk(root, &mut Remove)
}

/// Lists `dir`, visits each entry, and returns the directories to walk into, the first last.
fn visit_level(dir: &OwnedFd, visitor: &mut impl Visitor) -> io::Result<Vec<Component>> {
    let mut listed = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        // `.` and `..` are the only entries that are not components.
        let Some(name) = Component::new(entry.file_name().to_bytes()) else {
            continue;
        };
        let kind = match entry.file_type() {
            FileType::Unknown => {
                match rustix::fs::statat(dir, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) => FileType::from_raw_mode(st.st_mode),
                    Err(rustix::io::Errno::NOENT) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            kind => kind,
        };
        listed.push((name, kind));
    }
    let mut pending = Vec::new();
    for (name, kind) in listed {
        if visitor.done() {
            break;
        }
        if visitor.entry(dir, &name, kind)? == Visit::Descend && kind == FileType::Directory {
            pending.push(name);
        }
    }
    pending.reverse();
    Ok(pending)
}

/// Tests' deep tree: a chain of `depth` directories `d` below `dir`, each level holding an empty
/// file `f`, made by descriptor (its path is longer than any path the kernel takes). Returns
/// the bottom directory.
#[cfg(test)]
pub(crate) fn deep_chain(dir: &std::path::Path, depth: usize) -> OwnedFd {
    let mode = Mode::from_raw_mode(0o755);
    let mut at = rustix::fs::open(dir, OFlags::RDONLY | OFlags::DIRECTORY, mode).unwrap();
    for _ in 0..depth {
        rustix::fs::mkdirat(&at, "d", mode).unwrap();
        drop(rustix::fs::openat(&at, "f", OFlags::WRONLY | OFlags::CREATE, mode).unwrap());
        at = rustix::fs::openat(&at, "d", OFlags::RDONLY | OFlags::DIRECTORY, mode).unwrap();
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    struct Names(Vec<String>);
    impl Visitor for Names {
        fn entry(&mut self, _: &OwnedFd, name: &Component, kind: FileType) -> io::Result<Visit> {
            self.0.push(format!(
                "{}{}",
                String::from_utf8_lossy(name.as_bytes()),
                if kind == FileType::Directory { "/" } else { "" }
            ));
            Ok(Visit::Descend)
        }
    }

    fn open(path: &Path) -> OwnedFd {
        rustix::fs::open(path, DIR_FLAGS, Mode::empty()).unwrap()
    }

    #[test]
    fn a_walk_visits_every_entry_once_and_never_follows_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"s").unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/b/f"), b"f").unwrap();
        std::fs::write(dir.path().join("g"), b"g").unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("a/out")).unwrap();
        let mut names = Names(Vec::new());
        walk(&open(dir.path()), &mut names).unwrap();
        let mut seen = names.0;
        seen.sort();
        assert_eq!(seen, ["a/", "b/", "f", "g", "out"]);
    }

    #[test]
    fn a_tree_of_any_depth_is_removed_in_little_stack_and_few_descriptors() {
        // 5,000 levels: one descriptor per level would pass a process's usual 1,024, one
        // stack frame per level would overflow the 64 KiB this thread has.
        let outer = tempfile::tempdir().unwrap();
        std::fs::create_dir(outer.path().join("dest")).unwrap();
        std::fs::write(outer.path().join("beside"), b"b").unwrap();
        deep_chain(&outer.path().join("dest"), 5_000);
        let dest = outer.path().join("dest");
        std::thread::Builder::new()
            .stack_size(64 << 10)
            .spawn(move || {
                let fd = rustix::fs::open(&dest, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
                    .unwrap();
                empty(&fd).unwrap();
            })
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(
            std::fs::read_dir(outer.path().join("dest"))
                .unwrap()
                .count(),
            0
        );
        assert_eq!(std::fs::read(outer.path().join("beside")).unwrap(), b"b");
    }
}
