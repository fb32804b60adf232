//! `GET /metrics`: what one sandbox uses now, in envd's words (`SANDBOX-PROTOCOL.md` §7.4).
//! The control plane's `GET /sandboxes/{id}/metrics` (the SDK's `get_metrics`) asks for it.
//!
//! CPU is a rate, so the sandbox's cgroup is read twice, [`CPU_WINDOW`] apart: the share of
//! its cores it used in between. Memory and disk are levels now; a total the sandbox has no
//! limit for is the node's.

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use serde::Serialize;

use super::server::Authorized;
use crate::vmm::Usage;

/// Between the two CPU readings.
pub const CPU_WINDOW: Duration = Duration::from_millis(200);

/// envd's `/metrics` body, as the agent sends it and the control plane reads it.
#[derive(Debug, Serialize, serde::Deserialize, PartialEq)]
pub struct Metrics {
    /// Unix seconds of the second reading.
    pub ts: i64,
    pub cpu_count: f64,
    pub cpu_used_pct: f64,
    pub mem_total: u64,
    pub mem_used: u64,
    pub mem_cache: u64,
    pub mem_total_mib: u64,
    pub mem_used_mib: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

/// The body from two readings `elapsed` apart; `node_memory` stands in for a memory limit the
/// sandbox does not have (pure, for the tests).
pub fn metrics(
    first: &Usage,
    second: &Usage,
    elapsed: Duration,
    node_memory: u64,
    ts: i64,
) -> Metrics {
    let window_usec = elapsed.as_micros().max(1) as f64;
    let used = second.cpu_usec.saturating_sub(first.cpu_usec) as f64;
    let cores = second.cpu_count.max(0.01);
    let pct = (used / (window_usec * cores) * 100.0).clamp(0.0, 100.0);
    let mem_total = match second.memory_limit_bytes {
        0 => node_memory,
        limit => limit,
    };
    Metrics {
        ts,
        cpu_count: second.cpu_count,
        cpu_used_pct: (pct * 100.0).round() / 100.0,
        mem_total,
        mem_used: second.memory_bytes,
        mem_cache: second.memory_cache_bytes,
        mem_total_mib: mem_total >> 20,
        mem_used_mib: second.memory_bytes >> 20,
        disk_used: second.disk_bytes,
        disk_total: second.disk_limit_bytes,
    }
}

/// The node's memory (`MemTotal` of `/proc/meminfo`), 0 when unreadable.
fn node_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib << 10)
}

/// One reading, off the runtime's threads: it reads cgroup files and the sandbox's disk.
async fn read(sandbox: &std::sync::Arc<super::agent::LiveSandbox>) -> Option<Usage> {
    let sandbox = sandbox.clone();
    tokio::task::spawn_blocking(move || sandbox.with(|s| Ok(s.usage())).ok().flatten())
        .await
        .ok()
        .flatten()
}

pub async fn serve(Authorized(sandbox): Authorized) -> Response {
    let Some(first) = read(&sandbox).await else {
        return (
            StatusCode::NOT_IMPLEMENTED,
            "this sandbox's backend reports no usage",
        )
            .into_response();
    };
    let started = Instant::now();
    tokio::time::sleep(CPU_WINDOW).await;
    let Some(second) = read(&sandbox).await else {
        return super::server::not_found_response(&sandbox.id);
    };
    let body = metrics(
        &first,
        &second,
        started.elapsed(),
        node_memory(),
        chrono::Utc::now().timestamp(),
    );
    Json(body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_is_the_share_of_its_cores_used_between_the_readings() {
        let first = Usage {
            cpu_usec: 1_000_000,
            cpu_count: 2.0,
            ..Usage::default()
        };
        let second = Usage {
            cpu_usec: 1_200_000,
            cpu_count: 2.0,
            memory_bytes: 64 << 20,
            memory_limit_bytes: 512 << 20,
            disk_bytes: 10,
            disk_limit_bytes: 1 << 30,
            ..Usage::default()
        };
        // 0.2 s of CPU in 0.2 s on 2 cores: half of them.
        let m = metrics(&first, &second, Duration::from_millis(200), 8 << 30, 7);
        assert_eq!(m.cpu_used_pct, 50.0);
        assert_eq!((m.mem_total_mib, m.mem_used_mib), (512, 64));
        assert_eq!((m.disk_used, m.disk_total, m.ts), (10, 1 << 30, 7));
        // No limit of its own: the node's memory.
        let unlimited = Usage {
            memory_limit_bytes: 0,
            ..second
        };
        assert_eq!(
            metrics(&first, &unlimited, Duration::from_millis(200), 8 << 30, 7).mem_total,
            8 << 30
        );
    }
}
