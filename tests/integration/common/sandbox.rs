//! Sandbox helpers: the test node directory (shared by every sandbox test, content-addressed,
//! so concurrent tests are safe), the busybox base (built on first use), and ways to look at a
//! sandbox from inside and from the host.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use strata::domain::ids::Digest;
use strata::vmm::image;
use strata::vmm::{
    BootSpec, ExecOutcome, ExecRequest, NamespaceBackend, NamespaceConfig, Network, OutputLine,
    OutputSink, OutputStream, Sandbox, SandboxBackend,
};

/// The node's own data directory. Tests never write there (`scripts/test.sh` runs them with it
/// mounted read-only); they only read its prebuilt base images.
pub const NODE_STORE: &str = "/var/lib/strata";

/// Where the prebuilt base images are read from: `$STRATA_IMAGE_STORE`, else [`NODE_STORE`]
/// (where `scripts/setup.sh` builds them).
pub fn image_store() -> PathBuf {
    std::env::var_os("STRATA_IMAGE_STORE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(NODE_STORE))
}

/// The test node directory: `$STRATA_TEST_NODE_DIR`, else `/tmp/strata-test-node`, kept
/// between runs like the test Postgres. On first use in a process it gets a copy of every
/// image of [`image_store`] it lacks (blobs checked against their digests), so tests boot the
/// prebuilt bases without ever writing to the node's own directory.
pub fn node_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::var_os("STRATA_TEST_NODE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/tmp/strata-test-node"));
        assert!(
            !dir.starts_with(NODE_STORE),
            "STRATA_TEST_NODE_DIR={} is the node's own data directory; tests use their own",
            dir.display()
        );
        std::fs::create_dir_all(&dir).expect("create the test node directory");
        seed_images(&dir);
        dir
    })
    .clone()
}

/// Copies the prebuilt base images into `dir`, one process at a time.
fn seed_images(dir: &Path) {
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(".seed.lock"))
        .expect("open the test node seed lock");
    // SAFETY: flock on a descriptor we own; released when `lock` is dropped.
    unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
    let blobs = strata::vmm::LocalBlobStore::open(dir.join("blobs")).expect("test blob store");
    image::copy_images(&image_store(), dir, &blobs).unwrap_or_else(|e| {
        panic!(
            "copying the base images from {} into {}: {e}",
            image_store().display(),
            dir.display()
        )
    });
    drop(lock);
}

/// A node directory of the test's own, with `images` of the test node's catalog (their blobs
/// hard-linked, so this is cheap): for tests that delete blobs, which must never touch what
/// other tests share.
pub fn private_node(images: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a private node directory");
    let shared = node_dir();
    let from = image::ImageCatalog::open(&shared).expect("the test node catalog");
    let to = image::ImageCatalog::open(dir.path()).expect("the private catalog");
    strata::vmm::LocalBlobStore::open(dir.path().join("blobs")).expect("the private blob store");
    for name in images {
        let manifest = from
            .get(name)
            .expect("the image is in the test node catalog");
        for digest in manifest
            .digests()
            .into_iter()
            .chain(manifest.license_notice)
        {
            let src = shared.join("blobs/sha256").join(digest.hex());
            let dest = dir.path().join("blobs/sha256").join(digest.hex());
            if std::fs::hard_link(&src, &dest).is_err() {
                std::fs::copy(&src, &dest).expect("copy a base image blob");
            }
        }
        to.put(&manifest).expect("write the private catalog entry");
    }
    dir
}

pub fn backend() -> NamespaceBackend {
    backend_with_network(Default::default())
}

/// A backend whose sandboxes' networks follow `network` (ADR 0022).
pub fn backend_with_network(network: strata::vmm::NetworkConfig) -> NamespaceBackend {
    backend_with(network, Default::default())
}

/// A backend whose sandboxes' disks follow `disk` (ADR 0023).
pub fn backend_with_disk(disk: strata::vmm::namespace::scratch::DiskConfig) -> NamespaceBackend {
    backend_with(Default::default(), disk)
}

fn backend_with(
    network: strata::vmm::NetworkConfig,
    disk: strata::vmm::namespace::scratch::DiskConfig,
) -> NamespaceBackend {
    NamespaceBackend::new(NamespaceConfig {
        data_dir: node_dir(),
        agent_binary: super::strata_bin(),
        depth: Default::default(),
        ids: Default::default(),
        network,
        disk,
    })
    .expect("the namespace backend (these tests run as root)")
}

/// The busybox base's layers, building the image if the node has none.
pub async fn busybox(backend: &NamespaceBackend) -> Vec<Digest> {
    let blobs = backend.blobs();
    tokio::task::spawn_blocking(move || image::ensure_busybox(&node_dir(), blobs.as_ref()))
        .await
        .unwrap()
        .expect("the busybox base image")
        .digests()
}

pub fn spec(layers: Vec<Digest>) -> BootSpec {
    let mut s = BootSpec::new(layers);
    s.limits.network = Network::None;
    s
}

pub struct Output {
    pub outcome: ExecOutcome,
    pub stdout: String,
    pub stderr: String,
    pub lines: Vec<OutputLine>,
}

pub async fn exec(sb: &mut Box<dyn Sandbox>, request: ExecRequest) -> Output {
    let (sink, collecting) = OutputSink::collect(64 << 20);
    let outcome = sb.exec(request, sink).await.expect("exec");
    let output = collecting.finish().await;
    Output {
        outcome,
        stdout: output.text(OutputStream::Stdout),
        stderr: output.text(OutputStream::Stderr),
        lines: output.lines,
    }
}

/// Runs a shell command that must succeed; returns its stdout.
pub async fn sh(sb: &mut Box<dyn Sandbox>, cmd: &str) -> String {
    let out = exec(sb, ExecRequest::shell(cmd)).await;
    assert!(
        out.outcome.success(),
        "`{cmd}` failed with {:?}: {}",
        out.outcome,
        out.stderr
    );
    out.stdout
}

/// Every path of the root filesystem with type, mode, owner, size, content hash and link
/// target, as seen from inside the sandbox (other mounts excluded).
pub async fn manifest(sb: &mut Box<dyn Sandbox>) -> String {
    sh(
        sb,
        r#"find / -xdev | sort | while IFS= read -r p; do
  if [ -L "$p" ]; then echo "$p|link|$(stat -c '%u:%g' "$p")|$(readlink "$p")";
  elif [ -f "$p" ]; then echo "$p|file|$(stat -c '%a|%u:%g|%s' "$p")|$(sha256sum < "$p" | cut -d' ' -f1)";
  elif [ -d "$p" ]; then echo "$p|dir|$(stat -c '%a|%u:%g' "$p")";
  else echo "$p|other|$(stat -c '%F|%a|%u:%g' "$p")"; fi
done"#,
    )
    .await
}

/// Asserts that nothing of sandbox `id` is left on the host: no directory, no cgroup, no
/// mount, no process.
pub fn assert_no_trace(id: &str) {
    let dir = node_dir().join("sandboxes").join(id);
    // A destroyed sandbox's disk and directory go a moment after its processes (ADR 0023).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while dir.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(!dir.exists(), "{} is left behind", dir.display());
    for ctrl in ["", "pids/", "memory/", "cpu/", "devices/", "unified/"] {
        let cg = PathBuf::from(format!("/sys/fs/cgroup/{ctrl}strata/{id}"));
        assert!(!cg.exists(), "cgroup {} is left behind", cg.display());
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(id), "a mount of {id} is left behind");
    // The kernel detaches an autoclear loop device once its filesystem is gone, possibly
    // from a work queue: a moment after the unmount.
    let loops_of = || -> Vec<std::ffi::OsString> {
        std::fs::read_dir("/sys/block")
            .unwrap()
            .flatten()
            .filter(|e| {
                std::fs::read_to_string(e.path().join("loop/backing_file"))
                    .is_ok_and(|f| f.contains(id))
            })
            .map(|e| e.file_name())
            .collect()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !loops_of().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(
        loops_of(),
        Vec::<std::ffi::OsString>::new(),
        "loop devices of {id} are left behind"
    );
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cg) = std::fs::read_to_string(entry.path().join("cgroup")) {
            assert!(
                !cg.contains(&format!("strata/{id}")),
                "process {:?} of {id} is left behind",
                entry.file_name()
            );
        }
    }
}

/// Boots a sandbox for the test; the caller destroys it.
pub async fn boot(backend: &NamespaceBackend, spec: BootSpec) -> Box<dyn Sandbox> {
    backend.boot(spec).await.expect("boot")
}
