//! The Debian mirror this machine's apt already uses, for building the Debian base image.
//!
//! strata names no mirror of its own: nodes sit behind whatever mirror, proxy or snapshot their
//! operator configured, and the base image should come from the same place. apt itself says
//! which, through `apt-get indextargets` (every `deb` source, one-line or deb822, after apt's
//! own parsing), so nothing here reads `sources.list` syntax.

use std::process::Command;

/// A `deb` source's repository and release, as apt lists its `main` package indexes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AptSource {
    /// `http://host/debian/`, with the trailing slash apt gives it.
    pub repo_uri: String,
    /// The suite: `bookworm`, `bookworm-updates`, `bookworm-security`.
    pub release: String,
}

/// The repository to debootstrap `release` from: the machine's source of that very release,
/// or else of another plain release (not `-updates`, `-security`, `-backports`), which on a
/// Debian mirror serves every release. An error says what to pass instead.
pub fn debian_mirror(release: &str) -> Result<String, String> {
    let out = Command::new("apt-get")
        .args([
            "indextargets",
            "--no-release-info",
            "--format",
            "$(REPO_URI) $(RELEASE)",
            "Identifier: Packages",
            "Component: main",
        ])
        .output()
        .map_err(|e| {
            format!("running apt-get to find this machine's Debian mirror ({e}); pass --mirror URL")
        })?;
    if !out.status.success() {
        return Err(format!(
            "apt-get indextargets failed ({}); pass --mirror URL",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    pick(&parse(&String::from_utf8_lossy(&out.stdout)), release).ok_or_else(|| {
        format!(
            "this machine's apt sources name no Debian repository with a `main` component \
             (`apt-get indextargets` lists none for {release} or another release); pass \
             --mirror URL (or STRATA_DEBIAN_MIRROR)"
        )
    })
}

/// The `$(REPO_URI) $(RELEASE)` lines of `apt-get indextargets`.
pub fn parse(listing: &str) -> Vec<AptSource> {
    listing
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(uri, release)| AptSource {
            repo_uri: uri.trim().to_string(),
            release: release.trim().to_string(),
        })
        .filter(|s| !s.repo_uri.is_empty() && !s.release.is_empty())
        .collect()
}

/// The repository of `release` in `sources`, or of the first plain release; without the
/// trailing slash, as debootstrap and `sources.list` write it.
pub fn pick(sources: &[AptSource], release: &str) -> Option<String> {
    let plain = |s: &&AptSource| !s.release.contains('-') && !s.release.contains('/');
    sources
        .iter()
        .find(|s| s.release == release)
        .or_else(|| sources.iter().find(plain))
        .map(|s| s.repo_uri.trim_end_matches('/').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_release_itself_is_preferred_then_any_plain_release() {
        let listing = "http://mirror.example/debian-security/ bookworm-security\n\
                       http://mirror.example/debian/ bookworm-updates\n\
                       http://mirror.example/debian/ bookworm\n\
                       http://other.example/debian/ bookworm\n";
        let sources = parse(listing);
        assert_eq!(sources.len(), 4);
        assert_eq!(
            pick(&sources, "bookworm").as_deref(),
            Some("http://mirror.example/debian")
        );
        let trixie_host = parse(
            "http://mirror.example/debian-security/ trixie-security\n\
             http://mirror.example/debian/ trixie\n",
        );
        assert_eq!(
            pick(&trixie_host, "bookworm").as_deref(),
            Some("http://mirror.example/debian")
        );
        let only_updates = parse("http://mirror.example/debian/ bookworm-updates\n");
        assert_eq!(pick(&only_updates, "bookworm"), None);
        assert_eq!(pick(&parse(""), "bookworm"), None);
    }
}
