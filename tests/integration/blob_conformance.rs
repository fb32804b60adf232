//! The blob store's contract, run against both backends: the node-local directory and an S3
//! bucket on a real S3-protocol server on loopback (moto, started and stopped here).

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use object_store::path::Path as ObjectPath;
use strata::domain::ids::Digest;
use strata::vmm::local_s3::LocalS3;
use strata::vmm::object_blob_store::PART_SIZE;
use strata::vmm::{BlobStore, ObjectBlobStore, VmmError};

/// One backend under test, and a way to look at what it holds without going through it.
enum Backend {
    Local {
        dir: tempfile::TempDir,
        store: Arc<dyn BlobStore>,
    },
    S3 {
        server: LocalS3,
        bucket: String,
        store: Arc<dyn BlobStore>,
    },
}

impl Backend {
    fn local() -> Backend {
        let dir = tempfile::tempdir().unwrap();
        let store = strata::vmm::open_blob_store(None, dir.path()).unwrap();
        Backend::Local { dir, store }
    }

    fn s3() -> Backend {
        let server = LocalS3::start().expect("the S3 test server");
        let bucket = "blobs".to_owned();
        let store = server.blob_store(&bucket, "strata/test").unwrap();
        Backend::S3 {
            server,
            bucket,
            store,
        }
    }

    fn both() -> Vec<Backend> {
        vec![Backend::local(), Backend::s3()]
    }

    fn name(&self) -> &'static str {
        match self {
            Backend::Local { .. } => "local",
            Backend::S3 { .. } => "s3",
        }
    }

    fn store(&self) -> Arc<dyn BlobStore> {
        match self {
            Backend::Local { store, .. } | Backend::S3 { store, .. } => store.clone(),
        }
    }

    fn object(&self) -> &ObjectBlobStore {
        let Backend::S3 { store, .. } = self else {
            panic!("not an object store")
        };
        store
            .as_object()
            .expect("the S3 backend is an object store")
    }

    /// Names of what is stored under the store's `dir` (`sha256`, `tmp`, `quarantine`).
    fn names_in(&self, dir: &str) -> Vec<String> {
        match self {
            Backend::Local { dir: root, .. } => {
                match std::fs::read_dir(root.path().join("blobs").join(dir)) {
                    Ok(entries) => entries
                        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                        .collect(),
                    Err(_) => Vec::new(),
                }
            }
            Backend::S3 { .. } => {
                let store = self.object();
                let raw = store.raw();
                let prefix = ObjectPath::from(format!("strata/test/{dir}"));
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    use futures::TryStreamExt;
                    raw.list(Some(&prefix))
                        .map_ok(|m| m.location.filename().unwrap_or_default().to_owned())
                        .try_collect::<Vec<_>>()
                        .await
                        .unwrap()
                })
            }
        }
    }

    /// Replaces a stored blob's bytes behind the store's back.
    fn tamper(&self, digest: &Digest, bytes: Vec<u8>) {
        match self {
            Backend::Local { store, .. } => {
                let path = store.as_local().unwrap().path_of(digest);
                std::fs::write(path, bytes).unwrap();
            }
            Backend::S3 { .. } => {
                let store = self.object();
                let raw = store.raw();
                let key = store.key_of(digest);
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(raw.put(&key, bytes.into())).unwrap();
            }
        }
    }

    fn open_multipart_uploads(&self) -> usize {
        match self {
            Backend::Local { .. } => 0,
            Backend::S3 { server, bucket, .. } => server.open_multipart_uploads(bucket).unwrap(),
        }
    }
}

fn noise(len: usize, seed: u8) -> Vec<u8> {
    let mut state = 0x9e3779b97f4a7c15u64 ^ seed as u64;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// Waits until `check` holds (an abandoned upload is cleaned up in the background).
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sixteen_concurrent_puts_of_one_digest_store_one_object() {
    for backend in Backend::both() {
        // One small blob (a single conditional put) and one past a part (multipart + copy).
        for len in [4096, PART_SIZE + 4096] {
            let content = Arc::new(noise(len, 1));
            let handles: Vec<_> = (0..16)
                .map(|_| {
                    let (store, content) = (backend.store(), content.clone());
                    std::thread::spawn(move || store.put_bytes(&content).unwrap())
                })
                .collect();
            let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
            assert!(
                results.windows(2).all(|w| w[0] == w[1]),
                "{}",
                backend.name()
            );
            let digest = &results[0].0;
            assert_eq!(
                backend.names_in("sha256").len(),
                if len == 4096 { 1 } else { 2 }
            );
            assert!(backend.names_in("sha256").contains(&digest.hex()));
            assert_eq!(backend.store().verify(digest).unwrap(), len as u64);
        }
        eventually(
            &format!("{}: no temporary objects left", backend.name()),
            || backend.names_in("tmp").is_empty(),
        );
        assert_eq!(backend.open_multipart_uploads(), 0, "{}", backend.name());
    }
}

#[test]
fn a_corrupted_object_reads_as_an_error_and_a_put_repairs_it() {
    for backend in Backend::both() {
        let store = backend.store();
        let content = noise(100_000, 2);
        let (digest, size) = store.put_bytes(&content).unwrap();
        let mut torn = content.clone();
        torn[10] ^= 1;
        // File timestamps advance by the kernel's coarse clock tick: let one pass so the change
        // is visible in the file's identity, as a real one is.
        std::thread::sleep(Duration::from_millis(20));
        backend.tamper(&digest, torn);

        let mut reader = store.open_verified(&digest).unwrap();
        let read = std::io::copy(&mut reader, &mut std::io::sink());
        let err = strata::vmm::blob_store::read_error(read.unwrap_err(), "reading");
        assert!(
            matches!(err, VmmError::DigestMismatch { .. }),
            "{}: {err}",
            backend.name()
        );

        assert_eq!(
            store.intact_size(&digest).unwrap(),
            None,
            "{}",
            backend.name()
        );
        assert!(
            backend.names_in("sha256").is_empty(),
            "{}: moved aside",
            backend.name()
        );
        assert_eq!(
            backend.names_in("quarantine").len(),
            1,
            "{}",
            backend.name()
        );
        assert_eq!(store.put_bytes(&content).unwrap(), (digest, size));
        assert_eq!(
            store.intact_size(&digest).unwrap(),
            Some(size),
            "{}",
            backend.name()
        );
    }
}

#[test]
fn an_interrupted_upload_leaves_nothing_visible() {
    for backend in Backend::both() {
        let store = backend.store();
        // Past one part, so the object store has a multipart upload in flight to abort.
        let content = noise(2 * PART_SIZE + 100, 3);
        let mut sink = store.sink().unwrap();
        sink.append(Bytes::from(content[..PART_SIZE + 50].to_vec()))
            .unwrap();
        sink.write_all(&content[PART_SIZE + 50..]).unwrap();
        drop(sink);
        let mut writer = store.writer().unwrap();
        writer.write_all(&content[..1000]).unwrap();
        drop(writer);
        eventually(
            &format!("{}: nothing left of the uploads", backend.name()),
            || backend.names_in("tmp").is_empty() && backend.open_multipart_uploads() == 0,
        );
        assert!(backend.names_in("sha256").is_empty(), "{}", backend.name());
        let digest = Digest::of(&content);
        assert_eq!(store.size(&digest).unwrap(), None);
        assert!(matches!(
            store.open_verified(&digest).err().unwrap(),
            VmmError::BlobMissing { .. }
        ));
    }
}

#[test]
fn blobs_round_trip_and_a_wrong_expected_digest_stores_nothing() {
    for backend in Backend::both() {
        let store = backend.store();
        for len in [0, 1, 70_000, PART_SIZE + 1] {
            let content = noise(len, 4);
            let mut writer = store.writer().unwrap();
            for piece in content.chunks(33_333) {
                writer.write_all(piece).unwrap();
            }
            let (digest, size) = writer.commit().unwrap();
            assert_eq!((digest, size), (Digest::of(&content), len as u64));
            assert_eq!(store.size(&digest).unwrap(), Some(len as u64));
            let mut back = Vec::new();
            let mut reader = store.open_verified(&digest).unwrap();
            reader.read_to_end(&mut back).unwrap();
            reader.finish().unwrap();
            assert!(back == content, "{}: {len} bytes read back", backend.name());
        }
        let mut writer = store.writer().unwrap();
        writer.write_all(b"not what was promised").unwrap();
        let promised = Digest::of(b"something else");
        assert!(matches!(
            writer.commit_expecting(&promised).unwrap_err(),
            VmmError::DigestMismatch { .. }
        ));
        assert_eq!(store.size(&promised).unwrap(), None);
        assert!(store.verify(&Digest::of(b"absent")).is_err());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_upload_streams_into_either_store_and_a_broken_one_leaves_nothing() {
    for backend in Backend::both() {
        let store = backend.store();
        let content = Bytes::from(noise(3 * PART_SIZE + 7, 5));
        let body = futures::stream::iter(
            content
                .chunks(64 * 1024)
                .map(|c| Ok::<_, std::io::Error>(content.slice_ref(c)))
                .collect::<Vec<_>>(),
        );
        let ingested = strata::api::upload_ingest::ingest_upload(
            body,
            strata::api::upload_ingest::BodyLimits {
                declared: content.len() as u64,
                ceiling: u64::MAX,
                idle: std::time::Duration::from_secs(60),
            },
            store.clone(),
            |_| async { Ok(()) },
        )
        .await
        .unwrap();
        let digest = ingested.digest;
        assert_eq!(digest, Digest::of(&content));
        let verified = tokio::task::spawn_blocking({
            let (store, digest) = (store.clone(), digest);
            move || store.verify(&digest).unwrap()
        })
        .await
        .unwrap();
        assert_eq!(verified, content.len() as u64, "{}", backend.name());

        let broken = futures::stream::iter(vec![
            Ok(content.slice(..2 * PART_SIZE)),
            Err(std::io::Error::other("connection reset")),
        ]);
        let other = noise(3 * PART_SIZE, 6);
        let err = strata::api::upload_ingest::ingest_upload(
            broken,
            strata::api::upload_ingest::BodyLimits {
                declared: other.len() as u64,
                ceiling: u64::MAX,
                idle: std::time::Duration::from_secs(60),
            },
            store.clone(),
            |_| async { Ok(()) },
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("connection reset"), "{err}");
        let names = tokio::task::spawn_blocking(move || {
            eventually("the broken upload is cleaned up", || {
                backend.names_in("tmp").is_empty() && backend.open_multipart_uploads() == 0
            });
            backend.names_in("sha256")
        })
        .await
        .unwrap();
        assert_eq!(names, vec![digest.hex()]);
    }
}

#[test]
fn the_store_description_names_no_credentials() {
    let backend = Backend::s3();
    let described = backend.store().describe();
    assert_eq!(described, "s3://blobs/strata/test");
    for secret in [
        strata::vmm::local_s3::SECRET_KEY,
        strata::vmm::local_s3::ACCESS_KEY,
    ] {
        assert!(!described.contains(secret));
    }
    // An error from the store (an absent bucket) names neither key.
    let Backend::S3 { server, .. } = &backend else {
        unreachable!()
    };
    let missing = strata::vmm::blob_url::open_blob_store_with(
        Some("s3://no-such-bucket/x"),
        std::path::Path::new("/nonexistent"),
        server.env(),
    )
    .unwrap();
    let err = missing.put_bytes(b"x").unwrap_err().to_string();
    assert!(err.contains("s3://no-such-bucket/x"), "{err}");
    assert!(!err.contains(strata::vmm::local_s3::SECRET_KEY), "{err}");
    assert!(!err.contains(strata::vmm::local_s3::ACCESS_KEY), "{err}");
}

/// What create-if-absent rests on in the S3 backend: the server refuses a second conditional
/// put, and a conditional copy onto an existing name. (Were either ignored, the 16-put test
/// above would still find one object, since the racing writes carry the same bytes.)
#[test]
fn the_s3_server_refuses_a_second_create_and_a_copy_onto_an_existing_name() {
    let backend = Backend::s3();
    let raw = backend.object().raw();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let create = || object_store::PutOptions {
            mode: object_store::PutMode::Create,
            ..Default::default()
        };
        let key = ObjectPath::from("probe/a");
        raw.put_opts(&key, b"one".to_vec().into(), create())
            .await
            .unwrap();
        let second = raw.put_opts(&key, b"two".to_vec().into(), create()).await;
        assert!(
            matches!(second, Err(object_store::Error::AlreadyExists { .. })),
            "{second:?}"
        );
        let other = ObjectPath::from("probe/b");
        raw.put(&other, b"three".to_vec().into()).await.unwrap();
        let copied = raw.copy_if_not_exists(&other, &key).await;
        assert!(
            matches!(copied, Err(object_store::Error::AlreadyExists { .. })),
            "{copied:?}"
        );
        let kept = raw.get(&key).await.unwrap().bytes().await.unwrap();
        assert_eq!(&kept[..], b"one");
        let fresh = ObjectPath::from("probe/c");
        raw.copy_if_not_exists(&other, &fresh).await.unwrap();
    });
}

/// What garbage collection relies on: a listing of exactly the stored blobs with their sizes,
/// a delete that is idempotent, and a sweep of temporary leftovers that spares fresh ones.
#[test]
fn listing_deleting_and_sweeping_temporaries_behave_alike_on_both_stores() {
    for backend in Backend::both() {
        let store = backend.store();
        let name = backend.name();
        let put: Vec<(Digest, u64)> = (0..3u8)
            .map(|i| store.put_bytes(&noise(1000 + i as usize, i)).unwrap())
            .collect();
        let mut listed: Vec<(Digest, u64)> = store
            .list()
            .unwrap()
            .into_iter()
            .map(|b| (b.digest, b.size))
            .collect();
        listed.sort_by_key(|(d, _)| d.to_string());
        let mut expected = put.clone();
        expected.sort_by_key(|(d, _)| d.to_string());
        assert_eq!(listed, expected, "{name}");

        store.delete(&put[0].0).unwrap();
        store.delete(&put[0].0).unwrap(); // absent is success
        assert_eq!(store.size(&put[0].0).unwrap(), None, "{name}");
        assert_eq!(store.list().unwrap().len(), 2, "{name}");

        // A leftover of a crashed writer in tmp/.
        match &backend {
            Backend::Local { dir, .. } => {
                std::fs::write(dir.path().join("blobs/tmp/put-crashed"), b"partial").unwrap()
            }
            Backend::S3 { .. } => {
                let raw = backend.object().raw();
                let key = ObjectPath::from("strata/test/tmp/crashed");
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(raw.put(&key, b"partial".to_vec().into()))
                    .unwrap();
            }
        }
        let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        assert_eq!(
            store.sweep_temporary(hour_ago).unwrap(),
            0,
            "{name}: a fresh one stays"
        );
        assert_eq!(backend.names_in("tmp").len(), 1, "{name}");
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
        assert_eq!(store.sweep_temporary(later).unwrap(), 1, "{name}");
        assert!(backend.names_in("tmp").is_empty(), "{name}");
        assert_eq!(
            store.list().unwrap().len(),
            2,
            "{name}: blobs are not temporaries"
        );
    }
}

#[test]
fn the_first_claim_of_a_store_wins_every_claim_answers_the_winner_and_the_marker_is_no_blob() {
    for backend in Backend::both() {
        let store = backend.store();
        let name = backend.name();
        let (blob, _) = store.put_bytes(b"a blob beside the marker").unwrap();
        assert_eq!(store.owner().unwrap(), None, "{name}: unclaimed at first");

        // Sixteen claims at once, two identities: one wins and every claim answers it.
        let handles: Vec<_> = (0..16)
            .map(|i| {
                let store = store.clone();
                let id = if i % 2 == 0 {
                    "database-a"
                } else {
                    "database-b"
                };
                std::thread::spawn(move || (id, store.claim_owner(id).unwrap()))
            })
            .collect();
        let answers: Vec<(&str, String)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let winner = answers[0].1.clone();
        assert!(
            winner == "database-a" || winner == "database-b",
            "{name}: {winner}"
        );
        assert!(
            answers.iter().all(|(_, a)| *a == winner),
            "{name}: {answers:?}"
        );
        let loser = if winner == "database-a" {
            "database-b"
        } else {
            "database-a"
        };
        assert_eq!(store.owner().unwrap().as_deref(), Some(winner.as_str()));
        assert_eq!(
            store.claim_owner(loser).unwrap(),
            winner,
            "{name}: no takeover"
        );

        // The marker is not a blob, and sweeping temporaries leaves it.
        let listed: Vec<Digest> = store
            .list()
            .unwrap()
            .into_iter()
            .map(|b| b.digest)
            .collect();
        assert_eq!(listed, vec![blob], "{name}");
        let later = std::time::SystemTime::now() + Duration::from_secs(5);
        store.sweep_temporary(later).unwrap();
        assert_eq!(store.owner().unwrap().as_deref(), Some(winner.as_str()));

        // It is stored, not remembered: a fresh handle on the same store reads it.
        let reopened: Arc<dyn BlobStore> = match &backend {
            Backend::Local { dir, .. } => strata::vmm::open_blob_store(None, dir.path()).unwrap(),
            Backend::S3 { server, bucket, .. } => server.blob_store(bucket, "strata/test").unwrap(),
        };
        assert_eq!(
            reopened.owner().unwrap().as_deref(),
            Some(winner.as_str()),
            "{name}"
        );

        // Removing the marker, where it says it is, hands the store to the next claim.
        let marker = store.owner_marker();
        match &backend {
            Backend::Local { .. } => {
                assert!(marker.ends_with("/blobs/owner"), "{marker}");
                std::fs::remove_file(&marker).unwrap();
            }
            Backend::S3 { .. } => {
                assert_eq!(marker, "s3://blobs/strata/test/owner");
                let object = backend.object();
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(object.raw().delete(&object.owner_key()))
                    .unwrap();
            }
        }
        assert_eq!(store.owner().unwrap(), None, "{name}");
        assert_eq!(store.claim_owner(loser).unwrap(), loser, "{name}");
        assert_eq!(store.owner().unwrap().as_deref(), Some(loser));
    }
}

/// A blob that failed verification stays in quarantine as evidence until garbage collection
/// removes it: `sweep_quarantine` removes what was quarantined before the time it is given and
/// keeps the rest. Its age counts from the quarantine, not from when its bytes were written.
#[test]
fn quarantined_blobs_go_once_quarantined_before_the_given_time_on_both_stores() {
    for backend in Backend::both() {
        let store = backend.store();
        let name = backend.name();
        let kept = store.put_bytes(&noise(5000, 7)).unwrap();
        let content = noise(5000, 8);
        let (digest, _) = store.put_bytes(&content).unwrap();
        // A local file is torn as one written a month ago: the quarantine, not the write,
        // starts the retention.
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(crate::common::torn_blob::tear(
                store.as_ref(),
                &digest,
                &content,
            ));
        assert_eq!(store.intact_size(&digest).unwrap(), None, "{name}");
        assert_eq!(backend.names_in("quarantine").len(), 1, "{name}");

        let hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
        assert_eq!(
            store.sweep_quarantine(hour_ago).unwrap(),
            0,
            "{name}: quarantined just now, kept"
        );
        assert_eq!(backend.names_in("quarantine").len(), 1, "{name}");
        let later = std::time::SystemTime::now() + Duration::from_secs(5);
        assert_eq!(store.sweep_quarantine(later).unwrap(), 1, "{name}");
        assert!(backend.names_in("quarantine").is_empty(), "{name}");
        assert_eq!(store.sweep_quarantine(later).unwrap(), 0, "{name}");
        let listed: Vec<Digest> = store.list().unwrap().iter().map(|b| b.digest).collect();
        assert_eq!(
            listed,
            vec![kept.0],
            "{name}: stored blobs are not quarantine"
        );
        assert_eq!(store.intact_size(&kept.0).unwrap(), Some(kept.1), "{name}");
    }
}
