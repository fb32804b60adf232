//! `strata template export`: a template's result as an OCI image layout, readable by
//! `strata image import` and by OCI tools.
//!
//! Layout written: `oci-layout`, `index.json` (one manifest, annotated with the ref name),
//! `blobs/sha256/…`: the layer tars exactly as stored (uncompressed, so each layer's digest is
//! also its diff id), an image config carrying the final user and workdir and, when set, the
//! start command as `Cmd` (with the build's environment, which stays out of `Env`: ENV is
//! build-time only, ADR 0012), and the manifest.

use std::fs;
use std::io::Write;
use std::path::Path;

use serde_json::json;

use super::error::WorkerError;
use crate::domain::ids::Digest;
use crate::domain::snapshot::SnapshotRecord;
use crate::vmm::BlobStore;

const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
const CONFIG_TYPE: &str = "application/vnd.oci.image.config.v1+json";
const LAYER_TYPE: &str = "application/vnd.oci.image.layer.v1.tar";

/// Writes `record` as an OCI image layout in `dir` (created if missing); returns the manifest
/// digest.
pub fn write_oci_layout(
    blobs: &dyn BlobStore,
    record: &SnapshotRecord,
    ref_name: &str,
    dir: &Path,
) -> Result<Digest, WorkerError> {
    write_oci_layout_reporting(blobs, record, ref_name, dir, &mut |_, _, _| {})
}

/// [`write_oci_layout`], calling `on_layer(n, total, bytes)` after each layer is written (for
/// progress on a terminal).
pub fn write_oci_layout_reporting(
    blobs: &dyn BlobStore,
    record: &SnapshotRecord,
    ref_name: &str,
    dir: &Path,
    on_layer: &mut dyn FnMut(usize, usize, u64),
) -> Result<Digest, WorkerError> {
    let blob_dir = dir.join("blobs").join("sha256");
    fs::create_dir_all(&blob_dir)
        .map_err(WorkerError::io(format!("creating {}", blob_dir.display())))?;
    let mut layers = Vec::new();
    for layer in &record.layers {
        let digest = *layer;
        let path = blob_dir.join(digest.hex());
        let mut reader = blobs.open_verified(&digest)?;
        let mut out = fs::File::create(&path)
            .map_err(WorkerError::io(format!("creating {}", path.display())))?;
        let size = std::io::copy(&mut reader, &mut out)
            .map_err(WorkerError::io(format!("copying layer {digest}")))?;
        reader.finish()?;
        on_layer(layers.len() + 1, record.layers.len(), size);
        layers.push(json!({"mediaType": LAYER_TYPE, "digest": digest.to_string(), "size": size}));
    }
    let runtime = record.runtime_context();
    let env: Vec<String> = runtime
        .env
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let mut config = json!({
        "Env": env,
        "User": runtime.user,
        "WorkingDir": runtime.workdir,
    });
    if let Some(start) = record.start_cmd.as_deref().filter(|s| !s.is_empty()) {
        config["Cmd"] = json!([
            "/bin/sh",
            "-c",
            start_command_line(&record.context.env, start)
        ]);
    }
    let image_config = json!({
        "architecture": oci_arch(),
        "os": "linux",
        "config": config,
        "rootfs": {
            "type": "layers",
            "diff_ids": record.layers.iter().map(|d| d.to_string()).collect::<Vec<_>>(),
        },
    });
    let (config_digest, config_size) = write_blob(&blob_dir, &image_config)?;
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "digest": config_digest.to_string(), "size": config_size},
        "layers": layers,
    });
    let (manifest_digest, manifest_size) = write_blob(&blob_dir, &manifest)?;
    let index = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": MANIFEST_TYPE,
            "digest": manifest_digest.to_string(),
            "size": manifest_size,
            "annotations": {"org.opencontainers.image.ref.name": ref_name},
        }],
    });
    write_file(
        &dir.join("index.json"),
        &serde_json::to_vec_pretty(&index).expect("json"),
    )?;
    write_file(
        &dir.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    Ok(manifest_digest)
}

/// The start command with the build's environment, which it runs with on E2B, exported for it
/// alone: `export K='v'; …; exec /bin/sh -c '<start>'`.
fn start_command_line(env: &std::collections::BTreeMap<String, String>, start: &str) -> String {
    let mut line = String::new();
    for (k, v) in env {
        line.push_str(&format!("export {k}={}; ", single_quoted(v)));
    }
    line.push_str(&format!("exec /bin/sh -c {}", single_quoted(start)));
    line
}

fn single_quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

fn write_blob(blob_dir: &Path, value: &serde_json::Value) -> Result<(Digest, u64), WorkerError> {
    let bytes = serde_json::to_vec(value).expect("json serializes");
    let digest = Digest::of(&bytes);
    write_file(&blob_dir.join(digest.hex()), &bytes)?;
    Ok((digest, bytes.len() as u64))
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), WorkerError> {
    let mut f =
        fs::File::create(path).map_err(WorkerError::io(format!("creating {}", path.display())))?;
    f.write_all(bytes)
        .map_err(WorkerError::io(format!("writing {}", path.display())))
}

/// The OCI name of this machine's architecture.
fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}
