//! The local image catalog and the built-in base images.
//!
//! `<data>/images/<name>.json` maps a name to a manifest: ordered layer digests (bottom
//! first), the config (env, user, workdir) and the digest of a license notice. Every blob is
//! pinned by sha256 and verified when it is imported and again when it is extracted.
//!
//! Built-in bases (`strata image build-base`):
//! * `busybox`: busybox-static from Debian (`apt-get download` + `dpkg -x`), one symlink per
//!   applet; tiny and fast, for tests.
//! * `debian:bookworm`: `debootstrap --variant=minbase bookworm`, apt caches removed.
//! * `e2bdev/base`: the Debian base plus what users of E2B's default image expect (sudo, curl,
//!   git, ca-certificates, python3 with pip, node with npm, ...), installed by a RUN in a real
//!   sandbox and checkpointed as a second layer.

use std::fs;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::backend::{BootSpec, ExecRequest, Limits, Sandbox, SandboxBackend};
use super::blob_store::BlobStore;
use super::error::{Result, VmmError};
use super::id_range::Owners;
use super::layer::{self, LayerRef};
use crate::domain::ids::Digest;
use crate::domain::image_ref::ImageRef;

pub const BUSYBOX: &str = "busybox";
pub const DEBIAN: &str = "debian:bookworm";
/// The Debian release [`DEBIAN`] is built from.
pub const DEBIAN_RELEASE: &str = "bookworm";
pub const E2B_BASE: &str = "e2bdev/base";

/// What an operator runs to get image `name` into a node's catalog, for "not available" errors.
pub fn how_to_get(name: &str) -> String {
    match name {
        BUSYBOX => "build it with `strata image build-base --busybox-only`".to_owned(),
        DEBIAN | E2B_BASE => "build it with `strata image build-base`".to_owned(),
        _ => format!(
            "import it with `strata image import <docker save archive or OCI layout> --name {name}`"
        ),
    }
}

#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct ImageConfig {
    pub env: Vec<(String, String)>,
    pub user: Option<String>,
    pub workdir: Option<String>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ImageManifest {
    pub name: String,
    /// Bottom first.
    pub layers: Vec<LayerRef>,
    pub config: ImageConfig,
    /// A blob holding the license notice that travels with the image.
    pub license_notice: Option<Digest>,
    /// How the image was made, for operators.
    pub source: String,
}

impl ImageManifest {
    pub fn digests(&self) -> Vec<Digest> {
        self.layers.iter().map(|l| l.digest).collect()
    }
    pub fn size(&self) -> u64 {
        self.layers.iter().map(|l| l.size).sum()
    }
    /// The manifest's own digest: sha256 of its canonical JSON.
    pub fn digest(&self) -> Digest {
        Digest::of(&serde_json::to_vec(self).expect("manifest serializes"))
    }
}

#[derive(Debug, Clone)]
pub struct ImageCatalog {
    dir: PathBuf,
}

fn file_name(name: &str) -> String {
    name.replace('/', "%2F").replace(':', "%3A") + ".json"
}

impl ImageCatalog {
    pub fn open(data_dir: &Path) -> Result<ImageCatalog> {
        let dir = data_dir.join("images");
        fs::create_dir_all(&dir).map_err(VmmError::io(format!("creating {}", dir.display())))?;
        Ok(ImageCatalog { dir })
    }

    /// The entry named `name`, compared as Docker compares references (`debian:bookworm`,
    /// `docker.io/library/debian:bookworm` and `e2bdev/base:latest` / `e2bdev/base` are the
    /// same names). A reference pinned by digest names a registry manifest, never an entry here.
    pub fn get(&self, name: &str) -> Result<ImageManifest> {
        let path = self.dir.join(file_name(name));
        if let Ok(bytes) = fs::read(&path) {
            return serde_json::from_slice(&bytes)
                .map_err(|e| VmmError::Image(format!("{}: {e}", path.display())));
        }
        let not_found = || VmmError::ImageNotFound(name.to_string());
        let wanted = ImageRef::parse(name).map_err(|_| not_found())?;
        if wanted.digest().is_some() {
            return Err(not_found());
        }
        self.list()?
            .into_iter()
            .find(|m| ImageRef::parse(&m.name).is_ok_and(|r| r == wanted))
            .ok_or_else(not_found)
    }

    pub fn put(&self, manifest: &ImageManifest) -> Result<()> {
        let path = self.dir.join(file_name(&manifest.name));
        let tmp = self
            .dir
            .join(format!(".{}.tmp", uuid::Uuid::new_v4().simple()));
        fs::write(
            &tmp,
            serde_json::to_vec_pretty(manifest).expect("manifest serializes"),
        )
        .map_err(VmmError::io("writing an image manifest"))?;
        fs::rename(&tmp, &path).map_err(VmmError::io("publishing an image manifest"))
    }

    /// Drops a name from the catalog (its blobs stay until garbage collection).
    pub fn remove(&self, name: &str) -> Result<()> {
        match fs::remove_file(self.dir.join(file_name(name))) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(VmmError::ImageNotFound(name.to_string()))
            }
            Err(e) => Err(VmmError::io("removing an image")(e)),
        }
    }

    pub fn list(&self) -> Result<Vec<ImageManifest>> {
        let mut out = Vec::new();
        for e in fs::read_dir(&self.dir).map_err(VmmError::io("listing images"))? {
            let p = e.map_err(VmmError::io("listing images"))?.path();
            if p.extension().is_some_and(|x| x == "json") {
                if let Ok(m) =
                    serde_json::from_slice::<ImageManifest>(&fs::read(&p).unwrap_or_default())
                {
                    out.push(m);
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Checks that every blob of `name` is present and hashes to its digest.
    pub fn verify(&self, name: &str, blobs: &dyn BlobStore) -> Result<ImageManifest> {
        let m = self.get(name)?;
        for l in &m.layers {
            blobs.verify(&l.digest)?;
        }
        Ok(m)
    }
}

fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let out = cmd
        .output()
        .map_err(|e| VmmError::Image(format!("{what}: {e}")))?;
    if !out.status.success() {
        return Err(VmmError::Image(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Serializes base-image builds across processes (parallel tests, setup).
fn lock(data_dir: &Path) -> Result<fs::File> {
    use std::os::fd::AsRawFd;
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(data_dir.join("images/.build.lock"))
        .map_err(VmmError::io("opening the image build lock"))?;
    // SAFETY: flock on a descriptor we own; released when the file closes.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
    Ok(f)
}

/// Builds the busybox base if the catalog lacks it; returns its manifest.
pub fn ensure_busybox(data_dir: &Path, blobs: &dyn BlobStore) -> Result<ImageManifest> {
    let catalog = ImageCatalog::open(data_dir)?;
    if let Ok(m) = catalog.verify(BUSYBOX, blobs) {
        return Ok(m);
    }
    let _guard = lock(data_dir)?;
    if let Ok(m) = catalog.verify(BUSYBOX, blobs) {
        return Ok(m);
    }
    let work = tempfile::tempdir().map_err(VmmError::io("creating a build directory"))?;
    let deb_dir = work.path().join("deb");
    fs::create_dir(&deb_dir).map_err(VmmError::io("creating a build directory"))?;
    run(
        Command::new("apt-get")
            .args(["download", "-q", "busybox-static"])
            .current_dir(&deb_dir),
        "apt-get download busybox-static (run `apt-get update` first if the package is unknown)",
    )?;
    let deb = fs::read_dir(&deb_dir)
        .map_err(VmmError::io("reading the download directory"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .ok_or_else(|| VmmError::Image("apt-get download produced no .deb".into()))?;
    let unpacked = work.path().join("pkg");
    run(
        Command::new("dpkg").arg("-x").arg(&deb).arg(&unpacked),
        "dpkg -x",
    )?;
    let rootfs = work.path().join("rootfs");
    for (d, mode) in [
        ("", 0o755),
        ("bin", 0o755),
        ("sbin", 0o755),
        ("usr", 0o755),
        ("usr/bin", 0o755),
        ("usr/sbin", 0o755),
        ("etc", 0o755),
        ("root", 0o700),
        ("home", 0o755),
        ("tmp", 0o1777),
        ("proc", 0o555),
        ("dev", 0o755),
        ("var", 0o755),
        ("var/tmp", 0o1777),
    ] {
        let p = rootfs.join(d);
        fs::create_dir_all(&p).map_err(VmmError::io("creating the busybox rootfs"))?;
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).map_err(VmmError::io("chmod"))?;
    }
    let busybox = rootfs.join("bin/busybox");
    fs::copy(unpacked.join("bin/busybox"), &busybox).map_err(VmmError::io("copying busybox"))?;
    let list = Command::new(&busybox)
        .arg("--list-full")
        .output()
        .map_err(|e| VmmError::Image(format!("busybox --list-full: {e}")))?;
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        let link = rootfs.join(applet);
        if applet.is_empty() || applet == "bin/busybox" || link.exists() {
            continue;
        }
        if let Some(parent) = link.parent() {
            fs::create_dir_all(parent).map_err(VmmError::io("creating applet directories"))?;
        }
        std::os::unix::fs::symlink("/bin/busybox", &link)
            .map_err(VmmError::io("linking an applet"))?;
    }
    let etc = rootfs.join("etc");
    let files = [
        (
            "passwd",
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
            0o644,
        ),
        ("group", "root:x:0:\nnogroup:x:65534:\n", 0o644),
        (
            "shadow",
            "root:*:19000:0:99999:7:::\nnobody:*:19000:0:99999:7:::\n",
            0o640,
        ),
        ("hosts", "127.0.0.1 localhost\n::1 localhost\n", 0o644),
        ("resolv.conf", "", 0o644),
    ];
    for (name, content, mode) in files {
        fs::write(etc.join(name), content).map_err(VmmError::io("writing /etc"))?;
        fs::set_permissions(etc.join(name), fs::Permissions::from_mode(mode))
            .map_err(VmmError::io("chmod"))?;
    }
    let layer = layer::seal_dir(&rootfs, blobs, Owners::AsSandbox)?;
    let notice =
        fs::read(unpacked.join("usr/share/doc/busybox-static/copyright")).unwrap_or_default();
    let license = blobs.put_bytes(&notice)?.0;
    let manifest = ImageManifest {
        name: BUSYBOX.into(),
        layers: vec![layer],
        config: ImageConfig {
            env: vec![(
                "PATH".into(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            )],
            user: None,
            workdir: None,
        },
        license_notice: Some(license),
        source: format!(
            "Debian busybox-static ({})",
            deb.file_name().unwrap_or_default().to_string_lossy()
        ),
    };
    catalog.put(&manifest)?;
    Ok(manifest)
}

/// Builds `debian:bookworm` with debootstrap if the catalog lacks it, from `mirror` or else the
/// Debian mirror this machine's apt uses ([`crate::host_apt`]).
pub fn ensure_debian(
    data_dir: &Path,
    blobs: &dyn BlobStore,
    mirror: Option<&str>,
) -> Result<ImageManifest> {
    let catalog = ImageCatalog::open(data_dir)?;
    if let Ok(m) = catalog.verify(DEBIAN, blobs) {
        return Ok(m);
    }
    let _guard = lock(data_dir)?;
    if let Ok(m) = catalog.verify(DEBIAN, blobs) {
        return Ok(m);
    }
    let mirror = match mirror {
        Some(m) => m.to_string(),
        None => crate::host_apt::debian_mirror(DEBIAN_RELEASE)
            .map_err(|e| VmmError::Image(format!("building {DEBIAN}: {e}")))?,
    };
    let mirror = mirror.as_str();
    let work =
        tempfile::tempdir_in(data_dir).map_err(VmmError::io("creating a build directory"))?;
    let rootfs = work.path().join("rootfs");
    run(
        Command::new("debootstrap")
            .args(["--variant=minbase", DEBIAN_RELEASE])
            .arg(&rootfs)
            .arg(mirror),
        "debootstrap --variant=minbase bookworm (install it with `apt-get install debootstrap`)",
    )?;
    // Caches, device nodes and the host's resolver do not belong in an image.
    for dir in [
        "var/cache/apt/archives",
        "var/lib/apt/lists",
        "dev",
        "proc",
        "sys",
        "run",
        "tmp",
    ] {
        let p = rootfs.join(dir);
        if let Ok(entries) = fs::read_dir(&p) {
            for e in entries.flatten() {
                let path = e.path();
                if path.is_dir() && !path.is_symlink() {
                    let _ = fs::remove_dir_all(&path);
                } else {
                    let _ = fs::remove_file(&path);
                }
            }
        }
    }
    let _ = fs::remove_file(rootfs.join("etc/resolv.conf"));
    fs::write(rootfs.join("etc/resolv.conf"), "").map_err(VmmError::io("writing resolv.conf"))?;
    let _ = fs::write(rootfs.join("etc/hostname"), "sandbox\n");
    let packages = Command::new("chroot")
        .arg(&rootfs)
        .args(["dpkg-query", "-W", "-f", "${Package} ${Version}\\n"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let layer = layer::seal_dir(&rootfs, blobs, Owners::AsSandbox)?;
    let notice = format!(
        "Debian GNU/Linux bookworm (minbase), built with debootstrap from {mirror}.\n\
         Each package's license is in /usr/share/doc/<package>/copyright inside the image.\n\n\
         Packages:\n{packages}"
    );
    let license = blobs.put_bytes(notice.as_bytes())?.0;
    let manifest = ImageManifest {
        name: DEBIAN.into(),
        layers: vec![layer],
        config: ImageConfig {
            env: vec![(
                "PATH".into(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            )],
            user: None,
            workdir: None,
        },
        license_notice: Some(license),
        source: format!("debootstrap --variant=minbase bookworm {mirror}"),
    };
    catalog.put(&manifest)?;
    Ok(manifest)
}

/// What `e2bdev/base` carries on top of `debian:bookworm`: the packages E2B's own provisioning
/// puts on every Debian base (sudo, curl, ca-certificates, git, iproute2 for `ss`, procps for
/// `pgrep`, jq, socat, less) and the toolchains users of E2B's default image rely on (`pip`,
/// `npm`), so the SDK's `apt_install`, `pip_install`, `npm_install`, `git_clone` and its
/// ready-command helpers work on it unchanged.
pub const E2B_BASE_PACKAGES: &[&str] = &[
    "ca-certificates",
    "curl",
    "git",
    "sudo",
    "python3",
    "python3-pip",
    "python3-venv",
    "nodejs",
    "npm",
    "iproute2",
    "procps",
    "jq",
    "socat",
    "less",
];

/// Names the recipe of `e2bdev/base`; an image made by another recipe is rebuilt by
/// `strata image build-base`, so nodes set up before a recipe change catch up on the next setup.
const E2B_BASE_RECIPE: &str = "e2bdev/base recipe 2";

fn e2b_base_source() -> String {
    format!(
        "{DEBIAN} + {} ({E2B_BASE_RECIPE})",
        E2B_BASE_PACKAGES.join(" ")
    )
}

/// The install script of `e2bdev/base`. dpkg skips its fsyncs (the result is sealed into a
/// layer afterwards, so they buy nothing and cost minutes on a busy disk). Debian marks its
/// Python as externally managed (PEP 668), which makes a plain `pip install` fail; E2B's image
/// lets it install, so pip is told to do so system-wide.
fn e2b_base_script() -> String {
    format!(
        "set -e; apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
         -o Dpkg::Options::=--force-unsafe-io --no-install-recommends {} && apt-get clean && rm -rf /var/lib/apt/lists/* \
         && printf '[global]\\nbreak-system-packages = true\\n' > /etc/pip.conf",
        E2B_BASE_PACKAGES.join(" ")
    )
}

/// Whether the catalog's `e2bdev/base` is missing, broken or made by an older recipe.
fn e2b_base_current(catalog: &ImageCatalog, blobs: &dyn BlobStore) -> Option<ImageManifest> {
    catalog
        .verify(E2B_BASE, blobs)
        .ok()
        .filter(|m| m.source == e2b_base_source())
}

/// Builds `e2bdev/base` (the Debian base plus [`E2B_BASE_PACKAGES`]) in a sandbox, unless the
/// catalog already has one made by the current recipe.
pub async fn ensure_e2b_base(
    data_dir: &Path,
    backend: &dyn SandboxBackend,
    blobs: &dyn BlobStore,
) -> Result<ImageManifest> {
    let catalog = ImageCatalog::open(data_dir)?;
    if let Some(m) = e2b_base_current(&catalog, blobs) {
        return Ok(m);
    }
    let _guard = lock(data_dir)?;
    if let Some(m) = e2b_base_current(&catalog, blobs) {
        return Ok(m);
    }
    let debian = catalog.get(DEBIAN)?;
    let mut spec = BootSpec::new(debian.digests());
    spec.limits = Limits::default();
    spec.context.env = debian.config.env.clone();
    let mut sandbox: Box<dyn Sandbox> = backend.boot(spec).await?;
    let (sink, collecting) = crate::vmm::OutputSink::collect(256 << 10);
    let outcome = sandbox
        .exec(ExecRequest::shell(e2b_base_script()), sink)
        .await;
    let log = collecting.finish().await;
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => {
            sandbox.destroy().await?;
            return Err(e);
        }
    };
    if !outcome.success() {
        sandbox.destroy().await?;
        return Err(VmmError::Image(format!(
            "installing {} into {E2B_BASE} failed ({outcome:?}); the node needs network access to its Debian mirror: {}",
            E2B_BASE_PACKAGES.join(" "),
            log.joined()
        )));
    }
    let added = sandbox.checkpoint().await?;
    sandbox.destroy().await?;
    let mut layers = debian.layers.clone();
    layers.extend(added);
    let manifest = ImageManifest {
        name: E2B_BASE.into(),
        layers,
        config: debian.config.clone(),
        license_notice: debian.license_notice,
        source: e2b_base_source(),
    };
    catalog.put(&manifest)?;
    Ok(manifest)
}

/// Copies every image of the catalog in `from` (another node directory, only read) that the
/// catalog in `to` lacks: each blob the image names is streamed into `blobs` and checked against
/// its digest (blobs already present are skipped). A name `to` already has is kept as it is,
/// whatever `from` holds under it. Tests seed their own node directories from the node's
/// prebuilt base images this way without writing there.
pub fn copy_images(from: &Path, to: &Path, blobs: &dyn BlobStore) -> Result<Vec<ImageManifest>> {
    let source = from.join("images");
    let entries = match fs::read_dir(&source) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(VmmError::io(format!("listing {}", source.display()))(e)),
    };
    let catalog = ImageCatalog::open(to)?;
    let mut copied = Vec::new();
    for entry in entries {
        let path = entry
            .map_err(VmmError::io(format!("listing {}", source.display())))?
            .path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let bytes = fs::read(&path).map_err(VmmError::io(format!("reading {}", path.display())))?;
        let manifest: ImageManifest = serde_json::from_slice(&bytes)
            .map_err(|e| VmmError::Image(format!("{}: {e}", path.display())))?;
        if catalog.get(&manifest.name).is_ok() {
            continue;
        }
        let digests = manifest
            .digests()
            .into_iter()
            .chain(manifest.license_notice);
        for digest in digests {
            if blobs.intact_size(&digest)?.is_some() {
                continue;
            }
            let blob = from.join("blobs/sha256").join(digest.hex());
            let mut file = fs::File::open(&blob)
                .map_err(VmmError::io(format!("opening {}", blob.display())))?;
            let mut w = blobs.writer()?;
            std::io::copy(&mut file, &mut w)
                .map_err(VmmError::io(format!("copying {}", blob.display())))?;
            let (actual, _) = w.commit()?;
            if actual != digest {
                return Err(VmmError::DigestMismatch {
                    expected: digest.to_string(),
                    actual: actual.to_string(),
                });
            }
        }
        catalog.put(&manifest)?;
        copied.push(manifest);
    }
    Ok(copied)
}

/// Imports an OCI image layout directory or a `docker save` archive under `name`. Layers are
/// stored uncompressed and each is checked against the config's `rootfs.diff_ids`.
pub fn import(
    path: &Path,
    name: &str,
    data_dir: &Path,
    blobs: &dyn BlobStore,
) -> Result<ImageManifest> {
    let unpacked;
    let dir = if path.is_dir() {
        path.to_path_buf()
    } else {
        unpacked =
            tempfile::tempdir_in(data_dir).map_err(VmmError::io("creating an import directory"))?;
        let file =
            fs::File::open(path).map_err(VmmError::io(format!("opening {}", path.display())))?;
        tar::Archive::new(
            super::archive_policy::sniff_gzip(file).map_err(VmmError::io("reading the archive"))?,
        )
        .unpack(unpacked.path())
        .map_err(VmmError::io(format!("unpacking {}", path.display())))?;
        unpacked.path().to_path_buf()
    };
    let read_json = |p: &Path| -> Result<serde_json::Value> {
        let bytes = fs::read(p).map_err(VmmError::io(format!("reading {}", p.display())))?;
        serde_json::from_slice(&bytes).map_err(|e| VmmError::Image(format!("{}: {e}", p.display())))
    };
    let blob_path = |digest: &str| -> Result<PathBuf> {
        let (algo, hex) = digest
            .split_once(':')
            .ok_or_else(|| VmmError::Image(format!("bad digest {digest:?}")))?;
        Ok(dir.join("blobs").join(algo).join(hex))
    };
    let (config, layer_files): (serde_json::Value, Vec<PathBuf>) = if dir
        .join("index.json")
        .exists()
    {
        let index = read_json(&dir.join("index.json"))?;
        let mdesc = &index["manifests"][0];
        let mdigest = mdesc["digest"]
            .as_str()
            .ok_or_else(|| VmmError::Image("index.json has no manifest".into()))?;
        let mpath = blob_path(mdigest)?;
        check_file_digest(&mpath, mdigest)?;
        let manifest = read_json(&mpath)?;
        let cdigest = manifest["config"]["digest"]
            .as_str()
            .ok_or_else(|| VmmError::Image("manifest has no config".into()))?;
        let cpath = blob_path(cdigest)?;
        check_file_digest(&cpath, cdigest)?;
        let mut files = Vec::new();
        for l in manifest["layers"].as_array().cloned().unwrap_or_default() {
            let d = l["digest"].as_str().unwrap_or_default();
            let p = blob_path(d)?;
            check_file_digest(&p, d)?;
            files.push(p);
        }
        (read_json(&cpath)?, files)
    } else if dir.join("manifest.json").exists() {
        let m = read_json(&dir.join("manifest.json"))?;
        let entry = &m[0];
        let config = read_json(&dir.join(entry["Config"].as_str().unwrap_or_default()))?;
        let files = entry["Layers"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|l| dir.join(l.as_str().unwrap_or_default()))
            .collect();
        (config, files)
    } else {
        return Err(VmmError::Image(format!(
            "{} is neither an OCI image layout (index.json) nor a docker save archive (manifest.json)",
            path.display()
        )));
    };
    let diff_ids: Vec<String> = config["rootfs"]["diff_ids"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    if diff_ids.len() != layer_files.len() {
        return Err(VmmError::Image(format!(
            "the config lists {} diff_ids for {} layers",
            diff_ids.len(),
            layer_files.len()
        )));
    }
    let mut layers = Vec::new();
    for (file, diff_id) in layer_files.iter().zip(&diff_ids) {
        let f =
            fs::File::open(file).map_err(VmmError::io(format!("opening {}", file.display())))?;
        let mut reader =
            super::archive_policy::sniff_gzip(f).map_err(VmmError::io("reading a layer"))?;
        let mut w = blobs.writer()?;
        std::io::copy(&mut reader, &mut w).map_err(VmmError::io("storing a layer"))?;
        let (digest, size) = w.commit()?;
        let expected = image_digest(diff_id)?;
        if digest != expected {
            return Err(VmmError::DigestMismatch {
                expected: expected.to_string(),
                actual: digest.to_string(),
            });
        }
        layers.push(LayerRef { digest, size });
    }
    let c = &config["config"];
    let env = c["Env"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|v| {
            v.as_str()?
                .split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect();
    let manifest = ImageManifest {
        name: name.to_string(),
        layers,
        config: ImageConfig {
            env,
            user: c["User"]
                .as_str()
                .filter(|s| !s.is_empty())
                .map(str::to_string),
            workdir: c["WorkingDir"]
                .as_str()
                .filter(|s| !s.is_empty())
                .map(str::to_string),
        },
        license_notice: None,
        source: format!("imported from {}", path.display()),
    };
    ImageCatalog::open(data_dir)?.put(&manifest)?;
    Ok(manifest)
}

/// A digest as an imported image spells it: `sha256:<hex>` as OCI says, or the bare hex some
/// exporters write.
fn image_digest(text: &str) -> Result<Digest> {
    Digest::from_hex(text.strip_prefix("sha256:").unwrap_or(text))
        .map_err(|_| VmmError::InvalidDigest(text.to_owned()))
}

fn check_file_digest(path: &Path, digest: &str) -> Result<()> {
    let expected = image_digest(digest)?;
    let mut f =
        fs::File::open(path).map_err(VmmError::io(format!("opening {}", path.display())))?;
    let mut buf = Vec::new();
    f.read_to_end(&mut buf)
        .map_err(VmmError::io("reading a blob"))?;
    let actual = Digest::of(&buf);
    if actual != expected {
        return Err(VmmError::DigestMismatch {
            expected: expected.to_string(),
            actual: actual.to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn how_to_get_names_the_command_that_makes_the_image() {
        assert!(how_to_get(E2B_BASE).contains("`strata image build-base`"));
        assert!(how_to_get(DEBIAN).contains("`strata image build-base`"));
        assert!(how_to_get(BUSYBOX).contains("`strata image build-base --busybox-only`"));
        assert!(how_to_get("acme/app:1").contains("`strata image import"));
        assert!(how_to_get("acme/app:1").contains("--name acme/app:1`"));
    }

    fn entry(name: &str) -> ImageManifest {
        ImageManifest {
            name: name.into(),
            layers: vec![],
            config: ImageConfig::default(),
            license_notice: None,
            source: "test".into(),
        }
    }

    #[test]
    fn catalog_names_match_every_docker_spelling_of_them() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = ImageCatalog::open(dir.path()).unwrap();
        catalog.put(&entry(E2B_BASE)).unwrap();
        catalog.put(&entry(DEBIAN)).unwrap();
        for (asked, found) in [
            ("e2bdev/base", E2B_BASE),
            ("e2bdev/base:latest", E2B_BASE),
            ("docker.io/e2bdev/base", E2B_BASE),
            ("debian:bookworm", DEBIAN),
            ("docker.io/library/debian:bookworm", DEBIAN),
            ("library/debian:bookworm", DEBIAN),
        ] {
            assert_eq!(catalog.get(asked).unwrap().name, found, "{asked}");
        }
        for absent in [
            "debian",
            "debian:stable",
            "ghcr.io/e2bdev/base",
            "Not A Reference",
            &format!("e2bdev/base@sha256:{}", "a".repeat(64)),
        ] {
            assert!(
                matches!(catalog.get(absent), Err(VmmError::ImageNotFound(_))),
                "{absent}"
            );
        }
    }
}
