//! Wakes feed subscribers after appends commit, with `NOTIFY strata_events`.
//!
//! The NOTIFY is sent after COMMIT, from a background task, not inside the appending
//! transaction: a transaction that notifies takes a cluster-wide lock at COMMIT and keeps it
//! until its commit record is flushed, which serializes all appends (measured: half the
//! throughput). Here an append only signals a channel of capacity one; the task sends one NOTIFY
//! per burst of appends, in its own transaction that writes nothing. A notification lost with a
//! crashing process is covered by the subscribers' polling.

use std::sync::{Arc, OnceLock};

use sqlx::PgPool;
use tokio::sync::mpsc;

use super::feed::EVENTS_CHANNEL;

/// Shared by the clones of one [`EventStore`](super::EventStore); the background task ends when
/// the last clone is dropped.
#[derive(Debug, Default)]
pub(crate) struct Notifier {
    wake: OnceLock<mpsc::Sender<()>>,
}

impl Notifier {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Asks for a NOTIFY soon. Never waits; folds into a pending one.
    pub(crate) fn appended(&self, pool: &PgPool) {
        let wake = self.wake.get_or_init(|| {
            let (tx, rx) = mpsc::channel(1);
            tokio::spawn(send_notifications(pool.clone(), rx));
            tx
        });
        let _ = wake.try_send(());
    }
}

async fn send_notifications(pool: PgPool, mut wake: mpsc::Receiver<()>) {
    while wake.recv().await.is_some() {
        if let Err(err) = sqlx::query("SELECT pg_notify($1, '')")
            .bind(EVENTS_CHANNEL)
            .execute(&pool)
            .await
        {
            tracing::debug!(error = %err, "sending the feed wake-up failed; subscribers will poll");
        }
    }
}
