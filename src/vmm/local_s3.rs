//! A real S3-protocol server on loopback (the `moto` server from PyPI, installed by
//! `scripts/setup.sh` into `.venv-s3`): what the object-store tests and `strata bench upload
//! --store s3` run against. It dies with the process that started it.

use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::blob_store::BlobStore;
use super::error::{Result, VmmError};

/// Access key id and secret the local server accepts (it accepts any); not secrets.
pub const ACCESS_KEY: &str = "strata-test";
pub const SECRET_KEY: &str = "strata-test-secret";

pub struct LocalS3 {
    child: Child,
    /// Closing it stops the server.
    lifeline: Option<ChildStdin>,
    /// `http://127.0.0.1:<port>`
    pub endpoint: String,
}

fn failed(what: &str, detail: impl std::fmt::Display) -> VmmError {
    VmmError::Io {
        context: format!("{what}; install the S3 test server with scripts/setup.sh (.venv-s3)"),
        source: std::io::Error::other(detail.to_string()),
    }
}

/// The `moto_server` executable: `STRATA_S3_SERVER`, else the checkout's `.venv-s3`.
fn server_binary() -> PathBuf {
    if let Ok(path) = std::env::var("STRATA_S3_SERVER") {
        return PathBuf::from(path);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv-s3/bin/moto_server")
}

impl LocalS3 {
    /// Starts a server on a free loopback port and waits until it answers.
    pub fn start() -> Result<LocalS3> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(VmmError::io("choosing a port for the S3 server"))?
            .port();
        // The server runs under a shell that kills it when its standard input closes: when this
        // process exits, however it exits, the pipe closes and the server goes with it. The
        // shell itself exits when the server does, so a server that fails to start is noticed.
        let mut child = Command::new("sh")
            .args([
                "-c",
                "exec 3<&0; \"$0\" -H 127.0.0.1 -p \"$1\" </dev/null >/dev/null 2>&1 & server=$!; \
                 { read _ignored <&3; kill $server; } & wait $server",
            ])
            .arg(server_binary())
            .arg(port.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| failed("starting the S3 server (moto_server)", e))?;
        let lifeline = child.stdin.take();
        let mut server = LocalS3 {
            child,
            lifeline,
            endpoint: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(server);
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(failed("the S3 server exited at start", status));
            }
            if Instant::now() > deadline {
                return Err(failed("the S3 server did not start within 60 s", port));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The `AWS_*` settings that point `object_store` at this server.
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("AWS_ENDPOINT", self.endpoint.as_str()),
            ("AWS_ALLOW_HTTP", "true"),
            ("AWS_REGION", "us-east-1"),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    /// Creates `bucket` (the server accepts unsigned requests).
    pub fn create_bucket(&self, bucket: &str) -> Result<()> {
        let url = format!("{}/{bucket}", self.endpoint);
        let status = http_request("PUT", &url)?;
        if !(200..300).contains(&status.0) {
            return Err(failed(
                &format!("creating bucket {bucket}"),
                format!("HTTP {}: {}", status.0, status.1),
            ));
        }
        Ok(())
    }

    /// Multipart uploads begun and neither completed nor aborted in `bucket`.
    pub fn open_multipart_uploads(&self, bucket: &str) -> Result<usize> {
        let url = format!("{}/{bucket}?uploads", self.endpoint);
        let (status, body) = http_request("GET", &url)?;
        if status != 200 {
            return Err(failed(
                "listing multipart uploads",
                format!("HTTP {status}: {body}"),
            ));
        }
        Ok(body.matches("<Upload>").count())
    }

    /// A blob store in a fresh bucket of this server.
    pub fn blob_store(&self, bucket: &str, prefix: &str) -> Result<Arc<dyn BlobStore>> {
        self.create_bucket(bucket)?;
        super::blob_url::open_blob_store_with(
            Some(&format!("s3://{bucket}/{prefix}")),
            std::path::Path::new("/nonexistent"),
            self.env(),
        )
    }
}

/// A minimal HTTP/1.1 request on loopback: status and body. Only for the local server, which
/// needs no signature for bucket administration.
fn http_request(method: &str, url: &str) -> Result<(u16, String)> {
    use std::io::{Read, Write};
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| failed("an S3 server request", url))?;
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let mut stream =
        std::net::TcpStream::connect(host).map_err(VmmError::io("connecting to the S3 server"))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .map_err(VmmError::io("writing to the S3 server"))?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .map_err(VmmError::io("reading from the S3 server"))?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

impl Drop for LocalS3 {
    fn drop(&mut self) {
        drop(self.lifeline.take());
        let _ = self.child.wait();
    }
}
