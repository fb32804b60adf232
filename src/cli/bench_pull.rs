//! `strata bench pull`: a cold pull of a multi-layer image from a registry on loopback (Debian's
//! docker-registry) into a fresh node, next to the baseline `skopeo copy docker://… oci:DIR`
//! followed by `tar -x` of each layer in order, in the same run; then a warm pull (every layer
//! present: one manifest request).

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use rand::{Rng, SeedableRng};
use strata::domain::image_ref::ImageRef;
use strata::registry::layout::{Entry, Layer, Layout};
use strata::registry::local::LocalRegistry;
use strata::registry::manifest::Compression;
use strata::registry::{Puller, RegistrySettings};
use strata::vmm::LocalBlobStore;

#[derive(Debug, Args)]
pub struct BenchPullArgs {
    /// Uncompressed size of the image, in MiB (gzip brings it to about two thirds).
    #[arg(long, default_value_t = 300)]
    size_mib: usize,
    /// Layers of the image.
    #[arg(long, default_value_t = 7)]
    layers: usize,
    /// Cold pulls of each kind (alternating); the median is reported.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Where the registry, the layouts and the nodes live (default: the system temp dir).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
}

/// Files of 64 KiB to 4 MiB, each a mix of random bytes and repeated text, so that gzip shrinks
/// the layer about as much as it shrinks a typical distribution image.
fn layer_entries(rng: &mut rand::rngs::StdRng, index: usize, bytes: usize) -> Vec<Entry> {
    let mut entries = vec![Entry::Dir {
        path: format!("l{index}"),
    }];
    let mut left = bytes;
    let mut n = 0;
    while left > 0 {
        let size = rng.gen_range(64 << 10..4 << 20).min(left);
        let mut contents = vec![0u8; size];
        let random = size * 2 / 3;
        rng.fill(&mut contents[..random]);
        for (i, b) in contents[random..].iter_mut().enumerate() {
            *b = b"strata layer text, repeated to compress\n"[i % 40];
        }
        entries.push(Entry::File {
            path: format!("l{index}/f{n:05}"),
            contents,
            mode: 0o644,
        });
        left -= size;
        n += 1;
    }
    entries
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn baseline(addr: &str, work: &Path) -> anyhow::Result<Duration> {
    let oci = work.join(format!("skopeo-{}", uuid::Uuid::new_v4().simple()));
    let rootfs = oci.with_extension("rootfs");
    std::fs::create_dir_all(&rootfs)?;
    let started = Instant::now();
    let out = Command::new("skopeo")
        .args(["copy", "--quiet", "--src-tls-verify=false"])
        .arg(format!("docker://{addr}/bench/image:1"))
        .arg(format!("oci:{}:img", oci.display()))
        .output()
        .context("running skopeo (install it with scripts/setup.sh)")?;
    if !out.status.success() {
        bail!(
            "skopeo copy failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let index: serde_json::Value = serde_json::from_slice(&std::fs::read(oci.join("index.json"))?)?;
    let blob = |d: &str| {
        oci.join("blobs/sha256")
            .join(d.trim_start_matches("sha256:"))
    };
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(blob(
        index["manifests"][0]["digest"].as_str().unwrap_or_default(),
    ))?)?;
    for layer in manifest["layers"].as_array().cloned().unwrap_or_default() {
        let status = Command::new("tar")
            .arg("-x")
            .arg("-f")
            .arg(blob(layer["digest"].as_str().unwrap_or_default()))
            .arg("-C")
            .arg(&rootfs)
            .status()?;
        if !status.success() {
            bail!("tar -x of a layer failed");
        }
    }
    let took = started.elapsed();
    let _ = std::fs::remove_dir_all(&oci);
    let _ = std::fs::remove_dir_all(&rootfs);
    Ok(took)
}

pub async fn run(args: BenchPullArgs) -> anyhow::Result<()> {
    let base = match &args.dir {
        Some(d) => tempfile::tempdir_in(d)?,
        None => tempfile::tempdir()?,
    };
    let work = base.path();
    let layers = args.layers.max(1);
    let per_layer = (args.size_mib << 20) / layers;
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let mut layout = Layout::create(&work.join("layout"))?;
    let spec: Vec<Layer> = (0..layers)
        .map(|i| Layer {
            entries: layer_entries(&mut rng, i, per_layer),
            compression: Compression::Gzip,
        })
        .collect();
    let image = layout.image(
        &spec,
        &["PATH=/usr/bin:/bin"],
        &strata::registry::manifest::node_platform().architecture,
    )?;
    drop(spec);
    layout.tag("img", &image)?;
    let registry = LocalRegistry::start(&work.join("registry"), None)?;
    registry.push(layout.dir(), "img", "bench/image:1", false)?;
    println!(
        "image: {} layers, {} MiB uncompressed, {:.1} MiB compressed, from docker-registry on {}",
        layers,
        args.size_mib,
        image.layers_size as f64 / (1 << 20) as f64,
        registry.addr
    );
    let reference = ImageRef::parse(&format!("{}/bench/image:1", registry.addr))?;

    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    let mut last_node = None;
    for round in 0..args.repeat.max(1) {
        let node = work.join(format!("node-{round}"));
        let blobs = Arc::new(LocalBlobStore::open(node.join("blobs"))?);
        let puller = Puller::new(
            &node,
            strata::vmm::LayerCache::open(node.join("layers"), Default::default())?,
            blobs,
            // The benchmark's registry is on loopback: listed, as an operator would.
            RegistrySettings {
                insecure: vec![registry.addr.clone()],
                ..Default::default()
            },
        )?;
        let started = Instant::now();
        let (pulled, stats) = puller.pull(&reference, None, None).await?;
        ours.push(started.elapsed());
        if stats.layers_downloaded != layers {
            bail!(
                "a cold pull downloaded {} of {layers} layers",
                stats.layers_downloaded
            );
        }
        theirs.push(baseline(&registry.addr, work)?);
        if let Some((old, _)) = last_node.replace((node, puller)) {
            let _ = std::fs::remove_dir_all(old);
        }
        drop(pulled);
    }
    let (_, puller) = last_node.expect("at least one round");
    let started = Instant::now();
    let (_, warm) = puller.pull(&reference, None, None).await?;
    let warm_time = started.elapsed();

    let (ours, theirs) = (median(ours), median(theirs));
    let mib = image.layers_size as f64 / (1 << 20) as f64;
    println!(
        "cold pull, strata:                       {:>8.2} s  {:>7.1} MiB/s (compressed)",
        ours.as_secs_f64(),
        mib / ours.as_secs_f64()
    );
    println!(
        "cold pull, skopeo copy + tar -x (base):  {:>8.2} s  {:>7.1} MiB/s (compressed)",
        theirs.as_secs_f64(),
        mib / theirs.as_secs_f64()
    );
    println!(
        "ratio strata / baseline:                 {:>8.2}  (median of {})",
        ours.as_secs_f64() / theirs.as_secs_f64(),
        args.repeat.max(1)
    );
    println!(
        "warm pull, strata:                       {:>8.1} ms  {} request(s), {} layers downloaded",
        warm_time.as_secs_f64() * 1e3,
        warm.requests,
        warm.layers_downloaded
    );
    Ok(())
}
