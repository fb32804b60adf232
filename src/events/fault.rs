//! Fault injection for tests: losing the reply to an append that committed.
//!
//! A reply lost after COMMIT (a connection reset, a timeout on the way back) cannot be produced
//! reliably from outside, so a test arms [`EventStore::lose_next_reply`] (by stream category) or
//! [`EventStore::lose_next_reply_to`] (by event type) and the store commits the append and then
//! answers with a connection error, exactly as the caller would see it. Nothing arms it outside
//! tests; unarmed, it costs one uncontended lock per append.

use std::sync::Mutex;

use super::{AppendError, EventStore, StreamWrite};

/// Armed faults of one store (shared by its clones).
#[derive(Debug, Default)]
pub(crate) struct Faults {
    /// Appends whose reply is lost once each, in the order armed.
    lose_reply: Mutex<Vec<Trigger>>,
}

/// Which committed append loses its reply.
#[derive(Debug)]
enum Trigger {
    /// The next one that writes events to a stream of this category.
    Category(String),
    /// The next one that writes an event of this type.
    EventType(String),
}

impl Trigger {
    fn hits(&self, writes: &[StreamWrite]) -> bool {
        match self {
            Trigger::Category(c) => writes
                .iter()
                .any(|w| !w.is_guard() && w.stream.category() == c),
            Trigger::EventType(t) => writes
                .iter()
                .any(|w| w.events.iter().any(|e| &e.event_type == t)),
        }
    }
}

impl Faults {
    /// The error to answer instead of the outcome, if a fault is armed for one of `writes`.
    pub(crate) fn lost_reply(&self, writes: &[StreamWrite]) -> Option<AppendError> {
        let mut armed = self.lose_reply.lock().expect("not poisoned");
        let hit = armed.iter().position(|t| t.hits(writes))?;
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
        self.arm(Trigger::Category(category.to_owned()));
    }

    /// Fault injection, for tests only: the next append that writes an event of `event_type`
    /// (e.g. `PromotionVisible.v1`) commits and then fails as if its reply had been lost.
    pub fn lose_next_reply_to(&self, event_type: &str) {
        self.arm(Trigger::EventType(event_type.to_owned()));
    }

    fn arm(&self, trigger: Trigger) {
        self.faults
            .lose_reply
            .lock()
            .expect("not poisoned")
            .push(trigger);
    }

    /// Fault injection, for tests only: how many armed lost replies have not fired yet (a test
    /// checks that the fault it armed was met).
    pub fn lost_replies_pending(&self) -> usize {
        self.faults.lose_reply.lock().expect("not poisoned").len()
    }
}
