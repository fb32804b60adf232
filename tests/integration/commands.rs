//! The command helper: load, decide, append, and decide again after losing a race.

use crate::common;

use serde::{Deserialize, Serialize};
use strata::events::command::{self, load};
use strata::events::{
    execute, execute_writes, Actor, ActorRole, Aggregate, CommandContext, CommandError, Metadata,
    StreamId, StreamWrite,
};
use uuid::Uuid;

/// A tiny aggregate: a counter with a ceiling.
struct Counter;

#[derive(Debug, Default, Clone, PartialEq)]
struct CounterState {
    value: u64,
    opened: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
enum CounterEvent {
    #[serde(rename = "CounterOpened.v1")]
    Opened,
    #[serde(rename = "CounterIncremented.v1")]
    Incremented { to: u64 },
    #[serde(rename = "CounterMarked.v1")]
    Marked { note: String },
}

enum CounterCommand {
    Increment {
        ceiling: u64,
    },
    /// Not idempotent in the domain: every run decides a new mark.
    Mark {
        note: String,
    },
}

#[derive(Debug, PartialEq)]
enum CounterError {
    AtCeiling(u64),
}

impl Aggregate for Counter {
    type State = CounterState;
    type Event = CounterEvent;
    type Command = CounterCommand;
    type Error = CounterError;

    fn evolve(mut state: CounterState, event: &CounterEvent) -> CounterState {
        match event {
            CounterEvent::Opened => state.opened = true,
            CounterEvent::Incremented { to } => state.value = *to,
            CounterEvent::Marked { .. } => {}
        }
        state
    }

    fn decide(
        state: &CounterState,
        command: &CounterCommand,
    ) -> Result<Vec<CounterEvent>, CounterError> {
        let ceiling = match command {
            CounterCommand::Increment { ceiling } => ceiling,
            CounterCommand::Mark { note } => {
                return Ok(vec![CounterEvent::Marked { note: note.clone() }])
            }
        };
        if state.value >= *ceiling {
            return Err(CounterError::AtCeiling(state.value));
        }
        let mut events = Vec::new();
        if !state.opened {
            events.push(CounterEvent::Opened);
        }
        events.push(CounterEvent::Incremented {
            to: state.value + 1,
        });
        Ok(events)
    }
}

fn ctx() -> CommandContext {
    CommandContext::new(Metadata::new(Actor::new(ActorRole::Api, "test-node")))
}

#[tokio::test]
async fn concurrent_commands_on_one_stream_all_succeed_with_exact_state() {
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    let stream = StreamId::parse("counter-1").unwrap();
    const WRITERS: u64 = 16;
    let tasks: Vec<_> = (0..WRITERS)
        .map(|_| {
            let store = store.clone();
            let stream = stream.clone();
            tokio::spawn(async move {
                execute::<Counter>(
                    &store,
                    &stream,
                    &CounterCommand::Increment { ceiling: 1000 },
                    &ctx(),
                )
                .await
            })
        })
        .collect();
    let mut values = Vec::new();
    let mut retried = 0;
    for t in tasks {
        let done = t.await.unwrap().unwrap();
        assert!(!done.replay);
        if done.attempts > 1 {
            retried += 1;
        }
        values.push(done.state.value);
    }
    values.sort();
    assert_eq!(
        values,
        (1..=WRITERS).collect::<Vec<_>>(),
        "each saw a distinct state"
    );
    assert!(
        retried > 0,
        "the race was real: some commands decided again"
    );
    let loaded = load::<Counter>(&store, &stream).await.unwrap();
    assert_eq!(loaded.state.value, WRITERS);
    assert_eq!(
        loaded.version,
        WRITERS + 1,
        "Opened once, then one event per command"
    );
}

#[tokio::test]
async fn rejections_are_typed_and_write_nothing() {
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    let stream = StreamId::parse("counter-2").unwrap();
    let cmd = CounterCommand::Increment { ceiling: 1 };
    let done = execute::<Counter>(&store, &stream, &cmd, &ctx())
        .await
        .unwrap();
    assert_eq!(done.version, 2);
    assert_eq!(done.events.len(), 2);
    assert_eq!(
        done.events[0].metadata.causation_id,
        done.events[1].metadata.causation_id
    );
    match execute::<Counter>(&store, &stream, &cmd, &ctx()).await {
        Err(CommandError::Rejected(CounterError::AtCeiling(1))) => {}
        other => panic!("expected a rejection, got {other:?}"),
    }
    assert_eq!(store.stream_version(&stream).await.unwrap(), 2);
}

#[tokio::test]
async fn rerunning_a_command_id_never_appends_twice() {
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    let stream = StreamId::parse("counter-3").unwrap();
    let context = CommandContext::with_id(
        Uuid::now_v7(),
        Metadata::new(Actor::new(ActorRole::Api, "n")),
    );
    let cmd = CounterCommand::Increment { ceiling: 10 };
    let first = execute::<Counter>(&store, &stream, &cmd, &context)
        .await
        .unwrap();
    // The client retries the same command after its first run landed: decide, on the state
    // that first run made, produces different events under the same ids. The command has
    // already happened, so the retry is a replay of it (ADR 0009), never a second increment.
    let again = execute::<Counter>(&store, &stream, &cmd, &context)
        .await
        .unwrap();
    assert!(again.replay, "{again:?}");
    assert_eq!(
        again.events.iter().map(|e| e.event_id).collect::<Vec<_>>(),
        first.events.iter().map(|e| e.event_id).collect::<Vec<_>>()
    );
    assert_eq!(store.stream_version(&stream).await.unwrap(), first.version);
    // The ids are the command's: the stored events carry them.
    assert_eq!(
        first.events[0].event_id,
        command::derive_event_id(context.command_id, &stream, 0)
    );

    // A command whose rerun decides the same events (a client retry after a lost reply):
    // answered as a replay, stored once.
    let context = ctx();
    let mark = CounterCommand::Mark {
        note: "checked".into(),
    };
    let first = execute::<Counter>(&store, &stream, &mark, &context)
        .await
        .unwrap();
    assert!(!first.replay);
    let retry = execute::<Counter>(&store, &stream, &mark, &context)
        .await
        .unwrap();
    assert!(retry.replay);
    assert_eq!(retry.events, first.events);
    assert_eq!(retry.version, first.version);
    assert_eq!(store.stream_version(&stream).await.unwrap(), first.version);
}

#[tokio::test]
async fn multi_stream_decisions_retry_until_their_guards_hold() {
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    let limit = StreamId::parse("counter-limit").unwrap();
    // Seed the guarded stream.
    execute::<Counter>(
        &store,
        &limit,
        &CounterCommand::Increment { ceiling: 100 },
        &ctx(),
    )
    .await
    .unwrap();

    // 8 writers each copy the limit stream's value into their own stream, guarding the limit
    // stream, while another task keeps moving it. Every write must reflect a value that was
    // current at commit.
    let mover = {
        let store = store.clone();
        let limit = limit.clone();
        tokio::spawn(async move {
            for _ in 0..20 {
                execute::<Counter>(
                    &store,
                    &limit,
                    &CounterCommand::Increment { ceiling: 100 },
                    &ctx(),
                )
                .await
                .unwrap();
            }
        })
    };
    let copiers: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            let limit = limit.clone();
            tokio::spawn(async move {
                let target = StreamId::parse(format!("copy-{i}")).unwrap();
                let context = ctx();
                execute_writes::<CounterError, _, _>(&store, 100, || {
                    let (store, limit, target, context) = (
                        store.clone(),
                        limit.clone(),
                        target.clone(),
                        context.clone(),
                    );
                    async move {
                        let seen = load::<Counter>(&store, &limit).await?;
                        let mine = load::<Counter>(&store, &target).await?;
                        let events = vec![CounterEvent::Incremented {
                            to: seen.state.value,
                        }];
                        Ok(vec![
                            StreamWrite::guard(limit.clone(), seen.expected()),
                            StreamWrite::new(
                                target.clone(),
                                mine.expected(),
                                context.encode(&target, &events)?,
                            ),
                        ])
                    }
                })
                .await
                .unwrap()
            })
        })
        .collect();
    for c in copiers {
        let outcome = c.await.unwrap();
        let copied: CounterEvent = outcome.events[0].decode().unwrap();
        let CounterEvent::Incremented { to } = copied else {
            panic!("unexpected {copied:?}")
        };
        // The guard pinned the limit stream's version at commit: the copied value is the one
        // that stream had at that version.
        let guarded_version = outcome.versions[&limit];
        assert_eq!(
            guarded_version,
            to + 1,
            "value {to} is the state at version {guarded_version}"
        );
    }
    mover.await.unwrap();
}

/// A writer that carries its state forward decides on it without reading the stream, and
/// appends exactly as a fresh decision would; when someone else moved the stream, or the carried
/// state would refuse, the decision is made again on the stream as it is.
#[tokio::test]
async fn a_carried_state_is_used_when_current_and_replaced_when_stale() {
    let db = common::test_db().await;
    let store = strata::app::event_store(db.pool.clone());
    let stream = StreamId::parse("counter-carried").unwrap();
    let inc = CounterCommand::Increment { ceiling: 3 };

    // Current: one round, at the carried version.
    let first = execute::<Counter>(&store, &stream, &inc, &ctx())
        .await
        .unwrap();
    let carried = command::Loaded {
        state: first.state.clone(),
        version: first.version,
    };
    let second = command::execute_from::<Counter>(&store, &stream, carried.clone(), &inc, &ctx())
        .await
        .unwrap();
    assert_eq!(second.state.value, 2);
    assert_eq!(second.version, first.version + 1);
    assert_eq!(second.attempts, 1);

    // Stale (the stream moved past it): the append at the carried version loses, and the
    // decision on the stream as it is lands, never a duplicate of the old one.
    let third = command::execute_from::<Counter>(&store, &stream, carried, &inc, &ctx())
        .await
        .unwrap();
    assert_eq!(third.state.value, 3);
    assert_eq!(
        load::<Counter>(&store, &stream).await.unwrap().state.value,
        3
    );

    // A carried state that would refuse is not trusted: the stream decides. Here the stream
    // is at the ceiling, so the refusal stands, decided on fresh state.
    let at_ceiling = command::Loaded {
        state: CounterState {
            value: 3,
            opened: true,
        },
        version: third.version,
    };
    match command::execute_from::<Counter>(&store, &stream, at_ceiling, &inc, &ctx()).await {
        Err(CommandError::Rejected(CounterError::AtCeiling(3))) => {}
        other => panic!("expected the stream's refusal, got {other:?}"),
    }
    let higher = CounterCommand::Increment { ceiling: 10 };
    let wrongly_full = command::Loaded {
        state: CounterState {
            value: 10,
            opened: true,
        },
        version: 1,
    };
    let fourth = command::execute_from::<Counter>(&store, &stream, wrongly_full, &higher, &ctx())
        .await
        .unwrap();
    assert_eq!(
        fourth.state.value, 4,
        "decided on the stream, not on the carried state"
    );
}
