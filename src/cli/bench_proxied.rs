//! The proxied-request figure of `strata bench sandbox-api`: a small GET to a sandbox's port
//! through host routing (the API, the node's agent, into the sandbox's namespace) against the
//! same GET sent straight into the sandbox's network namespace, in the same run, alternating.
//!
//! Each request opens a connection of its own on both paths (busybox `httpd` closes after each
//! answer), and runs on a blocking thread: the direct one on a thread that joined the
//! sandbox's namespace once, so it pays no `setns` per request.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// The sandbox the timing script left serving, as it printed it.
#[derive(Debug, serde::Deserialize)]
pub struct Served {
    pub id: String,
    pub host: String,
    /// A word in the server's command line, to find its process on the host.
    pub marker: String,
}

/// Seconds per request, per path.
pub struct Figures {
    pub direct: Vec<f64>,
    pub proxied: Vec<f64>,
}

/// The host pid of the process serving `served` (its command line holds the marker).
fn server_pid(served: &Served) -> anyhow::Result<u32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        for entry in std::fs::read_dir("/proc")?.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let is_httpd = args.iter().any(|a| a.ends_with(b"httpd"));
            if is_httpd && args.contains(&served.marker.as_bytes()) {
                return Ok(pid);
            }
        }
        if Instant::now() > deadline {
            bail!("no process on this host serves sandbox {} ({} in its command line): is the bench on the node that runs it?", served.id, served.marker);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One GET of `/` naming `host`, over `stream`; its duration from `started`.
fn get(mut stream: TcpStream, host: &str, started: Instant) -> anyhow::Result<f64> {
    stream.set_nodelay(true)?;
    write!(
        stream,
        "GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = Vec::with_capacity(512);
    stream.read_to_end(&mut answer)?;
    let elapsed = started.elapsed().as_secs_f64();
    if !answer.starts_with(b"HTTP/1.") || !answer.windows(4).any(|w| w == b" 200") {
        bail!(
            "the page did not answer 200: {}",
            String::from_utf8_lossy(&answer[..answer.len().min(300)])
        );
    }
    Ok(elapsed)
}

/// `n` GETs straight to port 8080 in the namespace `netns`, from one thread that joined it.
fn direct(netns: &std::fs::File, host: &str, n: usize) -> anyhow::Result<Vec<f64>> {
    strata::vmm::port_door::in_network_namespace(netns.as_fd(), || {
        (0..n)
            .map(|_| {
                let started = Instant::now();
                get(
                    TcpStream::connect((Ipv4Addr::LOCALHOST, 8080))?,
                    host,
                    started,
                )
            })
            .collect::<anyhow::Result<Vec<f64>>>()
    })
    .context("joining the sandbox's network namespace")?
}

/// `n` GETs through the API at `api`, by host name.
fn proxied(api: SocketAddr, host: &str, n: usize) -> anyhow::Result<Vec<f64>> {
    (0..n)
        .map(|_| {
            let started = Instant::now();
            get(TcpStream::connect(api)?, host, started)
        })
        .collect()
}

/// `requests` GETs on each path (after a few unrecorded ones), in two alternating rounds.
pub fn measure(api: SocketAddr, served: &Served, requests: usize) -> anyhow::Result<Figures> {
    let pid = server_pid(served)?;
    let netns = std::fs::File::open(format!("/proc/{pid}/ns/net"))
        .with_context(|| format!("opening the network namespace of pid {pid}"))?;
    direct(&netns, &served.host, 20)?;
    proxied(api, &served.host, 20)?;
    let half = requests.div_ceil(2);
    let mut figures = Figures {
        direct: Vec::new(),
        proxied: Vec::new(),
    };
    for _ in 0..2 {
        figures.direct.extend(direct(&netns, &served.host, half)?);
        figures.proxied.extend(proxied(api, &served.host, half)?);
    }
    Ok(figures)
}

/// Requests per second of sequential requests that took `times`.
pub fn rate(times: &[f64]) -> f64 {
    times.len() as f64 / times.iter().sum::<f64>()
}
