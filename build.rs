//! Stamps the library with a fingerprint of its sources (`STRATA_SOURCE_ID`), so that the
//! strata binary can tell whether the `strata-sandbox-init` beside it was built from the same
//! library (a `cargo build --bin strata` leaves an older one in place) before starting
//! sandboxes with it. Everything the two binaries exchange is in the library.

use std::hash::{DefaultHasher, Hasher};
use std::path::{Path, PathBuf};

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// What the library is built from: `src` without the binaries' own sources (`main.rs`,
/// `cli/`, `bin/`), so that a change to those alone does not rebuild the library.
fn library_sources() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = std::fs::read_dir("src")
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    roots.retain(|p| {
        !["main.rs", "cli", "bin"]
            .iter()
            .any(|skip| p.ends_with(skip))
    });
    roots.extend(["Cargo.lock", "Cargo.toml"].map(PathBuf::from));
    roots
}

fn main() {
    let mut paths = Vec::new();
    for root in library_sources() {
        println!("cargo:rerun-if-changed={}", root.display());
        if root.is_dir() {
            files(&root, &mut paths);
        } else {
            paths.push(root);
        }
    }
    paths.sort();
    // SipHash with fixed keys: the same sources give the same fingerprint on every machine.
    let mut hasher = DefaultHasher::new();
    for path in &paths {
        hasher.write(path.to_string_lossy().as_bytes());
        hasher.write(&std::fs::read(path).unwrap_or_default());
    }
    println!("cargo:rustc-env=STRATA_SOURCE_ID={:016x}", hasher.finish());
}
