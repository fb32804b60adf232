//! A canonical, length-delimited binary encoding for everything strata hashes into an identity
//! (request digests, cache keys).
//!
//! Layout: [`Encoder`] with one method per value shape; [`Encoder::digest`] to finish. Every value
//! is self-delimiting (fixed-width integers, length-prefixed byte strings, counted lists, tagged
//! options), so the concatenation of encodings is prefix-free and two different value sequences
//! never encode to the same bytes. That is the property string joins lack: `["a b", "c"]` and
//! `["a", "b c"]` join to the same text but encode differently here.
//!
//! Every encoding starts with a domain label (for example `strata.request.v1`) so that a request
//! digest can never equal a cache key, and so that changing the layout means changing the label.

use super::ids::Digest;

/// Accumulates the canonical bytes of one value.
#[derive(Debug, Clone, Default)]
pub struct Encoder {
    bytes: Vec<u8>,
}

impl Encoder {
    /// Starts an encoding under a domain label; the label names the layout and its version.
    pub fn new(domain: &str) -> Self {
        let mut encoder = Self::default();
        encoder.str(domain);
        encoder
    }
    pub fn u8(&mut self, value: u8) -> &mut Self {
        self.bytes.push(value);
        self
    }
    pub fn u64(&mut self, value: u64) -> &mut Self {
        self.bytes.extend_from_slice(&value.to_be_bytes());
        self
    }
    pub fn bool(&mut self, value: bool) -> &mut Self {
        self.u8(value as u8)
    }
    /// A byte string: its length as a u64, then the bytes.
    pub fn bytes(&mut self, value: &[u8]) -> &mut Self {
        self.u64(value.len() as u64);
        self.bytes.extend_from_slice(value);
        self
    }
    pub fn str(&mut self, value: &str) -> &mut Self {
        self.bytes(value.as_bytes())
    }
    /// An optional value: tag 0 for none, tag 1 followed by the value.
    pub fn opt<T>(&mut self, value: Option<T>, mut some: impl FnMut(&mut Self, T)) -> &mut Self {
        match value {
            None => self.u8(0),
            Some(v) => {
                self.u8(1);
                some(self, v);
                self
            }
        }
    }
    pub fn opt_str(&mut self, value: Option<&str>) -> &mut Self {
        self.opt(value, |e, v| {
            e.str(v);
        })
    }
    /// A list: the item count, then each item.
    pub fn list<T>(
        &mut self,
        items: impl ExactSizeIterator<Item = T>,
        mut item: impl FnMut(&mut Self, T),
    ) -> &mut Self {
        self.u64(items.len() as u64);
        for value in items {
            item(self, value);
        }
        self
    }
    pub fn digest_field(&mut self, value: &Digest) -> &mut Self {
        self.bytes.extend_from_slice(value.as_bytes());
        self
    }
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
    /// The sha256 of the bytes encoded so far.
    pub fn digest(&self) -> Digest {
        Digest::of(&self.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn encode_list(items: &[String]) -> Vec<u8> {
        let mut e = Encoder::new("test.v1");
        e.list(items.iter(), |e, s| {
            e.str(s);
        });
        e.as_bytes().to_vec()
    }

    #[test]
    fn joins_that_collide_as_text_encode_differently() {
        let a = encode_list(&["a b".into(), "c".into()]);
        let b = encode_list(&["a".into(), "b c".into()]);
        assert_ne!(a, b);
    }

    #[test]
    fn domain_label_separates_encodings() {
        let mut a = Encoder::new("strata.request.v1");
        let mut b = Encoder::new("strata.cache.v1");
        a.str("x");
        b.str("x");
        assert_ne!(a.digest(), b.digest());
    }

    proptest! {
        #[test]
        fn list_encoding_is_injective(
            a in proptest::collection::vec(".{0,8}", 0..5),
            b in proptest::collection::vec(".{0,8}", 0..5),
        ) {
            prop_assume!(a != b);
            prop_assert_ne!(encode_list(&a), encode_list(&b));
        }

        #[test]
        fn list_encoding_is_prefix_free(
            a in proptest::collection::vec(".{0,8}", 0..5),
            b in proptest::collection::vec(".{0,8}", 0..5),
        ) {
            prop_assume!(a != b);
            let (ea, eb) = (encode_list(&a), encode_list(&b));
            prop_assert!(!eb.starts_with(&ea) && !ea.starts_with(&eb));
        }
    }
}
