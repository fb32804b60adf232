//! The operator page in a real headless Chromium (Debian's `chromium`): the DOM as the
//! browser built it, and screenshots kept under `target/tmp/ui/` as artifacts (and copied to
//! `STRATA_UI_SCREENSHOTS` when set: how `docs/images/` is refreshed).

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The admin token the tests' APIs are served with when they show the operator page.
pub const TOKEN: &str = "ui-admin-token-7f3a9c";

/// The HTML of `path` (a `/ui` page) of the API at `base`, fetched with [`TOKEN`].
pub async fn page(base: &str, path: &str) -> String {
    let resp = reqwest::Client::new()
        .get(format!("{base}{path}"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200, "{path}");
    resp.text().await.unwrap()
}

pub fn artifacts() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs headless Chromium with a fresh profile on `url`; `mode` is `--dump-dom` or
/// `--screenshot=PATH`. Returns stdout.
pub async fn chromium(url: &str, mode: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    let run = tokio::process::Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1400,1800",
            &format!("--user-data-dir={}", profile.path().display()),
            mode,
            url,
        ])
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("chromium finished within 120 s")
        .expect("chromium runs (scripts/setup.sh installs it)");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Copies a screenshot to `STRATA_UI_SCREENSHOTS` when set (how `docs/images/` is refreshed).
fn keep_screenshot(shot: &Path) {
    if let Ok(dir) = std::env::var("STRATA_UI_SCREENSHOTS") {
        std::fs::copy(shot, Path::new(&dir).join(shot.file_name().unwrap())).unwrap();
    }
}

/// A screenshot of `page` (a `/ui` path) of the API at `api`, signed in with [`TOKEN`], saved
/// as `name`; checked to be a PNG with something drawn in it.
pub async fn screenshot(api: &str, page: &str, name: &str) {
    let shot = artifacts().join(name);
    let _ = std::fs::remove_file(&shot);
    chromium(
        &format!("{api}/ui/login?token={TOKEN}&next={page}"),
        &format!("--screenshot={}", shot.display()),
    )
    .await;
    let png = std::fs::read(&shot).expect("the screenshot was written");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
    assert!(
        png.len() > 10_000,
        "a blank page is tiny: {} bytes",
        png.len()
    );
    keep_screenshot(&shot);
}
