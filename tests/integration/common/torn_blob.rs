//! A stored blob whose bytes no longer match its digest, for tests of quarantine: the bytes are
//! replaced behind the store's back, as a failing disk or a bad copy would.

use std::time::{Duration, SystemTime};

use strata::domain::ids::Digest;
use strata::vmm::BlobStore;

/// Replaces the stored bytes of `digest` (whose content is `content`) with `content` with its
/// first byte flipped, so the next verified read moves the blob to quarantine. On a local store
/// the torn file is also dated a month back: its retention must start at the quarantine, not at
/// the write.
pub async fn tear(blobs: &dyn BlobStore, digest: &Digest, content: &[u8]) {
    let mut torn = content.to_vec();
    torn[0] ^= 1;
    // A local store trusts, without reading it, a file whose inode, size, mtime and ctime are
    // those it verified at the put. The pause puts the rewrite's timestamps in a later clock
    // tick than the put's, so the torn file cannot pass for the verified one.
    tokio::time::sleep(Duration::from_millis(20)).await;
    if let Some(local) = blobs.as_local() {
        let path = local.path_of(digest);
        std::fs::write(&path, &torn).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(SystemTime::now() - Duration::from_secs(30 * 86400))
            .unwrap();
    } else {
        let object = blobs.as_object().unwrap();
        object
            .raw()
            .put(&object.key_of(digest), torn.into())
            .await
            .unwrap();
    }
}
