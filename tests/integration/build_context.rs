//! `strata::build_context` against the stock E2B Python SDK in `.venv`: the same tricky trees,
//! sources and ignore patterns go through both, and the files hash, the selected paths, the
//! archive members (type, mode, link target, content) and the `.dockerignore` verdicts must
//! agree exactly. The SDK is the specification here, so a missing `.venv` fails the test.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use strata::build_context::{
    files_hash, load_ignore, select_files, validate_source, write_archive, ContextError,
};
use strata::domain::ignore_pattern::IgnoreMatcher;

/// Runs the SDK on every case of `request` (see the script for its shape).
const SDK_SCRIPT: &str = r#"
import hashlib, io, json, os, sys, tarfile
from e2b.template.utils import (calculate_files_hash, get_all_files_in_path,
    read_dockerignore, tar_file_stream)
from e2b_dockerfile_utils import PatternMatcher

req = json.load(sys.stdin)
out = []
if req["kind"] == "copy":
    ctx = req["context"]
    for case in req["cases"]:
        patterns = read_dockerignore(ctx) + case["extra"]
        r = {}
        try:
            r["hash"] = calculate_files_hash(case["src"], case["dest"], ctx, patterns, False, None)
        except Exception as e:
            r["error"] = str(e)
        files = get_all_files_in_path(case["src"], ctx, patterns, True)
        r["files"] = [os.path.relpath(f, ctx) for f in files]
        if files and case.get("archive", True):
            members = []
            with tarfile.open(fileobj=tar_file_stream(case["src"], ctx, patterns, False, True)) as t:
                for m in t.getmembers():
                    d = {"name": m.name, "type": m.type.decode(), "mode": m.mode}
                    if m.issym():
                        d["link"] = m.linkname
                    if m.isfile():
                        d["sha256"] = hashlib.sha256(t.extractfile(m).read()).hexdigest()
                    members.append(d)
            r["members"] = members
        out.append(r)
else:
    for case in req["cases"]:
        try:
            m = PatternMatcher(case["patterns"])
        except ValueError as e:
            out.append({"error": str(e)})
            continue
        out.append({
            "matches": [m.matches(p) for p in req["paths"]],
            "may_match_under": [m.may_match_under(p) for p in req["paths"]],
        })
json.dump(out, sys.stdout)
"#;

fn sdk(request: &Value) -> Vec<Value> {
    let python = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: these tests check against the E2B Python SDK; run ./scripts/setup.sh",
        python.display()
    );
    let mut child = Command::new(&python)
        .arg("-c")
        .arg(SDK_SCRIPT)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(request.to_string().as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "the SDK script failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

fn write(path: &Path, content: &[u8], mode: u32) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, content).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// Nested directories, `a-b` next to `a/b` (sorting), every kind of link, an empty directory,
/// binary content, odd modes, unicode, glob characters in names and names past 100 bytes.
fn tricky_tree(root: &Path) {
    let app = root.join("app");
    write(&app.join("a.txt"), b"alpha\n", 0o644);
    write(&app.join("b.txt"), b"bravo\n", 0o600);
    write(&app.join(".hidden.txt"), b"dot\n", 0o644);
    write(&app.join("run.sh"), b"#!/bin/sh\necho hi\n", 0o755);
    write(&app.join("suid.sh"), b"#!/bin/sh\n", 0o4750);
    write(&app.join("readonly.txt"), b"ro", 0o444);
    write(
        &app.join("data.bin"),
        &[0, 1, 2, 0xff, 0xfe, 0, b'\n', 0x80],
        0o644,
    );
    write(&app.join("[x].txt"), b"bracket", 0o644);
    write(&app.join("sp ace.txt"), b"", 0o644);
    write(&app.join("ünïcödé.txt"), "ü".as_bytes(), 0o644);
    write(&app.join("a-b/x"), b"x", 0o644);
    write(&app.join("a/b/y"), b"y", 0o644);
    write(&app.join("sub/d.py"), b"print(1)\n", 0o644);
    write(&app.join("sub/deep/c.py"), b"print(2)\n", 0o755);
    write(&app.join("sub/deep/.env"), b"SECRET=1\n", 0o600);
    let long_dir = app.join("l".repeat(60)).join("o".repeat(60));
    write(&long_dir.join("long-file-name.txt"), b"long", 0o644);
    fs::create_dir_all(app.join("empty")).unwrap();
    fs::create_dir_all(app.join("locked")).unwrap();
    fs::set_permissions(app.join("locked"), fs::Permissions::from_mode(0o750)).unwrap();
    symlink("a.txt", app.join("rel-link")).unwrap();
    symlink("/etc/hostname", app.join("abs-link")).unwrap();
    symlink("/nonexistent/target", app.join("dangling")).unwrap();
    symlink("sub", app.join("dirlink")).unwrap();
    symlink("./sub//deep/", app.join("odd-link")).unwrap();
    symlink("t".repeat(150), app.join("long-link")).unwrap();
    write(&root.join("x.py"), b"import os\n", 0o644);
    write(&root.join("top.log"), b"log", 0o644);
    write(&root.join("keep.log"), b"keep", 0o644);
    write(&root.join("logs/a.log"), b"a", 0o644);
    write(&root.join("logs/keep.log"), b"k", 0o644);
    write(&root.join("build/out.bin"), b"out", 0o644);
    write(&root.join("build/keep/important.txt"), b"important", 0o644);
    write(&root.join("build/keep/scratch.tmp"), b"tmp", 0o644);
    write(&root.join(".dot/y.py"), b"y", 0o644);
    symlink("app", root.join("lapp")).unwrap();
    symlink("nowhere", root.join("dang")).unwrap();
}

struct Case {
    src: &'static str,
    dest: &'static str,
    extra: Vec<String>,
}

fn case(src: &'static str, dest: &'static str, extra: &[&str]) -> Case {
    Case {
        src,
        dest,
        extra: extra.iter().map(|s| s.to_string()).collect(),
    }
}

/// One archive member as both sides describe it.
fn member(
    name: &str,
    kind: &str,
    mode: u64,
    link: Option<String>,
    content: Option<&[u8]>,
) -> Value {
    let mut m = json!({"name": name.trim_end_matches('/'), "type": kind, "mode": mode});
    if let Some(link) = link {
        m["link"] = json!(link);
    }
    if let Some(content) = content {
        m["sha256"] = json!(hex::encode(Sha256::digest(content)));
    }
    m
}

fn our_members(archive: &[u8]) -> Vec<Value> {
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(archive));
    let mut members = Vec::new();
    for entry in tar.entries().unwrap() {
        let mut entry = entry.unwrap();
        let header = entry.header().clone();
        assert_eq!(header.uid().unwrap(), 0);
        assert_eq!(header.gid().unwrap(), 0);
        assert_eq!(header.mtime().unwrap(), 0);
        let name = String::from_utf8(entry.path_bytes().into_owned()).unwrap();
        let mode = header.mode().unwrap() as u64;
        let m = match header.entry_type() {
            tar::EntryType::Directory => member(&name, "5", mode, None, None),
            tar::EntryType::Symlink => {
                let link =
                    String::from_utf8(entry.link_name_bytes().unwrap().into_owned()).unwrap();
                member(&name, "2", mode, Some(link), None)
            }
            tar::EntryType::Regular => {
                let mut content = Vec::new();
                entry.read_to_end(&mut content).unwrap();
                member(&name, "0", mode, None, Some(&content))
            }
            other => panic!("unexpected member type {other:?} for {name}"),
        };
        members.push(m);
    }
    members
}

/// Runs every case through both sides and compares hash, selection and archive.
fn check_against_sdk(context: &Path, cases: &[Case]) {
    let request = json!({
        "kind": "copy",
        "context": context,
        "cases": cases.iter().map(|c| json!({"src": c.src, "dest": c.dest, "extra": c.extra})).collect::<Vec<_>>(),
    });
    let expected = sdk(&request);
    for (case, want) in cases.iter().zip(&expected) {
        let label = format!(
            "src={:?} dest={:?} extra={:?}",
            case.src, case.dest, case.extra
        );
        let ignore = load_ignore(context, &case.extra).unwrap();
        let files = select_files(context, case.src, &ignore).unwrap();
        let relative: Vec<String> = files
            .iter()
            .map(|f| {
                let rel = f
                    .strip_prefix(context)
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .to_string();
                if rel.is_empty() {
                    ".".to_string()
                } else {
                    rel
                }
            })
            .collect();
        let want_files: Vec<String> = serde_json::from_value(want["files"].clone()).unwrap();
        assert_eq!(relative, want_files, "selection differs for {label}");

        match files_hash(context, case.src, case.dest, &ignore) {
            Ok(hash) => assert_eq!(
                Some(hash.as_str()),
                want["hash"].as_str(),
                "hash differs for {label}"
            ),
            Err(e) => {
                let sdk_error = want["error"].as_str().unwrap_or_else(|| {
                    panic!(
                        "{label}: we failed ({e}) where the SDK hashed {}",
                        want["hash"]
                    )
                });
                assert!(matches!(e, ContextError::NoFiles { .. }), "{label}: {e}");
                assert!(
                    e.to_string().starts_with(sdk_error),
                    "{label}: {e} vs {sdk_error}"
                );
            }
        }

        if files.is_empty() {
            continue;
        }
        let mut archive = Vec::new();
        let written = write_archive(context, &files, &mut archive).unwrap();
        assert_eq!(written, archive.len() as u64, "{label}");
        assert_eq!(archive[..2], [0x1f, 0x8b], "{label}: not gzip");
        let ours = our_members(&archive);
        let theirs: Vec<Value> = serde_json::from_value(want["members"].clone()).unwrap();
        assert_eq!(ours, theirs, "archive members differ for {label}");
        let names: Vec<&str> = ours.iter().map(|m| m["name"].as_str().unwrap()).collect();
        assert_eq!(
            names, want_files,
            "archive names are not the selection for {label}"
        );
    }
}

#[test]
fn files_hash_selection_and_archive_match_the_sdk_on_a_tricky_tree() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = dir.path();
    tricky_tree(ctx);
    check_against_sdk(
        ctx,
        &[
            case("app", "/dst", &[]),
            case("./app", "/dst/", &[]),
            case("app/", "/dst", &[]),
            case("app/*.txt", "/t/", &[]),
            case("**/*.py", "/py/", &[]),
            case("./app/a/../a-b", "/x", &[]),
            case("app/dirlink", "/l", &[]),
            case("app/dangling", "/d", &[]),
            case("app/rel-link", "/r", &[]),
            case("app/empty", "/e", &[]),
            case("app/data.bin", "/bin/data", &[]),
            case("app/ünïcödé.txt", "/u", &[]),
            case("app/[ab].txt", "/c/", &[]),
            case("app/[!ab].txt", "/c/", &[]),
            case("app/\\[x].txt", "/c/", &[]),
            case("app/?.txt", "/q/", &[]),
            case("app/**/", "/dirs/", &[]),
            case("app/**", "/all/", &[]),
            case("app/sub/..", "/up", &[]),
            case("lapp/*.txt", "/via-link/", &[]),
            case("lapp/**", "/via-link/", &[]),
            case("lapp", "/link", &[]),
            case("dang/..", "/ctx", &[]),
            case("x.py/..", "/ctx", &[]),
            case("*", "/star/", &[]),
            case("**", "/globstar/", &[]),
            case(".", "/ctx", &[]),
            case("app/nope*", "/none", &[]),
            case("missing", "/none", &[]),
        ],
    );
}

#[test]
fn ignore_patterns_select_what_the_sdk_selects() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = dir.path();
    tricky_tree(ctx);
    fs::write(
        ctx.join(".dockerignore"),
        "\u{feff}# build output\r\n*.log\r\n!keep.log\nbuild\n!build/keep/important.txt\n\n  **/.env  \n",
    )
    .unwrap();
    let abs_pattern = format!("{}/app/sub/deep", ctx.display());
    check_against_sdk(
        ctx,
        &[
            case(".", "/ctx", &[]),
            case("build", "/b", &[]),
            case("build/keep/important.txt", "/b", &[]),
            case("build/keep", "/b", &[]),
            case("**/*.log", "/logs/", &[]),
            case("app", "/dst", &["app/*.txt", "!app/b.txt"]),
            case("app", "/dst", &[abs_pattern.as_str()]),
            case("app", "/dst", &["app/sub", "!app/sub/deep/c.py"]),
            case("app", "/dst", &["app"]),
            case("app/sub", "/dst", &["**/*.py", "!**/deep/*.py"]),
            case("app", "/dst", &["/app/l*", "app/[a-b].txt"]),
            case("app", "/dst", &["*", "!app"]),
        ],
    );
}

#[test]
fn ignore_matcher_agrees_with_the_sdk_pattern_matcher() {
    let pattern_sets: Vec<Vec<&str>> = vec![
        vec!["*.md", "!README.md"],
        vec!["*.md", "!README*.md", "README-secret.md"],
        vec!["**/*.go"],
        vec!["temp?"],
        vec!["*/temp*"],
        vec!["build", "!build/keep"],
        vec!["build/", "!build/keep/"],
        vec!["/foo"],
        vec!["./x/../foo", "//a//b//"],
        vec!["**foo"],
        vec!["a**"],
        vec!["a/**"],
        vec!["**"],
        vec!["***"],
        vec!["**/a/**/b"],
        vec!["a/**b"],
        vec!["[a-c]*", "![b]b"],
        vec!["[^a]b"],
        vec!["[!a]b"],
        vec!["a[^x]b"],
        vec!["\\*x", "a\\?b", "a\\b"],
        vec!["a]"],
        vec!["a.b+c(d)|e{f}$g^h"],
        vec!["*", "!*.keep", "x.keep"],
        vec!["a/b", "!a"],
        vec![" spaced ", "\t!tabbed\t", "# comment", ""],
        vec!["**/x", "!**/y/**"],
        vec!["é*", "?"],
        vec!["a/**/b?"],
        vec!["dir", "!dir/*/f"],
        vec!["../up", "/"],
        vec!["["],
        vec!["a\\"],
        vec!["!"],
        vec!["[z-a]"],
        vec!["[]]"],
        vec!["[a-]"],
        vec!["[^]"],
        vec!["ok", "[b-a", "z"],
    ];
    let paths = [
        "README.md",
        "README-secret.md",
        "README-x.md",
        "notes.md",
        "docs/x.md",
        "main.go",
        "a/b/c.go",
        "temp",
        "tempa",
        "tempab",
        "dir/temp1",
        "build",
        "build/keep",
        "build/keep/x",
        "build/other",
        "foo",
        "foo/bar",
        "x/foo",
        "b",
        "a",
        "a/b",
        "a/b/c",
        "a/x/b",
        "a/xb",
        "a/x/bc",
        "barfoo",
        "x/barfoo",
        "ab",
        "bb",
        "cb",
        "!b",
        "a/b",
        "a.b+c(d)|e{f}$g^h",
        "*x",
        "ax",
        "a?b",
        "axb",
        "a]",
        "x.keep",
        "z.keep",
        "y/x",
        "y/z/x",
        "z/x",
        "é",
        "éa",
        "a\nb",
        "a/x\ny/bc",
        "dir",
        "dir/sub",
        "dir/sub/f",
        "spaced",
        "tabbed",
        "up",
        "ok",
        "z",
    ];
    let request = json!({
        "kind": "matcher",
        "paths": &paths[..],
        "cases": pattern_sets.iter().map(|p| json!({"patterns": p})).collect::<Vec<_>>(),
    });
    let expected = sdk(&request);
    for (patterns, want) in pattern_sets.iter().zip(&expected) {
        let owned: Vec<String> = patterns.iter().map(|p| p.to_string()).collect();
        match IgnoreMatcher::new(&owned) {
            Err(e) => {
                let sdk_error = want["error"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{patterns:?}: we refused ({e}), the SDK did not"));
                // Both name the same pattern.
                let quoted = sdk_error.split('\'').nth(1).unwrap();
                assert!(
                    e.to_string().contains(&format!("'{quoted}'")),
                    "{patterns:?}: {e} vs {sdk_error}"
                );
            }
            Ok(m) => {
                assert!(
                    want["error"].is_null(),
                    "{patterns:?}: the SDK refused: {}",
                    want["error"]
                );
                for (i, path) in paths.iter().enumerate() {
                    assert_eq!(
                        Value::Bool(m.matches(path)),
                        want["matches"][i],
                        "matches({path:?}) with {patterns:?}"
                    );
                    assert_eq!(
                        Value::Bool(m.may_match_under(path)),
                        want["may_match_under"][i],
                        "may_match_under({path:?}) with {patterns:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn the_same_tree_gives_the_same_archive_bytes() {
    let one = tempfile::tempdir().unwrap();
    let two = tempfile::tempdir().unwrap();
    tricky_tree(one.path());
    tricky_tree(two.path());
    // Different mtimes must not show.
    std::thread::sleep(std::time::Duration::from_millis(20));
    fs::write(two.path().join("app/a.txt"), b"alpha\n").unwrap();
    let archive = |ctx: &Path| {
        let ignore = load_ignore(ctx, &[]).unwrap();
        let files = select_files(ctx, "app", &ignore).unwrap();
        let mut out = Vec::new();
        write_archive(ctx, &files, &mut out).unwrap();
        out
    };
    let first = archive(one.path());
    assert_eq!(first, archive(one.path()));
    assert_eq!(first, archive(two.path()));
}

#[test]
fn empty_selections_and_escaping_sources_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = dir.path();
    tricky_tree(ctx);
    let none = IgnoreMatcher::default();

    let err = files_hash(ctx, "app/*.nothing", "/x", &none).unwrap_err();
    assert!(matches!(err, ContextError::NoFiles { .. }), "{err}");
    assert!(
        err.to_string().starts_with(&format!(
            "No files found in {}/app/*.nothing",
            ctx.display()
        )),
        "{err}"
    );
    let everything_ignored = load_ignore(ctx, &["app".to_string()]).unwrap();
    assert!(matches!(
        files_hash(ctx, "app", "/x", &everything_ignored),
        Err(ContextError::NoFiles { .. })
    ));

    for src in ["../x", "app/../../x", ".."] {
        let err = select_files(ctx, src, &none).unwrap_err();
        assert!(
            matches!(err, ContextError::SourceEscapes { .. }),
            "{src}: {err}"
        );
        assert!(matches!(
            validate_source(src),
            Err(ContextError::SourceEscapes { .. })
        ));
    }
    let err = files_hash(ctx, "/etc", "/x", &none).unwrap_err();
    assert!(matches!(err, ContextError::AbsoluteSource { .. }), "{err}");
    assert!(err.to_string().contains("\"/etc\""), "{err}");

    // `**/..` passes the lexical check but its top-level match is the context's parent.
    let lone = tempfile::tempdir().unwrap();
    fs::write(lone.path().join("f"), b"f").unwrap();
    let err = select_files(lone.path(), "**/..", &none).unwrap_err();
    assert!(
        matches!(err, ContextError::MatchOutsideContext { .. }),
        "{err}"
    );

    // The SDK cannot encode such a name into the hash; an ignored one is no trouble.
    let odd = tempfile::tempdir().unwrap();
    let bad = std::ffi::OsStr::from_bytes(b"bad-\xff");
    fs::write(odd.path().join(bad), b"x").unwrap();
    fs::write(odd.path().join("good"), b"x").unwrap();
    let err = select_files(odd.path(), ".", &none).unwrap_err();
    assert!(matches!(err, ContextError::NonUtf8Path { .. }), "{err}");
    let err = select_files(odd.path(), "bad*", &none).unwrap_err();
    assert!(matches!(err, ContextError::NonUtf8Path { .. }), "{err}");
    let skip_bad = load_ignore(odd.path(), &["bad*".to_string()]).unwrap();
    assert_eq!(select_files(odd.path(), ".", &skip_bad).unwrap().len(), 2);

    let err = load_ignore(ctx, &["[".to_string()]).unwrap_err();
    assert!(err.to_string().contains("'['"), "{err}");
}

#[test]
fn sockets_fifos_and_foreign_paths_are_not_archived() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = dir.path();
    fs::create_dir(ctx.join("app")).unwrap();
    let fifo = ctx.join("app/pipe");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) }, 0);
    let socket_path = ctx.join("app/sock");
    let _socket = std::os::unix::net::UnixListener::bind(&socket_path).unwrap();

    let none = IgnoreMatcher::default();
    for (src, kind) in [("app/pipe", "fifo"), ("app/sock", "socket")] {
        let files = select_files(ctx, src, &none).unwrap();
        let err = write_archive(ctx, &files, Vec::new()).unwrap_err();
        assert!(
            matches!(&err, ContextError::UnsupportedFileType { kind: k, .. } if *k == kind),
            "{err}"
        );
        assert!(err.to_string().contains(src), "{err}");
    }
    let err = write_archive(ctx, &[PathBuf::from("/etc/hostname")], Vec::new()).unwrap_err();
    assert!(matches!(err, ContextError::OutsideContext { .. }), "{err}");

    // The hash still covers them, as the SDK's does (mode and size, no content); its archive
    // step is skipped (it would block opening the fifo).
    let cases = [("app/pipe", "/p"), ("app/sock", "/s")];
    let request = json!({
        "kind": "copy",
        "context": ctx,
        "cases": cases.iter().map(|(src, dest)| json!({"src": src, "dest": dest, "extra": [], "archive": false})).collect::<Vec<_>>(),
    });
    let expected = sdk(&request);
    for ((src, dest), want) in cases.iter().zip(&expected) {
        let hash = files_hash(ctx, src, dest, &none).unwrap();
        assert_eq!(Some(hash.as_str()), want["hash"].as_str(), "{src}");
    }
}
