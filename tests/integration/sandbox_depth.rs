//! Layer stack depth: 100 layers boot, a stack over the budget is refused before anything is
//! mounted, and compaction keeps the filesystem identical.

use crate::common;

use common::sandbox::*;
use strata::domain::ids::Digest;
use strata::vmm::compact::compact;
use strata::vmm::depth::DepthBudget;
use strata::vmm::{layer, BlobStore, NamespaceBackend, NamespaceConfig, SandboxBackend, VmmError};

/// A layer from a closure that fills an overlay-format directory.
fn make_layer(backend: &NamespaceBackend, fill: impl FnOnce(&std::path::Path)) -> Digest {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path());
    layer::seal_dir(
        dir.path(),
        backend.blobs().as_ref() as &dyn BlobStore,
        strata::vmm::id_range::Owners::AsSandbox,
    )
    .unwrap()
    .digest
}

fn whiteout(path: &std::path::Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::empty(),
        rustix::fs::makedev(0, 0),
    )
    .unwrap();
}

#[tokio::test]
async fn a_hundred_layers_boot_and_an_over_budget_stack_is_refused() {
    let backend = backend();
    let mut stack = busybox(&backend).await;
    for i in 0..99 {
        stack.push(make_layer(&backend, |d| {
            std::fs::create_dir(d.join("layers")).unwrap();
            std::fs::write(d.join(format!("layers/{i}")), format!("{i}\n")).unwrap();
            // Every layer also overwrites one shared file: the topmost must win.
            std::fs::write(d.join("layers-top"), format!("{i}\n")).unwrap();
        }));
    }
    assert_eq!(stack.len(), 100);
    let mut sb = boot(&backend, spec(stack.clone())).await;
    assert_eq!(
        sh(
            &mut sb,
            "ls /layers | wc -l; cat /layers/0 /layers/98 /layers-top"
        )
        .await,
        "99\n0\n98\n98\n"
    );
    let id = sb.id().to_string();
    sb.destroy().await.unwrap();
    assert_no_trace(&id);

    // 501 lowers: refused with a clear error, before any mount.
    let too_deep: Vec<Digest> = std::iter::repeat_n(stack[0], 501).collect();
    let err = backend.boot(spec(too_deep)).await.err().expect("refused");
    assert!(
        matches!(
            err,
            VmmError::StackTooDeep {
                depth: 501,
                budget: 500,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("compact"), "{err}");

    // A budget with a reserve for the build's checkpoints refuses earlier.
    let reserved = NamespaceBackend::new(NamespaceConfig {
        data_dir: node_dir(),
        agent_binary: common::strata_bin(),
        depth: DepthBudget {
            overlay_max: 500,
            reserved: 450,
        },
        ids: Default::default(),
        network: Default::default(),
        disk: Default::default(),
    })
    .unwrap();
    let err = reserved
        .boot(spec(stack.clone()))
        .await
        .err()
        .expect("refused");
    assert!(
        matches!(
            err,
            VmmError::StackTooDeep {
                depth: 100,
                budget: 50,
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn compaction_keeps_the_filesystem_identical() {
    let backend = backend();
    let base = busybox(&backend).await;
    let mut stack = base.clone();
    // Layers with additions, overwrites, deletions of base files, deletions of files added
    // inside the run, an opaque directory, and type changes.
    stack.push(make_layer(&backend, |d| {
        std::fs::create_dir_all(d.join("app/keep")).unwrap();
        std::fs::create_dir_all(d.join("app/later-opaque")).unwrap();
        std::fs::write(d.join("app/keep/a"), "a1").unwrap();
        std::fs::write(d.join("app/later-opaque/old"), "old").unwrap();
        std::fs::write(d.join("app/becomes-dir"), "file").unwrap();
        std::os::unix::fs::symlink("keep/a", d.join("app/link")).unwrap();
    }));
    stack.push(make_layer(&backend, |d| {
        std::fs::create_dir_all(d.join("app/keep")).unwrap();
        std::fs::create_dir_all(d.join("bin")).unwrap();
        std::fs::write(d.join("app/keep/a"), "a2").unwrap();
        whiteout(&d.join("bin/vi"));
        whiteout(&d.join("app/link"));
        std::fs::create_dir_all(d.join("app/becomes-dir")).unwrap();
        std::fs::write(d.join("app/becomes-dir/inside"), "in").unwrap();
    }));
    stack.push(make_layer(&backend, |d| {
        std::fs::create_dir_all(d.join("app/later-opaque")).unwrap();
        rustix::fs::setxattr(
            d.join("app/later-opaque"),
            "trusted.overlay.opaque",
            b"y",
            rustix::fs::XattrFlags::empty(),
        )
        .unwrap();
        std::fs::write(d.join("app/later-opaque/new"), "new").unwrap();
        std::fs::create_dir_all(d.join("usr")).unwrap();
        // A base directory replaced wholesale.
        std::fs::create_dir_all(d.join("usr/sbin")).unwrap();
        rustix::fs::setxattr(
            d.join("usr/sbin"),
            "trusted.overlay.opaque",
            b"y",
            rustix::fs::XattrFlags::empty(),
        )
        .unwrap();
        std::fs::write(d.join("usr/sbin/only"), "only").unwrap();
        std::fs::write(d.join("app/link"), "link is a file again").unwrap();
    }));
    stack.push(make_layer(&backend, |d| {
        std::fs::write(d.join("top"), "top").unwrap();
    }));

    let mut sb = boot(&backend, spec(stack.clone())).await;
    let before = manifest(&mut sb).await;
    assert!(before.contains("/app/later-opaque/new") && !before.contains("/app/later-opaque/old"));
    assert!(!before.contains("/bin/vi|"));
    sb.destroy().await.unwrap();

    let blobs = backend.blobs();
    let (compacted, layer) =
        compact(blobs.as_ref(), backend.layers(), &stack, 1..4, &node_dir()).unwrap();
    assert_eq!(compacted.len(), stack.len() - 2);
    assert_eq!(compacted[1], layer.digest);
    let mut sb = boot(&backend, spec(compacted.clone())).await;
    let after = manifest(&mut sb).await;
    sb.destroy().await.unwrap();
    assert_eq!(before, after, "compaction changed the filesystem");

    // Flattening the whole stack, base included, gives the same tree too.
    let (flat, _) = compact(
        blobs.as_ref(),
        backend.layers(),
        &stack,
        0..stack.len(),
        &node_dir(),
    )
    .unwrap();
    assert_eq!(flat.len(), 1);
    let mut sb = boot(&backend, spec(flat)).await;
    assert_eq!(manifest(&mut sb).await, before);
    sb.destroy().await.unwrap();

    let err = compact(blobs.as_ref(), backend.layers(), &stack, 3..9, &node_dir()).unwrap_err();
    assert!(matches!(err, VmmError::BadRange { .. }));
}
