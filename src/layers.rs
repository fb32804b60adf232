//! The dependency rule between strata's layers, checked by a test (docs/adr/0016).
//!
//! `domain` (pure rules) ← `events` (the store) ← `projections` (read models) ← `app` (the
//! write side) ← `api`, `worker`, `reconcilers`, the CLI. A module may use the layers below
//! it, never those above. Telemetry (`trace`, `metrics`, `telemetry`) and fault injection
//! (`fault`) observe every layer and are open to all.
//!
//! The test reads the source of the two bottom layers and fails on any path into a layer above
//! them, so a shortcut (the store building a read model, a rule reading the database) is caught
//! when it is written, not when the layers have grown together. What `events` may use is read
//! too, so the store cannot reach up by a detour: the telemetry and fault modules and the
//! stream adapters (`streams`) may name only the bottom layers and each other.

/// The modules `events` may use besides itself: open to every layer, so they must not lead
/// back above `events`.
#[cfg(test)]
const BESIDE_EVENTS: &[&str] = &["trace", "metrics", "telemetry", "fault"];

/// What each checked module may name under `crate::`, besides itself.
#[cfg(test)]
const ALLOWED: &[(&str, &[&str])] = &[
    ("domain", &[]),
    ("events", BESIDE_EVENTS),
    ("streams", &["domain", "events"]),
    (
        "trace",
        &[
            "domain",
            "events",
            "streams",
            "metrics",
            "telemetry",
            "fault",
        ],
    ),
    (
        "metrics",
        &["domain", "events", "streams", "trace", "telemetry", "fault"],
    ),
    (
        "telemetry",
        &["domain", "events", "streams", "trace", "metrics", "fault"],
    ),
    (
        "fault",
        &[
            "domain",
            "events",
            "streams",
            "trace",
            "metrics",
            "telemetry",
        ],
    ),
];

/// The `crate::<module>` paths in `source` outside comments, as module names.
#[cfg(test)]
fn crate_paths(source: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (number, line) in source.lines().enumerate() {
        let code = match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        };
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let tail = &rest[at + "crate::".len()..];
            let name: String = tail
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            found.push((number + 1, name));
            rest = tail;
        }
        // `use crate::{a, b}` names several layers at once.
        if let Some(at) = code.find("crate::{") {
            let group = &code[at + "crate::{".len()..];
            for part in group.split(',') {
                let name: String = part
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    found.push((number + 1, name));
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// The sources of module `name`: `src/<name>/` or `src/<name>.rs`.
    fn module_files(src: &Path, name: &str) -> Vec<PathBuf> {
        let mut files = Vec::new();
        let dir = src.join(name);
        if dir.is_dir() {
            rust_files(&dir, &mut files);
        } else {
            files.push(src.join(format!("{name}.rs")));
        }
        files
    }

    #[test]
    fn domain_and_events_import_no_upper_layer() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut violations = Vec::new();
        for module in BESIDE_EVENTS {
            assert!(
                ALLOWED.iter().any(|(checked, _)| checked == module),
                "{module} is used by events, so its imports are checked too"
            );
        }
        for (layer, allowed) in ALLOWED {
            let files = module_files(&src, layer);
            assert!(
                files.iter().all(|f| f.is_file()),
                "no sources for src/{layer}: {files:?}"
            );
            for file in files {
                let source = std::fs::read_to_string(&file).unwrap();
                for (line, name) in crate_paths(&source) {
                    if name != *layer && !name.is_empty() && !allowed.contains(&name.as_str()) {
                        violations.push(format!(
                            "{}:{line}: src/{layer} uses crate::{name}",
                            file.display()
                        ));
                    }
                }
            }
        }
        assert!(
            violations.is_empty(),
            "a bottom layer imports an upper one (see src/layers.rs):\n{}",
            violations.join("\n")
        );
    }

    #[test]
    fn the_scan_sees_paths_groups_and_skips_comments() {
        let source = "use crate::projections::builds;\n\
                      use crate::{api, events::X};\n\
                      // crate::worker in a comment\n\
                      let s = crate::app::event_store(pool);\n";
        let names: Vec<String> = crate_paths(source).into_iter().map(|(_, n)| n).collect();
        assert!(names.contains(&"projections".to_owned()));
        assert!(names.contains(&"api".to_owned()));
        assert!(names.contains(&"events".to_owned()));
        assert!(names.contains(&"app".to_owned()));
        assert!(!names.contains(&"worker".to_owned()));
    }
}
