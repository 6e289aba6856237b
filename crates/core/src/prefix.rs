//! A bounded store of per-prompt values (token ids, block hashes) found again by the prompt's
//! prefixes, so that work done for one prompt is reused by the next prompt sharing a prefix.
//!
//! A prompt is named by the keys of its prefixes at its cut points ([`PrefixCut`]): key `i`
//! hashes the whole text up to cut `i`, so two prompts with an equal key share everything
//! before that cut. A stored prompt keeps its values up to its last cut and, for every cut, how
//! many of them lie before it. [`PrefixStore::longest`] finds the longest stored cut of a new
//! prompt; the values before it are the new prompt's too. The store is bounded by bytes and
//! evicts the least recently used prompt; a prompt that extends (or repeats) a stored one
//! replaces it, so a growing conversation holds one entry, not one per turn.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::BuildIdentityHasher;

/// What one stored prompt costs besides its values: a key and a map slot per cut point.
const BYTES_PER_CUT: usize = 48;

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

/// The longest stored prefix of a prompt.
#[derive(Debug, Clone)]
pub struct PrefixHit<T> {
    /// Index of the cut (into the keys looked up).
    pub cut: usize,
    /// The stored prompt's values; the first `len` are the new prompt's.
    pub values: Arc<[T]>,
    /// Values before the cut.
    pub len: usize,
    /// Values before each of the looked-up cuts up to and including `cut`, when the store still
    /// knows them all (it forgets a key whose owner was evicted); spares the caller finding them.
    pub lens: Option<Vec<usize>>,
}

impl<T> PrefixHit<T> {
    /// The values the new prompt shares.
    pub fn shared(&self) -> &[T] {
        &self.values[..self.len]
    }
}

/// The store (see the module docs); share one behind an `Arc`.
pub struct PrefixStore<T> {
    max_bytes: usize,
    state: Mutex<State<T>>,
    hits: AtomicU64,
    misses: AtomicU64,
    reused: AtomicU64,
}

struct Entry<T> {
    values: Arc<[T]>,
    keys: Vec<u128>,
    last_used: u64,
    bytes: usize,
}

struct State<T> {
    /// Prefix key → (entry, values before that cut). Keys are hash values themselves.
    cuts: HashMap<u128, (u64, usize), BuildIdentityHasher>,
    entries: HashMap<u64, Entry<T>>,
    /// Entries by last use, oldest first.
    by_use: BTreeMap<u64, u64>,
    bytes: usize,
    next_id: u64,
    clock: u64,
}

impl<T: Copy> PrefixStore<T> {
    /// A store holding at most `max_bytes` (0 = nothing is stored).
    pub fn new(max_bytes: usize) -> Self {
        Self {
            max_bytes,
            state: Mutex::new(State {
                cuts: HashMap::default(),
                entries: HashMap::new(),
                by_use: BTreeMap::new(),
                bytes: 0,
                next_id: 0,
                clock: 0,
            }),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            reused: AtomicU64::new(0),
        }
    }

    /// Whether anything can be stored.
    pub fn is_enabled(&self) -> bool {
        self.max_bytes > 0
    }

    /// The longest stored cut among `keys` (a prompt's prefix keys, shortest first), counted as a
    /// hit or a miss; the found prompt becomes the most recently used.
    pub fn longest(&self, keys: &[u128]) -> Option<PrefixHit<T>> {
        let found = self.find_longest(keys);
        match &found {
            Some(hit) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                self.reused.fetch_add(hit.len as u64, Ordering::Relaxed);
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
            }
        }
        found
    }

    fn find_longest(&self, keys: &[u128]) -> Option<PrefixHit<T>> {
        let mut state = self.lock();
        let (cut, entry_id, len) = keys
            .iter()
            .enumerate()
            .rev()
            .find_map(|(i, key)| state.cuts.get(key).map(|(id, n)| (i, *id, *n)))?;
        state.clock += 1;
        let now = state.clock;
        let entry = state.entries.get_mut(&entry_id)?;
        let previous = std::mem::replace(&mut entry.last_used, now);
        let values = entry.values.clone();
        state.by_use.remove(&previous);
        state.by_use.insert(now, entry_id);
        let lens = keys[..=cut]
            .iter()
            .map(|key| state.cuts.get(key).map(|(_, n)| *n))
            .collect();
        Some(PrefixHit {
            cut,
            values,
            len,
            lens,
        })
    }

    /// Stores a prompt: `keys[i]` is the key of cut `i`, `lens[i]` how many of `values` lie
    /// before it (non-decreasing). Values past the last cut are not kept. A prompt larger than
    /// the whole bound is not stored.
    pub fn insert(&self, keys: Vec<u128>, lens: &[usize], values: &[T]) {
        debug_assert_eq!(keys.len(), lens.len());
        let held = lens.last().copied().unwrap_or(0).min(values.len());
        if keys.is_empty() || keys.len() != lens.len() {
            return;
        }
        let bytes = held * std::mem::size_of::<T>() + keys.len() * BYTES_PER_CUT;
        if bytes > self.max_bytes {
            return;
        }
        let mut state = self.lock();
        // A prompt that extends a stored one (or repeats it) holds all of its cuts: the older
        // copy goes. Keys hash whole prefixes, so the older one's cuts are all here when its
        // last one is at the same position here.
        let longest_known = keys.iter().rev().find_map(|key| state.cuts.get(key));
        if let Some(&(older, _)) = longest_known
            && state.entries.get(&older).is_some_and(|entry| {
                entry.keys.last() == keys.get(entry.keys.len().wrapping_sub(1))
            })
        {
            state.remove(older);
        }
        while state.bytes + bytes > self.max_bytes {
            let Some((_, oldest)) = state.by_use.pop_first() else {
                break;
            };
            state.remove(oldest);
        }
        state.clock += 1;
        state.next_id += 1;
        let (id, now) = (state.next_id, state.clock);
        for (key, len) in keys.iter().zip(lens) {
            state.cuts.insert(*key, (id, (*len).min(held)));
        }
        state.by_use.insert(now, id);
        state.bytes += bytes;
        state.entries.insert(
            id,
            Entry {
                values: values[..held].into(),
                keys,
                last_used: now,
                bytes,
            },
        );
    }

    /// Counters and size now.
    pub fn stats(&self) -> PrefixStats {
        let (bytes, entries) = {
            let state = self.lock();
            (state.bytes as u64, state.entries.len() as u64)
        };
        PrefixStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            reused: self.reused.load(Ordering::Relaxed),
            bytes,
            entries,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T> State<T> {
    fn remove(&mut self, id: u64) {
        let Some(entry) = self.entries.remove(&id) else {
            return;
        };
        self.by_use.remove(&entry.last_used);
        self.bytes -= entry.bytes;
        for key in &entry.keys {
            if self.cuts.get(key).is_some_and(|(owner, _)| *owner == id) {
                self.cuts.remove(key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(n: u128) -> Vec<u128> {
        (1..=n).collect()
    }

    #[test]
    fn longest_stored_cut_gives_the_values_before_it() {
        let store = PrefixStore::<u32>::new(1 << 20);
        store.insert(keys(3), &[2, 4, 6], &[10, 11, 12, 13, 14, 15, 16]);
        let hit = store.longest(&[1, 2, 99]).unwrap();
        assert_eq!((hit.cut, hit.shared()), (1, &[10, 11, 12, 13][..]));
        assert_eq!(hit.lens, Some(vec![2, 4]));
        assert!(store.longest(&[98, 99]).is_none());
        let stats = store.stats();
        assert_eq!((stats.hits, stats.misses, stats.reused), (1, 1, 4));
        assert_eq!(stats.entries, 1);
    }

    #[test]
    fn an_extending_prompt_replaces_the_one_it_extends() {
        let store = PrefixStore::<u32>::new(1 << 20);
        store.insert(keys(2), &[1, 2], &[1, 2]);
        store.insert(keys(3), &[1, 2, 3], &[1, 2, 3]);
        assert_eq!(store.stats().entries, 1);
        assert_eq!(store.longest(&keys(3)).unwrap().len, 3);
        // A branch off the shared prefix is a second entry.
        store.insert(vec![1, 2, 77], &[1, 2, 3], &[1, 2, 9]);
        assert_eq!(store.stats().entries, 2);
    }

    #[test]
    fn stays_within_its_bound_evicting_the_least_recently_used() {
        let per_entry = 100 * 4 + BYTES_PER_CUT;
        let store = PrefixStore::<u32>::new(3 * per_entry);
        for prompt in 0..10u128 {
            store.insert(vec![prompt * 1000], &[100], &[7; 100]);
            if prompt >= 1 {
                // Keep prompt 0 recently used.
                assert!(store.longest(&[0]).is_some());
            }
            assert!(store.stats().bytes as usize <= 3 * per_entry);
        }
        assert!(store.longest(&[0]).is_some());
        assert!(store.longest(&[1000]).is_none());
        assert_eq!(store.stats().entries, 3);
    }

    #[test]
    fn a_prompt_over_the_bound_or_a_zero_bound_stores_nothing() {
        let store = PrefixStore::<u64>::new(64);
        store.insert(vec![1], &[100], &[0; 100]);
        assert_eq!(store.stats().entries, 0);
        let off = PrefixStore::<u64>::new(0);
        assert!(!off.is_enabled());
        off.insert(vec![1], &[1], &[0]);
        assert!(off.longest(&[1]).is_none());
    }
}
