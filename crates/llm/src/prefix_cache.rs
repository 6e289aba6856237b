//! A bounded, process-wide cache of prompt tokenizations keyed by the prompt's prefix at its cut
//! points ([`Boundaries`]), so that a conversation's next turn tokenizes only what is new: the
//! ids up to the longest cut point an earlier prompt shared are reused, the rest is encoded.
//! The result is exactly what encoding the whole prompt gives (docs/tokenization.md).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use xxhash_rust::xxh3::Xxh3;

use crate::error::LlmError;
use crate::tokenizer::Tokenizer;
use crate::tokenizer::boundaries::Boundaries;

/// What one cached prompt costs besides its ids: a key and map slot per cut point.
const BYTES_PER_CUT: usize = 48;

/// Counters of a [`PrefixCache`], for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Prompts that reused a cached prefix.
    pub hits: u64,
    /// Prompts with cut points that found none.
    pub misses: u64,
    /// Tokens taken from the cache instead of encoded.
    pub reused_tokens: u64,
    /// Bytes held now.
    pub bytes: u64,
    /// Prompts held now.
    pub entries: u64,
}

/// The cache; share one per process behind an `Arc`.
pub struct PrefixCache {
    max_bytes: usize,
    state: Mutex<State>,
    hits: AtomicU64,
    misses: AtomicU64,
    reused_tokens: AtomicU64,
}

/// One cached prompt: its ids up to its last cut point, and the keys that point at it.
struct Entry {
    ids: Arc<[u32]>,
    keys: Vec<u128>,
    last_used: u64,
    bytes: usize,
}

#[derive(Default)]
struct State {
    /// Prefix key → (entry, number of its ids before that cut).
    cuts: HashMap<u128, (u64, usize)>,
    entries: HashMap<u64, Entry>,
    /// Entries by last use, oldest first.
    by_use: BTreeMap<u64, u64>,
    bytes: usize,
    next_id: u64,
    clock: u64,
}

impl PrefixCache {
    /// A cache holding at most `max_bytes` (0 = nothing is cached).
    pub fn new(max_bytes: usize) -> Self {
        Self {
            max_bytes,
            state: Mutex::new(State::default()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            reused_tokens: AtomicU64::new(0),
        }
    }

    /// The ids of `text` without the post-processor's special tokens (a rendered chat prompt),
    /// exactly as `tokenizer.encode(text, false)` gives them.
    pub fn encode(&self, tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>, LlmError> {
        let Some(boundaries) = tokenizer.boundaries().filter(|_| self.max_bytes > 0) else {
            return tokenizer.encode(text, false);
        };
        let cuts = boundaries.find(text);
        if cuts.is_empty() {
            return tokenizer.encode(text, false);
        }
        let keys = prefix_keys(boundaries.namespace(), text, &cuts);
        let cached = self.longest_cached(&keys);
        let ids = match &cached {
            Some((cut, ids, reused)) => {
                let suffix = tokenizer.encode(&text[cuts[*cut]..], false)?;
                let mut whole = Vec::with_capacity(reused + suffix.len());
                whole.extend_from_slice(&ids[..*reused]);
                whole.extend_from_slice(&suffix);
                self.hits.fetch_add(1, Ordering::Relaxed);
                self.reused_tokens
                    .fetch_add(*reused as u64, Ordering::Relaxed);
                whole
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                tokenizer.encode(text, false)?
            }
        };
        self.insert(boundaries, keys, &ids);
        Ok(ids)
    }

    /// Counters and size now.
    pub fn stats(&self) -> PrefixCacheStats {
        let (bytes, entries) = {
            let state = self.lock();
            (state.bytes as u64, state.entries.len() as u64)
        };
        PrefixCacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            reused_tokens: self.reused_tokens.load(Ordering::Relaxed),
            bytes,
            entries,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The longest cached cut of `keys`: (its index, the entry's ids, ids before the cut).
    fn longest_cached(&self, keys: &[u128]) -> Option<(usize, Arc<[u32]>, usize)> {
        let mut state = self.lock();
        let (cut, entry_id, reused) = keys
            .iter()
            .enumerate()
            .rev()
            .find_map(|(i, key)| state.cuts.get(key).map(|(id, n)| (i, *id, *n)))?;
        state.clock += 1;
        let now = state.clock;
        let entry = state.entries.get_mut(&entry_id)?;
        let previous = std::mem::replace(&mut entry.last_used, now);
        let ids = entry.ids.clone();
        state.by_use.remove(&previous);
        state.by_use.insert(now, entry_id);
        Some((cut, ids, reused))
    }

    /// Caches `ids` under the prefix keys of its cut points. Skipped when the ids do not hold
    /// one cut token per cut point (the text matched a cut token the tokenizer did not take).
    fn insert(&self, boundaries: &Boundaries, keys: Vec<u128>, ids: &[u32]) {
        let mut offsets = Vec::with_capacity(keys.len());
        for (i, id) in ids.iter().enumerate() {
            if boundaries.is_cut_id(*id) {
                offsets.push(i + 1);
            }
        }
        if offsets.len() != keys.len() {
            return;
        }
        let held = offsets.last().copied().unwrap_or(0);
        let bytes = held * 4 + keys.len() * BYTES_PER_CUT;
        if bytes > self.max_bytes {
            return;
        }
        let mut state = self.lock();
        // A prompt that extends a cached one (or repeats it) holds all of its cuts: the older
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
        for (key, offset) in keys.iter().zip(&offsets) {
            state.cuts.insert(*key, (id, *offset));
        }
        state.by_use.insert(now, id);
        state.bytes += bytes;
        state.entries.insert(
            id,
            Entry {
                ids: ids[..held].into(),
                keys,
                last_used: now,
                bytes,
            },
        );
    }
}

impl State {
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

/// The 128-bit hash of `text[..cut]` for every cut, in one pass over the text.
fn prefix_keys(namespace: u64, text: &str, cuts: &[usize]) -> Vec<u128> {
    let mut hasher = Xxh3::with_seed(namespace);
    let mut start = 0;
    cuts.iter()
        .map(|&cut| {
            hasher.update(&text.as_bytes()[start..cut]);
            start = cut;
            hasher.digest128()
        })
        .collect()
}
