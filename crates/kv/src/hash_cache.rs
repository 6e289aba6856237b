//! Block hashes found again by prompt prefix: a conversation's next turn hashes only the blocks
//! after the longest prefix an earlier prompt shared (docs/tokenization.md, "Block hashes").
//!
//! The prefixes are named by the prompt's cut points ([`PrefixCut`]), which the tokenizing stage
//! computes anyway; equal keys promise equal tokens before the cut, so the full blocks before it
//! have equal hashes. A cut's key is combined with the request's block-hash seed (LoRA, cache
//! salt), so prompts that hash differently never share. A wrong key (from a caller that lies)
//! can only misplace that caller's own requests: the hashes steer routing, not generation.

use crate::hashing::{BlockHasher, chain_seq_hash};
use kvmesh_core::prefix::{PrefixCut, PrefixEntry, PrefixStats, PrefixStore};

/// The cache of one model's router, or of one mock worker's engine; share it behind an `Arc`.
pub struct BlockHashCache {
    store: PrefixStore<HashedPrompt>,
}

/// One stored prompt: its blocks' hashes up to its last cut.
struct HashedPrompt {
    /// Keys of its cuts (salted with the seed and block size).
    keys: Vec<u128>,
    /// Full blocks before each cut.
    blocks: Vec<usize>,
    /// (local, sequence) hash of each block.
    hashes: Vec<(u64, u64)>,
}

impl PrefixEntry for HashedPrompt {
    fn keys(&self) -> &[u128] {
        &self.keys
    }

    fn value_bytes(&self) -> usize {
        self.keys.capacity() * std::mem::size_of::<u128>()
            + self.blocks.capacity() * std::mem::size_of::<usize>()
            + self.hashes.capacity() * std::mem::size_of::<(u64, u64)>()
    }
}

impl BlockHashCache {
    /// A cache holding at most `max_bytes` (0 = every prompt is hashed whole).
    pub fn new(max_bytes: usize) -> Self {
        Self {
            store: PrefixStore::new(max_bytes),
        }
    }

    /// The local and sequence hashes of every full block of `tokens`, reusing those of the
    /// longest cached prefix among `cuts`, and caching this prompt's for the next one.
    pub fn hash(
        &self,
        tokens: &[u32],
        cuts: &[PrefixCut],
        block_size: u32,
        seed: u64,
    ) -> (Vec<u64>, Vec<u64>) {
        let block_size = block_size.max(1) as usize;
        let num_blocks = tokens.len() / block_size;
        // Cuts past the prompt (a caller's mistake) are ignored rather than trusted.
        let cuts = &cuts[..cuts.partition_point(|cut| cut.tokens as usize <= tokens.len())];
        if cuts.is_empty() || !self.store.is_enabled() {
            return hash_from(tokens, block_size, seed, &[]);
        }
        let salt = u128::from(seed) << 64 | block_size as u128;
        let keys: Vec<u128> = cuts.iter().map(|cut| cut.key ^ salt).collect();
        let blocks: Vec<usize> = cuts
            .iter()
            .map(|cut| cut.tokens as usize / block_size)
            .collect();
        let hit = self.store.longest(&keys);
        let shared = hit.as_ref().map_or(&[][..], |hit| {
            let held = &hit.entry.hashes;
            &held[..hit.entry.blocks[hit.index].min(held.len())]
        });
        let shared = &shared[..shared.len().min(num_blocks)];
        self.store.record(hit.as_ref().map(|_| shared.len()));
        let (local, seq) = hash_from(tokens, block_size, seed, shared);
        let held = blocks.last().map_or(0, |&last| last.min(num_blocks));
        let hashes = local[..held]
            .iter()
            .copied()
            .zip(seq[..held].iter().copied())
            .collect();
        self.store.insert(HashedPrompt {
            keys,
            blocks,
            hashes,
        });
        (local, seq)
    }

    /// Counters and size now (`reused` counts blocks).
    pub fn stats(&self) -> PrefixStats {
        self.store.stats()
    }
}

/// The hashes of every full block, the first `shared.len()` taken from `shared`.
fn hash_from(
    tokens: &[u32],
    block_size: usize,
    seed: u64,
    shared: &[(u64, u64)],
) -> (Vec<u64>, Vec<u64>) {
    let num_blocks = tokens.len() / block_size;
    let mut local = Vec::with_capacity(num_blocks);
    let mut seq = Vec::with_capacity(num_blocks);
    for &(l, s) in shared {
        local.push(l);
        seq.push(s);
    }
    let mut hasher = BlockHasher::new(block_size, seed);
    let mut parent = seq.last().copied();
    for block in tokens[shared.len() * block_size..].chunks_exact(block_size) {
        let hash = hasher.hash_block(block);
        let chained = parent.map_or(hash, |parent| chain_seq_hash(parent, hash));
        local.push(hash);
        seq.push(chained);
        parent = Some(chained);
    }
    (local, seq)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(tokens: &[u32], block_size: u32, seed: u64) -> (Vec<u64>, Vec<u64>) {
        let local = crate::hashing::compute_block_hashes(tokens, block_size as usize, seed);
        let seq = crate::hashing::compute_seq_hashes(&local);
        (local, seq)
    }

    fn cut(key: u128, tokens: u32) -> PrefixCut {
        PrefixCut { key, tokens }
    }

    #[test]
    fn a_later_turn_reuses_the_shared_blocks_and_hashes_exactly_as_whole() {
        let cache = BlockHashCache::new(1 << 20);
        let first: Vec<u32> = (0..1000).collect();
        let cuts = [cut(1, 100), cut(2, 990)];
        assert_eq!(cache.hash(&first, &cuts, 16, 7), whole(&first, 16, 7));
        let mut second = first[..990].to_vec();
        second.extend(5000..6000);
        let cuts = [cut(1, 100), cut(2, 990), cut(3, 1900)];
        assert_eq!(cache.hash(&second, &cuts, 16, 7), whole(&second, 16, 7));
        let stats = cache.stats();
        assert_eq!((stats.hits, stats.misses), (1, 1));
        assert_eq!(stats.reused, 990 / 16);
    }

    #[test]
    fn another_seed_or_block_size_shares_nothing() {
        let cache = BlockHashCache::new(1 << 20);
        let tokens: Vec<u32> = (0..640).collect();
        let cuts = [cut(9, 640)];
        cache.hash(&tokens, &cuts, 16, 1);
        assert_eq!(cache.hash(&tokens, &cuts, 16, 2), whole(&tokens, 16, 2));
        assert_eq!(cache.hash(&tokens, &cuts, 32, 1), whole(&tokens, 32, 1));
        assert_eq!(cache.stats().hits, 0);
        assert_eq!(cache.hash(&tokens, &cuts, 16, 1), whole(&tokens, 16, 1));
        assert_eq!(cache.stats().hits, 1);
    }

    #[test]
    fn cuts_past_the_prompt_are_ignored() {
        let cache = BlockHashCache::new(1 << 20);
        let long: Vec<u32> = (0..640).collect();
        cache.hash(&long, &[cut(4, 640)], 16, 0);
        let short = &long[..100];
        assert_eq!(
            cache.hash(short, &[cut(4, 640)], 16, 0),
            whole(short, 16, 0)
        );
    }
}
