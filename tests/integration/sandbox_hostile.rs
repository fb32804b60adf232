//! Hostile COPY archives: each kind of entry is rejected or neutralised as
//! `vmm::archive_policy` says, inside the sandbox, and nothing outside the sandbox changes.

use crate::common;

use std::path::{Path, PathBuf};

use common::sandbox::*;
use strata::vmm::archive_policy::ArchivePolicy;
use strata::vmm::{CopyRequest, Sandbox, VmmError};

/// Writes one entry with a raw name and link name, bypassing the tar crate's own checks, the
/// way a hostile client would.
fn raw(
    b: &mut tar::Builder<std::fs::File>,
    kind: tar::EntryType,
    name: &str,
    link: &str,
    mode: u32,
    data: &[u8],
) {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(data.len() as u64);
    h.set_mode(mode);
    h.set_mtime(1_700_000_000);
    let gnu = h.as_gnu_mut().unwrap();
    gnu.name[..name.len()].copy_from_slice(name.as_bytes());
    gnu.linkname[..link.len()].copy_from_slice(link.as_bytes());
    // A well-formed sparse header: real size 0, no sparse map.
    gnu.realsize.copy_from_slice(b"00000000000\0");
    for s in gnu.sparse.iter_mut() {
        s.offset.copy_from_slice(b"00000000000\0");
        s.numbytes.copy_from_slice(b"00000000000\0");
    }
    h.set_cksum();
    b.append(&h, data).unwrap();
}

fn archive(
    dir: &Path,
    name: &str,
    build: impl FnOnce(&mut tar::Builder<std::fs::File>),
) -> PathBuf {
    let path = dir.join(name);
    let mut b = tar::Builder::new(std::fs::File::create(&path).unwrap());
    build(&mut b);
    b.finish().unwrap();
    path
}

async fn copy(
    sb: &mut Box<dyn Sandbox>,
    archive: &Path,
    src: &str,
    policy: ArchivePolicy,
) -> Result<(), VmmError> {
    let mut req = CopyRequest::new(src, "/dest");
    req.policy = policy;
    sb.copy_in(archive, req).await
}

fn host_tmp_entries(marker: &str) -> Vec<String> {
    std::fs::read_dir("/tmp")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(marker))
        .collect()
}

#[tokio::test]
async fn hostile_archives_are_rejected_or_neutralised_and_the_host_is_untouched() {
    let backend = backend();
    let base = busybox(&backend).await;
    let mut sb = boot(&backend, spec(base)).await;
    let id = sb.id().to_string();
    let work = tempfile::tempdir().unwrap();
    let marker = format!("strata-canary-{}", uuid::Uuid::new_v4().simple());
    // A host directory a symlink in an archive will point at; it must stay empty.
    let host_dir = PathBuf::from(format!("/tmp/{marker}-dir"));
    std::fs::create_dir(&host_dir).unwrap();
    let before = host_tmp_entries(&marker);

    // `..` and absolute names: rejected, naming the entry.
    let dotdot = format!("../../../../../../tmp/{marker}-dotdot");
    let a = archive(work.path(), "dotdot.tar", |b| {
        raw(b, tar::EntryType::Regular, &dotdot, "", 0o644, b"x")
    });
    let err = copy(&mut sb, &a, ".", ArchivePolicy::upload())
        .await
        .unwrap_err();
    assert!(err.to_string().contains(&dotdot), "{err}");
    let abs = format!("/tmp/{marker}-abs");
    let a = archive(work.path(), "abs.tar", |b| {
        raw(b, tar::EntryType::Regular, &abs, "", 0o644, b"x")
    });
    let err = copy(&mut sb, &a, ".", ArchivePolicy::upload())
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains(&abs) && err.to_string().contains("absolute"),
        "{err}"
    );

    // A symlink is stored as it is; writing through it is refused.
    let a = archive(work.path(), "through.tar", |b| {
        raw(b, tar::EntryType::Directory, "app", "", 0o755, b"");
        raw(
            b,
            tar::EntryType::Symlink,
            "app/out",
            host_dir.to_str().unwrap(),
            0o777,
            b"",
        );
        raw(
            b,
            tar::EntryType::Regular,
            "app/out/planted",
            "",
            0o644,
            b"x",
        );
    });
    let err = copy(&mut sb, &a, "app", ArchivePolicy::upload())
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("app/out/planted") && err.to_string().contains("symlink"),
        "{err}"
    );
    let a = archive(work.path(), "links.tar", |b| {
        raw(b, tar::EntryType::Directory, "app", "", 0o755, b"");
        raw(
            b,
            tar::EntryType::Symlink,
            "app/abs",
            "/etc/passwd",
            0o777,
            b"",
        );
        raw(
            b,
            tar::EntryType::Symlink,
            "app/up",
            "../../../../etc",
            0o777,
            b"",
        );
        raw(b, tar::EntryType::Regular, "app/file", "", 0o644, b"data");
        raw(b, tar::EntryType::Link, "app/hard", "app/file", 0o644, b"");
    });
    copy(&mut sb, &a, "app", ArchivePolicy::upload())
        .await
        .expect("links as stored are fine");
    assert_eq!(
        sh(
            &mut sb,
            "readlink /dest/abs; readlink /dest/up; cat /dest/hard; echo; stat -c %h /dest/file"
        )
        .await,
        "/etc/passwd\n../../../../etc\ndata\n2\n"
    );

    // Hardlinks out of the archive root: rejected.
    for target in ["../../../../etc/passwd", "/etc/passwd"] {
        let a = archive(work.path(), "hard.tar", |b| {
            raw(b, tar::EntryType::Link, "h", target, 0o644, b"")
        });
        let err = copy(&mut sb, &a, ".", ArchivePolicy::upload())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("outside"), "{err}");
    }

    // Devices, fifos and sparse files: rejected.
    for (kind, what) in [
        (tar::EntryType::Char, "character device"),
        (tar::EntryType::Block, "block device"),
        (tar::EntryType::Fifo, "fifo"),
        (tar::EntryType::GNUSparse, "sparse"),
    ] {
        let a = archive(work.path(), "dev.tar", |b| {
            raw(b, kind, "node", "", 0o666, b"")
        });
        let err = copy(&mut sb, &a, ".", ArchivePolicy::upload())
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains(what) && err.to_string().contains("node"),
            "{err}"
        );
    }

    // setuid, setgid and sticky bits: stripped.
    let a = archive(work.path(), "suid.tar", |b| {
        raw(
            b,
            tar::EntryType::Regular,
            "suid",
            "",
            0o6755,
            b"#!/bin/sh\n",
        );
        raw(b, tar::EntryType::Directory, "sticky", "", 0o1777, b"");
    });
    copy(&mut sb, &a, ".", ArchivePolicy::upload())
        .await
        .unwrap();
    assert_eq!(
        sh(&mut sb, "stat -c %a /dest/suid /dest/sticky").await,
        "755\n777\n"
    );

    // Size and count ceilings.
    let a = archive(work.path(), "big.tar", |b| {
        for i in 0..4 {
            raw(
                b,
                tar::EntryType::Regular,
                &format!("f{i}"),
                "",
                0o644,
                &vec![7u8; 4096],
            );
        }
    });
    let mut p = ArchivePolicy::upload();
    p.max_entry_bytes = 4095;
    assert!(copy(&mut sb, &a, ".", p)
        .await
        .unwrap_err()
        .to_string()
        .contains("per-entry limit"));
    let mut p = ArchivePolicy::upload();
    p.max_total_bytes = 3 * 4096;
    assert!(copy(&mut sb, &a, ".", p)
        .await
        .unwrap_err()
        .to_string()
        .contains("expands to more than"));
    let mut p = ArchivePolicy::upload();
    p.max_entries = 3;
    assert!(copy(&mut sb, &a, ".", p)
        .await
        .unwrap_err()
        .to_string()
        .contains("more than 3 entries"));

    // A gzip bomb is bounded by the total ceiling.
    let bomb = work.path().join("bomb.tar.gz");
    {
        let gz = flate2::write::GzEncoder::new(
            std::fs::File::create(&bomb).unwrap(),
            flate2::Compression::best(),
        );
        let mut b = tar::Builder::new(gz);
        let mut h = tar::Header::new_gnu();
        h.set_size(64 << 20);
        h.set_mode(0o644);
        b.append_data(&mut h, "zeros", std::io::repeat(0).take_n(64 << 20))
            .unwrap();
        b.into_inner().unwrap().finish().unwrap();
    }
    let mut p = ArchivePolicy::upload();
    p.max_total_bytes = 1 << 20;
    p.max_entry_bytes = 1 << 20;
    assert!(copy(&mut sb, &bomb, ".", p).await.is_err());

    // Nothing escaped: the host is as it was, and inside, no rejected entry was written.
    assert_eq!(host_tmp_entries(&marker), before);
    assert_eq!(std::fs::read_dir(&host_dir).unwrap().count(), 0);
    assert_eq!(
        sh(
            &mut sb,
            "ls -a /dest | sort | tr '\\n' ' '; ls / | grep -c strata-copy || true"
        )
        .await,
        ". .. abs file hard sticky suid up 0\n"
    );
    sb.destroy().await.unwrap();
    assert_no_trace(&id);
    std::fs::remove_dir(&host_dir).unwrap();
}

trait TakeN: std::io::Read + Sized {
    fn take_n(self, n: u64) -> std::io::Take<Self> {
        std::io::Read::take(self, n)
    }
}
impl<R: std::io::Read> TakeN for R {}
