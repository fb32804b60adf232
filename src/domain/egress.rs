//! Which addresses a tenant may make strata reach: the public internet, and nothing of the
//! node's own networks unless the operator listed it.
//!
//! Denied by default: loopback, the unspecified and broadcast addresses, `0.0.0.0/8`, RFC 1918
//! (`10/8`, `172.16/12`, `192.168/16`), link-local (`169.254/16`, `fe80::/10`: cloud metadata
//! services live there), shared address space (`100.64/10`), unique local (`fc00::/7`),
//! multicast, the reserved `240/4`, and every IPv4 address in its IPv6 forms (mapped,
//! compatible, NAT64 well-known prefix) judged as that IPv4 address. Everything else is public.
//! The registry client applies it to every host it connects to, token realms and redirects
//! included (ADR 0022); the sandbox network's egress rules take the same lists.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Whether `ip` is outside every denied range.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Some(v4) => is_public_v4(v4),
            None => is_public_v6(v6),
        },
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    !(ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_multicast()
        || ip.is_broadcast()
        || ip.is_unspecified()
        || a == 0
        || (a == 100 && (64..128).contains(&b))
        || a >= 240)
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let first = ip.segments()[0];
    !(ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || (first & 0xfe00) == 0xfc00
        || (first & 0xffc0) == 0xfe80)
}

/// The denied IPv4 ranges as networks, for a firewall that matches prefixes (the sandbox
/// network's egress rules): exactly the IPv4 addresses [`is_public`] refuses.
pub const DENIED_V4_NETS: [(Ipv4Addr, u8); 9] = [
    (Ipv4Addr::new(0, 0, 0, 0), 8),
    (Ipv4Addr::new(10, 0, 0, 0), 8),
    (Ipv4Addr::new(100, 64, 0, 0), 10),
    (Ipv4Addr::new(127, 0, 0, 0), 8),
    (Ipv4Addr::new(169, 254, 0, 0), 16),
    (Ipv4Addr::new(172, 16, 0, 0), 12),
    (Ipv4Addr::new(192, 168, 0, 0), 16),
    (Ipv4Addr::new(224, 0, 0, 0), 4),
    (Ipv4Addr::new(240, 0, 0, 0), 4),
];

/// The IPv4 address an IPv6 address stands for: `::ffff:a.b.c.d`, `::a.b.c.d`, `64:ff9b::/96`.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let tail = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    match s {
        [0, 0, 0, 0, 0, 0xffff, _, _] => Some(tail),
        [0, 0, 0, 0, 0, 0, _, _] if !ip.is_loopback() && !ip.is_unspecified() => Some(tail),
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(tail),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn public(s: &str) -> bool {
        is_public(s.parse().unwrap())
    }

    #[test]
    fn the_nodes_own_networks_are_denied() {
        for denied in [
            "127.0.0.1",
            "127.255.0.9",
            "0.0.0.0",
            "0.1.2.3",
            "10.255.255.53",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.255",
            "224.0.0.1",
            "255.255.255.255",
            "240.0.0.1",
            "::1",
            "::",
            "fe80::1",
            "fd00::2",
            "fc00::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::10.0.0.1",
            "64:ff9b::a9fe:a9fe",
        ] {
            assert!(!public(denied), "{denied} must be denied");
        }
    }

    #[test]
    fn the_internet_is_public() {
        for allowed in [
            "1.1.1.1",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "192.0.2.2",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
        ] {
            assert!(public(allowed), "{allowed} is public");
        }
    }

    #[test]
    fn the_denied_networks_are_exactly_what_is_public_refuses() {
        let in_nets = |ip: Ipv4Addr| {
            DENIED_V4_NETS.iter().any(|(net, prefix)| {
                let mask = u32::MAX.checked_shl(32 - *prefix as u32).unwrap_or(0);
                u32::from(ip) & mask == u32::from(*net)
            })
        };
        // Every network boundary and a stride through the whole space.
        let mut probes: Vec<u32> = (0..=u32::MAX).step_by(65_521).collect();
        for (net, prefix) in DENIED_V4_NETS {
            let start = u32::from(net);
            let end = start | (u32::MAX >> prefix);
            probes.extend([start.wrapping_sub(1), start, end, end.wrapping_add(1)]);
        }
        for ip in probes.into_iter().map(Ipv4Addr::from) {
            assert_eq!(in_nets(ip), !is_public_v4(ip), "{ip}");
        }
    }
}
