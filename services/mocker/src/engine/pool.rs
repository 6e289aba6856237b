//! The paged KV block pool of one rank (docs/mocker.md, "Block pool") and the KV events it owes
//! the indexers ("What it publishes").
//!
//! Full blocks are identified by sequence hash and exist at most once: a use of a cached hash
//! takes a reference instead of a copy, so "the last copy of a hash leaves" is simply "its block is
//! evicted". Partial blocks (and every block when prefix caching is off) are private and counted,
//! not named.
//!
//! Events are reconciled at the end of each pass instead of logged as they happen: `Removed` lists
//! evicted blocks the indexers had been told about, `Stored` lists blocks registered since that
//! are still present, in registration order (parents before children). A block registered and
//! evicted within one pass, for instance by a sequence preempted in the same pass, is therefore
//! never announced, and the indexers' view always equals the pool's content.

use std::collections::VecDeque;

use kvmesh_kv::{LocalBlockHash, SequenceHash};

use super::types::{KvCacheEvent, StoredBlock};

/// A sequence's hold on one block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// A block only this sequence uses (partial, or any block without prefix caching).
    Private,
    /// A full block in the hash table, shared by reference count.
    Shared(SequenceHash),
}

/// Where a hash is in the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// Referenced by at least one sequence.
    Active,
    /// Cached with no reference, evictable.
    Inactive,
    /// Not in the pool.
    Absent,
}

#[derive(Debug, Clone)]
struct Entry {
    num_refs: u32,
    local_hash: LocalBlockHash,
    parent: Option<SequenceHash>,
    /// Registration order; parents always register before their children.
    registered_at: u64,
    /// Whether the indexers know this block (a `Stored` for it went out after the last `Cleared`).
    is_announced: bool,
    /// LRU position while inactive.
    inactive_tick: Option<u64>,
}

/// Stale slots `inactive` may hold besides twice the live ones before they are swept.
const STALE_SLACK: usize = 1024;

/// The block pool: hash table of full blocks, inactive LRU, private block count, pending events.
#[derive(Debug)]
pub(crate) struct BlockPool {
    num_blocks: usize,
    entries: kvmesh_kv::BlockHashMap<Entry>,
    /// Inactive blocks in release order (ticks ascending); the first is evicted first.
    /// Sequences release their blocks tail first, so a chain's leaves always carry older ticks
    /// than their parents. A block reactivated or evicted leaves its slot behind, stale (its
    /// entry no longer carries that tick): skipped at the front, swept out when stale slots
    /// outnumber live ones. A tree map ordered by tick cost ~5× as much per block.
    inactive: VecDeque<(u64, SequenceHash)>,
    /// Live slots of `inactive`.
    num_inactive: usize,
    num_private: usize,
    num_active_shared: usize,
    next_tick: u64,
    next_registration: u64,
    // Owed to the indexers at the end of the pass.
    is_cleared_pending: bool,
    removed: Vec<SequenceHash>,
    to_announce: Vec<SequenceHash>,
    is_trace: bool,
}

impl BlockPool {
    pub(crate) fn new(num_blocks: usize, is_trace: bool) -> Self {
        Self {
            num_blocks,
            entries: kvmesh_kv::BlockHashMap::default(),
            inactive: VecDeque::new(),
            num_inactive: 0,
            num_private: 0,
            num_active_shared: 0,
            next_tick: 0,
            next_registration: 0,
            is_cleared_pending: false,
            removed: Vec::new(),
            to_announce: Vec::new(),
            is_trace,
        }
    }

    pub(crate) fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Blocks referenced by sequences (private or shared).
    pub(crate) fn num_used(&self) -> usize {
        self.num_private + self.num_active_shared
    }

    /// Blocks that new allocations may take: free ones plus evictable inactive ones.
    pub(crate) fn num_available(&self) -> usize {
        self.num_blocks.saturating_sub(self.num_used())
    }

    #[cfg(test)]
    pub(crate) fn num_inactive(&self) -> usize {
        self.num_inactive
    }

    /// Whether the slot `(tick, hash)` of `inactive` is live.
    fn is_live(&self, (tick, hash): (u64, SequenceHash)) -> bool {
        self.entries
            .get(&hash)
            .is_some_and(|entry| entry.inactive_tick == Some(tick))
    }

    pub(crate) fn lookup(&self, hash: SequenceHash) -> Lookup {
        match self.entries.get(&hash) {
            None => Lookup::Absent,
            Some(entry) if entry.num_refs > 0 => Lookup::Active,
            Some(_) => Lookup::Inactive,
        }
    }

    pub(crate) fn has_pending_events(&self) -> bool {
        self.is_cleared_pending || !self.removed.is_empty() || !self.to_announce.is_empty()
    }

    /// Takes a new private block, evicting an inactive one when no block is free. The caller has
    /// checked [`Self::num_available`].
    pub(crate) fn allocate_private(&mut self) {
        self.make_room();
        self.num_private += 1;
    }

    /// Turns one of the caller's private blocks into the shared block `hash` (it just became
    /// full): reuses the cached copy when there is one, otherwise registers the block.
    pub(crate) fn promote_private(
        &mut self,
        hash: SequenceHash,
        local_hash: LocalBlockHash,
        parent: Option<SequenceHash>,
    ) {
        self.num_private = self.num_private.saturating_sub(1);
        self.acquire_shared(hash, local_hash, parent);
    }

    /// Takes a reference on the full block `hash`: reuse when active, reactivate when inactive,
    /// else allocate and register it (evicting when no block is free).
    pub(crate) fn acquire_shared(
        &mut self,
        hash: SequenceHash,
        local_hash: LocalBlockHash,
        parent: Option<SequenceHash>,
    ) {
        if let Some(entry) = self.entries.get_mut(&hash) {
            entry.num_refs += 1;
            if entry.num_refs == 1 {
                if entry.inactive_tick.take().is_some() {
                    self.num_inactive -= 1;
                }
                self.num_active_shared += 1;
                self.sweep_stale();
            }
            return;
        }
        self.make_room();
        let registered_at = self.next_registration;
        self.next_registration += 1;
        self.entries.insert(
            hash,
            Entry {
                num_refs: 1,
                local_hash,
                parent,
                registered_at,
                is_announced: false,
                inactive_tick: None,
            },
        );
        self.num_active_shared += 1;
        self.to_announce.push(hash);
        if self.is_trace {
            tracing::info!(block_hash = hash, "kv block allocated");
        }
    }

    /// Releases a sequence's blocks, tail first, so the chain's leaf becomes the oldest inactive
    /// entry and is evicted before its parents.
    pub(crate) fn release(&mut self, slots: &[Slot]) {
        for slot in slots.iter().rev() {
            match *slot {
                Slot::Private => self.num_private = self.num_private.saturating_sub(1),
                Slot::Shared(hash) => {
                    let Some(entry) = self.entries.get_mut(&hash) else {
                        continue;
                    };
                    entry.num_refs = entry.num_refs.saturating_sub(1);
                    if entry.num_refs == 0 {
                        let tick = self.next_tick;
                        self.next_tick += 1;
                        entry.inactive_tick = Some(tick);
                        self.inactive.push_back((tick, hash));
                        self.num_inactive += 1;
                        self.num_active_shared = self.num_active_shared.saturating_sub(1);
                        self.sweep_stale();
                    }
                }
            }
        }
    }

    /// Drops every inactive block and owes the indexers a `Cleared`, followed by a `Stored` for
    /// every block still in use so their view stays exact. Returns the number of blocks dropped.
    pub(crate) fn clear(&mut self) -> usize {
        let num_dropped = self.num_inactive;
        for slot in std::mem::take(&mut self.inactive) {
            if self.is_live(slot) {
                self.entries.remove(&slot.1);
            }
        }
        self.num_inactive = 0;
        self.removed.clear();
        self.is_cleared_pending = true;
        let mut active: Vec<(u64, SequenceHash)> = self
            .entries
            .iter_mut()
            .map(|(hash, entry)| {
                entry.is_announced = false;
                (entry.registered_at, *hash)
            })
            .collect();
        active.sort_unstable();
        self.to_announce = active.into_iter().map(|(_, hash)| hash).collect();
        if self.is_trace {
            tracing::info!(num_dropped, "kv cache cleared");
        }
        num_dropped
    }

    /// The events owed since the last call: `Cleared`, then `Removed`, then one `Stored` per run of
    /// chained blocks.
    pub(crate) fn take_events(&mut self) -> Vec<KvCacheEvent> {
        let mut events = Vec::new();
        if std::mem::take(&mut self.is_cleared_pending) {
            events.push(KvCacheEvent::Cleared);
        }
        let removed = std::mem::take(&mut self.removed);
        if !removed.is_empty() {
            events.push(KvCacheEvent::Removed {
                block_hashes: removed,
            });
        }
        let mut candidates: Vec<(u64, SequenceHash)> = Vec::new();
        let mut seen = kvmesh_kv::BlockHashSet::default();
        for hash in std::mem::take(&mut self.to_announce) {
            if let Some(entry) = self.entries.get(&hash)
                && !entry.is_announced
                && seen.insert(hash)
            {
                candidates.push((entry.registered_at, hash));
            }
        }
        candidates.sort_unstable();
        let mut run: Option<(Option<SequenceHash>, Vec<StoredBlock>)> = None;
        for (_, hash) in candidates {
            let Some(entry) = self.entries.get_mut(&hash) else {
                continue;
            };
            entry.is_announced = true;
            let block = StoredBlock {
                block_hash: hash,
                tokens_hash: entry.local_hash,
            };
            match &mut run {
                Some((_, blocks)) if blocks.last().map(|last| last.block_hash) == entry.parent => {
                    blocks.push(block);
                }
                _ => {
                    if let Some((parent_hash, blocks)) = run.take() {
                        events.push(KvCacheEvent::Stored {
                            parent_hash,
                            blocks,
                        });
                    }
                    run = Some((entry.parent, vec![block]));
                }
            }
        }
        if let Some((parent_hash, blocks)) = run {
            events.push(KvCacheEvent::Stored {
                parent_hash,
                blocks,
            });
        }
        events
    }

    /// Evicts the least recently used inactive block when no block is free.
    fn make_room(&mut self) {
        if self.num_used() + self.num_inactive < self.num_blocks {
            return;
        }
        let Some(hash) = self.pop_oldest_inactive() else {
            return;
        };
        if let Some(entry) = self.entries.remove(&hash)
            && entry.is_announced
        {
            self.removed.push(hash);
        }
        if self.is_trace {
            tracing::info!(block_hash = hash, "kv block evicted");
        }
    }

    /// Takes the oldest live slot off `inactive`, skipping stale ones.
    fn pop_oldest_inactive(&mut self) -> Option<SequenceHash> {
        while let Some(slot) = self.inactive.pop_front() {
            if self.is_live(slot) {
                self.num_inactive -= 1;
                return Some(slot.1);
            }
        }
        None
    }

    /// Drops the stale slots of `inactive` once they outnumber the live ones (plus some
    /// slack), so its length stays within twice the inactive blocks: amortized O(1) per slot.
    fn sweep_stale(&mut self) {
        if self.inactive.len() > 2 * self.num_inactive + STALE_SLACK {
            let mut inactive = std::mem::take(&mut self.inactive);
            inactive.retain(|slot| self.is_live(*slot));
            self.inactive = inactive;
        }
    }

    /// Hashes present in the pool (active or inactive), sorted; for consistency checks.
    #[cfg(test)]
    pub(crate) fn present_hashes(&self) -> Vec<SequenceHash> {
        let mut hashes: Vec<_> = self.entries.keys().copied().collect();
        hashes.sort_unstable();
        hashes
    }

    /// Panics when the counters disagree with the table; tests call it after every pass.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        let num_active = self.entries.values().filter(|e| e.num_refs > 0).count();
        assert_eq!(num_active, self.num_active_shared);
        assert_eq!(self.entries.len() - num_active, self.num_inactive);
        assert!(self.num_used() + self.num_inactive <= self.num_blocks);
        let live: Vec<_> = self.inactive.iter().filter(|s| self.is_live(**s)).collect();
        assert_eq!(live.len(), self.num_inactive);
        assert!(live.windows(2).all(|pair| pair[0].0 < pair[1].0));
        for entry in self.entries.values().filter(|e| e.num_refs == 0) {
            assert!(
                entry.inactive_tick.is_some(),
                "inactive block without a tick"
            );
        }
        assert!(self.inactive.len() <= 2 * self.num_inactive + STALE_SLACK);
        // Presence is closed under parents: a cached block's whole prefix is cached.
        for entry in self.entries.values() {
            if let Some(parent) = entry.parent {
                assert!(self.entries.contains_key(&parent), "orphan block in pool");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(parent: Option<u64>, hashes: &[u64]) -> KvCacheEvent {
        KvCacheEvent::Stored {
            parent_hash: parent,
            blocks: hashes
                .iter()
                .map(|&h| StoredBlock {
                    block_hash: h,
                    tokens_hash: h + 100,
                })
                .collect(),
        }
    }

    #[test]
    fn chain_is_stored_once_and_reuse_is_silent() {
        let mut pool = BlockPool::new(4, false);
        pool.acquire_shared(1, 101, None);
        pool.acquire_shared(2, 102, Some(1));
        assert_eq!(pool.take_events(), vec![stored(None, &[1, 2])]);
        pool.acquire_shared(1, 101, None);
        assert_eq!(pool.lookup(1), Lookup::Active);
        assert!(pool.take_events().is_empty());
        assert_eq!(pool.num_used(), 2);
        pool.check_invariants();
    }

    #[test]
    fn leaves_are_evicted_before_parents() {
        let mut pool = BlockPool::new(3, false);
        pool.acquire_shared(1, 101, None);
        pool.acquire_shared(2, 102, Some(1));
        pool.acquire_shared(3, 103, Some(2));
        pool.take_events();
        pool.release(&[Slot::Shared(1), Slot::Shared(2), Slot::Shared(3)]);
        assert_eq!(pool.num_inactive(), 3);
        pool.allocate_private();
        assert_eq!(pool.lookup(3), Lookup::Absent);
        assert_eq!(pool.lookup(2), Lookup::Inactive);
        pool.acquire_shared(9, 109, None);
        assert_eq!(pool.lookup(2), Lookup::Absent);
        assert_eq!(pool.lookup(1), Lookup::Inactive);
        assert_eq!(
            pool.take_events(),
            vec![
                KvCacheEvent::Removed {
                    block_hashes: vec![3, 2]
                },
                stored(None, &[9]),
            ]
        );
        pool.check_invariants();
    }

    #[test]
    fn block_registered_and_evicted_in_one_pass_is_never_announced() {
        let mut pool = BlockPool::new(1, false);
        pool.acquire_shared(1, 101, None);
        pool.release(&[Slot::Shared(1)]);
        pool.acquire_shared(2, 102, None);
        assert_eq!(pool.take_events(), vec![stored(None, &[2])]);
    }

    #[test]
    fn clear_drops_inactive_and_reannounces_active() {
        let mut pool = BlockPool::new(4, false);
        pool.acquire_shared(1, 101, None);
        pool.acquire_shared(2, 102, Some(1));
        pool.acquire_shared(5, 105, None);
        pool.take_events();
        pool.release(&[Slot::Shared(5)]);
        assert_eq!(pool.clear(), 1);
        assert_eq!(pool.lookup(5), Lookup::Absent);
        assert_eq!(
            pool.take_events(),
            vec![KvCacheEvent::Cleared, stored(None, &[1, 2])]
        );
        pool.check_invariants();
    }

    #[test]
    fn reactivated_blocks_leave_stale_slots_that_are_swept_and_never_evicted() {
        // Blocks 1..=8 cycle between active and inactive many times, each cycle leaving stale
        // slots, far more than the sweep's slack.
        let mut pool = BlockPool::new(16, false);
        let chain: Vec<Slot> = (1..=8).map(Slot::Shared).collect();
        for round in 0..1000 {
            for hash in 1..=8u64 {
                pool.acquire_shared(hash, hash + 100, (hash > 1).then(|| hash - 1));
            }
            pool.release(&chain);
            if round % 100 == 0 {
                pool.check_invariants();
            }
        }
        pool.check_invariants();
        assert_eq!(pool.num_inactive(), 8);
        assert!(pool.inactive.len() <= 16 + STALE_SLACK);
        // Eviction still takes the least recently released live block: the chain's leaf.
        pool.take_events();
        for new in 0..8 {
            pool.acquire_shared(1000 + new, new, None);
        }
        pool.acquire_shared(2000, 0, None);
        assert_eq!(pool.lookup(8), Lookup::Absent);
        assert_eq!(pool.lookup(7), Lookup::Inactive);
        pool.check_invariants();
    }
}
