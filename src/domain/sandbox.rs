//! The sandbox aggregate (`sandbox-{id}`): a launched template, from the create call to its end.
//!
//! A sandbox is requested by the API (with the template's snapshot already resolved), placed on
//! one node by that node's compare-and-set (the epoch fences every later write of the node),
//! running once the node's agent answers, and ended exactly once: killed by its team, expired at
//! its deadline, failed to start, or lost with its node. Its deadline only moves by an explicit
//! `SetTimeout` (E2B: "now + timeout", which may shorten it) or by a `connect` (which only
//! extends it).
//!
//! Pause keeps the filesystem only (E2B's `mode="filesystem"`): the node that runs it seals its
//! writable layer as a checkpoint layer and stops it; the sandbox is then `Paused` with the
//! whole stack it resumes on, on no node. A resume asks for placement again (`Requested`), and
//! whichever node places it boots that stack and runs the template's start command again. A
//! resume that does not get as far as `Running` (its node failed or died, the caller gave up)
//! returns the sandbox to `Paused`: its files are kept, never lost with a node that only tried
//! to boot them.
//!
//! The envd access token is part of the request: it is the capability to this one sandbox's
//! agent, the SDK reads it back from every `connect`, and it dies with the sandbox.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

use super::ids::{BuildId, Digest, Epoch, SnapshotId, TeamId, TemplateId};

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
    /// The token a request for one of its ports must carry (`e2b-traffic-access-token`), when
    /// it was created with `allowPublicTraffic: false`; `None`: its ports are public (E2B's
    /// default, and every sandbox requested before this field).
    #[serde(default)]
    pub traffic_token: Option<String>,
    /// Pause at the deadline instead of ending (E2B's `autoPause`, lifecycle
    /// `on_timeout="pause"`).
    #[serde(default)]
    pub auto_pause: bool,
    /// The sandbox backend it runs on, resolved at create over the template's pin, the team's,
    /// `STRATA_SANDBOX_BACKEND` and the default; `None` for sandboxes requested before the
    /// setting, which ran the only backend there was (`namespace`).
    #[serde(default)]
    pub backend: Option<crate::domain::backend_name::ResolvedBackend>,
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
    /// Asked to pause; its node is sealing its filesystem.
    Pausing,
    /// Its filesystem is stored as `State::paused_layers`; it runs on no node.
    Paused,
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
    /// The stack the last pause stored, bottom first: what a resume boots on.
    pub paused_layers: Option<Vec<Digest>>,
    /// The life a resume asked for, counted from the resumed sandbox's start.
    pub resume_timeout_secs: Option<u32>,
}

impl State {
    pub fn is_ended(&self) -> bool {
        matches!(self.phase, Phase::Ended(_))
    }

    /// Booting again from a pause (requested or placed after `Resumed`).
    pub fn is_resuming(&self) -> bool {
        self.paused_layers.is_some() && matches!(self.phase, Phase::Requested | Phase::Placed)
    }

    /// The layers a node boots this sandbox on: the last pause's stack, or `None` for the
    /// template's snapshot.
    pub fn boot_layers(&self) -> Option<&[Digest]> {
        self.paused_layers.as_deref()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    Request {
        /// Boxed: the request is most of a command's size, and the other variants are small.
        request: Box<SandboxRequest>,
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
    /// Pause a running sandbox (its filesystem is kept, its processes are not).
    Pause {
        now: DateTime<Utc>,
    },
    /// The node (epoch) stored the pausing sandbox's filesystem as the stack `layers`.
    RecordPaused {
        epoch: Epoch,
        layers: Vec<Digest>,
        now: DateTime<Utc>,
    },
    /// Boot a paused sandbox again, to live `timeout_secs` from its start.
    Resume {
        timeout_secs: u32,
        now: DateTime<Utc>,
    },
    /// Its deadline passed (a no-op before it did, so a late or early tick writes nothing): it
    /// ends, or pauses when its request asked for `auto_pause`.
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
        /// Boxed as in [`Command::Request`]; serialized as the request itself.
        request: Box<SandboxRequest>,
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
    #[serde(rename = "SandboxPausing.v1")]
    Pausing {
        /// The deadline paused it (`auto_pause`), not a caller.
        #[serde(default)]
        on_timeout: bool,
        requested_at: DateTime<Utc>,
    },
    #[serde(rename = "SandboxPaused.v1")]
    Paused {
        epoch: Epoch,
        /// The whole stack a resume boots on, bottom first.
        layers: Vec<Digest>,
        paused_at: DateTime<Utc>,
    },
    #[serde(rename = "SandboxResumed.v1")]
    Resumed {
        timeout_secs: u32,
        resumed_at: DateTime<Utc>,
    },
    /// A resume did not get as far as running; the sandbox is paused again, its files intact.
    #[serde(rename = "SandboxResumeFailed.v1")]
    ResumeFailed {
        reason: String,
        failed_at: DateTime<Utc>,
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
    #[error("the sandbox is already paused")]
    AlreadyPaused,
    #[error("the sandbox is paused; connect to it to resume it first")]
    Paused,
    #[error("the sandbox is pausing; wait until it is paused")]
    Pausing,
    #[error("the sandbox is running, not paused")]
    NotPaused,
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
            if state.request.as_ref() == Some(&**request) {
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
                    let secs = state.resume_timeout_secs.unwrap_or_else(|| {
                        state
                            .request
                            .as_ref()
                            .map_or(DEFAULT_TIMEOUT_SECS, |r| r.timeout_secs)
                    });
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
            not_paused(state)?;
            check_timeout(*timeout_secs)?;
            Ok(vec![Event::TimeoutSet {
                end_at: deadline(*now, *timeout_secs),
                set_at: *now,
            }])
        }
        Command::Extend { timeout_secs, now } => {
            live(state)?;
            not_paused(state)?;
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
        Command::Pause { now } => match state.phase {
            Phase::Running => Ok(vec![Event::Pausing {
                on_timeout: false,
                requested_at: *now,
            }]),
            // Its caller waits for the pause under way.
            Phase::Pausing => Ok(Vec::new()),
            Phase::Paused => Err(Error::AlreadyPaused),
            Phase::Ended(r) => Err(Error::Ended(r)),
            Phase::Absent => Err(Error::NotFound),
            Phase::Requested | Phase::Placed => Err(Error::NotRunning),
        },
        Command::RecordPaused { epoch, layers, now } => {
            fence(state, *epoch)?;
            match state.phase {
                Phase::Pausing => Ok(vec![Event::Paused {
                    epoch: *epoch,
                    layers: layers.clone(),
                    paused_at: *now,
                }]),
                Phase::Paused if state.paused_layers.as_ref() == Some(layers) => Ok(Vec::new()),
                Phase::Ended(r) => Err(Error::Ended(r)),
                _ => Err(Error::NotRunning),
            }
        }
        Command::Resume { timeout_secs, now } => {
            check_timeout(*timeout_secs)?;
            match state.phase {
                Phase::Paused => Ok(vec![Event::Resumed {
                    timeout_secs: *timeout_secs,
                    resumed_at: *now,
                }]),
                Phase::Pausing => Err(Error::Pausing),
                Phase::Ended(r) => Err(Error::Ended(r)),
                _ => Err(Error::NotPaused),
            }
        }
        Command::Expire { now } => {
            if !matches!(state.phase, Phase::Placed | Phase::Running) {
                // Not yet started, pausing, paused (no deadline) or ended.
                return Ok(Vec::new());
            }
            match state.end_at {
                Some(end) if end <= *now => {
                    let pause = state.request.as_ref().is_some_and(|r| r.auto_pause);
                    if pause && state.phase == Phase::Running {
                        Ok(vec![Event::Pausing {
                            on_timeout: true,
                            requested_at: *now,
                        }])
                    } else {
                        Ok(ended(EndReason::Expired, None, *now))
                    }
                }
                _ => Ok(Vec::new()),
            }
        }
        Command::Fail { epoch, reason, now } => {
            if state.is_ended() || state.phase == Phase::Paused {
                return Ok(Vec::new());
            }
            if let Some(e) = epoch {
                fence(state, *e)?;
            }
            if state.is_resuming() {
                return Ok(resume_failed(reason, *now));
            }
            Ok(ended(EndReason::Failed, Some(reason.clone()), *now))
        }
        Command::Lose { epoch, reason, now } => {
            if state.is_ended() || state.phase == Phase::Paused {
                return Ok(Vec::new());
            }
            fence(state, *epoch)?;
            if state.is_resuming() {
                // Its node died booting it: the stored stack is intact, another node may try.
                return Ok(resume_failed(reason, *now));
            }
            Ok(ended(EndReason::Lost, Some(reason.clone()), *now))
        }
    }
}

fn resume_failed(reason: &str, now: DateTime<Utc>) -> Vec<Event> {
    vec![Event::ResumeFailed {
        reason: reason.to_owned(),
        failed_at: now,
    }]
}

fn not_paused(state: &State) -> Result<(), Error> {
    match state.phase {
        Phase::Paused => Err(Error::Paused),
        Phase::Pausing => Err(Error::Pausing),
        _ => Ok(()),
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
            state.request = Some((**request).clone());
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
        Event::Pausing { .. } => state.phase = Phase::Pausing,
        Event::Paused { layers, .. } => {
            state.phase = Phase::Paused;
            state.paused_layers = Some(layers.clone());
            state.node = None;
            state.agent_url = None;
            state.end_at = None;
        }
        Event::Resumed { timeout_secs, .. } => {
            state.phase = Phase::Requested;
            state.resume_timeout_secs = Some(*timeout_secs);
            state.end_at = None;
        }
        Event::ResumeFailed { .. } => {
            state.phase = Phase::Paused;
            state.node = None;
        }
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
            traffic_token: None,
            auto_pause: false,
            backend: None,
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
                request: Box::new(request()),
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
                    request: Box::new(other),
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

    fn layers(n: u8) -> Vec<Digest> {
        (1..=n).map(|i| Digest::from_bytes([i; 32])).collect()
    }

    fn paused() -> Vec<Command> {
        let mut cmds = running();
        cmds.push(Command::Pause { now: at(10) });
        cmds.push(Command::RecordPaused {
            epoch: Epoch(1),
            layers: layers(3),
            now: at(11),
        });
        cmds
    }

    #[test]
    fn a_paused_sandbox_keeps_its_stack_runs_nowhere_and_resumes_on_a_new_epoch() {
        let s = run(&paused()).unwrap();
        assert_eq!(s.phase, Phase::Paused);
        assert_eq!(s.boot_layers(), Some(&layers(3)[..]));
        assert_eq!((s.node.as_deref(), s.end_at), (None, None));
        // A paused sandbox has no deadline, and pausing it again says so.
        assert!(decide(&s, &Command::Expire { now: at(100_000) })
            .unwrap()
            .is_empty());
        assert_eq!(
            decide(&s, &Command::Pause { now: at(12) }),
            Err(Error::AlreadyPaused)
        );
        assert_eq!(
            decide(
                &s,
                &Command::Extend {
                    timeout_secs: 30,
                    now: at(12)
                }
            ),
            Err(Error::Paused)
        );

        let mut cmds = paused();
        cmds.extend([
            Command::Resume {
                timeout_secs: 30,
                now: at(20),
            },
            Command::Place {
                node: "n2".into(),
                now: at(21),
            },
            Command::Run {
                epoch: Epoch(2),
                agent_url: "http://127.0.0.1:2".into(),
                now: at(22),
            },
        ]);
        let s = run(&cmds).unwrap();
        assert_eq!(s.phase, Phase::Running);
        assert_eq!(s.node.as_deref(), Some("n2"));
        // The resume's life counts from the resumed start.
        assert_eq!(s.end_at, Some(at(52)));
        // The first node's epoch can no longer write.
        assert!(matches!(
            decide(
                &s,
                &Command::Lose {
                    epoch: Epoch(1),
                    reason: "n1 died".into(),
                    now: at(23)
                }
            ),
            Err(Error::Fenced { .. })
        ));
    }

    #[test]
    fn only_a_running_sandbox_pauses_and_only_its_node_records_the_pause() {
        let s = run(&running()[..2]).unwrap();
        assert_eq!(
            decide(&s, &Command::Pause { now: at(3) }),
            Err(Error::NotRunning)
        );
        let mut cmds = running();
        cmds.push(Command::Pause { now: at(10) });
        let pausing = run(&cmds).unwrap();
        assert_eq!(pausing.phase, Phase::Pausing);
        // A second caller waits for the same pause.
        assert!(decide(&pausing, &Command::Pause { now: at(10) })
            .unwrap()
            .is_empty());
        assert_eq!(
            decide(
                &pausing,
                &Command::Resume {
                    timeout_secs: 30,
                    now: at(10)
                }
            ),
            Err(Error::Pausing)
        );
        assert!(matches!(
            decide(
                &pausing,
                &Command::RecordPaused {
                    epoch: Epoch(9),
                    layers: layers(1),
                    now: at(11)
                }
            ),
            Err(Error::Fenced { .. })
        ));
        // A node dying mid-pause loses the sandbox: nothing was stored.
        let lost = decide(
            &pausing,
            &Command::Lose {
                epoch: Epoch(1),
                reason: "n1 died".into(),
                now: at(12),
            },
        )
        .unwrap();
        assert!(matches!(
            lost[..],
            [Event::Ended {
                reason: EndReason::Lost,
                ..
            }]
        ));
    }

    #[test]
    fn a_resume_that_does_not_reach_running_leaves_the_sandbox_paused_with_its_files() {
        let mut cmds = paused();
        cmds.extend([
            Command::Resume {
                timeout_secs: 30,
                now: at(20),
            },
            Command::Place {
                node: "n2".into(),
                now: at(21),
            },
            Command::Lose {
                epoch: Epoch(2),
                reason: "n2 died".into(),
                now: at(40),
            },
        ]);
        let s = run(&cmds).unwrap();
        assert_eq!(s.phase, Phase::Paused);
        assert_eq!(s.boot_layers(), Some(&layers(3)[..]));

        // The caller giving up before any node placed it, likewise.
        let mut cmds = paused();
        cmds.extend([
            Command::Resume {
                timeout_secs: 30,
                now: at(20),
            },
            Command::Fail {
                epoch: None,
                reason: "no node".into(),
                now: at(50),
            },
        ]);
        let s = run(&cmds).unwrap();
        assert_eq!(s.phase, Phase::Paused);
        // And it resumes again later.
        assert!(matches!(
            decide(
                &s,
                &Command::Resume {
                    timeout_secs: 30,
                    now: at(60)
                }
            )
            .unwrap()[..],
            [Event::Resumed { .. }]
        ));
        // Killing a paused sandbox ends it.
        let killed = run(&[cmds, vec![Command::Kill { now: at(70) }]].concat()).unwrap();
        assert_eq!(killed.phase, Phase::Ended(EndReason::Killed));
    }

    #[test]
    fn auto_pause_pauses_at_the_deadline_instead_of_ending() {
        let mut req = request();
        req.auto_pause = true;
        let mut cmds = running();
        cmds[0] = Command::Request {
            request: Box::new(req),
            now: at(0),
        };
        let s = run(&cmds).unwrap();
        let due = decide(&s, &Command::Expire { now: at(62) }).unwrap();
        assert!(matches!(
            due[..],
            [Event::Pausing {
                on_timeout: true,
                ..
            }]
        ));
        let pausing = due.iter().fold(s, evolve);
        assert!(decide(&pausing, &Command::Expire { now: at(100) })
            .unwrap()
            .is_empty());
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

    #[test]
    fn a_request_recorded_before_the_backend_setting_decodes_with_none() {
        let mut json = serde_json::to_value(request()).unwrap();
        json.as_object_mut().unwrap().remove("backend");
        let back: SandboxRequest = serde_json::from_value(json).unwrap();
        assert_eq!(back.backend, None);
        assert_eq!(back, request());
    }
}
