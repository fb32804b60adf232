//! File operations of a launched sandbox, served by the agent inside it: envd's
//! `filesystem.Filesystem` RPCs and the bodies of its `/files` routes.
//!
//! The agent already runs in the sandbox's root and as the request's user, so the kernel
//! enforces both the sandbox boundary and the user's permissions. What is left to this module
//! is what the tenant controls inside that root: symlinks (never followed where envd acts on the
//! link itself), FIFOs and devices (never read as if they were files), and an `/etc/passwd` that
//! may be anything. Answers are envd's protojson shapes on the agent's stdout; refusals are
//! [`FsError`]s, one line on the status pipe.

use std::cell::OnceCell;
use std::collections::HashMap;
use std::fmt;
use std::fs::{self, File, Metadata, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::{json, Map, Value};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub enum FsRequest {
    /// Copies the file's bytes to `out`. A directory is InvalidArgument, a missing path NotFound.
    Read { path: String },
    /// Replaces the file with `input` (read to EOF), creating missing parents; answers one JSON
    /// line `{"path", "name", "type": "file"}`. A directory is InvalidArgument.
    Write { path: String },
    /// envd ListDir to `depth` levels (1: direct children), `{"entries": [EntryInfo…]}`.
    List { path: String, depth: u32 },
    /// envd Stat: `{"entry": EntryInfo}`.
    Stat { path: String },
    /// envd MakeDir (`mkdir -p`): `{"entry": EntryInfo}`; an existing path is AlreadyExists.
    MakeDir { path: String },
    /// envd Remove: a file, a symlink (never its target) or a directory tree; answers `{}`.
    Remove { path: String },
    /// envd Move: rename(2), creating the destination's parents; `{"entry": EntryInfo}`.
    Move { source: String, destination: String },
    /// envd WatchDir / CreateWatcher: [`READY`](super::fs_watch::READY), then one JSON line
    /// per change, until stdin reaches its end ([`super::fs_watch`]).
    Watch { path: String, recursive: bool },
    /// A tar of the path (followed if it is a symlink) on `out`, its top entry named after the
    /// path's last component ([`super::fs_archive`]): a multi-stage build's `COPY --from`.
    Archive { path: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum FsErrorKind {
    NotFound,
    InvalidArgument,
    AlreadyExists,
    PermissionDenied,
    NoSpace,
    Internal,
}

const KINDS: [(FsErrorKind, &str); 6] = [
    (FsErrorKind::NotFound, "not_found"),
    (FsErrorKind::InvalidArgument, "invalid_argument"),
    (FsErrorKind::AlreadyExists, "already_exists"),
    (FsErrorKind::PermissionDenied, "permission_denied"),
    (FsErrorKind::NoSpace, "no_space"),
    (FsErrorKind::Internal, "internal"),
];

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FsError {
    pub kind: FsErrorKind,
    pub message: String,
}

impl FsError {
    pub fn new(kind: FsErrorKind, message: impl Into<String>) -> FsError {
        FsError {
            kind,
            message: message.into(),
        }
    }

    /// One line for the status pipe, so the host can answer with the right protocol code
    /// instead of a generic failure: `fs <kind> <message>`.
    pub fn encode(&self) -> String {
        let token = KINDS
            .iter()
            .find(|(k, _)| *k == self.kind)
            .map_or("internal", |(_, t)| t);
        format!("fs {token} {}", self.message.replace(['\n', '\r'], " "))
    }

    /// The error a status line carries, if it is one of [`FsError::encode`]'s.
    pub fn decode(line: &str) -> Option<FsError> {
        let rest = line.strip_prefix("fs ")?;
        let (token, message) = rest.split_once(' ').unwrap_or((rest, ""));
        let kind = KINDS.iter().find(|(_, t)| *t == token)?.0;
        Some(FsError::new(kind, message))
    }
}

impl fmt::Display for FsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for FsError {}

fn invalid(message: impl Into<String>) -> FsError {
    FsError::new(FsErrorKind::InvalidArgument, message)
}

fn internal(message: impl Into<String>) -> FsError {
    FsError::new(FsErrorKind::Internal, message)
}

fn is_a_directory(path: &Path) -> FsError {
    invalid(format!("path '{}' is a directory", path.display()))
}

/// Only regular files are read: a FIFO would hang the agent and a device never ends.
fn check_regular(meta: &Metadata, path: &Path) -> Result<(), FsError> {
    if meta.is_dir() {
        return Err(is_a_directory(path));
    }
    if !meta.is_file() {
        return Err(invalid(format!(
            "path '{}' is not a regular file",
            path.display()
        )));
    }
    Ok(())
}

/// Which side of a copy failed: the two are different faults with different wording.
enum CopyError {
    Read(io::Error),
    Write(io::Error),
}

fn copy(from: &mut dyn Read, to: &mut dyn Write) -> Result<(), CopyError> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => to.write_all(&buf[..n]).map_err(CopyError::Write)?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(CopyError::Read(e)),
        }
    }
}

/// The protocol's view of an errno: the client's mistakes (a file where a directory must be,
/// a name too long) are its to fix, not a server fault.
fn kind_of(e: &io::Error) -> FsErrorKind {
    use FsErrorKind::*;
    if e.kind() == io::ErrorKind::NotFound {
        return NotFound;
    }
    match e.raw_os_error() {
        Some(libc::EACCES | libc::EPERM | libc::EROFS) => PermissionDenied,
        Some(libc::ENOSPC | libc::EDQUOT) => NoSpace,
        Some(libc::EEXIST | libc::ENOTEMPTY) => AlreadyExists,
        Some(libc::ENOTDIR | libc::EISDIR | libc::ELOOP | libc::ENAMETOOLONG) => InvalidArgument,
        _ if e.kind() == io::ErrorKind::PermissionDenied => PermissionDenied,
        _ if e.kind() == io::ErrorKind::InvalidInput => InvalidArgument,
        _ => Internal,
    }
}

fn io_error(op: &str, path: &Path, e: &io::Error) -> FsError {
    match kind_of(e) {
        FsErrorKind::NotFound => FsError::new(
            FsErrorKind::NotFound,
            format!("path '{}' does not exist", path.display()),
        ),
        kind => FsError::new(kind, format!("{op} '{}': {e}", path.display())),
    }
}

/// Resolves `path` as envd does: absolute as given, `~` and `~/…` in `home`, anything else
/// relative to `home`. `.` and `..` are resolved lexically (never above `/`) so the answer names
/// the path the client asked for, whatever symlinks it crosses.
pub fn resolve(path: &str, home: &str) -> Result<PathBuf, FsError> {
    if path.is_empty() {
        return Err(invalid("the path is empty"));
    }
    if path.contains('\0') || home.contains('\0') {
        return Err(invalid(format!(
            "path '{}' contains a NUL byte",
            path.escape_debug()
        )));
    }
    let segments: [&str; 2] = if path.starts_with('/') {
        [path, ""]
    } else if path == "~" || path.starts_with("~/") {
        [home, &path[1..]]
    } else if path.starts_with('~') {
        return Err(invalid(format!(
            "path '{path}': cannot expand another user's home"
        )));
    } else {
        [home, path]
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in segments.iter().flat_map(|s| s.split('/')) {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            name => parts.push(name),
        }
    }
    Ok(PathBuf::from(format!("/{}", parts.join("/"))))
}

/// Owner and group names from the sandbox's own `/etc/passwd` and `/etc/group`: the agent has
/// no NSS, and the host's databases would name the wrong accounts. Read on the first lookup
/// only, so operations that never name an owner never read them.
#[derive(Debug)]
pub struct Names {
    root: PathBuf,
    tables: OnceCell<(HashMap<u32, String>, HashMap<u32, String>)>,
}

/// Most bytes of an account file read: the tenant may have made it huge.
const MAX_ACCOUNT_FILE: u64 = 16 << 20;

impl Names {
    pub fn new(root: &Path) -> Names {
        Names {
            root: root.to_path_buf(),
            tables: OnceCell::new(),
        }
    }

    fn tables(&self) -> &(HashMap<u32, String>, HashMap<u32, String>) {
        self.tables.get_or_init(|| {
            let load = |file: &str| parse_ids(&read_account_file(&self.root.join(file)));
            (load("etc/passwd"), load("etc/group"))
        })
    }

    /// The user's name, or its number when the sandbox does not name it.
    pub fn user(&self, uid: u32) -> String {
        self.tables()
            .0
            .get(&uid)
            .cloned()
            .unwrap_or_else(|| uid.to_string())
    }

    pub fn group(&self, gid: u32) -> String {
        self.tables()
            .1
            .get(&gid)
            .cloned()
            .unwrap_or_else(|| gid.to_string())
    }
}

/// Only a regular file, and only so much of it: `/etc/passwd` may be a FIFO or `/dev/zero`.
fn read_account_file(path: &Path) -> String {
    let Ok(file) = open_regular(path) else {
        return String::new();
    };
    let mut bytes = Vec::new();
    let _ = file.take(MAX_ACCOUNT_FILE).read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// `name:x:id:…` lines (passwd and group alike) by id; the first name of an id wins, as in libc.
fn parse_ids(text: &str) -> HashMap<u32, String> {
    let mut ids = HashMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let fields: Vec<&str> = line.split(':').collect();
        if let (Some(name), Some(Ok(id))) =
            (fields.first(), fields.get(2).map(|f| f.parse::<u32>()))
        {
            if !name.is_empty() {
                ids.entry(id).or_insert_with(|| (*name).to_owned());
            }
        }
    }
    ids
}

/// Opens `path` for reading only if it is a regular file. O_NONBLOCK so opening a FIFO cannot
/// hang the agent, O_NOCTTY so a tty cannot become its terminal; the type is checked on the
/// opened descriptor, so a swap after a check cannot smuggle a device in.
fn open_regular(path: &Path) -> Result<File, FsError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| io_error("opening", path, &e))?;
    let meta = file.metadata().map_err(|e| io_error("stat", path, &e))?;
    check_regular(&meta, path)?;
    Ok(file)
}

/// Go's `FileMode.String()`, which envd sends: type letters from `dalTLDpSugct?` (`L` for a
/// symlink, `D` plus `c` for a character device, `u`/`g`/`t` for setuid, setgid, sticky) or
/// `-`, then `rwxrwxrwx`.
fn go_mode_string(mode: u32) -> String {
    let format = mode & libc::S_IFMT;
    let mut s = String::with_capacity(12);
    let letters = [
        (format == libc::S_IFDIR, 'd'),
        (format == libc::S_IFLNK, 'L'),
        (format == libc::S_IFBLK || format == libc::S_IFCHR, 'D'),
        (format == libc::S_IFIFO, 'p'),
        (format == libc::S_IFSOCK, 'S'),
        (mode & libc::S_ISUID != 0, 'u'),
        (mode & libc::S_ISGID != 0, 'g'),
        (format == libc::S_IFCHR, 'c'),
        (mode & libc::S_ISVTX != 0, 't'),
    ];
    s.extend(letters.iter().filter(|(set, _)| *set).map(|(_, c)| *c));
    if s.is_empty() {
        s.push('-');
    }
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        s.push(if mode & (1 << (8 - i)) != 0 { c } else { '-' });
    }
    s
}

/// protojson's Timestamp: RFC 3339 in UTC with 0, 3, 6 or 9 fractional digits.
fn modified_time(meta: &Metadata) -> Option<String> {
    let nanos = u32::try_from(meta.mtime_nsec())
        .ok()
        .filter(|n| *n < 1_000_000_000)
        .unwrap_or(0);
    chrono::DateTime::from_timestamp(meta.mtime(), nanos)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true))
}

/// envd's EntryInfo of `path` (not following a final symlink), as protojson.
pub fn entry_info(path: &Path) -> Result<Value, FsError> {
    entry_info_with(path, &Names::new(Path::new("/")))
}

/// [`entry_info`] with names from `names`, so a listing reads the account files once.
pub fn entry_info_with(path: &Path, names: &Names) -> Result<Value, FsError> {
    let meta = fs::symlink_metadata(path).map_err(|e| io_error("stat", path, &e))?;
    let is_link = meta.file_type().is_symlink();
    // A symlink has its target's type, as the SDK's clients branch on it to descend or read;
    // a dangling one is a file.
    let is_dir = if is_link {
        fs::metadata(path).is_ok_and(|t| t.is_dir())
    } else {
        meta.is_dir()
    };
    let name = path
        .file_name()
        .map_or_else(|| path.to_string_lossy(), |n| n.to_string_lossy());
    let mut entry = Map::new();
    entry.insert("name".into(), json!(name));
    let kind = if is_dir {
        "FILE_TYPE_DIRECTORY"
    } else {
        "FILE_TYPE_FILE"
    };
    entry.insert("type".into(), json!(kind));
    entry.insert("path".into(), json!(path.to_string_lossy()));
    // protojson omits default values and sends int64 as a string.
    if meta.len() != 0 {
        entry.insert("size".into(), json!(meta.len().to_string()));
    }
    if meta.mode() & 0o777 != 0 {
        entry.insert("mode".into(), json!(meta.mode() & 0o777));
    }
    entry.insert("permissions".into(), json!(go_mode_string(meta.mode())));
    entry.insert("owner".into(), json!(names.user(meta.uid())));
    entry.insert("group".into(), json!(names.group(meta.gid())));
    if let Some(time) = modified_time(&meta) {
        entry.insert("modifiedTime".into(), json!(time));
    }
    if is_link {
        if let Ok(target) = fs::read_link(path) {
            entry.insert("symlinkTarget".into(), json!(target.to_string_lossy()));
        }
        entry.insert("isSymlink".into(), json!(true));
    }
    Ok(Value::Object(entry))
}

/// Runs `request`; `home` is the user's home directory; reads `input` only for Write; writes the
/// answer to `out`.
pub fn run(
    request: &FsRequest,
    home: &str,
    input: &mut dyn Read,
    out: &mut dyn Write,
) -> Result<(), FsError> {
    let names = Names::new(Path::new("/"));
    let entry = |path: &Path| Ok::<_, FsError>(json!({ "entry": entry_info_with(path, &names)? }));
    match request {
        FsRequest::Read { path } => read(&resolve(path, home)?, out),
        FsRequest::Write { path } => write(&resolve(path, home)?, input, out),
        FsRequest::List { path, depth } => {
            let path = resolve(path, home)?;
            answer(out, &path, &list(&path, *depth, &names)?)
        }
        FsRequest::Stat { path } => {
            let path = resolve(path, home)?;
            answer(out, &path, &entry(&path)?)
        }
        FsRequest::MakeDir { path } => {
            let path = resolve(path, home)?;
            make_dir(&path)?;
            answer(out, &path, &entry(&path)?)
        }
        FsRequest::Remove { path } => {
            let path = resolve(path, home)?;
            remove(&path)?;
            answer(out, &path, &json!({}))
        }
        FsRequest::Move {
            source,
            destination,
        } => {
            let (source, destination) = (resolve(source, home)?, resolve(destination, home)?);
            move_entry(&source, &destination)?;
            answer(out, &destination, &entry(&destination)?)
        }
        // Stopped by the end of the agent's stdin, descriptor 0 (the host drops its end).
        FsRequest::Watch { path, recursive } => {
            super::fs_watch::watch(&resolve(path, home)?, *recursive, 0, out)
        }
        FsRequest::Archive { path } => super::fs_archive::archive(&resolve(path, home)?, out),
    }
}

fn answer(out: &mut dyn Write, path: &Path, value: &Value) -> Result<(), FsError> {
    let mut line = value.to_string().into_bytes();
    line.push(b'\n');
    out.write_all(&line)
        .map_err(|e| internal(format!("writing the answer for '{}': {e}", path.display())))
}

fn read(path: &Path, out: &mut dyn Write) -> Result<(), FsError> {
    // Checked before opening too, so a device is never even opened (opening some has effects).
    if let Ok(meta) = fs::metadata(path) {
        check_regular(&meta, path)?;
    }
    copy(&mut open_regular(path)?, out).map_err(|e| match e {
        CopyError::Read(e) => io_error("reading", path, &e),
        CopyError::Write(e) => internal(format!("sending '{}': {e}", path.display())),
    })
}

fn make_dirs(dir: &Path) -> Result<(), FsError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(|e| io_error("creating directory", dir, &e))
}

/// Distinguishes temp files of concurrent writes by one agent; the pid and clock, of agents.
static TEMP_COUNTER: AtomicU32 = AtomicU32::new(0);

/// A fresh file next to where the upload goes, so the final rename stays on one filesystem.
/// O_EXCL never follows a symlink, so a planted link cannot redirect the bytes.
fn create_temp(dir: &Path) -> Result<(PathBuf, File), FsError> {
    let clock = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    for _ in 0..64 {
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(
            ".strata-upload-{}-{clock:x}-{n}",
            std::process::id()
        ));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
        {
            Ok(file) => return Ok((tmp, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_error("creating a file in", dir, &e)),
        }
    }
    Err(internal(format!(
        "no free temporary name in '{}'",
        dir.display()
    )))
}

/// Writes to a temp file and renames it over `path`: readers see the old file or the new one,
/// never half of one, and a symlink at `path` is replaced rather than written through.
fn write(path: &Path, input: &mut dyn Read, out: &mut dyn Write) -> Result<(), FsError> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(is_a_directory(path));
    };
    // A replaced file keeps its permissions, as envd's in-place write would.
    let mode = match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => return Err(is_a_directory(path)),
        Ok(meta) if meta.is_file() => meta.mode() & 0o777,
        Ok(_) => 0o644,
        Err(e) if e.kind() == io::ErrorKind::NotFound => 0o644,
        Err(e) => return Err(io_error("stat", path, &e)),
    };
    make_dirs(dir)?;
    let (tmp, mut file) = create_temp(dir)?;
    let written = (|| {
        copy(input, &mut file).map_err(|e| match e {
            CopyError::Read(e) => {
                internal(format!("reading the upload for '{}': {e}", path.display()))
            }
            CopyError::Write(e) => io_error("writing", path, &e),
        })?;
        // Explicit, so the agent's umask does not decide what the user gets.
        file.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(|e| io_error("setting the mode of", path, &e))?;
        drop(file);
        fs::rename(&tmp, path).map_err(|e| io_error("replacing", path, &e))
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    let answer_line = json!({
        "path": path.to_string_lossy(),
        "name": name.to_string_lossy(),
        "type": "file",
    });
    answer(out, path, &answer_line)
}

/// Most entries one listing collects: past it the answer could not be read back anyway, and a
/// hostile tree must not exhaust the agent's memory first.
const MAX_ENTRIES: usize = 250_000;

/// Walks breadth by an explicit stack (a deep tree cannot overflow ours) and only into real
/// directories: a symlinked directory is listed, never entered.
fn list(root: &Path, depth: u32, names: &Names) -> Result<Value, FsError> {
    let meta = fs::metadata(root).map_err(|e| io_error("stat", root, &e))?;
    if !meta.is_dir() {
        return Err(invalid(format!(
            "path '{}' is not a directory",
            root.display()
        )));
    }
    let depth = depth.max(1);
    let mut entries: Vec<(PathBuf, Value)> = Vec::new();
    let mut pending: Vec<(PathBuf, u32)> = vec![(root.to_path_buf(), 1)];
    while let Some((dir, level)) = pending.pop() {
        let reader = match fs::read_dir(&dir) {
            Ok(reader) => reader,
            Err(e) if level == 1 => return Err(io_error("listing", &dir, &e)),
            // A subdirectory the user cannot read is still listed itself; envd's clients expect
            // the rest of the tree rather than a failure.
            Err(_) => continue,
        };
        for item in reader.flatten() {
            let path = dir.join(item.file_name());
            // Gone between readdir and lstat: it is simply not there any more.
            let Ok(info) = entry_info_with(&path, names) else {
                continue;
            };
            if level < depth && item.file_type().is_ok_and(|t| t.is_dir()) {
                pending.push((path.clone(), level + 1));
            }
            entries.push((path, info));
            if entries.len() > MAX_ENTRIES {
                return Err(invalid(format!(
                    "more than {MAX_ENTRIES} entries under '{}'; list with a smaller depth",
                    root.display()
                )));
            }
        }
    }
    // Path order is component-wise, as envd's walk emits them ("a", "a/x", "a-b").
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let entries: Vec<Value> = entries.into_iter().map(|(_, v)| v).collect();
    Ok(json!({ "entries": entries }))
}

fn make_dir(path: &Path) -> Result<(), FsError> {
    match fs::symlink_metadata(path) {
        Ok(_) if fs::metadata(path).is_ok_and(|m| m.is_dir()) => Err(FsError::new(
            FsErrorKind::AlreadyExists,
            format!("directory '{}' already exists", path.display()),
        )),
        Ok(_) => Err(FsError::new(
            FsErrorKind::AlreadyExists,
            format!(
                "path '{}' already exists and is not a directory",
                path.display()
            ),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => make_dirs(path),
        Err(e) => Err(io_error("stat", path, &e)),
    }
}

/// `remove_dir_all` does not follow symlinks inside the tree and removes a symlink at the top
/// itself, even if it was swapped in after the lstat.
fn remove(path: &Path) -> Result<(), FsError> {
    if path == Path::new("/") {
        return Err(invalid("refusing to remove '/'"));
    }
    let meta = fs::symlink_metadata(path).map_err(|e| io_error("stat", path, &e))?;
    let removed = if meta.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    };
    removed.map_err(|e| io_error("removing", path, &e))
}

fn move_entry(source: &Path, destination: &Path) -> Result<(), FsError> {
    fs::symlink_metadata(source).map_err(|e| io_error("stat", source, &e))?;
    if source == Path::new("/") || (destination != source && destination.starts_with(source)) {
        return Err(invalid(format!(
            "cannot move '{}' into itself ('{}')",
            source.display(),
            destination.display()
        )));
    }
    if let Some(parent) = destination.parent() {
        make_dirs(parent)?;
    }
    // Both paths in the message: either side may be the one the kernel refused.
    fs::rename(source, destination).map_err(|e| {
        FsError::new(
            kind_of(&e),
            format!(
                "moving '{}' to '{}': {e}",
                source.display(),
                destination.display()
            ),
        )
    })
}

/// How an upload reaches a Write agent: frames of a big-endian `u32` length and that many
/// bytes, ended by an empty frame. The pipe closing before the empty frame is an aborted upload
/// (the client went away mid-body), which must leave the old file as it was, not a truncated
/// one in its place; a bare end of input could not tell the two apart.
pub mod upload_frames {
    use std::io::{self, Read};

    /// One frame of `data` (at most `u32::MAX` bytes); an empty `data` is the end.
    pub fn frame(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + data.len());
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        out.extend_from_slice(data);
        out
    }

    /// The bytes of the frames `inner` carries; an error when it ends before the end frame.
    pub struct Unframed<R> {
        inner: R,
        left: usize,
        done: bool,
    }

    impl<R: Read> Unframed<R> {
        pub fn new(inner: R) -> Self {
            Unframed {
                inner,
                left: 0,
                done: false,
            }
        }
    }

    impl<R: Read> Read for Unframed<R> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.done || buf.is_empty() {
                return Ok(0);
            }
            if self.left == 0 {
                let mut len = [0u8; 4];
                self.inner.read_exact(&mut len).map_err(|_| {
                    io::Error::new(io::ErrorKind::UnexpectedEof, "the upload was cut off")
                })?;
                self.left = u32::from_be_bytes(len) as usize;
                if self.left == 0 {
                    self.done = true;
                    return Ok(0);
                }
            }
            let want = buf.len().min(self.left);
            let n = self.inner.read(&mut buf[..want])?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the upload was cut off",
                ));
            }
            self.left -= n;
            Ok(n)
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn framed_bytes_come_back_whole_and_a_cut_stream_is_an_error() {
            let mut wire = frame(b"hello ");
            wire.extend(frame(b"world"));
            wire.extend(frame(b""));
            let mut out = String::new();
            Unframed::new(&wire[..]).read_to_string(&mut out).unwrap();
            assert_eq!(out, "hello world");
            let cut = &wire[..wire.len() - 4];
            let mut out = Vec::new();
            assert!(Unframed::new(cut).read_to_end(&mut out).is_err());
            let mid = &wire[..7];
            assert!(Unframed::new(mid).read_to_end(&mut Vec::new()).is_err());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn call(request: FsRequest, home: &Path) -> Result<Vec<u8>, FsError> {
        call_with(request, home, b"")
    }

    fn call_with(request: FsRequest, home: &Path, input: &[u8]) -> Result<Vec<u8>, FsError> {
        let mut out = Vec::new();
        run(&request, home.to_str().unwrap(), &mut &input[..], &mut out)?;
        Ok(out)
    }

    fn json_of(request: FsRequest, home: &Path) -> Value {
        serde_json::from_slice(&call(request, home).unwrap()).unwrap()
    }

    fn p(path: &Path) -> String {
        path.to_str().unwrap().to_owned()
    }

    fn stat(path: &Path) -> Value {
        json_of(FsRequest::Stat { path: p(path) }, Path::new("/"))["entry"].clone()
    }

    fn list_paths(path: &Path, depth: u32) -> Vec<String> {
        let answer = json_of(
            FsRequest::List {
                path: p(path),
                depth,
            },
            Path::new("/"),
        );
        let entries = answer["entries"].as_array().unwrap();
        entries
            .iter()
            .map(|e| e["path"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn write_then_read_round_trips_and_creates_parents() {
        let home = tempfile::tempdir().unwrap();
        let file = home.path().join("a/b/c.txt");
        let out = call_with(FsRequest::Write { path: p(&file) }, home.path(), b"hello").unwrap();
        let answer: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            answer,
            json!({"path": p(&file), "name": "c.txt", "type": "file"})
        );
        assert!(home.path().join("a/b").is_dir());
        assert_eq!(fs::metadata(&file).unwrap().mode() & 0o777, 0o644);
        assert_eq!(
            call(FsRequest::Read { path: p(&file) }, home.path()).unwrap(),
            b"hello"
        );
        // Relative to home, and replacing: no temp files left behind.
        call_with(
            FsRequest::Write {
                path: "a/b/c.txt".into(),
            },
            home.path(),
            b"bye",
        )
        .unwrap();
        assert_eq!(fs::read(&file).unwrap(), b"bye");
        assert_eq!(fs::read_dir(home.path().join("a/b")).unwrap().count(), 1);
    }

    #[test]
    fn write_replaces_a_symlink_instead_of_following_it() {
        let home = tempfile::tempdir().unwrap();
        let target = home.path().join("target");
        fs::write(&target, "orig").unwrap();
        let link = home.path().join("link");
        symlink(&target, &link).unwrap();
        call_with(FsRequest::Write { path: p(&link) }, home.path(), b"new").unwrap();
        assert!(fs::symlink_metadata(&link).unwrap().is_file());
        assert_eq!(fs::read(&link).unwrap(), b"new");
        assert_eq!(fs::read(&target).unwrap(), b"orig");
    }

    #[test]
    fn write_to_a_directory_and_read_of_non_files_are_invalid() {
        let home = tempfile::tempdir().unwrap();
        let dir = p(home.path());
        let err = call_with(FsRequest::Write { path: dir.clone() }, home.path(), b"x").unwrap_err();
        assert_eq!(err.kind, FsErrorKind::InvalidArgument);
        let err = call(FsRequest::Read { path: dir }, home.path()).unwrap_err();
        assert_eq!(err.kind, FsErrorKind::InvalidArgument);
        let fifo = home.path().join("fifo");
        let c = std::ffi::CString::new(p(&fifo)).unwrap();
        // SAFETY: mkfifo on a NUL-terminated path in a temp dir.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let err = call(FsRequest::Read { path: p(&fifo) }, home.path()).unwrap_err();
        assert_eq!(err.kind, FsErrorKind::InvalidArgument);
        let missing = home.path().join("missing");
        let err = call(FsRequest::Read { path: p(&missing) }, home.path()).unwrap_err();
        assert_eq!(err.kind, FsErrorKind::NotFound);
        assert_eq!(
            err.message,
            format!("path '{}' does not exist", p(&missing))
        );
    }

    #[test]
    fn list_sorts_by_path_and_does_not_enter_symlinks() {
        let home = tempfile::tempdir().unwrap();
        let h = home.path();
        fs::create_dir_all(h.join("a/deep")).unwrap();
        fs::write(h.join("a/x"), "1").unwrap();
        fs::write(h.join("a/deep/y"), "2").unwrap();
        fs::write(h.join("b"), "").unwrap();
        fs::create_dir(h.join("a-c")).unwrap();
        symlink(h.join("a"), h.join("link")).unwrap();
        let rel = |names: &[&str]| names.iter().map(|n| p(&h.join(n))).collect::<Vec<_>>();
        assert_eq!(list_paths(h, 1), rel(&["a", "a-c", "b", "link"]));
        assert_eq!(list_paths(h, 0), rel(&["a", "a-c", "b", "link"]));
        assert_eq!(
            list_paths(h, 2),
            rel(&["a", "a/deep", "a/x", "a-c", "b", "link"])
        );
        // A symlinked directory as the root is listed through, under the asked path.
        assert_eq!(
            list_paths(&h.join("link"), 1),
            rel(&["link/deep", "link/x"])
        );
        let err = call(
            FsRequest::List {
                path: p(&h.join("b")),
                depth: 1,
            },
            h,
        )
        .unwrap_err();
        assert_eq!(err.kind, FsErrorKind::InvalidArgument);
        let err = call(
            FsRequest::List {
                path: p(&h.join("nope")),
                depth: 1,
            },
            h,
        )
        .unwrap_err();
        assert_eq!(err.kind, FsErrorKind::NotFound);
    }

    #[test]
    fn stat_reports_envd_entry_info() {
        let home = tempfile::tempdir().unwrap();
        let h = home.path();
        let file = h.join("hello.txt");
        fs::write(&file, "abc").unwrap();
        fs::set_permissions(&file, fs::Permissions::from_mode(0o644)).unwrap();
        let entry = stat(&file);
        assert_eq!(entry["name"], "hello.txt");
        assert_eq!(entry["type"], "FILE_TYPE_FILE");
        assert_eq!(entry["path"], p(&file));
        assert_eq!(entry["size"], "3");
        assert_eq!(entry["mode"], 420);
        assert_eq!(entry["permissions"], "-rw-r--r--");
        assert!(entry["owner"].is_string() && entry["group"].is_string());
        assert!(entry["modifiedTime"].as_str().unwrap().ends_with('Z'));
        assert!(entry.get("isSymlink").is_none() && entry.get("symlinkTarget").is_none());

        let empty = h.join("empty");
        fs::write(&empty, "").unwrap();
        fs::set_permissions(&empty, fs::Permissions::from_mode(0o000)).unwrap();
        let entry = stat(&empty);
        assert!(entry.get("size").is_none() && entry.get("mode").is_none());
        assert_eq!(entry["permissions"], "----------");

        let dir = h.join("dir");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        let entry = stat(&dir);
        assert_eq!(entry["type"], "FILE_TYPE_DIRECTORY");
        assert_eq!(entry["permissions"], "drwxr-xr-x");

        let link = h.join("to-dir");
        symlink("dir", &link).unwrap();
        let entry = stat(&link);
        assert_eq!(entry["type"], "FILE_TYPE_DIRECTORY");
        assert_eq!(entry["isSymlink"], true);
        assert_eq!(entry["symlinkTarget"], "dir");
        assert_eq!(entry["size"], "3");
        assert_eq!(entry["mode"], 0o777);
        assert_eq!(entry["permissions"], "Lrwxrwxrwx");

        let dangling = h.join("dangling");
        symlink("/nowhere/at/all", &dangling).unwrap();
        let entry = stat(&dangling);
        assert_eq!(entry["type"], "FILE_TYPE_FILE");
        assert_eq!(entry["symlinkTarget"], "/nowhere/at/all");

        let err = call(
            FsRequest::Stat {
                path: p(&h.join("nope")),
            },
            h,
        )
        .unwrap_err();
        assert_eq!(err.kind, FsErrorKind::NotFound);
    }

    #[test]
    fn go_mode_strings() {
        assert_eq!(go_mode_string(libc::S_IFDIR | 0o1777), "dtrwxrwxrwx");
        assert_eq!(go_mode_string(libc::S_IFREG | 0o4755), "urwxr-xr-x");
        assert_eq!(go_mode_string(libc::S_IFCHR | 0o666), "Dcrw-rw-rw-");
        assert_eq!(go_mode_string(libc::S_IFIFO | 0o600), "prw-------");
    }

    #[test]
    fn make_dir_creates_parents_and_refuses_existing_paths() {
        let home = tempfile::tempdir().unwrap();
        let dir = home.path().join("x/y/z");
        let answer = json_of(FsRequest::MakeDir { path: p(&dir) }, home.path());
        assert_eq!(answer["entry"]["type"], "FILE_TYPE_DIRECTORY");
        assert_eq!(answer["entry"]["path"], p(&dir));
        assert!(dir.is_dir());
        let err = call(FsRequest::MakeDir { path: p(&dir) }, home.path()).unwrap_err();
        assert_eq!(err.kind, FsErrorKind::AlreadyExists);
        assert_eq!(
            err.message,
            format!("directory '{}' already exists", p(&dir))
        );
        let file = home.path().join("file");
        fs::write(&file, "").unwrap();
        let err = call(FsRequest::MakeDir { path: p(&file) }, home.path()).unwrap_err();
        assert_eq!(err.kind, FsErrorKind::AlreadyExists);
        let err = call(
            FsRequest::MakeDir {
                path: p(&file.join("sub")),
            },
            home.path(),
        )
        .unwrap_err();
        assert_eq!(err.kind, FsErrorKind::InvalidArgument);
    }

    #[test]
    fn remove_never_follows_a_symlink() {
        let home = tempfile::tempdir().unwrap();
        let h = home.path();
        fs::create_dir_all(h.join("real/sub")).unwrap();
        fs::write(h.join("real/sub/f"), "keep").unwrap();
        symlink(h.join("real"), h.join("link")).unwrap();
        let out = call(
            FsRequest::Remove {
                path: p(&h.join("link")),
            },
            h,
        )
        .unwrap();
        assert_eq!(serde_json::from_slice::<Value>(&out).unwrap(), json!({}));
        assert!(fs::symlink_metadata(h.join("link")).is_err());
        assert_eq!(fs::read(h.join("real/sub/f")).unwrap(), b"keep");
        // A tree holding a symlink out of it: the tree goes, the outside stays.
        fs::create_dir(h.join("tree")).unwrap();
        symlink(h.join("real"), h.join("tree/out")).unwrap();
        call(
            FsRequest::Remove {
                path: p(&h.join("tree")),
            },
            h,
        )
        .unwrap();
        assert!(!h.join("tree").exists() && h.join("real/sub/f").exists());
        let err = call(
            FsRequest::Remove {
                path: p(&h.join("tree")),
            },
            h,
        )
        .unwrap_err();
        assert_eq!(err.kind, FsErrorKind::NotFound);
        let err = call(FsRequest::Remove { path: "/".into() }, h).unwrap_err();
        assert_eq!(err.kind, FsErrorKind::InvalidArgument);
    }

    #[test]
    fn move_renames_into_new_parents() {
        let home = tempfile::tempdir().unwrap();
        let h = home.path();
        fs::write(h.join("src"), "data").unwrap();
        let dest = h.join("new/dir/dst");
        let request = FsRequest::Move {
            source: "src".into(),
            destination: p(&dest),
        };
        let answer = json_of(request, h);
        assert_eq!(answer["entry"]["path"], p(&dest));
        assert_eq!(answer["entry"]["name"], "dst");
        assert_eq!(fs::read(&dest).unwrap(), b"data");
        assert!(!h.join("src").exists());
        let missing = FsRequest::Move {
            source: "src".into(),
            destination: "elsewhere".into(),
        };
        assert_eq!(call(missing, h).unwrap_err().kind, FsErrorKind::NotFound);
        let into_itself = FsRequest::Move {
            source: "new".into(),
            destination: "new/dir/inner".into(),
        };
        assert_eq!(
            call(into_itself, h).unwrap_err().kind,
            FsErrorKind::InvalidArgument
        );
    }

    #[test]
    fn resolve_is_lexical_and_never_above_root() {
        let r = |path: &str| resolve(path, "/home/user").map(|p| p.to_str().unwrap().to_owned());
        assert_eq!(r("a/../b").unwrap(), "/home/user/b");
        assert_eq!(r("../../x").unwrap(), "/x");
        assert_eq!(r("../../../../x").unwrap(), "/x");
        assert_eq!(r("/etc/./passwd").unwrap(), "/etc/passwd");
        assert_eq!(r("/..").unwrap(), "/");
        assert_eq!(r("~").unwrap(), "/home/user");
        assert_eq!(r("~/d//e/").unwrap(), "/home/user/d/e");
        assert_eq!(r(".").unwrap(), "/home/user");
        assert_eq!(r("").unwrap_err().kind, FsErrorKind::InvalidArgument);
        assert_eq!(r("~root/x").unwrap_err().kind, FsErrorKind::InvalidArgument);
        assert_eq!(r("a\0b").unwrap_err().kind, FsErrorKind::InvalidArgument);
        assert_eq!(resolve("x", "").unwrap(), PathBuf::from("/x"));
    }

    #[test]
    fn errors_round_trip_through_a_status_line() {
        for (kind, _) in KINDS {
            let err = FsError::new(kind, "path '/a b' does not exist");
            assert_eq!(FsError::decode(&err.encode()), Some(err));
        }
        let err = FsError::new(FsErrorKind::Internal, "two\nlines");
        assert_eq!(err.encode(), "fs internal two lines");
        assert_eq!(
            FsError::decode("fs internal two lines").unwrap().message,
            "two lines"
        );
        assert_eq!(
            FsError::decode("fs no_space").unwrap(),
            FsError::new(FsErrorKind::NoSpace, "")
        );
        assert_eq!(FsError::decode("fs bogus x"), None);
        assert_eq!(FsError::decode("start\tuser\tx\ty"), None);
    }

    #[test]
    fn account_files_name_ids() {
        let ids = parse_ids("# comment\nroot:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:\nalias:x:0:0::/:\nbad\n:x:5:5\n");
        assert_eq!(ids.get(&0).map(String::as_str), Some("root"));
        assert_eq!(ids.get(&1000).map(String::as_str), Some("user"));
        assert_eq!(ids.len(), 2);
        let names = Names::new(Path::new("/nonexistent-root"));
        assert_eq!(names.user(1234), "1234");
        assert_eq!(names.group(99), "99");
    }
}
