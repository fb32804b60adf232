//! Registry credentials at rest: sealed with ChaCha20-Poly1305 under a key derived from the
//! server secret (the one that signs upload URLs), bound to their build (the build id is the
//! associated data, so a sealed row moved to another build does not open). Stored in
//! `build_credentials`, readable only while the reading attempt holds the build, deleted when
//! the build ends (the inline builds projection deletes the row with the terminal event).

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use sqlx::PgPool;

use crate::domain::build_spec::RegistryCredentials;
use crate::domain::ids::{BuildId, Epoch};

const NONCE_LEN: usize = 12;

#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("the sealed registry credentials of build {0} do not open with this server's key; every API replica and build node needs the same STRATA_UPLOAD_SECRET")]
    Open(BuildId),
    #[error("reading the registry credentials of build {build}: {source}")]
    Store {
        build: BuildId,
        #[source]
        source: sqlx::Error,
    },
}

/// The sealing key. `Debug` shows nothing of it.
#[derive(Clone)]
pub struct CredentialSeal {
    cipher: ChaCha20Poly1305,
    /// Keys [`Self::fingerprint`]: derived from the same secret for that purpose only.
    fingerprint_key: [u8; 32],
}

impl std::fmt::Debug for CredentialSeal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CredentialSeal(<key>)")
    }
}

impl CredentialSeal {
    /// Derives the key from the server secret, for this purpose only.
    pub fn from_secret(secret: &[u8]) -> CredentialSeal {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes any key");
        mac.update(b"strata.registry-credentials.v1");
        let key = mac.finalize().into_bytes();
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes any key");
        mac.update(b"strata.registry-credentials-fingerprint.v1");
        CredentialSeal {
            cipher: ChaCha20Poly1305::new(Key::from_slice(&key)),
            fingerprint_key: mac.finalize().into_bytes().into(),
        }
    }

    /// A keyed digest of `credentials`: the same credentials give the same digest on every API
    /// replica sharing the secret (a retried start is recognised), and without the secret it
    /// says nothing about them, unlike a plain digest anyone could test guesses against.
    pub fn fingerprint(&self, credentials: &RegistryCredentials) -> crate::domain::ids::Digest {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.fingerprint_key)
            .expect("HMAC takes any key");
        mac.update(&serde_json::to_vec(credentials).expect("credentials serialize"));
        crate::domain::ids::Digest::from_bytes(mac.finalize().into_bytes().into())
    }

    pub fn seal(&self, build: &BuildId, credentials: &RegistryCredentials) -> Vec<u8> {
        let nonce: [u8; NONCE_LEN] = rand::random();
        let plaintext = serde_json::to_vec(credentials).expect("credentials serialize");
        let mut out = nonce.to_vec();
        out.extend(
            self.cipher
                .encrypt(
                    Nonce::from_slice(&nonce),
                    Payload {
                        msg: &plaintext,
                        aad: build.to_string().as_bytes(),
                    },
                )
                .expect("sealing does not fail"),
        );
        out
    }

    pub fn open(&self, build: &BuildId, sealed: &[u8]) -> Result<RegistryCredentials, SealError> {
        if sealed.len() < NONCE_LEN {
            return Err(SealError::Open(*build));
        }
        let (nonce, ciphertext) = sealed.split_at(NONCE_LEN);
        let plaintext = self
            .cipher
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: ciphertext,
                    aad: build.to_string().as_bytes(),
                },
            )
            .map_err(|_| SealError::Open(*build))?;
        serde_json::from_slice(&plaintext).map_err(|_| SealError::Open(*build))
    }
}

/// Stores a build's sealed credentials unless some are stored already (a replayed start keeps
/// the first). Returns whether this call stored them.
pub async fn store(pool: &PgPool, build: &BuildId, sealed: &[u8]) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "INSERT INTO build_credentials (build_id, sealed) VALUES ($1, $2) ON CONFLICT (build_id) DO NOTHING",
    )
    .bind(build.as_uuid())
    .bind(sealed)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Whether sealed credentials of `build` are still stored: from its start until the event that
/// ends it.
pub async fn is_stored(pool: &PgPool, build: &BuildId) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM build_credentials WHERE build_id = $1)")
        .bind(build.as_uuid())
        .fetch_one(pool)
        .await
}

/// Removes exactly these sealed bytes (a start that stored them and was then refused).
pub async fn discard(pool: &PgPool, build: &BuildId, sealed: &[u8]) -> Result<(), sqlx::Error> {
    sqlx::query("DELETE FROM build_credentials WHERE build_id = $1 AND sealed = $2")
        .bind(build.as_uuid())
        .bind(sealed)
        .execute(pool)
        .await
        .map(drop)
}

/// The credentials of `build`, readable only while attempt `epoch` holds it.
pub async fn load(
    pool: &PgPool,
    seal: &CredentialSeal,
    build: &BuildId,
    epoch: Epoch,
) -> Result<Option<RegistryCredentials>, SealError> {
    let row: Option<(Vec<u8>,)> = sqlx::query_as(
        "SELECT c.sealed FROM build_credentials c JOIN builds b ON b.build_id = c.build_id \
         WHERE c.build_id = $1 AND b.phase = 'active' AND b.epoch = $2",
    )
    .bind(build.as_uuid())
    .bind(epoch.0 as i64)
    .fetch_optional(pool)
    .await
    .map_err(|source| SealError::Store {
        build: *build,
        source,
    })?;
    row.map(|(sealed,)| seal.open(build, &sealed)).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fingerprint_is_stable_for_one_secret_and_says_nothing_without_it() {
        let creds = RegistryCredentials::Registry {
            username: "u".into(),
            password: "hunter2".into(),
        };
        let a = CredentialSeal::from_secret(b"0123456789abcdef0123456789abcdef");
        let again = CredentialSeal::from_secret(b"0123456789abcdef0123456789abcdef");
        let other = CredentialSeal::from_secret(b"another secret, another key 0123");
        assert_eq!(a.fingerprint(&creds), again.fingerprint(&creds));
        assert_ne!(a.fingerprint(&creds), other.fingerprint(&creds));
        let plain = crate::domain::ids::Digest::of(&serde_json::to_vec(&creds).unwrap());
        assert_ne!(
            a.fingerprint(&creds),
            plain,
            "not the guessable plain digest"
        );
    }

    #[test]
    fn sealed_credentials_open_only_with_the_key_and_for_their_build() {
        let seal = CredentialSeal::from_secret(b"0123456789abcdef0123456789abcdef");
        let build = BuildId::from_uuid(uuid::Uuid::new_v4());
        let other = BuildId::from_uuid(uuid::Uuid::new_v4());
        let creds = RegistryCredentials::Registry {
            username: "u".into(),
            password: "hunter2-secret".into(),
        };
        let sealed = seal.seal(&build, &creds);
        assert!(
            !sealed.windows(7).any(|w| w == b"hunter2"),
            "the password is not in the clear"
        );
        assert_eq!(seal.open(&build, &sealed).unwrap(), creds);
        assert!(seal.open(&other, &sealed).is_err(), "bound to the build");
        let wrong = CredentialSeal::from_secret(b"another secret of thirty-two bytes");
        assert!(wrong.open(&build, &sealed).is_err());
        let mut tampered = sealed.clone();
        *tampered.last_mut().unwrap() ^= 1;
        assert!(seal.open(&build, &tampered).is_err());
        assert_ne!(seal.seal(&build, &creds), sealed, "a fresh nonce each time");
    }
}
