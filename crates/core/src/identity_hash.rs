//! A hasher for keys that are already uniform hash values (block hashes, prompt-prefix keys):
//! hash maps keyed by them need no SipHash, which costs more than the rest of a lookup.

/// Passes a `u64` key through and folds a `u128` key to 64 bits; other input is mixed a byte
/// at a time. Only for keys that are themselves hash outputs: sequential ids would all land in
/// the same probe group.
#[derive(Debug, Default, Clone, Copy)]
pub struct IdentityHasher(u64);

impl std::hash::Hasher for IdentityHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }

    fn write_u128(&mut self, value: u128) {
        self.0 = (value as u64) ^ ((value >> 64) as u64);
    }
}

/// The `BuildHasher` of hash maps keyed by hash values.
pub type BuildIdentityHasher = std::hash::BuildHasherDefault<IdentityHasher>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, Hasher};

    #[test]
    fn hash_keys_pass_through() {
        let build = BuildIdentityHasher::default();
        assert_eq!(build.hash_one(0xDEAD_BEEF_u64), 0xDEAD_BEEF);
        assert_eq!(build.hash_one((7u128 << 64) | 5), 7 ^ 5);
        let mut bytes = IdentityHasher::default();
        bytes.write(&[1, 2]);
        assert_eq!(bytes.finish(), 0x0102);
    }
}
