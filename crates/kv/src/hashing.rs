//! Block and sequence hashing (docs/kv-events.md, "Hashing").

pub use kvmesh_core::IdentityHasher;
use xxhash_rust::const_xxh3::const_custom_default_secret;
use xxhash_rust::xxh3::{xxh3_64_with_secret, xxh3_64_with_seed};

/// Seed every block hash starts from, and the constant seed of sequence hashing.
pub const BASE_SEED: u64 = 1337;

/// Content hash of one full block of tokens: equal tokens give equal hashes at any position.
pub type LocalBlockHash = u64;

/// Rolling hash of a whole prefix up to and including a block.
pub type SequenceHash = u64;

/// Returns the block-hash seed for a request: 1337, plus the hash of a non-empty LoRA name, plus
/// the hash of a non-empty cache salt.
pub fn seed_for(lora_name: Option<&str>, cache_salt: Option<&str>) -> u64 {
    let mut seed = BASE_SEED;
    if let Some(lora) = lora_name.filter(|name| !name.is_empty()) {
        seed = seed.wrapping_add(xxh3_64_with_seed(lora.as_bytes(), 0));
    }
    if let Some(salt) = cache_salt.filter(|salt| !salt.is_empty()) {
        seed = seed.wrapping_add(xxh3_64_with_seed(salt.as_bytes(), 1));
    }
    seed
}

/// Hashes token blocks with a fixed seed, reusing one byte buffer between calls.
///
/// Exists so that hot paths (the router hashing every prompt, the mocker hashing every block) do
/// not allocate per block.
#[derive(Debug, Clone)]
pub struct BlockHasher {
    block_size: usize,
    seed: u64,
    /// The XXH3 secret `seed` derives, made once: for inputs past [`XXH3_MID_SIZE_MAX`] bytes
    /// XXH3 with a seed is XXH3 with this secret, and deriving it per block costs as much as
    /// hashing a 64-token block.
    secret: [u8; 192],
    bytes: Vec<u8>,
}

/// The longest input XXH3 hashes with its short-input paths, where a seed is mixed in directly
/// rather than through the derived secret.
const XXH3_MID_SIZE_MAX: usize = 240;

impl BlockHasher {
    /// Creates a hasher for blocks of `block_size` tokens (at least 1) with the given seed.
    pub fn new(block_size: usize, seed: u64) -> Self {
        let block_size = block_size.max(1);
        Self {
            block_size,
            seed,
            secret: const_custom_default_secret(seed),
            // Block sizes can come from requests: reserve for a common block, grow past it.
            bytes: Vec::with_capacity(block_size.min(1024) * 4),
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Hashes one block of exactly `block_size` tokens (shorter input is hashed as given).
    pub fn hash_block(&mut self, tokens: &[u32]) -> LocalBlockHash {
        // Sized first and filled in place: a loop the compiler turns into wide copies.
        self.bytes.resize(tokens.len() * 4, 0);
        for (bytes, token) in self.bytes.chunks_exact_mut(4).zip(tokens) {
            bytes.copy_from_slice(&token.to_le_bytes());
        }
        if self.bytes.len() > XXH3_MID_SIZE_MAX {
            xxh3_64_with_secret(&self.bytes, &self.secret)
        } else {
            xxh3_64_with_seed(&self.bytes, self.seed)
        }
    }

    /// Appends the local hash of every full block of `tokens` to `out`; a trailing partial block
    /// is dropped.
    pub fn hash_blocks_into(&mut self, tokens: &[u32], out: &mut Vec<LocalBlockHash>) {
        out.reserve(tokens.len() / self.block_size);
        for block in tokens.chunks_exact(self.block_size) {
            let hash = self.hash_block(block);
            out.push(hash);
        }
    }
}

/// Local hashes of every full block of `tokens`.
pub fn compute_block_hashes(tokens: &[u32], block_size: usize, seed: u64) -> Vec<LocalBlockHash> {
    let mut out = Vec::new();
    BlockHasher::new(block_size, seed).hash_blocks_into(tokens, &mut out);
    out
}

/// Chains a parent sequence hash with the next block's local hash.
#[inline]
pub fn chain_seq_hash(parent: SequenceHash, local: LocalBlockHash) -> SequenceHash {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&parent.to_le_bytes());
    bytes[8..].copy_from_slice(&local.to_le_bytes());
    xxh3_64_with_seed(&bytes, BASE_SEED)
}

/// Sequence hashes for a run of local hashes starting at the root.
pub fn compute_seq_hashes(local: &[LocalBlockHash]) -> Vec<SequenceHash> {
    let mut out = Vec::with_capacity(local.len());
    let mut parent = None;
    for &hash in local {
        let seq = match parent {
            None => hash,
            Some(parent) => chain_seq_hash(parent, hash),
        };
        out.push(seq);
        parent = Some(seq);
    }
    out
}

/// Event-plane partition of a worker: `xxh3_64(LE64(worker_id), 0) mod partitions`.
pub fn kv_partition(worker_id: u64, partitions: u32) -> u32 {
    let partitions = u64::from(partitions.max(1));
    (xxh3_64_with_seed(&worker_id.to_le_bytes(), 0) % partitions) as u32
}

/// A hash map keyed by block hashes ([`IdentityHasher`]).
pub type BlockHashMap<V> = std::collections::HashMap<u64, V, kvmesh_core::BuildIdentityHasher>;

/// A set of block hashes ([`IdentityHasher`]).
pub type BlockHashSet = std::collections::HashSet<u64, kvmesh_core::BuildIdentityHasher>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_local_hashes() {
        let tokens: Vec<u32> = (1..=12).collect();
        let hashes = compute_block_hashes(&tokens, 4, BASE_SEED);
        assert_eq!(
            hashes,
            vec![
                14643705804678351452,
                16777012769546811212,
                483935686894639516
            ]
        );
    }

    #[test]
    fn a_huge_block_size_hashes_nothing_and_reserves_little() {
        assert!(compute_block_hashes(&[1, 2, 3], u32::MAX as usize, BASE_SEED).is_empty());
        assert!(
            BlockHasher::new(u32::MAX as usize, BASE_SEED)
                .bytes
                .capacity()
                <= 4096
        );
    }

    #[test]
    fn golden_sequence_hashes() {
        let tokens: Vec<u32> = (1..=12).collect();
        let seq = compute_seq_hashes(&compute_block_hashes(&tokens, 4, BASE_SEED));
        assert_eq!(seq[0], 14643705804678351452);
        assert_eq!(seq[1], 4945711292740353085);
        assert_eq!(seq[2], 12583592247330656132);
    }

    #[test]
    fn golden_lora_seed() {
        let seed = seed_for(Some("my-lora"), None);
        assert_eq!(seed, 12827409268353072861);
        assert_eq!(
            compute_block_hashes(&[1, 2, 3, 4], 4, seed),
            vec![15671544057904749233]
        );
        assert_eq!(seed_for(Some(""), None), BASE_SEED);
    }

    #[test]
    fn every_block_size_hashes_as_xxh3_with_the_seed() {
        // Either side of the 240-byte edge where the derived secret takes over, with seeds that
        // differ from the base one.
        let tokens: Vec<u32> = (0..4096u32)
            .map(|t| t.wrapping_mul(2_654_435_761))
            .collect();
        for seed in [BASE_SEED, 0, seed_for(Some("my-lora"), Some("salt"))] {
            for block_size in [1, 4, 16, 59, 60, 61, 64, 65, 128, 256, 1024] {
                let mut hasher = BlockHasher::new(block_size, seed);
                for block in tokens.chunks_exact(block_size).take(8) {
                    let bytes: Vec<u8> = block.iter().flat_map(|t| t.to_le_bytes()).collect();
                    assert_eq!(
                        hasher.hash_block(block),
                        xxh3_64_with_seed(&bytes, seed),
                        "block size {block_size}, seed {seed}"
                    );
                }
            }
        }
    }

    #[test]
    fn partial_block_is_dropped() {
        let tokens: Vec<u32> = (0..10).collect();
        assert_eq!(compute_block_hashes(&tokens, 4, BASE_SEED).len(), 2);
    }

    #[test]
    fn golden_partitions() {
        assert_eq!(kv_partition(1, 16), 14);
        assert_eq!(kv_partition(2, 16), 3);
        assert_eq!(kv_partition(42, 16), 8);
    }
}
