//! envd's directory watches, run by a file agent inside the sandbox: inotify on one directory
//! (recursive: on every directory below it too, each new one added as it appears), one JSON line
//! per change on stdout, until the host closes the agent's stdin.
//!
//! The agent runs as the request's user in the sandbox's root, like every file operation
//! ([`super::fs_ops`]), so a watch sees only what that user may list. Events name the changed
//! entry relative to the watched directory, and map inotify's bits as envd's (fsnotify's) do:
//! created or moved in is `CREATE`, modified `WRITE`, deleted `REMOVE`, moved out `RENAME`,
//! attributes `CHMOD`.

use std::collections::HashMap;
use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::RawFd;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::fs_ops::{FsError, FsErrorKind};

/// The first line a watch writes once its watches are in place: the host answers the
/// client's start then, and an error before it is the request's.
pub const READY: &str = "{\"ready\":true}";

/// Directories one watch may cover (each is one inotify watch of the sandbox's user).
const MAX_DIRECTORIES: usize = 8192;

const MASK: u32 = libc::IN_CREATE
    | libc::IN_MOVED_TO
    | libc::IN_MODIFY
    | libc::IN_DELETE
    | libc::IN_MOVED_FROM
    | libc::IN_ATTRIB
    | libc::IN_DELETE_SELF
    | libc::IN_ONLYDIR;

/// What envd reports for one inotify event, if anything.
fn event_type(mask: u32) -> Option<&'static str> {
    if mask & (libc::IN_CREATE | libc::IN_MOVED_TO) != 0 {
        Some("EVENT_TYPE_CREATE")
    } else if mask & libc::IN_MODIFY != 0 {
        Some("EVENT_TYPE_WRITE")
    } else if mask & libc::IN_DELETE != 0 {
        Some("EVENT_TYPE_REMOVE")
    } else if mask & libc::IN_MOVED_FROM != 0 {
        Some("EVENT_TYPE_RENAME")
    } else if mask & libc::IN_ATTRIB != 0 {
        Some("EVENT_TYPE_CHMOD")
    } else {
        None
    }
}

struct Inotify {
    fd: RawFd,
    /// Watch descriptor -> the directory it watches, relative to the watched root.
    dirs: HashMap<i32, PathBuf>,
    root: PathBuf,
}

impl Drop for Inotify {
    fn drop(&mut self) {
        // SAFETY: closing the descriptor this value owns.
        unsafe { libc::close(self.fd) };
    }
}

impl Inotify {
    fn add(&mut self, relative: &Path) -> Result<(), FsError> {
        if self.dirs.len() >= MAX_DIRECTORIES {
            return Err(FsError::new(
                FsErrorKind::InvalidArgument,
                format!(
                    "'{}' holds more than {MAX_DIRECTORIES} directories; watch a smaller tree",
                    self.root.display()
                ),
            ));
        }
        let full = self.root.join(relative);
        let c = CString::new(full.as_os_str().as_bytes()).map_err(|_| {
            FsError::new(FsErrorKind::InvalidArgument, "the path contains a NUL byte")
        })?;
        // SAFETY: a valid descriptor and a NUL-terminated path.
        let wd = unsafe { libc::inotify_add_watch(self.fd, c.as_ptr(), MASK) };
        if wd < 0 {
            let e = std::io::Error::last_os_error();
            let kind = match e.raw_os_error() {
                Some(libc::ENOENT) => FsErrorKind::NotFound,
                Some(libc::ENOTDIR) => FsErrorKind::InvalidArgument,
                Some(libc::EACCES | libc::EPERM) => FsErrorKind::PermissionDenied,
                Some(libc::ENOSPC) => FsErrorKind::NoSpace,
                _ => FsErrorKind::Internal,
            };
            let message = match kind {
                FsErrorKind::NotFound => format!("path '{}' does not exist", full.display()),
                FsErrorKind::InvalidArgument => {
                    format!("path '{}' is not a directory", full.display())
                }
                FsErrorKind::NoSpace => format!(
                    "watching '{}': the sandbox's user has no inotify watches left",
                    full.display()
                ),
                _ => format!("watching '{}': {e}", full.display()),
            };
            return Err(FsError::new(kind, message));
        }
        self.dirs.insert(wd, relative.to_path_buf());
        Ok(())
    }

    /// Watches `relative` and every directory below it (symlinks are not followed). A directory
    /// that vanished meanwhile is skipped.
    fn add_tree(&mut self, relative: &Path) -> Result<(), FsError> {
        let mut pending = vec![relative.to_path_buf()];
        while let Some(dir) = pending.pop() {
            match self.add(&dir) {
                Ok(()) => {}
                Err(e) if e.kind == FsErrorKind::NotFound && dir != relative => continue,
                Err(e) => return Err(e),
            }
            let Ok(entries) = std::fs::read_dir(self.root.join(&dir)) else {
                continue;
            };
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    pending.push(dir.join(entry.file_name()));
                }
            }
        }
        Ok(())
    }
}

/// Waits until `a` or `b` is readable or hung up; answers which.
fn poll2(a: RawFd, b: RawFd) -> std::io::Result<(bool, bool)> {
    let mut fds = [
        libc::pollfd {
            fd: a,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: b,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: two valid pollfd entries.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n >= 0 {
            let ready = |p: &libc::pollfd| p.revents != 0;
            return Ok((ready(&fds[0]), ready(&fds[1])));
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Watches `root` until `stop` (the agent's stdin) reaches its end or the root itself goes.
pub fn watch(
    root: &Path,
    recursive: bool,
    stop: RawFd,
    out: &mut dyn Write,
) -> Result<(), FsError> {
    let meta = std::fs::metadata(root).map_err(|e| {
        let kind = if e.kind() == std::io::ErrorKind::NotFound {
            FsErrorKind::NotFound
        } else {
            FsErrorKind::PermissionDenied
        };
        FsError::new(
            kind,
            format!(
                "path '{}' does not exist or cannot be read: {e}",
                root.display()
            ),
        )
    })?;
    if !meta.is_dir() {
        return Err(FsError::new(
            FsErrorKind::InvalidArgument,
            format!("path '{}' is not a directory", root.display()),
        ));
    }
    // SAFETY: inotify_init1 with a valid flag.
    let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
    if fd < 0 {
        return Err(FsError::new(
            FsErrorKind::Internal,
            format!("inotify: {}", std::io::Error::last_os_error()),
        ));
    }
    let mut inotify = Inotify {
        fd,
        dirs: HashMap::new(),
        root: root.to_path_buf(),
    };
    if recursive {
        inotify.add_tree(Path::new(""))?;
    } else {
        inotify.add(Path::new(""))?;
    }
    let gone =
        |e: std::io::Error| FsError::new(FsErrorKind::Internal, format!("writing an event: {e}"));
    writeln!(out, "{READY}")
        .and_then(|()| out.flush())
        .map_err(gone)?;

    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let (events, stopped) = poll2(fd, stop)
            .map_err(|e| FsError::new(FsErrorKind::Internal, format!("poll: {e}")))?;
        if stopped {
            let mut byte = [0u8; 512];
            // SAFETY: reading into a local buffer from an inherited descriptor.
            let n = unsafe { libc::read(stop, byte.as_mut_ptr().cast(), byte.len()) };
            if n <= 0 {
                return Ok(());
            }
        }
        if !events {
            continue;
        }
        // SAFETY: reading into a buffer of the given length.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(FsError::new(FsErrorKind::Internal, format!("inotify: {e}")));
        }
        let mut at = 0usize;
        let header = std::mem::size_of::<libc::inotify_event>();
        while at + header <= n as usize {
            // SAFETY: the kernel wrote whole events; read the header unaligned.
            let event: libc::inotify_event =
                unsafe { std::ptr::read_unaligned(buf[at..].as_ptr().cast()) };
            let name_bytes = &buf[at + header..at + header + event.len as usize];
            at += header + event.len as usize;
            let name_end = name_bytes
                .iter()
                .position(|b| *b == 0)
                .unwrap_or(name_bytes.len());
            let name = std::ffi::OsStr::from_bytes(&name_bytes[..name_end]);
            let Some(dir) = inotify.dirs.get(&event.wd).cloned() else {
                continue;
            };
            if event.mask & libc::IN_IGNORED != 0 {
                inotify.dirs.remove(&event.wd);
                continue;
            }
            if event.mask & libc::IN_DELETE_SELF != 0 {
                if dir.as_os_str().is_empty() {
                    // The watched directory itself is gone: nothing more can come.
                    return Ok(());
                }
                continue;
            }
            let relative = dir.join(name);
            if recursive
                && event.mask & libc::IN_ISDIR != 0
                && event.mask & (libc::IN_CREATE | libc::IN_MOVED_TO) != 0
            {
                // Its contents may have been made before the watch: those are not reported,
                // as envd's fsnotify does not either.
                let _ = inotify.add_tree(&relative);
            }
            let Some(kind) = event_type(event.mask) else {
                continue;
            };
            let line = json!({"name": relative.to_string_lossy(), "type": kind});
            writeln!(out, "{line}").map_err(gone)?;
        }
        out.flush().map_err(gone)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inotify_bits_map_to_envds_event_types() {
        assert_eq!(event_type(libc::IN_CREATE), Some("EVENT_TYPE_CREATE"));
        assert_eq!(event_type(libc::IN_MOVED_TO), Some("EVENT_TYPE_CREATE"));
        assert_eq!(event_type(libc::IN_MODIFY), Some("EVENT_TYPE_WRITE"));
        assert_eq!(event_type(libc::IN_DELETE), Some("EVENT_TYPE_REMOVE"));
        assert_eq!(event_type(libc::IN_MOVED_FROM), Some("EVENT_TYPE_RENAME"));
        assert_eq!(event_type(libc::IN_ATTRIB), Some("EVENT_TYPE_CHMOD"));
        assert_eq!(event_type(libc::IN_IGNORED), None);
    }

    #[test]
    fn a_recursive_watch_reports_changes_below_it_until_its_stop_closes() {
        use std::io::BufRead;
        let dir = tempfile::tempdir().unwrap();
        let mut pipe = [0; 2];
        // SAFETY: a pipe into a local array.
        assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
        let (stop_read, stop_write) = (pipe[0], pipe[1]);
        let (theirs, ours) = std::os::unix::net::UnixStream::pair().unwrap();
        let root = dir.path().to_path_buf();
        let watcher = std::thread::spawn(move || {
            let mut out = theirs;
            let watched = watch(&root, true, stop_read, &mut out);
            // SAFETY: closing the read end this thread was given.
            unsafe { libc::close(stop_read) };
            watched
        });
        let mut lines = std::io::BufReader::new(ours).lines();
        let mut next = || lines.next().unwrap().unwrap();
        assert_eq!(next(), READY);
        std::fs::write(dir.path().join("a.txt"), "a").unwrap();
        assert_eq!(next(), r#"{"name":"a.txt","type":"EVENT_TYPE_CREATE"}"#);
        assert_eq!(next(), r#"{"name":"a.txt","type":"EVENT_TYPE_WRITE"}"#);
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        assert_eq!(next(), r#"{"name":"sub","type":"EVENT_TYPE_CREATE"}"#);
        // The new directory is watched once its creation was reported.
        std::fs::File::create(dir.path().join("sub/b.txt")).unwrap();
        assert_eq!(next(), r#"{"name":"sub/b.txt","type":"EVENT_TYPE_CREATE"}"#);
        std::fs::rename(dir.path().join("a.txt"), dir.path().join("sub/c.txt")).unwrap();
        assert_eq!(next(), r#"{"name":"a.txt","type":"EVENT_TYPE_RENAME"}"#);
        assert_eq!(next(), r#"{"name":"sub/c.txt","type":"EVENT_TYPE_CREATE"}"#);
        std::fs::remove_file(dir.path().join("sub/b.txt")).unwrap();
        assert_eq!(next(), r#"{"name":"sub/b.txt","type":"EVENT_TYPE_REMOVE"}"#);
        // SAFETY: closing the write end: the watch ends.
        unsafe { libc::close(stop_write) };
        watcher.join().unwrap().unwrap();
    }

    #[test]
    fn a_missing_path_or_a_file_is_refused_before_anything_is_watched() {
        let dir = tempfile::tempdir().unwrap();
        let mut out = Vec::new();
        let missing = watch(&dir.path().join("nope"), false, -1, &mut out).unwrap_err();
        assert_eq!(missing.kind, FsErrorKind::NotFound);
        std::fs::write(dir.path().join("f"), "").unwrap();
        let file = watch(&dir.path().join("f"), false, -1, &mut out).unwrap_err();
        assert_eq!(file.kind, FsErrorKind::InvalidArgument);
        assert!(out.is_empty(), "no ready line before a refusal");
    }
}
