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

/// Bytes of bound per shard of the key map: the default 256 MiB store splits it 256 ways (the
/// most), one of 1 MiB or less keeps one map. More shards make each doubling, and the eviction
/// that pays for it in a full store, smaller; a turn touches only its new cuts, so spreading the
/// cuts over more maps no longer costs it (docs/benchmarks.md, "The shard count is a trade").
const BYTES_PER_SHARD: usize = 1 << 20;

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
    /// [`State::cuts_removed`] when all of this entry's cuts were last known to be held.
    cuts_intact_at: u64,
}

struct State<E> {
    /// Prefix key → (entry, index of the key in it). Keys are hash values themselves.
    cuts: ShardedMap<u128, (u64, usize)>,
    entries: Slab<Slot<E>>,
    /// Entries by last use, oldest first.
    by_use: BTreeMap<u64, u64>,
    bytes: usize,
    clock: u64,
    /// Cut keys removed from `cuts` so far: while it has not moved since an entry was stored,
    /// every cut of that entry is still held.
    cuts_removed: u64,
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
                cuts_removed: 0,
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
        let cuts_removed = state.cuts_removed;
        let slot = Slot {
            entry: Arc::clone(&entry),
            last_used: now,
            bytes,
            cuts_intact_at: cuts_removed,
        };
        // The older prompt's cuts need checking only if some cut was removed since they were
        // all known to be held (an evicted branch may have taken one): a conversation's turn
        // then touches only its new cuts, not every cut of its history.
        let (id, first_new, check_from) = match replaced {
            Some((at, older, _)) => {
                let mut check_from = 0;
                if let Some(held) = state.entries.get_mut(older) {
                    if held.cuts_intact_at == cuts_removed {
                        check_from = at + 1;
                    }
                    *held = slot;
                }
                (older, at + 1, check_from)
            }
            None => (state.entries.insert(slot), 0, 0),
        };
        for (index, key) in keys.iter().enumerate().skip(check_from) {
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
            let cuts_removed = state.cuts_removed;
            if let Some(slot) = state.entries.get_mut(id) {
                slot.cuts_intact_at = cuts_removed;
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
                self.cuts_removed += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests;
