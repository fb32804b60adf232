//! The pull engine against a real registry (CNCF distribution, Debian's `docker-registry`) on
//! loopback, with images pushed by skopeo from OCI layouts written here.

use crate::common;

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use common::registry::{self, proxy, LocalRegistry};
use strata::domain::ids::Digest;
use strata::domain::image_ref::ImageRef;
use strata::registry::layout::Layout;
use strata::registry::manifest::Compression;
use strata::registry::{BasicAuth, PullError, Puller, RegistrySettings};
use strata::vmm::{BlobStore, LocalBlobStore};

struct Node {
    dir: tempfile::TempDir,
    blobs: Arc<LocalBlobStore>,
}

impl Node {
    fn new() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let blobs = Arc::new(LocalBlobStore::open(dir.path().join("blobs")).unwrap());
        Node { dir, blobs }
    }
    /// A puller for this test's loopback registries: 127.0.0.1 is listed, as an operator would
    /// list a registry on the node (nothing is by default).
    fn puller(&self, mut settings: RegistrySettings) -> Puller {
        settings.insecure.push("127.0.0.1".into());
        self.unlisted_puller(settings)
    }
    fn unlisted_puller(&self, settings: RegistrySettings) -> Puller {
        Puller::new(
            self.dir.path(),
            strata::vmm::LayerCache::open(self.dir.path().join("layers"), Default::default())
                .unwrap(),
            self.blobs.clone(),
            settings,
        )
        .unwrap()
    }
    fn layer_dir(&self, diff_id: &str) -> std::path::PathBuf {
        self.dir
            .path()
            .join("layers")
            .join(diff_id.trim_start_matches("sha256:"))
    }
    /// Stored blobs and extracted layers, plus anything left in temporary places (not the
    /// layer cache's own files, its id range and its lock, which start with a dot).
    fn contents(&self) -> (usize, usize, usize) {
        let count = |p: &Path| {
            std::fs::read_dir(p)
                .map(|d| {
                    d.flatten()
                        .filter(|e| {
                            !matches!(e.file_name().to_str(), Some(".owners" | ".publish.lock"))
                        })
                        .count()
                })
                .unwrap_or(0)
        };
        let root = self.dir.path();
        (
            count(&root.join("blobs/sha256")),
            count(&root.join("layers")),
            count(&root.join("blobs/tmp")),
        )
    }
}

fn reference(registry: &str, path: &str) -> ImageRef {
    ImageRef::parse(&format!("{registry}/{path}")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_multi_layer_image_is_pulled_verified_and_unpacked_then_pulled_warm_with_one_request() {
    let work = tempfile::tempdir().unwrap();
    let reg = LocalRegistry::start(&work.path().join("reg"), None).unwrap();
    let image = registry::push_three_layers(&reg, work.path(), "team/app:v1", "first\n");
    let node = Node::new();
    let puller = node.puller(RegistrySettings::default());

    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = seen.clone();
    let progress: strata::registry::pull::ProgressFn =
        Arc::new(move |p| sink.lock().unwrap().push(p.to_string()));
    let (pulled, stats) = puller
        .pull(&reference(&reg.addr, "team/app:v1"), None, Some(progress))
        .await
        .unwrap();
    assert_eq!(
        pulled.digest.to_string(),
        image.digest,
        "pinned to the pushed manifest"
    );
    assert_eq!(stats.layers_downloaded, 3);
    let diff_ids: Vec<String> = pulled.layers.iter().map(|l| l.digest.to_string()).collect();
    assert_eq!(
        diff_ids, image.diff_ids,
        "layers are stored by diff id, bottom first"
    );
    for layer in &pulled.layers {
        node.blobs.verify(&layer.digest).unwrap();
    }
    // gzip layer, zstd layer (with the whiteout in overlay's format), uncompressed layer.
    let first = node.layer_dir(&image.diff_ids[0]);
    assert_eq!(
        std::fs::read_to_string(first.join("bin/tool")).unwrap(),
        "#!/bin/sh\necho tool\n"
    );
    let second = node.layer_dir(&image.diff_ids[1]);
    assert_eq!(
        std::fs::read_to_string(second.join("etc/marker")).unwrap(),
        "first\n"
    );
    let wh = std::fs::symlink_metadata(second.join("etc/removed")).unwrap();
    assert!(
        wh.file_type().is_char_device() && wh.rdev() == 0,
        "a whiteout becomes a 0/0 device"
    );
    assert!(node.layer_dir(&image.diff_ids[2]).join("srv/app").is_file());
    assert_eq!(
        pulled.config.env,
        vec![
            ("PATH".to_owned(), "/usr/bin:/bin".to_owned()),
            ("GREETING".to_owned(), "hello world".to_owned()),
            ("EMPTY".to_owned(), String::new()),
            (" ".to_owned(), "x".to_owned()),
        ]
    );
    let lines = seen.lock().unwrap().clone();
    assert!(
        lines
            .first()
            .is_some_and(|l| l.starts_with("pulling 0/3 layers")),
        "{lines:?}"
    );
    assert!(
        lines
            .last()
            .is_some_and(|l| l.starts_with("pulling 3/3 layers")),
        "{lines:?}"
    );

    let before = node.contents();
    let (warm, stats) = puller
        .pull(&reference(&reg.addr, "team/app:v1"), None, None)
        .await
        .unwrap();
    assert_eq!(stats.requests, 1, "a warm pull is one manifest request");
    assert_eq!(stats.layers_downloaded, 0);
    assert_eq!(warm.digest, pulled.digest);
    assert_eq!(node.contents(), before);
}

/// A layer blob torn after its pull (a host crash, a bad disk) is not taken as pulled: the next
/// pull of the image downloads that layer again instead of answering from the warm record.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_torn_layer_blob_is_downloaded_again_on_the_next_pull() {
    let work = tempfile::tempdir().unwrap();
    let reg = LocalRegistry::start(&work.path().join("reg"), None).unwrap();
    let image = registry::push_three_layers(&reg, work.path(), "team/torn:v1", "torn\n");
    let node = Node::new();
    let puller = node.puller(RegistrySettings::default());
    let (pulled, _) = puller
        .pull(&reference(&reg.addr, "team/torn:v1"), None, None)
        .await
        .unwrap();
    assert_eq!(pulled.digest.to_string(), image.digest);

    let torn = pulled.layers[1].digest;
    let path = node.blobs.path_of(&torn);
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len / 2)
        .unwrap();

    let (again, stats) = puller
        .pull(&reference(&reg.addr, "team/torn:v1"), None, None)
        .await
        .unwrap();
    assert_eq!(again.digest, pulled.digest);
    assert_eq!(
        stats.layers_downloaded, 1,
        "only the torn layer comes again"
    );
    for layer in &again.layers {
        node.blobs.verify(&layer.digest).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_manifest_list_resolves_to_the_node_platform_or_says_what_it_offers() {
    let work = tempfile::tempdir().unwrap();
    let reg = LocalRegistry::start(&work.path().join("reg"), None).unwrap();
    let mut layout = Layout::create(&work.path().join("layout")).unwrap();
    let other_arch = if registry::node_arch() == "amd64" {
        "arm64"
    } else {
        "amd64"
    };
    let mine = layout
        .image(
            &[registry::layer(
                Compression::Gzip,
                vec![registry::file("arch", "mine")],
            )],
            &[],
            &registry::node_arch(),
        )
        .unwrap();
    let other = layout
        .image(
            &[registry::layer(
                Compression::Gzip,
                vec![registry::file("arch", "other")],
            )],
            &[],
            other_arch,
        )
        .unwrap();
    let s390 = layout
        .image(
            &[registry::layer(
                Compression::Gzip,
                vec![registry::file("arch", "s390x")],
            )],
            &[],
            "s390x",
        )
        .unwrap();
    let both = layout.index(&[&other, &mine]).unwrap();
    let foreign = layout.index(&[&s390]).unwrap();
    layout.tag("multi", &both).unwrap();
    layout.tag("foreign", &foreign).unwrap();
    reg.push(layout.dir(), "multi", "lib/multi:1", true)
        .unwrap();
    reg.push(layout.dir(), "foreign", "lib/foreign:1", true)
        .unwrap();

    let node = Node::new();
    let puller = node.puller(RegistrySettings::default());
    let (pulled, _) = puller
        .pull(&reference(&reg.addr, "lib/multi:1"), None, None)
        .await
        .unwrap();
    assert_eq!(
        pulled.digest.to_string(),
        both.digest,
        "pinned to the index"
    );
    assert_eq!(pulled.manifest_digest.to_string(), mine.digest);
    let dir = node.layer_dir(&mine.diff_ids[0]);
    assert_eq!(std::fs::read_to_string(dir.join("arch")).unwrap(), "mine");

    let err = puller
        .pull(&reference(&reg.addr, "lib/foreign:1"), None, None)
        .await
        .unwrap_err();
    assert!(
        matches!(err, PullError::UnsupportedPlatform { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("linux/s390x"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_protected_registry_needs_the_right_password_and_errors_never_show_it() {
    let work = tempfile::tempdir().unwrap();
    let password = "s3cret-Pa55word";
    let reg = LocalRegistry::start(&work.path().join("reg"), Some(("builder", password))).unwrap();
    registry::push_three_layers(&reg, work.path(), "private/app:1", "private\n");
    let node = Node::new();
    let puller = node.puller(RegistrySettings::default());
    let r = reference(&reg.addr, "private/app:1");

    let anonymous = puller.pull(&r, None, None).await.unwrap_err();
    assert!(
        matches!(anonymous, PullError::Unauthorized { .. }),
        "{anonymous}"
    );
    let wrong = "wrong-Pa55word";
    let err = puller
        .pull(
            &r,
            Some(BasicAuth {
                username: "builder".into(),
                password: wrong.into(),
            }),
            None,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, PullError::Unauthorized { .. }), "{err}");
    let shown = format!("{err} {err:?}");
    assert!(
        !shown.contains(wrong) && !shown.contains(password),
        "{shown}"
    );
    assert_eq!(
        node.contents(),
        (0, 0, 0),
        "nothing stored without authorization"
    );

    let (pulled, _) = puller
        .pull(
            &r,
            Some(BasicAuth {
                username: "builder".into(),
                password: password.into(),
            }),
            None,
        )
        .await
        .unwrap();
    assert_eq!(pulled.layers.len(), 3);
    // Once the layers are on the node, a caller without the password still gets nothing.
    let again = puller.pull(&r, None, None).await.unwrap_err();
    assert!(matches!(again, PullError::Unauthorized { .. }), "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_corrupted_blob_fails_the_pull_and_nothing_is_stored() {
    let work = tempfile::tempdir().unwrap();
    let reg = LocalRegistry::start(&work.path().join("reg"), None).unwrap();
    let image = registry::push_three_layers(&reg, work.path(), "team/app:v1", "first\n");
    let tamper = proxy(&reg.addr).await;
    tamper.corrupt_layers.store(true, Ordering::SeqCst);
    let node = Node::new();
    let puller = node.puller(RegistrySettings::default());
    let err = puller
        .pull(&reference(&tamper.addr, "team/app:v1"), None, None)
        .await
        .unwrap_err();
    assert!(matches!(err, PullError::DigestMismatch { .. }), "{err}");
    assert!(err.to_string().contains("nothing was stored"), "{err}");
    let (blobs, layers, tmp) = node.contents();
    assert_eq!((blobs, tmp), (0, 0), "no blob and no temporary file: {err}");
    assert_eq!(layers, 0, "no extracted layer and no staging directory");
    for diff in &image.diff_ids {
        assert!(node
            .blobs
            .size(&Digest::parse(diff).unwrap())
            .unwrap()
            .is_none());
    }
    // The same pull through an honest path succeeds.
    tamper.corrupt_layers.store(false, Ordering::SeqCst);
    puller
        .pull(&reference(&tamper.addr, "team/app:v1"), None, None)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_pulls_of_one_image_download_each_layer_once() {
    let work = tempfile::tempdir().unwrap();
    let reg = LocalRegistry::start(&work.path().join("reg"), None).unwrap();
    registry::push_three_layers(&reg, work.path(), "team/app:v1", "first\n");
    let counting = proxy(&reg.addr).await;
    let node = Node::new();
    let puller = node.puller(RegistrySettings::default());
    let r = reference(&counting.addr, "team/app:v1");
    let (a, b) = tokio::join!(puller.pull(&r, None, None), puller.pull(&r, None, None));
    let ((a, sa), (b, sb)) = (a.unwrap(), b.unwrap());
    assert_eq!(a.digest, b.digest);
    assert_eq!(sa.layers_downloaded + sb.layers_downloaded, 3);
    // Two configs, three layers: each layer went over the wire once.
    assert_eq!(counting.blob_requests.load(Ordering::SeqCst), 2 + 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_moved_tag_resolves_anew_while_a_pinned_digest_keeps_the_old_image() {
    let work = tempfile::tempdir().unwrap();
    let reg = LocalRegistry::start(&work.path().join("reg"), None).unwrap();
    let old = registry::push_three_layers(&reg, work.path(), "team/app:v1", "old\n");
    let node = Node::new();
    let puller = node.puller(RegistrySettings::default());
    let r = reference(&reg.addr, "team/app:v1");
    let (first, _) = puller.pull(&r, None, None).await.unwrap();
    let new = registry::push_three_layers(&reg, work.path(), "team/app:v1", "new\n");
    assert_ne!(old.digest, new.digest);
    let (moved, stats) = puller.pull(&r, None, None).await.unwrap();
    assert_eq!(moved.digest.to_string(), new.digest);
    assert_eq!(
        stats.layers_downloaded, 1,
        "only the changed layer is fetched"
    );
    let (pinned, _) = puller
        .pull(&r.pinned(first.digest), None, None)
        .await
        .unwrap();
    assert_eq!(pinned.digest.to_string(), old.digest);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mirrors_unknown_images_and_the_size_ceiling() {
    let work = tempfile::tempdir().unwrap();
    let reg = LocalRegistry::start(&work.path().join("reg"), None).unwrap();
    let image = registry::push_three_layers(&reg, work.path(), "library/debian:stable", "d\n");
    let node = Node::new();
    let mirrored = node.puller(
        RegistrySettings::parse(Some(&format!("docker.io=http://{}", reg.addr)), None, None)
            .unwrap(),
    );
    for spelling in [
        "debian:stable",
        "docker.io/library/debian:stable",
        "index.docker.io/debian:stable",
    ] {
        let (pulled, _) = mirrored
            .pull(&ImageRef::parse(spelling).unwrap(), None, None)
            .await
            .unwrap();
        assert_eq!(pulled.digest.to_string(), image.digest, "{spelling}");
    }
    let err = mirrored
        .pull(&ImageRef::parse("debian:no-such-tag").unwrap(), None, None)
        .await
        .unwrap_err();
    assert!(matches!(err, PullError::NotFound { .. }), "{err}");
    assert!(err.to_string().contains("debian:no-such-tag"), "{err}");

    let small = Node::new();
    let capped = small.puller(RegistrySettings {
        max_bytes: Some(image.layers_size - 1),
        ..Default::default()
    });
    let err = capped
        .pull(&reference(&reg.addr, "library/debian:stable"), None, None)
        .await
        .unwrap_err();
    assert!(matches!(err, PullError::TooLarge { .. }), "{err}");
    assert_eq!(small.contents(), (0, 0, 0));
}

/// Issue 46: only each layer's expansion was capped, so an image of many layers of zeros, each
/// small compressed and within the per-layer ceiling, could fill the disk that also holds
/// Postgres (or, with empty files, take its inodes). A pull's layers are charged together as they stream, against the image's ceiling
/// and the node's disk reserve, and a pull past either fails saying which.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pull_expands_no_further_than_its_ceiling_or_the_nodes_reserve() {
    let work = tempfile::tempdir().unwrap();
    let reg = LocalRegistry::start(&work.path().join("reg"), None).unwrap();
    let layout_dir = work.path().join("layout");
    let mut layout = Layout::create(&layout_dir).unwrap();
    let zeros = "\0".repeat(1 << 20);
    // Four layers of 1 MiB of zeros each, a few KiB compressed.
    let layers: Vec<_> = (0..4)
        .map(|i| {
            registry::layer(
                Compression::Gzip,
                vec![registry::file(&format!("zeros-{i}"), &zeros)],
            )
        })
        .collect();
    let image = layout
        .image(&layers, &["PATH=/bin"], &registry::node_arch())
        .unwrap();
    layout.tag("img", &image).unwrap();
    reg.push(&layout_dir, "img", "team/zeros:1", false).unwrap();
    let zeros_image = || reference(&reg.addr, "team/zeros:1");

    // Each layer is within a 2 MiB per-layer ceiling; together they pass a 3 MiB image ceiling.
    let node = Node::new();
    let capped = node.puller(RegistrySettings {
        max_layer_bytes: Some(2 << 20),
        max_expanded_bytes: Some(3 << 20),
        ..Default::default()
    });
    let err = capped.pull(&zeros_image(), None, None).await.unwrap_err();
    assert!(
        err.to_string().contains("STRATA_PULL_MAX_EXPANDED_BYTES"),
        "{err}"
    );
    // Room for the image: it pulls.
    let room = Node::new();
    let roomy = room.puller(RegistrySettings {
        max_layer_bytes: Some(2 << 20),
        max_expanded_bytes: Some(5 << 20),
        ..Default::default()
    });
    roomy.pull(&zeros_image(), None, None).await.unwrap();

    // A reserve the node's disk cannot keep: the pull stops at its first look.
    let full = Node::new();
    let reserved = full.puller(RegistrySettings {
        disk_reserve: Some(u64::MAX / 2),
        ..Default::default()
    });
    let err = reserved.pull(&zeros_image(), None, None).await.unwrap_err();
    assert!(
        err.to_string().contains("STRATA_NODE_DISK_RESERVE"),
        "{err}"
    );

    // Inodes, not bytes: four layers of 300 empty files each pass a ceiling of 1,000 entries
    // for the image (each layer alone is far within the archive policy's per-layer cap).
    let files: Vec<_> = (0..4)
        .map(|l| {
            let files = (0..300)
                .map(|i| registry::file(&format!("empty-{l}-{i}"), ""))
                .collect();
            registry::layer(Compression::Gzip, files)
        })
        .collect();
    let image = layout
        .image(&files, &["PATH=/bin"], &registry::node_arch())
        .unwrap();
    layout.tag("files", &image).unwrap();
    reg.push(&layout_dir, "files", "team/files:1", false)
        .unwrap();
    let pull_with_ceiling = |max_entries: u64| {
        let files = reference(&reg.addr, "team/files:1");
        async move {
            let node = Node::new();
            node.puller(RegistrySettings {
                max_entries: Some(max_entries),
                ..Default::default()
            })
            .pull(&files, None, None)
            .await
        }
    };
    let err = pull_with_ceiling(1_000).await.unwrap_err();
    assert!(err.to_string().contains("STRATA_PULL_MAX_ENTRIES"), "{err}");
    pull_with_ceiling(1_300).await.unwrap();
}

#[test]
fn strata_image_pull_pulls_into_the_data_dir_and_image_ls_lists_it() {
    let work = tempfile::tempdir().unwrap();
    let reg = LocalRegistry::start(&work.path().join("reg"), Some(("cli", "cli-Pa55"))).unwrap();
    let image = registry::push_three_layers(&reg, work.path(), "team/cli:1", "cli\n");
    let data = work.path().join("data");
    let run_with = |args: &[&str], password: Option<&str>, env: &[(&str, &str)]| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_strata"));
        cmd.args(args)
            .envs(env.iter().copied())
            .env("STRATA_DATA_DIR", &data)
            // The test's registry is on loopback: listed, as an operator would.
            .env("STRATA_INSECURE_REGISTRIES", "127.0.0.1")
            .env_remove("STRATA_REGISTRY_PASSWORD");
        if let Some(p) = password {
            cmd.env("STRATA_REGISTRY_PASSWORD", p);
        }
        cmd.output().unwrap()
    };
    let run = |args: &[&str], password: Option<&str>| run_with(args, password, &[]);
    let reference = format!("{}/team/cli:1", reg.addr);
    let refused = run(&["image", "pull", &reference], None);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("refused access"));
    // A pull by hand keeps the node's disk reserve, as a build's pull does.
    let reserved = run_with(
        &["image", "pull", &reference, "--username", "cli"],
        Some("cli-Pa55"),
        &[("STRATA_NODE_DISK_RESERVE", "1000000TiB")],
    );
    assert!(!reserved.status.success());
    assert!(
        String::from_utf8_lossy(&reserved.stderr).contains("STRATA_NODE_DISK_RESERVE"),
        "{}",
        String::from_utf8_lossy(&reserved.stderr)
    );
    let out = run(
        &["image", "pull", &reference, "--username", "cli"],
        Some("cli-Pa55"),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&image.digest) && stdout.contains("3 layers"),
        "{stdout}"
    );
    let ls = run(&["image", "ls"], None);
    let listing = String::from_utf8_lossy(&ls.stdout);
    assert!(
        listing.contains(&format!("{}/team/cli:1@{}", reg.addr, image.digest)),
        "{listing}"
    );
}

/// The `WWW-Authenticate: Bearer` flow against a token front (common/registry.rs `token_front`,
/// which stands in for a token server because none installs here): the front's `/token` gives a
/// token only for the right basic credentials and the repository's pull scope, and only requests
/// bearing that token reach the registry behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bearer_token_registry_grants_a_pull_scoped_token_for_the_right_credentials_only() {
    use registry::{token_front, FrontMode, FRONT_SERVICE};
    let work = tempfile::tempdir().unwrap();
    let reg = LocalRegistry::start(&work.path().join("reg"), None).unwrap();
    let image = registry::push_three_layers(&reg, work.path(), "team/bearer:1", "bearer\n");
    let password = "t0ken-Pa55word";
    let front = token_front(&reg.addr, "builder", password, FrontMode::Token).await;
    let r = reference(&front.addr, "team/bearer:1");
    let node = Node::new();
    let puller = node.puller(RegistrySettings::default());
    let auth = |password: &str| {
        Some(BasicAuth {
            username: "builder".into(),
            password: password.into(),
        })
    };

    let anonymous = puller.pull(&r, None, None).await.unwrap_err();
    assert!(
        matches!(anonymous, PullError::Unauthorized { .. }),
        "{anonymous}"
    );
    let wrong = "wrong-t0ken-Pa55word";
    let err = puller.pull(&r, auth(wrong), None).await.unwrap_err();
    assert!(matches!(err, PullError::Unauthorized { .. }), "{err}");
    assert!(err.to_string().contains("refused access"), "{err}");
    let shown = format!("{anonymous} {anonymous:?} {err} {err:?}");
    assert!(
        !shown.contains(wrong) && !shown.contains(password),
        "{shown}"
    );
    assert_eq!(
        front.forwarded.load(Ordering::SeqCst),
        0,
        "nothing reached the registry without a token"
    );
    assert_eq!(node.contents(), (0, 0, 0), "nothing stored without a token");

    let (pulled, _) = puller.pull(&r, auth(password), None).await.unwrap();
    assert_eq!(pulled.digest.to_string(), image.digest);
    assert_eq!(
        std::fs::read_to_string(node.layer_dir(&image.diff_ids[1]).join("etc/marker")).unwrap(),
        "bearer\n"
    );
    // Manifest, config and three layers, all with the token earned once.
    assert_eq!(front.forwarded.load(Ordering::SeqCst), 5);
    let asked = front.token_requests.lock().unwrap().clone();
    assert_eq!(asked.len(), 3, "one token request per pull: {asked:?}");
    for query in &asked {
        assert!(
            query.contains(&("scope".into(), "repository:team/bearer:pull".into()))
                && query.contains(&("service".into(), FRONT_SERVICE.into())),
            "{query:?}"
        );
    }

    // A challenge without a scope: the client asks for the repository's pull scope itself.
    let bare = token_front(&reg.addr, "builder", password, FrontMode::TokenWithoutScope).await;
    let other = Node::new();
    let (pulled, _) = other
        .puller(RegistrySettings::default())
        .pull(
            &reference(&bare.addr, "team/bearer:1"),
            auth(password),
            None,
        )
        .await
        .unwrap();
    assert_eq!(pulled.digest.to_string(), image.digest);
    let asked = bare.token_requests.lock().unwrap().clone();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert!(
        asked[0].contains(&("scope".into(), "repository:team/bearer:pull".into())),
        "{asked:?}"
    );
}

/// A registry that answers `429` with its error body: the pull fails as rate-limited, saying
/// what the registry said.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rate_limited_pull_fails_with_the_registrys_message() {
    use registry::{token_front, FrontMode, RATE_LIMIT_MESSAGE};
    let work = tempfile::tempdir().unwrap();
    let reg = LocalRegistry::start(&work.path().join("reg"), None).unwrap();
    registry::push_three_layers(&reg, work.path(), "team/limited:1", "limited\n");
    let front = token_front(&reg.addr, "builder", "pw", FrontMode::RateLimited).await;
    let node = Node::new();
    let err = node
        .puller(RegistrySettings::default())
        .pull(&reference(&front.addr, "team/limited:1"), None, None)
        .await
        .unwrap_err();
    assert!(matches!(err, PullError::RateLimited { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&format!("TOOMANYREQUESTS: {RATE_LIMIT_MESSAGE}")),
        "{text}"
    );
    assert!(
        text.contains("rate-limiting") && text.contains("team/limited:1"),
        "{text}"
    );
    assert_eq!(node.contents(), (0, 0, 0));
}

/// Images in Docker's formats (not OCI): a v2 schema 2 manifest and a Docker manifest list,
/// converted and pushed by skopeo (`--format v2s2`), read back with `skopeo inspect --raw`, and
/// pulled through a proxy that records the media types the registry served.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn docker_schema2_manifests_and_manifest_lists_are_pulled() {
    use strata::registry::manifest::{DOCKER_LIST, DOCKER_MANIFEST};
    let work = tempfile::tempdir().unwrap();
    let reg = LocalRegistry::start(&work.path().join("reg"), None).unwrap();
    let mut layout = Layout::create(&work.path().join("layout")).unwrap();
    let gz = |entries| registry::layer(Compression::Gzip, entries);
    let mine = layout
        .image(
            &[
                gz(vec![
                    registry::dir("etc"),
                    registry::file("etc/removed", "x\n"),
                ]),
                gz(vec![
                    registry::dir("etc"),
                    registry::whiteout("etc/removed"),
                    registry::file("etc/marker", "docker\n"),
                ]),
            ],
            &["FORMAT=docker"],
            &registry::node_arch(),
        )
        .unwrap();
    let other_arch = if registry::node_arch() == "amd64" {
        "arm64"
    } else {
        "amd64"
    };
    let other = layout
        .image(
            &[gz(vec![registry::file("arch", "other")])],
            &[],
            other_arch,
        )
        .unwrap();
    let both = layout.index(&[&other, &mine]).unwrap();
    layout.tag("single", &mine).unwrap();
    layout.tag("multi", &both).unwrap();
    registry::push_docker(&reg, layout.dir(), "single", "docker/app:1", false);
    registry::push_docker(&reg, layout.dir(), "multi", "docker/multi:1", true);

    let (single, single_digest) = registry::inspect_raw(&reg, "docker/app:1");
    assert_eq!(single["mediaType"], DOCKER_MANIFEST, "{single}");
    assert_eq!(
        single["config"]["mediaType"],
        "application/vnd.docker.container.image.v1+json"
    );
    for layer in single["layers"].as_array().unwrap() {
        assert_eq!(
            layer["mediaType"], "application/vnd.docker.image.rootfs.diff.tar.gzip",
            "{single}"
        );
    }
    let (list, list_digest) = registry::inspect_raw(&reg, "docker/multi:1");
    assert_eq!(list["mediaType"], DOCKER_LIST, "{list}");
    let entries = list["manifests"].as_array().unwrap();
    assert_eq!(entries.len(), 2);
    let node_entry = entries
        .iter()
        .find(|e| e["platform"]["architecture"] == registry::node_arch().as_str())
        .unwrap();
    assert!(
        entries.iter().all(|e| e["mediaType"] == DOCKER_MANIFEST),
        "{list}"
    );

    let relay = proxy(&reg.addr).await;
    let node = Node::new();
    let puller = node.puller(RegistrySettings::default());
    let (pulled, _) = puller
        .pull(&reference(&relay.addr, "docker/app:1"), None, None)
        .await
        .unwrap();
    assert_eq!(pulled.digest.to_string(), single_digest);
    assert_eq!(
        relay.manifest_types.lock().unwrap().clone(),
        vec![DOCKER_MANIFEST.to_owned()]
    );
    let diff_ids: Vec<String> = pulled.layers.iter().map(|l| l.digest.to_string()).collect();
    assert_eq!(
        diff_ids, mine.diff_ids,
        "the layer contents survived conversion"
    );
    let top = node.layer_dir(&mine.diff_ids[1]);
    assert_eq!(
        std::fs::read_to_string(top.join("etc/marker")).unwrap(),
        "docker\n"
    );
    let wh = std::fs::symlink_metadata(top.join("etc/removed")).unwrap();
    assert!(wh.file_type().is_char_device() && wh.rdev() == 0);
    assert_eq!(
        pulled.config.env,
        vec![("FORMAT".to_owned(), "docker".to_owned())]
    );

    relay.manifest_types.lock().unwrap().clear();
    let fresh = Node::new();
    let (pulled, _) = fresh
        .puller(RegistrySettings::default())
        .pull(&reference(&relay.addr, "docker/multi:1"), None, None)
        .await
        .unwrap();
    assert_eq!(pulled.digest.to_string(), list_digest, "pinned to the list");
    assert_eq!(
        pulled.manifest_digest.to_string(),
        node_entry["digest"].as_str().unwrap()
    );
    assert_eq!(
        relay.manifest_types.lock().unwrap().clone(),
        vec![DOCKER_LIST.to_owned(), DOCKER_MANIFEST.to_owned()]
    );
    assert_eq!(
        std::fs::read_to_string(fresh.layer_dir(&mine.diff_ids[1]).join("etc/marker")).unwrap(),
        "docker\n"
    );
}

/// A build names the registry and its realm: a registry on the node's loopback is refused
/// unless listed, and a realm on another host over plain HTTP (here another loopback address)
/// gets nothing, credentials least of all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unlisted_loopback_registries_and_foreign_realms_are_refused_before_anything_is_sent() {
    use registry::{token_front, FrontMode};
    let work = tempfile::tempdir().unwrap();
    let reg = LocalRegistry::start(&work.path().join("reg"), None).unwrap();
    registry::push_three_layers(&reg, work.path(), "team/realm:1", "realm\n");
    let password = "r3alm-Pa55word";
    let auth = Some(BasicAuth {
        username: "builder".into(),
        password: password.into(),
    });

    // Nothing listed: the loopback registry is not contacted at all.
    let front = token_front(&reg.addr, "builder", password, FrontMode::Token).await;
    let node = Node::new();
    let err = node
        .unlisted_puller(RegistrySettings::default())
        .pull(&reference(&front.addr, "team/realm:1"), auth.clone(), None)
        .await
        .unwrap_err();
    assert!(matches!(err, PullError::Refused { .. }), "{err}");
    assert!(
        err.to_string().contains("STRATA_INSECURE_REGISTRIES"),
        "{err}"
    );
    assert_eq!(front.hits.load(Ordering::SeqCst), 0, "nothing reached it");

    // Listed registry, realm on another (unlisted) host over plain HTTP: the realm's server,
    // listening there, receives nothing.
    let realm = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
    let realm_port = realm.local_addr().unwrap().port();
    let arrived = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = arrived.clone();
    let realm_task = tokio::spawn(async move {
        while let Ok((_conn, _)) = realm.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
        }
    });
    let foreign = token_front(
        &reg.addr,
        "builder",
        password,
        FrontMode::RealmElsewhere(realm_port),
    )
    .await;
    let err = node
        .puller(RegistrySettings::default())
        .pull(&reference(&foreign.addr, "team/realm:1"), auth, None)
        .await
        .unwrap_err();
    assert!(matches!(err, PullError::Refused { .. }), "{err}");
    assert!(err.to_string().contains("no credentials"), "{err}");
    assert!(!format!("{err:?}").contains(password));
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(
        arrived.load(Ordering::SeqCst),
        0,
        "no connection reached the realm"
    );
    assert_eq!(foreign.forwarded.load(Ordering::SeqCst), 0);
    assert_eq!(node.contents(), (0, 0, 0), "nothing stored");
    realm_task.abort();
}

/// A registry the test writes by hand on loopback: one manifest for every tag, and the blobs
/// it is given, so it can lie where a real registry never would (a layer descriptor without
/// `size`, a layer tar with a hostile header, a manifest naming blobs it does not have).
struct HandRegistry {
    addr: String,
    /// Blob requests it answered, found or not.
    blob_requests: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for HandRegistry {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn sha256_of(b: &[u8]) -> String {
    format!(
        "sha256:{}",
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(b))
    )
}

/// A one-layer OCI manifest (gzip layer `layer_digest` of tar digest `diff_id`, with its
/// `size` only when given) and its config, as (manifest, config) bytes.
fn one_layer_image(layer_digest: &str, size: Option<u64>, diff_id: &str) -> (Vec<u8>, Vec<u8>) {
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": registry::node_arch(), "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }))
    .unwrap();
    let mut layer_desc = serde_json::json!({
        "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
        "digest": layer_digest,
    });
    if let Some(size) = size {
        layer_desc["size"] = size.into();
    }
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": sha256_of(&config), "size": config.len()},
        "layers": [layer_desc],
    }))
    .unwrap();
    (manifest, config)
}

/// Serves `manifest` for every tag and the `blobs` by their digests (404 for others).
async fn hand_registry(manifest: Vec<u8>, blobs: Vec<Vec<u8>>) -> HandRegistry {
    use axum::response::IntoResponse;
    let blobs: std::collections::HashMap<String, Vec<u8>> =
        blobs.into_iter().map(|b| (sha256_of(&b), b)).collect();
    let blobs = Arc::new(blobs);
    let blob_requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = blob_requests.clone();
    let handler = move |uri: axum::http::Uri| {
        let (blobs, manifest, counter) = (blobs.clone(), manifest.clone(), counter.clone());
        async move {
            let path = uri.path();
            if path == "/v2/" {
                return (axum::http::StatusCode::OK, "{}").into_response();
            }
            if path.contains("/manifests/") {
                return (
                    [("content-type", "application/vnd.oci.image.manifest.v1+json")],
                    manifest,
                )
                    .into_response();
            }
            counter.fetch_add(1, Ordering::SeqCst);
            match path.rsplit('/').next().and_then(|d| blobs.get(d)) {
                Some(bytes) => bytes.clone().into_response(),
                None => axum::http::StatusCode::NOT_FOUND.into_response(),
            }
        }
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let app = axum::Router::new().fallback(handler);
    let task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    HandRegistry {
        addr,
        blob_requests,
        task,
    }
}

/// A layer tar of one file, owned by root.
fn one_file_tar(name: &str, contents: &[u8]) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(contents.len() as u64);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    tar.append_data(&mut h, name, contents).unwrap();
    tar.into_inner().unwrap()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

/// Issue: a layer descriptor without `size` counted 0 against STRATA_PULL_MAX_BYTES. The bytes
/// that arrive are counted now: over the ceiling the pull fails saying so, and nothing is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_layer_without_a_declared_size_is_counted_as_it_arrives() {
    let noise: Vec<u8> = (0..400_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let tar = one_file_tar("noise", &noise);
    let layer = gzip(&tar);
    let size = layer.len() as u64;
    let (manifest, config) = one_layer_image(&sha256_of(&layer), None, &sha256_of(&tar));
    let reg = hand_registry(manifest, vec![config, layer]).await;
    let node = Node::new();
    let err = node
        .puller(RegistrySettings {
            max_bytes: Some(size / 2),
            ..Default::default()
        })
        .pull(&reference(&reg.addr, "team/sizeless:1"), None, None)
        .await
        .unwrap_err();
    assert!(matches!(err, PullError::TooLarge { .. }), "{err}");
    assert!(err.to_string().contains("STRATA_PULL_MAX_BYTES"), "{err}");
    assert_eq!(node.contents(), (0, 0, 0));
    // Under a ceiling it fits, the same registry's image pulls.
    let roomy = Node::new();
    roomy
        .puller(RegistrySettings {
            max_bytes: Some(size * 2),
            ..Default::default()
        })
        .pull(&reference(&reg.addr, "team/sizeless:1"), None, None)
        .await
        .unwrap();
}

/// Issue: a tar's GNU long-name header was read whole into memory before any size check. A
/// layer whose first header announces a 64 MiB long name (and sends it: it compresses to
/// almost nothing) fails the pull naming the header, and nothing is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_layer_with_a_huge_long_name_header_fails_the_pull_before_it_is_read() {
    let announced = 64u64 << 20;
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::GNULongName);
    h.set_path("././@LongLink").unwrap();
    h.set_size(announced);
    h.set_mode(0o644);
    h.set_cksum();
    let mut tar = h.as_bytes().to_vec();
    tar.resize(512 + announced as usize, b'a');
    tar.extend_from_slice(&[0u8; 1024]);
    let layer = gzip(&tar);
    let (manifest, config) = one_layer_image(
        &sha256_of(&layer),
        Some(layer.len() as u64),
        &sha256_of(&tar),
    );
    let reg = hand_registry(manifest, vec![config, layer]).await;
    let node = Node::new();
    let err = node
        .puller(RegistrySettings::default())
        .pull(&reference(&reg.addr, "team/longname:1"), None, None)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("GNU long name entry of 67108864 bytes"),
        "{text}"
    );
    assert_eq!(node.contents(), (0, 0, 0));
}

/// Issue: the puller reused any stored layer a manifest named, and answered from an earlier
/// pull of the same manifest digest, so a tenant who knew another tenant's private layer
/// digests (SBOMs, CI logs) could serve a manifest naming them from a registry of their own
/// and boot on bytes it never had. Now a stored layer or earlier result counts only for the
/// repository that served it: the hand-written registry has to serve the bytes itself, does
/// not have them, and the pull fails; with the bytes, they are verified and nothing is stored
/// twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_layer_another_repository_served_is_reused_only_after_this_one_serves_it_too() {
    let work = tempfile::tempdir().unwrap();
    let reg = LocalRegistry::start(&work.path().join("reg"), None).unwrap();
    let private = registry::push_three_layers(&reg, work.path(), "victim/private:1", "secret\n");
    let node = Node::new();
    let puller = node.puller(RegistrySettings::default());
    let (pulled, _) = puller
        .pull(&reference(&reg.addr, "victim/private:1"), None, None)
        .await
        .unwrap();
    let held = node.contents();
    let (victim_manifest, _) = registry::inspect_raw(&reg, "victim/private:1");
    let first = &victim_manifest["layers"][0];
    let (layer_digest, layer_size) = (
        first["digest"].as_str().unwrap().to_owned(),
        first["size"].as_u64().unwrap(),
    );

    // A manifest naming the victim's first layer, from a registry that does not have it.
    let (manifest, config) = one_layer_image(&layer_digest, Some(layer_size), &private.diff_ids[0]);
    let evil = hand_registry(manifest.clone(), vec![config.clone()]).await;
    let err = puller
        .pull(&reference(&evil.addr, "attacker/probe:1"), None, None)
        .await
        .unwrap_err();
    assert!(matches!(err, PullError::NotFound { .. }), "{err}");
    assert!(
        evil.blob_requests.load(Ordering::SeqCst) >= 2,
        "the layer was asked of the registry, not answered from the node"
    );
    assert_eq!(node.contents(), held, "nothing new stored, nothing lost");

    // The victim's very manifest, served by that registry: no earlier result is reused either.
    let raw = std::process::Command::new("skopeo")
        .args(["inspect", "--raw", "--tls-verify=false"])
        .arg(format!("docker://{}/victim/private:1", reg.addr))
        .output()
        .unwrap()
        .stdout;
    let (_, top) = registry::inspect_raw(&reg, "victim/private:1");
    assert_eq!(top, pulled.digest.to_string());
    let replayed = hand_registry(raw, vec![]).await;
    let err = puller
        .pull(&reference(&replayed.addr, "attacker/replay:1"), None, None)
        .await
        .unwrap_err();
    assert!(!matches!(err, PullError::TooLarge { .. }), "{err}");

    // The same repository again is a warm pull; a repository that does serve the bytes gets
    // them verified and reused (one blob on disk).
    let (again, stats) = puller
        .pull(&reference(&reg.addr, "victim/private:1"), None, None)
        .await
        .unwrap();
    assert_eq!(again.digest, pulled.digest);
    assert_eq!(stats.layers_downloaded, 0);
    let layer_bytes = reqwest::get(format!(
        "http://{}/v2/victim/private/blobs/{layer_digest}",
        reg.addr
    ))
    .await
    .unwrap()
    .error_for_status()
    .unwrap()
    .bytes()
    .await
    .map(|b| b.to_vec())
    .expect("the registry's own copy of the layer");
    let holding = hand_registry(manifest, vec![config, layer_bytes]).await;
    let (mirror, stats) = puller
        .pull(&reference(&holding.addr, "other/holder:1"), None, None)
        .await
        .unwrap();
    assert_eq!(mirror.layers[0].digest.to_string(), private.diff_ids[0]);
    assert_eq!(stats.layers_downloaded, 1, "served and verified once");
    assert_eq!(node.contents(), held, "the layer is not stored twice");
}

/// A layer that expands to more than one build may write (STRATA_BUILD_DISK_MAX, which a build
/// node sets as the layer ceiling) fails the pull saying so, and nothing is kept: a gzip layer of
/// a few KiB cannot fill the node's disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_layer_that_expands_past_what_a_build_may_write_fails_the_pull() {
    let zeros = vec![0u8; 4 << 20];
    let tar = one_file_tar("zeros", &zeros);
    let layer = gzip(&tar);
    assert!(layer.len() < 64 << 10, "it compresses to almost nothing");
    let (manifest, config) = one_layer_image(
        &sha256_of(&layer),
        Some(layer.len() as u64),
        &sha256_of(&tar),
    );
    let reg = hand_registry(manifest, vec![config, layer]).await;
    let node = Node::new();
    let err = node
        .puller(RegistrySettings {
            max_layer_bytes: Some(1 << 20),
            ..Default::default()
        })
        .pull(&reference(&reg.addr, "team/bomb:1"), None, None)
        .await
        .unwrap_err();
    assert!(
        matches!(err, PullError::LayerTooLarge { limit: 1048576, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("STRATA_BUILD_DISK_MAX"), "{err}");
    assert_eq!(node.contents(), (0, 0, 0));
    // Within the ceiling it pulls.
    Node::new()
        .puller(RegistrySettings {
            max_layer_bytes: Some(8 << 20),
            ..Default::default()
        })
        .pull(&reference(&reg.addr, "team/bomb:1"), None, None)
        .await
        .unwrap();
}
