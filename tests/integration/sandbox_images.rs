//! Images: import of `docker save` archives and OCI layouts (verified by digest), and the
//! Debian-based E2B base with its default user.

use crate::common;

use std::io::Write;

use common::sandbox::*;
use strata::domain::ids::Digest;
use strata::vmm::image::{self, ImageCatalog};
use strata::vmm::{BlobStore, ExecRequest, SandboxBackend, VmmError};

/// A `docker save`-style archive holding the busybox layer plus a small second layer.
fn docker_save(dir: &std::path::Path, layers: &[Vec<u8>], tamper: bool) -> std::path::PathBuf {
    let diff_ids: Vec<String> = layers.iter().map(|l| Digest::of(l).to_string()).collect();
    let config = serde_json::json!({
        "config": {"Env": ["PATH=/bin:/usr/bin", "GREETING=hello"], "WorkingDir": "/srv", "User": ""},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    });
    let path = dir.join(if tamper { "tampered.tar" } else { "image.tar" });
    let mut b = tar::Builder::new(std::fs::File::create(&path).unwrap());
    let mut add = |name: &str, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, name, data).unwrap();
    };
    let mut names = Vec::new();
    for (i, l) in layers.iter().enumerate() {
        let mut data = l.clone();
        if tamper && i == 1 {
            data[600] ^= 1;
        }
        add(&format!("layer{i}/layer.tar"), &data);
        names.push(format!("layer{i}/layer.tar"));
    }
    add("config.json", config.to_string().as_bytes());
    add(
        "manifest.json",
        serde_json::json!([{"Config": "config.json", "RepoTags": ["test:latest"], "Layers": names}]).to_string().as_bytes(),
    );
    b.finish().unwrap();
    path
}

#[tokio::test]
async fn a_docker_save_archive_imports_verified_and_boots() {
    let backend = backend();
    let base = busybox(&backend).await;
    let blobs = backend.blobs();
    let mut base_tar = Vec::new();
    let mut r = blobs.open_verified(&base[0]).unwrap();
    std::io::Read::read_to_end(&mut r, &mut base_tar).unwrap();
    let extra = {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("srv")).unwrap();
        std::fs::write(d.path().join("srv/imported"), "imported layer\n").unwrap();
        let mut v = Vec::new();
        strata::vmm::layer::write_layer_tar(
            d.path(),
            strata::vmm::id_range::Owners::AsSandbox,
            &mut v,
        )
        .unwrap();
        v
    };
    // gzip the second layer, as registries do.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&extra).unwrap();
    let work = tempfile::tempdir().unwrap();
    let name = format!("test/import-{}", uuid::Uuid::new_v4().simple());

    let tampered = docker_save(work.path(), &[base_tar.clone(), extra.clone()], true);
    let err = image::import(&tampered, &name, &node_dir(), blobs.as_ref()).unwrap_err();
    assert!(matches!(err, VmmError::DigestMismatch { .. }), "{err}");
    assert!(ImageCatalog::open(&node_dir()).unwrap().get(&name).is_err());

    let good = docker_save(work.path(), &[base_tar, gz.finish().unwrap()], false);
    // The config's diff_ids name the uncompressed layers.
    let good = {
        let dir = tempfile::tempdir_in(work.path()).unwrap().keep();
        tar::Archive::new(std::fs::File::open(&good).unwrap())
            .unpack(&dir)
            .unwrap();
        let cfg: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        let mut cfg = cfg;
        cfg["rootfs"]["diff_ids"][1] = serde_json::Value::String(Digest::of(&extra).to_string());
        std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
        dir
    };
    let m = image::import(&good, &name, &node_dir(), blobs.as_ref()).unwrap();
    assert_eq!(m.layers.len(), 2);
    assert_eq!(m.config.workdir.as_deref(), Some("/srv"));
    let listed = ImageCatalog::open(&node_dir()).unwrap().list().unwrap();
    assert!(listed.iter().any(|i| i.name == name));

    let mut s = spec(m.digests());
    s.context.env = m.config.env.clone();
    s.context.workdir = m.config.workdir.clone();
    let mut sb = boot(&backend, s).await;
    assert_eq!(
        sh(&mut sb, "cat imported; echo $GREETING").await,
        "imported layer\nhello\n"
    );
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn the_e2b_base_creates_the_default_user_with_useradd_and_sudo() {
    if std::process::Command::new("debootstrap")
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(
            std::env::var_os("CI").is_none(),
            "debootstrap is missing in CI: scripts/setup.sh installs it and builds the Debian base"
        );
        eprintln!("SKIPPED: debootstrap is not installed; run scripts/setup.sh");
        return;
    }
    let backend = backend();
    let blobs = backend.blobs();
    let dir = node_dir();
    let b = blobs.clone();
    let d = dir.clone();
    tokio::task::spawn_blocking(move || {
        // The machine's own mirror (apt's sources), as `strata image build-base` uses.
        image::ensure_debian(&d, b.as_ref(), None)
    })
    .await
    .unwrap()
    .expect("the Debian base");
    let m = image::ensure_e2b_base(&dir, &backend, blobs.as_ref() as &dyn BlobStore)
        .await
        .expect("e2bdev/base");
    let mut s = spec(m.digests());
    s.context.env = m.config.env.clone();
    let mut sb = backend.boot(s).await.unwrap();
    let id = sb.id().to_string();
    sb.ensure_user("user", true).await.unwrap();
    let out = exec(
        &mut sb,
        ExecRequest::shell("id -un; echo $HOME; getent passwd user | cut -d: -f7; sudo -n id -u")
            .user("user"),
    )
    .await;
    assert_eq!(
        out.stdout, "user\n/home/user\n/bin/bash\n0\n",
        "{:?} {}",
        out.outcome, out.stderr
    );
    // The user survives a checkpoint.
    sb.checkpoint().await.unwrap();
    assert_eq!(
        sh(&mut sb, "id -u user; stat -c %U /home/user").await,
        "1000\nuser\n"
    );
    sb.destroy().await.unwrap();
    assert_no_trace(&id);
}

/// The Debian base is built from the mirror this machine's apt uses, named nowhere in strata:
/// what `strata image build-base` would pick here is what the node's base image's own apt
/// sources name (scripts/setup.sh built it that way).
#[test]
fn the_debian_base_comes_from_the_mirror_the_machines_apt_uses() {
    let mirror = strata::host_apt::debian_mirror(image::DEBIAN_RELEASE)
        .expect("this machine's apt sources name a Debian mirror");
    let catalog = ImageCatalog::open(&node_dir()).unwrap();
    let debian = catalog
        .get(image::DEBIAN)
        .expect("debian:bookworm in the test node (scripts/setup.sh builds it)");
    let sources = debian
        .digests()
        .iter()
        .map(|d| {
            node_dir()
                .join("layers")
                .join(d.hex())
                .join("etc/apt/sources.list")
        })
        .find(|p| p.is_file())
        .expect("the Debian base has an apt sources.list");
    let written = std::fs::read_to_string(&sources).unwrap();
    assert_eq!(
        written.trim(),
        format!("deb {mirror} {} main", image::DEBIAN_RELEASE),
        "{}",
        sources.display()
    );
}
