//! Writes OCI image layouts (`oci-layout`, `index.json`, `blobs/sha256/…`) from files given in
//! memory: the images `strata bench pull` and the registry tests push with skopeo.

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use super::manifest::{Compression, OCI_INDEX, OCI_MANIFEST};

/// One entry of a layer.
#[derive(Debug, Clone)]
pub enum Entry {
    File {
        path: String,
        contents: Vec<u8>,
        mode: u32,
    },
    Dir {
        path: String,
    },
    /// An OCI whiteout: hides `path` of the layers below.
    Whiteout {
        path: String,
    },
}

#[derive(Debug, Clone)]
pub struct Layer {
    pub entries: Vec<Entry>,
    pub compression: Compression,
}

/// A manifest written into a layout.
#[derive(Debug, Clone)]
pub struct Written {
    pub digest: String,
    pub size: u64,
    pub media_type: &'static str,
    pub diff_ids: Vec<String>,
    pub architecture: String,
    /// Compressed bytes of all layers.
    pub layers_size: u64,
}

pub struct Layout {
    dir: PathBuf,
    refs: Vec<serde_json::Value>,
}

fn sha(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

impl Layout {
    pub fn create(dir: &Path) -> std::io::Result<Layout> {
        std::fs::create_dir_all(dir.join("blobs/sha256"))?;
        std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
        Ok(Layout {
            dir: dir.to_owned(),
            refs: Vec::new(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn blob(&self, bytes: &[u8]) -> std::io::Result<(String, u64)> {
        let digest = sha(bytes);
        let path = self.dir.join("blobs/sha256").join(&digest[7..]);
        std::fs::write(path, bytes)?;
        Ok((digest, bytes.len() as u64))
    }

    /// The path of a blob in the layout (to corrupt it, or read it).
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        self.dir
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:"))
    }

    /// Writes an image (layers, config, manifest) and returns its manifest.
    pub fn image(
        &mut self,
        layers: &[Layer],
        env: &[&str],
        architecture: &str,
    ) -> std::io::Result<Written> {
        let mut descriptors = Vec::new();
        let mut diff_ids = Vec::new();
        let mut layers_size = 0;
        for layer in layers {
            let tar = layer_tar(&layer.entries)?;
            diff_ids.push(sha(&tar));
            let (bytes, media_type) = match layer.compression {
                Compression::None => (tar, "application/vnd.oci.image.layer.v1.tar"),
                Compression::Gzip => {
                    let mut enc =
                        flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                    enc.write_all(&tar)?;
                    (enc.finish()?, "application/vnd.oci.image.layer.v1.tar+gzip")
                }
                Compression::Zstd => (
                    zstd::stream::encode_all(&tar[..], 3)?,
                    "application/vnd.oci.image.layer.v1.tar+zstd",
                ),
            };
            let (digest, size) = self.blob(&bytes)?;
            layers_size += size;
            descriptors
                .push(serde_json::json!({"mediaType": media_type, "digest": digest, "size": size}));
        }
        let config = serde_json::json!({
            "architecture": architecture,
            "os": "linux",
            "config": {"Env": env, "WorkingDir": "/srv", "User": "nobody"},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        });
        let (config_digest, config_size) = self.blob(&serde_json::to_vec(&config)?)?;
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config_size},
            "layers": descriptors,
        });
        let (digest, size) = self.blob(&serde_json::to_vec(&manifest)?)?;
        Ok(Written {
            digest,
            size,
            media_type: OCI_MANIFEST,
            diff_ids,
            architecture: architecture.to_owned(),
            layers_size,
        })
    }

    /// Writes an image index over `manifests` (each with its platform).
    pub fn index(&mut self, manifests: &[&Written]) -> std::io::Result<Written> {
        let entries: Vec<serde_json::Value> = manifests
            .iter()
            .map(|m| {
                serde_json::json!({
                    "mediaType": m.media_type, "digest": m.digest, "size": m.size,
                    "platform": {"architecture": m.architecture, "os": "linux"},
                })
            })
            .collect();
        let index =
            serde_json::json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries});
        let (digest, size) = self.blob(&serde_json::to_vec(&index)?)?;
        Ok(Written {
            digest,
            size,
            media_type: OCI_INDEX,
            diff_ids: Vec::new(),
            architecture: String::new(),
            layers_size: manifests.iter().map(|m| m.layers_size).sum(),
        })
    }

    /// Names `written` as `name` in the layout's `index.json` (`oci:DIR:name` for skopeo).
    pub fn tag(&mut self, name: &str, written: &Written) -> std::io::Result<()> {
        self.refs
            .retain(|r| r["annotations"]["org.opencontainers.image.ref.name"] != name);
        self.refs.push(serde_json::json!({
            "mediaType": written.media_type, "digest": written.digest, "size": written.size,
            "annotations": {"org.opencontainers.image.ref.name": name},
        }));
        let index = serde_json::json!({"schemaVersion": 2, "manifests": self.refs});
        std::fs::write(self.dir.join("index.json"), serde_json::to_vec(&index)?)
    }
}

fn layer_tar(entries: &[Entry]) -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for entry in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(1_700_000_000);
        h.set_uid(0);
        h.set_gid(0);
        match entry {
            Entry::File {
                path,
                contents,
                mode,
            } => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(*mode);
                h.set_size(contents.len() as u64);
                builder.append_data(&mut h, path, &contents[..])?;
            }
            Entry::Dir { path } => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
                builder.append_data(&mut h, path, std::io::empty())?;
            }
            Entry::Whiteout { path } => {
                let p = Path::new(path);
                let name = format!(
                    ".wh.{}",
                    p.file_name().and_then(|n| n.to_str()).unwrap_or_default()
                );
                let full = p.parent().map_or(PathBuf::from(&name), |d| d.join(&name));
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(0o600);
                h.set_size(0);
                builder.append_data(&mut h, full, std::io::empty())?;
            }
        }
    }
    builder.into_inner()
}
