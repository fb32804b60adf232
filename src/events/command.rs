//! Running commands against streams: load, decide, append, and on a lost race do it again.
//!
//! Domain code stays pure ([`Aggregate::decide`] and [`Aggregate::evolve`]); this module is the
//! loop around it. A [`VersionConflict`](AppendError::VersionConflict) means another writer
//! moved the stream between our read and our append: the decision was made on stale state, so
//! it is made again on fresh state, never replayed blindly.
//!
//! Event ids are derived from the command id, the stream and the event's index, so running the
//! same command again (a client retry after a lost reply) produces the same ids and the store
//! recognises it instead of storing the events twice.

use std::future::Future;

use sha2::{Digest, Sha256};
use thiserror::Error;
use uuid::Uuid;

use super::{
    AdmissionCheck, AppendError, AppendOutcome, DecodeError, DomainEvent, EncodeError, EventStore,
    ExpectedVersion, Metadata, ReadError, RecordedEvent, StreamId, StreamWrite,
};

/// A stream's state machine. Implemented by pure domain types.
pub trait Aggregate {
    type State: Default + Send;
    type Event: DomainEvent + Send + Sync;
    /// Carries everything the decision needs, including the current time.
    type Command: Sync;
    type Error;

    fn evolve(state: Self::State, event: &Self::Event) -> Self::State;
    fn decide(
        state: &Self::State,
        command: &Self::Command,
    ) -> Result<Vec<Self::Event>, Self::Error>;
}

/// Who runs the command and under which id.
#[derive(Debug, Clone)]
pub struct CommandContext {
    /// Identifies this command across client retries: the same id yields the same event ids.
    pub command_id: Uuid,
    /// Recorded on every event; its `causation_id` defaults to `command_id`.
    pub metadata: Metadata,
    /// Decide-and-append rounds before giving up on a contended stream.
    pub max_attempts: u32,
    /// A limit every append of this command must pass inside its transaction.
    pub admission: Option<AdmissionCheck>,
}

impl CommandContext {
    /// A new command with a fresh id.
    pub fn new(metadata: Metadata) -> Self {
        Self::with_id(Uuid::now_v7(), metadata)
    }

    pub fn with_id(command_id: Uuid, metadata: Metadata) -> Self {
        Self {
            command_id,
            metadata,
            max_attempts: 64,
            admission: None,
        }
    }

    /// This command's appends also run `check` (when there is one) in their transaction, and
    /// fail with [`AppendError::Refused`] (storing nothing) when it refuses.
    pub fn with_admission(mut self, check: Option<AdmissionCheck>) -> Self {
        self.admission = check;
        self
    }

    pub fn with_max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts.max(1);
        self
    }

    /// The metadata recorded on this command's events.
    pub fn event_metadata(&self) -> Metadata {
        let mut metadata = self.metadata.clone();
        metadata.causation_id.get_or_insert(self.command_id);
        metadata
    }

    /// The id of the `index`-th event this command appends to `stream`: stable across retries.
    pub fn event_id(&self, stream: &StreamId, index: usize) -> Uuid {
        derive_event_id(self.command_id, stream, index)
    }

    /// The write of `events` to `stream`, expected at `expected`, with this command's ids and
    /// metadata.
    pub fn write<E: DomainEvent>(
        &self,
        stream: &StreamId,
        expected: ExpectedVersion,
        events: &[E],
    ) -> Result<StreamWrite, EncodeError> {
        Ok(StreamWrite::new(
            stream.clone(),
            expected,
            self.encode(stream, events)?,
        ))
    }

    /// Encodes `events` for `stream` with this command's ids and metadata.
    pub fn encode<E: DomainEvent>(
        &self,
        stream: &StreamId,
        events: &[E],
    ) -> Result<Vec<super::NewEvent>, EncodeError> {
        let metadata = self.event_metadata();
        events
            .iter()
            .enumerate()
            .map(|(i, e)| e.encode(self.event_id(stream, i), metadata.clone()))
            .collect()
    }
}

/// A deterministic, RFC 9562 version-8 UUID from the command id, stream and index.
pub fn derive_event_id(command_id: Uuid, stream: &StreamId, index: usize) -> Uuid {
    let mut hasher = Sha256::new();
    hasher.update(b"strata.event-id.v1\0");
    hasher.update(command_id.as_bytes());
    hasher.update((stream.as_str().len() as u64).to_be_bytes());
    hasher.update(stream.as_str().as_bytes());
    hasher.update((index as u64).to_be_bytes());
    let digest = hasher.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_custom_bytes(bytes).into_uuid()
}

#[derive(Debug, Error)]
pub enum CommandError<E> {
    /// The domain refused the command on current state.
    #[error("command rejected: {0}")]
    Rejected(E),
    #[error("{stream} kept moving: all {attempts} attempts lost a version race; try again later")]
    Contended { stream: String, attempts: u32 },
    #[error(transparent)]
    Append(AppendError),
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    Decode(#[from] DecodeError),
    #[error(transparent)]
    Encode(#[from] EncodeError),
}

/// A database error while deciding (reading the clock, a lookup) is a read of the store that
/// failed, never the domain refusing: it must not become [`CommandError::Rejected`].
impl<E> From<sqlx::Error> for CommandError<E> {
    fn from(err: sqlx::Error) -> Self {
        CommandError::Read(ReadError::Database(err))
    }
}

impl<E> CommandError<E> {
    /// Whether this is the store being unreachable or overloaded (a failed read, a failed or
    /// exhausted append), which a caller may retry, as opposed to a refusal, a lost race or a
    /// defect.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            CommandError::Read(ReadError::Database(_))
                | CommandError::Append(
                    AppendError::Database(_) | AppendError::SerializationRetriesExhausted { .. }
                )
        )
    }

    /// The error of a [`load`] as another command's: loading never rejects, so only read,
    /// decode, encode, append and contention errors pass through unchanged.
    pub fn into_other<F>(self) -> CommandError<F> {
        match self {
            CommandError::Read(e) => CommandError::Read(e),
            CommandError::Decode(e) => CommandError::Decode(e),
            CommandError::Encode(e) => CommandError::Encode(e),
            CommandError::Append(e) => CommandError::Append(e),
            CommandError::Contended { stream, attempts } => {
                CommandError::Contended { stream, attempts }
            }
            CommandError::Rejected(_) => unreachable!("loading never rejects"),
        }
    }
}

/// A stream's state as of `version`.
#[derive(Debug, Clone)]
pub struct Loaded<S> {
    pub state: S,
    pub version: u64,
}

impl<S> Loaded<S> {
    /// The expectation that the stream is still where it was loaded.
    pub fn expected(&self) -> ExpectedVersion {
        if self.version == 0 {
            ExpectedVersion::NoStream
        } else {
            ExpectedVersion::Exact(self.version)
        }
    }
}

/// Folds `stream` into `A::State` from the authoritative events.
pub async fn load<A: Aggregate>(
    store: &EventStore,
    stream: &StreamId,
) -> Result<Loaded<A::State>, CommandError<A::Error>> {
    let events = store.read_stream_all(stream).await?;
    let mut state = A::State::default();
    let mut version = 0;
    for recorded in &events {
        state = A::evolve(state, &A::Event::decode(recorded)?);
        version = recorded.version;
    }
    Ok(Loaded { state, version })
}

/// The result of a command.
#[derive(Debug, Clone)]
pub struct Executed<S> {
    /// State after the command's events.
    pub state: S,
    pub version: u64,
    /// The events appended (empty when the decision was "nothing to do").
    pub events: Vec<RecordedEvent>,
    /// Decide-and-append rounds used.
    pub attempts: u32,
    /// The events were stored by an earlier run of this same command.
    pub replay: bool,
}

/// Runs `command` on `stream`: load and fold, decide, append at the loaded version; on a version
/// conflict, reload and decide again, up to `context.max_attempts` times.
pub async fn execute<A: Aggregate>(
    store: &EventStore,
    stream: &StreamId,
    command: &A::Command,
    context: &CommandContext,
) -> Result<Executed<A::State>, CommandError<A::Error>> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let loaded = load::<A>(store, stream).await?;
        let decided = match A::decide(&loaded.state, command) {
            Ok(decided) => decided,
            Err(rejected) => {
                // A retry after a lost reply sees the state its first run made and may be
                // refused by it (an acquired build is no longer queued): it is a replay.
                if let Some(events) = already_applied(store, stream, context).await? {
                    return Ok(replayed(loaded, events, attempt));
                }
                return Err(CommandError::Rejected(rejected));
            }
        };
        if decided.is_empty() {
            if let Some(events) = already_applied(store, stream, context).await? {
                return Ok(replayed(loaded, events, attempt));
            }
            return Ok(Executed {
                state: loaded.state,
                version: loaded.version,
                events: Vec::new(),
                attempts: attempt,
                replay: false,
            });
        }
        let write = StreamWrite::new(
            stream.clone(),
            loaded.expected(),
            context.encode(stream, &decided)?,
        );
        match store
            .append_admitted(vec![write], context.admission.as_ref())
            .await
        {
            Ok(outcome) if outcome.replay => {
                // An earlier run of this command landed; its events may or may not be in what
                // we loaded, so report the stream as it is now.
                let now = load::<A>(store, stream).await?;
                return Ok(Executed {
                    state: now.state,
                    version: now.version,
                    events: outcome.events,
                    attempts: attempt,
                    replay: true,
                });
            }
            Ok(outcome) => {
                let state = decided.iter().fold(loaded.state, A::evolve);
                return Ok(Executed {
                    state,
                    version: outcome.version(stream).unwrap_or(loaded.version),
                    events: outcome.events,
                    attempts: attempt,
                    replay: false,
                });
            }
            Err(err @ AppendError::EventIdsReused { .. }) => {
                // The first run landed with other payloads (a later clock reading): its events
                // stand.
                if let Some(events) = already_applied(store, stream, context).await? {
                    let now = load::<A>(store, stream).await?;
                    return Ok(replayed(now, events, attempt));
                }
                return Err(CommandError::Append(err));
            }
            Err(err) if err.is_version_conflict() => {
                if attempt >= context.max_attempts {
                    return Err(CommandError::Contended {
                        stream: stream.to_string(),
                        attempts: attempt,
                    });
                }
                tokio::task::yield_now().await;
            }
            Err(err) => return Err(CommandError::Append(err)),
        }
    }
}

/// [`execute`] from a state the caller carried forward (what its own last write left), so the
/// stream is not read and folded again for a write that follows the caller's own. The first
/// round decides on `carried` and appends at its version. Only the stream as it is may refuse a
/// command or find nothing to do, so a refusal or an empty decision on `carried`, and a version
/// conflict (someone else wrote), fall back to [`execute`] on fresh state.
pub async fn execute_from<A: Aggregate>(
    store: &EventStore,
    stream: &StreamId,
    carried: Loaded<A::State>,
    command: &A::Command,
    context: &CommandContext,
) -> Result<Executed<A::State>, CommandError<A::Error>> {
    if let Ok(decided) = A::decide(&carried.state, command) {
        if !decided.is_empty() {
            let write = StreamWrite::new(
                stream.clone(),
                carried.expected(),
                context.encode(stream, &decided)?,
            );
            match store
                .append_admitted(vec![write], context.admission.as_ref())
                .await
            {
                Ok(outcome) if !outcome.replay => {
                    let version = outcome.version(stream).unwrap_or(carried.version);
                    return Ok(Executed {
                        state: decided.iter().fold(carried.state, A::evolve),
                        version,
                        events: outcome.events,
                        attempts: 1,
                        replay: false,
                    });
                }
                // A replay, a lost race or reused ids: judged on the stream as it is.
                Ok(_) | Err(AppendError::EventIdsReused { .. }) => {}
                Err(err) if err.is_version_conflict() => {}
                Err(err) => return Err(CommandError::Append(err)),
            }
        }
    }
    execute::<A>(store, stream, command, context).await
}

/// The events this command (`context`'s id) already appended to `stream`, if its first event
/// is stored: the mark of a run whose reply was lost.
pub async fn already_applied(
    store: &EventStore,
    stream: &StreamId,
    context: &CommandContext,
) -> Result<Option<Vec<RecordedEvent>>, ReadError> {
    let events = store
        .events_by_id(&context.event_id(stream, 0), stream)
        .await?;
    Ok((!events.is_empty()).then_some(events))
}

fn replayed<S>(loaded: Loaded<S>, events: Vec<RecordedEvent>, attempts: u32) -> Executed<S> {
    Executed {
        state: loaded.state,
        version: loaded.version,
        events,
        attempts,
        replay: true,
    }
}

/// The multi-stream form: `decide` loads whatever it needs (with [`load`]) and returns the
/// writes, including a guard ([`StreamWrite::guard`]) for every stream it read but does not
/// write. On a version conflict it is called again, up to `max_attempts` times.
pub async fn execute_writes<E, F, Fut>(
    store: &EventStore,
    max_attempts: u32,
    mut decide: F,
) -> Result<AppendOutcome, CommandError<E>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Vec<StreamWrite>, CommandError<E>>>,
{
    execute_writes_with(store, max_attempts, || {
        let decided = decide();
        async move { decided.await.map(|writes| (writes, ())) }
    })
    .await
    .map(|(outcome, ())| outcome)
}

/// [`execute_writes`] whose decision also produces a value (the template a registration
/// chose, the generation a link reserved): the value of the round whose writes were appended
/// is returned with the outcome.
pub async fn execute_writes_with<T, E, F, Fut>(
    store: &EventStore,
    max_attempts: u32,
    decide: F,
) -> Result<(AppendOutcome, T), CommandError<E>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(Vec<StreamWrite>, T), CommandError<E>>>,
{
    execute_writes_admitted(store, max_attempts, None, decide).await
}

/// [`execute_writes_with`] whose every append also runs `admission` in its transaction.
pub async fn execute_writes_admitted<T, E, F, Fut>(
    store: &EventStore,
    max_attempts: u32,
    admission: Option<&AdmissionCheck>,
    mut decide: F,
) -> Result<(AppendOutcome, T), CommandError<E>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(Vec<StreamWrite>, T), CommandError<E>>>,
{
    let mut attempt = 0;
    loop {
        attempt += 1;
        let (writes, value) = decide().await?;
        match store.append_admitted(writes, admission).await {
            Ok(mut outcome) => {
                outcome.attempts = attempt;
                return Ok((outcome, value));
            }
            Err(AppendError::VersionConflict { stream, .. }) if attempt < max_attempts => {
                tracing::debug!(%stream, attempt, "version conflict; deciding again");
                tokio::task::yield_now().await;
            }
            Err(AppendError::VersionConflict { stream, .. }) => {
                return Err(CommandError::Contended {
                    stream: stream.to_string(),
                    attempts: attempt,
                })
            }
            Err(err) => return Err(CommandError::Append(err)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_ids_are_stable_per_command_stream_and_index() {
        let cmd = Uuid::now_v7();
        let a = StreamId::parse("build-a").unwrap();
        let b = StreamId::parse("build-b").unwrap();
        assert_eq!(derive_event_id(cmd, &a, 0), derive_event_id(cmd, &a, 0));
        assert_ne!(derive_event_id(cmd, &a, 0), derive_event_id(cmd, &a, 1));
        assert_ne!(derive_event_id(cmd, &a, 0), derive_event_id(cmd, &b, 0));
        assert_ne!(
            derive_event_id(cmd, &a, 0),
            derive_event_id(Uuid::now_v7(), &a, 0)
        );
        assert_eq!(derive_event_id(cmd, &a, 0).get_version_num(), 8);
    }
}
