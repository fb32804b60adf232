//! COPY, as E2B's orchestrator executes it (PROTOCOL.md §3.7). Runs inside the sandbox (the
//! agent passes `/` as the root); the archive is extracted under the hostile-entry policy into
//! a private staging directory first, then moved into place.
//!
//! * source: the glob-free prefix of `src` inside the archive (`app/*.txt` -> `app`);
//! * owner: `owner` (`user` alone means `user:user`), else the current user;
//! * destination: relative paths resolve against the workdir, else the user's home;
//! * a file or symlink is moved into place (into `dest` itself when it ends with `/` or is an
//!   existing directory), `mode` applying to files only;
//! * a directory's *contents* are merged into `dest`: existing directories (and symlinks to
//!   directories) are kept and merged into, other entries are replaced.

use std::fs;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::archive_policy::{self, ArchivePolicy};
use super::users::UserDb;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CopySpec {
    /// `args[0]`: the source as the SDK wrote it, possibly with a glob.
    pub src: String,
    /// `args[1]`.
    pub dest: String,
    /// `args[2]`: `user[:group]`, empty for the current user.
    pub owner: Option<String>,
    /// `args[3]`: octal text such as `0640`.
    pub mode: Option<String>,
    /// The current WORKDIR, if one was set.
    pub workdir: Option<String>,
    /// The current USER.
    pub user: String,
    pub policy: ArchivePolicy,
    /// A directory source whose destination did not exist gives that destination to the
    /// owner, as Docker's `COPY --chown` does (E2B's COPY leaves it to root).
    #[serde(default)]
    pub owns_created_dest: bool,
}

/// `doublestar.SplitPattern(src + "/")`'s base: the components before the first one that has a
/// glob metacharacter.
pub fn glob_free_prefix(src: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    for part in src.split('/') {
        if part.contains(['*', '?', '[', '{', '\\']) {
            break;
        }
        if part.is_empty() || part == "." {
            continue;
        }
        out.push(part);
    }
    out.join("/")
}

fn parse_mode(mode: &str) -> Result<u32, String> {
    let digits = mode.trim_start_matches("0o");
    u32::from_str_radix(digits, 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| format!("COPY mode {mode:?} is not octal permission bits"))
}

/// Runs one COPY under `root` (`/` inside a sandbox).
pub fn run_copy(root: &Path, archive: impl Read, spec: &CopySpec) -> Result<(), String> {
    let db = UserDb::load(root);
    let owner_spec = match spec.owner.as_deref() {
        Some(o) if !o.is_empty() => o.to_string(),
        _ => spec.user.clone(),
    };
    let (uid, gid) = db.resolve_owner(&owner_spec)?;
    let home = db
        .resolve(&spec.user)
        .map(|u| u.home)
        .unwrap_or_else(|_| "/".into());
    let mode = match spec.mode.as_deref() {
        Some(m) if !m.is_empty() => Some(parse_mode(m)?),
        _ => None,
    };
    let base = spec.workdir.clone().unwrap_or(home);
    let dest_text = if spec.dest.starts_with('/') {
        spec.dest.clone()
    } else {
        format!("{}/{}", base.trim_end_matches('/'), spec.dest)
    };
    let dest = root.join(dest_text.trim_start_matches('/'));

    let staging = root.join(format!(".strata-copy-{}", uuid::Uuid::new_v4().simple()));
    fs::create_dir(&staging).map_err(|e| format!("creating the COPY staging directory: {e}"))?;
    fs::set_permissions(&staging, fs::Permissions::from_mode(0o700)).ok();
    let result = (|| {
        archive_policy::extract(archive, &staging, &spec.policy).map_err(|e| e.to_string())?;
        let prefix = glob_free_prefix(&spec.src);
        let src = if prefix.is_empty() {
            staging.clone()
        } else {
            staging.join(&prefix)
        };
        let meta = fs::symlink_metadata(&src)
            .map_err(|_| format!("COPY source {:?} is not in the uploaded archive", spec.src))?;
        if meta.is_dir() {
            chown_tree(&src, uid, gid, mode)?;
            let created = fs::symlink_metadata(&dest).is_err();
            fs::create_dir_all(&dest).map_err(|e| format!("creating {dest_text}: {e}"))?;
            if created && spec.owns_created_dest {
                std::os::unix::fs::lchown(&dest, Some(uid), Some(gid))
                    .map_err(|e| format!("chown {dest_text}: {e}"))?;
            }
            merge(&src, &dest)
        } else {
            let name = src
                .file_name()
                .expect("a source file has a name")
                .to_owned();
            let target: PathBuf = if spec.dest.ends_with('/') {
                fs::create_dir_all(&dest).map_err(|e| format!("creating {dest_text}: {e}"))?;
                dest.join(&name)
            } else {
                if let Some(parent) = dest.parent() {
                    fs::create_dir_all(parent)
                        .map_err(|e| format!("creating the parent of {dest_text}: {e}"))?;
                }
                if dest.is_dir() {
                    dest.join(&name)
                } else {
                    dest.clone()
                }
            };
            std::os::unix::fs::lchown(&src, Some(uid), Some(gid))
                .map_err(|e| format!("chown: {e}"))?;
            if let (Some(m), true) = (mode, meta.is_file()) {
                fs::set_permissions(&src, fs::Permissions::from_mode(m))
                    .map_err(|e| format!("chmod: {e}"))?;
            }
            if fs::symlink_metadata(&target)
                .map(|m| m.is_dir())
                .unwrap_or(false)
            {
                return Err(format!(
                    "COPY would replace the directory {} with a file",
                    target.display()
                ));
            }
            fs::rename(&src, &target).map_err(|e| format!("moving into {}: {e}", target.display()))
        }
    })();
    let _ = fs::remove_dir_all(&staging);
    result
}

fn chown_tree(path: &Path, uid: u32, gid: u32, mode: Option<u32>) -> Result<(), String> {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid)).map_err(|e| format!("chown: {e}"))?;
    let meta = fs::symlink_metadata(path).map_err(|e| e.to_string())?;
    if let Some(m) = mode {
        if !meta.file_type().is_symlink() {
            fs::set_permissions(path, fs::Permissions::from_mode(m))
                .map_err(|e| format!("chmod: {e}"))?;
        }
    }
    if meta.is_dir() {
        for entry in fs::read_dir(path).map_err(|e| e.to_string())? {
            chown_tree(&entry.map_err(|e| e.to_string())?.path(), uid, gid, mode)?;
        }
    }
    Ok(())
}

/// Merges the contents of `src` into the directory `dest` (tar's `--keep-directory-symlink
/// --no-overwrite-dir`).
fn merge(src: &Path, dest: &Path) -> Result<(), String> {
    let mut entries: Vec<_> = fs::read_dir(src)
        .map_err(|e| e.to_string())?
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let s = entry.path();
        let d = dest.join(entry.file_name());
        let smeta = fs::symlink_metadata(&s).map_err(|e| e.to_string())?;
        let dmeta = fs::symlink_metadata(&d).ok();
        let d_is_dir = fs::metadata(&d).map(|m| m.is_dir()).unwrap_or(false);
        if smeta.is_dir() {
            if d_is_dir {
                merge(&s, &d)?;
                continue;
            }
            if dmeta.is_some() {
                fs::remove_file(&d).map_err(|e| format!("replacing {}: {e}", d.display()))?;
            }
        } else if dmeta.as_ref().map(|m| m.is_dir()).unwrap_or(false) {
            return Err(format!(
                "COPY would replace the directory {} with a file",
                d.display()
            ));
        }
        fs::rename(&s, &d).map_err(|e| format!("moving into {}: {e}", d.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_source_is_the_glob_free_prefix() {
        assert_eq!(glob_free_prefix("app/*.txt"), "app");
        assert_eq!(glob_free_prefix("app"), "app");
        assert_eq!(glob_free_prefix("./single.txt"), "single.txt");
        assert_eq!(glob_free_prefix("a/b/**/c"), "a/b");
        assert_eq!(glob_free_prefix("*"), "");
        assert_eq!(parse_mode("0640").unwrap(), 0o640);
        assert!(parse_mode("rw").is_err());
    }
}
