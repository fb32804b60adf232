//! Disk limits (ADR 0023): a sandbox writes to its own filesystem of `STRATA_BUILD_DISK_MAX`
//! bytes, so a step that writes without end fills that and not the node's disk; its layers
//! count against the same limit; a node keeps its reserve; destroy leaves no mount, image or
//! loop device.

use crate::common;

use std::os::unix::fs::MetadataExt;

use common::sandbox::*;
use strata::vmm::namespace::scratch::DiskConfig;
use strata::vmm::{ExecRequest, SandboxBackend};

const LIMIT: u64 = 64 << 20;

fn limited() -> DiskConfig {
    DiskConfig {
        max: Some(LIMIT),
        reserve: DiskConfig::DEFAULT_RESERVE,
    }
}

/// Bytes the sandbox's scratch image holds on the node's disk.
fn image_bytes(id: &str) -> u64 {
    let image = node_dir().join("sandboxes").join(id).join("disk.img");
    std::fs::metadata(&image)
        .unwrap_or_else(|e| panic!("{}: {e}", image.display()))
        .blocks()
        * 512
}

#[tokio::test]
async fn a_step_that_writes_without_end_fills_its_own_disk_and_says_so() {
    let backend = backend_with_disk(limited());
    let mut sb = boot(&backend, spec(busybox(&backend).await)).await;
    let id = sb.id().to_string();
    assert_eq!(sb.disk_note(), None, "a fresh sandbox has room");

    let out = exec(
        &mut sb,
        ExecRequest::shell("dd if=/dev/zero of=/fill bs=1M count=1000"),
    )
    .await;
    assert!(!out.outcome.success(), "dd wrote 1000 MiB into 64");
    assert!(
        out.stderr.contains("No space left on device"),
        "{}",
        out.stderr
    );
    let note = sb
        .disk_note()
        .expect("a full disk is said beside the failure");
    assert!(
        note.contains("64.0 MiB") && note.contains("STRATA_BUILD_DISK_MAX"),
        "{note}"
    );
    // What the node's disk holds for it is bounded by the limit, whatever the step asked.
    let held = image_bytes(&id);
    assert!(
        held <= LIMIT,
        "the sandbox holds {held} bytes of the node's disk"
    );
    // The sandbox still works, and what it wrote up to the limit is there.
    let size: u64 = sh(&mut sb, "stat -c %s /fill")
        .await
        .trim()
        .parse()
        .unwrap();
    assert!(size > 32 << 20 && size <= LIMIT, "{size}");
    // Freeing space inside makes room again.
    sh(&mut sb, "rm /fill && echo ok > /after").await;
    assert_eq!(sb.disk_note(), None);

    sb.destroy().await.unwrap();
    assert_no_trace(&id);
}

#[tokio::test]
async fn a_builds_checkpointed_layers_count_against_its_limit() {
    let backend = backend_with_disk(limited());
    let mut sb = boot(&backend, spec(busybox(&backend).await)).await;
    let id = sb.id().to_string();
    sh(
        &mut sb,
        "dd if=/dev/zero of=/first bs=1M count=40 2>/dev/null",
    )
    .await;
    let layer = sb.checkpoint().await.unwrap().expect("a layer of 40 MiB");
    assert!(layer.size > 40 << 20);
    // The layer is in the node's cache and the stack; its bytes still count here.
    let out = exec(
        &mut sb,
        ExecRequest::shell("dd if=/dev/zero of=/second bs=1M count=40"),
    )
    .await;
    assert!(
        !out.outcome.success(),
        "two 40 MiB steps fit a 64 MiB build limit"
    );
    assert!(sb.disk_note().is_some());
    // The first step's file is intact (it is the checkpoint's).
    assert_eq!(sh(&mut sb, "stat -c %s /first").await.trim(), "41943040");
    sb.destroy().await.unwrap();
    assert_no_trace(&id);
}

#[tokio::test]
async fn a_node_boots_nothing_that_would_eat_into_its_reserve() {
    let backend = backend_with_disk(DiskConfig {
        max: Some(LIMIT),
        // More than any disk here has: nothing can be granted.
        reserve: 1 << 50,
    });
    let layers = busybox(&backend).await;
    let err = match backend.boot(spec(layers.clone())).await {
        Ok(_) => panic!("a sandbox booted into the node's reserve"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("STRATA_NODE_DISK_RESERVE") && err.contains("1024.0 TiB"),
        "{err}"
    );
    assert_eq!(
        traces_of(&backend),
        Vec::<String>::new(),
        "a refused boot leaves nothing"
    );

    // A build that asks for more free disk than the limit is refused with the limit named.
    let backend = backend_with_disk(limited());
    let mut s = spec(layers);
    s.limits.disk_min_free = Some(LIMIT * 2);
    let err = match backend.boot(s).await {
        Ok(_) => panic!("a sandbox booted with less free disk than its build asked for"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("minFreeDiskMb") && err.contains("64.0 MiB"),
        "{err}"
    );
    assert_eq!(traces_of(&backend), Vec::<String>::new());
}

#[tokio::test]
async fn a_destroyed_sandboxs_grant_is_free_at_once() {
    // The node lends one and a half disks: a sandbox that asks for a whole disk fits, two do
    // not. Each one writes, is destroyed, and the next is booted at once, while the destroyed
    // one's image is still being unlinked in the background: it must not count any more.
    const DISK: u64 = 4 << 30;
    let st = rustix::fs::statvfs(node_dir()).unwrap();
    let free = st.f_bavail * st.f_frsize;
    assert!(
        free > 2 * DISK,
        "this test needs {} GiB free on {}",
        (2 * DISK) >> 30,
        node_dir().display()
    );
    let backend = backend_with_disk(DiskConfig {
        max: Some(DISK),
        reserve: free - DISK - DISK / 2,
    });
    let layers = busybox(&backend).await;
    for round in 0..4 {
        let mut s = spec(layers.clone());
        s.limits.disk_min_free = Some(DISK);
        let mut sb = match backend.boot(s).await {
            Ok(sb) => sb,
            Err(e) => panic!("round {round}: {e}"),
        };
        sh(
            &mut sb,
            "dd if=/dev/zero of=/written bs=1M count=256 2>/dev/null; sync",
        )
        .await;
        sb.destroy().await.unwrap();
    }
}

/// What of `backend`'s sandboxes is on the host: directories and mounts (a fresh backend that
/// booted nothing has none).
fn traces_of(backend: &strata::vmm::NamespaceBackend) -> Vec<String> {
    let prefix = format!("sbx-{}-", backend.owner_id());
    let mut found: Vec<String> = std::fs::read_dir(node_dir().join("sandboxes"))
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(&prefix))
        .collect();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    found.extend(
        mounts
            .lines()
            .filter(|l| l.contains(&prefix))
            .map(str::to_owned),
    );
    found
}

/// The other way to fill a disk: files, not bytes. The node's inode table is not the tenant's
/// either.
#[tokio::test]
async fn a_step_that_makes_files_without_end_runs_out_of_its_own_inodes() {
    let backend = backend_with_disk(limited());
    let mut sb = boot(&backend, spec(busybox(&backend).await)).await;
    let id = sb.id().to_string();
    let out = exec(
        &mut sb,
        ExecRequest::shell("mkdir /many && cd /many && seq 1 100000 | xargs touch"),
    )
    .await;
    assert!(
        !out.outcome.success(),
        "100000 files fit a 64 MiB disk's inodes"
    );
    assert!(
        out.stderr.contains("No space left on device"),
        "{}",
        out.stderr
    );
    assert!(
        sb.disk_note().is_some(),
        "a disk out of inodes is said to be full"
    );
    let made: u64 = sh(&mut sb, "ls /many | wc -l")
        .await
        .trim()
        .parse()
        .unwrap();
    assert!(made > 1000 && made < 100000, "{made} files made");
    sb.destroy().await.unwrap();
    assert_no_trace(&id);
}
