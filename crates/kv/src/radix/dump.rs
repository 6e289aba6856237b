//! Dumping the index as events (snapshots; docs/indexer.md, "Snapshots and bootstrap") and
//! rebuilding from them.
//!
//! A dump is the events that rebuild the state exactly: per member, stored events with parents
//! before children (chains merged into one event where possible), and worker-removed markers for
//! removed workers. A member may hold a block without holding its parent (the parent was evicted
//! alone); such a block is re-created through a chain of placeholder engine hashes that a removed
//! event in the same dump drops again, so the tree path, the memberships and the digest come out
//! identical.

use std::collections::HashMap;

use super::apply::tiers_of;
use super::nodes::ROOT;
use super::{RadixIndex, SLOT_MASK, TIER_SHIFT};
use crate::events::{
    KvEvent, KvEventBatch, KvEventKind, KvRemoved, KvStored, KvStoredBlock, Tier, WorkerKey,
};

/// Events per batch in a dump, so a batch stays well under the 512 KiB message limit.
const EVENTS_PER_BATCH: usize = 1024;
/// First candidate placeholder engine hash; candidates the member uses are skipped.
const PLACEHOLDER_BASE: u64 = 0x706c_6163_6568_6f6c;

/// A member's event cursor, carried with a snapshot so replay resumes its order checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct WorkerCursor {
    /// The member.
    pub worker: WorkerKey,
    /// Last event id applied.
    pub last_event_id: u64,
}

/// The whole state of an index as events (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IndexDump {
    /// Last applied event id of every member that has one, sorted.
    pub cursors: Vec<WorkerCursor>,
    /// Worker-removed markers first, then each member's stored (and placeholder-removing) events.
    /// Event ids are numbered from 0 per member and ignored when loading.
    pub batches: Vec<KvEventBatch>,
}

impl RadixIndex {
    /// The state as events; [`RadixIndex::from_dump`] rebuilds an index with the same digest,
    /// answers, counts and cursors.
    pub fn dump(&self) -> IndexDump {
        let mut removed: Vec<u64> = self.removed_workers.iter().copied().collect();
        removed.sort_unstable();
        let mut batches: Vec<KvEventBatch> = removed
            .into_iter()
            .map(KvEventBatch::worker_removed)
            .collect();
        let mut cursors = Vec::new();
        let mut ids: Vec<(WorkerKey, u32)> = self.by_key.iter().map(|(&k, &id)| (k, id)).collect();
        ids.sort_unstable();
        for (worker, id) in ids {
            let Some(member) = self.member(id) else {
                continue;
            };
            if let Some(last_event_id) = member.last_event_id {
                cursors.push(WorkerCursor {
                    worker,
                    last_event_id,
                });
            }
            let events = self.member_events(id);
            for (chunk_index, chunk) in events.chunks(EVENTS_PER_BATCH).enumerate() {
                let first_id = (chunk_index * EVENTS_PER_BATCH) as u64;
                batches.push(KvEventBatch {
                    worker_id: worker.worker_id,
                    dp_rank: worker.dp_rank,
                    events: chunk
                        .iter()
                        .enumerate()
                        .map(|(i, (tier, kind))| KvEvent {
                            event_id: first_id + i as u64,
                            tier: *tier,
                            kind: kind.clone(),
                        })
                        .collect(),
                    published_at_ms: 0,
                    worker_removed: false,
                    worker_readmitted: false,
                });
            }
        }
        IndexDump { cursors, batches }
    }

    /// Rebuilds an index from a dump.
    pub fn from_dump(dump: &IndexDump) -> Self {
        let mut index = Self::new();
        for batch in &dump.batches {
            index.load_batch(batch);
        }
        for cursor in &dump.cursors {
            index.set_cursor(cursor.worker, cursor.last_event_id);
        }
        index
    }

    /// Applies one batch of a dump (a snapshot chunk): event ids are not checked and no counters
    /// move; a worker-removed marker removes and blocks the worker.
    pub fn load_batch(&mut self, batch: &KvEventBatch) {
        if batch.worker_readmitted {
            self.readmit_worker(batch.worker_id);
            return;
        }
        if batch.worker_removed {
            let counted = self.counters.workers_removed;
            self.remove_worker(batch.worker_id);
            self.counters.workers_removed = counted;
            return;
        }
        if self.removed_workers.contains(&batch.worker_id) || batch.events.is_empty() {
            return;
        }
        let Some(id) = self.member_id_or_insert(batch.worker()) else {
            return;
        };
        for event in &batch.events {
            self.apply_event(id, event);
        }
        self.store.maybe_reclaim();
    }

    /// Sets a member's last applied event id (from a snapshot's cursors), registering it if new.
    pub fn set_cursor(&mut self, worker: WorkerKey, last_event_id: u64) {
        if self.removed_workers.contains(&worker.worker_id) {
            return;
        }
        if let Some(id) = self.member_id_or_insert(worker)
            && let Some(member) = self.members[id as usize].as_mut()
        {
            member.last_event_id = Some(last_event_id);
        }
    }

    /// One member's blocks as (tier, event) pairs, parents first.
    fn member_events(&self, id: u32) -> Vec<(Tier, KvEventKind)> {
        let Some(member) = self.member(id) else {
            return Vec::new();
        };
        // (engine hash, slot, tiers), in a fixed order.
        let mut entries: Vec<(u64, u32, u32)> = member
            .lookup
            .iter()
            .map(|(hash, value)| (hash, value & SLOT_MASK, value >> TIER_SHIFT))
            .collect();
        entries.sort_unstable();
        let is_held: HashMap<u32, ()> = entries.iter().map(|&(_, slot, _)| (slot, ())).collect();

        // Group entries under their nearest held ancestor (the root if none).
        let mut children: HashMap<u32, Vec<usize>> = HashMap::new();
        for (i, &(_, slot, _)) in entries.iter().enumerate() {
            children
                .entry(self.anchor_of(slot, &is_held))
                .or_default()
                .push(i);
        }

        let mut placeholders = Placeholders::new(|hash| member.lookup.get(hash).is_some());
        let mut named: HashMap<u32, u64> = HashMap::new();
        let mut events: Vec<(Tier, KvEventKind)> = Vec::new();
        let mut stack: Vec<usize> = children.get(&ROOT).cloned().unwrap_or_default();
        stack.reverse();
        while let Some(i) = stack.pop() {
            let (hash, slot, tiers) = entries[i];
            let anchor = self.anchor_of(slot, &is_held);
            let parent_hash = (anchor != ROOT)
                .then(|| named.get(&anchor).copied())
                .flatten();
            let gap = self.unheld_chain(slot, anchor);
            let block = KvStoredBlock::new(hash, self.tokens_hash(slot));
            for tier in tiers_of(tiers) {
                if gap.is_empty() {
                    push_stored(&mut events, tier, parent_hash, block.clone());
                    continue;
                }
                let fillers = placeholders.take(gap.len());
                let mut blocks: Vec<KvStoredBlock> = gap
                    .iter()
                    .zip(&fillers)
                    .map(|(&gap_slot, &filler)| {
                        KvStoredBlock::new(filler, self.tokens_hash(gap_slot))
                    })
                    .collect();
                blocks.push(block.clone());
                events.push((
                    tier,
                    KvEventKind::Stored(KvStored {
                        parent_hash,
                        blocks,
                        start_position: None,
                    }),
                ));
                events.push((
                    tier,
                    KvEventKind::Removed(KvRemoved {
                        block_hashes: fillers,
                    }),
                ));
            }
            if let std::collections::hash_map::Entry::Vacant(vacant) = named.entry(slot) {
                vacant.insert(hash);
                if let Some(kids) = children.get(&slot) {
                    stack.extend(kids.iter().rev());
                }
            }
        }
        events
    }

    /// Nearest ancestor of `slot` the member holds, or [`ROOT`].
    fn anchor_of(&self, slot: u32, is_held: &HashMap<u32, ()>) -> u32 {
        let mut ancestor = self.store.parent_of(slot);
        while ancestor != ROOT && !is_held.contains_key(&ancestor) {
            ancestor = self.store.parent_of(ancestor);
        }
        ancestor
    }

    /// Slots strictly between `anchor` and `slot`, root side first.
    fn unheld_chain(&self, slot: u32, anchor: u32) -> Vec<u32> {
        let mut chain = Vec::new();
        let mut ancestor = self.store.parent_of(slot);
        while ancestor != anchor {
            chain.push(ancestor);
            ancestor = self.store.parent_of(ancestor);
        }
        chain.reverse();
        chain
    }
}

/// Appends a one-block store, extending the previous event when it is the same tier's chain.
fn push_stored(
    events: &mut Vec<(Tier, KvEventKind)>,
    tier: Tier,
    parent_hash: Option<u64>,
    block: KvStoredBlock,
) {
    if let (Some(parent), Some((last_tier, KvEventKind::Stored(last)))) =
        (parent_hash, events.last_mut())
        && *last_tier == tier
        && last.blocks.last().map(|b| b.block_hash) == Some(parent)
    {
        last.blocks.push(block);
        return;
    }
    events.push((
        tier,
        KvEventKind::Stored(KvStored {
            parent_hash,
            blocks: vec![block],
            start_position: None,
        }),
    ));
}

/// Engine hashes a member does not use, handed out for placeholder chains (reused after each
/// chain's removal).
struct Placeholders<'a> {
    hashes: Vec<u64>,
    next: u64,
    is_used: Box<dyn Fn(u64) -> bool + 'a>,
}

impl<'a> Placeholders<'a> {
    fn new(is_used: impl Fn(u64) -> bool + 'a) -> Self {
        Self {
            hashes: Vec::new(),
            next: PLACEHOLDER_BASE,
            is_used: Box::new(is_used),
        }
    }

    fn take(&mut self, count: usize) -> Vec<u64> {
        while self.hashes.len() < count {
            let candidate = self.next;
            self.next = self.next.wrapping_add(1);
            if !(self.is_used)(candidate) {
                self.hashes.push(candidate);
            }
        }
        self.hashes[..count].to_vec()
    }
}
