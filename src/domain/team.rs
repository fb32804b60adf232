//! The team aggregate (`team-{id}`): the tenant that owns API keys, templates, builds, uploaded
//! context and (later) cache entries.
//!
//! A key is stored only as its sha256: the plaintext is shown once, when it is issued, and is
//! never recorded anywhere. Issuing the first key creates the team; revoking a key is final.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use uuid::Uuid;

/// The prefix E2B SDKs expect (the JS SDK rejects other keys unless told not to check).
pub const KEY_PREFIX: &str = "e2b_";

/// An API key's plaintext: `e2b_` followed by 40 lowercase hex digits. Debug never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// A key from 20 random bytes supplied by the caller (the domain draws no randomness).
    pub fn from_random(bytes: [u8; 20]) -> Self {
        Self(format!("{KEY_PREFIX}{}", hex::encode(bytes)))
    }

    /// Parses a presented key. Any string is checked the same way, so the error never says how
    /// close a guess was.
    pub fn parse(presented: &str) -> Option<Self> {
        let hex_part = presented.strip_prefix(KEY_PREFIX)?;
        (hex_part.len() == 40
            && hex_part
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
        .then(|| Self(presented.to_owned()))
    }

    /// What the store keeps and looks keys up by.
    pub fn sha256_hex(&self) -> String {
        hex::encode(Sha256::digest(self.0.as_bytes()))
    }

    /// The first characters, safe to show in listings and logs.
    pub fn display_prefix(&self) -> String {
        self.0[..KEY_PREFIX.len() + 6].to_owned()
    }

    /// The plaintext, for printing once when the key is issued.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKey({}…)", self.display_prefix())
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct State {
    pub created: bool,
    /// key id -> (sha256, revoked)
    pub keys: BTreeMap<Uuid, KeyState>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct KeyState {
    pub sha256: String,
    pub revoked: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    IssueKey {
        key_id: Uuid,
        key_sha256: String,
        prefix: String,
        now: DateTime<Utc>,
    },
    RevokeKey {
        key_id: Uuid,
        now: DateTime<Utc>,
    },
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "type")]
pub enum Event {
    #[serde(rename = "TeamCreated.v1")]
    TeamCreated { created_at: DateTime<Utc> },
    #[serde(rename = "ApiKeyIssued.v1")]
    ApiKeyIssued {
        key_id: Uuid,
        key_sha256: String,
        prefix: String,
        issued_at: DateTime<Utc>,
    },
    #[serde(rename = "ApiKeyRevoked.v1")]
    ApiKeyRevoked {
        key_id: Uuid,
        revoked_at: DateTime<Utc>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("key {key_id} is already issued with another secret; issue a new key id")]
    KeyIdReused { key_id: Uuid },
    #[error("key {key_id} does not belong to this team; list the team's keys first")]
    UnknownKey { key_id: Uuid },
}

pub fn decide(state: &State, command: &Command) -> Result<Vec<Event>, Error> {
    match command {
        Command::IssueKey {
            key_id,
            key_sha256,
            prefix,
            now,
        } => {
            if let Some(existing) = state.keys.get(key_id) {
                return if &existing.sha256 == key_sha256 {
                    Ok(vec![])
                } else {
                    Err(Error::KeyIdReused { key_id: *key_id })
                };
            }
            let mut events = Vec::new();
            if !state.created {
                events.push(Event::TeamCreated { created_at: *now });
            }
            events.push(Event::ApiKeyIssued {
                key_id: *key_id,
                key_sha256: key_sha256.clone(),
                prefix: prefix.clone(),
                issued_at: *now,
            });
            Ok(events)
        }
        Command::RevokeKey { key_id, now } => match state.keys.get(key_id) {
            None => Err(Error::UnknownKey { key_id: *key_id }),
            Some(k) if k.revoked => Ok(vec![]),
            Some(_) => Ok(vec![Event::ApiKeyRevoked {
                key_id: *key_id,
                revoked_at: *now,
            }]),
        },
    }
}

pub fn evolve(mut state: State, event: &Event) -> State {
    match event {
        Event::TeamCreated { .. } => state.created = true,
        Event::ApiKeyIssued {
            key_id, key_sha256, ..
        } => {
            state.keys.insert(
                *key_id,
                KeyState {
                    sha256: key_sha256.clone(),
                    revoked: false,
                },
            );
        }
        Event::ApiKeyRevoked { key_id, .. } => {
            if let Some(k) = state.keys.get_mut(key_id) {
                k.revoked = true;
            }
        }
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 29, 12, 0, 0).unwrap()
    }

    fn issue(key_id: u128, key: &ApiKey) -> Command {
        Command::IssueKey {
            key_id: Uuid::from_u128(key_id),
            key_sha256: key.sha256_hex(),
            prefix: key.display_prefix(),
            now: now(),
        }
    }

    #[test]
    fn keys_have_the_sdk_format_and_never_print() {
        let key = ApiKey::from_random([0xab; 20]);
        assert_eq!(key.expose().len(), 44);
        assert!(ApiKey::parse(key.expose()).is_some());
        assert!(!format!("{key:?}").contains(&key.expose()[10..]));
        for bad in [
            "",
            "e2b_",
            "e2b_XYZ",
            "sk_abababababababababababababababababababab",
            &format!("{}0", key.expose()),
        ] {
            assert!(ApiKey::parse(bad).is_none(), "{bad:?} accepted");
        }
    }

    #[test]
    fn the_first_key_creates_the_team_and_a_retry_is_idempotent() {
        let key = ApiKey::from_random([1; 20]);
        let events = decide(&State::default(), &issue(1, &key)).unwrap();
        assert!(matches!(events[0], Event::TeamCreated { .. }));
        assert!(matches!(events[1], Event::ApiKeyIssued { .. }));
        let state = events.iter().fold(State::default(), evolve);
        assert!(decide(&state, &issue(1, &key)).unwrap().is_empty());
        let other = ApiKey::from_random([2; 20]);
        assert_eq!(
            decide(&state, &issue(1, &other)),
            Err(Error::KeyIdReused {
                key_id: Uuid::from_u128(1)
            })
        );
        let second = decide(&state, &issue(2, &other)).unwrap();
        assert!(matches!(second.as_slice(), [Event::ApiKeyIssued { .. }]));
    }

    #[test]
    fn revocation_is_final_and_unknown_keys_are_refused() {
        let key = ApiKey::from_random([3; 20]);
        let state = decide(&State::default(), &issue(1, &key))
            .unwrap()
            .iter()
            .fold(State::default(), evolve);
        let revoke = Command::RevokeKey {
            key_id: Uuid::from_u128(1),
            now: now(),
        };
        let state = decide(&state, &revoke).unwrap().iter().fold(state, evolve);
        assert!(state.keys[&Uuid::from_u128(1)].revoked);
        assert!(decide(&state, &revoke).unwrap().is_empty());
        assert!(matches!(
            decide(
                &state,
                &Command::RevokeKey {
                    key_id: Uuid::from_u128(9),
                    now: now()
                }
            ),
            Err(Error::UnknownKey { .. })
        ));
    }
}
