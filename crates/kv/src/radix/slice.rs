//! Applying a run of one member's events under the ordering rules, optionally in bounded slices.
//!
//! Slicing lets a caller that shares its thread (or a lock around the index) with other work
//! bound how long one call takes, even for a single huge event (a prefill storing thousands of
//! blocks). A slice may end in the middle of an event: the cursor remembers where the chain
//! stands, and since nothing else writes to the index between two slices of a run, the result
//! equals applying the run at once (the property tests check it).

use super::RadixIndex;
use super::warm::WINDOW_OPS;
use crate::counters::{EventStatus, EventType};
use crate::events::{KvEvent, KvEventKind, WorkerKey};

/// Where a stored event's chain stands: the node the next block attaches under.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Chain {
    pub(crate) parent: u32,
    pub(crate) key: u64,
    pub(crate) depth: u32,
}

/// Progress through a run of events applied with [`RadixIndex::apply_slice`].
#[derive(Debug, Clone, Default)]
pub struct ApplyCursor {
    /// Next event to apply (or being applied).
    event: usize,
    /// Blocks or hashes of `event` applied so far; `None` before its checks ran.
    offset: Option<usize>,
    chain: Chain,
    is_missing: bool,
    /// Events before this one were warmed.
    warmed_until: usize,
}

impl ApplyCursor {
    /// A cursor at the start of a run.
    pub fn new() -> Self {
        Self::default()
    }
}

impl RadixIndex {
    /// Applies a run of one member's consecutive events (a batch's body) under the ordering
    /// rules of docs/kv-events.md, "Ordering rules".
    pub fn apply_events(&mut self, worker: WorkerKey, events: &[KvEvent]) {
        self.apply_slice(worker, events, &mut ApplyCursor::new(), usize::MAX);
    }

    /// Applies about `budget` block operations of `events` from `cursor` on; returns true once
    /// the whole run is applied. Nothing else may write to the index between two slices of one
    /// run.
    pub fn apply_slice(
        &mut self,
        worker: WorkerKey,
        events: &[KvEvent],
        cursor: &mut ApplyCursor,
        budget: usize,
    ) -> bool {
        if cursor.event >= events.len() {
            return true;
        }
        let is_start = cursor.event == 0 && cursor.offset.is_none();
        if self.removed_workers.contains(&worker.worker_id) {
            if is_start {
                self.counters.ignored_removed_worker += events.len() as u64;
            }
            cursor.event = events.len();
            return true;
        }
        let Some(id) = self.member_id_or_insert(worker) else {
            if is_start {
                self.counters.stored.invalid_block += events.len() as u64;
            }
            cursor.event = events.len();
            return true;
        };
        let mut ops = 0;
        while cursor.event < events.len() && ops < budget {
            if cursor.event >= cursor.warmed_until {
                self.warm_window(id, events, cursor);
            }
            let event = &events[cursor.event];
            if cursor.offset.is_none() && !self.begin_event(id, event, cursor) {
                cursor.event += 1;
                continue;
            }
            if self.continue_event(id, event, cursor, budget, &mut ops) {
                cursor.event += 1;
                cursor.offset = None;
            }
        }
        self.store.maybe_reclaim();
        cursor.event >= events.len()
    }

    /// Warms the next window of about [`WINDOW_OPS`] block operations.
    fn warm_window(&mut self, id: u32, events: &[KvEvent], cursor: &mut ApplyCursor) {
        let mut end = cursor.event;
        let mut ops = 0;
        while end < events.len() && (end == cursor.event || ops < WINDOW_OPS) {
            ops += events[end].block_ops();
            end += 1;
        }
        if ops > 8 {
            let mut scratch = std::mem::take(&mut self.warm_scratch);
            self.warm(id, &events[cursor.event..end], &mut scratch);
            self.warm_scratch = scratch;
        }
        cursor.warmed_until = end;
    }

    /// Ordering checks and per-event preparation; false when the event is finished already
    /// (skipped as a duplicate, dropped, or a clear, which applies at once).
    fn begin_event(&mut self, id: u32, event: &KvEvent, cursor: &mut ApplyCursor) -> bool {
        let Some(member) = self.members[id as usize].as_mut() else {
            return false;
        };
        match member.last_event_id {
            Some(last) if event.event_id <= last => {
                self.counters.duplicates += 1;
                return false;
            }
            Some(last) if event.event_id > last + 1 => {
                self.counters.gaps += 1;
                if !member.has_warned_gap {
                    member.has_warned_gap = true;
                    tracing::warn!(
                        worker_id = member.key.worker_id,
                        dp_rank = member.key.dp_rank,
                        last_event_id = last,
                        event_id = event.event_id,
                        "gap in kv event ids"
                    );
                }
            }
            _ => {}
        }
        member.last_event_id = Some(event.event_id);
        match &event.kind {
            KvEventKind::Stored(stored) => match self.begin_store(id, stored) {
                Ok(chain) => cursor.chain = chain,
                Err(status) => {
                    self.counters.bump(EventType::Stored, status);
                    return false;
                }
            },
            KvEventKind::Removed(_) => cursor.is_missing = false,
            KvEventKind::Cleared => {
                self.clear_member(id);
                self.counters.bump(EventType::Cleared, EventStatus::Ok);
                return false;
            }
        }
        cursor.offset = Some(0);
        true
    }

    /// Applies blocks of a begun event until it ends (true) or `ops` reaches `budget` (false).
    fn continue_event(
        &mut self,
        id: u32,
        event: &KvEvent,
        cursor: &mut ApplyCursor,
        budget: usize,
        ops: &mut usize,
    ) -> bool {
        let mut offset = cursor.offset.unwrap_or(0);
        let finished = match &event.kind {
            KvEventKind::Stored(stored) => {
                let mut status = None;
                while offset < stored.blocks.len() && *ops < budget {
                    let block = &stored.blocks[offset];
                    if let Err(error) = self.store_block(id, event.tier, block, &mut cursor.chain) {
                        status = Some(error);
                        break;
                    }
                    offset += 1;
                    *ops += 1;
                }
                match status {
                    Some(error) => Some((EventType::Stored, error)),
                    None if offset == stored.blocks.len() => {
                        Some((EventType::Stored, EventStatus::Ok))
                    }
                    None => None,
                }
            }
            KvEventKind::Removed(removed) => {
                while offset < removed.block_hashes.len() && *ops < budget {
                    let hash = removed.block_hashes[offset];
                    cursor.is_missing |= !self.remove_hash(id, event.tier, hash);
                    offset += 1;
                    *ops += 1;
                }
                (offset == removed.block_hashes.len()).then(|| {
                    let status = if cursor.is_missing {
                        EventStatus::BlockNotFound
                    } else {
                        EventStatus::Ok
                    };
                    (EventType::Removed, status)
                })
            }
            KvEventKind::Cleared => Some((EventType::Cleared, EventStatus::Ok)),
        };
        cursor.offset = Some(offset);
        match finished {
            Some((event_type, status)) => {
                self.counters.bump(event_type, status);
                *ops += usize::from(offset == 0);
                true
            }
            None => false,
        }
    }
}
