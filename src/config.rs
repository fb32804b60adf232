//! Configuration shared by the subcommands, in one place: every setting is a flag with an
//! environment-variable twin, and `strata <command> --help` shows them all.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

/// Where state lives: the database and the node-local data directory.
#[derive(Debug, Clone, Args)]
pub struct StorageArgs {
    /// Postgres connection URL. Unset: `strata up` creates and starts a local cluster in
    /// `<data-dir>/postgres`, and the other commands use that cluster while it runs.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,

    /// Node-local data directory: blob store, extracted layers, images, embedded Postgres.
    #[arg(long, env = "STRATA_DATA_DIR", default_value = "/var/lib/strata")]
    pub data_dir: PathBuf,

    /// Where blobs (layers, images, uploaded contexts) live: `file:///path`, or
    /// `s3://bucket/prefix` configured by the standard `AWS_*` variables (`AWS_ENDPOINT` and
    /// `AWS_ALLOW_HTTP` for S3-compatible servers). Unset: `<data-dir>/blobs`, one node only.
    #[arg(long, env = "STRATA_BLOB_URL")]
    pub blob_url: Option<String>,

    /// Host ids of sandbox users: sandbox uid/gid `n` (0–65535) is host id `BASE + n`, so a
    /// build step's root is nobody on the host. The node's extracted layers are written for
    /// this range; a data directory keeps the range it was first used with.
    #[arg(long, env = "STRATA_SANDBOX_ID_RANGE", default_value_t = crate::vmm::id_range::IdRange::default(), value_name = "BASE[:65536]")]
    pub sandbox_id_range: crate::vmm::id_range::IdRange,

    #[command(flatten)]
    pub sandbox_network: SandboxNetworkArgs,

    #[command(flatten)]
    pub sandbox_disk: SandboxDiskArgs,

    #[command(flatten)]
    pub team_limits: TeamLimitArgs,

    /// A scrape of `/metrics` (the API's, and `--metrics-listen`'s) must present
    /// `Authorization: Bearer <token>`; unset, `/metrics` is open to whoever reaches it.
    #[arg(long, env = "STRATA_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<String>,

    /// Maximum connections in this process's Postgres pool.
    #[arg(long, env = "STRATA_DB_POOL_SIZE", default_value_t = 16)]
    pub db_pool_size: u32,
}

/// How much a sandbox may write, and what the node keeps free (ADR 0023).
#[derive(Debug, Clone, Args)]
pub struct SandboxDiskArgs {
    /// Most bytes one build (or `template exec`) may write, its layers included: each sandbox
    /// writes to its own filesystem of this size (`20GiB`, `500MB`, bytes), and a step past it
    /// fails saying so. `none`: sandboxes write to the data disk, unbounded.
    #[arg(long, env = "STRATA_BUILD_DISK_MAX", default_value = "20GiB", value_parser = parse_disk_max, value_name = "SIZE|none")]
    pub build_disk_max: SizeLimit,

    /// Free space on the data disk that no sandbox is ever granted (the blob store, layers and,
    /// under `strata up`, Postgres live there). A sandbox that cannot get what it needs beyond
    /// it does not boot.
    #[arg(long, env = "STRATA_NODE_DISK_RESERVE", default_value = "4GiB", value_parser = parse_bytes)]
    pub node_disk_reserve: u64,
}

/// `STRATA_BUILD_DISK_MAX`: a size of at least the smallest sandbox disk, or no bound.
fn parse_disk_max(text: &str) -> Result<SizeLimit, String> {
    match parse_size_limit(text)?.0 {
        Some(n) if n < crate::vmm::namespace::scratch::FLOOR => Err(format!(
            "{text:?} is below the smallest sandbox disk, 64MiB"
        )),
        n => Ok(SizeLimit(n)),
    }
}

impl SandboxDiskArgs {
    pub fn config(&self) -> crate::vmm::namespace::scratch::DiskConfig {
        crate::vmm::namespace::scratch::DiskConfig {
            max: self.build_disk_max.0,
            reserve: self.node_disk_reserve,
        }
    }
}

/// What one team may hold at once (ADR 0024). Each is a count or `none`. Every API replica
/// and build node should be given the same values: the API holds teams to the queued, upload
/// and step limits, the build nodes to the running one.
#[derive(Debug, Clone, Args)]
pub struct TeamLimitArgs {
    /// Builds of one team running at once, across all nodes; its further builds stay queued,
    /// and other teams' builds are taken first.
    #[arg(long, env = "STRATA_TEAM_MAX_RUNNING_BUILDS", default_value_t = Limit(crate::domain::team_limits::TeamLimits::DEFAULT.running_builds), value_name = "N|none")]
    pub team_max_running_builds: Limit,

    /// Builds of one team registered and not yet running (waiting for uploads, or queued);
    /// a registration past it gets a 429.
    #[arg(long, env = "STRATA_TEAM_MAX_QUEUED_BUILDS", default_value_t = Limit(crate::domain::team_limits::TeamLimits::DEFAULT.queued_builds), value_name = "N|none")]
    pub team_max_queued_builds: Limit,

    /// Upload links of one team's waiting builds not yet used; a link past it gets a 429.
    #[arg(long, env = "STRATA_TEAM_MAX_PENDING_UPLOADS", default_value_t = Limit(crate::domain::team_limits::TeamLimits::DEFAULT.pending_uploads), value_name = "N|none")]
    pub team_max_pending_uploads: Limit,

    /// Steps one build may have; a start with more gets a 400.
    #[arg(long, env = "STRATA_BUILD_MAX_STEPS", default_value_t = Limit(crate::domain::team_limits::TeamLimits::DEFAULT.steps_per_build), value_name = "N|none")]
    pub build_max_steps: Limit,

    /// Bytes one team's uploaded context archives may take in the blob store, each distinct
    /// archive once (`50GiB`, `500MB`, bytes, or none); an upload that would pass it gets a
    /// 413 before a byte of it is stored. Garbage collection frees room.
    #[arg(long, env = "STRATA_TEAM_MAX_STORED_UPLOADS", default_value = "50GiB", value_parser = parse_size_limit, value_name = "SIZE|none")]
    pub team_max_stored_uploads: SizeLimit,
}

impl TeamLimitArgs {
    pub fn limits(&self) -> crate::domain::team_limits::TeamLimits {
        crate::domain::team_limits::TeamLimits {
            running_builds: self.team_max_running_builds.0,
            queued_builds: self.team_max_queued_builds.0,
            pending_uploads: self.team_max_pending_uploads.0,
            steps_per_build: self.build_max_steps.0,
            stored_upload_bytes: self.team_max_stored_uploads.0,
        }
    }
}

/// A count limit, or `none` for no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit(pub Option<u32>);

impl std::str::FromStr for Limit {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim() {
            "none" => Ok(Limit(None)),
            t => t
                .parse()
                .map(|n| Limit(Some(n)))
                .map_err(|_| format!("{text:?} is not a limit; write a count such as 8, or none")),
        }
    }
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(n) => write!(f, "{n}"),
            None => f.write_str("none"),
        }
    }
}

/// A size limit, or `none` for no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizeLimit(pub Option<u64>);

fn parse_size_limit(text: &str) -> Result<SizeLimit, String> {
    match text.trim() {
        "none" => Ok(SizeLimit(None)),
        t => parse_bytes(t).map(|n| SizeLimit(Some(n))),
    }
}

/// What sandboxes (build steps, `template exec`) may reach over the network (ADR 0022).
#[derive(Debug, Clone, Args)]
pub struct SandboxNetworkArgs {
    /// `public`: each sandbox has its own network with the public internet, never the node,
    /// its private networks (RFC 1918, link-local, CGNAT, ULA), loopback or other sandboxes.
    /// `none`: loopback only, no DNS.
    #[arg(
        long,
        env = "STRATA_SANDBOX_EGRESS",
        default_value = "public",
        value_name = "public|none"
    )]
    pub sandbox_egress: crate::domain::egress_policy::EgressMode,

    /// Exceptions to the denied ranges, comma-separated `CIDR[:PORT[-PORT]]` (TCP and UDP;
    /// without ports, everything): a package mirror on the LAN is `10.1.2.3:3142`. The node's
    /// own addresses are reachable only through an exception that names the address alone
    /// (`a.b.c.d` or `a.b.c.d/32`); a wider range never opens the node.
    #[arg(
        long,
        env = "STRATA_SANDBOX_EGRESS_ALLOW",
        default_value = "",
        value_name = "CIDR[:PORT],..."
    )]
    pub sandbox_egress_allow: String,

    /// Most connections one sandbox may have open through its link at once (TCP and UDP flows,
    /// counted in the host's connection-tracking table); one more is refused at once with
    /// "no route to host" until one of them ends.
    #[arg(
        long,
        env = "STRATA_SANDBOX_MAX_CONNECTIONS",
        default_value_t = crate::domain::egress_policy::EgressPolicy::DEFAULT_MAX_CONNECTIONS,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub sandbox_max_connections: u32,

    /// Resolvers sandboxes are given, comma-separated IPv4 addresses (port 53 to them is
    /// allowed). Default: the host's `resolv.conf`'s, loopback stubs left out.
    #[arg(long, env = "STRATA_SANDBOX_DNS", value_name = "IP,...")]
    pub sandbox_dns: Option<String>,

    /// Where sandbox links take their addresses (a /30 each); must not overlap the host's
    /// networks.
    #[arg(long, env = "STRATA_SANDBOX_SUBNET", default_value = crate::vmm::NetworkConfig::DEFAULT_SUBNET)]
    pub sandbox_subnet: crate::domain::egress_policy::Ipv4Net,
}

impl SandboxNetworkArgs {
    /// The node's network settings, with the host's resolvers unless some are named.
    pub fn config(
        &self,
    ) -> Result<crate::vmm::NetworkConfig, crate::domain::egress_policy::EgressError> {
        use crate::domain::egress_policy::EgressPolicy;
        let policy = EgressPolicy {
            mode: self.sandbox_egress,
            allow: EgressPolicy::parse_allow(&self.sandbox_egress_allow)?,
            dns: match &self.sandbox_dns {
                Some(list) => EgressPolicy::parse_dns(list)?,
                None => Vec::new(),
            },
            max_connections: self.sandbox_max_connections,
        };
        Ok(crate::vmm::NetworkConfig::with_host_resolvers(
            policy,
            self.sandbox_subnet,
        ))
    }
}

/// Settings of the HTTP server.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address the API listens on.
    #[arg(long, env = "STRATA_LISTEN", default_value = "127.0.0.1:3000")]
    pub listen: SocketAddr,

    /// Token operators present as `Authorization: Bearer <token>` on `/admin/*`. Without one,
    /// the operator API answers 503 (it is never open).
    #[arg(long, env = "STRATA_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// Base URL clients use to reach this server, for links the server hands out (upload URLs).
    /// Defaults to `http://<listen>`.
    #[arg(long, env = "STRATA_PUBLIC_URL")]
    pub public_url: Option<String>,

    /// Key that signs upload URLs (at least 32 bytes). Every API replica needs the same one.
    /// Unset: a random key is created once in `<data-dir>/upload-secret` and reused.
    #[arg(long, env = "STRATA_UPLOAD_SECRET", hide_env_values = true)]
    pub upload_secret: Option<String>,

    /// Largest context archive one upload URL accepts, in bytes.
    #[arg(long, env = "STRATA_UPLOAD_MAX_BYTES", default_value_t = 2 << 30)]
    pub upload_max_bytes: u64,

    /// How long an upload URL stays valid, in seconds.
    #[arg(long, env = "STRATA_UPLOAD_URL_TTL", default_value_t = 900)]
    pub upload_url_ttl_secs: u64,

    /// Longest pause in an upload body, in seconds: a client that sends nothing for this long
    /// is cut off (408) and the URL may be used again.
    #[arg(long, env = "STRATA_UPLOAD_IDLE_TIMEOUT_SECS", default_value_t = 30)]
    pub upload_idle_timeout_secs: u64,

    /// Uploads this API process receives at once; one more answers 503 with `Retry-After`.
    /// Each holds two threads of the blocking pool, which `strata up`'s worker shares.
    #[arg(long, env = "STRATA_UPLOAD_MAX_CONCURRENT", default_value_t = 64)]
    pub upload_max_concurrent: usize,

    /// Longest a build status request waits for news (a log line, another status) before it
    /// answers "nothing new", in milliseconds; 0 answers at once. Well under the SDKs' request
    /// timeout.
    #[arg(long, env = "STRATA_STATUS_HOLD_MS", default_value_t = 1500)]
    pub status_hold_ms: u64,

    /// Status requests this API process holds at once; one more answers at once.
    #[arg(long, env = "STRATA_STATUS_MAX_HELD", default_value_t = 1024)]
    pub status_max_held: usize,

    /// Longest `Sandbox.create` waits for a node to run the sandbox (boot, start and ready
    /// commands) before it ends it and answers 503.
    #[arg(long, env = "STRATA_SANDBOX_START_TIMEOUT_SECS", default_value_t = 30)]
    pub sandbox_start_timeout_secs: u64,

    /// The `domain` sandbox creates and connects answer: the SDK reaches a sandbox at
    /// `<port>-<id>.<domain>` when it has no `E2B_SANDBOX_URL`. Unset: the host of the public
    /// URL (never null, or the SDK would send its traffic to E2B's cloud).
    #[arg(long, env = "STRATA_SANDBOX_DOMAIN")]
    pub sandbox_domain: Option<String>,

    /// Where to serve the API over TLS for `*.<domain>` as well (`0.0.0.0:443`: the SDK
    /// reaches envd at `https://49983-<id>.<domain>` with no port). Needs
    /// STRATA_SANDBOX_TLS_CERT and STRATA_SANDBOX_TLS_KEY; DNS for `*.<domain>` is the
    /// operator's.
    #[arg(long, env = "STRATA_SANDBOX_TLS_LISTEN", requires_all = ["sandbox_tls_cert", "sandbox_tls_key"])]
    pub sandbox_tls_listen: Option<SocketAddr>,

    /// PEM certificate chain for `*.<domain>` (the leaf first).
    #[arg(long, env = "STRATA_SANDBOX_TLS_CERT", value_name = "PEM")]
    pub sandbox_tls_cert: Option<std::path::PathBuf>,

    /// PEM private key of that certificate.
    #[arg(long, env = "STRATA_SANDBOX_TLS_KEY", value_name = "PEM")]
    pub sandbox_tls_key: Option<std::path::PathBuf>,

    /// How long a registered build waits for its uploads and start before it expires, in seconds.
    #[arg(long, env = "STRATA_BUILD_WAITING_TIMEOUT", default_value_t = 3600)]
    pub build_waiting_timeout_secs: u64,

    /// How long a started build may wait for a worker before it fails, in seconds.
    #[arg(long, env = "STRATA_BUILD_QUEUE_TIMEOUT", default_value_t = 3600)]
    pub build_queue_timeout_secs: u64,

    /// Most CPUs one build may ask for (`cpuCount`); a registration above it gets a 400.
    #[arg(long, env = "STRATA_BUILD_CPU_MAX", default_value_t = crate::domain::build_spec::Ceilings::DEFAULT.cpu_count)]
    pub build_cpu_max: u32,

    /// Most memory one build may ask for (`memoryMB`), in MiB; a registration above it gets a
    /// 400.
    #[arg(long, env = "STRATA_BUILD_MEMORY_MAX", default_value_t = crate::domain::build_spec::Ceilings::DEFAULT.memory_mb)]
    pub build_memory_max_mb: u32,

    /// The execution cache's mode for every build this API starts: `steps` (checkpoint after
    /// each mutating step, resume from the deepest), `final` (only the final result is cached;
    /// a build is one capture) or `off` (nothing read or written). A build keeps the mode it
    /// was started with; a value that is not a mode is skipped with a line in the build log.
    #[arg(long, env = "STRATA_CACHE_MODE")]
    pub cache_mode: Option<String>,
    /// The sandbox backend builds and launched sandboxes run on unless a team or template pin
    /// says otherwise (`strata settings pin ... sandbox.backend=…`): `namespace`, the only one
    /// today. An unknown value is skipped, and the build log says so.
    #[arg(long, env = "STRATA_SANDBOX_BACKEND")]
    pub sandbox_backend: Option<String>,
}

/// Identity of this process in event metadata and logs.
#[derive(Debug, Clone, Args)]
pub struct NodeArgs {
    /// Node id recorded as the actor of every event this process appends. Defaults to the
    /// hostname.
    #[arg(long, env = "STRATA_NODE_ID")]
    pub node_id: Option<String>,
}

impl NodeArgs {
    pub fn node_id(&self) -> String {
        self.node_id.clone().unwrap_or_else(|| {
            rustix::system::uname()
                .nodename()
                .to_string_lossy()
                .into_owned()
        })
    }
}

impl ServeArgs {
    pub fn public_url(&self) -> String {
        self.public_url
            .clone()
            .unwrap_or_else(|| format!("http://{}", self.listen))
            .trim_end_matches('/')
            .to_string()
    }
}

/// Settings of a build node (`strata worker`, and the worker inside `strata up`).
#[derive(Debug, Clone, Args)]
pub struct BuildNodeArgs {
    /// How long an attempt holds a build without renewing its lease; renewed every third of it.
    #[arg(long, env = "STRATA_LEASE_SECS", default_value_t = 30)]
    pub lease_secs: u64,

    /// Builds this node runs at once.
    #[arg(long, env = "STRATA_MAX_BUILDS", default_value_t = 2)]
    pub max_builds: usize,

    /// How long finalization waits for a template's ready command to succeed.
    #[arg(long, env = "STRATA_READY_TIMEOUT_SECS", default_value_t = 120)]
    pub ready_timeout_secs: u64,

    /// How long one RUN step may take.
    #[arg(long, env = "STRATA_STEP_TIMEOUT_SECS", default_value_t = 3600)]
    pub step_timeout_secs: u64,

    /// Most bytes of command output one build stores (and the SDK shows); past it the commands
    /// run on and one line says the rest was not kept.
    #[arg(long, env = "STRATA_BUILD_LOG_MAX_BYTES", default_value_t = 64 << 20)]
    pub build_log_max_bytes: u64,

    /// Most lines of command output one build stores: each is a row, so a flood of short lines
    /// is capped by count as long ones are by bytes.
    #[arg(long, env = "STRATA_BUILD_LOG_MAX_LINES", default_value_t = 100_000)]
    pub build_log_max_lines: u64,

    /// Most bytes of extracted layers this node keeps in `<data-dir>/layers`; past it, the
    /// least recently used layers no running sandbox mounts are removed (and extracted again
    /// from the blob store when next needed). Unset: unbounded.
    #[arg(long, env = "STRATA_LAYER_CACHE_BYTES")]
    pub layer_cache_bytes: Option<u64>,

    /// How often the build queue is polled when no notification arrives.
    #[arg(long, env = "STRATA_QUEUE_POLL_MS", default_value_t = 2000)]
    pub queue_poll_ms: u64,

    /// Cache-aware placement: how long a queued build is left to a live node that holds more
    /// of its layers (its deepest cached checkpoint, or its base) before any node takes it.
    /// 0: no preference, the queue's order.
    #[arg(long, env = "STRATA_PLACEMENT_WAIT_MS", default_value_t = 5000)]
    pub placement_wait_ms: u64,

    /// Launched sandboxes this node runs at once (the SDK's `Sandbox.create`).
    #[arg(long, env = "STRATA_MAX_SANDBOXES", default_value_t = 32)]
    pub max_sandboxes: usize,

    /// The most one launched sandbox may write (its share of the node's disk, under
    /// STRATA_BUILD_DISK_MAX): `2GiB`, `500MB`, bytes.
    #[arg(long, env = "STRATA_SANDBOX_DISK_MAX", default_value = "2GiB", value_parser = parse_bytes)]
    pub sandbox_disk_max: u64,

    /// Where this node's sandbox agent listens: the API forwards the SDK's envd traffic
    /// (commands, files) here. Port 0 picks a free one.
    #[arg(long, env = "STRATA_AGENT_LISTEN", default_value = "127.0.0.1:0")]
    pub agent_listen: std::net::SocketAddr,

    /// The URL the API reaches this node's agent at, when it is not the listen address (a
    /// node on another host: `http://10.0.0.7:49983`).
    #[arg(long, env = "STRATA_AGENT_URL")]
    pub agent_url: Option<String>,

    #[command(flatten)]
    pub registry: RegistryArgs,
}

/// Garbage collection of the blob store (the `gc` reconciler, `strata gc`, `strata storage`).
#[derive(Debug, Clone, Args)]
pub struct GcArgs {
    /// Total size the blob store should stay under (`20GiB`, `500MB`, bytes). Past it, GC
    /// deletes unreferenced objects cheapest-to-rebuild first; never a live result. Unset: only
    /// the keep and grace rules apply.
    #[arg(long, env = "STRATA_STORAGE_BUDGET", value_parser = parse_bytes)]
    pub storage_budget: Option<u64>,

    /// Cache entries, superseded results and uploads unused this long are deleted whatever the
    /// budget (`7d`, `12h`, `30m`, `45s`).
    #[arg(long, env = "STRATA_GC_KEEP", default_value = "7d", value_parser = parse_duration)]
    pub gc_keep: chrono::Duration,

    /// Nothing written or used more recently than this is deleted.
    #[arg(long, env = "STRATA_GC_GRACE", default_value = "1h", value_parser = parse_duration)]
    pub gc_grace: chrono::Duration,

    /// Cached final results kept per template before older ones count as surplus.
    #[arg(long, env = "STRATA_GC_FINALS_PER_TEMPLATE", default_value_t = 3)]
    pub gc_finals_per_template: usize,

    /// When GC passes run: a cron expression with six fields, seconds first; `off` runs none
    /// (then only `strata gc` deletes).
    #[arg(long, env = "STRATA_GC_SCHEDULE", default_value = "0 */10 * * * *")]
    pub gc_schedule: String,
}

impl GcArgs {
    /// The GC reconciler's schedule; `None` when it is `off`.
    pub fn schedule(
        &self,
    ) -> Result<Option<crate::reconcilers::Schedule>, crate::reconcilers::ReconcileError> {
        if self.gc_schedule.trim() == "off" {
            return Ok(None);
        }
        crate::reconcilers::Schedule::parse(&self.gc_schedule).map(Some)
    }

    pub fn policy(&self) -> crate::reconcilers::gc::GcPolicy {
        crate::reconcilers::gc::GcPolicy {
            budget: self.storage_budget,
            keep: self.gc_keep,
            grace: self.gc_grace,
            finals_per_template: self.gc_finals_per_template,
            ..Default::default()
        }
    }
}

/// A size in bytes: a number with an optional unit (`B`, `KB`/`MB`/`GB`/`TB` in powers of
/// 1000, `KiB`/`MiB`/`GiB`/`TiB` in powers of 1024; `K`/`M`/`G`/`T` are the binary ones).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size; write e.g. 20GiB, 500MB or 1048576"))?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        other => {
            return Err(format!(
                "unknown size unit {other:?} in {text:?}; use B, MB, MiB, GB, GiB, ..."
            ))
        }
    };
    number
        .checked_mul(scale)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// A duration: a number with a unit `s`, `m`, `h` or `d`.
pub fn parse_duration(text: &str) -> Result<chrono::Duration, String> {
    let t = text.trim();
    let invalid = || format!("{text:?} is not a duration; write e.g. 45s, 30m, 12h or 7d");
    let unit = t.chars().last().ok_or_else(invalid)?;
    let number: i64 = t[..t.len() - unit.len_utf8()]
        .parse()
        .map_err(|_| invalid())?;
    match unit {
        's' => Ok(chrono::Duration::seconds(number)),
        'm' => Ok(chrono::Duration::minutes(number)),
        'h' => Ok(chrono::Duration::hours(number)),
        'd' => Ok(chrono::Duration::days(number)),
        _ => Err(invalid()),
    }
}

/// How base images are pulled from OCI registries.
#[derive(Debug, Clone, Default, Args)]
pub struct RegistryArgs {
    /// Registry mirrors, comma-separated `registry=url` (e.g. `docker.io=http://127.0.0.1:5000`).
    /// A mirrored registry is reached only through its mirror.
    #[arg(long = "registry-mirror", env = "STRATA_REGISTRY_MIRRORS", value_delimiter = ',', value_parser = parse_mirror)]
    pub registry_mirrors: Vec<(String, String)>,

    /// Registry hosts reached over plain HTTP, comma-separated (loopback hosts always are).
    #[arg(
        long = "insecure-registry",
        env = "STRATA_INSECURE_REGISTRIES",
        value_delimiter = ','
    )]
    pub insecure_registries: Vec<String>,

    /// Largest image a pull accepts, in compressed bytes of its layers (`10GiB`, `500MB`,
    /// bytes), counted as they arrive (a layer that declares no size counts too); `none`: no
    /// ceiling.
    #[arg(long, env = "STRATA_PULL_MAX_BYTES", default_value = "10GiB", value_parser = parse_size_or_none, value_name = "SIZE|none")]
    pub pull_max_bytes: SizeOrNone,

    /// Most bytes one image's layers may expand to on the node's disk, together, counted as
    /// they stream (`none`: no ceiling of its own; the node's disk reserve still holds).
    #[arg(long, env = "STRATA_PULL_MAX_EXPANDED_BYTES", default_value = "64GiB", value_parser = parse_size_or_none, value_name = "SIZE|none")]
    pub pull_max_expanded_bytes: SizeOrNone,

    /// Most files, directories and links one image's layers may hold, together, counted as
    /// they stream (`none`: no ceiling of its own; the node keeps the share of its inodes
    /// that its disk reserve is of its bytes either way).
    #[arg(long, env = "STRATA_PULL_MAX_ENTRIES", default_value = "8000000", value_parser = parse_count_or_none, value_name = "COUNT|none")]
    pub pull_max_entries: CountOrNone,
}

/// A count, or `none` for no bound.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CountOrNone(pub Option<u64>);

fn parse_count_or_none(text: &str) -> Result<CountOrNone, String> {
    match text.trim() {
        "none" => Ok(CountOrNone(None)),
        t => t
            .replace('_', "")
            .parse::<u64>()
            .map(|n| CountOrNone(Some(n)))
            .map_err(|_| format!("`{t}` is not a count: a whole number, or `none`")),
    }
}

/// A size, or `none` for no bound (the default of a value built in code).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SizeOrNone(pub Option<u64>);

fn parse_size_or_none(text: &str) -> Result<SizeOrNone, String> {
    match text.trim() {
        "none" => Ok(SizeOrNone(None)),
        t => parse_bytes(t).map(|n| SizeOrNone(Some(n))),
    }
}

fn parse_mirror(text: &str) -> Result<(String, String), String> {
    let s = crate::registry::RegistrySettings::parse(Some(text), None, None)
        .map_err(|e| e.to_string())?;
    s.mirrors
        .into_iter()
        .next()
        .ok_or_else(|| format!("registry mirror {text:?} is empty"))
}

impl RegistryArgs {
    pub fn settings(&self) -> crate::registry::RegistrySettings {
        crate::registry::RegistrySettings {
            mirrors: self.registry_mirrors.iter().cloned().collect(),
            insecure: self
                .insecure_registries
                .iter()
                .map(|h| h.trim().to_owned())
                .filter(|h| !h.is_empty())
                .collect(),
            max_bytes: self.pull_max_bytes.0,
            // The build node sets it from STRATA_BUILD_DISK_MAX (`cli/worker.rs`).
            max_layer_bytes: None,
            max_expanded_bytes: self.pull_max_expanded_bytes.0,
            max_entries: self.pull_max_entries.0,
            // Set by the processes that keep a node's disk, from STRATA_NODE_DISK_RESERVE.
            disk_reserve: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_decimal_and_binary_units_and_refuse_the_rest() {
        assert_eq!(parse_bytes("1048576"), Ok(1 << 20));
        assert_eq!(parse_bytes("20GiB"), Ok(20 << 30));
        assert_eq!(parse_bytes("20G"), Ok(20 << 30));
        assert_eq!(parse_bytes("500MB"), Ok(500_000_000));
        assert_eq!(parse_bytes("3 kb"), Ok(3_000));
        assert!(parse_bytes("lots").unwrap_err().contains("not a size"));
        assert!(parse_bytes("5PB")
            .unwrap_err()
            .contains("unknown size unit"));
        assert!(parse_bytes("99999999999T")
            .unwrap_err()
            .contains("too large"));
    }

    #[test]
    fn durations_parse_with_a_unit_and_refuse_the_rest() {
        assert_eq!(parse_duration("45s"), Ok(chrono::Duration::seconds(45)));
        assert_eq!(parse_duration("30m"), Ok(chrono::Duration::minutes(30)));
        assert_eq!(parse_duration("7d"), Ok(chrono::Duration::days(7)));
        assert!(parse_duration("7").is_err());
        assert!(parse_duration("7w").is_err());
        assert!(parse_duration("").is_err());
    }
}
