//! Which hosts the registry client may reach on a tenant's behalf.
//!
//! An image reference, a token realm and a redirect are all chosen by whoever wrote the build
//! (or runs the registry it names), and the client runs on the node: without a rule, a build
//! makes the node fetch from its own loopback services, its cloud metadata service or the
//! private network, and hands registry credentials to any host a realm names. So, for every
//! connection (ADR 0022):
//! * the address must be public ([`crate::domain::egress`]) and not one of the node's own,
//!   checked on every resolution (a name that resolves to a denied address is refused, so DNS
//!   cannot smuggle one in) and on every address literal, unless the operator listed the host
//!   (`STRATA_INSECURE_REGISTRIES`, or a mirror's URL in `STRATA_REGISTRY_MIRRORS`);
//! * plain HTTP only to a listed host;
//! * redirects follow the same rules, ten at most;
//! * a token realm must be HTTPS on the registry's host or its site (`auth.docker.io` for
//!   `registry-1.docker.io`), or plain HTTP on a listed registry's own host; credentials go
//!   to no other realm ([`Reach::check_realm`]).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use crate::domain::egress;

use super::settings::{host_of, RegistrySettings};

#[derive(Debug, Clone, Default)]
pub struct Reach {
    /// Hosts the operator listed (lowercase, no port): reachable at any address, over HTTP.
    listed: Vec<String>,
    /// The node's own addresses: never reachable unless listed.
    own: Vec<IpAddr>,
}

impl Reach {
    pub fn new(settings: &RegistrySettings) -> Reach {
        let mut listed: Vec<String> = settings
            .insecure
            .iter()
            .map(|h| host_of(h).to_ascii_lowercase())
            .collect();
        for url in settings.mirrors.values() {
            if let Ok(u) = reqwest::Url::parse(url) {
                if let Some(h) = u.host_str() {
                    listed.push(h.trim_matches(['[', ']']).to_ascii_lowercase());
                }
            }
        }
        Reach {
            listed,
            own: own_addresses(),
        }
    }

    pub fn is_listed(&self, host: &str) -> bool {
        let host = host.trim_matches(['[', ']']).to_ascii_lowercase();
        self.listed.contains(&host)
    }

    /// Whether `host` may be reached at `ip`.
    pub fn check_ip(&self, host: &str, ip: IpAddr) -> Result<(), String> {
        if self.is_listed(host) || (egress::is_public(ip) && !self.own.contains(&ip)) {
            return Ok(());
        }
        Err(format!(
            "{host} is at {ip}, an address of this node or of a private, loopback, link-local or \
             reserved range; registries there must be listed in STRATA_INSECURE_REGISTRIES (or be \
             a mirror in STRATA_REGISTRY_MIRRORS)"
        ))
    }

    /// The scheme and, for an address literal, the address of `url` (a name's addresses are
    /// checked when it resolves: [`Resolver`]).
    pub fn check_url(&self, url: &reqwest::Url) -> Result<(), String> {
        let host = url.host_str().unwrap_or_default();
        let bare = host.trim_matches(['[', ']']);
        match url.scheme() {
            "https" => {}
            "http" if self.is_listed(bare) => {}
            scheme => {
                return Err(format!(
                    "{url} is {scheme}, not HTTPS; plain HTTP is only for registries listed in \
                     STRATA_INSECURE_REGISTRIES"
                ))
            }
        }
        if let Ok(ip) = bare.parse::<IpAddr>() {
            self.check_ip(bare, ip)?;
        }
        Ok(())
    }

    /// Whether the registry at `endpoint` may send its clients (and their credentials) to
    /// `realm` for a token.
    pub fn check_realm(&self, endpoint: &str, realm: &str) -> Result<reqwest::Url, String> {
        let realm_url = reqwest::Url::parse(realm)
            .map_err(|e| format!("the token realm {realm:?} is not a URL: {e}"))?;
        let registry = reqwest::Url::parse(endpoint)
            .ok()
            .and_then(|u| u.host_str().map(str::to_ascii_lowercase))
            .unwrap_or_default();
        let host = realm_url
            .host_str()
            .unwrap_or_default()
            .to_ascii_lowercase();
        let same_host = host == registry;
        let refused = |why: &str| -> Result<reqwest::Url, String> {
            Err(format!(
                "the registry sends clients to the token realm {realm}, {why}; strata sends no \
                 credentials there"
            ))
        };
        match realm_url.scheme() {
            "https" if same_host || same_site(&host, &registry) => {}
            "https" => {
                return refused(&format!(
                    "which is neither {registry} nor a host of its site"
                ))
            }
            "http" if same_host && self.is_listed(&registry) => {}
            _ => {
                return refused("which is plain HTTP on another host than the (listed) registry's")
            }
        }
        match self.check_url(&realm_url) {
            Ok(()) => Ok(realm_url),
            Err(e) => refused(&e),
        }
    }
}

/// Whether two names share their last two labels (`auth.docker.io`, `registry-1.docker.io`):
/// the registries that hand out tokens from another host do so from their own site.
fn same_site(a: &str, b: &str) -> bool {
    let site = |h: &str| {
        let labels: Vec<&str> = h.rsplit('.').take(2).collect();
        (labels.len() == 2 && h.parse::<IpAddr>().is_err()).then(|| labels.join("."))
    };
    matches!((site(a), site(b)), (Some(x), Some(y)) if x == y)
}

/// Every address of this node's interfaces.
fn own_addresses() -> Vec<IpAddr> {
    crate::host_interfaces::addresses()
        .into_iter()
        .map(|(_, ip)| ip)
        .collect()
}

/// reqwest's resolver, through [`Reach`]: a name that resolves only to addresses it may not
/// reach fails to resolve, with the reason.
pub struct Resolver(pub Arc<Reach>);

impl reqwest::dns::Resolve for Resolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let reach = self.0.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut refusal = None;
            let allowed: Vec<SocketAddr> = found
                .into_iter()
                .filter(|a| match reach.check_ip(&host, a.ip()) {
                    Ok(()) => true,
                    Err(e) => {
                        refusal.get_or_insert(e);
                        false
                    }
                })
                .collect();
            if allowed.is_empty() {
                let why = refusal.unwrap_or_else(|| format!("{host} has no address"));
                return Err(why.into());
            }
            Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reach(insecure: &[&str], mirrors: &[(&str, &str)]) -> Reach {
        let settings = RegistrySettings {
            insecure: insecure.iter().map(|s| s.to_string()).collect(),
            mirrors: mirrors
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        };
        Reach::new(&settings)
    }

    fn url(s: &str) -> reqwest::Url {
        reqwest::Url::parse(s).unwrap()
    }

    #[test]
    fn private_and_loopback_registries_need_a_listing() {
        let r = reach(
            &["10.1.2.3:5000"],
            &[("docker.io", "http://127.0.0.1:5001")],
        );
        assert!(r.check_url(&url("https://8.8.8.8/v2/")).is_ok());
        assert!(r
            .check_url(&url("https://169.254.169.254/latest/"))
            .is_err());
        assert!(r.check_url(&url("http://127.0.0.2:5000/v2/")).is_err());
        assert!(r.check_url(&url("https://[::1]:5000/v2/")).is_err());
        // Listed: the insecure registry (any port) and the mirror's host.
        assert!(r.check_url(&url("http://10.1.2.3:5000/v2/")).is_ok());
        assert!(r.check_url(&url("http://127.0.0.1:5001/v2/")).is_ok());
        // Plain HTTP only to a listed host.
        assert!(r.check_url(&url("http://8.8.8.8/v2/")).is_err());
        assert!(r
            .check_ip("example.com", "10.0.0.1".parse().unwrap())
            .is_err());
        assert!(r.check_ip("10.1.2.3", "10.1.2.3".parse().unwrap()).is_ok());
    }

    #[test]
    fn realms_stay_on_the_registrys_site_and_https() {
        let r = reach(&["127.0.0.1"], &[]);
        let hub = "https://registry-1.docker.io";
        assert!(r.check_realm(hub, "https://auth.docker.io/token").is_ok());
        assert!(r
            .check_realm("https://ghcr.io", "https://ghcr.io/token")
            .is_ok());
        assert!(r
            .check_realm("https://registry.gitlab.com", "https://gitlab.com/jwt/auth")
            .is_ok());
        // Another site, plain HTTP, or a denied address: refused, nothing is sent.
        assert!(r.check_realm(hub, "https://evil.example/token").is_err());
        assert!(r.check_realm(hub, "http://auth.docker.io/token").is_err());
        assert!(r
            .check_realm("https://8.8.8.8", "https://169.254.169.254/token")
            .is_err());
        assert!(r
            .check_realm("http://127.0.0.1:5000", "http://127.0.0.2:9/token")
            .is_err());
        // A listed registry may serve its own realm over HTTP.
        assert!(r
            .check_realm("http://127.0.0.1:5000", "http://127.0.0.1:5000/token")
            .is_ok());
        assert!(r.check_realm("http://127.0.0.1:5000", "not a url").is_err());
    }

    #[test]
    fn the_nodes_own_addresses_are_found() {
        let own = own_addresses();
        assert!(own.contains(&"127.0.0.1".parse().unwrap()), "{own:?}");
    }
}
