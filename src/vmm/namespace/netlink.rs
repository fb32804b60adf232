//! The few routing-netlink requests a sandbox's network needs: a veth pair with one end in
//! another namespace, links up, an IPv4 address, a default route, a link deleted. Spoken
//! directly on a `NETLINK_ROUTE` socket, because each `ip` process costs more than the whole
//! setup (ADR 0022: about 12 ms per `ip` against well under one for a request here).
//!
//! A socket acts on the network namespace of the thread that opened it, for as long as it is
//! open, whichever thread uses it later.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

const NLMSG_ERROR: u16 = 2;
const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_NEWADDR: u16 = 20;
const RTM_NEWROUTE: u16 = 24;

const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;

const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_GROUP: u16 = 27;
const IFLA_NET_NS_FD: u16 = 28;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const VETH_INFO_PEER: u16 = 1;

const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;

const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;

const RT_TABLE_MAIN: u8 = 254;
const RTPROT_BOOT: u8 = 3;
const RT_SCOPE_UNIVERSE: u8 = 0;
const RTN_UNICAST: u8 = 1;

const IFF_UP: u32 = 0x1;

/// A routing-netlink socket in the network namespace it was opened in.
pub struct Netlink {
    fd: OwnedFd,
    seq: u32,
}

/// The far end of a new veth pair.
pub struct Peer<'a> {
    pub name: &'a str,
    /// The namespace it moves to.
    pub netns: BorrowedFd<'a>,
    /// Its interface group: the firewall matches a policy on it (`iifgroup`).
    pub group: u32,
}

impl Netlink {
    /// Opens a socket in the calling thread's network namespace.
    pub fn open() -> io::Result<Netlink> {
        // SAFETY: socket(2) with constant arguments; the result is checked.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor we just opened and own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Netlink { fd, seq: 0 })
    }

    /// Creates the veth pair `name` (here) – `peer` (moved to the peer's namespace).
    pub fn add_veth(&mut self, name: &str, peer: Peer<'_>) -> io::Result<()> {
        let mut m = Message::new(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL);
        m.put(&ifinfomsg(0, 0, 0));
        m.attr(IFLA_IFNAME, &cstring(name));
        m.begin(IFLA_LINKINFO);
        m.attr(IFLA_INFO_KIND, b"veth");
        m.begin(IFLA_INFO_DATA);
        m.begin(VETH_INFO_PEER);
        m.put(&ifinfomsg(0, 0, 0));
        m.attr(IFLA_IFNAME, &cstring(peer.name));
        m.attr(
            IFLA_NET_NS_FD,
            &(peer.netns.as_raw_fd() as u32).to_ne_bytes(),
        );
        m.attr(IFLA_GROUP, &peer.group.to_ne_bytes());
        m.end();
        m.end();
        m.end();
        self.request(m)
    }

    /// Sets link `index` up.
    pub fn set_up(&mut self, index: u32) -> io::Result<()> {
        let mut m = Message::new(RTM_NEWLINK, 0);
        m.put(&ifinfomsg(index, IFF_UP, IFF_UP));
        self.request(m)
    }

    /// Adds `addr/prefix` to link `index`.
    pub fn add_address(&mut self, index: u32, addr: Ipv4Addr, prefix: u8) -> io::Result<()> {
        let mut m = Message::new(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL);
        let mut ifa = [0u8; 8];
        ifa[0] = libc::AF_INET as u8;
        ifa[1] = prefix;
        ifa[3] = RT_SCOPE_UNIVERSE;
        ifa[4..8].copy_from_slice(&index.to_ne_bytes());
        m.put(&ifa);
        m.attr(IFA_LOCAL, &addr.octets());
        m.attr(IFA_ADDRESS, &addr.octets());
        self.request(m)
    }

    /// Adds the default route via `gateway` on link `index`.
    pub fn add_default_route(&mut self, index: u32, gateway: Ipv4Addr) -> io::Result<()> {
        let mut m = Message::new(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL);
        m.put(&[
            libc::AF_INET as u8,
            0, // dst_len: the default route
            0,
            0,
            RT_TABLE_MAIN,
            RTPROT_BOOT,
            RT_SCOPE_UNIVERSE,
            RTN_UNICAST,
            0,
            0,
            0,
            0,
        ]);
        m.attr(RTA_GATEWAY, &gateway.octets());
        m.attr(RTA_OIF, &index.to_ne_bytes());
        self.request(m)
    }

    /// Deletes link `name` (both ends, for a veth). `Ok(false)` when there is none.
    pub fn delete_link(&mut self, name: &str) -> io::Result<bool> {
        let mut m = Message::new(RTM_DELLINK, 0);
        m.put(&ifinfomsg(0, 0, 0));
        m.attr(IFLA_IFNAME, &cstring(name));
        match self.request(m) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Sends `m` and waits for the kernel's acknowledgement.
    fn request(&mut self, m: Message) -> io::Result<()> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let bytes = m.finish(seq);
        // SAFETY: a zeroed sockaddr_nl is the kernel's address (pid 0, no groups).
        let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        kernel.nl_family = libc::AF_NETLINK as u16;
        // SAFETY: sendto on our socket with a buffer and address that outlive the call.
        let sent = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                0,
                (&kernel as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = vec![0u8; 8192];
        loop {
            // SAFETY: recv into a buffer we own, of the length given.
            let n =
                unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(err);
            }
            let mut at = 0usize;
            let n = n as usize;
            while at + 16 <= n {
                let len = u32::from_ne_bytes(buf[at..at + 4].try_into().unwrap()) as usize;
                let kind = u16::from_ne_bytes(buf[at + 4..at + 6].try_into().unwrap());
                let got_seq = u32::from_ne_bytes(buf[at + 8..at + 12].try_into().unwrap());
                if len < 16 || at + len > n {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "a truncated netlink reply",
                    ));
                }
                if kind == NLMSG_ERROR && got_seq == seq && len >= 20 {
                    let code = i32::from_ne_bytes(buf[at + 16..at + 20].try_into().unwrap());
                    return if code == 0 {
                        Ok(())
                    } else {
                        Err(io::Error::from_raw_os_error(-code))
                    };
                }
                at += align(len);
            }
        }
    }
}

/// The index of link `name` in the calling thread's network namespace.
pub fn index_of(name: &str) -> io::Result<u32> {
    let c = std::ffi::CString::new(name).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: a NUL-terminated name; the result is checked.
    let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if index == 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(index)
    }
}

fn ifinfomsg(index: u32, flags: u32, change: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0] = libc::AF_UNSPEC as u8;
    b[4..8].copy_from_slice(&index.to_ne_bytes());
    b[8..12].copy_from_slice(&flags.to_ne_bytes());
    b[12..16].copy_from_slice(&change.to_ne_bytes());
    b
}

fn cstring(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

fn align(n: usize) -> usize {
    (n + 3) & !3
}

/// A request being built: a header, a fixed part, attributes (nested ones by offset).
struct Message {
    buf: Vec<u8>,
    open: Vec<usize>,
}

impl Message {
    fn new(kind: u16, flags: u16) -> Message {
        let mut buf = vec![0u8; 16];
        buf[4..6].copy_from_slice(&kind.to_ne_bytes());
        buf[6..8].copy_from_slice(&(flags | NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
        Message {
            buf,
            open: Vec::new(),
        }
    }

    fn put(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
        self.buf.resize(align(self.buf.len()), 0);
    }

    fn attr(&mut self, kind: u16, data: &[u8]) {
        self.buf
            .extend_from_slice(&((4 + data.len()) as u16).to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.put(data);
    }

    fn begin(&mut self, kind: u16) {
        self.open.push(self.buf.len());
        self.buf.extend_from_slice(&[0, 0]);
        self.buf.extend_from_slice(&kind.to_ne_bytes());
    }

    fn end(&mut self) {
        let at = self.open.pop().expect("an open nested attribute");
        let len = (self.buf.len() - at) as u16;
        self.buf[at..at + 2].copy_from_slice(&len.to_ne_bytes());
    }

    fn finish(mut self, seq: u32) -> Vec<u8> {
        debug_assert!(self.open.is_empty());
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf[8..12].copy_from_slice(&seq.to_ne_bytes());
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_attributes_carry_their_whole_length() {
        let mut m = Message::new(RTM_NEWLINK, 0);
        m.put(&ifinfomsg(0, 0, 0));
        m.begin(IFLA_LINKINFO);
        m.attr(IFLA_INFO_KIND, b"veth");
        m.end();
        let bytes = m.finish(7);
        assert_eq!(
            u32::from_ne_bytes(bytes[0..4].try_into().unwrap()) as usize,
            bytes.len()
        );
        assert_eq!(u32::from_ne_bytes(bytes[8..12].try_into().unwrap()), 7);
        // The nest: its own 4 bytes and the 8-byte kind attribute inside.
        let nest = &bytes[32..];
        assert_eq!(u16::from_ne_bytes(nest[0..2].try_into().unwrap()), 12);
        assert_eq!(
            u16::from_ne_bytes(nest[2..4].try_into().unwrap()),
            IFLA_LINKINFO
        );
        assert_eq!(&nest[8..12], b"veth");
    }
}
