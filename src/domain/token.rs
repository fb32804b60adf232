//! Comparing a presented bearer token with the configured one.

use sha2::{Digest as _, Sha256};

/// Compares in time independent of where the tokens differ, and of their lengths (both are
/// hashed to 32 bytes first).
pub fn tokens_equal(presented: &str, expected: &str) -> bool {
    let a = Sha256::digest(presented.as_bytes());
    let b = Sha256::digest(expected.as_bytes());
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}
