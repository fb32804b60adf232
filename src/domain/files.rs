//! The `files-{scope}:{filesHash}` stream: the generations of one context archive name.
//!
//! Layout: [`State`], [`Command`], [`Event`], [`Error`], [`decide`], [`evolve`], then the
//! link-time view ([`State::present`]).
//!
//! A generation is *reserved* when an upload link is handed out (so the signed URL can name it and
//! no two links share one) and *published* when its upload completes: `{generation, blob_digest,
//! size}`, create-if-absent. Publication never overwrites: the same generation with the same
//! digest is an idempotent replay, with another digest a conflict. The build stream decides
//! which generation a build is bound to; this stream only says which generations exist.
//!
//! "Present" for the link response means: a published generation exists in this scope, so a
//! build without a binding can be bound to the latest one and the SDK may skip its upload. A
//! generation whose stored bytes a build found torn or missing is *retired*: the name is then
//! absent until the next upload publishes a newer generation (RFC: a digest-mismatched object is
//! absent and repairable, never permanently present).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::ids::{BuildId, Digest, Generation, IntentId};

/// A published generation: which bytes it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishedGeneration {
    pub generation: Generation,
    pub blob_digest: Digest,
    pub size: u64,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct State {
    /// The highest generation handed out; the next reservation takes the one after it.
    pub reserved_up_to: Generation,
    /// Which intent holds which generation, so a retried link request gets the same one back.
    pub reservations: BTreeMap<IntentId, Generation>,
    pub published: BTreeMap<Generation, PublishedGeneration>,
    /// The most recently published generation: the freshest bytes under this name.
    pub latest: Option<Generation>,
    /// Generations whose bytes a reader found torn or missing: never present again.
    pub retired: std::collections::BTreeSet<Generation>,
}

impl State {
    /// The generation a build without a binding gets bound to at link time, if any.
    pub fn present(&self) -> Option<PublishedGeneration> {
        self.latest
            .filter(|g| !self.retired.contains(g))
            .and_then(|g| self.published.get(&g).copied())
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Reserve a generation for an upload intent (idempotent per intent).
    ReserveGeneration { build: BuildId, intent: IntentId },
    /// Publish a reserved generation with the server-computed digest of the uploaded bytes.
    PublishGeneration {
        generation: Generation,
        blob_digest: Digest,
        size: u64,
        build: BuildId,
        intent: IntentId,
    },
    /// A build could not read the bytes of `generation` (missing, or not matching
    /// `blob_digest`): the generation is no longer present, so the next link asks for an upload.
    RetireGeneration {
        generation: Generation,
        blob_digest: Digest,
        reason: String,
    },
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "type")]
pub enum Event {
    #[serde(rename = "GenerationReserved.v1")]
    GenerationReserved {
        generation: Generation,
        build: BuildId,
        intent: IntentId,
    },
    #[serde(rename = "GenerationPublished.v1")]
    GenerationPublished {
        generation: Generation,
        blob_digest: Digest,
        size: u64,
        build: BuildId,
        intent: IntentId,
    },
    #[serde(rename = "GenerationRetired.v1")]
    GenerationRetired {
        generation: Generation,
        blob_digest: Digest,
        reason: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("generation {generation} was never reserved here; upload through a link from GET /templates/{{id}}/files/{{hash}}")]
    NotReserved { generation: Generation },
    #[error("generation {generation} is reserved for intent {reserved_for}, not {intent}; the upload URL does not match its intent")]
    WrongIntent {
        generation: Generation,
        intent: IntentId,
        reserved_for: IntentId,
    },
    #[error("generation {generation} is already published as {published}; an upload of {attempted} cannot replace it. Request a new upload link")]
    AlreadyPublished {
        generation: Generation,
        published: Digest,
        attempted: Digest,
    },
    #[error("generation {generation} holds {published}, not {named}; nothing to retire")]
    RetireMismatch {
        generation: Generation,
        published: Digest,
        named: Digest,
    },
}

pub fn decide(state: &State, command: &Command) -> Result<Vec<Event>, Error> {
    match command {
        Command::ReserveGeneration { build, intent } => {
            if state.reservations.contains_key(intent) {
                return Ok(vec![]);
            }
            Ok(vec![Event::GenerationReserved {
                generation: state.reserved_up_to.next(),
                build: *build,
                intent: *intent,
            }])
        }
        Command::PublishGeneration {
            generation,
            blob_digest,
            size,
            build,
            intent,
        } => {
            let reserved_for = state
                .reservations
                .iter()
                .find(|(_, g)| *g == generation)
                .map(|(i, _)| *i)
                .ok_or(Error::NotReserved {
                    generation: *generation,
                })?;
            if reserved_for != *intent {
                return Err(Error::WrongIntent {
                    generation: *generation,
                    intent: *intent,
                    reserved_for,
                });
            }
            match state.published.get(generation) {
                Some(p) if p.blob_digest == *blob_digest => Ok(vec![]),
                Some(p) => Err(Error::AlreadyPublished {
                    generation: *generation,
                    published: p.blob_digest,
                    attempted: *blob_digest,
                }),
                None => Ok(vec![Event::GenerationPublished {
                    generation: *generation,
                    blob_digest: *blob_digest,
                    size: *size,
                    build: *build,
                    intent: *intent,
                }]),
            }
        }
        Command::RetireGeneration {
            generation,
            blob_digest,
            reason,
        } => retire(state, *generation, *blob_digest, reason),
    }
}

fn retire(
    state: &State,
    generation: Generation,
    blob_digest: Digest,
    reason: &str,
) -> Result<Vec<Event>, Error> {
    let published = state
        .published
        .get(&generation)
        .ok_or(Error::NotReserved { generation })?;
    if published.blob_digest != blob_digest {
        return Err(Error::RetireMismatch {
            generation,
            published: published.blob_digest,
            named: blob_digest,
        });
    }
    if state.retired.contains(&generation) {
        return Ok(vec![]);
    }
    Ok(vec![Event::GenerationRetired {
        generation,
        blob_digest,
        reason: reason.to_owned(),
    }])
}

pub fn evolve(mut state: State, event: &Event) -> State {
    match event {
        Event::GenerationReserved {
            generation, intent, ..
        } => {
            state.reserved_up_to = state.reserved_up_to.max(*generation);
            state.reservations.insert(*intent, *generation);
        }
        Event::GenerationPublished {
            generation,
            blob_digest,
            size,
            ..
        } => {
            state.published.insert(
                *generation,
                PublishedGeneration {
                    generation: *generation,
                    blob_digest: *blob_digest,
                    size: *size,
                },
            );
            state.latest = Some(*generation);
        }
        Event::GenerationRetired { generation, .. } => {
            state.retired.insert(*generation);
        }
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use uuid::Uuid;

    fn build() -> BuildId {
        BuildId::from_uuid(Uuid::from_u128(7))
    }
    fn intent(n: u128) -> IntentId {
        IntentId::from_uuid(Uuid::from_u128(n))
    }
    fn apply(state: State, command: &Command) -> Result<State, Error> {
        Ok(decide(&state, command)?.iter().fold(state, evolve))
    }

    #[test]
    fn a_retired_latest_generation_is_absent_until_a_newer_one_is_published() {
        let reserve = |s, i| {
            apply(
                s,
                &Command::ReserveGeneration {
                    build: build(),
                    intent: intent(i),
                },
            )
            .unwrap()
        };
        let publish = |s, g, i| {
            apply(
                s,
                &Command::PublishGeneration {
                    generation: Generation(g),
                    blob_digest: Digest::of(b"abc"),
                    size: 3,
                    build: build(),
                    intent: intent(i),
                },
            )
            .unwrap()
        };
        let s = publish(reserve(State::default(), 1), 1, 1);
        let retire = |digest| Command::RetireGeneration {
            generation: Generation(1),
            blob_digest: digest,
            reason: "torn".into(),
        };
        assert!(matches!(
            decide(&s, &retire(Digest::of(b"other"))),
            Err(Error::RetireMismatch { .. })
        ));
        let s = apply(s, &retire(Digest::of(b"abc"))).unwrap();
        assert_eq!(s.present(), None);
        assert_eq!(decide(&s, &retire(Digest::of(b"abc"))).unwrap(), vec![]);
        let s = publish(reserve(s, 2), 2, 2);
        assert_eq!(s.present().unwrap().generation, Generation(2));
    }

    #[test]
    fn reservations_are_unique_and_idempotent_per_intent() {
        let s = apply(
            State::default(),
            &Command::ReserveGeneration {
                build: build(),
                intent: intent(1),
            },
        )
        .unwrap();
        let s = apply(
            s,
            &Command::ReserveGeneration {
                build: build(),
                intent: intent(2),
            },
        )
        .unwrap();
        assert_eq!(s.reservations[&intent(1)], Generation(1));
        assert_eq!(s.reservations[&intent(2)], Generation(2));
        let again = decide(
            &s,
            &Command::ReserveGeneration {
                build: build(),
                intent: intent(1),
            },
        )
        .unwrap();
        assert!(again.is_empty());
        assert_eq!(s.present(), None, "a reservation is not a publication");
    }

    #[test]
    fn publication_is_create_if_absent() {
        let s = apply(
            State::default(),
            &Command::ReserveGeneration {
                build: build(),
                intent: intent(1),
            },
        )
        .unwrap();
        let publish = |d: &[u8], i| Command::PublishGeneration {
            generation: Generation(1),
            blob_digest: Digest::of(d),
            size: 3,
            build: build(),
            intent: intent(i),
        };
        let s = apply(s, &publish(b"abc", 1)).unwrap();
        assert_eq!(s.present().unwrap().blob_digest, Digest::of(b"abc"));
        assert!(
            decide(&s, &publish(b"abc", 1)).unwrap().is_empty(),
            "replay is a no-op"
        );
        assert!(matches!(
            decide(&s, &publish(b"xyz", 1)),
            Err(Error::AlreadyPublished { .. })
        ));
        assert!(matches!(
            decide(&s, &publish(b"abc", 2)),
            Err(Error::WrongIntent { .. })
        ));
        let unreserved = Command::PublishGeneration {
            generation: Generation(9),
            blob_digest: Digest::of(b"a"),
            size: 1,
            build: build(),
            intent: intent(1),
        };
        assert!(matches!(
            decide(&s, &unreserved),
            Err(Error::NotReserved { .. })
        ));
    }

    proptest! {
        /// Whatever the interleaving, a published generation never changes its bytes.
        #[test]
        fn published_generations_never_change(ops in proptest::collection::vec((0u128..4, 0u8..3, any::<bool>()), 1..40)) {
            let mut s = State::default();
            for (i, content, reserve) in ops {
                let cmd = if reserve {
                    Command::ReserveGeneration { build: build(), intent: intent(i) }
                } else {
                    let generation = s.reservations.get(&intent(i)).copied().unwrap_or(Generation(1));
                    Command::PublishGeneration { generation, blob_digest: Digest::of(&[content]), size: 1, build: build(), intent: intent(i) }
                };
                let before = s.published.clone();
                if let Ok(events) = decide(&s, &cmd) {
                    s = events.iter().fold(s, evolve);
                }
                for (g, p) in before {
                    prop_assert_eq!(s.published[&g], p);
                }
            }
        }
    }
}
