//! A hash map split into many small maps by bits of each key's hash.
//!
//! A `HashMap` grows by doubling, moving every entry at once: at a million entries that is tens
//! of milliseconds, and the prefix store does it under its lock, so every request that
//! tokenizes waits (docs/tokenization.md, "Memory"). Split `n` ways, each map doubles on its own
//! and one doubling moves an `n`th of the entries. Lookups cost one more shift.
//!
//! The map also keeps an estimate of its heap bytes, from each shard's capacity, so that the
//! store counts its key map as it is and not at an average load.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};

use crate::BuildIdentityHasher;

/// The most maps the entries are split into.
pub(super) const MAX_SHARDS: usize = 256;

/// Keys must be uniform hash values (the maps hash with [`BuildIdentityHasher`]): the shard
/// is taken from bits 32–39 of the key's hash, apart from the low bits that pick a bucket
/// inside a shard and the top bits hashbrown keeps as a tag.
pub(super) struct ShardedMap<K, V> {
    shards: Box<[HashMap<K, V, BuildIdentityHasher>]>,
    /// Σ [`Self::table_bytes`] over the shards.
    bytes: usize,
}

impl<K: Hash + Eq, V> ShardedMap<K, V> {
    /// An empty map split into `shards` maps (1 to [`MAX_SHARDS`]); a shard allocates on its
    /// first entry.
    pub(super) fn new(shards: usize) -> Self {
        Self {
            shards: (0..shards.clamp(1, MAX_SHARDS))
                .map(|_| HashMap::default())
                .collect(),
            bytes: 0,
        }
    }

    /// Heap bytes of the shards, estimated from their capacities.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Heap bytes of a shard that has room for `capacity` entries, laid out as hashbrown lays a
    /// table out: a power of two of buckets, filled to at most 7/8 (all but one below 8), each a
    /// slot and a control byte, and a group's width of control bytes more.
    pub(super) fn table_bytes(capacity: usize) -> usize {
        const GROUP_WIDTH: usize = 16;
        if capacity == 0 {
            return 0;
        }
        let buckets = if capacity < 8 {
            (capacity + 1).next_power_of_two()
        } else {
            (capacity * 8 / 7).next_power_of_two()
        };
        buckets * (std::mem::size_of::<(K, V)>() + 1) + GROUP_WIDTH
    }

    /// Runs `change` on shard `shard` and brings the byte estimate up to date.
    fn changing<T>(
        &mut self,
        shard: usize,
        change: impl FnOnce(&mut HashMap<K, V, BuildIdentityHasher>) -> T,
    ) -> T {
        let map = &mut self.shards[shard];
        let before = Self::table_bytes(map.capacity());
        let result = change(map);
        self.bytes = self.bytes + Self::table_bytes(map.capacity()) - before;
        result
    }

    fn shard(&self, key: &K) -> usize {
        (BuildIdentityHasher::default().hash_one(key) >> 32) as usize % self.shards.len()
    }

    pub(super) fn get(&self, key: &K) -> Option<&V> {
        self.shards[self.shard(key)].get(key)
    }

    pub(super) fn insert(&mut self, key: K, value: V) -> Option<V> {
        let shard = self.shard(&key);
        self.changing(shard, |map| map.insert(key, value))
    }

    /// Inserts `value` unless `key` is held already.
    pub(super) fn insert_if_absent(&mut self, key: K, value: V) {
        let shard = self.shard(&key);
        self.changing(shard, |map| {
            map.entry(key).or_insert(value);
        });
    }

    pub(super) fn remove(&mut self, key: &K) -> Option<V> {
        let shard = self.shard(key);
        self.changing(shard, |map| map.remove(key))
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.shards.iter().map(HashMap::len).sum()
    }

    /// Entries of the fullest shard: what the largest single doubling moves.
    #[cfg(test)]
    pub(super) fn largest_shard(&self) -> usize {
        self.shards.iter().map(HashMap::len).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaves_as_one_map_and_spreads_hash_keys_over_every_shard() {
        let mut map = ShardedMap::new(MAX_SHARDS);
        // Weyl-sequence keys, as the store's entry ids are.
        let keys: Vec<u64> = (1..=100_000u64)
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect();
        for (value, key) in keys.iter().enumerate() {
            assert_eq!(map.insert(*key, value), None);
        }
        assert_eq!(map.len(), keys.len());
        for (value, key) in keys.iter().enumerate() {
            assert_eq!(map.get(key), Some(&value));
        }
        assert_eq!(map.insert(keys[7], 0), Some(7));
        assert_eq!(map.remove(&keys[7]), Some(0));
        assert_eq!(map.get(&keys[7]), None);
        map.insert_if_absent(keys[7], 5);
        map.insert_if_absent(keys[7], 6);
        assert_eq!(map.get(&keys[7]), Some(&5));
        // The estimate is the shards' own: a slot and a control byte per bucket at most 7/8
        // full (a bucket is 17 bytes here).
        let per_entry = map.bytes() as f64 / map.len() as f64;
        assert!(
            (17.0..=17.0 * 16.0 / 7.0 + 1.0).contains(&per_entry),
            "{per_entry}"
        );
        // Even shards hold 100 000 / 256 ≈ 391 each; the fullest holds far less than all.
        let largest = map.largest_shard();
        assert!(
            largest < 2 * keys.len() / MAX_SHARDS,
            "fullest shard {largest}"
        );

        let mut cuts = ShardedMap::new(100);
        for i in 0..100_000u128 {
            let key = i.wrapping_mul(0x2545_F491_4F6C_DD1D_9E37_79B9_7F4A_7C15);
            cuts.insert(key, ());
        }
        assert!(cuts.largest_shard() < 2 * 100_000 / 100);
        assert_eq!(ShardedMap::<u64, ()>::new(0).shards.len(), 1);
        assert_eq!(ShardedMap::<u64, ()>::new(1 << 20).shards.len(), MAX_SHARDS);
    }
}
