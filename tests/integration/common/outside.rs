//! The tests' own "outside world": a network namespace this process makes, linked to the host
//! by a veth pair on a private address (`10.252.0.0/16`, a /30 per world), in which a test
//! starts the servers a sandbox should or should not reach. It dies with the test process;
//! no test traffic leaves the machine.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use strata::vmm::namespace::netlink::{self, Netlink};
use strata::vmm::namespace::network::{new_netns, VethEnd};

const LOCKS: &str = "/run/strata/test-outside";
const SLOTS: u32 = 16_384;

pub struct Outside {
    netns: OwnedFd,
    /// The world's address (its `eth0`).
    pub ip: Ipv4Addr,
    /// The host's end of the link.
    pub host_ip: Ipv4Addr,
    link: String,
    _lock: std::fs::File,
}

impl Outside {
    pub fn new() -> Outside {
        std::fs::create_dir_all(LOCKS).unwrap();
        let start = rand::random::<u32>() % SLOTS;
        for i in 0..SLOTS {
            let slot = (start + i) % SLOTS;
            let link = format!("sto{slot}");
            let lock = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(format!("{LOCKS}/{link}.lock"))
                .unwrap();
            // SAFETY: flock on a descriptor we own.
            if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                continue;
            }
            let base = u32::from(Ipv4Addr::new(10, 252, 0, 0)) + slot * 4;
            let (host_ip, ip) = (Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2));
            let mut host = Netlink::open().unwrap();
            let _ = host.delete_link(&link);
            let here = std::fs::File::open("/proc/self/ns/net").unwrap();
            let netns = new_netns(Some(VethEnd {
                host_name: &link,
                host_netns: here.as_fd(),
                group: 0,
                address: ip,
                gateway: host_ip,
            }))
            .expect("the outside world's namespace");
            let index = netlink::index_of(&link).unwrap();
            host.add_address(index, host_ip, 30).unwrap();
            host.set_up(index).unwrap();
            return Outside {
                netns,
                ip,
                host_ip,
                link,
                _lock: lock,
            };
        }
        panic!("no free outside-world slot in {LOCKS}");
    }

    /// `f` run on a thread inside the world's namespace (sockets it opens stay there).
    pub fn inside<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let fd = self.netns.as_raw_fd();
        std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: setns on this thread only, which ends with the closure.
                assert_eq!(unsafe { libc::setns(fd, libc::CLONE_NEWNET) }, 0);
                f()
            })
            .join()
            .unwrap()
        })
    }

    /// An HTTP server in the world answering every request with `body`; its address.
    pub fn http(&self, body: &'static str) -> SocketAddr {
        let ip = self.ip;
        let listener = self.inside(|| TcpListener::bind((ip, 0)).unwrap());
        serve_http(listener, body)
    }

    /// A DNS server in the world on port 53, answering `A` queries for `name` with `answer`
    /// and every other name with NXDOMAIN.
    pub fn dns(&self, name: &'static str, answer: Ipv4Addr) {
        let ip = self.ip;
        let socket = self.inside(|| UdpSocket::bind((ip, 53)).unwrap());
        std::thread::spawn(move || serve_dns(socket, name, answer));
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        if let Ok(mut host) = Netlink::open() {
            let _ = host.delete_link(&self.link);
        }
    }
}

/// Serves `body` to every connection of `listener` on a thread; the listener's address.
pub fn serve_http(listener: TcpListener, body: &'static str) -> SocketAddr {
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = write!(
                conn,
                "HTTP/1.0 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    addr
}

fn serve_dns(socket: UdpSocket, name: &str, answer: Ipv4Addr) {
    let mut buf = [0u8; 512];
    while let Ok((n, from)) = socket.recv_from(&mut buf) {
        let query = &buf[..n];
        if n < 12 {
            continue;
        }
        // The question: labels up to the zero byte, then type and class.
        let mut at = 12;
        let mut labels = Vec::new();
        while at < n && query[at] != 0 {
            let len = query[at] as usize;
            labels.push(String::from_utf8_lossy(&query[at + 1..(at + 1 + len).min(n)]).to_string());
            at += 1 + len;
        }
        let end = at + 5;
        if end > n {
            continue;
        }
        let qtype = u16::from_be_bytes([query[at + 1], query[at + 2]]);
        let found = labels.join(".").eq_ignore_ascii_case(name);
        let mut reply = query[..end].to_vec();
        reply[2] = 0x84 | (query[2] & 0x01); // a response, authoritative, RD copied
        reply[3] = if found { 0x00 } else { 0x03 }; // NOERROR or NXDOMAIN
        reply[6..12].copy_from_slice(&[0, 0, 0, 0, 0, 0]);
        if found && qtype == 1 {
            reply[7] = 1; // one answer
            reply.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]);
            reply.extend_from_slice(&answer.octets());
        }
        let _ = socket.send_to(&reply, from);
    }
}
