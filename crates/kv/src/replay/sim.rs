//! Turns a request trace into the find queries and KV events a fleet of finite-cache engines emits.

use std::collections::HashMap;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::{Assignment, ReplayConfig};
use crate::events::{KvEvent, KvEventBatch, KvEventKind, KvRemoved, KvStored, KvStoredBlock, Tier};
use crate::hashing::BASE_SEED;

/// One request's work: the query the router runs, then the events its worker emits.
pub(super) struct Step {
    /// Local hashes of the request's blocks.
    pub(super) query: Vec<u64>,
    /// Index of the worker the request went to.
    pub(super) worker: usize,
    /// Evictions then stores of that worker (no events when everything was cached).
    pub(super) batch: Option<KvEventBatch>,
}

/// Totals of a simulated trace.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct SimTotals {
    pub(super) stored_blocks: u64,
    pub(super) removed_blocks: u64,
    pub(super) looked_up_blocks: u64,
}

/// Tokens hash standing in for a trace block id.
pub(super) fn tokens_hash(block_id: u64) -> u64 {
    xxh3_64_with_seed(&block_id.to_le_bytes(), BASE_SEED)
}

/// Worker id of simulated worker `index` (spread so lanes get their share).
pub(super) fn worker_id(index: usize) -> u64 {
    index as u64 + 1
}

/// Applies expansion and copies to the raw trace (Dynamo's `expand_trace_lengths` and
/// `duplicate_traces`): id `h` becomes `h·k .. h·k+k-1`; copy `c` adds `(max+1)·c`.
pub(super) fn expand(requests: Vec<Vec<u64>>, expansion: usize, copies: usize) -> Vec<Vec<u64>> {
    let k = expansion.max(1) as u64;
    let copies = copies.max(1);
    let max_id = requests.iter().flatten().copied().max().unwrap_or(0);
    let offset_base = (max_id + 1) * k;
    let mut out = Vec::with_capacity(requests.len() * copies);
    for request in &requests {
        for copy in 0..copies as u64 {
            out.push(
                request
                    .iter()
                    .flat_map(|&h| (0..k).map(move |j| h * k + j + offset_base * copy))
                    .collect(),
            );
        }
    }
    out
}

/// A fixed-capacity LRU set of block ids (doubly linked list in a slab).
struct Lru {
    slots: HashMap<u64, u32>,
    ids: Vec<u64>,
    prev: Vec<u32>,
    next: Vec<u32>,
    free: Vec<u32>,
    /// Most recently used.
    head: u32,
    /// Least recently used.
    tail: u32,
}

const NIL: u32 = u32::MAX;

impl Lru {
    fn new() -> Self {
        Self {
            slots: HashMap::new(),
            ids: Vec::new(),
            prev: Vec::new(),
            next: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
        }
    }

    fn len(&self) -> usize {
        self.slots.len()
    }

    fn contains(&self, id: u64) -> bool {
        self.slots.contains_key(&id)
    }

    fn unlink(&mut self, slot: u32) {
        let (prev, next) = (self.prev[slot as usize], self.next[slot as usize]);
        if prev == NIL {
            self.head = next;
        } else {
            self.next[prev as usize] = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.prev[next as usize] = prev;
        }
    }

    fn push_front(&mut self, slot: u32) {
        self.prev[slot as usize] = NIL;
        self.next[slot as usize] = self.head;
        if self.head != NIL {
            self.prev[self.head as usize] = slot;
        }
        self.head = slot;
        if self.tail == NIL {
            self.tail = slot;
        }
    }

    /// Makes `id` the most recently used, inserting it if absent.
    fn touch(&mut self, id: u64) {
        if let Some(&slot) = self.slots.get(&id) {
            self.unlink(slot);
            self.push_front(slot);
            return;
        }
        let slot = match self.free.pop() {
            Some(slot) => {
                self.ids[slot as usize] = id;
                slot
            }
            None => {
                self.ids.push(id);
                self.prev.push(NIL);
                self.next.push(NIL);
                (self.ids.len() - 1) as u32
            }
        };
        self.slots.insert(id, slot);
        self.push_front(slot);
    }

    fn pop_lru(&mut self) -> Option<u64> {
        let slot = self.tail;
        if slot == NIL {
            return None;
        }
        self.unlink(slot);
        self.free.push(slot);
        let id = self.ids[slot as usize];
        self.slots.remove(&id);
        Some(id)
    }
}

/// Runs every request through its worker's engine cache, in trace order.
pub(super) fn simulate(requests: &[Vec<u64>], config: &ReplayConfig) -> (Vec<Step>, SimTotals) {
    let workers = config.workers.max(1);
    let capacity = config.blocks_per_worker.max(1);
    let mut caches: Vec<Lru> = (0..workers).map(|_| Lru::new()).collect();
    let mut next_event_id = vec![0u64; workers];
    let mut totals = SimTotals::default();
    let mut steps = Vec::with_capacity(requests.len());
    for (i, ids) in requests.iter().enumerate() {
        let ids = &ids[..ids.len().min(capacity)];
        if ids.is_empty() {
            continue;
        }
        let worker = match config.assignment {
            Assignment::RoundRobin => i % workers,
            Assignment::Prefix => (tokens_hash(ids[0]) % workers as u64) as usize,
        };
        let cache = &mut caches[worker];
        let query: Vec<u64> = ids.iter().map(|&id| tokens_hash(id)).collect();
        totals.looked_up_blocks += query.len() as u64;

        let was_cached: Vec<bool> = ids.iter().map(|&id| cache.contains(id)).collect();
        let num_new = was_cached.iter().filter(|&&cached| !cached).count();
        // Keep this request's cached blocks from being evicted, then make room.
        for (&id, _) in ids.iter().zip(&was_cached).filter(|(_, cached)| **cached) {
            cache.touch(id);
        }
        let mut evicted = Vec::new();
        while cache.len() + num_new > capacity {
            match cache.pop_lru() {
                Some(id) => evicted.push(id),
                None => break,
            }
        }
        let mut events = Vec::new();
        let mut next_id = || {
            let id = next_event_id[worker];
            next_event_id[worker] += 1;
            id
        };
        if !evicted.is_empty() {
            totals.removed_blocks += evicted.len() as u64;
            events.push(KvEvent {
                event_id: next_id(),
                tier: Tier::Device,
                kind: KvEventKind::Removed(KvRemoved {
                    block_hashes: evicted,
                }),
            });
        }
        // Each run of uncached blocks is one stored event chained on the block before it.
        let mut j = 0;
        while j < ids.len() {
            if was_cached[j] {
                j += 1;
                continue;
            }
            let start = j;
            while j < ids.len() && !was_cached[j] {
                j += 1;
            }
            totals.stored_blocks += (j - start) as u64;
            events.push(KvEvent {
                event_id: next_id(),
                tier: Tier::Device,
                kind: KvEventKind::Stored(KvStored {
                    parent_hash: start.checked_sub(1).map(|p| ids[p]),
                    blocks: (start..j)
                        .map(|k| KvStoredBlock::new(ids[k], query[k]))
                        .collect(),
                    start_position: Some(start as u32),
                }),
            });
        }
        // Touch deepest first so a request's tail is evicted before its head (as vLLM frees).
        for &id in ids.iter().rev() {
            cache.touch(id);
        }
        let batch = (!events.is_empty()).then(|| KvEventBatch {
            worker_id: worker_id(worker),
            dp_rank: 0,
            events,
            published_at_ms: 0,
            worker_removed: false,
            worker_readmitted: false,
        });
        steps.push(Step {
            query,
            worker,
            batch,
        });
    }
    (steps, totals)
}
