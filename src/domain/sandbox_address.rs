//! Which sandbox, and which of its ports, a request is for, as E2B's edge reads it: the `Host`
//! `<port>-<id>.<domain>` (what `sandbox.get_host(port)` gives), or the `E2b-Sandbox-Id` and
//! `E2b-Sandbox-Port` headers an SDK sends when told one URL for every sandbox.

/// The port of a sandbox's envd (the SDK's `ENVD_PORT`): requests for it are the agent's.
pub const ENVD_PORT: u16 = 49983;

/// A sandbox and one of its ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxAddress {
    pub id: String,
    pub port: u16,
}

impl SandboxAddress {
    /// Whether the request is for the sandbox's envd (its agent), not a port of its own.
    pub fn is_envd(&self) -> bool {
        self.port == ENVD_PORT
    }
}

/// `host` (a `Host` header, with or without `:port`) read as `<port>-<id>.<domain>`: one label
/// before the domain, split at its first `-` into a port and an id of lower-case letters and
/// digits. Anything else is not a sandbox's host.
pub fn from_host(host: &str, domain: &str) -> Option<SandboxAddress> {
    let host = host.trim().trim_end_matches('.');
    let host = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    let domain = domain.trim().trim_end_matches('.');
    if domain.is_empty() {
        return None;
    }
    let label = host
        .to_ascii_lowercase()
        .strip_suffix(&format!(".{}", domain.to_ascii_lowercase()))?
        .to_string();
    let (port, id) = label.split_once('-')?;
    sandbox_address(port, id)
}

/// The `E2b-Sandbox-Id` and `E2b-Sandbox-Port` headers' values (the port defaults to envd's).
pub fn from_headers(id: &str, port: Option<&str>) -> Option<SandboxAddress> {
    sandbox_address(port.unwrap_or("49983").trim(), id.trim())
}

fn sandbox_address(port: &str, id: &str) -> Option<SandboxAddress> {
    let id = super::sandbox::SandboxId::parse(id).ok()?;
    let port = port.parse::<u16>().ok().filter(|p| *p > 0)?;
    Some(SandboxAddress {
        id: id.as_str().to_string(),
        port,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(port: u16, id: &str) -> Option<SandboxAddress> {
        Some(SandboxAddress {
            id: id.into(),
            port,
        })
    }

    #[test]
    fn a_host_names_a_port_and_a_sandbox_under_the_domain() {
        assert_eq!(
            from_host("8080-abc123.sandbox.test", "sandbox.test"),
            at(8080, "abc123")
        );
        assert_eq!(
            from_host("8080-abc123.sandbox.test:3000", "sandbox.test"),
            at(8080, "abc123")
        );
        assert_eq!(
            from_host("49983-ABC123.Sandbox.Test.", "sandbox.test"),
            at(49983, "abc123")
        );
        assert!(from_host("49983-abc123.sandbox.test", "sandbox.test")
            .unwrap()
            .is_envd());
        for other in [
            "sandbox.test",
            "api.sandbox.test",
            "8080-abc123.other.test",
            "8080-abc123.x.sandbox.test",
            "8080-abc-123.sandbox.test",
            "99999-abc123.sandbox.test",
            "0-abc123.sandbox.test",
            "port-abc123.sandbox.test",
            "8080-.sandbox.test",
            "8080-abc123sandbox.test",
            "127.0.0.1:3000",
        ] {
            assert_eq!(from_host(other, "sandbox.test"), None, "{other}");
        }
        assert_eq!(from_host("8080-abc123.", ""), None);
    }

    #[test]
    fn headers_name_the_envd_port_unless_they_say_another() {
        assert_eq!(from_headers("abc123", None), at(ENVD_PORT, "abc123"));
        assert_eq!(from_headers("abc123", Some("8080")), at(8080, "abc123"));
        assert_eq!(from_headers("../etc", Some("8080")), None);
        assert_eq!(from_headers("abc123", Some("http")), None);
    }
}
