//! Which registry repositories have served each layer and image this node holds.
//!
//! A manifest names its layers by digest, and digests are not secrets: they appear in SBOMs,
//! CI logs and `docker inspect`. If a pull reused any stored layer a manifest names, a tenant
//! who knows another tenant's private layer digest could write a manifest naming it, serve it
//! from a registry of their own, and boot on bytes they never had (and learn from the blob
//! requests their registry does or does not see which layers a node holds). So a stored layer
//! (or an earlier pull's result) is reused only for a pull from a repository that served it
//! before; any other repository must serve the bytes again, and they are verified against the
//! digests without being stored twice. A registry's own answer to "do you have this blob" is
//! no proof: the registry may be the one lying.
//!
//! One file per digest under `images/pulled/provenance/`, one `registry/repository` per line.
//! It is a cache of facts: losing it costs one more download, never a wrong reuse.

use std::io::Write;
use std::path::PathBuf;

use crate::domain::ids::Digest;
use crate::vmm::VmmError;

pub struct Provenance {
    dir: PathBuf,
}

impl Provenance {
    pub fn open(dir: PathBuf) -> Result<Provenance, VmmError> {
        std::fs::create_dir_all(&dir)
            .map_err(VmmError::io(format!("creating {}", dir.display())))?;
        Ok(Provenance { dir })
    }

    /// Whether `source` (`registry/repository`) has served `digest` to this node.
    pub fn has(&self, digest: &Digest, source: &str) -> bool {
        std::fs::read_to_string(self.dir.join(digest.hex()))
            .is_ok_and(|text| text.lines().any(|l| l == source))
    }

    /// Records that `source` served `digest` (verified against it).
    pub fn add(&self, digest: &Digest, source: &str) -> Result<(), VmmError> {
        if self.has(digest, source) {
            return Ok(());
        }
        let path = self.dir.join(digest.hex());
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(VmmError::io(format!("opening {}", path.display())))?;
        file.write_all(format!("{source}\n").as_bytes())
            .map_err(VmmError::io(format!("writing {}", path.display())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_counts_only_for_the_digests_it_served() {
        let dir = tempfile::tempdir().unwrap();
        let p = Provenance::open(dir.path().join("provenance")).unwrap();
        let (a, b) = (Digest::of(b"a"), Digest::of(b"b"));
        assert!(!p.has(&a, "docker.io/library/debian"));
        p.add(&a, "docker.io/library/debian").unwrap();
        p.add(&a, "docker.io/library/debian").unwrap();
        p.add(&a, "ghcr.io/team/app").unwrap();
        assert!(p.has(&a, "docker.io/library/debian") && p.has(&a, "ghcr.io/team/app"));
        assert!(!p.has(&a, "docker.io/library/debia"), "whole lines only");
        assert!(!p.has(&b, "docker.io/library/debian"));
        let text = std::fs::read_to_string(dir.path().join("provenance").join(a.hex())).unwrap();
        assert_eq!(text.lines().count(), 2);
    }
}
