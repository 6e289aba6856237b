//! Event application: ordering rules, stored / removed / cleared, and membership bookkeeping.

use super::nodes::{ROOT, child_key, mix, tokens_hash_of};
use super::pool::{ALIAS_BIT, TIER_MASK, entry};
use super::slice::Chain;
use super::{RadixIndex, SLOT_MASK, TIER_SHIFT, digest_term};
use crate::counters::{EventStatus, EventType};
use crate::events::{KvEvent, KvEventBatch, KvEventKind, KvStored, KvStoredBlock, Tier};

impl RadixIndex {
    /// See [`RadixIndex::apply`].
    pub(super) fn apply_batch(&mut self, batch: &KvEventBatch) {
        if batch.worker_removed {
            self.remove_worker(batch.worker_id);
        } else if batch.worker_readmitted {
            self.readmit_worker(batch.worker_id);
        } else {
            self.apply_events(batch.worker(), &batch.events);
        }
    }

    /// Applies one event's effect, without ordering checks (snapshot loading uses this directly).
    pub(super) fn apply_event(&mut self, id: u32, event: &KvEvent) -> (EventType, EventStatus) {
        match &event.kind {
            KvEventKind::Stored(stored) => (EventType::Stored, self.store(id, event.tier, stored)),
            KvEventKind::Removed(removed) => (
                EventType::Removed,
                self.remove_hashes(id, event.tier, &removed.block_hashes),
            ),
            KvEventKind::Cleared => {
                self.clear_member(id);
                (EventType::Cleared, EventStatus::Ok)
            }
        }
    }

    /// Applies a stored event's effect (no ordering checks, no counters).
    pub(crate) fn store(&mut self, id: u32, tier: Tier, stored: &KvStored) -> EventStatus {
        let mut chain = match self.begin_store(id, stored) {
            Ok(chain) => chain,
            Err(status) => return status,
        };
        for block in &stored.blocks {
            if let Err(status) = self.store_block(id, tier, block, &mut chain) {
                return status;
            }
        }
        EventStatus::Ok
    }

    /// Checks a stored event (self-reference, parent) and returns where its chain attaches.
    pub(super) fn begin_store(&mut self, id: u32, stored: &KvStored) -> Result<Chain, EventStatus> {
        if has_self_reference(stored, &mut self.dedup_bitmap) {
            return Err(EventStatus::InvalidBlock);
        }
        let member = self.member(id).ok_or(EventStatus::InvalidBlock)?;
        let parent = match stored.parent_hash {
            None => ROOT,
            Some(hash) => match member.lookup.get(hash) {
                Some(value) => value & SLOT_MASK,
                None => return Err(EventStatus::ParentBlockNotFound),
            },
        };
        Ok(Chain {
            parent,
            key: self.store.key_of(parent),
            depth: self.store.depth_of(parent),
        })
    }

    /// Stores one block of a chain under `chain` and moves `chain` onto it.
    pub(super) fn store_block(
        &mut self,
        id: u32,
        tier: Tier,
        block: &KvStoredBlock,
        chain: &mut Chain,
    ) -> Result<(), EventStatus> {
        let key = child_key(chain.key, block.tokens_hash);
        let depth = chain.depth + 1;
        let slot = match self.store.find_or_insert(key, chain.parent, depth) {
            Ok((slot, true)) => slot,
            Ok((slot, false)) if self.store.parent_of(slot) == chain.parent => slot,
            // Same 64-bit path key under another parent (or a full arena): refuse rather than
            // corrupt.
            _ => return Err(EventStatus::InvalidBlock),
        };
        self.attach(id, slot, block.block_hash, tier, block.tokens_hash, depth);
        *chain = Chain {
            parent: slot,
            key,
            depth,
        };
        Ok(())
    }

    /// Applies a removed event's effect (no ordering checks, no counters).
    pub(crate) fn remove_hashes(&mut self, id: u32, tier: Tier, hashes: &[u64]) -> EventStatus {
        let mut is_missing = false;
        for &hash in hashes {
            is_missing |= !self.remove_hash(id, tier, hash);
        }
        if is_missing {
            EventStatus::BlockNotFound
        } else {
            EventStatus::Ok
        }
    }

    /// Removes one engine hash's `tier` from member `id`; false when it does not hold it there.
    pub(super) fn remove_hash(&mut self, id: u32, tier: Tier, hash: u64) -> bool {
        let bit = 1u32 << tier.index();
        let Some(member) = self.members[id as usize].as_mut() else {
            return false;
        };
        let lookup = &mut member.lookup;
        let Some(pos) = lookup.locate(hash) else {
            return false;
        };
        let value = lookup.value_at(pos);
        if (value >> TIER_SHIFT) & bit == 0 {
            return false;
        }
        let remaining = (value >> TIER_SHIFT) & !bit;
        if remaining == 0 {
            lookup.remove_at(pos);
        } else {
            lookup.set_at(pos, (value & SLOT_MASK) | (remaining << TIER_SHIFT));
        }
        self.release_claims(id, hash, (value & SLOT_MASK) | (bit << TIER_SHIFT));
        true
    }

    /// Drops every block of a member (its lookup, memberships and digest terms).
    pub(super) fn clear_member(&mut self, id: u32) {
        let Some(member) = self.members[id as usize].as_mut() else {
            return;
        };
        let lookup = std::mem::take(&mut member.lookup);
        for (hash, value) in lookup.iter() {
            self.release_claims(id, hash, value);
        }
    }

    /// Adds (member, tier) to `slot` under `hash`; the node already exists.
    fn attach(&mut self, id: u32, slot: u32, hash: u64, tier: Tier, tokens_hash: u64, depth: u32) {
        let bit = 1u32 << tier.index();
        let Some(member) = self.members[id as usize].as_mut() else {
            return;
        };
        let worker = member.key;
        let fresh = slot | (bit << TIER_SHIFT);
        match member.lookup.insert_if_absent(hash, fresh) {
            None => self.add_member_at_node(id, slot, tier),
            Some(value) if value & SLOT_MASK == slot => {
                if (value >> TIER_SHIFT) & bit != 0 {
                    return;
                }
                member.lookup.insert(hash, value | (bit << TIER_SHIFT));
                self.add_tier_at_node(id, slot, tier, false);
            }
            Some(value) => {
                // The engine hash named another block: move it here. Attach first so freeing
                // the old node upward cannot free the new one.
                member.lookup.insert(hash, fresh);
                self.add_member_at_node(id, slot, tier);
                self.release_claims(id, hash, value);
            }
        }
        self.digest = self
            .digest
            .wrapping_add(digest_term(worker, tier, hash, tokens_hash, depth));
    }

    /// Adds member `id` to node `slot` for a new engine hash (the lookup is already written).
    fn add_member_at_node(&mut self, id: u32, slot: u32, tier: Tier) {
        if self.store.position(slot, id).is_some() {
            // Another engine hash of this member already names the node.
            self.add_tier_at_node(id, slot, tier, true);
            return;
        }
        if self
            .store
            .push_entry(slot, entry(id, 1 << tier.index(), false))
            .is_err()
        {
            // The node's list is at its size limit: the member is not recorded there.
            return;
        }
        self.num_entries += 1;
        self.bump_tree_size(id, 1);
    }

    /// Adds a tier to an existing entry; `is_new_hash` when a further engine hash names the node.
    fn add_tier_at_node(&mut self, id: u32, slot: u32, tier: Tier, is_new_hash: bool) {
        let Some((pos, old)) = self.store.find_entry(slot, id) else {
            return;
        };
        let bit = 1u32 << tier.index();
        let is_alias = old & ALIAS_BIT != 0 || is_new_hash;
        if is_alias {
            let counts = self.aliases.entry((slot, id)).or_insert_with(|| {
                let mut counts = [0u32; 4];
                for t in tiers_of(old & TIER_MASK) {
                    counts[t.index()] = 1;
                }
                counts
            });
            counts[tier.index()] += 1;
        }
        self.store
            .set_entry(slot, pos, entry(id, (old & TIER_MASK) | bit, is_alias));
    }

    /// Drops the node-side claims (and digest terms) of `hash`'s former lookup value `value`;
    /// the lookup itself has already been rewritten or dropped.
    fn release_claims(&mut self, id: u32, hash: u64, value: u32) {
        let Some(worker) = self.member(id).map(|member| member.key) else {
            return;
        };
        let slot = value & SLOT_MASK;
        let node = self.store.view(slot);
        let tokens_hash = tokens_hash_of(node.key, self.store.key_of(node.parent));
        for tier in tiers_of(value >> TIER_SHIFT) {
            self.digest =
                self.digest
                    .wrapping_sub(digest_term(worker, tier, hash, tokens_hash, node.depth));
            self.drop_tier_at_node(id, slot, tier);
        }
    }

    /// Removes one engine hash's claim on (slot, member, tier); frees what becomes empty.
    fn drop_tier_at_node(&mut self, id: u32, slot: u32, tier: Tier) {
        let Some((pos, old)) = self.store.find_entry(slot, id) else {
            return;
        };
        let bit = 1u32 << tier.index();
        let mut tiers = old & TIER_MASK;
        let is_alias = old & ALIAS_BIT != 0;
        if is_alias {
            let counts = self.aliases.entry((slot, id)).or_insert([0; 4]);
            counts[tier.index()] = counts[tier.index()].saturating_sub(1);
            if counts[tier.index()] == 0 {
                tiers &= !bit;
            }
            if tiers == 0 {
                self.aliases.remove(&(slot, id));
            }
        } else {
            tiers &= !bit;
        }
        if tiers != 0 {
            self.store.set_entry(slot, pos, entry(id, tiers, is_alias));
            return;
        }
        self.store.swap_remove_entry(slot, pos);
        self.num_entries -= 1;
        self.bump_tree_size(id, -1);
        self.free_upward(slot);
    }

    fn free_upward(&mut self, mut slot: u32) {
        while slot != ROOT {
            let node = self.store.view(slot);
            if node.members != 0 || node.children != 0 {
                return;
            }
            slot = self.store.free(slot);
        }
    }

    /// Tokens hash of the node in `slot`.
    pub(super) fn tokens_hash(&self, slot: u32) -> u64 {
        let node = self.store.view(slot);
        tokens_hash_of(node.key, self.store.key_of(node.parent))
    }
}

/// The tiers set in a 4-bit mask, fastest first.
pub(super) fn tiers_of(mask: u32) -> impl Iterator<Item = Tier> {
    Tier::ALL
        .into_iter()
        .filter(move |tier| mask & (1 << tier.index()) != 0)
}

/// Whether a stored event repeats a hash among its blocks and parent (a self-reference;
/// docs/kv-events.md, "Event model").
///
/// Short events compare pairwise. Longer ones set one bit per hash in `bitmap` (65 536 bits,
/// all clear between calls) and only sort when two hashes share a bit.
fn has_self_reference(stored: &KvStored, bitmap: &mut Vec<u64>) -> bool {
    let blocks = &stored.blocks;
    if blocks.len() <= 16 {
        for (i, block) in blocks.iter().enumerate() {
            if stored.parent_hash == Some(block.block_hash)
                || blocks[..i].iter().any(|b| b.block_hash == block.block_hash)
            {
                return true;
            }
        }
        return false;
    }
    if bitmap.len() < 1024 {
        bitmap.resize(1024, 0);
    }
    let hashes = || {
        blocks
            .iter()
            .map(|b| b.block_hash)
            .chain(stored.parent_hash)
    };
    let bit_of = |hash: u64| (mix(hash) >> 48) as usize;
    let mut is_shared = false;
    for hash in hashes() {
        let bit = bit_of(hash);
        is_shared |= bitmap[bit >> 6] & (1 << (bit & 63)) != 0;
        bitmap[bit >> 6] |= 1 << (bit & 63);
    }
    for hash in hashes() {
        let bit = bit_of(hash);
        bitmap[bit >> 6] &= !(1 << (bit & 63));
    }
    if !is_shared {
        return false;
    }
    let mut sorted: Vec<u64> = hashes().collect();
    sorted.sort_unstable();
    sorted.windows(2).any(|pair| pair[0] == pair[1])
}
