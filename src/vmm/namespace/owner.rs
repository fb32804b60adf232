//! Which live process owns which sandbox directory.
//!
//! Each [`NamespaceBackend`](super::NamespaceBackend) is an owner with a short random id. Its
//! sandboxes are named `sbx-<owner>-<random>`, and it holds an exclusive `flock(2)` on
//! `sandboxes/.owner-<owner>.lock` for as long as it exists. The kernel drops the lock when the
//! process dies, however it dies, so "the lock can be taken" means "the owner is gone" and its
//! sandboxes may be swept ([`super::sweep`]). Several owners may share one data directory (two
//! workers, a worker and a CLI command, concurrent tests) without ever sweeping each other.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::vmm::error::{Result, VmmError};

const LOCK_PREFIX: &str = ".owner-";
const LOCK_SUFFIX: &str = ".lock";
const SANDBOX_PREFIX: &str = "sbx-";

/// A live owner: holds its lock until dropped, then removes it.
#[derive(Debug)]
pub struct SandboxOwner {
    id: String,
    lock_path: PathBuf,
    _lock: File,
}

impl SandboxOwner {
    /// Becomes a new owner in `sandboxes`. The lock is taken before the file gets its final
    /// name, so no sweeper ever sees an owner's lock file unlocked while the owner lives.
    pub fn register(sandboxes: &Path) -> Result<SandboxOwner> {
        let id = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
        let staged = sandboxes.join(format!("{LOCK_PREFIX}new-{id}"));
        let lock_path = lock_path(sandboxes, &id);
        let io_err = |what: &str| VmmError::io(format!("{what} {}", lock_path.display()));
        let mut file = File::create(&staged).map_err(io_err("creating"))?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive)
            .map_err(|e| io_err("locking")(e.into()))?;
        // The pid is for people (and tests) looking at the directory; the lock is the truth.
        writeln!(file, "{}", std::process::id()).map_err(io_err("writing"))?;
        fs::rename(&staged, &lock_path).map_err(io_err("publishing"))?;
        Ok(SandboxOwner {
            id,
            lock_path,
            _lock: file,
        })
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// A new sandbox id of this owner.
    pub fn new_sandbox_id(&self) -> String {
        new_sandbox_id(&self.id)
    }
}

/// A new sandbox id of owner `owner`.
pub fn new_sandbox_id(owner: &str) -> String {
    format!(
        "{SANDBOX_PREFIX}{owner}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

impl Drop for SandboxOwner {
    fn drop(&mut self) {
        // Every sandbox of this owner holds the backend, so none is left running here.
        let _ = fs::remove_file(&self.lock_path);
    }
}

pub fn lock_path(sandboxes: &Path, owner: &str) -> PathBuf {
    sandboxes.join(format!("{LOCK_PREFIX}{owner}{LOCK_SUFFIX}"))
}

/// What a name in `sandboxes/` is.
#[derive(Debug, PartialEq, Eq)]
pub enum Entry<'a> {
    /// `sbx-<owner>-<random>`.
    Sandbox {
        owner: &'a str,
    },
    /// `sbx-<12 hex>`: made before sandboxes had owners; nothing can still own it once this
    /// version runs on the node.
    UnownedSandbox,
    /// `.owner-<owner>.lock`.
    Lock {
        owner: &'a str,
    },
    /// `.owner-new-<owner>`: a lock file whose owner died before publishing it.
    StagedLock,
    Other,
}

pub fn classify(name: &str) -> Entry<'_> {
    if let Some(rest) = name.strip_prefix(SANDBOX_PREFIX) {
        return match rest.split_once('-') {
            Some((owner, _)) if !owner.is_empty() => Entry::Sandbox { owner },
            None if !rest.is_empty() => Entry::UnownedSandbox,
            _ => Entry::Other,
        };
    }
    if let Some(rest) = name.strip_prefix(LOCK_PREFIX) {
        if rest.starts_with("new-") {
            return Entry::StagedLock;
        }
        if let Some(owner) = rest.strip_suffix(LOCK_SUFFIX) {
            return Entry::Lock { owner };
        }
    }
    Entry::Other
}

/// A dead owner's lock, held while its sandboxes are swept; `None` while the owner lives.
pub struct DeadOwner {
    file: Option<File>,
    path: PathBuf,
}

impl DeadOwner {
    /// Takes `owner`'s lock if nobody holds it. A missing lock file means a dead owner too: it
    /// is created before the first sandbox and removed only by its owner's drop or a sweeper.
    pub fn try_claim(sandboxes: &Path, owner: &str) -> io::Result<Option<DeadOwner>> {
        let path = lock_path(sandboxes, owner);
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok(Some(DeadOwner { file: None, path }))
            }
            Err(e) => return Err(e),
        };
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(Some(DeadOwner {
                file: Some(file),
                path,
            })),
            Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes the lock file once the owner's sandboxes are gone.
    pub fn release(mut self) {
        if self.file.take().is_some() {
            let _ = fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_classified() {
        assert_eq!(
            classify("sbx-1a2b3c4d-99aa88bb"),
            Entry::Sandbox { owner: "1a2b3c4d" }
        );
        assert_eq!(classify("sbx-0123456789ab"), Entry::UnownedSandbox);
        assert_eq!(
            classify(".owner-1a2b3c4d.lock"),
            Entry::Lock { owner: "1a2b3c4d" }
        );
        assert_eq!(classify(".owner-new-1a2b3c4d"), Entry::StagedLock);
        assert_eq!(classify("sbx-"), Entry::Other);
        assert_eq!(classify("notes.txt"), Entry::Other);
    }

    #[test]
    fn an_owner_is_alive_while_it_exists_and_dead_after() {
        let dir = tempfile::tempdir().unwrap();
        let owner = SandboxOwner::register(dir.path()).unwrap();
        let id = owner.id().to_owned();
        assert!(DeadOwner::try_claim(dir.path(), &id).unwrap().is_none());
        assert!(classify(&owner.new_sandbox_id()) == Entry::Sandbox { owner: &id });
        drop(owner);
        assert!(!lock_path(dir.path(), &id).exists());
        assert!(DeadOwner::try_claim(dir.path(), &id).unwrap().is_some());
    }
}
