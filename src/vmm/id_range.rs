//! The host ids a sandbox's users are: sandbox uid and gid `n` (0–65535) is host id `base + n`.
//!
//! A build step runs as root inside its sandbox, and is nobody on the host: the sandbox's user
//! namespace maps its ids onto this unprivileged range, and every tree the node keeps for
//! sandboxes (extracted layers, overlay upper directories) holds the host ids, so overlay shows
//! a sandbox its own files as their in-sandbox owners without an idmapped mount. Layer tars
//! keep the in-sandbox owners: sealing subtracts `base`, extraction adds it, so layer digests
//! and cache keys do not depend on the range (ADR 0021).

use std::fmt;

/// How many ids a sandbox has: 0–65535, as in an OCI image and E2B's builds.
pub const SANDBOX_IDS: u32 = 65536;

/// How many host uids above the range own sandbox user namespaces, one each: the kernel charges
/// a namespace's inotify instances and watches, processes and nested namespaces to its owner
/// (ADR 0034), so each sandbox's owner is a uid of its own that nothing else runs as.
pub const NAMESPACE_OWNERS: u32 = 65536;

/// The default base: far above any account a host creates (`useradd` stops at 60000, subuid
/// ranges conventionally start at 100000 and grow by 65536) and below 2^31, which some tools
/// read as a negative id.
pub const DEFAULT_BASE: u32 = 1_000_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct IdRange {
    base: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdRangeError {
    #[error(
        "STRATA_SANDBOX_ID_RANGE {0:?} is not BASE or BASE:65536 (for example 1000000000:65536)"
    )]
    Malformed(String),
    #[error("STRATA_SANDBOX_ID_RANGE must give sandboxes exactly 65536 ids (0–65535), not {0}")]
    Count(u64),
    #[error("STRATA_SANDBOX_ID_RANGE base {0} is too low: host accounts (0–65535) would be sandbox users; use 100000 or more")]
    TooLow(u32),
    #[error("STRATA_SANDBOX_ID_RANGE base {0} leaves no room below 2^32 - 1 for 65536 sandbox ids and the 65536 namespace owners above them")]
    TooHigh(u32),
    #[error("{what} id {id} is outside the sandbox's ids (0–65535); a layer cannot carry it")]
    SandboxIdOutOfRange { what: &'static str, id: u64 },
    #[error("host {what} id {id} is outside the sandbox id range {range}; the file was not made by a sandbox")]
    HostIdOutOfRange {
        what: &'static str,
        id: u32,
        range: IdRange,
    },
}

impl Default for IdRange {
    fn default() -> Self {
        IdRange { base: DEFAULT_BASE }
    }
}

impl fmt::Display for IdRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.base, SANDBOX_IDS)
    }
}

impl std::str::FromStr for IdRange {
    type Err = IdRangeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let malformed = || IdRangeError::Malformed(s.to_string());
        let (base, count) = match s.trim().split_once(':') {
            Some((b, c)) => (b, Some(c)),
            None => (s.trim(), None),
        };
        let base: u32 = base.parse().map_err(|_| malformed())?;
        if let Some(c) = count {
            let c: u64 = c.parse().map_err(|_| malformed())?;
            if c != SANDBOX_IDS as u64 {
                return Err(IdRangeError::Count(c));
            }
        }
        IdRange::new(base)
    }
}

impl IdRange {
    pub fn new(base: u32) -> Result<IdRange, IdRangeError> {
        if base < 100_000 {
            return Err(IdRangeError::TooLow(base));
        }
        // The last id, 2^32 - 1, is "no id" (-1) to the kernel.
        if base as u64 + SANDBOX_IDS as u64 + NAMESPACE_OWNERS as u64 > u32::MAX as u64 {
            return Err(IdRangeError::TooHigh(base));
        }
        Ok(IdRange { base })
    }

    pub fn base(&self) -> u32 {
        self.base
    }

    /// The first of the [`NAMESPACE_OWNERS`] host uids that own sandbox user namespaces: the ids
    /// just above the sandbox range, which no sandbox id maps to and no host account uses.
    pub fn first_owner(&self) -> u32 {
        self.base + SANDBOX_IDS
    }

    /// The line for `/proc/<pid>/uid_map` and `gid_map`.
    pub fn map_line(&self) -> String {
        format!("0 {} {}\n", self.base, SANDBOX_IDS)
    }

    /// The host id of sandbox id `id` (a layer tar's owner).
    pub fn to_host(&self, what: &'static str, id: u64) -> Result<u32, IdRangeError> {
        if id >= SANDBOX_IDS as u64 {
            return Err(IdRangeError::SandboxIdOutOfRange { what, id });
        }
        Ok(self.base + id as u32)
    }

    /// The sandbox id of host id `id` (an owner on a tree the node keeps for sandboxes).
    pub fn to_sandbox(&self, what: &'static str, id: u32) -> Result<u32, IdRangeError> {
        id.checked_sub(self.base)
            .filter(|n| *n < SANDBOX_IDS)
            .ok_or(IdRangeError::HostIdOutOfRange {
                what,
                id,
                range: *self,
            })
    }
}

/// How the owners of a directory being sealed relate to the owners the layer records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owners {
    /// The tree holds in-sandbox ids already (a root filesystem made on the host, such as
    /// debootstrap's): recorded as they are.
    AsSandbox,
    /// The tree is one the node keeps for sandboxes (an upper directory or an extracted
    /// layer): its host ids are mapped back into the sandbox's.
    Mapped(IdRange),
}

impl Owners {
    pub fn to_sandbox(&self, what: &'static str, id: u32) -> Result<u32, IdRangeError> {
        match self {
            Owners::AsSandbox => Ok(id),
            Owners::Mapped(r) => r.to_sandbox(what, id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_base_with_or_without_the_count() {
        assert_eq!("200000".parse::<IdRange>().unwrap().base(), 200_000);
        assert_eq!("200000:65536".parse::<IdRange>().unwrap().base(), 200_000);
        assert_eq!(IdRange::default().to_string(), "1000000000:65536");
    }

    #[test]
    fn refuses_ranges_that_would_reach_host_accounts_or_overflow() {
        assert_eq!("0".parse::<IdRange>(), Err(IdRangeError::TooLow(0)));
        assert_eq!("65536".parse::<IdRange>(), Err(IdRangeError::TooLow(65536)));
        assert_eq!(
            "200000:1000".parse::<IdRange>(),
            Err(IdRangeError::Count(1000))
        );
        assert!(matches!(
            "4294901760".parse::<IdRange>(),
            Err(IdRangeError::TooHigh(_))
        ));
        // Room for the sandbox ids but not for the namespace owners above them.
        assert!(matches!(
            "4294836224".parse::<IdRange>(),
            Err(IdRangeError::TooHigh(_))
        ));
        let highest = IdRange::new(u32::MAX - 2 * 65536).unwrap();
        assert_eq!(highest.first_owner() as u64 + 65536, u32::MAX as u64);
        assert!(matches!(
            "abc".parse::<IdRange>(),
            Err(IdRangeError::Malformed(_))
        ));
        assert!(matches!(
            "1:2:3".parse::<IdRange>(),
            Err(IdRangeError::Malformed(_))
        ));
    }

    #[test]
    fn ids_map_both_ways_and_nothing_outside_the_range_maps() {
        let r = IdRange::new(200_000).unwrap();
        assert_eq!(r.to_host("uid", 0).unwrap(), 200_000);
        assert_eq!(r.to_host("uid", 65535).unwrap(), 265_535);
        assert!(r.to_host("uid", 65536).is_err());
        assert_eq!(r.to_sandbox("uid", 201_000).unwrap(), 1000);
        assert!(r.to_sandbox("uid", 0).is_err());
        assert!(r.to_sandbox("uid", 199_999).is_err());
        assert!(r.to_sandbox("uid", 265_536).is_err());
        assert_eq!(r.map_line(), "0 200000 65536\n");
        for n in [0u64, 1, 1000, 65534, 65535] {
            let host = r.to_host("gid", n).unwrap();
            assert_eq!(r.to_sandbox("gid", host).unwrap() as u64, n);
        }
    }
}
