//! How a build node behaves: its identity, its lease, its concurrency and its timeouts.

use std::path::PathBuf;
use std::time::Duration;

/// Settings of one build node. The command line fills them from
/// [`crate::config::BuildNodeArgs`]; tests set them directly.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// Recorded as the attempt's node and as the actor of every event.
    pub node_id: String,
    /// Node data directory: blobs, layers, images, sandboxes.
    pub data_dir: PathBuf,
    /// `STRATA_BLOB_URL`: the shared blob store; `None` is `<data_dir>/blobs`.
    pub blob_url: Option<String>,
    /// Budget of the node's extracted-layer cache in bytes; `None` is unbounded.
    pub layer_cache_bytes: Option<u64>,
    /// The strata binary, started inside sandboxes as their init and agent.
    pub agent_binary: PathBuf,
    /// The host ids sandbox users are (`STRATA_SANDBOX_ID_RANGE`).
    pub sandbox_ids: crate::vmm::id_range::IdRange,
    /// What sandboxes may reach (`STRATA_SANDBOX_EGRESS*`).
    pub sandbox_network: crate::vmm::NetworkConfig,
    /// Each sandbox's disk limit and the node's reserve (ADR 0023).
    pub sandbox_disk: crate::vmm::namespace::scratch::DiskConfig,
    /// How long an attempt holds a build without renewal; renewed every third of it.
    pub lease: Duration,
    /// Builds this node runs at once.
    pub max_builds: usize,
    /// How long finalization waits for the ready command to succeed.
    pub ready_timeout: Duration,
    /// How long one RUN may take.
    pub step_timeout: Duration,
    /// Most bytes of command output stored per build (`STRATA_BUILD_LOG_MAX_BYTES`).
    pub build_log_max_bytes: u64,
    /// Most lines of command output stored per build (`STRATA_BUILD_LOG_MAX_LINES`).
    pub build_log_max_lines: u64,
    /// How often the queue is polled when no NOTIFY arrives.
    pub poll_interval: Duration,
    /// The sandbox stack's depth limit. Builds plan their checkpoints within it: steps past the
    /// per-build budget run without a checkpoint instead of failing.
    pub depth: crate::vmm::depth::DepthBudget,
    /// Mirrors, insecure registries and the size ceiling for base-image pulls.
    pub registry: crate::registry::RegistrySettings,
    /// Opens the registry credentials builds bring; without it such builds fail at `base`.
    pub credential_seal: Option<crate::registry::sealed::CredentialSeal>,
    /// How long a queued build is left to a node holding more of its layers before this node
    /// takes it anyway (ADR 0020); zero turns cache-aware placement off (the queue's order).
    pub placement_wait: Duration,
    /// How often this node reports its layer residency when nothing changed; its residency
    /// stops counting three of these after its last report.
    pub residency_heartbeat: Duration,
    /// What one team may hold; a node reads the running-build limit (ADR 0024).
    pub team_limits: crate::domain::team_limits::TeamLimits,
    /// Launched sandboxes this node runs at once; 0 runs none (a build-only node).
    pub max_sandboxes: usize,
    /// The most one launched sandbox may write (`STRATA_SANDBOX_DISK_MAX`).
    pub sandbox_disk_max: u64,
    /// Where the node's sandbox agent listens, and the URL the API reaches it at (`None`:
    /// `http://` + the bound address).
    pub agent_listen: std::net::SocketAddr,
    pub agent_url: Option<String>,
}

impl WorkerSettings {
    pub fn new(
        node_id: impl Into<String>,
        data_dir: impl Into<PathBuf>,
        agent_binary: impl Into<PathBuf>,
    ) -> Self {
        WorkerSettings {
            node_id: node_id.into(),
            data_dir: data_dir.into(),
            blob_url: None,
            layer_cache_bytes: None,
            agent_binary: agent_binary.into(),
            sandbox_ids: Default::default(),
            sandbox_network: Default::default(),
            sandbox_disk: Default::default(),
            lease: Duration::from_secs(30),
            max_builds: 2,
            ready_timeout: Duration::from_secs(120),
            step_timeout: Duration::from_secs(3600),
            build_log_max_bytes: 64 << 20,
            build_log_max_lines: 100_000,
            poll_interval: Duration::from_secs(2),
            depth: Default::default(),
            registry: Default::default(),
            credential_seal: None,
            placement_wait: Duration::from_secs(5),
            residency_heartbeat: Duration::from_secs(5),
            team_limits: crate::domain::team_limits::TeamLimits::DEFAULT,
            max_sandboxes: 32,
            sandbox_disk_max: 2 << 30,
            agent_listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            agent_url: None,
        }
    }

    /// Time between lease renewals: a third of the lease, so two renewals may fail in a row
    /// before the lease passes.
    pub fn renew_every(&self) -> Duration {
        self.lease / 3
    }

    /// How long one residency report keeps counting: three heartbeats, so one lost report
    /// does not make a live node look gone.
    pub fn residency_ttl(&self) -> Duration {
        self.residency_heartbeat * 3
    }

    /// What one build stores of its commands' output.
    pub fn build_log_limits(&self) -> crate::worker::build_log::OutputLimits {
        crate::worker::build_log::OutputLimits {
            bytes: self.build_log_max_bytes,
            lines: self.build_log_max_lines,
        }
    }
}

impl WorkerSettings {
    /// The node's settings from its command-line flags (`strata worker`, `strata up`).
    pub fn from_args(
        args: &crate::config::BuildNodeArgs,
        node_id: String,
        data_dir: PathBuf,
        agent_binary: PathBuf,
    ) -> WorkerSettings {
        let mut s = WorkerSettings::new(node_id, data_dir, agent_binary);
        s.lease = Duration::from_secs(args.lease_secs.max(1));
        s.max_builds = args.max_builds.max(1);
        s.ready_timeout = Duration::from_secs(args.ready_timeout_secs);
        s.step_timeout = Duration::from_secs(args.step_timeout_secs);
        s.build_log_max_bytes = args.build_log_max_bytes;
        s.build_log_max_lines = args.build_log_max_lines;
        s.poll_interval = Duration::from_millis(args.queue_poll_ms.max(50));
        s.layer_cache_bytes = args.layer_cache_bytes;
        s.placement_wait = Duration::from_millis(args.placement_wait_ms);
        s.registry = args.registry.settings();
        s.max_sandboxes = args.max_sandboxes;
        s.sandbox_disk_max = args.sandbox_disk_max;
        s.agent_listen = args.agent_listen;
        s.agent_url = args.agent_url.clone();
        s
    }
}
