//! Long CLI work shows progress on a terminal and stays quiet when piped: `strata image
//! build-base`, `strata template export` and `strata image pull`, run once under a
//! pseudo-terminal (`script`, from util-linux) and once with stderr piped.

use crate::common;

use std::path::Path;
use std::process::Command;

use common::worker_fixture::*;
use serde_json::json;

/// Runs `args` with `env` under a pseudo-terminal; returns everything the terminal showed.
fn on_terminal(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut line = shell_quote(&common::strata_bin().display().to_string());
    for a in args {
        line.push(' ');
        line.push_str(&shell_quote(a));
    }
    let out = Command::new("script")
        .args(["-qefc", &line, "/dev/null"])
        .envs(env.iter().copied())
        .env_remove("STRATA_PROGRESS")
        .output()
        .expect("script (util-linux) runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `args` with stdout and stderr piped; returns (stdout, stderr).
fn piped(args: &[&str], env: &[(&str, &str)]) -> (String, String) {
    let out = Command::new(common::strata_bin())
        .args(args)
        .envs(env.iter().copied())
        .env_remove("STRATA_PROGRESS")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

#[test]
fn build_base_shows_its_stages_on_a_terminal_only() {
    let data = common::data_dir();
    let dir = data.path().to_str().unwrap();
    let env = [("STRATA_DATA_DIR", dir), ("RUST_LOG", "warn")];
    let shown = on_terminal(&["image", "build-base", "--busybox-only"], &env);
    assert!(shown.contains("[1/1] busybox"), "{shown:?}");
    assert!(
        shown.contains("s)"),
        "the stage ends with its duration: {shown:?}"
    );
    assert!(shown.contains("busybox\tsha256:"), "{shown:?}");

    let (stdout, stderr) = piped(&["image", "build-base", "--busybox-only"], &env);
    assert!(stdout.starts_with("busybox\tsha256:"), "{stdout:?}");
    assert!(!stderr.contains("[1/1]"), "progress on a pipe: {stderr:?}");
    assert!(!stdout.contains("[1/1]"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn template_export_reports_layers_on_a_terminal_only() {
    let mut fx = Fixture::new(settings()).await;
    let (_, build) = fx.api.register("exported").await;
    fx.api
        .start(
            build,
            json!({"fromImage": "busybox", "force": false, "steps": [
                step("RUN", &["echo one > one.txt"]),
                step("RUN", &["echo two > two.txt"]),
            ]}),
        )
        .await;
    assert_ready(&fx.wait_terminal(build).await);
    fx.stop().await;

    let node = common::sandbox::node_dir();
    let out = common::data_dir();
    let team = fx.api.team.to_string();
    let env = [
        ("DATABASE_URL", fx.db.url.as_str()),
        ("STRATA_DATA_DIR", node.to_str().unwrap()),
        ("RUST_LOG", "warn"),
    ];
    let tty_dir = out.path().join("tty");
    let shown = on_terminal(
        &[
            "template",
            "export",
            "--team",
            &team,
            "exported",
            tty_dir.to_str().unwrap(),
        ],
        &env,
    );
    assert!(shown.contains("[1/1] exporting exported"), "{shown:?}");
    assert!(shown.contains("layer 1/"), "{shown:?}");
    assert!(shown.contains("done ("), "{shown:?}");
    assert!(Path::new(&tty_dir).join("index.json").exists());

    let pipe_dir = out.path().join("pipe");
    let (stdout, stderr) = piped(
        &[
            "template",
            "export",
            "--team",
            &team,
            "exported",
            pipe_dir.to_str().unwrap(),
        ],
        &env,
    );
    assert!(stdout.starts_with("exported\tsha256:"), "{stdout:?}");
    assert!(
        !stderr.contains("exporting") && !stderr.contains("layer "),
        "{stderr:?}"
    );
    assert!(Path::new(&pipe_dir).join("index.json").exists());
}

#[test]
fn image_pull_shows_its_progress_on_a_terminal_only() {
    let work = tempfile::tempdir().unwrap();
    let reg = common::registry::LocalRegistry::start(&work.path().join("reg"), None).unwrap();
    let image = common::registry::push_three_layers(&reg, work.path(), "team/shown:1", "x\n");
    let reference = format!("{}/team/shown:1", reg.addr);
    let tty_data = work.path().join("tty");
    let env = [
        ("STRATA_DATA_DIR", tty_data.to_str().unwrap()),
        ("RUST_LOG", "warn"),
        ("STRATA_INSECURE_REGISTRIES", "127.0.0.1"),
    ];
    let shown = on_terminal(&["image", "pull", &reference], &env);
    assert!(
        shown.contains(&format!("[1/1] pulling {reference}")),
        "{shown:?}"
    );
    assert!(
        shown.contains(&image.digest[..19]) && shown.contains("s)"),
        "the stage ends with the digest and its duration: {shown:?}"
    );

    let pipe_data = work.path().join("pipe");
    let env = [
        ("STRATA_DATA_DIR", pipe_data.to_str().unwrap()),
        ("RUST_LOG", "warn"),
        ("STRATA_INSECURE_REGISTRIES", "127.0.0.1"),
    ];
    let (stdout, stderr) = piped(&["image", "pull", &reference], &env);
    assert!(stdout.contains(&image.digest), "{stdout:?}");
    assert!(
        !stderr.contains("pulling") && !stderr.contains("layer "),
        "{stderr:?}"
    );
}
