//! The sandbox is a boundary against its own root (ADR 0021), seen from inside a busybox
//! sandbox and from the host: the user namespace's id map, the capability sets, the read-only
//! and masked kernel interfaces, the neutral cgroup and mount views, the device policy, and
//! the host owners of what root makes. Each probe is harmless to the host if the boundary is
//! missing (a sysctl is written back with the value it has; `sysrq-trigger` is only opened).
//! The same probes run through the stock SDK in `tests/e2e/test_sdk_boundary.py`.

use crate::common;

use common::sandbox::*;
use strata::vmm::id_range::IdRange;
use strata::vmm::namespace::confine::capability_mask;
use strata::vmm::{ExecRequest, Sandbox};

async fn refused(sb: &mut Box<dyn Sandbox>, what: &str, cmd: &str) -> String {
    let out = exec(sb, ExecRequest::shell(cmd)).await;
    assert!(
        !out.outcome.success(),
        "{what} must be refused, and `{cmd}` succeeded: {}",
        out.stdout
    );
    out.stderr
}

async fn refused_cmd(sb: &mut Box<dyn Sandbox>, cmd: &str) -> String {
    refused(sb, cmd, cmd).await
}

#[tokio::test]
async fn root_in_a_sandbox_is_nobody_on_the_host() {
    let backend = backend();
    let base = busybox(&backend).await;
    let mut sb = boot(&backend, spec(base)).await;
    let id = sb.id().to_string();
    let ids = IdRange::default();

    let map = sh(&mut sb, "cat /proc/self/uid_map /proc/self/gid_map").await;
    let words: Vec<&str> = map.split_whitespace().collect();
    let base_id = ids.base().to_string();
    assert_eq!(
        words,
        ["0", &base_id, "65536", "0", &base_id, "65536"],
        "{map}"
    );
    assert_eq!(sh(&mut sb, "id -u; id -g").await, "0\n0\n");

    // Root's files, setuid ones included, belong to the id range on the host.
    sh(
        &mut sb,
        "touch /made && cp /bin/busybox /suid && chmod 4755 /suid && mkdir /d",
    )
    .await;
    let upper = backend.sandbox_dir(&id).join("disk/upper-0");
    for name in ["made", "suid", "d"] {
        let m = std::fs::symlink_metadata(upper.join(name)).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!((m.uid(), m.gid()), (ids.base(), ids.base()), "{name}");
    }
    // On the host, the scratch disk holding that setuid file is mounted nosuid and nodev.
    let disk = backend.sandbox_dir(&id).join("disk");
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = mountinfo
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(disk.to_str().unwrap()))
        .unwrap_or_else(|| panic!("no mount at {}", disk.display()));
    let options: Vec<&str> = line.split(' ').nth(5).unwrap().split(',').collect();
    assert!(
        options.contains(&"nosuid") && options.contains(&"nodev"),
        "{line}"
    );
    // strata's own processes in the sandbox are not dumpable: root there cannot read them.
    let err = refused_cmd(&mut sb, "cat /proc/1/environ").await;
    assert!(err.contains("Permission denied"), "{err}");

    // Capabilities: root has exactly the sandbox set, a user none.
    let caps = sh(&mut sb, "grep -E '^Cap' /proc/self/status").await;
    let want = format!("{:016x}", capability_mask());
    let zero = "0000000000000000";
    for (set, value) in [
        ("CapInh", zero),
        ("CapPrm", &want),
        ("CapEff", &want),
        ("CapBnd", &want),
        ("CapAmb", zero),
    ] {
        assert!(
            caps.contains(&format!("{set}:\t{value}")),
            "{set} in {caps}"
        );
    }
    let mut as_user = ExecRequest::shell("grep -E '^Cap(Eff|Bnd)' /proc/self/status");
    as_user.user = Some("nobody".into());
    as_user.cwd = Some("/".into());
    let user_caps = exec(&mut sb, as_user).await.stdout;
    assert!(
        user_caps.contains(&format!("CapEff:\t{zero}")),
        "{user_caps}"
    );
    assert!(
        user_caps.contains(&format!("CapBnd:\t{want}")),
        "{user_caps}"
    );

    sb.destroy().await.unwrap();
    assert_no_trace(&id);
}

#[tokio::test]
async fn kernel_interfaces_namespaces_and_devices_are_out_of_reach() {
    let backend = backend();
    let base = busybox(&backend).await;
    let mut sb = boot(&backend, spec(base)).await;
    let id = sb.id().to_string();

    refused(
        &mut sb,
        "writing a sysctl",
        "cat /proc/sys/kernel/core_pattern > /proc/sys/kernel/core_pattern",
    )
    .await;
    refused(
        &mut sb,
        "opening sysrq-trigger",
        "exec 3>/proc/sysrq-trigger",
    )
    .await;
    refused(
        &mut sb,
        "remounting /proc/sys",
        "mount -o remount,rw /proc/sys",
    )
    .await;
    refused(&mut sb, "a tmpfs mount", "mount -t tmpfs none /mnt").await;
    refused(&mut sb, "unmounting a mask", "umount /proc/kcore").await;
    let err = refused(&mut sb, "a user namespace", "unshare -U true").await;
    assert!(err.contains("Operation not permitted"), "{err}");
    refused(&mut sb, "a device node", "mknod /mem c 1 1").await;
    refused(&mut sb, "setting the hostname", "hostname elsewhere").await;
    // Masked where this kernel has them: each reads as empty.
    let masked = sh(
        &mut sb,
        "for f in /proc/kcore /proc/keys /proc/timer_list /proc/sched_debug; do \
         [ -e $f ] && echo \"$f $(cat $f | wc -c)\"; done; true",
    )
    .await;
    assert!(masked.lines().all(|l| l.ends_with(" 0")), "{masked}");
    assert_eq!(sh(&mut sb, "ls /sys | wc -l").await.trim(), "0");

    // Nothing names the node or the sandbox.
    let cgroup = sh(&mut sb, "cat /proc/self/cgroup").await;
    assert!(cgroup.lines().all(|l| l.ends_with(":/")), "{cgroup}");
    let mountinfo = sh(&mut sb, "cat /proc/self/mountinfo").await;
    let node = node_dir().display().to_string();
    assert!(!mountinfo.contains(&node), "{mountinfo}");
    assert!(!mountinfo.contains(&id), "{mountinfo}");
    assert!(!mountinfo.contains("sbx-"), "{mountinfo}");

    // /dev holds what a build needs, and nothing of the host's.
    let dev = sh(&mut sb, "ls /dev").await;
    let mut names: Vec<&str> = dev.split_whitespace().collect();
    names.sort();
    assert_eq!(
        names,
        [
            "fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout",
            "tty", "urandom", "zero"
        ]
    );
    assert_eq!(sh(&mut sb, "head -c 3 /dev/zero | wc -c").await.trim(), "3");

    sb.destroy().await.unwrap();
    assert_no_trace(&id);
}

/// The host uid that owns the user namespace `link` (`user:[inode]`, as `/proc/self/ns/user`
/// reads inside the sandbox), found through a host process in it.
fn owner_of_user_namespace(link: &str) -> u32 {
    use std::os::fd::AsRawFd;
    let pid = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .find(|e| {
            std::fs::read_link(e.path().join("ns/user")).is_ok_and(|l| l.to_str() == Some(link))
        })
        .unwrap_or_else(|| panic!("no host process is in {link}"));
    let ns = std::fs::File::open(pid.path().join("ns/user")).unwrap();
    let mut uid: libc::uid_t = u32::MAX;
    // NS_GET_OWNER_UID, `_IO(0xb7, 0x4)` in <linux/nsfs.h>.
    // SAFETY: the ioctl writes one uid_t into `uid`.
    let r = unsafe { libc::ioctl(ns.as_raw_fd(), 0xb704, &mut uid as *mut libc::uid_t) };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    uid
}

/// Each sandbox has a user namespace of its own, owned by a host uid of its own above the id
/// range, so what the kernel counts per owner (inotify instances and watches, processes) is
/// each sandbox's own, not host root's pool (ADR 0034). The stock SDK's view of the same is
/// `tests/e2e/test_sdk_kernel_counters.py`.
#[tokio::test]
async fn each_sandbox_has_a_user_namespace_of_its_own_owned_by_nobody_else() {
    let backend = backend();
    let base = busybox(&backend).await;
    let mut a = boot(&backend, spec(base.clone())).await;
    let mut b = boot(&backend, spec(base)).await;
    let link = |s: String| s.trim().to_string();
    let ns_a = link(sh(&mut a, "readlink /proc/self/ns/user").await);
    let ns_b = link(sh(&mut b, "readlink /proc/self/ns/user").await);
    assert_ne!(ns_a, ns_b, "two sandboxes share a user namespace");
    let host = std::fs::read_link("/proc/self/ns/user").unwrap();
    assert_ne!(Some(ns_a.as_str()), host.to_str());

    let ids = IdRange::default();
    let owners = ids.first_owner()..ids.first_owner() + 65536;
    let (owner_a, owner_b) = (
        owner_of_user_namespace(&ns_a),
        owner_of_user_namespace(&ns_b),
    );
    assert!(
        owners.contains(&owner_a) && owners.contains(&owner_b),
        "{owner_a} {owner_b}"
    );
    assert_ne!(owner_a, owner_b);

    // A checkpoint's new sandbox-init joins the same namespace.
    sh(&mut a, "echo x > /step").await;
    a.checkpoint().await.unwrap();
    assert_eq!(link(sh(&mut a, "readlink /proc/self/ns/user").await), ns_a);
    // The map is the same range in every sandbox: the layer trees hold one set of host ids.
    assert_eq!(
        sh(&mut a, "cat /proc/self/uid_map").await,
        sh(&mut b, "cat /proc/self/uid_map").await
    );
    a.destroy().await.unwrap();
    b.destroy().await.unwrap();
}

#[tokio::test]
async fn the_view_from_inside_is_the_same_after_a_checkpoint() {
    let backend = backend();
    let base = busybox(&backend).await;
    let mut sb = boot(&backend, spec(base)).await;
    let before = sh(&mut sb, "cat /proc/self/cgroup; echo x > /step").await;
    let first = sb.checkpoint().await.unwrap();
    assert!(first.is_some());
    let after = sh(&mut sb, "cat /proc/self/cgroup").await;
    assert_eq!(before, after);
    let mountinfo = sh(&mut sb, "cat /proc/self/mountinfo").await;
    assert!(
        !mountinfo.contains(&node_dir().display().to_string()),
        "{mountinfo}"
    );
    sb.destroy().await.unwrap();
}

/// Layers keep their in-sandbox owners: a checkpoint of what a step made is byte for byte the
/// layer of the same tree made on the host with those owners, as before ids were mapped.
#[tokio::test]
async fn a_checkpoint_records_in_sandbox_owners_so_digests_do_not_change() {
    let backend = backend();
    let base = busybox(&backend).await;
    let mut sb = boot(&backend, spec(base)).await;
    sh(
        &mut sb,
        "mkdir -p /app/data && echo hi > /app/data/f && chown 1000:1000 /app/data/f \
         && chmod 4755 /app/data/f && chown 0:5 /app/data \
         && touch -d @1700000000 /app/data/f /app/data /app",
    )
    .await;
    let sealed = sb.checkpoint().await.unwrap().expect("a layer");
    sb.destroy().await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let app = dir.path().join("app");
    std::fs::create_dir_all(app.join("data")).unwrap();
    std::fs::write(app.join("data/f"), "hi\n").unwrap();
    std::os::unix::fs::lchown(app.join("data/f"), Some(1000), Some(1000)).unwrap();
    std::os::unix::fs::lchown(app.join("data"), Some(0), Some(5)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(app.join("data/f"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    for p in [app.join("data/f"), app.join("data"), app.clone()] {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        std::fs::File::open(&p).unwrap().set_modified(t).unwrap();
    }
    let blobs = backend.blobs();
    let expected = strata::vmm::layer::seal_dir(
        dir.path(),
        blobs.as_ref(),
        strata::vmm::id_range::Owners::AsSandbox,
    )
    .unwrap();
    assert_eq!(sealed.digest, expected.digest);
}
