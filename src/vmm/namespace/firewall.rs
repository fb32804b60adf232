//! The node's sandbox firewall (ADR 0022): one nftables table, `inet strata`, shared by every
//! strata process on the host and written idempotently by each when it starts.
//!
//! * Sandbox links are named `sbx<n>` and carry their policy as the interface group.
//! * Forwarded or host-bound traffic from a sandbox link goes through its policy's chain: a
//!   new flow past the link's connection cap is refused; DNS to the sandbox resolvers and the
//!   allow list's single addresses are accepted; the host's own addresses are dropped; the
//!   allow list's ranges are accepted; IPv6 and the denied ranges are dropped, and the rest
//!   (the public internet) accepted.
//! * Nothing is forwarded from one sandbox link to another, and nothing reaches a sandbox
//!   link unless it answers a connection the sandbox opened.
//! * Sandbox subnets are masqueraded on their way out.
//!
//! Drops are final whatever other tables say; accepts let other tables judge too. What
//! installed a policy keeps it installed (`firewall_keeper.rs`).

use std::io::Write;
use std::process::{Command, Stdio};

use crate::domain::egress::DENIED_V4_NETS;
use crate::domain::egress_policy::{AllowRule, EgressPolicy, Ipv4Net};
use crate::vmm::error::{Result, VmmError};

pub(super) const TABLE: &str = "inet strata";
/// The host-side name prefix of every sandbox link.
pub const LINK_PREFIX: &str = "sbx";

/// The chain holding `policy`'s rules.
pub(super) fn chain(policy: &EgressPolicy) -> String {
    format!("policy_{:08x}", policy.fingerprint())
}

/// The set counting each link's open flows for `policy`'s cap.
pub(super) fn connections_set(policy: &EgressPolicy) -> String {
    format!("conns_{:08x}", policy.fingerprint())
}

/// Adds the rules accepting what `rule` opens to `chain`.
fn allow_rule(line: &mut impl FnMut(String), chain: &str, rule: &AllowRule) {
    let t = TABLE;
    match rule.ports {
        None => line(format!("add rule {t} {chain} ip daddr {} accept", rule.net)),
        Some((a, b)) => {
            let ports = if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            };
            for proto in ["udp", "tcp"] {
                line(format!(
                    "add rule {t} {chain} ip daddr {} {proto} dport {ports} accept",
                    rule.net
                ));
            }
        }
    }
}

/// The nft script that installs the table's base chains (if missing), rewrites them, and
/// adds `policy` (its chain, its group in the dispatch map) and `subnet` (masqueraded).
pub fn script(policy: &EgressPolicy, subnet: Ipv4Net) -> String {
    let t = TABLE;
    let p = LINK_PREFIX;
    let c = chain(policy);
    let mut s = String::new();
    let mut line = |l: String| {
        s.push_str(&l);
        s.push('\n');
    };
    line(format!("add table {t}"));
    line(format!(
        "add chain {t} forward {{ type filter hook forward priority -10; policy accept; }}"
    ));
    line(format!(
        "add chain {t} input {{ type filter hook input priority -10; policy accept; }}"
    ));
    line(format!(
        "add chain {t} postrouting {{ type nat hook postrouting priority 90; policy accept; }}"
    ));
    line(format!(
        "add map {t} policies {{ type devgroup : verdict; }}"
    ));
    line(format!(
        "add set {t} sandbox_nets {{ type ipv4_addr; flags interval; }}"
    ));
    let conns = connections_set(policy);
    line(format!(
        "add set {t} {conns} {{ type ifname; size 65535; flags dynamic; }}"
    ));
    line(format!("add chain {t} {c}"));
    line(format!("flush chain {t} {c}"));
    // Each new flow of a link is counted against the link's cap in the host's conntrack table
    // (the count falls as flows end); past it the sandbox is told at once, not left to time out.
    line(format!(
        "add rule {t} {c} ct state new add @{conns} {{ iifname ct count over {} }} reject with icmpx admin-prohibited",
        policy.max_connections
    ));
    for dns in &policy.dns {
        for proto in ["udp", "tcp"] {
            line(format!(
                "add rule {t} {c} ip daddr {dns} {proto} dport 53 accept"
            ));
        }
    }
    // An exception that names one address alone may open one of the node's own; the node's
    // addresses are dropped before any wider range is consulted, so that allowing a LAN never
    // opens the node (its services, the links' host ends) with it.
    let (one_address, ranges): (Vec<_>, Vec<_>) =
        policy.allow.iter().partition(|r| r.names_one_address());
    for rule in one_address {
        allow_rule(&mut line, &c, rule);
    }
    line(format!("add rule {t} {c} fib daddr type local drop"));
    for rule in ranges {
        allow_rule(&mut line, &c, rule);
    }
    let denied = DENIED_V4_NETS
        .iter()
        .map(|(net, prefix)| format!("{net}/{prefix}"))
        .collect::<Vec<_>>()
        .join(", ");
    line(format!("add rule {t} {c} meta nfproto ipv6 drop"));
    line(format!("add rule {t} {c} ip daddr {{ {denied} }} drop"));
    line(format!("add rule {t} {c} accept"));
    line(format!("flush chain {t} forward"));
    line(format!(
        "add rule {t} forward oifname \"{p}*\" ct state established,related accept"
    ));
    line(format!("add rule {t} forward oifname \"{p}*\" drop"));
    line(format!(
        "add rule {t} forward iifname \"{p}*\" iifgroup vmap @policies"
    ));
    line(format!("add rule {t} forward iifname \"{p}*\" drop"));
    line(format!("flush chain {t} input"));
    line(format!(
        "add rule {t} input iifname \"{p}*\" iifgroup vmap @policies"
    ));
    line(format!("add rule {t} input iifname \"{p}*\" drop"));
    line(format!("flush chain {t} postrouting"));
    line(format!(
        "add rule {t} postrouting ip saddr @sandbox_nets oifname != \"{p}*\" masquerade"
    ));
    line(format!(
        "add element {t} policies {{ {:#x} : jump {c} }}",
        policy.fingerprint()
    ));
    line(format!("add element {t} sandbox_nets {{ {subnet} }}"));
    s
}

/// Installs `policy` for sandboxes on `subnet` (one `nft` transaction: all or nothing) and
/// turns on IPv4 forwarding, which NAT needs.
pub fn install(policy: &EgressPolicy, subnet: Ipv4Net) -> Result<()> {
    let script = script(policy, subnet);
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            VmmError::Network(format!(
                "running nft ({e}): sandbox networks need nftables (`apt-get install nftables`), \
                 or set STRATA_SANDBOX_EGRESS=none"
            ))
        })?;
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(script.as_bytes())
        .map_err(VmmError::io("writing the firewall rules to nft"))?;
    let out = child
        .wait_with_output()
        .map_err(VmmError::io("waiting for nft"))?;
    if !out.status.success() {
        return Err(VmmError::Network(format!(
            "installing the sandbox firewall failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").map_err(VmmError::io(
        "turning on IPv4 forwarding for sandbox networks",
    ))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_is_dropped_before_any_range_and_only_a_single_address_opens_it() {
        let policy = EgressPolicy {
            allow: EgressPolicy::parse_allow("10.9.0.0/16:3128, 192.168.7.0/24, 10.1.2.3:3142")
                .unwrap(),
            dns: EgressPolicy::parse_dns("10.255.255.53").unwrap(),
            max_connections: 77,
            ..Default::default()
        };
        let s = script(&policy, "10.213.0.0/16".parse().unwrap());
        let at = |needle: &str| {
            s.find(needle)
                .unwrap_or_else(|| panic!("`{needle}` missing from:\n{s}"))
        };
        let c = chain(&policy);
        let cap = at("ct count over 77 } reject");
        let dns = at(&format!("{c} ip daddr 10.255.255.53 udp dport 53 accept"));
        let single = at(&format!("{c} ip daddr 10.1.2.3/32 tcp dport 3142 accept"));
        let node = at("fib daddr type local drop");
        let ranges = [
            at(&format!("{c} ip daddr 10.9.0.0/16 tcp dport 3128 accept")),
            at(&format!("{c} ip daddr 192.168.7.0/24 accept")),
        ];
        let v6 = at("ipv6 drop");
        let denied = at("10.0.0.0/8, 100.64.0.0/10");
        let rest = at(&format!("add rule {TABLE} {c} accept"));
        assert!(cap < dns && dns < single && single < node, "{s}");
        assert!(ranges.iter().all(|r| node < *r && *r < v6), "{s}");
        assert!(v6 < denied && denied < rest, "{s}");
        assert!(s.contains("169.254.0.0/16"));
        assert!(s.contains(&format!("{:#x} : jump {c}", policy.fingerprint())));
        assert!(s.contains("sandbox_nets { 10.213.0.0/16 }"));
    }
}
