//! ARCHITECTURE.md is the map a newcomer reads first; a map that names a file that moved sends
//! them nowhere. Every path it names exists: a backticked path from the repository's root, a
//! file or directory named under a `### \`src/...\`` heading (relative to that directory), and
//! every ADR it cites by number.

use std::path::{Path, PathBuf};

const ROOTS: &[&str] = &[
    "src/",
    "tests/",
    "docs/",
    "migrations/",
    "fuzz/",
    "scripts/",
    "examples/",
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The backticked spans of `line`.
fn spans(line: &str) -> Vec<&str> {
    line.split('`').skip(1).step_by(2).collect()
}

/// What a span names, when it names a path: from the root, or under `section`'s directory.
fn named_path(span: &str, section: Option<&Path>) -> Option<PathBuf> {
    let span = span.trim();
    if span.contains(' ') || span.contains('<') || span.contains('*') {
        return None;
    }
    if ROOTS.iter().any(|r| span.starts_with(r)) {
        return Some(repo().join(span));
    }
    let relative = span.ends_with(".rs") || (span.ends_with('/') && span.len() > 1);
    match section {
        Some(dir) if relative && !span.starts_with('.') => Some(dir.join(span)),
        _ => None,
    }
}

#[test]
fn every_path_the_architecture_map_names_exists() {
    let text = std::fs::read_to_string(repo().join("ARCHITECTURE.md")).unwrap();
    let mut section: Option<PathBuf> = None;
    let mut checked = 0;
    let mut missing = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if let Some(heading) = line.strip_prefix("### ") {
            section = spans(heading)
                .first()
                .filter(|s| s.starts_with("src/"))
                .map(|s| repo().join(s));
            continue;
        }
        if line.starts_with("## ") {
            section = None;
        }
        for span in spans(line) {
            if let Some(path) = named_path(span, section.as_deref()) {
                checked += 1;
                if !path.exists() {
                    missing.push(format!("line {}: `{span}` ({})", n + 1, path.display()));
                }
            }
        }
        for (at, _) in line.match_indices("ADR ") {
            let number: String = line[at + 4..].chars().take(4).collect();
            if number.len() == 4 && number.chars().all(|c| c.is_ascii_digit()) {
                checked += 1;
                let found = std::fs::read_dir(repo().join("docs/adr"))
                    .unwrap()
                    .flatten()
                    .any(|e| {
                        e.file_name()
                            .to_string_lossy()
                            .starts_with(&format!("{number}-"))
                    });
                if !found {
                    missing.push(format!("line {}: ADR {number}", n + 1));
                }
            }
        }
    }
    assert!(
        checked > 80,
        "only {checked} paths checked: is the map's format still the one this test reads?"
    );
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names what does not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn a_moved_file_is_caught() {
    let section = repo().join("src/app");
    assert_eq!(
        named_path("build.rs", Some(&section)),
        Some(section.join("build.rs"))
    );
    assert!(named_path("no_such_file.rs", Some(&section)).is_some_and(|p| !p.exists()));
    assert_eq!(named_path("<data dir>/layers", None), None);
    assert_eq!(named_path("strata up", None), None);
}
