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
    let (count, corrupt) = (blob_requests.clone(), corrupt_layers.clone());
    let handler = move |request: Request| {
        let (client, upstream, count, corrupt) = (
            client.clone(),
            upstream.clone(),
            count.clone(),
            corrupt.clone(),
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
        task,
    }
}
