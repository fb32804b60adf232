//! A whole build over the real HTTP API, as the SDK drives it: a key from `strata keys create`,
//! registration, upload link, signed PUT, start, status polls. Shared by the operator tests
//! (metrics, the page, traces), which need builds whose every request went over the wire.

use std::time::Duration;

use serde_json::{json, Value};

/// An SDK-like client of one team.
pub struct SdkClient {
    pub http: reqwest::Client,
    pub base: String,
    pub key: String,
    /// Sent as `traceparent` on every request when set.
    pub traceparent: Option<String>,
}

/// Issues a key for `team` through the same command `strata keys create` runs.
pub async fn key_for(db_url: &str, team: &str) -> String {
    let out = tokio::process::Command::new(super::strata_bin())
        .args(["keys", "create", "--team", team])
        .env("DATABASE_URL", db_url)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

pub fn tar_gz(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::default(),
    ));
    for (path, data) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append_data(&mut header, path, *data).unwrap();
    }
    builder.into_inner().unwrap().finish().unwrap()
}

impl SdkClient {
    pub async fn new(base: &str, db_url: &str, team: &str) -> SdkClient {
        SdkClient {
            http: reqwest::Client::new(),
            base: base.to_owned(),
            key: key_for(db_url, team).await,
            traceparent: None,
        }
    }

    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header("X-API-KEY", &self.key);
        if let Some(tp) = &self.traceparent {
            req = req.header("traceparent", tp);
        }
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// `POST /v3/templates`, asserting every field the SDK reads; (template id, build id).
    pub async fn register(&self, name: &str) -> (String, String) {
        let (status, body) = self
            .call(
                reqwest::Method::POST,
                "/v3/templates",
                Some(json!({"name": name})),
            )
            .await;
        assert_eq!(status, 202, "{body}");
        for key in [
            "templateID",
            "buildID",
            "public",
            "names",
            "tags",
            "aliases",
        ] {
            assert!(body.get(key).is_some(), "{key} missing from {body}");
        }
        (
            body["templateID"].as_str().unwrap().to_string(),
            body["buildID"].as_str().unwrap().to_string(),
        )
    }
    /// Registers `name`, uploads each `(filesHash, archive)`, starts `spec` (its COPY steps name
    /// those hashes) and polls until ready or error. Returns (template id, build id, status).
    pub async fn build(
        &self,
        name: &str,
        files: &[(&str, Vec<u8>)],
        spec: Value,
    ) -> (String, String, Value) {
        let (template, build) = self.register(name).await;
        for (hash, bytes) in files {
            let (status, link) = self
                .call(
                    reqwest::Method::GET,
                    &format!("/templates/{template}/files/{hash}"),
                    None,
                )
                .await;
            assert_eq!(status, 201, "{link}");
            if !link["present"].as_bool().unwrap() {
                let mut put = self
                    .http
                    .put(link["url"].as_str().unwrap())
                    .body(bytes.clone());
                if let Some(tp) = &self.traceparent {
                    put = put.header("traceparent", tp);
                }
                let resp = put.send().await.unwrap();
                assert_eq!(
                    resp.status().as_u16(),
                    200,
                    "{}",
                    resp.text().await.unwrap()
                );
            }
        }
        let (status, body) = self
            .call(
                reqwest::Method::POST,
                &format!("/v2/templates/{template}/builds/{build}"),
                Some(spec),
            )
            .await;
        assert_eq!(status, 202, "{body}");
        for _ in 0..1200 {
            let (status, body) = self
                .call(
                    reqwest::Method::GET,
                    &format!("/templates/{template}/builds/{build}/status?logsOffset=0&limit=1"),
                    None,
                )
                .await;
            assert_eq!(status, 200, "{body}");
            if matches!(body["status"].as_str(), Some("ready" | "error")) {
                return (template, build, body);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("build {build} did not finish");
    }
}

/// Prometheus text exposition as `series -> value` (`name{labels}` exactly as printed).
pub fn parse_metrics(text: &str) -> std::collections::BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

pub async fn scrape(url: &str) -> std::collections::BTreeMap<String, f64> {
    let resp = reqwest::get(url).await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let ct = resp.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
    parse_metrics(&resp.text().await.unwrap())
}

/// A child process (`strata up`, `strata reconcile`) that is SIGTERMed and reaped when the test
/// ends, also when an assertion fails first: a leaked server would keep a worker running.
pub struct ChildGuard(pub Option<std::process::Child>);

impl ChildGuard {
    pub fn id(&self) -> u32 {
        self.0.as_ref().expect("running").id()
    }
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        self.0.as_mut().expect("running").try_wait().unwrap()
    }
    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.0.take().expect("running");
        // SAFETY: plain kill(2) on our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        child.wait().unwrap()
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            // SAFETY: plain kill(2) on our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let _ = child.wait();
        }
    }
}
