//! `STRATA_BLOB_URL`: which blob store a process uses.
//!
//! * unset, or `file:///path`: the node-local store (`<data-dir>/blobs` by default). Every
//!   process that reads a blob must then share that directory, which is one machine.
//! * `s3://bucket/prefix`: an S3 bucket or S3-compatible server, configured by `object_store`'s
//!   standard variables: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
//!   `AWS_REGION`, `AWS_ENDPOINT` (a MinIO, Ceph or other server), `AWS_ALLOW_HTTP=true` (a
//!   plain-HTTP endpoint). Nodes then share only Postgres and the bucket.
//!
//! Only the scheme, bucket and prefix of the URL appear in logs and errors.

use std::path::Path;
use std::sync::Arc;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey, S3CopyIfNotExists};

use super::blob_store::{BlobStore, LocalBlobStore};
use super::error::{Result, VmmError};
use super::object_blob_store::ObjectBlobStore;

/// Opens the blob store `url` names, or the local one under `data_dir` when there is none; an
/// object store takes its settings from this process's `AWS_*` environment variables.
pub fn open_blob_store(url: Option<&str>, data_dir: &Path) -> Result<Arc<dyn BlobStore>> {
    open_blob_store_with(url, data_dir, std::env::vars())
}

/// [`open_blob_store`] with the `AWS_*` settings taken from `vars` instead of the environment
/// (names and meanings as `object_store` reads them from the environment).
pub fn open_blob_store_with(
    url: Option<&str>,
    data_dir: &Path,
    vars: impl IntoIterator<Item = (String, String)>,
) -> Result<Arc<dyn BlobStore>> {
    let url = url.map(str::trim).filter(|u| !u.is_empty());
    let Some(url) = url else {
        return Ok(Arc::new(LocalBlobStore::open(data_dir.join("blobs"))?));
    };
    let bad = |why: &str| VmmError::BlobUrl {
        url: url.to_owned(),
        why: why.to_owned(),
    };
    if let Some(path) = url.strip_prefix("file://") {
        if !path.starts_with('/') {
            return Err(bad(
                "a file URL needs an absolute path: file:///var/lib/strata/blobs",
            ));
        }
        return Ok(Arc::new(LocalBlobStore::open(path)?));
    }
    if let Some(rest) = url.strip_prefix("s3://") {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad("name a bucket: s3://bucket/prefix"));
        }
        let mut builder = AmazonS3Builder::new();
        for (name, value) in vars {
            if !name.starts_with("AWS_") {
                continue;
            }
            if let Ok(key) = name.to_ascii_lowercase().parse::<AmazonS3ConfigKey>() {
                builder = builder.with_config(key, value);
            }
        }
        let mut builder = builder.with_bucket_name(bucket);
        // Publishing a large blob is a copy of its temporary object: S3 makes it conditional by
        // completing a one-part multipart copy with If-None-Match, unless told otherwise.
        if builder
            .get_config_value(&AmazonS3ConfigKey::CopyIfNotExists)
            .is_none()
        {
            builder = builder.with_copy_if_not_exists(S3CopyIfNotExists::Multipart);
        }
        let store = builder.build().map_err(|e| bad(&e.to_string()))?;
        let described = format!("s3://{bucket}/{}", prefix.trim_matches('/'));
        return Ok(Arc::new(ObjectBlobStore::new(
            Arc::new(store),
            prefix,
            described,
        )?));
    }
    Err(bad(
        "unsupported scheme; use file:///path or s3://bucket/prefix (with AWS_* settings)",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_url_is_the_local_store_under_the_data_dir() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_blob_store(None, dir.path()).unwrap();
        assert_eq!(
            store.describe(),
            format!("file://{}", dir.path().join("blobs").display())
        );
        assert!(dir.path().join("blobs/sha256").is_dir());
    }

    #[test]
    fn a_file_url_is_the_local_store_at_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}/elsewhere", dir.path().display());
        let store = open_blob_store(Some(&url), Path::new("/nonexistent")).unwrap();
        assert!(store.as_local().is_some());
        assert!(dir.path().join("elsewhere/sha256").is_dir());
    }

    #[test]
    fn bad_urls_say_what_is_accepted() {
        for url in ["file://relative", "s3://", "ftp://x/y"] {
            let err = open_blob_store(Some(url), Path::new("/nonexistent"))
                .err()
                .unwrap_or_else(|| panic!("{url} was accepted"));
            assert!(matches!(err, VmmError::BlobUrl { .. }), "{url}: {err}");
            assert!(err.to_string().contains(url), "{err}");
        }
    }
}
