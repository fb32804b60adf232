//! Image references, normalized the way Docker normalizes them.
//!
//! Users, the SDKs and the node catalog spell one image many ways: `debian`, `debian:latest`,
//! `library/debian`, `docker.io/library/debian:latest` and `index.docker.io/library/debian` all
//! name the same image. Matching them as raw strings made `e2bdev/base:latest` (the SDK's own
//! default) "not available" although `e2bdev/base` was. Every place that names an image parses
//! it with [`ImageRef::parse`] and compares the parsed form.
//!
//! Rules (those of Docker's reference grammar):
//! * the first `/`-separated component is a registry host when it contains `.` or `:`, or is
//!   `localhost`, or has an upper-case letter; otherwise the registry is `docker.io`;
//! * `index.docker.io` is `docker.io`; on `docker.io` a one-component repository gets `library/`;
//! * the repository is lower-case components of `[a-z0-9]` joined by `.`, `_`, `__` or dashes;
//! * a tag follows the last `:` after the last `/` (`[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`);
//! * a digest follows `@` (`sha256:` and 64 lower-case hex digits; other algorithms are refused);
//! * with neither tag nor digest the tag is `latest`; with a digest, the digest is what is pulled.

use std::fmt;

use super::ids::Digest;

pub const DEFAULT_REGISTRY: &str = "docker.io";
pub const DEFAULT_TAG: &str = "latest";
const LEGACY_DEFAULT_REGISTRY: &str = "index.docker.io";
const OFFICIAL_NAMESPACE: &str = "library";
const MAX_NAME_LEN: usize = 255;

/// A parsed, normalized image reference.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ImageRef {
    registry: String,
    repository: String,
    tag: Option<String>,
    digest: Option<Digest>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageRefError {
    #[error("image reference is empty; name an image such as `debian:bookworm`")]
    Empty,
    #[error("image reference {reference:?} is invalid: {reason}")]
    Invalid { reference: String, reason: String },
}

fn invalid(reference: &str, reason: impl Into<String>) -> ImageRefError {
    ImageRefError::Invalid {
        reference: reference.to_owned(),
        reason: reason.into(),
    }
}

impl ImageRef {
    /// Parses and normalizes `text` (surrounding whitespace is ignored).
    pub fn parse(text: &str) -> Result<ImageRef, ImageRefError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(ImageRefError::Empty);
        }
        let (name_and_tag, digest) = match text.split_once('@') {
            Some((left, right)) => (left, Some(parse_digest(text, right)?)),
            None => (text, None),
        };
        let last_slash = name_and_tag.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match name_and_tag[last_slash..].rfind(':') {
            Some(i) => {
                let at = last_slash + i;
                let tag = &name_and_tag[at + 1..];
                if !valid_tag(tag) {
                    return Err(invalid(
                        text,
                        format!("tag {tag:?} must be 1-128 of [A-Za-z0-9_.-], not starting with '.' or '-'"),
                    ));
                }
                (&name_and_tag[..at], Some(tag.to_owned()))
            }
            None => (name_and_tag, None),
        };
        if name.is_empty() {
            return Err(invalid(text, "the repository name is missing"));
        }
        if name.len() > MAX_NAME_LEN {
            return Err(invalid(
                text,
                format!("the name is longer than {MAX_NAME_LEN} characters"),
            ));
        }
        let (registry, remainder) = match name.split_once('/') {
            Some((first, rest)) if is_registry(first) => (first.to_owned(), rest),
            _ => (DEFAULT_REGISTRY.to_owned(), name),
        };
        if !valid_registry(&registry) {
            return Err(invalid(
                text,
                format!("registry host {registry:?} is invalid"),
            ));
        }
        let registry = if registry == LEGACY_DEFAULT_REGISTRY {
            DEFAULT_REGISTRY.to_owned()
        } else {
            registry
        };
        if remainder.chars().any(|c| c.is_ascii_uppercase()) {
            return Err(invalid(text, "repository names must be lower-case"));
        }
        for component in remainder.split('/') {
            if !valid_path_component(component) {
                return Err(invalid(
                    text,
                    format!("repository component {component:?} must be lower-case letters and digits, separated by '.', '_', '__' or '-'"),
                ));
            }
        }
        let repository = if registry == DEFAULT_REGISTRY && !remainder.contains('/') {
            format!("{OFFICIAL_NAMESPACE}/{remainder}")
        } else {
            remainder.to_owned()
        };
        let tag = match (&tag, &digest) {
            (None, None) => Some(DEFAULT_TAG.to_owned()),
            _ => tag,
        };
        Ok(ImageRef {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// The registry host (`docker.io`, `127.0.0.1:5000`, `ghcr.io`).
    pub fn registry(&self) -> &str {
        &self.registry
    }

    /// The repository path on the registry (`library/debian`).
    pub fn repository(&self) -> &str {
        &self.repository
    }

    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    pub fn digest(&self) -> Option<&Digest> {
        self.digest.as_ref()
    }

    /// What the manifest is fetched by: the digest when there is one, else the tag.
    pub fn manifest_reference(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => d.to_string(),
            (None, Some(t)) => t.clone(),
            (None, None) => DEFAULT_TAG.to_owned(),
        }
    }

    /// This reference pinned to `digest` (the tag is kept for display).
    pub fn pinned(&self, digest: Digest) -> ImageRef {
        ImageRef {
            digest: Some(digest),
            ..self.clone()
        }
    }

    /// This reference without a digest: the name and tag a catalog entry is known by.
    pub fn unpinned(&self) -> ImageRef {
        ImageRef {
            tag: self.tag.clone().or_else(|| Some(DEFAULT_TAG.to_owned())),
            digest: None,
            ..self.clone()
        }
    }

    /// Docker's short spelling: `debian:bookworm`, `e2bdev/base:latest`, `ghcr.io/o/r:1`.
    pub fn familiar(&self) -> String {
        let mut name = if self.registry == DEFAULT_REGISTRY {
            self.repository
                .strip_prefix("library/")
                .filter(|rest| !rest.contains('/'))
                .unwrap_or(&self.repository)
                .to_owned()
        } else {
            format!("{}/{}", self.registry, self.repository)
        };
        if let Some(t) = &self.tag {
            name.push(':');
            name.push_str(t);
        }
        if let Some(d) = &self.digest {
            name.push('@');
            name.push_str(&d.to_string());
        }
        name
    }
}

/// The fully qualified form: `docker.io/library/debian:bookworm[@sha256:…]`.
impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for ImageRef {
    type Err = ImageRefError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ImageRef::parse(s)
    }
}

fn parse_digest(reference: &str, text: &str) -> Result<Digest, ImageRefError> {
    let Some((algorithm, hex)) = text.split_once(':') else {
        return Err(invalid(
            reference,
            "a digest is written `sha256:<64 hex digits>`",
        ));
    };
    if algorithm != "sha256" {
        return Err(invalid(
            reference,
            format!("digest algorithm {algorithm:?} is not supported; use sha256"),
        ));
    }
    if hex.len() != 64
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(invalid(
            reference,
            "a sha256 digest has 64 lower-case hex digits",
        ));
    }
    Digest::parse(text).map_err(|e| invalid(reference, e.to_string()))
}

fn is_registry(first: &str) -> bool {
    first.contains('.')
        || first.contains(':')
        || first == "localhost"
        || first.chars().any(|c| c.is_ascii_uppercase())
}

fn valid_registry(host: &str) -> bool {
    let (name, port) = if let Some(rest) = host.strip_prefix('[') {
        // An IPv6 literal: `[::1]:5000`.
        let Some((ip, after)) = rest.split_once(']') else {
            return false;
        };
        if ip.is_empty() || !ip.chars().all(|c| c.is_ascii_hexdigit() || c == ':') {
            return false;
        }
        match after {
            "" => return true,
            p => match p.strip_prefix(':') {
                Some(port) => return valid_port(port),
                None => return false,
            },
        }
    } else {
        match host.rsplit_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (host, None),
        }
    };
    if let Some(p) = port {
        if !valid_port(p) {
            return false;
        }
    }
    !name.is_empty()
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

fn valid_port(port: &str) -> bool {
    !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit())
}

fn valid_tag(tag: &str) -> bool {
    let bytes = tag.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 128
        && (bytes[0].is_ascii_alphanumeric() || bytes[0] == b'_')
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`
fn valid_path_component(component: &str) -> bool {
    let bytes = component.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if bytes.is_empty() || !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        if alnum(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && !alnum(bytes[i]) {
            i += 1;
        }
        let sep = &component[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|b| b == b'-');
        if !ok {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn canon(s: &str) -> String {
        ImageRef::parse(s).unwrap().to_string()
    }

    #[test]
    fn docker_spellings_of_one_image_normalize_alike() {
        for s in [
            "debian",
            "debian:latest",
            "library/debian",
            "docker.io/debian",
            "docker.io/library/debian:latest",
            "index.docker.io/library/debian",
            "  debian:latest  ",
        ] {
            assert_eq!(canon(s), "docker.io/library/debian:latest", "{s}");
        }
        assert_eq!(canon("e2bdev/base"), "docker.io/e2bdev/base:latest");
        assert_eq!(canon("e2bdev/base:latest"), canon("e2bdev/base"));
        assert_eq!(
            canon("docker.io/library/debian:bookworm"),
            canon("debian:bookworm")
        );
        assert_ne!(canon("debian:bookworm"), canon("debian"));
    }

    #[test]
    fn registries_are_recognized_by_dot_colon_or_localhost() {
        let r = ImageRef::parse("127.0.0.1:5000/team/app:v1").unwrap();
        assert_eq!(
            (r.registry(), r.repository(), r.tag()),
            ("127.0.0.1:5000", "team/app", Some("v1"))
        );
        let r = ImageRef::parse("localhost/app").unwrap();
        assert_eq!((r.registry(), r.repository()), ("localhost", "app"));
        let r = ImageRef::parse("ghcr.io/o/r").unwrap();
        assert_eq!(r.to_string(), "ghcr.io/o/r:latest");
        // `localhost:5000` without a path is a repository with a tag, as in Docker.
        let r = ImageRef::parse("localhost:5000").unwrap();
        assert_eq!(r.to_string(), "docker.io/library/localhost:5000");
        let r = ImageRef::parse("[::1]:5000/app:1").unwrap();
        assert_eq!(r.registry(), "[::1]:5000");
        let r = ImageRef::parse("123456789012.dkr.ecr.eu-west-1.amazonaws.com/app:1").unwrap();
        assert_eq!(r.registry(), "123456789012.dkr.ecr.eu-west-1.amazonaws.com");
    }

    #[test]
    fn digests_pin_and_win_over_tags() {
        let hex = "a".repeat(64);
        let r = ImageRef::parse(&format!("debian@sha256:{hex}")).unwrap();
        assert_eq!(r.tag(), None);
        assert_eq!(r.manifest_reference(), format!("sha256:{hex}"));
        assert_eq!(
            r.to_string(),
            format!("docker.io/library/debian@sha256:{hex}")
        );
        let r = ImageRef::parse(&format!("debian:12@sha256:{hex}")).unwrap();
        assert_eq!(r.tag(), Some("12"));
        assert_eq!(r.manifest_reference(), format!("sha256:{hex}"));
        assert_eq!(r.unpinned().to_string(), "docker.io/library/debian:12");
        assert_eq!(r.familiar(), format!("debian:12@sha256:{hex}"));
    }

    #[test]
    fn bad_references_are_refused_with_the_reason() {
        for (s, needle) in [
            ("", "empty"),
            ("Debian", "lower-case"),
            ("debian:", "tag"),
            ("debian:-x", "tag"),
            ("debian@sha512:abcd", "sha512"),
            ("debian@sha256:abc", "64"),
            ("a//b", "component"),
            ("a/b_-c", "component"),
            ("bad_host.com:port/x", "registry"),
            (":tag", "missing"),
        ] {
            let e = ImageRef::parse(s).unwrap_err().to_string();
            assert!(e.contains(needle), "{s:?}: {e}");
        }
        assert!(ImageRef::parse(&format!("x/{}", "a".repeat(300))).is_err());
    }

    #[test]
    fn familiar_names_are_dockers_short_form() {
        assert_eq!(
            ImageRef::parse("docker.io/library/debian:12")
                .unwrap()
                .familiar(),
            "debian:12"
        );
        assert_eq!(
            ImageRef::parse("e2bdev/base").unwrap().familiar(),
            "e2bdev/base:latest"
        );
        assert_eq!(
            ImageRef::parse("127.0.0.1:5000/x").unwrap().familiar(),
            "127.0.0.1:5000/x:latest"
        );
    }

    fn component() -> impl Strategy<Value = String> {
        proptest::string::string_regex("[a-z0-9]{1,6}((\\.|_|__|-{1,2})[a-z0-9]{1,4}){0,2}")
            .unwrap()
    }

    /// A repository path. Its first component has no dot: a dotted first component names a
    /// registry, in Docker as here.
    fn path() -> impl Strategy<Value = Vec<String>> {
        (
            proptest::string::string_regex("[a-z0-9]{1,6}((_|__|-{1,2})[a-z0-9]{1,4}){0,2}")
                .unwrap(),
            proptest::collection::vec(component(), 0..3),
        )
            .prop_map(|(first, rest)| std::iter::once(first).chain(rest).collect())
    }

    fn reference() -> impl Strategy<Value = String> {
        let registry = prop_oneof![
            Just(String::new()),
            Just("docker.io/".to_owned()),
            Just("index.docker.io/".to_owned()),
            Just("localhost:5000/".to_owned()),
            Just("127.0.0.1:5000/".to_owned()),
            Just("ghcr.io/".to_owned()),
            Just("registry.example.com/".to_owned()),
        ];
        let tag = prop_oneof![
            Just(String::new()),
            proptest::string::string_regex("[A-Za-z0-9_][A-Za-z0-9_.-]{0,12}")
                .unwrap()
                .prop_map(|t| format!(":{t}")),
        ];
        let digest = prop_oneof![
            Just(String::new()),
            proptest::string::string_regex("[0-9a-f]{64}")
                .unwrap()
                .prop_map(|h| format!("@sha256:{h}")),
        ];
        (registry, path(), tag, digest)
            .prop_map(|(r, path, t, d)| format!("{r}{}{t}{d}", path.join("/")))
    }

    proptest! {
        /// The canonical form is a fixed point, and the familiar form names the same image.
        #[test]
        fn normalization_is_idempotent(s in reference()) {
            let r = ImageRef::parse(&s).unwrap();
            let again = ImageRef::parse(&r.to_string()).unwrap();
            prop_assert_eq!(&again, &r);
            prop_assert_eq!(ImageRef::parse(&r.familiar()).unwrap(), r.clone());
            prop_assert!(r.tag().is_some() || r.digest().is_some());
            prop_assert!(r.repository().contains('/') || r.registry() != DEFAULT_REGISTRY);
        }

        /// Adding the defaults Docker adds changes nothing.
        #[test]
        fn defaults_are_implied(path in path()) {
            let name = path.join("/");
            let short = ImageRef::parse(&name).unwrap();
            prop_assert_eq!(&ImageRef::parse(&format!("{name}:latest")).unwrap(), &short);
            prop_assert_eq!(&ImageRef::parse(&format!("docker.io/{name}")).unwrap(), &short);
            if path.len() == 1 {
                prop_assert_eq!(&ImageRef::parse(&format!("docker.io/library/{name}")).unwrap(), &short);
            }
        }

        /// Parsing never panics, whatever the input.
        #[test]
        fn arbitrary_text_never_panics(s in ".{0,80}") {
            let _ = ImageRef::parse(&s);
        }
    }
}
