//! Wakes feed subscribers after appends commit, with `NOTIFY strata_events`.
//!
//! The NOTIFY is sent after COMMIT, from a background task, not inside the appending
//! transaction: a transaction that notifies takes a cluster-wide lock at COMMIT and keeps it
//! until its commit record is flushed, which serializes all appends (measured: half the
//! throughput). Here an append only records its streams and signals a channel of capacity one;
//! the task sends one NOTIFY per burst of appends, in its own transaction that writes nothing. A
//! notification lost with a crashing process is covered by the subscribers' polling.
//!
//! The payload names the streams the burst appended to, one per line ([`streams_of`]), so a
//! listener that waits on one stream (a held status request) wakes only for it. A burst whose
//! names do not fit in one notification says [`ANY_STREAM`] instead.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, OnceLock};

use sqlx::PgPool;
use tokio::sync::mpsc;

use super::feed::EVENTS_CHANNEL;

/// The payload of a notification that may concern any stream.
pub const ANY_STREAM: &str = "*";

/// Postgres refuses payloads of 8000 bytes or more.
const MAX_PAYLOAD: usize = 7900;

/// The streams a notification's payload names; `None` when it may concern any stream (an
/// overflowing burst, or a process of an earlier version that sent no names).
pub fn streams_of(payload: &str) -> Option<impl Iterator<Item = &str>> {
    (!payload.is_empty() && payload != ANY_STREAM).then(|| payload.lines())
}

/// Shared by the clones of one [`EventStore`](super::EventStore); the background task ends when
/// the last clone is dropped.
#[derive(Debug, Default)]
pub(crate) struct Notifier {
    wake: OnceLock<mpsc::Sender<()>>,
    pending: Arc<Mutex<Pending>>,
}

/// Streams appended to since the last NOTIFY.
#[derive(Debug, Default)]
struct Pending {
    streams: BTreeSet<String>,
    bytes: usize,
    overflow: bool,
}

impl Pending {
    fn add(&mut self, stream: &str) {
        if self.overflow || self.streams.contains(stream) {
            return;
        }
        if self.bytes + stream.len() + 1 > MAX_PAYLOAD {
            self.overflow = true;
            self.streams.clear();
            return;
        }
        self.bytes += stream.len() + 1;
        self.streams.insert(stream.to_owned());
    }

    fn take_payload(&mut self) -> String {
        let taken = std::mem::take(self);
        if taken.overflow {
            return ANY_STREAM.to_owned();
        }
        taken.streams.into_iter().collect::<Vec<_>>().join("\n")
    }
}

impl Notifier {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Asks for a NOTIFY naming `streams` soon. Never waits; folds into a pending one.
    pub(crate) fn appended<'a>(&self, pool: &PgPool, streams: impl IntoIterator<Item = &'a str>) {
        {
            let mut pending = self.pending.lock().expect("notifier lock");
            for stream in streams {
                pending.add(stream);
            }
        }
        let wake = self.wake.get_or_init(|| {
            let (tx, rx) = mpsc::channel(1);
            tokio::spawn(send_notifications(pool.clone(), rx, self.pending.clone()));
            tx
        });
        let _ = wake.try_send(());
    }
}

async fn send_notifications(
    pool: PgPool,
    mut wake: mpsc::Receiver<()>,
    pending: Arc<Mutex<Pending>>,
) {
    while wake.recv().await.is_some() {
        let payload = pending.lock().expect("notifier lock").take_payload();
        if let Err(err) = sqlx::query("SELECT pg_notify($1, $2)")
            .bind(EVENTS_CHANNEL)
            .bind(&payload)
            .execute(&pool)
            .await
        {
            tracing::debug!(error = %err, "sending the feed wake-up failed; subscribers will poll");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_names_each_stream_once_and_an_overflow_names_any() {
        let mut pending = Pending::default();
        pending.add("build-a");
        pending.add("template-t");
        pending.add("build-a");
        let payload = pending.take_payload();
        assert_eq!(payload, "build-a\ntemplate-t");
        assert_eq!(
            streams_of(&payload).unwrap().collect::<Vec<_>>(),
            ["build-a", "template-t"]
        );
        assert_eq!(pending.take_payload(), "", "taking the payload empties it");

        let long = "s".repeat(1000);
        for i in 0..10 {
            pending.add(&format!("{long}{i}"));
        }
        let payload = pending.take_payload();
        assert_eq!(payload, ANY_STREAM);
        assert!(streams_of(&payload).is_none());
        assert!(
            streams_of("").is_none(),
            "an earlier version's empty payload"
        );
    }
}
