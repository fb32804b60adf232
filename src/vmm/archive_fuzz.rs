//! The extractor's escape oracle: "an archive changes nothing outside its destination", for
//! any archive. Shared by the `extract_tar` fuzz target (`fuzz/fuzz_targets/extract_tar.rs`)
//! and the test that replays the fuzzer's corpus, so a finding stays a regression test.
//!
//! An input is not a tar but a small program that writes one ([`hostile_tar`]): every name and
//! link target is raw bytes written straight into the header, as a hostile archive holds them,
//! while the fuzzer never wastes its time on checksums and padding. The destination sits in a
//! tree with a sibling directory, a file beside it and one above; that tree (types, modes,
//! owners, contents, link targets, mtimes) is compared before and after the extraction. An
//! extraction may fail: only a change outside the destination is a finding.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::archive_policy::{extract_tar, ArchiveKind, ArchivePolicy};

/// At most this many entries per input, and this many bytes in a name, link or file.
const MAX_ENTRIES: usize = 32;
const MAX_NAME: usize = 100;
const MAX_DATA: usize = 8;

/// Decodes a fuzz input into the archive kind and the tar it writes.
///
/// Byte 0 picks the kind (even: a layer, odd: an upload). Each entry then reads: a type byte
/// (regular, directory, symlink, hardlink, character device, fifo), a name length and that
/// many name bytes, for links a target length and target bytes, and a content length and
/// content. A short input ends the archive where it runs out.
pub fn hostile_tar(data: &[u8]) -> (ArchiveKind, Vec<u8>) {
    let mut bytes = data.iter().copied();
    let kind = match bytes.next().unwrap_or(0) % 2 {
        0 => ArchiveKind::Layer,
        _ => ArchiveKind::Upload,
    };
    let mut take = |len: usize| -> Vec<u8> { bytes.by_ref().take(len).collect() };
    let mut builder = tar::Builder::new(Vec::new());
    for _ in 0..MAX_ENTRIES {
        let Some(selector) = take(1).first().copied() else {
            break;
        };
        let entry_type = match selector % 6 {
            0 => tar::EntryType::Regular,
            1 => tar::EntryType::Directory,
            2 => tar::EntryType::Symlink,
            3 => tar::EntryType::Link,
            4 => tar::EntryType::Char,
            _ => tar::EntryType::Fifo,
        };
        let name_len = take(1).first().map_or(0, |b| *b as usize % (MAX_NAME + 1));
        let name = take(name_len);
        let link = if matches!(entry_type, tar::EntryType::Symlink | tar::EntryType::Link) {
            let len = take(1).first().map_or(0, |b| *b as usize % (MAX_NAME + 1));
            take(len)
        } else {
            Vec::new()
        };
        let contents = if entry_type == tar::EntryType::Regular {
            let len = take(1).first().map_or(0, |b| *b as usize % (MAX_DATA + 1));
            take(len)
        } else {
            Vec::new()
        };
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(entry_type);
        header.set_size(contents.len() as u64);
        header.set_mode(if entry_type == tar::EntryType::Directory {
            0o755
        } else {
            0o644
        });
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        let gnu = header.as_gnu_mut().expect("a GNU header");
        gnu.name[..name.len()].copy_from_slice(&name);
        gnu.linkname[..link.len()].copy_from_slice(&link);
        header.set_cksum();
        builder
            .append(&header, &contents[..])
            .expect("writing to memory");
    }
    (kind, builder.into_inner().expect("writing to memory"))
}

/// Extracts the archive `data` decodes to and reports any change outside the destination.
pub fn check(data: &[u8]) -> Result<(), String> {
    let (kind, tar) = hostile_tar(data);
    let base = tempfile::tempdir().map_err(|e| format!("making a scratch directory: {e}"))?;
    let outer = base.path().join("outer");
    let dest = outer.join("dest");
    let setup = || -> std::io::Result<()> {
        std::fs::create_dir_all(outer.join("sibling/d"))?;
        std::fs::create_dir(&dest)?;
        std::fs::write(outer.join("sibling/a"), b"sibling file")?;
        std::fs::write(outer.join("sibling/d/b"), b"nested sibling file")?;
        std::os::unix::fs::symlink("a", outer.join("sibling/l"))?;
        std::fs::write(outer.join("beside"), b"beside the destination")?;
        std::fs::write(base.path().join("above"), b"above the destination")?;
        Ok(())
    };
    setup().map_err(|e| format!("setting up the tree around the destination: {e}"))?;
    let before = tree(base.path(), &dest);
    let policy = ArchivePolicy {
        kind,
        max_entries: MAX_ENTRIES as u64,
        max_entry_bytes: 1 << 12,
        max_total_bytes: 1 << 16,
        owners: None,
    };
    // Whether it succeeds is the extractor's business; what it touched is the oracle's.
    let result = extract_tar(&tar[..], &dest, &policy);
    let after = tree(base.path(), &dest);
    if before == after {
        return Ok(());
    }
    let mut changed = Vec::new();
    for (path, was) in &before {
        match after.get(path) {
            None => changed.push(format!("{path}: removed (was {was})")),
            Some(now) if now != was => changed.push(format!("{path}: {was} -> {now}")),
            Some(_) => {}
        }
    }
    for (path, now) in &after {
        if !before.contains_key(path) {
            changed.push(format!("{path}: created ({now})"));
        }
    }
    Err(format!(
        "extracting a {kind:?} archive changed what lies outside its destination (the extraction \
         returned {result:?}):\n  {}",
        changed.join("\n  ")
    ))
}

/// Everything below `root` except what lies inside `dest`, described without following links. `dest`
/// itself is described by type and inode only (a layer's root entry may set its mode).
fn tree(root: &Path, dest: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let key = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .display()
                .to_string();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                out.insert(key, "unreadable".into());
                continue;
            };
            if path == dest {
                out.insert(key, format!("{:?} inode {}", meta.file_type(), meta.ino()));
                continue;
            }
            let what = if meta.is_dir() {
                pending.push(path.clone());
                "dir".to_string()
            } else if meta.file_type().is_symlink() {
                format!("link to {:?}", std::fs::read_link(&path).ok())
            } else if meta.is_file() {
                format!("file {:?}", std::fs::read(&path).ok())
            } else {
                format!("{:?}", meta.file_type())
            };
            out.insert(
                key,
                format!(
                    "{what} mode {:o} owner {}:{} mtime {}.{} inode {}",
                    meta.mode(),
                    meta.uid(),
                    meta.gid(),
                    meta.mtime(),
                    meta.mtime_nsec(),
                    meta.ino()
                ),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A program writing one entry of `entry_type` selector with `name` (and no contents).
    fn one_entry(kind: u8, selector: u8, name: &[u8]) -> Vec<u8> {
        let mut program = vec![kind, selector, name.len() as u8];
        program.extend_from_slice(name);
        if selector == 0 {
            program.push(0);
        }
        program
    }

    #[test]
    fn a_program_writes_the_names_it_holds_byte_for_byte() {
        let (kind, tar) = hostile_tar(&one_entry(0, 0, b"a/../../x"));
        assert_eq!(kind, ArchiveKind::Layer);
        let mut archive = tar::Archive::new(&tar[..]);
        let names: Vec<Vec<u8>> = archive
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path_bytes().into_owned())
            .collect();
        assert_eq!(names, vec![b"a/../../x".to_vec()]);
    }

    #[test]
    fn the_oracle_sees_a_change_outside_the_destination() {
        // A fake escape: the oracle's own walk must report what an escape would do. The
        // extraction itself is harmless; the change is made here, between the two walks.
        let base = tempfile::tempdir().unwrap();
        let dest = base.path().join("dest");
        std::fs::create_dir(&dest).unwrap();
        std::fs::write(base.path().join("beside"), b"x").unwrap();
        let before = tree(base.path(), &dest);
        std::fs::write(dest.join("inside"), b"y").unwrap();
        assert_eq!(
            before,
            tree(base.path(), &dest),
            "inside dest is not watched"
        );
        std::fs::remove_file(base.path().join("beside")).unwrap();
        assert_ne!(before, tree(base.path(), &dest));
    }

    #[test]
    fn a_whiteout_of_the_parent_leaves_the_tree_around_the_destination_alone() {
        // `.wh...` at the root names `..`: on the code before the fix it emptied the directory
        // holding the destination (the node's `layers/`).
        for name in [
            &b".wh..."[..],
            b"x/.wh...",
            b".wh..",
            b".wh.",
            b"x/.wh..wh..opq",
        ] {
            check(&one_entry(0, 0, name)).unwrap();
            check(&one_entry(0, 1, name)).unwrap();
        }
    }

    /// Every input the fuzzer kept (its corpus) and every finding (`fuzz/regressions`) is
    /// replayed: none may change anything outside the destination.
    #[test]
    fn the_fuzz_corpus_never_escapes_the_destination() {
        let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
        let mut replayed = 0;
        for dir in ["corpus/extract_tar", "regressions/extract_tar"] {
            let Ok(entries) = std::fs::read_dir(fuzz.join(dir)) else {
                continue;
            };
            for entry in entries {
                let path = entry.unwrap().path();
                let input = std::fs::read(&path).unwrap();
                if let Err(e) = check(&input) {
                    panic!("{}: {e}", path.display());
                }
                replayed += 1;
            }
        }
        assert!(replayed > 0, "no fuzz corpus under {}", fuzz.display());
    }
}
