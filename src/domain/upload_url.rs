//! Signed upload URLs: the only credential of the SDK's bare `PUT` (no API key is sent).
//!
//! Layout: [`UploadSecret`] (the server key, redacted in `Debug`); [`UploadGrant`] (what a URL
//! allows); [`UploadGrant::sign`] giving a [`SignedUpload`] (path and query, signature redacted in
//! `Debug`); [`verify`] with its [`UrlError`]s.
//!
//! A URL grants exactly one thing: `PUT` of at most `max_size` bytes for `(team, build, intent,
//! hash, generation)` until `expires_at`. The MAC is HMAC-SHA256 over the canonical,
//! length-delimited encoding of all of those plus the method, so no field can be moved into
//! another. Verification compares in constant time (`hmac`'s `verify_slice`), checks the MAC
//! before the expiry (a forged expiry learns nothing) and reads the clock from its caller.
//!
//! Shape: `/upload/{build}/{intent}/{hash}/{generation}?team=..&max=..&exp=..&sig=..`, where `exp`
//! is Unix seconds and `sig` is unpadded base64url.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::canonical::Encoder;
use super::ids::{BuildId, FilesHash, Generation, IntentId, TeamId};

/// The path prefix the API routes to the upload handler.
pub const UPLOAD_PATH_PREFIX: &str = "/upload/";

/// The server's signing key. At least 32 bytes; never printed.
#[derive(Clone)]
pub struct UploadSecret(Vec<u8>);

impl UploadSecret {
    pub fn new(bytes: Vec<u8>) -> Result<Self, UrlError> {
        if bytes.len() < 32 {
            return Err(UrlError::WeakSecret { len: bytes.len() });
        }
        Ok(Self(bytes))
    }
}

impl std::fmt::Debug for UploadSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UploadSecret(<redacted>)")
    }
}

/// The only method a grant allows. Kept in the MAC so a future method cannot reuse a PUT URL.
pub const METHOD_PUT: &str = "PUT";

/// What one upload URL allows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UploadGrant {
    pub team: TeamId,
    pub build: BuildId,
    pub intent: IntentId,
    pub hash: FilesHash,
    pub generation: Generation,
    /// The largest body accepted, checked against `Content-Length` before reading.
    pub max_size: u64,
    /// Whole seconds: the URL carries Unix seconds.
    pub expires_at: DateTime<Utc>,
}

/// A signed upload URL's path and query. `Debug` hides the signature; use
/// [`SignedUpload::expose_path_and_query`] only to build the link response.
#[derive(Clone, PartialEq, Eq)]
pub struct SignedUpload {
    path: String,
    query_without_sig: String,
    sig: String,
}

impl SignedUpload {
    pub fn expose_path_and_query(&self) -> String {
        format!("{}?{}&sig={}", self.path, self.query_without_sig, self.sig)
    }
}

impl std::fmt::Debug for SignedUpload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SignedUpload({}?{}&sig=<redacted>)",
            self.path, self.query_without_sig
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("the upload URL expired at {expired_at}; request a new link with GET /templates/{{id}}/files/{{hash}}")]
    Expired { expired_at: DateTime<Utc> },
    #[error("the upload URL's signature does not match; use the URL exactly as the link response returned it")]
    BadSignature,
    #[error("the upload URL is malformed ({what}); use the URL exactly as the link response returned it")]
    Malformed { what: &'static str },
    #[error("the upload signing secret has {len} bytes; use at least 32 random bytes")]
    WeakSecret { len: usize },
}

type HmacSha256 = Hmac<Sha256>;

fn mac(secret: &UploadSecret, grant: &UploadGrant, method: &str) -> HmacSha256 {
    let mut e = Encoder::new("strata.upload-url.v1");
    e.str(method)
        .str(grant.team.as_str())
        .str(&grant.build.to_string())
        .str(&grant.intent.to_string())
        .str(grant.hash.as_str())
        .u64(grant.generation.0)
        .u64(grant.max_size)
        .u64(grant.expires_at.timestamp() as u64);
    let mut mac = HmacSha256::new_from_slice(&secret.0).expect("HMAC accepts keys of any length");
    mac.update(e.as_bytes());
    mac
}

impl UploadGrant {
    pub fn sign(&self, secret: &UploadSecret) -> SignedUpload {
        let sig = URL_SAFE_NO_PAD.encode(mac(secret, self, METHOD_PUT).finalize().into_bytes());
        SignedUpload {
            path: format!(
                "{UPLOAD_PATH_PREFIX}{}/{}/{}/{}",
                self.build, self.intent, self.hash, self.generation
            ),
            query_without_sig: format!(
                "team={}&max={}&exp={}",
                self.team,
                self.max_size,
                self.expires_at.timestamp()
            ),
            sig,
        }
    }
}

/// Checks an incoming upload request: `path` and `query` as received, `method` the HTTP method.
/// Returns the grant it carries, or why it is refused.
pub fn verify(
    path: &str,
    query: &str,
    method: &str,
    secret: &UploadSecret,
    now: DateTime<Utc>,
) -> Result<UploadGrant, UrlError> {
    let malformed = |what| UrlError::Malformed { what };
    let rest = path
        .strip_prefix(UPLOAD_PATH_PREFIX)
        .ok_or(malformed("path prefix"))?;
    let parts: Vec<&str> = rest.split('/').collect();
    let [build, intent, hash, generation] = parts.as_slice() else {
        return Err(malformed("path segments"));
    };
    let build = BuildId::parse(build).map_err(|_| malformed("build id"))?;
    let intent = IntentId::parse(intent).map_err(|_| malformed("intent id"))?;
    let hash = FilesHash::parse(hash).map_err(|_| malformed("filesHash"))?;
    let generation = Generation(generation.parse().map_err(|_| malformed("generation"))?);

    let (mut team, mut max, mut exp, mut sig) = (None, None, None, None);
    for pair in query.split('&') {
        let (key, value) = pair.split_once('=').ok_or(malformed("query pair"))?;
        let slot = match key {
            "team" => &mut team,
            "max" => &mut max,
            "exp" => &mut exp,
            "sig" => &mut sig,
            _ => return Err(malformed("unknown query parameter")),
        };
        if slot.replace(value).is_some() {
            return Err(malformed("repeated query parameter"));
        }
    }
    let team = TeamId::parse(team.ok_or(malformed("team"))?).map_err(|_| malformed("team"))?;
    let max_size = max
        .ok_or(malformed("max"))?
        .parse()
        .map_err(|_| malformed("max"))?;
    let exp: i64 = exp
        .ok_or(malformed("exp"))?
        .parse()
        .map_err(|_| malformed("exp"))?;
    let expires_at = DateTime::from_timestamp(exp, 0).ok_or(malformed("exp"))?;
    let sig = URL_SAFE_NO_PAD
        .decode(sig.ok_or(malformed("sig"))?)
        .map_err(|_| malformed("sig"))?;

    let grant = UploadGrant {
        team,
        build,
        intent,
        hash,
        generation,
        max_size,
        expires_at,
    };
    mac(secret, &grant, method)
        .verify_slice(&sig)
        .map_err(|_| UrlError::BadSignature)?;
    if now >= expires_at {
        return Err(UrlError::Expired {
            expired_at: expires_at,
        });
    }
    Ok(grant)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;
    use uuid::Uuid;

    fn secret() -> UploadSecret {
        UploadSecret::new(vec![7u8; 32]).unwrap()
    }
    fn grant() -> UploadGrant {
        UploadGrant {
            team: TeamId::parse("team-1").unwrap(),
            build: BuildId::from_uuid(Uuid::from_u128(1)),
            intent: IntentId::from_uuid(Uuid::from_u128(2)),
            hash: FilesHash::parse(&"9".repeat(64)).unwrap(),
            generation: Generation(3),
            max_size: 1 << 30,
            expires_at: Utc.with_ymd_and_hms(2026, 11, 29, 13, 0, 0).unwrap(),
        }
    }
    fn split(url: &str) -> (&str, &str) {
        url.split_once('?').unwrap()
    }
    fn before_expiry() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 29, 12, 0, 0).unwrap()
    }

    #[test]
    fn a_signed_url_verifies_to_its_grant() {
        let url = grant().sign(&secret()).expose_path_and_query();
        let (path, query) = split(&url);
        assert_eq!(
            verify(path, query, "PUT", &secret(), before_expiry()),
            Ok(grant())
        );
    }

    #[test]
    fn expiry_is_enforced_at_the_instant() {
        let url = grant().sign(&secret()).expose_path_and_query();
        let (path, query) = split(&url);
        assert!(matches!(
            verify(path, query, "PUT", &secret(), grant().expires_at),
            Err(UrlError::Expired { .. })
        ));
    }

    #[test]
    fn any_tampering_is_a_bad_signature() {
        let url = grant().sign(&secret()).expose_path_and_query();
        let (path, query) = split(&url);
        let other = UploadSecret::new(vec![8u8; 32]).unwrap();
        assert_eq!(
            verify(path, query, "PUT", &other, before_expiry()),
            Err(UrlError::BadSignature)
        );
        assert_eq!(
            verify(path, query, "POST", &secret(), before_expiry()),
            Err(UrlError::BadSignature)
        );
        let bigger = query.replace("max=1073741824", "max=1073741825");
        assert_eq!(
            verify(path, &bigger, "PUT", &secret(), before_expiry()),
            Err(UrlError::BadSignature)
        );
        let later = query.replace(
            &grant().expires_at.timestamp().to_string(),
            &(grant().expires_at.timestamp() + 1).to_string(),
        );
        assert_eq!(
            verify(path, &later, "PUT", &secret(), before_expiry()),
            Err(UrlError::BadSignature)
        );
        let other_gen = path.replace("/3", "/4");
        assert_eq!(
            verify(&other_gen, query, "PUT", &secret(), before_expiry()),
            Err(UrlError::BadSignature)
        );
    }

    #[test]
    fn malformed_urls_say_what_is_wrong() {
        let url = grant().sign(&secret()).expose_path_and_query();
        let (path, query) = split(&url);
        for (p, q) in [
            ("/other/x", query),
            (&path[..path.len() - 2], query),
            (path, "team=team-1&max=1"),
            (path, &format!("{query}&extra=1")),
            (path, &query.replace("sig=", "sig=%%%")),
        ] {
            assert!(
                matches!(
                    verify(p, q, "PUT", &secret(), before_expiry()),
                    Err(UrlError::Malformed { .. })
                ),
                "{p}?{q}"
            );
        }
    }

    #[test]
    fn secrets_and_signatures_never_print() {
        let signed = grant().sign(&secret());
        let url = signed.expose_path_and_query();
        let sig = url.rsplit_once("sig=").unwrap().1;
        let debug = format!("{signed:?} {:?}", secret());
        assert!(!debug.contains(sig), "{debug}");
        assert!(debug.contains("<redacted>"));
        assert!(UploadSecret::new(vec![1; 16]).is_err());
    }

    proptest! {
        #[test]
        fn flipping_any_signature_character_is_rejected(pos in 0usize..43, c in "[A-Za-z0-9_-]") {
            let url = grant().sign(&secret()).expose_path_and_query();
            let (path, query) = split(&url);
            let (head, sig) = query.rsplit_once("sig=").unwrap();
            let mut chars: Vec<char> = sig.chars().collect();
            let pos = pos % chars.len();
            let replacement = c.chars().next().unwrap();
            prop_assume!(chars[pos] != replacement);
            chars[pos] = replacement;
            let tampered = format!("{head}sig={}", chars.into_iter().collect::<String>());
            let result = verify(path, &tampered, "PUT", &secret(), before_expiry());
            let rejected = matches!(result, Err(UrlError::BadSignature) | Err(UrlError::Malformed { .. }));
            prop_assert!(rejected, "tampered signature accepted: {:?}", result);
        }
    }
}
