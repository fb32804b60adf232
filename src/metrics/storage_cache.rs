//! The node's storage figures, measured at most once per [`MAX_AGE`] however often they are
//! asked for.
//!
//! Measuring walks `blobs/` and `layers/`, which on a busy node is millions of files; a
//! scrape every few seconds (or anyone who can reach `/metrics`) would otherwise keep a
//! blocking thread walking the disk. A request gets the last measurement; when it is older
//! than [`MAX_AGE`], one refresh starts in the background (never two at once) and the next
//! request sees it. Only the very first request of a process waits for a measurement.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use super::storage::{usage, StorageUsage};

/// How old a measurement may be before a request starts a new one.
pub const MAX_AGE: Duration = Duration::from_secs(30);

#[derive(Default)]
struct Entry {
    /// The last measurement; held across the first one, so requests meanwhile wait for it.
    measured: tokio::sync::Mutex<Option<(Instant, Vec<StorageUsage>)>>,
    refreshing: AtomicBool,
}

static CACHE: LazyLock<Mutex<HashMap<PathBuf, Arc<Entry>>>> = LazyLock::new(Default::default);

fn entry(dir: &Path) -> Arc<Entry> {
    let mut all = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    all.entry(dir.to_path_buf()).or_default().clone()
}

async fn measure(dir: PathBuf) -> Vec<StorageUsage> {
    tokio::task::spawn_blocking(move || usage(&dir))
        .await
        .unwrap_or_default()
}

/// The usage under `data_dir`, at most [`MAX_AGE`] old but for a refresh in flight.
pub async fn cached_usage(data_dir: &Path) -> Vec<StorageUsage> {
    cached_usage_within(data_dir, MAX_AGE).await
}

async fn cached_usage_within(data_dir: &Path, max_age: Duration) -> Vec<StorageUsage> {
    let slot = entry(data_dir);
    let mut measured = slot.measured.lock().await;
    let Some((at, last)) = &*measured else {
        let first = measure(data_dir.to_path_buf()).await;
        *measured = Some((Instant::now(), first.clone()));
        return first;
    };
    if at.elapsed() >= max_age && !slot.refreshing.swap(true, Ordering::SeqCst) {
        let (slot, dir) = (slot.clone(), data_dir.to_path_buf());
        tokio::spawn(async move {
            let fresh = measure(dir).await;
            *slot.measured.lock().await = Some((Instant::now(), fresh));
            slot.refreshing.store(false, Ordering::SeqCst);
        });
    }
    last.clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn requests_within_the_age_are_answered_from_one_measurement() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("blobs")).unwrap();
        std::fs::write(dir.path().join("blobs/a"), b"12345").unwrap();
        let first = cached_usage_within(dir.path(), Duration::from_secs(3600)).await;
        assert_eq!(first[0].bytes, 5);
        // More bytes arrive; within the age the figure stays the measured one.
        std::fs::write(dir.path().join("blobs/b"), b"123").unwrap();
        let again = cached_usage_within(dir.path(), Duration::from_secs(3600)).await;
        assert_eq!(again[0].bytes, 5);
        // Past the age a request still answers at once with the last figure and starts one
        // refresh, which a later request sees.
        let stale = cached_usage_within(dir.path(), Duration::ZERO).await;
        assert_eq!(stale[0].bytes, 5);
        let mut seen = 0;
        for _ in 0..100 {
            seen = cached_usage_within(dir.path(), Duration::from_secs(3600)).await[0].bytes;
            if seen == 8 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(seen, 8);
    }
}
