//! The E2B template-build calls `strata build` makes, as the stock SDK makes them
//! (`../shared/e2b/PROTOCOL.md` §1): register, ask for an upload link, upload, start, poll.
//! A strata server answers them, local or remote.

use std::path::Path;

use anyhow::{bail, Context};
use serde_json::{json, Value};

/// One server, one API key.
pub struct BuildClient {
    http: reqwest::Client,
    base: String,
    key: String,
}

/// What `POST /v3/templates` answered.
pub struct Registered {
    pub template_id: String,
    pub build_id: String,
}

/// `GET /templates/{id}/files/{hash}`: whether the server holds the files, and where to put them
/// if not.
pub struct UploadLink {
    pub present: bool,
    pub url: Option<String>,
    pub headers: Vec<(String, String)>,
}

/// One status page.
pub struct StatusPage {
    pub status: String,
    pub entries: Vec<LogEntry>,
    /// On error: the server's reason and the step it names (`"3"`, `"base"`, `"finalize"`).
    pub reason: Option<(String, Option<String>)>,
}

pub struct LogEntry {
    pub message: String,
    pub step: Option<String>,
    /// When the server logged it; step durations are measured on the server's clock.
    pub timestamp: Option<chrono::DateTime<chrono::Utc>>,
}

impl BuildClient {
    pub fn new(base: &str, key: &str) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            .build()
            .context("building the HTTP client")?;
        Ok(BuildClient {
            http,
            base: base.trim_end_matches('/').to_string(),
            key: key.to_string(),
        })
    }

    pub async fn register(
        &self,
        name: &str,
        tags: &[String],
        cpu: Option<u32>,
        memory_mb: Option<u32>,
    ) -> anyhow::Result<Registered> {
        let mut body = json!({ "name": name });
        if !tags.is_empty() {
            body["tags"] = json!(tags);
        }
        if let Some(cpu) = cpu {
            body["cpuCount"] = json!(cpu);
        }
        if let Some(memory) = memory_mb {
            body["memoryMB"] = json!(memory);
        }
        let answer = self
            .send(
                self.http.post(format!("{}/v3/templates", self.base)),
                Some(body),
                "registering the build",
            )
            .await?;
        Ok(Registered {
            template_id: text(&answer, "templateID")?,
            build_id: text(&answer, "buildID")?,
        })
    }

    pub async fn upload_link(&self, template: &str, hash: &str) -> anyhow::Result<UploadLink> {
        let answer = self
            .send(
                self.http
                    .get(format!("{}/templates/{template}/files/{hash}", self.base)),
                None,
                "asking for an upload link",
            )
            .await?;
        let headers = answer["headers"]
            .as_object()
            .map(|h| {
                h.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        Ok(UploadLink {
            present: answer["present"].as_bool().unwrap_or(false),
            url: answer["url"].as_str().map(str::to_string),
            headers,
        })
    }

    /// PUTs the archive with an explicit length, and without the API key: the link is the
    /// credential (PROTOCOL.md §1.3).
    pub async fn upload(&self, link: &UploadLink, archive: &Path) -> anyhow::Result<()> {
        let url = link
            .url
            .as_deref()
            .context("the server said the files are missing but gave no upload link")?;
        let file = tokio::fs::File::open(archive)
            .await
            .with_context(|| format!("opening {}", archive.display()))?;
        let size = file.metadata().await?.len();
        let body =
            reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::with_capacity(file, 1 << 20));
        let mut request = self.http.put(url).header("content-length", size).body(body);
        for (name, value) in &link.headers {
            request = request.header(name, value);
        }
        let response = request.send().await.context("uploading the context")?;
        if !response.status().is_success() {
            bail!(
                "uploading the context: {}",
                error_text(
                    response.status(),
                    &response.bytes().await.unwrap_or_default()
                )
            );
        }
        Ok(())
    }

    pub async fn start(&self, registered: &Registered, spec: Value) -> anyhow::Result<()> {
        self.send(
            self.http.post(format!(
                "{}/v2/templates/{}/builds/{}",
                self.base, registered.template_id, registered.build_id
            )),
            Some(spec),
            "starting the build",
        )
        .await?;
        Ok(())
    }

    pub async fn status(
        &self,
        registered: &Registered,
        offset: usize,
    ) -> anyhow::Result<StatusPage> {
        let answer = self
            .send(
                self.http.get(format!(
                    "{}/templates/{}/builds/{}/status?logsOffset={offset}&limit=100",
                    self.base, registered.template_id, registered.build_id
                )),
                None,
                "reading the build's status",
            )
            .await?;
        let entries = answer["logEntries"]
            .as_array()
            .map(|entries| {
                entries
                    .iter()
                    .map(|e| LogEntry {
                        message: e["message"].as_str().unwrap_or_default().to_string(),
                        step: e["step"].as_str().map(str::to_string),
                        timestamp: e["timestamp"]
                            .as_str()
                            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                            .map(|t| t.with_timezone(&chrono::Utc)),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let reason = answer["reason"].as_object().map(|r| {
            (
                r.get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("the build failed")
                    .to_string(),
                r.get("step").and_then(Value::as_str).map(str::to_string),
            )
        });
        Ok(StatusPage {
            status: text(&answer, "status")?,
            entries,
            reason,
        })
    }

    /// Sends with the API key; a non-2xx answer is an error carrying the server's message.
    async fn send(
        &self,
        request: reqwest::RequestBuilder,
        body: Option<Value>,
        what: &str,
    ) -> anyhow::Result<Value> {
        let mut request = request.header("x-api-key", &self.key);
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("{what}: cannot reach {}", self.base))?;
        let status = response.status();
        let bytes = response.bytes().await.with_context(|| what.to_string())?;
        if !status.is_success() {
            bail!("{what}: {}", error_text(status, &bytes));
        }
        if bytes.is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&bytes).with_context(|| format!("{what}: the answer is not JSON"))
    }
}

fn text(answer: &Value, field: &str) -> anyhow::Result<String> {
    answer[field]
        .as_str()
        .map(str::to_string)
        .with_context(|| format!("the server's answer has no {field}: {answer}"))
}

/// `401: invalid API key`, from E2B's `{"code", "message"}` error body when there is one.
fn error_text(status: reqwest::StatusCode, body: &[u8]) -> String {
    let message = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    format!("{} {message}", status.as_u16())
}
