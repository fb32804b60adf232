//! The sandbox aggregate (`sandbox-{id}`): a launched template, from the create call to its end.
//!
//! A sandbox is requested by the API (with the template's snapshot already resolved), placed on
//! one node by that node's compare-and-set (the epoch fences every later write of the node),
//! running once the node's agent answers, and ended exactly once: killed by its team, expired at
//! its deadline, failed to start, or lost with its node. Its deadline only moves by an explicit
//! `SetTimeout` (E2B: "now + timeout", which may shorten it) or by a `connect` (which only
//! extends it).
//!
//! The envd access token is part of the request: it is the capability to this one sandbox's
//! agent, the SDK reads it back from every `connect`, and it dies with the sandbox.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

use super::ids::{BuildId, Epoch, SnapshotId, TeamId, TemplateId};

/// A sandbox's id: `i` and 20 lowercase letters or digits, as E2B's. The SDK builds host names
/// (`49983-<id>.<domain>`) and paths from it unescaped, so nothing else is accepted.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SandboxId(String);

const ID_ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

impl SandboxId {
    /// A fresh id from caller-supplied randomness (the domain draws none).
    pub fn from_random(bytes: [u8; 20]) -> SandboxId {
        let mut id = String::with_capacity(21);
        id.push('i');
        for b in bytes {
            id.push(ID_ALPHABET[b as usize % ID_ALPHABET.len()] as char);
        }
        SandboxId(id)
    }

    pub fn parse(value: &str) -> Result<SandboxId, super::ids::IdError> {
        let ok = (2..=64).contains(&value.len())
            && value
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        if ok {
            Ok(SandboxId(value.to_owned()))
        } else {
            Err(super::ids::IdError::Invalid {
                kind: "sandbox id",
                value: value.chars().take(80).collect(),
                rule: "use 2 to 64 lowercase letters and digits",
            })
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for SandboxId {
    type Error = super::ids::IdError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        SandboxId::parse(&value)
    }
}
impl From<SandboxId> for String {
    fn from(id: SandboxId) -> String {
        id.0
    }
}
impl std::fmt::Display for SandboxId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Default and ceiling of a sandbox's life, in seconds (E2B's model default is 300; its
/// hobby plan's ceiling is one hour, a self-hosted operator may want a day).
pub const DEFAULT_TIMEOUT_SECS: u32 = 300;
pub const MAX_TIMEOUT_SECS: u32 = 24 * 3600;

/// What the create call asked for, with the template already resolved to one snapshot.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SandboxRequest {
    pub team: TeamId,
    pub template: TemplateId,
    /// The reference as the caller wrote it (`name`, `name:tag`, or the id): E2B's `alias`.
    pub alias: String,
    pub build: BuildId,
    pub snapshot: SnapshotId,
    pub timeout_secs: u32,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// The process environment every command starts with (under its own `envs`).
    #[serde(default)]
    pub env_vars: BTreeMap<String, String>,
    pub allow_internet: bool,
    /// What the template's build asked for, reported by `get_info`.
    pub cpu_count: u32,
    pub memory_mb: u32,
    pub envd_token: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EndReason {
    Killed,
    Expired,
    Failed,
    Lost,
}

impl EndReason {
    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::Killed => "killed",
            EndReason::Expired => "expired",
            EndReason::Failed => "failed",
            EndReason::Lost => "lost",
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub enum Phase {
    #[default]
    Absent,
    Requested,
    Placed,
    Running,
    Ended(EndReason),
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct State {
    pub phase: Phase,
    pub request: Option<SandboxRequest>,
    pub requested_at: Option<DateTime<Utc>>,
    pub node: Option<String>,
    pub epoch: Epoch,
    pub agent_url: Option<String>,
    pub started_at: Option<DateTime<Utc>>,
    pub end_at: Option<DateTime<Utc>>,
}

impl State {
    pub fn is_ended(&self) -> bool {
        matches!(self.phase, Phase::Ended(_))
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    Request {
        request: SandboxRequest,
        now: DateTime<Utc>,
    },
    /// A node takes a requested sandbox.
    Place {
        node: String,
        now: DateTime<Utc>,
    },
    /// The node's agent answers for the booted sandbox at `agent_url`.
    Run {
        epoch: Epoch,
        agent_url: String,
        now: DateTime<Utc>,
    },
    /// The new deadline is `now + timeout_secs` (it may shorten the sandbox's life).
    SetTimeout {
        timeout_secs: u32,
        now: DateTime<Utc>,
    },
    /// `connect` on a running sandbox: the deadline only grows to `now + timeout_secs`.
    Extend {
        timeout_secs: u32,
        now: DateTime<Utc>,
    },
    Kill {
        now: DateTime<Utc>,
    },
    /// Its deadline passed (a no-op before it did, so a late or early tick writes nothing).
    Expire {
        now: DateTime<Utc>,
    },
    /// The node (epoch) could not boot it, or the create call gave up waiting (`epoch: None`).
    Fail {
        epoch: Option<Epoch>,
        reason: String,
        now: DateTime<Utc>,
    },
    /// Its node is gone (a reconciler's verdict on the node's lease).
    Lose {
        epoch: Epoch,
        reason: String,
        now: DateTime<Utc>,
    },
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "type")]
pub enum Event {
    #[serde(rename = "SandboxRequested.v1")]
    Requested {
        request: SandboxRequest,
        requested_at: DateTime<Utc>,
    },
    #[serde(rename = "SandboxPlaced.v1")]
    Placed {
        node: String,
        epoch: Epoch,
        placed_at: DateTime<Utc>,
    },
    #[serde(rename = "SandboxRunning.v1")]
    Running {
        epoch: Epoch,
        agent_url: String,
        started_at: DateTime<Utc>,
        end_at: DateTime<Utc>,
    },
    #[serde(rename = "SandboxTimeoutSet.v1")]
    TimeoutSet {
        end_at: DateTime<Utc>,
        set_at: DateTime<Utc>,
    },
    #[serde(rename = "SandboxEnded.v1")]
    Ended {
        reason: EndReason,
        #[serde(default)]
        detail: Option<String>,
        ended_at: DateTime<Utc>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("sandbox already exists; create another with a new id")]
    AlreadyExists,
    #[error("sandbox not found")]
    NotFound,
    #[error("sandbox ended ({}); create a new one", .0.as_str())]
    Ended(EndReason),
    #[error("sandbox is already placed on node {node}")]
    AlreadyPlaced { node: String },
    #[error("epoch {given} is not the sandbox's current epoch {current}; this node lost it")]
    Fenced { given: Epoch, current: Epoch },
    #[error("timeout must be between 1 and {MAX_TIMEOUT_SECS} seconds, got {0}")]
    BadTimeout(u32),
    #[error("the sandbox is not running yet")]
    NotRunning,
}

fn deadline(now: DateTime<Utc>, secs: u32) -> DateTime<Utc> {
    now + Duration::seconds(i64::from(secs))
}

pub fn check_timeout(secs: u32) -> Result<u32, Error> {
    if secs == 0 || secs > MAX_TIMEOUT_SECS {
        Err(Error::BadTimeout(secs))
    } else {
        Ok(secs)
    }
}

fn ended(reason: EndReason, detail: Option<String>, now: DateTime<Utc>) -> Vec<Event> {
    vec![Event::Ended {
        reason,
        detail,
        ended_at: now,
    }]
}

pub fn decide(state: &State, command: &Command) -> Result<Vec<Event>, Error> {
    if let (Phase::Absent, cmd) = (&state.phase, command) {
        return match cmd {
            Command::Request { request, now } => {
                check_timeout(request.timeout_secs)?;
                Ok(vec![Event::Requested {
                    request: request.clone(),
                    requested_at: *now,
                }])
            }
            _ => Err(Error::NotFound),
        };
    }
    match command {
        Command::Request { request, .. } => {
            // A replayed request with the same body is its own answer.
            if state.request.as_ref() == Some(request) {
                Ok(Vec::new())
            } else {
                Err(Error::AlreadyExists)
            }
        }
        Command::Place { node, now } => match &state.phase {
            Phase::Requested => Ok(vec![Event::Placed {
                node: node.clone(),
                epoch: state.epoch.next(),
                placed_at: *now,
            }]),
            Phase::Ended(r) => Err(Error::Ended(*r)),
            _ => Err(Error::AlreadyPlaced {
                node: state.node.clone().unwrap_or_default(),
            }),
        },
        Command::Run {
            epoch,
            agent_url,
            now,
        } => {
            fence(state, *epoch)?;
            match &state.phase {
                Phase::Placed => {
                    let secs = state
                        .request
                        .as_ref()
                        .map_or(DEFAULT_TIMEOUT_SECS, |r| r.timeout_secs);
                    Ok(vec![Event::Running {
                        epoch: *epoch,
                        agent_url: agent_url.clone(),
                        started_at: *now,
                        end_at: state.end_at.unwrap_or_else(|| deadline(*now, secs)),
                    }])
                }
                Phase::Running => Ok(Vec::new()),
                Phase::Ended(r) => Err(Error::Ended(*r)),
                _ => Err(Error::NotRunning),
            }
        }
        Command::SetTimeout { timeout_secs, now } => {
            live(state)?;
            check_timeout(*timeout_secs)?;
            Ok(vec![Event::TimeoutSet {
                end_at: deadline(*now, *timeout_secs),
                set_at: *now,
            }])
        }
        Command::Extend { timeout_secs, now } => {
            live(state)?;
            check_timeout(*timeout_secs)?;
            let wanted = deadline(*now, *timeout_secs);
            match state.end_at {
                Some(current) if current >= wanted => Ok(Vec::new()),
                _ => Ok(vec![Event::TimeoutSet {
                    end_at: wanted,
                    set_at: *now,
                }]),
            }
        }
        Command::Kill { now } => {
            live(state)?;
            Ok(ended(EndReason::Killed, None, *now))
        }
        Command::Expire { now } => {
            if state.is_ended() {
                return Ok(Vec::new());
            }
            match state.end_at {
                Some(end) if end <= *now => Ok(ended(EndReason::Expired, None, *now)),
                _ => Ok(Vec::new()),
            }
        }
        Command::Fail { epoch, reason, now } => {
            if state.is_ended() {
                return Ok(Vec::new());
            }
            if let Some(e) = epoch {
                fence(state, *e)?;
            }
            Ok(ended(EndReason::Failed, Some(reason.clone()), *now))
        }
        Command::Lose { epoch, reason, now } => {
            if state.is_ended() {
                return Ok(Vec::new());
            }
            fence(state, *epoch)?;
            Ok(ended(EndReason::Lost, Some(reason.clone()), *now))
        }
    }
}

fn live(state: &State) -> Result<(), Error> {
    match state.phase {
        Phase::Absent => Err(Error::NotFound),
        Phase::Ended(r) => Err(Error::Ended(r)),
        _ => Ok(()),
    }
}

fn fence(state: &State, epoch: Epoch) -> Result<(), Error> {
    if epoch == state.epoch {
        Ok(())
    } else {
        Err(Error::Fenced {
            given: epoch,
            current: state.epoch,
        })
    }
}

pub fn evolve(mut state: State, event: &Event) -> State {
    match event {
        Event::Requested {
            request,
            requested_at,
        } => {
            state.phase = Phase::Requested;
            state.request = Some(request.clone());
            state.requested_at = Some(*requested_at);
        }
        Event::Placed { node, epoch, .. } => {
            state.phase = Phase::Placed;
            state.node = Some(node.clone());
            state.epoch = *epoch;
        }
        Event::Running {
            agent_url,
            started_at,
            end_at,
            ..
        } => {
            state.phase = Phase::Running;
            state.agent_url = Some(agent_url.clone());
            state.started_at = Some(*started_at);
            state.end_at = Some(*end_at);
        }
        Event::TimeoutSet { end_at, .. } => state.end_at = Some(*end_at),
        Event::Ended { reason, .. } => state.phase = Phase::Ended(*reason),
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
    }

    fn request() -> SandboxRequest {
        SandboxRequest {
            team: TeamId::parse("t1").unwrap(),
            template: TemplateId::parse("tpl").unwrap(),
            alias: "tpl".into(),
            build: BuildId::from_uuid(uuid::Uuid::nil()),
            snapshot: SnapshotId::from_uuid(uuid::Uuid::nil()),
            timeout_secs: 60,
            metadata: BTreeMap::new(),
            env_vars: BTreeMap::new(),
            allow_internet: true,
            cpu_count: 2,
            memory_mb: 512,
            envd_token: "tok".into(),
        }
    }

    fn run(commands: &[Command]) -> Result<State, Error> {
        let mut state = State::default();
        for c in commands {
            for e in decide(&state, c)? {
                state = evolve(state, &e);
            }
        }
        Ok(state)
    }

    fn running() -> Vec<Command> {
        vec![
            Command::Request {
                request: request(),
                now: at(0),
            },
            Command::Place {
                node: "n1".into(),
                now: at(1),
            },
            Command::Run {
                epoch: Epoch(1),
                agent_url: "http://127.0.0.1:1".into(),
                now: at(2),
            },
        ]
    }

    #[test]
    fn a_sandbox_runs_until_the_timeout_counted_from_its_start() {
        let s = run(&running()).unwrap();
        assert_eq!(s.phase, Phase::Running);
        assert_eq!(s.end_at, Some(at(62)));
        let early = decide(&s, &Command::Expire { now: at(61) }).unwrap();
        assert!(early.is_empty(), "not expired before its deadline");
        let late = decide(&s, &Command::Expire { now: at(62) }).unwrap();
        assert!(matches!(
            late[..],
            [Event::Ended {
                reason: EndReason::Expired,
                ..
            }]
        ));
    }

    #[test]
    fn only_one_node_places_a_sandbox_and_a_stale_epoch_is_fenced() {
        let mut cmds = running();
        cmds.truncate(2);
        let s = run(&cmds).unwrap();
        let again = decide(
            &s,
            &Command::Place {
                node: "n2".into(),
                now: at(3),
            },
        );
        assert_eq!(again, Err(Error::AlreadyPlaced { node: "n1".into() }));
        let stale = decide(
            &s,
            &Command::Run {
                epoch: Epoch(7),
                agent_url: "x".into(),
                now: at(3),
            },
        );
        assert!(matches!(stale, Err(Error::Fenced { .. })));
    }

    #[test]
    fn a_killed_sandbox_stays_ended_and_answers_as_such() {
        let mut cmds = running();
        cmds.push(Command::Kill { now: at(5) });
        let s = run(&cmds).unwrap();
        assert_eq!(s.phase, Phase::Ended(EndReason::Killed));
        assert_eq!(
            decide(&s, &Command::Kill { now: at(6) }),
            Err(Error::Ended(EndReason::Killed))
        );
        assert_eq!(
            decide(
                &s,
                &Command::SetTimeout {
                    timeout_secs: 10,
                    now: at(6)
                }
            ),
            Err(Error::Ended(EndReason::Killed))
        );
        // Reconciler verdicts after the end write nothing.
        assert!(decide(&s, &Command::Expire { now: at(1000) })
            .unwrap()
            .is_empty());
    }

    #[test]
    fn set_timeout_may_shorten_and_connect_only_extends() {
        let s = run(&running()).unwrap();
        let shorter = decide(
            &s,
            &Command::SetTimeout {
                timeout_secs: 5,
                now: at(10),
            },
        )
        .unwrap();
        assert!(matches!(shorter[..], [Event::TimeoutSet { end_at, .. }] if end_at == at(15)));
        let no_shorter = decide(
            &s,
            &Command::Extend {
                timeout_secs: 5,
                now: at(10),
            },
        )
        .unwrap();
        assert!(no_shorter.is_empty());
        let longer = decide(
            &s,
            &Command::Extend {
                timeout_secs: 600,
                now: at(10),
            },
        )
        .unwrap();
        assert!(matches!(longer[..], [Event::TimeoutSet { end_at, .. }] if end_at == at(610)));
        assert_eq!(
            decide(
                &s,
                &Command::SetTimeout {
                    timeout_secs: 0,
                    now: at(10)
                }
            ),
            Err(Error::BadTimeout(0))
        );
    }

    #[test]
    fn a_replayed_request_is_a_no_op_and_another_body_is_refused() {
        let s = run(&running()[..1]).unwrap();
        assert!(decide(&s, &running()[0]).unwrap().is_empty());
        let mut other = request();
        other.timeout_secs = 61;
        assert_eq!(
            decide(
                &s,
                &Command::Request {
                    request: other,
                    now: at(0)
                }
            ),
            Err(Error::AlreadyExists)
        );
    }

    #[test]
    fn a_create_that_gave_up_fails_the_sandbox_and_its_node_cannot_revive_it() {
        let mut cmds = running();
        cmds.truncate(2);
        cmds.push(Command::Fail {
            epoch: None,
            reason: "no node answered".into(),
            now: at(30),
        });
        let s = run(&cmds).unwrap();
        assert_eq!(s.phase, Phase::Ended(EndReason::Failed));
        assert_eq!(
            decide(
                &s,
                &Command::Run {
                    epoch: Epoch(1),
                    agent_url: "x".into(),
                    now: at(31)
                }
            ),
            Err(Error::Ended(EndReason::Failed))
        );
    }

    #[test]
    fn ids_are_dns_labels_without_dashes() {
        let id = SandboxId::from_random([255; 20]);
        assert_eq!(id.as_str().len(), 21);
        assert!(SandboxId::parse(id.as_str()).is_ok());
        assert!(SandboxId::parse("I-upper").is_err());
        assert!(SandboxId::parse("a-b").is_err());
        assert!(SandboxId::parse("").is_err());
    }
}
