//! Checkpoint fidelity: after every step, a fresh sandbox booted on the checkpoint's stack has
//! exactly the live sandbox's filesystem.

use crate::common;

use common::sandbox::*;
use strata::vmm::{CopyRequest, Sandbox};

/// A gzip COPY context like the SDK's: `ctx/` with a nested tree, a symlink and an executable.
fn context_archive(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("context.tar.gz");
    let gz = flate2::write::GzEncoder::new(
        std::fs::File::create(&path).unwrap(),
        flate2::Compression::best(),
    );
    let mut b = tar::Builder::new(gz);
    let mut add = |name: &str, kind: tar::EntryType, mode: u32, data: &[u8], link: Option<&str>| {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(data.len() as u64);
        h.set_mtime(1_700_000_000);
        match link {
            Some(l) => b.append_link(&mut h, name, l).unwrap(),
            None => b.append_data(&mut h, name, data).unwrap(),
        }
    };
    add("ctx", tar::EntryType::Directory, 0o755, b"", None);
    add("ctx/bin", tar::EntryType::Directory, 0o755, b"", None);
    add(
        "ctx/bin/run.sh",
        tar::EntryType::Regular,
        0o755,
        b"#!/bin/sh\necho run\n",
        None,
    );
    add(
        "ctx/config.txt",
        tar::EntryType::Regular,
        0o644,
        b"key=value\n",
        None,
    );
    add(
        "ctx/link.txt",
        tar::EntryType::Symlink,
        0o777,
        b"",
        Some("config.txt"),
    );
    add(
        "ctx/nested/deep/data.txt",
        tar::EntryType::Regular,
        0o600,
        b"deep\n",
        None,
    );
    add(
        "single.txt",
        tar::EntryType::Regular,
        0o644,
        b"single\n",
        None,
    );
    b.into_inner().unwrap().finish().unwrap();
    path
}

async fn checkpoint_and_compare(
    backend: &strata::vmm::NamespaceBackend,
    sb: &mut Box<dyn Sandbox>,
    step: &str,
) {
    let live = manifest(sb).await;
    let layer = sb.checkpoint().await.expect("checkpoint").expect("a layer");
    assert!(layer.size > 0);
    let mut fresh = boot(backend, spec(sb.layers().to_vec())).await;
    let restored = manifest(&mut fresh).await;
    let fresh_id = fresh.id().to_string();
    fresh.destroy().await.unwrap();
    assert_no_trace(&fresh_id);
    if live != restored {
        let l: Vec<&str> = live.lines().collect();
        let r: Vec<&str> = restored.lines().collect();
        let only_live: Vec<_> = l.iter().filter(|x| !r.contains(x)).collect();
        let only_restored: Vec<_> = r.iter().filter(|x| !l.contains(x)).collect();
        panic!("after {step}: live and restored differ\nonly live: {only_live:#?}\nonly restored: {only_restored:#?}");
    }
    // The live sandbox continues on the checkpoint with the same filesystem.
    assert_eq!(
        manifest(sb).await,
        live,
        "after {step}: the sandbox changed across its own checkpoint"
    );
}

#[tokio::test]
async fn every_checkpoint_restores_the_live_filesystem() {
    let backend = backend();
    let base = busybox(&backend).await;
    let tmp = tempfile::tempdir().unwrap();
    let archive = context_archive(tmp.path());
    let mut sb = boot(&backend, spec(base.clone())).await;
    let id = sb.id().to_string();

    // RUN: files, a directory tree, a symlink, a hardlink, owners and modes.
    sh(
        &mut sb,
        "mkdir -p /app/dir/sub /app/gone && echo a > /app/a.txt && echo x > /app/gone/x \
        && echo s > /app/dir/sub/s && ln -s a.txt /app/link && ln /app/a.txt /app/hard \
        && chmod 640 /app/a.txt && chown 65534:65534 /app/hard && echo t > /tmp/persisted",
    )
    .await;
    checkpoint_and_compare(&backend, &mut sb, "RUN create").await;

    // COPY: a directory's contents merged into dest, and a single file with owner and mode.
    sb.copy_in(&archive, CopyRequest::new("ctx", "/srv"))
        .await
        .expect("COPY ctx");
    let mut req = CopyRequest::new("single.txt", "/srv/files/");
    req.owner = Some("65534:65534".into());
    req.mode = Some("0600".into());
    sb.copy_in(&archive, req).await.expect("COPY single");
    assert_eq!(
        sh(
            &mut sb,
            "cat /srv/config.txt /srv/link.txt /srv/files/single.txt"
        )
        .await,
        "key=value\nkey=value\nsingle\n"
    );
    assert_eq!(
        sh(
            &mut sb,
            "stat -c '%a %u' /srv/files/single.txt /srv/bin/run.sh"
        )
        .await,
        "600 65534\n755 0\n"
    );
    checkpoint_and_compare(&backend, &mut sb, "COPY").await;

    // WORKDIR: created with mkdir -p, then the context carries it.
    sh(&mut sb, "mkdir -p /work/deep").await;
    sb.context_mut().workdir = Some("/work/deep".into());
    assert_eq!(sh(&mut sb, "pwd").await, "/work/deep\n");
    checkpoint_and_compare(&backend, &mut sb, "WORKDIR").await;

    // RUN: deletions, of this build's files and of the base's.
    sh(
        &mut sb,
        "rm /app/a.txt /bin/vi && rm -rf /app/gone /usr/share",
    )
    .await;
    checkpoint_and_compare(&backend, &mut sb, "RUN delete").await;

    // RUN: a directory replaced by a file, a base directory replaced by another directory, a
    // symlink replaced by a directory.
    sh(
        &mut sb,
        "rm -rf /app/dir && echo now-a-file > /app/dir \
        && rm -rf /usr/sbin && mkdir /usr/sbin && echo only > /usr/sbin/only \
        && rm /app/link && mkdir /app/link && echo in > /app/link/inside",
    )
    .await;
    checkpoint_and_compare(&backend, &mut sb, "RUN replace").await;
    assert_eq!(
        sh(&mut sb, "ls /usr/sbin; test ! -e /bin/vi && echo vi-gone").await,
        "only\nvi-gone\n"
    );

    // The stack grew by one layer per checkpoint.
    assert_eq!(sb.layers().len(), base.len() + 5);
    sb.destroy().await.unwrap();
    assert_no_trace(&id);
}

/// A host crash can leave a checkpoint's blob torn under its digest name. Sealing the same
/// content again must replace it, not keep the torn file because the name exists.
#[tokio::test]
async fn a_checkpoint_of_the_same_content_repairs_a_torn_blob() {
    let backend = backend();
    let base = busybox(&backend).await;
    let nonce = uuid::Uuid::new_v4();
    // Fixed mtimes, so two sandboxes seal byte-identical layers.
    let write =
        format!("mkdir /torn && echo {nonce} > /torn/f && touch -t 202301010000 /torn/f /torn");
    let mut digest = None;
    for tear in ["first checkpoint", "truncated", "bit-flipped"] {
        if let Some(d) = &digest {
            let path = backend
                .blobs()
                .as_local()
                .expect("the local store")
                .path_of(d);
            let mut bytes = std::fs::read(&path).unwrap();
            match tear {
                "truncated" => bytes.truncate(bytes.len() / 2),
                _ => bytes[600] ^= 0x04,
            }
            std::fs::write(&path, bytes).unwrap();
            assert!(backend.blobs().verify(d).is_err(), "{tear}: torn");
        }
        let mut sb = boot(&backend, spec(base.clone())).await;
        sh(&mut sb, &write).await;
        let layer = sb.checkpoint().await.expect("checkpoint").expect("a layer");
        assert_eq!(
            sh(&mut sb, "cat /torn/f").await,
            format!("{nonce}\n"),
            "{tear}"
        );
        sb.destroy().await.unwrap();
        assert_eq!(*digest.get_or_insert(layer.digest), layer.digest);
        assert_eq!(
            backend.blobs().verify(&layer.digest).unwrap(),
            layer.size,
            "{tear}: the blob is whole again"
        );
    }
}

/// A step that changes nothing (`echo`, a WORKDIR that exists) seals no layer: the stack stays
/// as it was and the sandbox keeps running on it.
#[tokio::test]
async fn a_checkpoint_of_no_change_adds_no_layer() {
    let backend = backend();
    let base = busybox(&backend).await;
    let mut sb = boot(&backend, spec(base.clone())).await;
    let id = sb.id().to_string();
    assert_eq!(sh(&mut sb, "echo one").await, "one\n");
    assert_eq!(sb.checkpoint().await.expect("checkpoint"), None);
    assert_eq!(sh(&mut sb, "echo two").await, "two\n");
    assert_eq!(sb.checkpoint().await.expect("checkpoint"), None);
    assert_eq!(sb.layers(), base.as_slice());
    sh(&mut sb, "echo changed > /changed").await;
    let layer = sb.checkpoint().await.expect("checkpoint").expect("a layer");
    assert_eq!(sb.layers().last(), Some(&layer.digest));
    assert_eq!(sh(&mut sb, "cat /changed").await, "changed\n");
    sb.destroy().await.unwrap();
    assert_no_trace(&id);
}

/// Two steps with byte-identical diffs give the same layer twice in one stack: it boots, and
/// the upper occurrence decides (a deletion between the two is undone by the second).
#[tokio::test]
async fn the_same_layer_twice_in_a_stack_boots() {
    let backend = backend();
    let base = busybox(&backend).await;
    let mut sb = boot(&backend, spec(base.clone())).await;
    let id = sb.id().to_string();
    let write = "printf x > /same && touch -d @1700000000 /same";
    sh(&mut sb, write).await;
    let first = sb.checkpoint().await.expect("checkpoint").expect("a layer");
    sh(&mut sb, "rm /same").await;
    sb.checkpoint().await.expect("checkpoint").expect("a layer");
    sh(&mut sb, write).await;
    let again = sb.checkpoint().await.expect("checkpoint").expect("a layer");
    assert_eq!(
        first.digest, again.digest,
        "identical diffs give one digest"
    );
    assert_eq!(sh(&mut sb, "cat /same").await, "x\n");
    let mut fresh = boot(&backend, spec(sb.layers().to_vec())).await;
    assert_eq!(sh(&mut fresh, "cat /same").await, "x\n");
    fresh.destroy().await.unwrap();
    sb.destroy().await.unwrap();
    assert_no_trace(&id);
}

/// Issue 46: sealing walked a layer's tree by recursion, a frame per directory level, on a
/// blocking thread's stack; a step that leaves a very deep tree (1,900 levels: with the test
/// node's data directory, its host paths stay under PATH_MAX) took the whole process down.
/// It seals like any other tree now, and booted again on the checkpoint the deepest file is
/// there.
#[tokio::test]
async fn a_tree_as_deep_as_paths_allow_seals_without_taking_the_node_down() {
    let backend = backend();
    let base = busybox(&backend).await;
    let mut sb = boot(&backend, spec(base)).await;
    sh(
        &mut sb,
        "cd /tmp && i=0; while [ $i -lt 1900 ]; do mkdir d && cd d; i=$((i+1)); done; echo deepest > f",
    )
    .await;
    let layer = sb.checkpoint().await.expect("sealing a deep tree");
    assert!(layer.is_some(), "the step's changes made no layer");
    // Read by relative steps: the whole path is longer than one system call takes.
    let depth = sh(
        &mut sb,
        "cd /tmp && n=0; while [ -d d ]; do cd d; n=$((n+1)); done; echo $n; cat f",
    )
    .await;
    assert_eq!(depth, "1900\ndeepest\n");
    sb.destroy().await.unwrap();
}
