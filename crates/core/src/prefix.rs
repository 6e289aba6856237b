//! A bounded store of per-prompt values (token ids, block hashes) found again by the prompt's
//! prefixes, so that work done for one prompt is reused by the next prompt sharing a prefix.
//!
//! A prompt is named by the keys of its prefixes at its cut points ([`PrefixCut`]): key `i`
//! names the whole text up to cut `i`, so two prompts with an equal key share everything
//! before that cut. A stored prompt is a [`PrefixEntry`] of the caller's making, holding its
//! values and its keys. [`PrefixStore::find`] and [`PrefixStore::longest`] find a stored prompt
//! by a key; the values before that cut are the new prompt's too. The store is bounded by bytes
//! and evicts the least recently used prompt; a prompt that extends (or repeats) a stored one
//! replaces it, so a growing conversation holds one entry, not one per turn.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use sharded_map::ShardedMap;
use slab::Slab;

mod sharded_map;
mod slab;

/// What the store spends per stored prompt besides its cuts and the prompt itself: the count
/// words of the shared allocation holding it, its slab slot and its place in the use order.
/// The prompt's own fields (`size_of::<E>()`) come on top.
pub const BYTES_PER_ENTRY: usize = 80;

/// Bytes of bound per shard of the key map: a store of 16 MiB or more splits it 256 ways, one
/// of 64 KiB or less keeps one map.
const BYTES_PER_SHARD: usize = 64 << 10;

/// One cut point of a prompt: the key of the text before it and the prompt's tokens before it.
/// Equal keys promise equal token prefixes (the key hashes the text, and the cuts lie where the
/// tokenizer cannot merge across), which is what lets block hashes be reused by key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PrefixCut {
    /// 128-bit hash of the prompt text before the cut, seeded by the tokenizer's identity.
    pub key: u128,
    /// Prompt tokens before the cut.
    pub tokens: u32,
}

/// Counters and size of a [`PrefixStore`], for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixStats {
    /// Lookups that found a stored prefix.
    pub hits: u64,
    /// Lookups that found none.
    pub misses: u64,
    /// Values taken from the store instead of computed.
    pub reused: u64,
    /// Bytes held now.
    pub bytes: u64,
    /// Prompts held now.
    pub entries: u64,
}

/// Stats of several stores together (one per model, say).
impl std::ops::Add for PrefixStats {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        Self {
            hits: self.hits + other.hits,
            misses: self.misses + other.misses,
            reused: self.reused + other.reused,
            bytes: self.bytes + other.bytes,
            entries: self.entries + other.entries,
        }
    }
}

/// One stored prompt, as its user shapes it: the store needs only its keys and its size.
pub trait PrefixEntry {
    /// The keys of the prompt's cuts, shortest prefix first.
    fn keys(&self) -> &[u128];
    /// Heap bytes it holds (the capacities of its buffers), counted against the store's bound
    /// with what the store adds ([`PrefixStore::stored_bytes`] and its key map).
    fn value_bytes(&self) -> usize;
}

/// A stored prompt found by one of its keys.
#[derive(Debug)]
pub struct PrefixHit<E> {
    /// Index of the key among those looked up ([`PrefixStore::longest`]; 0 for
    /// [`PrefixStore::find`]).
    pub cut: usize,
    /// The stored prompt.
    pub entry: Arc<E>,
    /// Index of the key among the stored prompt's keys.
    pub index: usize,
}

/// The store (see the module docs); share one behind an `Arc`.
pub struct PrefixStore<E> {
    max_bytes: usize,
    state: Mutex<State<E>>,
    hits: AtomicU64,
    misses: AtomicU64,
    reused: AtomicU64,
}

struct Slot<E> {
    entry: Arc<E>,
    last_used: u64,
    bytes: usize,
}

struct State<E> {
    /// Prefix key → (entry, index of the key in it). Keys are hash values themselves.
    cuts: ShardedMap<u128, (u64, usize)>,
    entries: Slab<Slot<E>>,
    /// Entries by last use, oldest first.
    by_use: BTreeMap<u64, u64>,
    bytes: usize,
    clock: u64,
}

impl<E: PrefixEntry> PrefixStore<E> {
    /// A store holding at most `max_bytes` (0 = nothing is stored).
    pub fn new(max_bytes: usize) -> Self {
        Self {
            max_bytes,
            state: Mutex::new(State {
                cuts: ShardedMap::new(max_bytes / BYTES_PER_SHARD),
                entries: Slab::new(),
                by_use: BTreeMap::new(),
                bytes: 0,
                clock: 0,
            }),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            reused: AtomicU64::new(0),
        }
    }

    /// What storing `entry` counts against the bound besides its cuts' slots in the key map
    /// (which the map counts as it grows): its heap bytes, its fields and the store's own cost
    /// of holding it.
    pub fn stored_bytes(entry: &E) -> usize {
        entry.value_bytes() + std::mem::size_of::<E>() + BYTES_PER_ENTRY
    }

    /// Whether anything can be stored.
    pub fn is_enabled(&self) -> bool {
        self.max_bytes > 0
    }

    /// The stored prompt holding `key`, which becomes the most recently used. Not counted:
    /// the caller says with [`Self::record`] what the lookup of a whole prompt came to.
    pub fn find(&self, key: u128) -> Option<PrefixHit<E>> {
        let mut state = self.lock();
        let &(id, index) = state.cuts.get(&key)?;
        let entry = state.touch(id)?;
        Some(PrefixHit {
            cut: 0,
            entry,
            index,
        })
    }

    /// The longest stored cut among `keys` (a prompt's prefix keys, shortest first); the found
    /// prompt becomes the most recently used. Not counted (see [`Self::record`]).
    pub fn longest(&self, keys: &[u128]) -> Option<PrefixHit<E>> {
        let mut state = self.lock();
        let (cut, id, index) = keys
            .iter()
            .enumerate()
            .rev()
            .find_map(|(i, key)| state.cuts.get(key).map(|&(id, index)| (i, id, index)))?;
        let entry = state.touch(id)?;
        Some(PrefixHit { cut, entry, index })
    }

    /// Counts one prompt's lookup: a hit reusing `reused` values, or a miss.
    pub fn record(&self, reused: Option<usize>) {
        match reused {
            Some(reused) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                self.reused.fetch_add(reused as u64, Ordering::Relaxed);
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Stores a prompt. A prompt without keys, or larger than the whole bound, is not stored.
    pub fn insert(&self, entry: E) {
        let entry = Arc::new(entry);
        let keys = entry.keys();
        let bytes = Self::stored_bytes(&entry);
        if keys.is_empty() || bytes > self.max_bytes {
            return;
        }
        let mut state = self.lock();
        // A prompt that extends (or repeats) a stored one holds all of its cuts: it takes the
        // older one's place. Keys name whole prefixes, so the older one's cuts are all here
        // when its last one is at the same position here; they keep pointing at the slot, and
        // only the cuts past them are added (the shared ones are only looked up), so storing a
        // conversation's turn costs little more than what it added.
        let extended = keys
            .iter()
            .enumerate()
            .rev()
            .find_map(|(i, key)| state.cuts.get(key).map(|&(id, index)| (i, id, index)))
            .filter(|&(at, older, index)| {
                at == index
                    && state
                        .entries
                        .get(older)
                        .is_some_and(|slot| slot.entry.keys().len() == index + 1)
            });
        // Out of the use order while room is made, so that it is not the one evicted.
        let replaced = extended.and_then(|(at, older, _)| Some((at, older, state.unlist(older)?)));
        while state.held_bytes() + bytes > self.max_bytes {
            let Some((_, oldest)) = state.by_use.pop_first() else {
                break;
            };
            state.remove(oldest);
        }
        state.clock += 1;
        let now = state.clock;
        let slot = Slot {
            entry: Arc::clone(&entry),
            last_used: now,
            bytes,
        };
        let (id, first_new) = match replaced {
            Some((at, older, _)) => {
                if let Some(held) = state.entries.get_mut(older) {
                    *held = slot;
                }
                (older, at + 1)
            }
            None => (state.entries.insert(slot), 0),
        };
        for (index, key) in keys.iter().enumerate() {
            if index < first_new {
                // Held already, by this slot or another prompt sharing the prefix; put back
                // only if an evicted prompt took it along.
                state.cuts.insert_if_absent(*key, (id, index));
            } else {
                state.cuts.insert(*key, (id, index));
            }
        }
        state.by_use.insert(now, id);
        state.bytes += bytes;
        // The new cuts may have grown the key map past the bound. A prompt evicted here may
        // have taken cuts this one shares with it; this one holds them too.
        let mut evicted = false;
        while state.held_bytes() > self.max_bytes {
            match state.by_use.first_key_value() {
                Some((_, &oldest)) if oldest != id => {
                    state.by_use.pop_first();
                    state.remove(oldest);
                    evicted = true;
                }
                _ => break,
            }
        }
        if evicted {
            for (index, key) in keys.iter().enumerate() {
                state.cuts.insert_if_absent(*key, (id, index));
            }
        }
        drop(state);
        drop(replaced);
    }

    /// Counters and size now.
    pub fn stats(&self) -> PrefixStats {
        let (bytes, entries) = {
            let state = self.lock();
            (state.held_bytes() as u64, state.entries.len() as u64)
        };
        PrefixStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            reused: self.reused.load(Ordering::Relaxed),
            bytes,
            entries,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<E>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<E: PrefixEntry> State<E> {
    /// Bytes held: the entries' and the key map's.
    fn held_bytes(&self) -> usize {
        self.bytes + self.cuts.bytes()
    }

    /// The entry `id`, now the most recently used.
    fn touch(&mut self, id: u64) -> Option<Arc<E>> {
        self.clock += 1;
        let now = self.clock;
        let slot = self.entries.get_mut(id)?;
        let previous = std::mem::replace(&mut slot.last_used, now);
        let entry = slot.entry.clone();
        self.by_use.remove(&previous);
        self.by_use.insert(now, id);
        Some(entry)
    }

    /// Takes entry `id` out of use and size accounting, leaving it and its cuts in place (the
    /// caller puts a prompt holding them all in its slot). Returns the entry, to be dropped
    /// once the lock is let go.
    fn unlist(&mut self, id: u64) -> Option<Arc<E>> {
        let slot = self.entries.get_mut(id)?;
        self.by_use.remove(&slot.last_used);
        self.bytes -= std::mem::take(&mut slot.bytes);
        Some(slot.entry.clone())
    }

    fn remove(&mut self, id: u64) {
        let Some(slot) = self.entries.remove(id) else {
            return;
        };
        self.by_use.remove(&slot.last_used);
        self.bytes -= slot.bytes;
        for key in slot.entry.keys() {
            if self.cuts.get(key).is_some_and(|(owner, _)| *owner == id) {
                self.cuts.remove(key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stored prompt of the tests: its keys and, per key, the values before that cut.
    struct Prompt {
        keys: Vec<u128>,
        lens: Vec<usize>,
        values: Vec<u32>,
    }

    impl PrefixEntry for Prompt {
        fn keys(&self) -> &[u128] {
            &self.keys
        }

        fn value_bytes(&self) -> usize {
            self.values.len() * 4
        }
    }

    fn prompt(keys: Vec<u128>, lens: &[usize], values: &[u32]) -> Prompt {
        Prompt {
            keys,
            lens: lens.to_vec(),
            values: values.to_vec(),
        }
    }

    fn keys(n: u128) -> Vec<u128> {
        (1..=n).collect()
    }

    /// What a test prompt costs beside its values and cuts.
    const PER_ENTRY: usize = BYTES_PER_ENTRY + std::mem::size_of::<Prompt>();

    /// What a one-shard key map with room for `cuts` costs.
    fn key_map(cuts: usize) -> usize {
        ShardedMap::<u128, (u64, usize)>::table_bytes(cuts)
    }

    #[test]
    fn longest_stored_cut_gives_the_values_before_it() {
        let store = PrefixStore::new(1 << 20);
        store.insert(prompt(keys(3), &[2, 4, 6], &[10, 11, 12, 13, 14, 15]));
        let hit = store.longest(&[1, 2, 99]).unwrap();
        assert_eq!((hit.cut, hit.index), (1, 1));
        assert_eq!(
            &hit.entry.values[..hit.entry.lens[hit.index]],
            &[10, 11, 12, 13]
        );
        assert!(store.longest(&[98, 99]).is_none());
        let found = store.find(3).unwrap();
        assert_eq!((found.cut, found.index), (0, 2));
        assert!(store.find(99).is_none());
        store.record(Some(4));
        store.record(None);
        let stats = store.stats();
        assert_eq!((stats.hits, stats.misses, stats.reused), (1, 1, 4));
        assert_eq!(stats.entries, 1);
    }

    #[test]
    fn an_extending_prompt_replaces_the_one_it_extends() {
        let store = PrefixStore::new(1 << 20);
        store.insert(prompt(keys(2), &[1, 2], &[1, 2]));
        store.insert(prompt(keys(3), &[1, 2, 3], &[1, 2, 3]));
        assert_eq!(store.stats().entries, 1);
        assert_eq!(store.longest(&keys(3)).unwrap().index, 2);
        // The older cuts now find the extended prompt, and only its bytes are counted.
        let found = store.find(1).unwrap();
        assert_eq!((found.index, found.entry.values.len()), (0, 3));
        assert_eq!(
            store.stats().bytes as usize,
            3 * 4 + PER_ENTRY + store.lock().cuts.bytes(),
            "the replaced prompt's bytes are released"
        );
        // Repeating it changes nothing.
        store.insert(prompt(keys(3), &[1, 2, 3], &[1, 2, 3]));
        assert_eq!(store.stats().entries, 1);
        // A branch off the shared prefix is a second entry.
        store.insert(prompt(vec![1, 2, 77], &[1, 2, 3], &[1, 2, 9]));
        assert_eq!(store.stats().entries, 2);
        // So is a prompt sharing only a shorter prefix of a stored one.
        store.insert(prompt(vec![1, 55], &[1, 2], &[1, 5]));
        assert_eq!(store.stats().entries, 3);
    }

    #[test]
    fn a_conversation_keeps_its_cuts_when_a_branch_sharing_them_is_evicted() {
        // Room for six cuts in two prompts.
        let bound = 6 * 4 + 2 * PER_ENTRY + key_map(7);
        let store = PrefixStore::new(bound);
        store.insert(prompt(keys(2), &[1, 2], &[1, 2]));
        // A branch sharing cut 1 takes that key's slot in the map.
        store.insert(prompt(vec![1, 50], &[1, 2], &[1, 5]));
        // The conversation grows past its own cuts, then is used, so the branch is older.
        store.insert(prompt(keys(4), &[1, 2, 3, 4], &[1, 2, 3, 4]));
        assert_eq!(store.longest(&keys(4)).unwrap().index, 3);
        // A third prompt needs room: the branch, least recently used, goes with its keys.
        store.insert(prompt(vec![900], &[1], &[9]));
        assert!(store.find(50).is_none());
        // The shared cut may have gone with the branch; the conversation's next turn holds it.
        store.insert(prompt(keys(5), &[1, 2, 3, 4, 5], &[1, 2, 3, 4, 5]));
        assert_eq!(store.find(1).unwrap().entry.values.len(), 5);
        for key in 2..=5u128 {
            let found = store.find(key).expect("the conversation's own cuts stay");
            assert_eq!(found.index as u128, key - 1);
            assert_eq!(found.entry.values.len(), 5);
        }
        assert!(store.stats().bytes as usize <= bound);
    }

    #[test]
    fn a_prompt_keeps_the_cuts_it_shares_when_its_own_growth_evicts_their_owner() {
        // A conversation holds cuts 1 and 2; a branch takes cut 1 in the key map. The next turn
        // extends the conversation with three cuts, which grow the key map (room for 3 → 7)
        // past the bound, so the branch, least recently used, is evicted after the turn is
        // stored, and takes cut 1 with it.
        let bound = 2 * 4 + 5 * 4 + 2 * PER_ENTRY + key_map(3) + 50;
        assert!(bound < 2 * 4 + 5 * 4 + 2 * PER_ENTRY + key_map(7));
        let store = PrefixStore::new(bound);
        store.insert(prompt(keys(2), &[1, 2], &[1, 2]));
        store.insert(prompt(vec![1, 50], &[1, 2], &[1, 5]));
        store.insert(prompt(keys(5), &[1, 2, 3, 4, 5], &[1, 2, 3, 4, 5]));
        assert_eq!(store.stats().entries, 1);
        assert!(store.find(50).is_none());
        let shared = store.find(1).expect("the conversation holds cut 1 too");
        assert_eq!((shared.index, shared.entry.values.len()), (0, 5));
        assert!(store.stats().bytes as usize <= bound);
    }

    #[test]
    fn stays_within_its_bound_evicting_the_least_recently_used() {
        let per_entry = 100 * 4 + PER_ENTRY;
        let bound = 3 * per_entry + key_map(7);
        let store = PrefixStore::new(bound);
        for key in 0..10u128 {
            store.insert(prompt(vec![key * 1000], &[100], &[7; 100]));
            if key >= 1 {
                // Keep prompt 0 recently used.
                assert!(store.longest(&[0]).is_some());
            }
            assert!(store.stats().bytes as usize <= bound);
        }
        assert!(store.find(0).is_some());
        assert!(store.find(1000).is_none());
        assert_eq!(store.stats().entries, 3);
    }

    #[test]
    fn filling_up_never_grows_one_map_by_more_than_a_small_part_of_the_store() {
        // Growing a map moves all it holds under the store's lock; the store splits its maps so
        // that no single map holds more than a few times its even share.
        let store = PrefixStore::new(1 << 30);
        let mut key = 0u128;
        for _ in 0..50_000 {
            let keys = (0..3)
                .map(|_| {
                    key = key.wrapping_add(0x2545_F491_4F6C_DD1D_9E37_79B9_7F4A_7C15);
                    key
                })
                .collect();
            store.insert(prompt(keys, &[1, 2, 3], &[1, 2, 3]));
        }
        let state = store.lock();
        assert_eq!((state.cuts.len(), state.entries.len()), (150_000, 50_000));
        let even = |n: usize| n / sharded_map::MAX_SHARDS;
        assert!(state.cuts.largest_shard() < 2 * even(150_000));
        // Entries sit in a slab, which grows a chunk at a time.
    }

    #[test]
    fn a_prompt_over_the_bound_or_a_zero_bound_stores_nothing() {
        let store = PrefixStore::new(64);
        store.insert(prompt(vec![1], &[100], &[0; 100]));
        assert_eq!(store.stats().entries, 0);
        let off = PrefixStore::new(0);
        assert!(!off.is_enabled());
        off.insert(prompt(vec![1], &[1], &[0]));
        assert!(off.find(1).is_none());
    }
}
