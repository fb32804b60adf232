//! Keeps the node's sandbox firewall in place when something else on the host changes it.
//!
//! The table is the host's, and the host has other writers: an operator's `nft flush ruleset`,
//! a firewall manager reloading its rules, a container engine restarting. Most changes fail
//! closed (a policy chain emptied or its map element gone leaves a link's packets to the base
//! chains' final drop), but a deleted table or emptied base chain opens the node and every
//! private network to every sandbox. So every process that installed a policy looks at the
//! table every [`KEEP_EVERY`] and installs what it needs again, in one transaction, when any
//! of it is missing or differs from what the kernel listed right after its own install.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use serde_json::Value;

use super::firewall::{self, TABLE};
use crate::domain::egress_policy::{EgressPolicy, Ipv4Net};
use crate::vmm::error::{Result, VmmError};

/// How long the firewall may stay changed before the node notices and restores it.
pub const KEEP_EVERY: Duration = Duration::from_secs(2);

/// The policies this process installed, and what the table held for each right after.
static KEPT: Mutex<Vec<Kept>> = Mutex::new(Vec::new());
static KEEPER: OnceLock<()> = OnceLock::new();

struct Kept {
    policy: EgressPolicy,
    subnet: Ipv4Net,
    needs: Needs,
}

/// The parts of the table one policy relies on, as `nft -j` lists them, handles left out:
/// the base chains and the policy's chain (their hooks and rules), the policy's counting set,
/// its element of the dispatch map and its subnet's element of the NAT set.
#[derive(Debug, PartialEq)]
struct Needs {
    chains: BTreeMap<String, (Value, Vec<Value>)>,
    sets: BTreeMap<String, Value>,
    dispatch: Option<Value>,
    subnet: Option<Value>,
}

/// Installs `policy` for `subnet` and keeps it installed for the life of the process.
pub fn install_and_keep(policy: &EgressPolicy, subnet: Ipv4Net) -> Result<()> {
    firewall::install(policy, subnet)?;
    let needs = needs(&list()?, policy, subnet);
    let mut kept = KEPT.lock().expect("firewall keeper lock");
    kept.retain(|k| !(k.policy == *policy && k.subnet == subnet));
    kept.push(Kept {
        policy: policy.clone(),
        subnet,
        needs,
    });
    drop(kept);
    KEEPER.get_or_init(|| {
        std::thread::Builder::new()
            .name("strata-firewall-keeper".into())
            .spawn(keep)
            .expect("starting the firewall keeper thread");
    });
    Ok(())
}

fn keep() {
    loop {
        std::thread::sleep(KEEP_EVERY);
        if let Err(e) = check_once() {
            tracing::warn!(error = %e, "checking the sandbox firewall failed; trying again");
        }
    }
}

/// Compares the table with what each kept policy needs and installs again what differs.
fn check_once() -> Result<()> {
    let listing = list()?;
    let mut kept = KEPT.lock().expect("firewall keeper lock");
    for k in kept.iter_mut() {
        let now = needs(&listing, &k.policy, k.subnet);
        if now == k.needs {
            continue;
        }
        tracing::warn!(
            changed = %what_changed(&k.needs, &now),
            chain = %firewall::chain(&k.policy),
            "the sandbox firewall was changed by something other than strata; installing it again"
        );
        firewall::install(&k.policy, k.subnet)?;
        k.needs = needs(&list()?, &k.policy, k.subnet);
    }
    Ok(())
}

/// The table as `nft -j` lists it; an empty listing when it is gone.
fn list() -> Result<Value> {
    let (family, name) = TABLE.split_once(' ').expect("`family name`");
    let out = Command::new("nft")
        .args(["-j", "list", "table", family, name])
        .output()
        .map_err(VmmError::io("running nft to list the sandbox firewall"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        if err.contains("No such file or directory") {
            return Ok(Value::Null);
        }
        return Err(VmmError::Network(format!(
            "listing the sandbox firewall failed: {}",
            err.trim()
        )));
    }
    serde_json::from_slice(&out.stdout)
        .map_err(|e| VmmError::Network(format!("nft listed the firewall as unreadable JSON: {e}")))
}

/// What of `listing` `policy` on `subnet` relies on.
fn needs(listing: &Value, policy: &EgressPolicy, subnet: Ipv4Net) -> Needs {
    let chain = firewall::chain(policy);
    let counting = firewall::connections_set(policy);
    let wanted = ["forward", "input", "postrouting", chain.as_str()];
    let mut needs = Needs {
        chains: BTreeMap::new(),
        sets: BTreeMap::new(),
        dispatch: None,
        subnet: None,
    };
    let items = listing
        .get("nftables")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    for item in items {
        if let Some(c) = item.get("chain").filter(|c| wanted.contains(&name(c))) {
            needs.chains.entry(name(c).to_string()).or_default().0 = without(c, &["handle"]);
        } else if let Some(r) = item
            .get("rule")
            .filter(|r| wanted.contains(&field(r, "chain")))
        {
            let expr = r.get("expr").cloned().unwrap_or(Value::Null);
            needs
                .chains
                .entry(field(r, "chain").to_string())
                .or_default()
                .1
                .push(expr);
        } else if let Some(s) = item.get("set").filter(|s| name(s) == counting) {
            needs
                .sets
                .insert(counting.clone(), without(s, &["handle", "elem"]));
        } else if let Some(s) = item.get("set").filter(|s| name(s) == "sandbox_nets") {
            let want = serde_json::json!({"prefix": {"addr": subnet.addr().to_string(), "len": subnet.prefix()}});
            needs.subnet = elements(s).find(|e| **e == want).cloned();
        } else if let Some(m) = item.get("map").filter(|m| name(m) == "policies") {
            let key = Value::from(policy.fingerprint());
            needs.dispatch = elements(m).find(|e| e.get(0) == Some(&key)).cloned();
        }
    }
    needs
}

fn name(v: &Value) -> &str {
    field(v, "name")
}

fn field<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}

fn elements(set: &Value) -> impl Iterator<Item = &Value> {
    set.get("elem")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

fn without(v: &Value, keys: &[&str]) -> Value {
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        for k in keys {
            o.remove(*k);
        }
    }
    v
}

/// A short account of what differs, for the log.
fn what_changed(before: &Needs, now: &Needs) -> String {
    let mut changed = Vec::new();
    for (chain, was) in &before.chains {
        match now.chains.get(chain) {
            None => changed.push(format!("chain {chain} gone")),
            Some(is) if is.0 != was.0 => changed.push(format!("chain {chain} redefined")),
            Some(is) if is.1 != was.1 => changed.push(format!(
                "chain {chain} has {} rules, not {}",
                is.1.len(),
                was.1.len()
            )),
            Some(_) => {}
        }
    }
    if before.sets != now.sets {
        changed.push("the connection-counting set changed".into());
    }
    if before.dispatch != now.dispatch {
        changed.push("the policy's dispatch element changed".into());
    }
    if before.subnet != now.subnet {
        changed.push("the sandbox subnet's NAT element changed".into());
    }
    if now.chains.is_empty() && now.dispatch.is_none() {
        return "the table is gone".into();
    }
    changed.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> EgressPolicy {
        EgressPolicy {
            dns: vec!["10.255.255.53".parse().unwrap()],
            ..Default::default()
        }
    }

    /// A listing shaped as `nft -j` gives it: another policy's chain and elements beside ours.
    fn listing(local_drop: bool) -> Value {
        let p = policy();
        let c = firewall::chain(&p);
        let mut rules = vec![
            serde_json::json!({"rule": {"table": "strata", "chain": c, "handle": 9, "expr": [{"accept": null}]}}),
        ];
        if local_drop {
            rules.insert(0, serde_json::json!({"rule": {"table": "strata", "chain": c, "handle": 5, "expr": [{"match": {"op": "==", "left": {"fib": {"result": "type", "flags": ["daddr"]}}, "right": "local"}}, {"drop": null}]}}));
        }
        let mut items = vec![
            serde_json::json!({"metainfo": {"version": "1.0.6"}}),
            serde_json::json!({"map": {"name": "policies", "handle": 2, "elem": [[7, {"jump": {"target": "policy_00000007"}}], [p.fingerprint(), {"jump": {"target": c}}]]}}),
            serde_json::json!({"set": {"name": "sandbox_nets", "handle": 3, "elem": [{"prefix": {"addr": "10.213.0.0", "len": 16}}]}}),
            serde_json::json!({"chain": {"name": "forward", "handle": 1, "hook": "forward", "prio": -10}}),
            serde_json::json!({"chain": {"name": c, "handle": 4}}),
            serde_json::json!({"chain": {"name": "policy_00000007", "handle": 8}}),
            serde_json::json!({"rule": {"chain": "policy_00000007", "handle": 12, "expr": [{"drop": null}]}}),
        ];
        items.extend(rules);
        serde_json::json!({"nftables": items})
    }

    #[test]
    fn handles_and_other_policies_do_not_count_as_changes_but_a_missing_rule_does() {
        let subnet = "10.213.0.0/16".parse().unwrap();
        let before = needs(&listing(true), &policy(), subnet);
        assert!(before.dispatch.is_some() && before.subnet.is_some());
        let mut renumbered = listing(true);
        for item in renumbered["nftables"].as_array_mut().unwrap() {
            if let Some(r) = item.get_mut("rule") {
                r["handle"] = Value::from(100);
            }
        }
        let mut other = renumbered["nftables"].as_array().unwrap().clone();
        other.retain(|i| {
            i.get("rule")
                .map(|r| r["chain"] != "policy_00000007")
                .unwrap_or(true)
        });
        let other = serde_json::json!({"nftables": other});
        assert_eq!(needs(&other, &policy(), subnet), before);

        let opened = needs(&listing(false), &policy(), subnet);
        assert_ne!(opened, before);
        let said = what_changed(&before, &opened);
        assert!(said.contains("has 1 rules, not 2"), "{said}");

        let gone = needs(&Value::Null, &policy(), subnet);
        assert_eq!(what_changed(&before, &gone), "the table is gone");
    }
}
