//! A network namespace of the host's own, linked to it by a veth pair on a private /30:
//! an "outside world" whose servers a sandbox may or may not reach, for the tests and
//! `strata bench sandbox` (nothing they send leaves the machine). It dies with the process.

use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use super::netlink::{self, Netlink};
use super::network::{new_netns, VethEnd};
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
    link: String,
    _lock: std::fs::File,
}

impl OutsideWorld {
    /// A world on a free /30 of `subnet`, its link named `<prefix><slot>`, slots locked in
    /// `locks` (host-wide, so concurrent processes take different ones).
    pub fn new(subnet: Ipv4Net, prefix: &str, locks: &str) -> Result<OutsideWorld> {
        std::fs::create_dir_all(locks).map_err(VmmError::io(format!("creating {locks}")))?;
        let slots = (subnet.size() / 4).min(1 << 16) as u32;
        let start = rand::random::<u32>() % slots.max(1);
        for i in 0..slots {
            let slot = (start + i) % slots;
            let link = format!("{prefix}{slot}");
            let path = format!("{locks}/{link}.lock");
            let lock = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .map_err(VmmError::io(format!("opening {path}")))?;
            // SAFETY: flock on a descriptor we own.
            if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                continue;
            }
            let base = u32::from(subnet.addr()) + slot * 4;
            let (host_ip, ip) = (Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2));
            let net = Ipv4Net::new(Ipv4Addr::from(base), 30).expect("an aligned /30");
            let mut host = Netlink::open().map_err(VmmError::io("opening a netlink socket"))?;
            let _ = host.delete_link(&link);
            let here = std::fs::File::open("/proc/self/ns/net")
                .map_err(VmmError::io("opening the host's network namespace"))?;
            let netns = new_netns(Some(VethEnd {
                host_name: &link,
                host_netns: here.as_fd(),
                group: 0,
                address: ip,
                gateway: host_ip,
            }))?;
            netlink::index_of(&link)
                .and_then(|index| {
                    host.add_address(index, host_ip, 30)?;
                    host.set_up(index)
                })
                .map_err(VmmError::io(format!("configuring {link}")))?;
            return Ok(OutsideWorld {
                netns,
                ip,
                host_ip,
                net,
                link,
                _lock: lock,
            });
        }
        Err(VmmError::Network(format!(
            "no free /30 of {subnet} in {locks}"
        )))
    }

    /// `f` run on a thread inside the world's namespace (sockets it opens stay there).
    pub fn inside<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let fd = self.netns.as_raw_fd();
        std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: setns on this thread only, which ends with the closure.
                assert_eq!(
                    unsafe { libc::setns(fd, libc::CLONE_NEWNET) },
                    0,
                    "joining the outside world's namespace"
                );
                f()
            })
            .join()
            .expect("the outside world's thread")
        })
    }
}

impl Drop for OutsideWorld {
    fn drop(&mut self) {
        if let Ok(mut host) = Netlink::open() {
            let _ = host.delete_link(&self.link);
        }
    }
}
