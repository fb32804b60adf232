//! Fault injection for tests: losing the reply to an append that committed.
//!
//! A reply lost after COMMIT (a connection reset, a timeout on the way back) cannot be produced
//! reliably from outside, so a test arms [`EventStore::lose_next_reply`] and the store commits
//! the append and then answers with a connection error, exactly as the caller would see it.
//! Nothing arms it outside tests; unarmed, it costs one uncontended lock per append.

use std::sync::Mutex;

use super::{AppendError, EventStore, StreamWrite};

/// Armed faults of one store (shared by its clones).
#[derive(Debug, Default)]
pub(crate) struct Faults {
    /// Stream categories whose next committed append loses its reply, once each.
    lose_reply: Mutex<Vec<String>>,
}

impl Faults {
    /// The error to answer instead of the outcome, if a fault is armed for one of `writes`.
    pub(crate) fn lost_reply(&self, writes: &[StreamWrite]) -> Option<AppendError> {
        let mut armed = self.lose_reply.lock().expect("not poisoned");
        let hit = armed.iter().position(|c| {
            writes
                .iter()
                .any(|w| !w.is_guard() && w.stream.category() == c)
        })?;
        armed.remove(hit);
        Some(AppendError::Database(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "fault injection: the reply to a committed append was lost",
        ))))
    }
}

impl EventStore {
    /// Fault injection, for tests only: the next append that writes events to a stream of
    /// `category` commits and then fails as if its reply had been lost.
    pub fn lose_next_reply(&self, category: &str) {
        self.faults
            .lose_reply
            .lock()
            .expect("not poisoned")
            .push(category.to_owned());
    }

    /// Fault injection, for tests only: how many armed lost replies have not fired yet (a test
    /// checks that the fault it armed was met).
    pub fn lost_replies_pending(&self) -> usize {
        self.faults.lose_reply.lock().expect("not poisoned").len()
    }
}
