//! The sandboxes a node's agent answers for, and what each one is.
//!
//! The agent runs in the node's process and speaks for every sandbox the node launched: each
//! request names its sandbox (`E2b-Sandbox-Id`, set by the SDK and kept by the API's forward),
//! carries that sandbox's access token, and is served by asking the sandbox's own agent (inside
//! its namespaces, as its user) to start a process, touch a file or send a signal. Nothing a
//! tenant sends is done on the host.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};

use super::processes::Table;
use crate::vmm::Sandbox;

/// One launched sandbox.
pub struct LiveSandbox {
    pub id: String,
    token: String,
    /// What a request for one of its ports must carry (`allowPublicTraffic: false`); `None`:
    /// they are public. Checked here too, not only by the API: the agent's address may be
    /// reachable by more than the API (`STRATA_AGENT_LISTEN`).
    traffic_token: Option<String>,
    /// Held only to start agents (a quick, synchronous call), never across an await; `None`
    /// once the sandbox was taken for its destruction (a request still in flight then finds
    /// it not running).
    sandbox: Mutex<Option<Box<dyn Sandbox>>>,
    /// The template's user, for requests that name none.
    pub default_user: String,
    /// `/envs`: the create call's `envVars`.
    pub env_vars: BTreeMap<String, String>,
    pub processes: Arc<Table>,
    /// Its open streams, against [`super::budget::MAX_STREAMS`].
    pub streams: super::budget::StreamBudget,
    /// Kept directory watches (`CreateWatcher`); their agents end with them.
    pub watchers: super::watches::Watchers,
}

impl LiveSandbox {
    pub fn new(
        id: String,
        token: String,
        sandbox: Box<dyn Sandbox>,
        default_user: String,
        env_vars: BTreeMap<String, String>,
    ) -> LiveSandbox {
        LiveSandbox {
            id,
            token,
            traffic_token: None,
            sandbox: Mutex::new(Some(sandbox)),
            default_user,
            env_vars,
            processes: Arc::new(Table::default()),
            streams: Default::default(),
            watchers: super::watches::Watchers::default(),
        }
    }

    /// The same sandbox whose ports ask for `token` (`None`: public).
    pub fn with_traffic_token(mut self, token: Option<String>) -> LiveSandbox {
        self.traffic_token = token;
        self
    }

    /// Whether a request for one of its ports may pass, presenting `presented`.
    pub fn traffic_allowed(&self, presented: Option<&str>) -> bool {
        match &self.traffic_token {
            None => true,
            Some(expected) => {
                presented.is_some_and(|p| crate::domain::token::tokens_equal(p, expected))
            }
        }
    }

    /// Compared as the project compares every secret, so a guess learns nothing from timing.
    pub fn token_matches(&self, presented: &str) -> bool {
        crate::domain::token::tokens_equal(presented, &self.token)
    }

    pub fn token(&self) -> &str {
        &self.token
    }

    /// Runs `f` with the sandbox (to start an agent).
    pub fn with<T>(
        &self,
        f: impl FnOnce(&dyn Sandbox) -> crate::vmm::error::Result<T>,
    ) -> crate::vmm::error::Result<T> {
        let guard = self.sandbox.lock().expect("sandbox lock");
        match guard.as_ref() {
            Some(sandbox) => f(sandbox.as_ref()),
            None => Err(crate::vmm::VmmError::Exec(format!(
                "sandbox {} has ended",
                self.id
            ))),
        }
    }

    /// The sandbox itself, for its destruction, whoever still holds this.
    pub fn take_sandbox(&self) -> Option<Box<dyn Sandbox>> {
        self.sandbox.lock().expect("sandbox lock").take()
    }
}

/// Every sandbox this node's agent answers for, by id.
#[derive(Default)]
pub struct Agents {
    live: RwLock<HashMap<String, Arc<LiveSandbox>>>,
}

impl Agents {
    pub fn get(&self, id: &str) -> Option<Arc<LiveSandbox>> {
        self.live.read().expect("agents").get(id).cloned()
    }

    pub fn insert(&self, sandbox: Arc<LiveSandbox>) {
        self.live
            .write()
            .expect("agents")
            .insert(sandbox.id.clone(), sandbox);
    }

    /// Stops answering for `id`; the caller destroys what it gets back.
    pub fn remove(&self, id: &str) -> Option<Arc<LiveSandbox>> {
        self.live.write().expect("agents").remove(id)
    }

    pub fn len(&self) -> usize {
        self.live.read().expect("agents").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
