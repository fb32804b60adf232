//! What a sandbox's network may reach (ADR 0022): the public internet by default, the
//! operator's exceptions (`STRATA_SANDBOX_EGRESS_ALLOW`), DNS to the resolvers it is given,
//! or nothing at all (`STRATA_SANDBOX_EGRESS=none`). Parsed and named here; the node's
//! firewall enforces it outside the sandbox.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use sha2::{Digest as _, Sha256};

/// An IPv4 network, `a.b.c.d/n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Net {
    addr: Ipv4Addr,
    prefix: u8,
}

impl Ipv4Net {
    /// The network of `addr` with `prefix` bits; host bits must be zero.
    pub fn new(addr: Ipv4Addr, prefix: u8) -> Result<Ipv4Net, EgressError> {
        if prefix > 32 {
            return Err(EgressError(format!(
                "{addr}/{prefix}: a prefix length is at most 32"
            )));
        }
        let net = Ipv4Net { addr, prefix };
        if u32::from(addr) & !net.mask() != 0 {
            return Err(EgressError(format!(
                "{addr}/{prefix} has host bits set; the network is {}/{prefix}",
                Ipv4Addr::from(u32::from(addr) & net.mask())
            )));
        }
        Ok(net)
    }

    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }

    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    fn mask(&self) -> u32 {
        if self.prefix == 0 {
            0
        } else {
            u32::MAX << (32 - self.prefix)
        }
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & self.mask() == u32::from(self.addr)
    }

    pub fn overlaps(&self, other: &Ipv4Net) -> bool {
        self.contains(other.addr) || other.contains(self.addr)
    }

    /// How many addresses the network holds.
    pub fn size(&self) -> u64 {
        1u64 << (32 - self.prefix)
    }
}

impl fmt::Display for Ipv4Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl FromStr for Ipv4Net {
    type Err = EgressError;

    /// `a.b.c.d/n`, or a bare address (`/32`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (addr, prefix) = s.split_once('/').unwrap_or((s, "32"));
        let addr: Ipv4Addr = addr.parse().map_err(|_| {
            if addr.contains(':') {
                EgressError(format!(
                    "{s}: sandboxes have IPv4 only; name an IPv4 network (a.b.c.d/n)"
                ))
            } else {
                EgressError(format!("{s}: not an IPv4 network (a.b.c.d/n)"))
            }
        })?;
        let prefix: u8 = prefix
            .parse()
            .map_err(|_| EgressError(format!("{s}: the prefix length must be a number")))?;
        Ipv4Net::new(addr, prefix)
    }
}

/// One exception to the denied ranges: a network, and the ports on it (TCP and UDP) that
/// are open; no ports opens every port and protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AllowRule {
    pub net: Ipv4Net,
    /// Inclusive.
    pub ports: Option<(u16, u16)>,
}

impl AllowRule {
    /// Whether the rule names one address alone: only such a rule opens one of the node's own
    /// addresses, which a wider range containing it never does.
    pub fn names_one_address(&self) -> bool {
        self.net.prefix() == 32
    }
}

impl fmt::Display for AllowRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.net)?;
        match self.ports {
            Some((a, b)) if a == b => write!(f, ":{a}"),
            Some((a, b)) => write!(f, ":{a}-{b}"),
            None => Ok(()),
        }
    }
}

impl FromStr for AllowRule {
    type Err = EgressError;

    /// `10.1.0.0/16`, `10.1.2.3`, `10.1.2.3:3128`, `10.0.0.0/8:8000-8100`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let (net, ports) = match s.rsplit_once(':') {
            Some((net, ports)) if !net.contains(':') => (net, Some(ports)),
            _ => (s, None),
        };
        let net: Ipv4Net = net.parse()?;
        let ports = ports
            .map(|p| {
                let (a, b) = p.split_once('-').unwrap_or((p, p));
                let port = |x: &str| {
                    x.parse::<u16>()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| EgressError(format!("{s}: `{x}` is not a port (1–65535)")))
                };
                let (a, b) = (port(a)?, port(b)?);
                if a > b {
                    return Err(EgressError(format!("{s}: the port range {a}-{b} is empty")));
                }
                Ok((a, b))
            })
            .transpose()?;
        Ok(AllowRule { net, ports })
    }
}

/// Whether sandboxes get a network beyond loopback.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EgressMode {
    /// The public internet, the allow list and DNS, through the node's NAT.
    #[default]
    Public,
    /// Loopback only: no link, no DNS.
    None,
}

impl FromStr for EgressMode {
    type Err = EgressError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "public" | "" => Ok(EgressMode::Public),
            "none" => Ok(EgressMode::None),
            other => Err(EgressError(format!(
                "`{other}` is not an egress mode: `public` (the default) or `none`"
            ))),
        }
    }
}

impl fmt::Display for EgressMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EgressMode::Public => "public",
            EgressMode::None => "none",
        })
    }
}

/// A node's sandbox egress policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressPolicy {
    pub mode: EgressMode,
    /// Exceptions to the denied ranges, in the order given.
    pub allow: Vec<AllowRule>,
    /// The resolvers sandboxes are given (port 53 to them is allowed, private or not).
    pub dns: Vec<Ipv4Addr>,
    /// Most connections one sandbox may have open through its link at once (each is an entry
    /// in the host's one connection-tracking table, which every sandbox and the host share).
    pub max_connections: u32,
}

impl Default for EgressPolicy {
    fn default() -> Self {
        EgressPolicy {
            mode: EgressMode::default(),
            allow: Vec::new(),
            dns: Vec::new(),
            max_connections: EgressPolicy::DEFAULT_MAX_CONNECTIONS,
        }
    }
}

impl EgressPolicy {
    /// A sandbox's share of a typical host's table (`nf_conntrack_max` is 262,144 on a host
    /// with 16 GiB and more): 64 sandboxes at their cap fill it.
    pub const DEFAULT_MAX_CONNECTIONS: u32 = 4096;

    /// Parses a comma- or whitespace-separated allow list.
    pub fn parse_allow(list: &str) -> Result<Vec<AllowRule>, EgressError> {
        list.split([',', ' ', '\n', '\t'])
            .filter(|s| !s.trim().is_empty())
            .map(str::parse)
            .collect()
    }

    /// Parses a comma- or whitespace-separated list of resolver addresses.
    pub fn parse_dns(list: &str) -> Result<Vec<Ipv4Addr>, EgressError> {
        list.split([',', ' ', '\n', '\t'])
            .filter(|s| !s.trim().is_empty())
            .map(|s| {
                s.trim()
                    .parse::<Ipv4Addr>()
                    .map_err(|_| EgressError(format!("{s}: a sandbox resolver is an IPv4 address")))
            })
            .collect()
    }

    /// A short stable name for the policy, the same in every process that has the same one:
    /// the firewall keeps one chain per distinct policy, shared by the sandboxes that use it.
    pub fn fingerprint(&self) -> u32 {
        let mut h = Sha256::new();
        h.update(format!("mode={}\n", self.mode));
        for rule in &self.allow {
            h.update(format!("allow={rule}\n"));
        }
        for dns in &self.dns {
            h.update(format!("dns={dns}\n"));
        }
        h.update(format!("max_connections={}\n", self.max_connections));
        let d = h.finalize();
        // Group 0 is every interface's default group: never a policy's.
        u32::from_be_bytes([d[0], d[1], d[2], d[3]]).max(1)
    }

    /// The resolvers to give sandboxes from a `resolv.conf`: its `nameserver` lines, without
    /// loopback addresses (a stub resolver on the host's loopback is not the sandbox's) and
    /// without IPv6 ones (sandboxes have IPv4 only).
    pub fn resolvers_from_resolv_conf(text: &str) -> Vec<Ipv4Addr> {
        text.lines()
            .filter_map(|l| l.trim().strip_prefix("nameserver"))
            .filter_map(|rest| rest.trim().parse::<Ipv4Addr>().ok())
            .filter(|ip| !ip.is_loopback() && !ip.is_unspecified())
            .collect()
    }
}

/// A policy setting that is not valid, with what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("sandbox egress: {0}")]
pub struct EgressError(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_rules_parse_with_and_without_ports() {
        let rules = EgressPolicy::parse_allow("10.1.0.0/16, 192.168.5.7:3128 10.0.0.0/8:8000-8100")
            .unwrap();
        assert_eq!(rules.len(), 3);
        assert_eq!(rules[0].to_string(), "10.1.0.0/16");
        assert_eq!(rules[0].ports, None);
        assert_eq!(rules[1].to_string(), "192.168.5.7/32:3128");
        assert_eq!(rules[1].ports, Some((3128, 3128)));
        assert_eq!(rules[2].ports, Some((8000, 8100)));
        assert!(rules[2].net.contains("10.200.3.4".parse().unwrap()));
        assert!(!rules[0].net.contains("10.2.0.1".parse().unwrap()));
    }

    #[test]
    fn bad_allow_rules_say_what_is_wrong() {
        for (input, says) in [
            ("10.1.0.1/16", "host bits set; the network is 10.1.0.0/16"),
            ("10.1.0.0/33", "at most 32"),
            ("fd00::/8", "IPv4 only"),
            ("10.0.0.1:0", "not a port"),
            ("10.0.0.1:90-80", "empty"),
            ("mirror.lan", "not an IPv4 network"),
        ] {
            let err = EgressPolicy::parse_allow(input).unwrap_err().to_string();
            assert!(err.contains(says), "{input}: {err}");
        }
    }

    #[test]
    fn a_loopback_stub_resolver_is_not_given_to_sandboxes() {
        let conf = "# systemd-resolved\nnameserver 127.0.0.53\nnameserver ::1\nnameserver 10.255.255.53\noptions edns0\n";
        assert_eq!(
            EgressPolicy::resolvers_from_resolv_conf(conf),
            vec!["10.255.255.53".parse::<Ipv4Addr>().unwrap()]
        );
    }

    #[test]
    fn the_fingerprint_names_the_whole_policy() {
        let base = EgressPolicy::default();
        let mut other = base.clone();
        other.allow = EgressPolicy::parse_allow("10.9.0.0/16").unwrap();
        let mut none = base.clone();
        none.mode = EgressMode::None;
        let mut capped = base.clone();
        capped.max_connections = 8;
        assert_eq!(base.fingerprint(), EgressPolicy::default().fingerprint());
        assert_ne!(base.fingerprint(), other.fingerprint());
        assert_ne!(base.fingerprint(), capped.fingerprint());
        assert_ne!(base.fingerprint(), none.fingerprint());
        assert_ne!(base.fingerprint(), 0);
    }

    #[test]
    fn modes_parse() {
        assert_eq!("none".parse::<EgressMode>().unwrap(), EgressMode::None);
        assert_eq!("public".parse::<EgressMode>().unwrap(), EgressMode::Public);
        assert!("host"
            .parse::<EgressMode>()
            .unwrap_err()
            .to_string()
            .contains("`public`"));
    }
}
