//! Read-only warm-up of the memory a run of events will touch.
//!
//! Applying one block costs several dependent cache misses (member lookup → node → parent →
//! path-key index). Done one block at a time, and behind probing loops whose branches depend on
//! the loaded data, they serialise. Before applying a window of events, these passes read the
//! same lines in tight loops that do not branch on what they load, so the CPU keeps many misses
//! in flight; the apply that follows then finds the lines in cache. The passes only read, so they
//! cannot change any result.

use super::nodes::{ROOT, ROOT_KEY, child_key};
use super::{RadixIndex, SLOT_MASK};
use crate::events::{KvEvent, KvEventKind};

/// Block operations warmed per window: enough to keep many misses in flight, few enough that
/// the window's lines stay in L1/L2 until applied.
pub(super) const WINDOW_OPS: usize = 256;

impl RadixIndex {
    /// Touches the lookups, nodes, parents and index slots `events` of member `id` will use.
    pub(super) fn warm(&self, id: u32, events: &[KvEvent], nodes: &mut Vec<u32>) {
        let Some(member) = self.member(id) else {
            return;
        };
        let lookup = &member.lookup;
        let mut sink = 0u32;
        // Pass 1: home slots of every engine hash named, and of every path key stored.
        for event in events {
            match &event.kind {
                KvEventKind::Removed(removed) => {
                    for &hash in &removed.block_hashes {
                        sink ^= lookup.touch(hash);
                    }
                }
                KvEventKind::Stored(stored) => {
                    let mut key = match stored.parent_hash {
                        None => ROOT_KEY,
                        Some(hash) => match lookup.get(hash) {
                            Some(value) => self.store.key_of(value & SLOT_MASK),
                            None => continue,
                        },
                    };
                    for block in &stored.blocks {
                        key = child_key(key, block.tokens_hash);
                        sink ^= lookup.touch(block.block_hash) ^ self.store.touch_key(key);
                    }
                }
                KvEventKind::Cleared => {}
            }
        }
        // Pass 2: the nodes removals name (lookups now cached), with their index slots.
        nodes.clear();
        for event in events {
            if let KvEventKind::Removed(removed) = &event.kind {
                for &hash in &removed.block_hashes {
                    if let Some(value) = lookup.get(hash) {
                        nodes.push(self.store.touch_node(value & SLOT_MASK));
                    }
                }
            }
        }
        // Pass 3: their parents (freeing upward and the digest's tokens hash read them).
        for &parent in nodes.iter() {
            if parent != ROOT {
                sink ^= self.store.touch_node(parent);
            }
        }
        std::hint::black_box(sink);
    }
}
