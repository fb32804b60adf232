//! `strata bench sandbox`: sandbox latency and checkpoint
//! cost, each next to a baseline measured in the same run.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use strata::domain::ids::Digest;
use strata::vmm::image;
use strata::vmm::{
    layer, BlobStore, BootSpec, ExecRequest, NamespaceBackend, NamespaceConfig, Network,
    SandboxBackend,
};

#[derive(Debug, Args)]
pub struct BenchSandboxArgs {
    #[arg(long, env = "STRATA_DATA_DIR", default_value = "/var/lib/strata")]
    data_dir: PathBuf,
    /// Runs per latency measurement.
    #[arg(long, default_value_t = 50)]
    runs: usize,
    /// Size of the writable layer for the checkpoint measurement, in MiB.
    #[arg(long, default_value_t = 50)]
    checkpoint_mib: u64,
    /// Rounds of the checkpoint measurement (each: the baselines, then the checkpoint).
    #[arg(long, default_value_t = 5)]
    checkpoint_runs: usize,
    /// Host ids of sandbox users (see `strata worker --help`).
    #[arg(long, env = "STRATA_SANDBOX_ID_RANGE", default_value_t = Default::default(), value_name = "BASE[:65536]")]
    sandbox_id_range: strata::vmm::id_range::IdRange,
    #[command(flatten)]
    sandbox_network: strata::config::SandboxNetworkArgs,
    #[command(flatten)]
    sandbox_disk: strata::config::SandboxDiskArgs,
    /// Size of the download through the sandbox network, in MiB (0 skips it).
    #[arg(long, default_value_t = 200)]
    download_mib: u64,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn spec(layers: Vec<Digest>) -> BootSpec {
    let mut s = BootSpec::new(layers);
    s.limits.network = Network::Egress;
    s
}

pub async fn run(args: BenchSandboxArgs) -> anyhow::Result<()> {
    let backend = NamespaceBackend::new(NamespaceConfig {
        data_dir: args.data_dir.clone(),
        agent_binary: std::env::current_exe().context("locating the strata binary")?,
        depth: Default::default(),
        ids: args.sandbox_id_range,
        network: args.sandbox_network.config()?,
        disk: args.sandbox_disk.config(),
    })?;
    let measured = tokio::select! {
        measured = measure(&args, &backend) => measured,
        _ = super::shutdown_signal() => Err(anyhow::anyhow!("interrupted")),
    };
    backend.shutdown().await;
    nothing_left(&args.data_dir, backend.owner_id()).await?;
    measured
}

/// Fails when a mount or loop device of the owner's sandboxes outlives the bench (ADR 0034):
/// what a benchmark leaves on the host is a bug it found.
async fn nothing_left(data_dir: &std::path::Path, owner: &str) -> anyhow::Result<()> {
    let sandboxes = data_dir.join("sandboxes");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = strata::vmm::namespace::sweep::traces_of(&sandboxes, owner);
        if left.is_empty() {
            println!("left on the host: no mount or loop device of the bench's sandboxes");
            return Ok(());
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "the bench left these on the host (the next start on {} sweeps them): {}",
                data_dir.display(),
                left.join("; ")
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn measure(args: &BenchSandboxArgs, backend: &NamespaceBackend) -> anyhow::Result<()> {
    let blobs = backend.blobs();
    let (d, b) = (args.data_dir.clone(), blobs.clone());
    let base = tokio::task::spawn_blocking(move || image::ensure_busybox(&d, b.as_ref())).await??;
    let base_layers = base.digests();

    // 1. boot + exec `true` + destroy, and the floor under it: the same kernel work done
    // directly (bench_probe.rs) on the same lower directories. One run of each in turn, so
    // that all three see the same machine state: on a shared machine the load moves within a
    // bench, and measuring one after the other skewed the ratios both ways.
    let lowers: Vec<PathBuf> = base_layers
        .iter()
        .rev()
        .map(|d| backend.layers().path(d))
        .collect();
    let scratch = tempfile::tempdir_in(&args.data_dir)?;
    let mut samples = Vec::new();
    let mut phases: [Vec<Duration>; 3] = Default::default();
    let (mut probes, mut syncing_probes) = (Vec::new(), Vec::new());
    for i in 0..args.runs + 2 {
        let t = Instant::now();
        let mut sb = backend.boot(spec(base_layers.clone())).await?;
        let booted = t.elapsed();
        let tx = strata::vmm::OutputSink::discard();
        let out = sb.exec(ExecRequest::shell("true"), tx).await?;
        let executed = t.elapsed();
        sb.destroy().await?;
        anyhow::ensure!(out.success(), "`true` failed: {out:?}");
        if i >= 2 {
            samples.push(t.elapsed());
            phases[0].push(booted);
            phases[1].push(executed - booted);
            phases[2].push(t.elapsed() - executed);
        }
        for volatile in [true, false] {
            let (b, l, s) = (
                backend.clone(),
                lowers.clone(),
                scratch.path().to_path_buf(),
            );
            let e = tokio::task::spawn_blocking(move || {
                super::bench_probe::probe_once(&b, &l, &s, volatile)
            })
            .await??;
            if i >= 2 {
                if volatile {
                    &mut probes
                } else {
                    &mut syncing_probes
                }
                .push(e);
            }
        }
    }
    samples.sort();
    for p in &mut phases {
        p.sort();
    }
    probes.sort();
    syncing_probes.sort();
    let (p50, p99) = (percentile(&samples, 0.5), percentile(&samples, 0.99));
    let (probe50, probe99) = (percentile(&probes, 0.5), percentile(&probes, 0.99));
    println!(
        "boot+exec(true)+destroy, busybox, {} runs: p50 {:.1} ms, p99 {:.1} ms; \
         direct-syscall probe (same mounts): p50 {:.1} ms, p99 {:.1} ms; ratio p50 {:.2}x (p50 over probe p50), p99 {:.2}x (p99 over probe p50)",
        samples.len(),
        ms(p50),
        ms(p99),
        ms(probe50),
        ms(probe99),
        p50.as_secs_f64() / probe50.as_secs_f64(),
        p99.as_secs_f64() / probe50.as_secs_f64(),
    );
    for (name, p) in [("p50", 0.5), ("p99", 0.99)] {
        println!(
            "  phases, {name}: boot {:.1} ms, exec {:.1} ms, destroy {:.1} ms",
            ms(percentile(&phases[0], p)),
            ms(percentile(&phases[1], p)),
            ms(percentile(&phases[2], p)),
        );
    }
    let (sync50, sync99) = (
        percentile(&syncing_probes, 0.5),
        percentile(&syncing_probes, 0.99),
    );
    println!(
        "  the probe with an overlay that syncs its upper filesystem at unmount (strata's mounts before ADR 0018's last change): \
         p50 {:.1} ms, p99 {:.1} ms; ratio p50 {:.2}x, p99 {:.2}x",
        ms(sync50),
        ms(sync99),
        p50.as_secs_f64() / sync50.as_secs_f64(),
        p99.as_secs_f64() / sync50.as_secs_f64(),
    );

    // 2. checkpoint of an N MiB writable layer vs `tar -c DIR | openssl dgst -sha256` of the
    // same directory, in rounds; medians, and the median of each round's own ratio (the disk's
    // load moves between rounds on a shared machine).
    let (mut checkpoints, mut baselines, mut size) = (Vec::new(), Vec::new(), 0);
    let mut durable_baselines = Vec::new();
    let mut round_ratios = Vec::new();
    for _ in 0..args.checkpoint_runs.max(1) {
        let mut sb = backend.boot(spec(base_layers.clone())).await?;
        let tx = strata::vmm::OutputSink::discard();
        let out = sb
            .exec(
                ExecRequest::shell(format!(
                    "mkdir -p /bench && for i in $(seq 1 {n}); do head -c 1048576 /dev/urandom > /bench/f$i; done",
                    n = args.checkpoint_mib
                )),
                tx,
            )
            .await?;
        anyhow::ensure!(out.success(), "filling the writable layer failed: {out:?}");
        // On the sandbox's scratch disk (ADR 0023), else in its directory.
        let dir = args.data_dir.join("sandboxes").join(sb.id());
        let upper = [dir.join("disk/upper-0"), dir.join("upper-0")]
            .into_iter()
            .find(|p| p.exists())
            .context("the sandbox's upper directory is not where strata keeps it")?;
        let t = Instant::now();
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "tar -C '{}' -cf - . | openssl dgst -sha256 >/dev/null",
                upper.display()
            ))
            .status()?;
        baselines.push(t.elapsed());
        anyhow::ensure!(status.success(), "baseline tar | openssl failed");
        // The same, also keeping the tar durably on the data disk, as a sealed blob is kept.
        let kept = args.data_dir.join(format!("bench-tar-{}", sb.id()));
        let t = Instant::now();
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "tar -C '{}' -cf - . | tee '{}' | openssl dgst -sha256 >/dev/null && sync '{}'",
                upper.display(),
                kept.display(),
                kept.display()
            ))
            .status()?;
        durable_baselines.push(t.elapsed());
        let _ = std::fs::remove_file(&kept);
        anyhow::ensure!(
            status.success(),
            "baseline tar | tee | openssl && sync failed"
        );
        let t = Instant::now();
        let layer = sb
            .checkpoint()
            .await?
            .context("the benchmark wrote files, yet the checkpoint sealed no layer")?;
        checkpoints.push(t.elapsed());
        round_ratios.push(
            checkpoints.last().unwrap().as_secs_f64() / baselines.last().unwrap().as_secs_f64(),
        );
        size = layer.size;
        sb.destroy().await?;
    }
    checkpoints.sort();
    baselines.sort();
    durable_baselines.sort();
    round_ratios.sort_by(f64::total_cmp);
    let middle = checkpoints.len() / 2;
    let (checkpoint, baseline) = (checkpoints[middle], baselines[middle]);
    println!(
        "checkpoint of a {} MiB writable layer (median of {}): {:.0} ms (seal + adopt or extract the tree + reboot; layer {} bytes); \
         baseline tar|openssl sha256 of the same dir: {:.0} ms; ratio {:.2}x; median of the rounds' ratios {:.2}x",
        args.checkpoint_mib,
        checkpoints.len(),
        ms(checkpoint),
        size,
        ms(baseline),
        checkpoint.as_secs_f64() / baseline.as_secs_f64(),
        round_ratios[middle]
    );
    println!(
        "  baseline that also keeps the tar durably (tar | tee FILE | openssl sha256 && sync FILE): {:.0} ms; ratio {:.2}x",
        ms(durable_baselines[middle]),
        checkpoint.as_secs_f64() / durable_baselines[middle].as_secs_f64()
    );

    network(args, backend, &base_layers).await?;

    // 3. boot latency by stack depth.
    let scratch = tempfile::tempdir_in(&args.data_dir)?;
    let mut extra = Vec::new();
    for i in 0..63 {
        let dir = scratch.path().join(format!("l{i}"));
        std::fs::create_dir_all(dir.join("layers"))?;
        std::fs::write(
            dir.join("layers").join(format!("file{i}")),
            format!("layer {i}\n"),
        )?;
        extra.push(
            layer::seal_dir(
                &dir,
                blobs.as_ref() as &dyn BlobStore,
                strata::vmm::id_range::Owners::AsSandbox,
            )?
            .digest,
        );
    }
    for depth in [1usize, 16, 64] {
        let mut stack = base_layers.clone();
        stack.extend(extra.iter().take(depth - 1).cloned());
        let mut samples = Vec::new();
        for i in 0..args.runs + 1 {
            let t = Instant::now();
            let sb = backend.boot(spec(stack.clone())).await?;
            let e = t.elapsed();
            sb.destroy().await?;
            if i >= 1 {
                samples.push(e);
            }
        }
        samples.sort();
        println!(
            "boot on {depth:>2} layers: p50 {:.1} ms, p99 {:.1} ms",
            ms(percentile(&samples, 0.5)),
            ms(percentile(&samples, 0.99))
        );
    }
    Ok(())
}

/// Part 4, what the sandbox network costs: boot+exec+destroy with a link against loopback
/// only, interleaved; and a download from an outside host of the bench's own (a network
/// namespace on this machine) through the sandbox's link and NAT, against the same download
/// by the same client (busybox `nc`) in the host's namespace.
async fn network(
    args: &BenchSandboxArgs,
    backend: &NamespaceBackend,
    base_layers: &[Digest],
) -> anyhow::Result<()> {
    let mut with_link = Vec::new();
    let mut loopback_only = Vec::new();
    for i in 0..args.runs + 2 {
        for network in [Network::Egress, Network::None] {
            let mut s = spec(base_layers.to_vec());
            s.limits.network = network;
            let t = Instant::now();
            let mut sb = backend.boot(s).await?;
            let tx = strata::vmm::OutputSink::discard();
            let out = sb.exec(ExecRequest::shell("true"), tx).await?;
            sb.destroy().await?;
            anyhow::ensure!(out.success(), "`true` failed: {out:?}");
            if i >= 2 {
                match network {
                    Network::Egress => &mut with_link,
                    Network::None => &mut loopback_only,
                }
                .push(t.elapsed());
            }
        }
    }
    with_link.sort();
    loopback_only.sort();
    let (l50, l99) = (percentile(&with_link, 0.5), percentile(&with_link, 0.99));
    let (n50, n99) = (
        percentile(&loopback_only, 0.5),
        percentile(&loopback_only, 0.99),
    );
    println!(
        "boot+exec(true)+destroy with the sandbox's link (egress policy): p50 {:.1} ms, p99 {:.1} ms; \
         loopback only: p50 {:.1} ms, p99 {:.1} ms; ratio p50 {:.2}x, p99 {:.2}x",
        ms(l50),
        ms(l99),
        ms(n50),
        ms(n99),
        l50.as_secs_f64() / n50.as_secs_f64(),
        l99.as_secs_f64() / n99.as_secs_f64(),
    );
    if args.download_mib == 0 {
        return Ok(());
    }

    let world = strata::vmm::namespace::outside::OutsideWorld::new(
        "10.254.0.0/16".parse()?,
        "sbo",
        "/run/strata/bench-outside",
    )?;
    let mib = args.download_mib;
    let listener = world.inside(|| std::net::TcpListener::bind((world.ip, 0)))?;
    let port = listener.local_addr()?.port();
    std::thread::spawn(move || {
        let chunk = vec![0u8; 1 << 20];
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            std::thread::spawn({
                let chunk = chunk.clone();
                move || {
                    use std::io::Write;
                    for _ in 0..mib {
                        if conn.write_all(&chunk).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    let mut config = args.sandbox_network.config()?;
    config
        .policy
        .allow
        .push(strata::domain::egress_policy::AllowRule {
            net: world.net,
            ports: None,
        });
    let reaching = NamespaceBackend::new(NamespaceConfig {
        data_dir: args.data_dir.clone(),
        agent_binary: std::env::current_exe()?,
        depth: Default::default(),
        ids: args.sandbox_id_range,
        network: config,
        disk: args.sandbox_disk.config(),
    })?;
    // Whatever ends the downloads, the second backend is shut down and checked too.
    let downloaded = download(backend, &reaching, base_layers, &world.ip, port).await;
    reaching.shutdown().await;
    nothing_left(&args.data_dir, reaching.owner_id()).await?;
    let (mut inside, mut host) = downloaded?;
    inside.sort();
    host.sort();
    let rate = |d: Duration| mib as f64 / d.as_secs_f64();
    println!(
        "download of {mib} MiB from an outside host (median of 3): through the sandbox's link {:.0} MiB/s; \
         the host's namespace, same client {:.0} MiB/s; ratio {:.2}x",
        rate(inside[1]),
        rate(host[1]),
        rate(inside[1]) / rate(host[1]),
    );
    Ok(())
}

/// Three downloads from the outside host, through a sandbox on `reaching` and from the host's
/// own namespace with the same busybox client: their times, in that order.
async fn download(
    backend: &NamespaceBackend,
    reaching: &NamespaceBackend,
    base_layers: &[Digest],
    ip: &impl std::fmt::Display,
    port: u16,
) -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
    let busybox = base_layers
        .iter()
        .map(|d| backend.layers().path(d).join("bin/busybox"))
        .find(|p| p.exists())
        .context("the busybox base has no bin/busybox")?;
    let fetch = format!("nc {ip} {port} > /dev/null");
    let mut sb = reaching.boot(spec(base_layers.to_vec())).await?;
    let (mut inside, mut host) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        let tx = strata::vmm::OutputSink::discard();
        let t = Instant::now();
        let out = sb.exec(ExecRequest::shell(fetch.clone()), tx).await?;
        inside.push(t.elapsed());
        anyhow::ensure!(out.success(), "the download in the sandbox failed: {out:?}");
        let t = Instant::now();
        let status = std::process::Command::new(&busybox)
            .args(["sh", "-c", &format!("{} {fetch}", busybox.display())])
            .stdin(std::process::Stdio::null())
            .status()?;
        host.push(t.elapsed());
        anyhow::ensure!(
            status.success(),
            "the download in the host namespace failed"
        );
    }
    sb.destroy().await?;
    Ok((inside, host))
}
