//! Registry fixtures: real `docker-registry` instances on loopback (from
//! [`strata::registry::local`]), images written as OCI layouts and pushed with skopeo, and an
//! HTTP proxy in front of a registry that counts blob requests and, when told to, corrupts the
//! layer blobs it relays (the one fault a real registry cannot be made to produce).

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use strata::registry::layout::{Entry, Layer, Layout, Written};
use strata::registry::manifest::Compression;

pub use strata::registry::local::LocalRegistry;

pub fn file(path: &str, contents: &str) -> Entry {
    Entry::File {
        path: path.into(),
        contents: contents.as_bytes().to_vec(),
        mode: 0o644,
    }
}

pub fn dir(path: &str) -> Entry {
    Entry::Dir { path: path.into() }
}

pub fn whiteout(path: &str) -> Entry {
    Entry::Whiteout { path: path.into() }
}

pub fn layer(compression: Compression, entries: Vec<Entry>) -> Layer {
    Layer {
        entries,
        compression,
    }
}

/// The node's architecture as OCI names it.
pub fn node_arch() -> String {
    strata::registry::manifest::node_platform().architecture
}

/// A three-layer image: gzip, zstd (with a whiteout of a file of the first layer) and an
/// uncompressed one; `marker` goes into `/etc/marker`.
pub fn three_layer_image(layout: &mut Layout, marker: &str) -> Written {
    layout
        .image(
            &[
                layer(
                    Compression::Gzip,
                    vec![
                        dir("etc"),
                        file("etc/hostname", "base\n"),
                        file("etc/removed", "gone soon\n"),
                        dir("bin"),
                        file("bin/tool", "#!/bin/sh\necho tool\n"),
                    ],
                ),
                layer(
                    Compression::Zstd,
                    vec![
                        dir("etc"),
                        whiteout("etc/removed"),
                        file("etc/marker", marker),
                    ],
                ),
                layer(
                    Compression::None,
                    vec![dir("srv"), file("srv/app", "app\n")],
                ),
            ],
            &[
                "PATH=/usr/bin:/bin",
                "GREETING=hello world",
                "EMPTY=",
                " =x",
            ],
            &node_arch(),
        )
        .expect("writing an OCI layout")
}

/// Writes `marker`'s three-layer image into a fresh layout under `work` and pushes it as
/// `dest` to `registry`.
pub fn push_three_layers(
    registry: &LocalRegistry,
    work: &Path,
    dest: &str,
    marker: &str,
) -> Written {
    let dir = work.join(format!("layout-{}", uuid::Uuid::new_v4().simple()));
    let mut layout = Layout::create(&dir).unwrap();
    let image = three_layer_image(&mut layout, marker);
    layout.tag("img", &image).unwrap();
    registry
        .push(&dir, "img", dest, false)
        .expect("skopeo push");
    image
}

/// A proxy on loopback in front of `upstream` (`127.0.0.1:port`).
pub struct Proxy {
    pub addr: String,
    pub blob_requests: Arc<AtomicUsize>,
    pub corrupt_layers: Arc<AtomicBool>,
    /// The `Content-Type` of every manifest response relayed, in order.
    pub manifest_types: Arc<std::sync::Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn proxy(upstream: &str) -> Proxy {
    use axum::body::Body;
    use axum::extract::Request;
    use axum::response::Response;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let blob_requests = Arc::new(AtomicUsize::new(0));
    let corrupt_layers = Arc::new(AtomicBool::new(false));
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let upstream = upstream.to_owned();
    let manifest_types = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (count, corrupt, types) = (
        blob_requests.clone(),
        corrupt_layers.clone(),
        manifest_types.clone(),
    );
    let handler = move |request: Request| {
        let (client, upstream, count, corrupt, types) = (
            client.clone(),
            upstream.clone(),
            count.clone(),
            corrupt.clone(),
            types.clone(),
        );
        async move {
            let path = request
                .uri()
                .path_and_query()
                .map(|p| p.to_string())
                .unwrap_or_default();
            let is_blob = path.contains("/blobs/sha256:");
            if is_blob {
                count.fetch_add(1, Ordering::SeqCst);
            }
            let mut forward = client.get(format!("http://{upstream}{path}"));
            for (name, value) in request.headers() {
                if name != "host" {
                    forward = forward.header(name, value);
                }
            }
            let answer = forward.send().await.unwrap();
            let status = answer.status();
            let headers = answer.headers().clone();
            if path.contains("/manifests/") {
                let kind = headers
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default();
                types.lock().unwrap().push(kind.to_owned());
            }
            let mut body = answer.bytes().await.unwrap().to_vec();
            // Layer blobs are the large ones; configs and manifests are small JSON.
            if is_blob && corrupt.load(Ordering::SeqCst) && body.len() > 64 && body[0] != b'{' {
                let at = body.len() / 2;
                body[at] ^= 0x55;
            }
            let mut response = Response::builder().status(status.as_u16());
            for (name, value) in headers.iter() {
                if name != "content-length" && name != "transfer-encoding" {
                    response = response.header(name.as_str(), value.as_bytes());
                }
            }
            response.body(Body::from(body)).unwrap()
        }
    };
    let app = axum::Router::new().fallback(handler);
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    Proxy {
        addr,
        blob_requests,
        corrupt_layers,
        manifest_types,
        task,
    }
}

/// Pushes `oci:<layout>:<name>` to `dest` on `registry` converted to Docker's formats
/// (`skopeo copy --format v2s2`: a Docker v2 schema 2 manifest, and with `all` the index becomes
/// a Docker manifest list). Digests change in the conversion; read them back with
/// [`inspect_raw`].
pub fn push_docker(registry: &LocalRegistry, layout: &Path, name: &str, dest: &str, all: bool) {
    let mut cmd = std::process::Command::new("skopeo");
    cmd.args([
        "copy",
        "--quiet",
        "--format",
        "v2s2",
        "--dest-tls-verify=false",
    ]);
    if all {
        cmd.arg("--all");
    }
    if let Some((u, p)) = &registry.credentials {
        cmd.arg(format!("--dest-creds={u}:{p}"));
    }
    cmd.arg(format!("oci:{}:{name}", layout.display()))
        .arg(format!("docker://{}/{dest}", registry.addr));
    let out = cmd.output().expect("running skopeo");
    assert!(
        out.status.success(),
        "skopeo copy --format v2s2: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The manifest (or manifest list) bytes `dest` has on `registry`, as `skopeo inspect --raw`
/// reads them, with their digest.
pub fn inspect_raw(registry: &LocalRegistry, dest: &str) -> (serde_json::Value, String) {
    let out = std::process::Command::new("skopeo")
        .args(["inspect", "--raw", "--tls-verify=false"])
        .arg(format!("docker://{}/{dest}", registry.addr))
        .output()
        .expect("running skopeo");
    assert!(
        out.status.success(),
        "skopeo inspect --raw: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let digest = format!(
        "sha256:{}",
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&out.stdout))
    );
    (serde_json::from_slice(&out.stdout).unwrap(), digest)
}

/// What a [`TokenFront`] answers instead of forwarding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrontMode {
    /// Bearer challenges, tokens for the right credentials, forwarding with a valid token.
    Token,
    /// As `Token`, but the challenge names no scope: the client must ask for
    /// `repository:<name>:pull` itself.
    TokenWithoutScope,
    /// Every registry request is answered `429 Too Many Requests` with a registry error body.
    RateLimited,
    /// As `Token`, but the challenge sends clients to a realm on another loopback host
    /// (`http://127.0.0.2:<port>/token`), which a client must refuse.
    RealmElsewhere(u16),
}

/// The message a rate-limited [`TokenFront`] sends in its error body.
pub const RATE_LIMIT_MESSAGE: &str = "slow down, you pulled too much";

/// A bearer-token registry on loopback: it answers `401` with a
/// `Bearer realm=…/token,service=…,scope=repository:<name>:pull` challenge, its `/token`
/// endpoint issues a token only for the right basic credentials and only for the pull scope of
/// the repository a request names, and requests carrying `Authorization: Bearer <token>` for
/// that repository are forwarded to an open registry. It stands in for a token server (Docker
/// Hub's auth.docker.io, a distribution `token` auth setup), none of which installs here: the
/// Debian docker-registry speaks only Basic with htpasswd.
pub struct TokenFront {
    pub addr: String,
    /// The query of every token request (`scope`, `service`), in order.
    pub token_requests: Arc<std::sync::Mutex<Vec<TokenQuery>>>,
    /// Registry requests answered with a forwarded response (token accepted).
    pub forwarded: Arc<AtomicUsize>,
    /// Every request the front received.
    pub hits: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TokenFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The query parameters of one token request.
pub type TokenQuery = Vec<(String, String)>;

pub const FRONT_SERVICE: &str = "strata-test-front";

/// The repository a `/v2/<name>/(manifests|blobs)/<reference>` path names.
fn repository_of(path: &str) -> Option<String> {
    let rest = path.strip_prefix("/v2/")?;
    let end = rest
        .rfind("/manifests/")
        .or_else(|| rest.rfind("/blobs/"))?;
    Some(rest[..end].to_owned())
}

pub async fn token_front(
    upstream: &str,
    username: &str,
    password: &str,
    mode: FrontMode,
) -> TokenFront {
    use axum::body::Body;
    use axum::extract::Request;
    use axum::response::Response;
    use base64::Engine as _;
    use std::collections::HashMap;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let token_requests = Arc::new(std::sync::Mutex::new(Vec::new()));
    let forwarded = Arc::new(AtomicUsize::new(0));
    let hits = Arc::new(AtomicUsize::new(0));
    // Issued tokens and the repository each may pull.
    let tokens: Arc<std::sync::Mutex<HashMap<String, String>>> = Arc::default();
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let expected_basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"))
    );
    let upstream = upstream.to_owned();
    let (requests, count, front) = (token_requests.clone(), forwarded.clone(), addr.clone());
    let all = hits.clone();
    let handler = move |request: Request| {
        all.fetch_add(1, Ordering::SeqCst);
        let (client, upstream, requests, count, tokens, expected_basic, front) = (
            client.clone(),
            upstream.clone(),
            requests.clone(),
            count.clone(),
            tokens.clone(),
            expected_basic.clone(),
            front.clone(),
        );
        async move {
            let error = |status: u16, code: &str, message: &str| {
                Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Body::from(
                        serde_json::json!({"errors": [{"code": code, "message": message}]})
                            .to_string(),
                    ))
                    .unwrap()
            };
            let authorization = request
                .headers()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let path = request.uri().path().to_owned();
            if path == "/token" {
                let url = format!(
                    "http://{front}/token?{}",
                    request.uri().query().unwrap_or("")
                );
                let query: TokenQuery = reqwest::Url::parse(&url)
                    .unwrap()
                    .query_pairs()
                    .into_owned()
                    .collect();
                requests.lock().unwrap().push(query.clone());
                if authorization != expected_basic {
                    return error(401, "UNAUTHORIZED", "authentication required");
                }
                let scope = query
                    .iter()
                    .find(|(k, _)| k == "scope")
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default();
                let service = query.iter().find(|(k, _)| k == "service");
                let Some(repository) = scope
                    .strip_prefix("repository:")
                    .and_then(|s| s.strip_suffix(":pull"))
                    .filter(|_| service.is_some_and(|(_, v)| v == FRONT_SERVICE))
                else {
                    return error(
                        400,
                        "DENIED",
                        "a token is issued for one repository's pull scope",
                    );
                };
                let token = uuid::Uuid::new_v4().simple().to_string();
                tokens
                    .lock()
                    .unwrap()
                    .insert(token.clone(), repository.to_owned());
                return Response::builder()
                    .status(200)
                    .header("content-type", "application/json")
                    .body(Body::from(
                        serde_json::json!({"token": token, "expires_in": 300}).to_string(),
                    ))
                    .unwrap();
            }
            if mode == FrontMode::RateLimited {
                return error(429, "TOOMANYREQUESTS", RATE_LIMIT_MESSAGE);
            }
            let repository = repository_of(&path).unwrap_or_default();
            let granted = authorization
                .strip_prefix("Bearer ")
                .and_then(|t| tokens.lock().unwrap().get(t).cloned());
            if granted.as_deref() != Some(repository.as_str()) {
                let realm = match mode {
                    FrontMode::RealmElsewhere(port) => format!("http://127.0.0.2:{port}/token"),
                    _ => format!("http://{front}/token"),
                };
                let mut challenge = format!("Bearer realm=\"{realm}\",service=\"{FRONT_SERVICE}\"");
                if matches!(mode, FrontMode::Token | FrontMode::RealmElsewhere(_)) {
                    challenge.push_str(&format!(",scope=\"repository:{repository}:pull\""));
                }
                let mut response = error(401, "UNAUTHORIZED", "authentication required");
                response
                    .headers_mut()
                    .insert("www-authenticate", challenge.parse().unwrap());
                return response;
            }
            count.fetch_add(1, Ordering::SeqCst);
            let target = request
                .uri()
                .path_and_query()
                .map(|p| p.to_string())
                .unwrap_or_default();
            let mut forward = client.get(format!("http://{upstream}{target}"));
            for (name, value) in request.headers() {
                if name != "host" && name != "authorization" {
                    forward = forward.header(name, value);
                }
            }
            let answer = forward.send().await.unwrap();
            let mut response = Response::builder().status(answer.status().as_u16());
            for (name, value) in answer.headers().iter() {
                if name != "content-length" && name != "transfer-encoding" {
                    response = response.header(name.as_str(), value.as_bytes());
                }
            }
            response
                .body(Body::from(answer.bytes().await.unwrap()))
                .unwrap()
        }
    };
    let app = axum::Router::new().fallback(handler);
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    TokenFront {
        addr,
        token_requests,
        forwarded,
        hits,
        task,
    }
}
