//! What one sandbox's clients can make the node hold, host side: the agent runs in the strata
//! process, outside every sandbox's cgroup, so each thing a request leaves behind (a process
//! the API started and follows, a stream open on it, output queued for a client) is counted
//! per sandbox here. Past a limit the request is refused with `resource_exhausted`, saying
//! which limit and what frees it.
//!
//! Bytes held are bounded by the streams: each follows its process through a queue of at most
//! [`STREAM_QUEUE`] chunks of 32 KiB, so a sandbox holds at most
//! `MAX_STREAMS * STREAM_QUEUE * 32 KiB` (16 MiB) of output for its clients, and a client that
//! does not read misses output instead of growing the node (see [`super::processes`]).

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::connect::{Code, ConnectError};

/// Processes started through the API that still run, per sandbox. Each holds its pipes (four
/// descriptors) and a pump in the strata process; processes the sandbox starts itself do not
/// count (its pids cgroup bounds those).
pub const MAX_PROCESSES: usize = 256;

/// Streams open per sandbox: a started or connected process's output, a streamed directory
/// watch. Every background command holds one until its client disconnects.
pub const MAX_STREAMS: usize = 128;

/// Chunks a stream's queue holds before its process's output waits for it (and, once the
/// client has not read for a while, goes past it).
pub const STREAM_QUEUE: usize = 4;

/// One sandbox's open streams.
#[derive(Debug, Clone)]
pub struct StreamBudget {
    open: Arc<Semaphore>,
}

impl Default for StreamBudget {
    fn default() -> Self {
        StreamBudget {
            open: Arc::new(Semaphore::new(MAX_STREAMS)),
        }
    }
}

impl StreamBudget {
    /// A stream's place, held until the stream ends or its client goes; refused past
    /// [`MAX_STREAMS`].
    pub fn open(&self) -> Result<OwnedSemaphorePermit, ConnectError> {
        self.open.clone().try_acquire_owned().map_err(|_| {
            ConnectError::new(
                Code::ResourceExhausted,
                format!(
                    "this sandbox has {MAX_STREAMS} open streams (commands and watches a client \
                     follows); disconnect from one, or let a command end, first"
                ),
            )
        })
    }
}

/// The refusal of a process past [`MAX_PROCESSES`].
pub fn too_many_processes() -> ConnectError {
    ConnectError::new(
        Code::ResourceExhausted,
        format!(
            "this sandbox runs {MAX_PROCESSES} processes started through the API; kill one or \
             wait for one to end first"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_refused_past_the_limit_and_given_back_when_they_end() {
        let budget = StreamBudget::default();
        let held: Vec<_> = (0..MAX_STREAMS).map(|_| budget.open().unwrap()).collect();
        let refused = budget.open().unwrap_err();
        assert!(
            refused.message.contains("128 open streams"),
            "{}",
            refused.message
        );
        drop(held);
        assert!(budget.open().is_ok());
    }
}
