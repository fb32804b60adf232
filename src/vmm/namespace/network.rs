//! Every sandbox's own network namespace (ADR 0022). The namespace is made by the host, owned
//! by the host's user namespace (root in a sandbox holds no capability over its interfaces,
//! routes or firewall), and held open by the sandbox for its whole life, so a checkpoint's new
//! `sandbox-init` joins the same one.
//!
//! With egress on, the namespace has a veth link, `eth0`, whose host end `sbx<n>` has slot
//! `n`'s /30 of the sandbox subnet: `.1` on the host, `.2` in the sandbox, the default route
//! through the host, where the firewall ([`super::firewall`]) judges every packet. Slots are
//! host-wide, one lock file each under `/run/strata/net`, held while the link exists: a
//! process that dies releases its locks, and its namespaces, with its links, go with it.

use std::fs::File;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

use super::firewall::LINK_PREFIX;
use super::firewall_keeper;
use super::host_slots::{HeldSlot, HostSlots};
use super::netlink::{self, Netlink, Peer};
use crate::domain::egress_policy::{EgressMode, EgressPolicy, Ipv4Net};
use crate::vmm::error::{Result, VmmError};

/// Where the host-wide slot locks live.
const SLOTS_DIR: &str = "/run/strata/net";

/// How a node's sandboxes are networked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkConfig {
    pub policy: EgressPolicy,
    /// Sandbox links take their /30s from here. It must not overlap the host's networks.
    pub subnet: Ipv4Net,
}

impl NetworkConfig {
    pub const DEFAULT_SUBNET: &'static str = "10.213.0.0/16";

    /// The default policy with the host's resolvers (from `/etc/resolv.conf`, loopback stubs
    /// excluded; systemd-resolved's upstream list when the stub is all there is).
    pub fn with_host_resolvers(mut policy: EgressPolicy, subnet: Ipv4Net) -> NetworkConfig {
        if policy.dns.is_empty() {
            policy.dns = host_resolvers();
        }
        NetworkConfig { policy, subnet }
    }
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig::with_host_resolvers(
            EgressPolicy::default(),
            NetworkConfig::DEFAULT_SUBNET
                .parse()
                .expect("a valid subnet"),
        )
    }
}

/// The resolvers in the host's `resolv.conf` a sandbox can use.
pub fn host_resolvers() -> Vec<Ipv4Addr> {
    for path in ["/etc/resolv.conf", "/run/systemd/resolve/resolv.conf"] {
        let found = std::fs::read_to_string(path)
            .map(|t| EgressPolicy::resolvers_from_resolv_conf(&t))
            .unwrap_or_default();
        if !found.is_empty() {
            return found;
        }
    }
    Vec::new()
}

/// How many ready namespaces with links a node keeps, so that a boot takes one instead of
/// making one (a veth pair and its namespace cost more than the rest of a boot; ADR 0022).
const SPARE: usize = 4;

/// A node's sandbox networking: its policy installed, namespaces with links made ahead of
/// need, links deleted off the sandbox's path.
pub struct Networks {
    links: Arc<Links>,
    spare: Arc<Spare>,
}

#[derive(Default)]
struct Spare {
    /// The ready namespaces, and whether any sandbox has asked for one yet: a process that
    /// boots no networked sandbox (a one-shot command, most tests) makes none ahead.
    nets: Mutex<(Vec<SandboxNet>, bool)>,
    taken: Condvar,
}

impl Networks {
    /// Installs the firewall for `config` (unless egress is `none`) and starts keeping
    /// spare namespaces.
    pub fn start(config: NetworkConfig) -> Result<Networks> {
        let links = Arc::new(Links::start(config)?);
        let spare = Arc::new(Spare::default());
        if links.config.policy.mode == EgressMode::Public {
            let (weak, spare) = (Arc::downgrade(&links), spare.clone());
            std::thread::Builder::new()
                .name("sandbox-net-spare".into())
                .spawn(move || keep_spares(weak, spare))
                .map_err(VmmError::io("starting the sandbox network thread"))?;
        }
        Ok(Networks { links, spare })
    }

    pub fn config(&self) -> &NetworkConfig {
        &self.links.config
    }

    /// A network namespace for one sandbox: loopback only when `egress` is false or the
    /// node's mode is `none`, else with its link, address and route.
    pub fn create(&self, egress: bool) -> Result<SandboxNet> {
        if egress && self.links.config.policy.mode == EgressMode::Public {
            let spare = {
                let mut nets = self.spare.nets.lock().expect("spare lock");
                nets.1 = true;
                nets.0.pop()
            };
            self.spare.taken.notify_one();
            if let Some(net) = spare {
                return Ok(net);
            }
        }
        self.links.create(egress)
    }
}

/// Keeps [`SPARE`] namespaces with links ready, from the first one asked for, while the
/// node's networks exist.
fn keep_spares(links: Weak<Links>, spare: Arc<Spare>) {
    loop {
        {
            let mut nets = spare.nets.lock().expect("spare lock");
            while !nets.1 || nets.0.len() >= SPARE {
                nets = spare
                    .taken
                    .wait_timeout(nets, Duration::from_secs(1))
                    .expect("spare lock")
                    .0;
                if links.strong_count() == 0 {
                    return;
                }
            }
        }
        let Some(strong) = links.upgrade() else {
            return;
        };
        match strong.create(true) {
            Ok(net) => spare.nets.lock().expect("spare lock").0.push(net),
            Err(e) => {
                tracing::warn!(error = %e, "making a spare sandbox network failed");
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}

/// The node's links: its policy and its slots (none when egress is `none`).
struct Links {
    config: NetworkConfig,
    /// The host's network namespace, where sandbox links' host ends go.
    host_netns: OwnedFd,
    slots: Option<SlotPool>,
}

impl Links {
    fn start(config: NetworkConfig) -> Result<Links> {
        let host_netns = File::open("/proc/self/ns/net")
            .map(OwnedFd::from)
            .map_err(VmmError::io("opening the host's network namespace"))?;
        let slots = match config.policy.mode {
            EgressMode::None => {
                tracing::info!(
                    "sandbox networks: none (loopback only, STRATA_SANDBOX_EGRESS=none)"
                );
                None
            }
            EgressMode::Public => {
                check_subnet_is_free(config.subnet)?;
                let slots = SlotPool::new(config.subnet, LINK_PREFIX, SLOTS_DIR)?;
                if config.policy.dns.is_empty() {
                    tracing::warn!(
                        "the host's resolv.conf names no resolver a sandbox can use (only \
                         loopback stubs); sandboxes get no DNS until STRATA_SANDBOX_DNS names one"
                    );
                }
                firewall_keeper::install_and_keep(&config.policy, config.subnet)?;
                tracing::info!(
                    subnet = %config.subnet,
                    allow = %config.policy.allow.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(","),
                    dns = %config.policy.dns.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(","),
                    "sandbox networks: the public internet, the allow list and DNS; never the node, its networks or other sandboxes"
                );
                Some(slots)
            }
        };
        Ok(Links {
            config,
            host_netns,
            slots,
        })
    }

    fn create(&self, egress: bool) -> Result<SandboxNet> {
        let Some(slots) = self.slots.as_ref().filter(|_| egress) else {
            return Ok(SandboxNet {
                netns: new_netns(None)?,
                link: None,
                resolvers: Vec::new(),
            });
        };
        let slot = slots.take()?;
        let netns = linked_netns(
            &slot,
            self.host_netns.as_fd(),
            self.config.policy.fingerprint(),
        )?;
        Ok(SandboxNet {
            netns,
            link: Some(slot),
            resolvers: self.config.policy.dns.clone(),
        })
    }
}

/// Waits for a released link to go with its namespace (the kernel tears namespaces down in
/// batches), deleting it only if it lingers; the slot is free once it is gone (the lock is
/// dropped with `link`). Its own socket: a deletion waits out an RCU grace period, which no
/// other link's setup should wait behind.
fn release(link: Slot) {
    for _ in 0..100 {
        if netlink::index_of(&link.name).is_err() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Ok(mut nl) = Netlink::open() {
        let _ = nl.delete_link(&link.name);
    }
}

/// Host-wide /30 slots of a subnet for links named `<prefix><n>`, one [`HostSlots`] slot each,
/// held while the link exists, taken round-robin so that a freed address is not reused at once
/// (conntrack entries of the last holder time out first).
pub struct SlotPool {
    subnet: Ipv4Net,
    prefix: &'static str,
    slots: HostSlots,
}

/// One slot, locked: its link's name and the two addresses of its /30.
pub struct Slot {
    pub name: String,
    /// `.1`, the host's end.
    pub host_ip: Ipv4Addr,
    /// `.2`, the namespace's `eth0`.
    pub ip: Ipv4Addr,
    pub net: Ipv4Net,
    _held: HeldSlot,
}

impl SlotPool {
    pub fn new(subnet: Ipv4Net, prefix: &'static str, dir: &str) -> Result<SlotPool> {
        let count = (subnet.size() / 4).min(100_000) as u32;
        if count == 0 {
            return Err(VmmError::Network(format!(
                "the subnet {subnet} holds no /30; give a /16 or so (STRATA_SANDBOX_SUBNET)"
            )));
        }
        let slots = HostSlots::new(dir, prefix, 0, count)
            .map_err(VmmError::io(format!("creating {dir}")))?;
        Ok(SlotPool {
            subnet,
            prefix,
            slots,
        })
    }

    pub fn take(&self) -> Result<Slot> {
        let held = self
            .slots
            .take()
            .map_err(VmmError::io(format!(
                "locking a slot in {}",
                self.slots.dir().display()
            )))?
            .ok_or_else(|| {
                VmmError::Network(format!(
                    "all {} links of {} are in use; give a larger STRATA_SANDBOX_SUBNET",
                    self.slots.count(),
                    self.subnet
                ))
            })?;
        let index = held.number();
        let base = u32::from(self.subnet.addr()) + index * 4;
        Ok(Slot {
            name: format!("{}{index}", self.prefix),
            host_ip: Ipv4Addr::from(base + 1),
            ip: Ipv4Addr::from(base + 2),
            net: Ipv4Net::new(Ipv4Addr::from(base), 30).expect("an aligned /30"),
            _held: held,
        })
    }
}

/// A new network namespace linked to the host through `slot`: its `eth0` has `slot.ip` and
/// the default route via the host's end, `slot.name` in `host_netns` with `slot.host_ip` and
/// interface group `group` (the firewall's policy key, or 0).
pub fn linked_netns(slot: &Slot, host_netns: BorrowedFd<'_>, group: u32) -> Result<OwnedFd> {
    let mut host = Netlink::open().map_err(VmmError::io("opening a netlink socket"))?;
    // A link left by a namespace the kernel has not finished tearing down.
    let _ = host.delete_link(&slot.name);
    let netns = new_netns(Some(VethEnd {
        peer: Peer {
            name: &slot.name,
            netns: host_netns,
            group,
        },
        address: slot.ip,
        gateway: slot.host_ip,
    }))?;
    netlink::index_of(&slot.name)
        .and_then(|index| {
            host.add_address(index, slot.host_ip, 30)?;
            host.set_up(index)
        })
        .map_err(VmmError::io(format!("configuring {}", slot.name)))?;
    Ok(netns)
}

/// Refuses a sandbox subnet that holds an address of the host's (other than sandbox links').
fn check_subnet_is_free(subnet: Ipv4Net) -> Result<()> {
    for (name, ip) in crate::host_interfaces::addresses() {
        if let std::net::IpAddr::V4(v4) = ip {
            if subnet.contains(v4) && !name.starts_with(LINK_PREFIX) {
                return Err(VmmError::Network(format!(
                    "the sandbox subnet {subnet} overlaps {name}'s address {v4}; choose \
                     another with STRATA_SANDBOX_SUBNET"
                )));
            }
        }
    }
    Ok(())
}

/// The namespace's side of a veth link, set up inside a new namespace: `eth0` with
/// `address/30` and the default route via `gateway`, its `peer` moved out.
struct VethEnd<'a> {
    peer: Peer<'a>,
    address: Ipv4Addr,
    gateway: Ipv4Addr,
}

/// Makes a network namespace on a thread of its own (a network namespace is per thread, and
/// that thread ends with the work), brings loopback up in it and, with `link`, the sandbox's
/// end of its veth pair.
fn new_netns(link: Option<VethEnd<'_>>) -> Result<OwnedFd> {
    std::thread::scope(|s| {
        s.spawn(|| -> std::io::Result<OwnedFd> {
            // SAFETY: unshare on this thread only; it exits when this closure returns.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let ns = File::open("/proc/thread-self/ns/net")?;
            let mut nl = Netlink::open()?;
            nl.set_up(1)?;
            if let Some(link) = link {
                nl.add_veth("eth0", link.peer)?;
                let index = netlink::index_of("eth0")?;
                nl.set_up(index)?;
                nl.add_address(index, link.address, 30)?;
                nl.add_default_route(index, link.gateway)?;
            }
            Ok(OwnedFd::from(ns))
        })
        .join()
        .expect("network namespace thread")
    })
    .map_err(VmmError::io("making the sandbox's network namespace"))
}

/// One sandbox's network namespace, and its link while it has one.
pub struct SandboxNet {
    netns: OwnedFd,
    /// The slot of its link, while it has one.
    link: Option<Slot>,
    resolvers: Vec<Ipv4Addr>,
}

impl SandboxNet {
    /// The namespace, for `setns` in the sandbox's first process.
    pub fn netns(&self) -> BorrowedFd<'_> {
        self.netns.as_fd()
    }

    /// The `resolv.conf` the sandbox sees, or `None` without a link (nothing to resolve).
    pub fn resolv_conf(&self) -> Option<String> {
        self.link.as_ref()?;
        let mut text = String::from("# strata: the node's resolvers (STRATA_SANDBOX_DNS)\n");
        for r in &self.resolvers {
            text.push_str(&format!("nameserver {r}\n"));
        }
        Some(text)
    }
}

impl Drop for SandboxNet {
    /// Frees the link's slot once the link is gone, on a thread of its own: the namespace's
    /// teardown, or a deletion, waits for the kernel, which the sandbox's destroy need not.
    fn drop(&mut self) {
        if let Some(link) = self.link.take() {
            let _ = std::thread::Builder::new()
                .name("sandbox-net-release".into())
                .spawn(move || release(link));
        }
    }
}
