//! Fault injection for tests: losing the reply to an append that committed, and failing the
//! read that follows one.
//!
//! A reply lost after COMMIT (a connection reset, a timeout on the way back) cannot be produced
//! reliably from outside, so a test arms [`EventStore::lose_next_reply`] (by stream category) or
//! [`EventStore::lose_next_reply_to`] (by event type) and the store commits the append and then
//! answers with a connection error, exactly as the caller would see it. Nor can a connection
//! that drops between a writer's append and its next read of the same stream: a test arms
//! [`EventStore::fail_next_read_after`] and that one read fails. Nothing arms either outside
//! tests; unarmed, they cost one uncontended lock per append and per stream read.

use std::sync::Mutex;

use super::{AppendError, EventStore, ReadError, StreamId, StreamWrite};

/// Armed faults of one store (shared by its clones).
#[derive(Debug, Default)]
pub(crate) struct Faults {
    /// Appends whose reply is lost once each, in the order armed.
    lose_reply: Mutex<Vec<Trigger>>,
    /// Event types whose next committed append makes the next read of its streams fail.
    fail_read_after: Mutex<Vec<String>>,
    /// Streams whose next read fails once (armed by a committed append above).
    failing_reads: Mutex<Vec<StreamId>>,
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
    /// After `writes` committed: the error to answer instead of the outcome, if a fault is
    /// armed for one of them; and the reads armed to fail after an append like this one.
    pub(crate) fn lost_reply(&self, writes: &[StreamWrite]) -> Option<AppendError> {
        self.arm_failing_reads(writes);
        let mut armed = self.lose_reply.lock().expect("not poisoned");
        let hit = armed.iter().position(|t| t.hits(writes))?;
        armed.remove(hit);
        Some(AppendError::Database(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "fault injection: the reply to a committed append was lost",
        ))))
    }
}

impl Faults {
    fn arm_failing_reads(&self, writes: &[StreamWrite]) {
        let mut armed = self.fail_read_after.lock().expect("not poisoned");
        let hit = armed.iter().position(|t| {
            writes
                .iter()
                .any(|w| w.events.iter().any(|e| &e.event_type == t))
        });
        let Some(hit) = hit else { return };
        let event_type = armed.remove(hit);
        let mut failing = self.failing_reads.lock().expect("not poisoned");
        failing.extend(
            writes
                .iter()
                .filter(|w| w.events.iter().any(|e| e.event_type == event_type))
                .map(|w| w.stream.clone()),
        );
    }

    /// The error a read of `stream` answers instead of its events, once, if one is armed.
    pub(crate) fn failed_read(&self, stream: &StreamId) -> Option<ReadError> {
        let mut failing = self.failing_reads.lock().expect("not poisoned");
        let hit = failing.iter().position(|s| s == stream)?;
        failing.remove(hit);
        Some(ReadError::Database(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "fault injection: the connection dropped before this read",
        ))))
    }
}

impl EventStore {
    /// Fault injection, for tests only: once an append that writes an event of `event_type`
    /// commits, the next read of each stream it wrote that event to fails with a connection
    /// error.
    pub fn fail_next_read_after(&self, event_type: &str) {
        self.faults
            .fail_read_after
            .lock()
            .expect("not poisoned")
            .push(event_type.to_owned());
    }

    /// Fault injection, for tests only: how many reads armed by [`Self::fail_next_read_after`]
    /// have not failed yet (armed and not met, or met and not yet read).
    pub fn failed_reads_pending(&self) -> usize {
        self.faults
            .fail_read_after
            .lock()
            .expect("not poisoned")
            .len()
            + self
                .faults
                .failing_reads
                .lock()
                .expect("not poisoned")
                .len()
    }

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
