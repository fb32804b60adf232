//! A network namespace of the host's own, linked to it by a veth pair on a private /30:
//! an "outside world" whose servers a sandbox may or may not reach, for the tests and
//! `strata bench sandbox` (nothing they send leaves the machine). It dies with the process.

use std::net::Ipv4Addr;
use std::os::fd::{AsFd, OwnedFd};

use super::netlink::Netlink;
use super::network::{linked_netns, Slot, SlotPool};
use crate::domain::egress_policy::Ipv4Net;
use crate::vmm::error::{Result, VmmError};

pub struct OutsideWorld {
    netns: OwnedFd,
    /// The world's address (its `eth0`).
    pub ip: Ipv4Addr,
    /// The host's end of the link.
    pub host_ip: Ipv4Addr,
    /// The /30 of both.
    pub net: Ipv4Net,
    slot: Slot,
}

impl OutsideWorld {
    /// A world on a free /30 of `subnet`, its link named `<prefix><slot>`, slots locked in
    /// `locks` (host-wide, so concurrent processes take different ones).
    pub fn new(subnet: Ipv4Net, prefix: &'static str, locks: &str) -> Result<OutsideWorld> {
        let slot = SlotPool::new(subnet, prefix, locks)?.take()?;
        let here = std::fs::File::open("/proc/self/ns/net")
            .map_err(VmmError::io("opening the host's network namespace"))?;
        let netns = linked_netns(&slot, here.as_fd(), 0)?;
        Ok(OutsideWorld {
            netns,
            ip: slot.ip,
            host_ip: slot.host_ip,
            net: slot.net,
            slot,
        })
    }

    /// `f` run on a thread inside the world's namespace (sockets it opens stay there).
    pub fn inside<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        crate::vmm::port_door::in_network_namespace(self.netns.as_fd(), f)
            .expect("joining the outside world's namespace")
    }
}

impl Drop for OutsideWorld {
    fn drop(&mut self) {
        if let Ok(mut host) = Netlink::open() {
            let _ = host.delete_link(&self.slot.name);
        }
    }
}
