//! `strata bench blobs`: what durability and verification cost on the paths that decide on a
//! blob or an extracted layer, each next to the plain path (no fsync, presence only) measured in
//! the same run on the same filesystem.
//!
//! * put: hash + write + fsync + rename + directory fsync, against hash + write + link;
//! * cache probe of a present layer: `intact_size` (a stat once verified in this process; a
//!   full hash the first time) against a plain stat;
//! * layer extraction: extract + syncfs + rename + mark, against extract + rename.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use strata::vmm::archive_policy::{self, ArchivePolicy};
use strata::vmm::id_range::{IdRange, Owners};
use strata::vmm::{BlobStore, LayerCache, LocalBlobStore};

#[derive(Debug, Args)]
pub struct BenchBlobsArgs {
    /// Where the scratch store lives (its filesystem is what is measured).
    #[arg(long, env = "STRATA_DATA_DIR", default_value = "/var/lib/strata")]
    data_dir: PathBuf,
    /// Size of the blob and of the layer, in MiB.
    #[arg(long, default_value_t = 50)]
    mib: usize,
    /// Repetitions of each measurement (the median is printed).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Files in the layer (the blob's bytes spread over them).
    #[arg(long, default_value_t = 1000)]
    files: usize,
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn line(what: &str, new: Duration, plain: Duration, plain_what: &str) {
    println!(
        "{what}: {:.3} ms; plain path ({plain_what}): {:.3} ms; ratio {:.2}x",
        ms(new),
        ms(plain),
        new.as_secs_f64() / plain.as_secs_f64().max(1e-9)
    );
}

/// Pseudo-random bytes (xorshift), so nothing compresses or deduplicates.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

pub async fn run(args: BenchBlobsArgs) -> anyhow::Result<()> {
    tokio::task::spawn_blocking(move || run_blocking(args)).await?
}

fn run_blocking(args: BenchBlobsArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.data_dir)?;
    let scratch = tempfile::tempdir_in(&args.data_dir)?;
    let store = LocalBlobStore::open(scratch.path().join("blobs"))?;
    let len = args.mib << 20;
    let runs = args.runs.max(1);
    println!(
        "blobs of {} MiB, median of {runs}, in {}",
        args.mib,
        scratch.path().display()
    );

    // 1. put.
    let (mut new, mut plain) = (Vec::new(), Vec::new());
    for i in 0..runs {
        let bytes = noise(len, 2 * i as u64 + 1);
        let t = Instant::now();
        store.put_bytes(&bytes)?;
        new.push(t.elapsed());
        let bytes = noise(len, 2 * i as u64 + 2);
        let t = Instant::now();
        let digest = strata::domain::ids::Digest::of(&bytes);
        let mut tmp = tempfile::NamedTempFile::new_in(store.staging_dir())?;
        tmp.write_all(&bytes)?;
        let _ = std::fs::hard_link(tmp.path(), scratch.path().join(digest.hex()));
        plain.push(t.elapsed());
    }
    line(
        "put (hash, write, fsync, rename, dir fsync)",
        median(new),
        median(plain),
        "hash, write, link",
    );

    // 2. cache probe of one present layer.
    let (digest, _) = store.put_bytes(&noise(len, 99))?;
    let cold_store = || LocalBlobStore::open(scratch.path().join("blobs"));
    let (mut warm, mut cold, mut stat) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let fresh = cold_store()?;
        let t = Instant::now();
        fresh.intact_size(&digest)?;
        cold.push(t.elapsed());
        let t = Instant::now();
        fresh.intact_size(&digest)?;
        warm.push(t.elapsed());
        let t = Instant::now();
        fresh.size(&digest)?;
        stat.push(t.elapsed());
    }
    let stat = median(stat);
    line(
        "probe, verified earlier in this process (stat + identity)",
        median(warm),
        stat,
        "stat",
    );
    line(
        "probe, first in this process (full sha256)",
        median(cold),
        stat,
        "stat",
    );

    // 3. layer extraction: a tar of `files` files carrying `mib` MiB.
    let src = scratch.path().join("src");
    std::fs::create_dir_all(&src)?;
    let per_file = (len / args.files.max(1)).max(1);
    for i in 0..args.files.max(1) {
        std::fs::write(src.join(format!("f{i}")), noise(per_file, 1000 + i as u64))?;
    }
    let layer = strata::vmm::layer::seal_dir(&src, &store, Owners::AsSandbox)?;
    let (mut new, mut plain) = (Vec::new(), Vec::new());
    for i in 0..runs {
        let cache = LayerCache::open(
            scratch.path().join(format!("layers-{i}")),
            IdRange::default(),
        )?;
        let t = Instant::now();
        cache.ensure(&store, &layer.digest)?;
        new.push(t.elapsed());
        let dir = scratch.path().join(format!("plain-{i}"));
        let tmp = scratch.path().join(format!("plain-tmp-{i}"));
        let t = Instant::now();
        std::fs::create_dir(&tmp)?;
        let mut reader = store.open_verified(&layer.digest)?;
        archive_policy::extract_tar(
            &mut reader,
            &tmp,
            &ArchivePolicy::layer_for(IdRange::default()),
        )?;
        reader.finish()?;
        std::fs::rename(&tmp, &dir)?;
        plain.push(t.elapsed());
    }
    line(
        &format!(
            "layer extraction, {} files (extract, syncfs, rename, mark)",
            args.files
        ),
        median(new),
        median(plain),
        "extract, rename",
    );
    let cache = LayerCache::open(scratch.path().join("layers-0"), IdRange::default())?;
    let (mut marked, mut is_dir) = (Vec::new(), Vec::new());
    for _ in 0..runs.max(100) {
        let t = Instant::now();
        cache.ensure(&store, &layer.digest)?;
        marked.push(t.elapsed());
        let t = Instant::now();
        let _ = cache.path(&layer.digest).is_dir();
        is_dir.push(t.elapsed());
    }
    line(
        "extracted layer lookup (tree and mark)",
        median(marked),
        median(is_dir),
        "is_dir",
    );
    Ok(())
}
