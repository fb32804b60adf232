//! The tests' own "outside world" (`strata::vmm::namespace::outside`): a network namespace
//! this process makes, linked to the host on a private address (`10.252.0.0/16`, a /30 per
//! world), in which a test starts the servers a sandbox should or should not reach. It dies
//! with the test process; no test traffic leaves the machine.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::ops::Deref;

use strata::vmm::namespace::outside::OutsideWorld;

pub struct Outside(OutsideWorld);

impl Deref for Outside {
    type Target = OutsideWorld;
    fn deref(&self) -> &OutsideWorld {
        &self.0
    }
}

impl Outside {
    pub fn new() -> Outside {
        Outside(
            OutsideWorld::new(
                "10.252.0.0/16".parse().unwrap(),
                "sto",
                "/run/strata/test-outside",
            )
            .expect("the outside world"),
        )
    }

    /// An HTTP server in the world answering every request with `body`; its address.
    pub fn http(&self, body: &'static str) -> SocketAddr {
        let ip = self.ip;
        let listener = self.inside(|| TcpListener::bind((ip, 0)).unwrap());
        serve_http(listener, body)
    }

    /// A TCP server in the world that holds every connection open, saying nothing, until its
    /// client closes it; its address.
    pub fn holding(&self) -> SocketAddr {
        let ip = self.ip;
        let listener = self.inside(|| TcpListener::bind((ip, 0)).unwrap());
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for mut conn in listener.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    while matches!(conn.read(&mut buf), Ok(n) if n > 0) {}
                });
            }
        });
        addr
    }

    /// A DNS server in the world on port 53, answering `A` queries for `name` with `answer`
    /// and every other name with NXDOMAIN.
    pub fn dns(&self, name: &'static str, answer: Ipv4Addr) {
        let ip = self.ip;
        let socket = self.inside(|| UdpSocket::bind((ip, 53)).unwrap());
        std::thread::spawn(move || serve_dns(socket, name, answer));
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
