//! `strata image`: the node's local image catalog.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use strata::domain::image_ref::ImageRef;
use strata::registry::{BasicAuth, Puller};
use strata::vmm::image::{self, ImageCatalog};
use strata::vmm::{BlobStore, NamespaceBackend, NamespaceConfig};

use super::progress::Progress;

#[derive(Debug, Args)]
pub struct ImageArgs {
    /// Node-local data directory (blobs, layers, images).
    #[arg(
        long,
        env = "STRATA_DATA_DIR",
        default_value = "/var/lib/strata",
        global = true
    )]
    data_dir: PathBuf,
    /// The blob store the images' layers go to and come from (see `strata api --help`); unset:
    /// `<data-dir>/blobs`. Each node keeps its own catalog, naming blobs in the shared store.
    #[arg(long, env = "STRATA_BLOB_URL", global = true)]
    blob_url: Option<String>,
    /// Host ids of sandbox users (see `strata worker --help`).
    #[arg(long, env = "STRATA_SANDBOX_ID_RANGE", default_value_t = Default::default(), global = true, value_name = "BASE[:65536]")]
    sandbox_id_range: strata::vmm::id_range::IdRange,
    #[command(flatten)]
    sandbox_network: strata::config::SandboxNetworkArgs,
    #[command(flatten)]
    sandbox_disk: strata::config::SandboxDiskArgs,
    #[command(subcommand)]
    command: ImageCommand,
}

#[derive(Debug, Subcommand)]
enum ImageCommand {
    /// Build the built-in base images that are missing: busybox, debian:bookworm, e2bdev/base.
    BuildBase {
        /// Only build the busybox base (seconds, no debootstrap).
        #[arg(long)]
        busybox_only: bool,
        /// Debian mirror for debootstrap. Default: the one this machine's apt sources name for
        /// the release (`apt-get indextargets`), so the image comes from where the node's own
        /// packages do.
        #[arg(long, env = "STRATA_DEBIAN_MIRROR", value_name = "URL")]
        mirror: Option<String>,
    },
    /// Import an OCI image layout directory or a `docker save` archive.
    Import {
        path: PathBuf,
        #[arg(long)]
        name: String,
    },
    /// Copy the images of another node directory (only read) that this one lacks, blobs checked
    /// against their digests.
    Copy {
        #[arg(long)]
        from: PathBuf,
    },
    /// Pull an image from its registry (as a build would) into the node's layer store.
    Pull {
        /// Image reference, e.g. `debian:stable`, `ghcr.io/org/app:1`, `name@sha256:…`.
        reference: String,
        /// Registry username (the password is read from STRATA_REGISTRY_PASSWORD).
        #[arg(long, env = "STRATA_REGISTRY_USERNAME")]
        username: Option<String>,
        #[arg(
            long,
            env = "STRATA_REGISTRY_PASSWORD",
            hide_env_values = true,
            hide = true
        )]
        password: Option<String>,
        #[command(flatten)]
        registry: strata::config::RegistryArgs,
    },
    /// List images: name, manifest digest, layers, size.
    Ls,
}

/// `sha256:0123456789ab…`, for progress lines.
fn short(digest: &str) -> String {
    format!("{}…", &digest[..digest.len().min(19)])
}

pub async fn run(args: ImageArgs) -> anyhow::Result<()> {
    let data_dir = args.data_dir;
    let blobs = strata::vmm::open_blob_store(args.blob_url.as_deref(), &data_dir)
        .context("opening the blob store (STRATA_BLOB_URL)")?;
    let backend = NamespaceBackend::with_blobs(
        NamespaceConfig {
            data_dir: data_dir.clone(),
            agent_binary: std::env::current_exe().context("locating the strata binary")?,
            depth: Default::default(),
            ids: args.sandbox_id_range,
            network: args.sandbox_network.config()?,
            disk: args.sandbox_disk.config(),
        },
        blobs,
    )
    .context("opening the node's sandbox backend")?;
    let blobs = backend.blobs();
    match args.command {
        ImageCommand::BuildBase {
            busybox_only,
            mirror,
        } => {
            let progress = Progress::for_stderr();
            let total = if busybox_only { 1 } else { 3 };
            progress.stage(1, total, "busybox");
            let (d, b) = (data_dir.clone(), blobs.clone());
            let m = tokio::task::spawn_blocking(move || image::ensure_busybox(&d, b.as_ref()))
                .await??;
            progress.finish_stage(&short(&m.digest().to_string()));
            println!("{}\t{}", m.name, m.digest());
            if !busybox_only {
                progress.stage(
                    2,
                    total,
                    "debian:bookworm (debootstrap; minutes when missing)",
                );
                let (d, b) = (data_dir.clone(), blobs.clone());
                let m = tokio::task::spawn_blocking(move || {
                    image::ensure_debian(&d, b.as_ref(), mirror.as_deref())
                })
                .await??;
                progress.finish_stage(&short(&m.digest().to_string()));
                println!("{}\t{}", m.name, m.digest());
                progress.stage(3, total, "e2bdev/base");
                let m =
                    image::ensure_e2b_base(&data_dir, &backend, blobs.as_ref() as &dyn BlobStore)
                        .await?;
                progress.finish_stage(&short(&m.digest().to_string()));
                println!("{}\t{}", m.name, m.digest());
            }
            progress.finish();
        }
        ImageCommand::Import { path, name } => {
            // Builds find the image by any Docker spelling of this name.
            ImageRef::parse(&name).context("--name must be an image reference")?;
            let d = data_dir.clone();
            let m = tokio::task::spawn_blocking(move || {
                image::import(&path, &name, &d, blobs.as_ref())
            })
            .await??;
            println!("{}\t{}\t{} layers", m.name, m.digest(), m.layers.len());
        }
        ImageCommand::Copy { from } => {
            let d = data_dir.clone();
            let copied =
                tokio::task::spawn_blocking(move || image::copy_images(&from, &d, blobs.as_ref()))
                    .await??;
            for m in copied {
                println!("{}\t{}", m.name, m.digest());
            }
        }
        ImageCommand::Pull {
            reference,
            username,
            password,
            registry,
        } => {
            let parsed = ImageRef::parse(&reference)?;
            // A pull by hand keeps the node's reserve as a build's pull does.
            let mut settings = registry.settings();
            settings.disk_reserve = Some(args.sandbox_disk.node_disk_reserve);
            let puller = Puller::new(&data_dir, backend.layers().clone(), blobs.clone(), settings)?;
            let credentials = match (username, password) {
                (Some(username), Some(password)) => Some(BasicAuth { username, password }),
                (None, None) => None,
                _ => anyhow::bail!("give both --username and STRATA_REGISTRY_PASSWORD, or neither"),
            };
            let started = std::time::Instant::now();
            let line = Progress::for_stderr();
            line.stage(1, 1, &format!("pulling {reference}"));
            let report = line.clone();
            let progress: strata::registry::pull::ProgressFn = std::sync::Arc::new(move |p| {
                report.detail(format!(
                    "layer {}/{}, {} of {}",
                    p.layers_done,
                    p.layers_total,
                    super::progress::bytes(p.bytes_done),
                    super::progress::bytes(p.bytes_total)
                ))
            });
            let pulled = puller.pull(&parsed, credentials, Some(progress)).await;
            let (pulled, stats) = match pulled {
                Ok(done) => {
                    line.finish_stage(&short(&done.0.digest.to_string()));
                    line.finish();
                    done
                }
                Err(e) => {
                    line.finish_stage("failed");
                    line.finish();
                    return Err(e.into());
                }
            };
            println!(
                "{}\t{}\t{} layers\t{} downloaded ({} bytes) in {:.2}s",
                pulled.reference,
                pulled.digest,
                pulled.layers.len(),
                stats.layers_downloaded,
                stats.bytes_downloaded,
                started.elapsed().as_secs_f64()
            );
        }
        ImageCommand::Ls => {
            println!(
                "{:<24} {:<73} {:>6} {:>12}",
                "NAME", "DIGEST", "LAYERS", "SIZE"
            );
            for m in ImageCatalog::open(&data_dir)?.list()? {
                println!(
                    "{:<24} {:<73} {:>6} {:>12}",
                    m.name,
                    m.digest().to_string(),
                    m.layers.len(),
                    m.size()
                );
            }
            let puller = Puller::new(
                &data_dir,
                backend.layers().clone(),
                blobs.clone(),
                Default::default(),
            )?;
            for p in puller.list() {
                println!(
                    "{:<24} {:<73} {:>6} {:>12}",
                    p.reference,
                    p.digest.to_string(),
                    p.layers.len(),
                    p.layers.iter().map(|l| l.size).sum::<u64>()
                );
            }
        }
    }
    Ok(())
}
