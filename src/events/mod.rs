//! Event types and the Postgres event store.
//!
//! Layout:
//! * [`StreamId`], [`ExpectedVersion`], [`Metadata`], [`NewEvent`], [`StreamWrite`],
//!   [`RecordedEvent`], [`FeedPosition`]: the vocabulary.
//! * [`DomainEvent`]: typed payloads (domain enums tagged `Name.vN`) in and out of the store.
//! * [`EventStore`]: `append` (all-or-nothing, SERIALIZABLE, head-row compare-and-set,
//!   idempotent on event ids; concurrent one-stream appends commit in groups), `append_with` (plus an [`InlineProjection`] in the same
//!   transaction), `read_stream`, `stream_version`, and the global feed (`read_feed`,
//!   `subscribe`) in commit-safe order.
//! * [`command`]: the load–decide–append loop around pure [`Aggregate`]s.
//!
//! Design notes: docs/adr/0001-event-store.md, docs/adr/0002-global-feed.md.

mod admission;
mod append;
pub mod command;
mod domain_event;
mod error;
mod expected_version;
mod fault;
mod feed;
mod group_commit;
mod inline;
mod metadata;
mod new_event;
mod notifier;
pub use notifier::{streams_of, ANY_STREAM};
mod recorded_event;
mod retry;
mod store;
mod stream_id;

pub use admission::{AdmissionCheck, AdmissionRefused};
pub use append::AppendOutcome;
pub use command::{execute, execute_writes, Aggregate, CommandContext, CommandError, Executed};
pub use domain_event::{DecodeError, DomainEvent, EncodeError};
pub use error::{is_serialization_failure, AppendError, ReadError};
pub use expected_version::ExpectedVersion;
pub use feed::{FeedSubscription, FeedWakeups, EVENTS_CHANNEL, HELD_BACK_SQL};
pub use group_commit::GroupCommitPolicy;
pub use inline::{InlineProjection, NoInlineProjection};
pub use metadata::{Actor, ActorRole, Metadata};
pub use new_event::{NewEvent, StreamWrite};
pub use recorded_event::{FeedPosition, FeedPositionError, RecordedEvent};
pub use retry::RetryPolicy;
pub use store::EventStore;
pub use stream_id::{StreamId, StreamIdError, MAX_STREAM_ID_LEN};

pub(crate) use feed::{feed_horizon, held_back, read_feed, HeldBackBackoff};
