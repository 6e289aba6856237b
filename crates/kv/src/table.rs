//! A compact open-addressing map from `u64` keys to `u32` values.
//!
//! Every (block, worker) entry of the index costs one slot of one of these (the member's
//! engine-hash lookup) and every node one more (the path-key index), so the slot is 12 bytes (key
//! split in two `u32` halves, no padding), the table runs at up to 80 % load and grows by half
//! (any capacity, not just powers of two: the home slot is a multiply-shift "fast range" of a
//! Fibonacci hash), keeping the average load near two thirds. Linear probing keeps a lookup to
//! about one cache line; an insert writes one slot and moves nothing, and removal shifts later
//! entries of the run back (Knuth's algorithm R) instead of leaving tombstones, so the table never
//! degrades. Key 0 is the empty marker and is stored out of line.
//!
//! Slots are atomics so the node index can be read by queries while its single writer changes
//! it (the member lookups, private to their writer, pay nothing for it: these loads and stores
//! are plain moves on x86). A concurrent reader can miss an entry that a removal's shift is
//! moving or read a slot half-written; callers of [`U64Table::get`] from other threads validate
//! what they find (the node index checks the node's own key). Growing or shrinking builds a new
//! table ([`U64Table::resized`]), which a shared owner publishes while readers finish on the old.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

/// Golden-ratio multiplier of Fibonacci hashing; spreads sequential and random keys alike.
const FIB: u64 = 0x9E37_79B9_7F4A_7C15;
/// Smallest allocated capacity.
const MIN_CAPACITY: usize = 8;

/// One slot's contents: the key as two halves (so the slot is 12 bytes) and the value.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    lo: u32,
    hi: u32,
    val: u32,
}

impl Slot {
    #[inline]
    fn key(&self) -> u64 {
        (u64::from(self.hi) << 32) | u64::from(self.lo)
    }

    #[inline]
    fn is_empty(&self) -> bool {
        self.lo == 0 && self.hi == 0
    }

    #[inline]
    fn new(key: u64, val: u32) -> Self {
        Self {
            lo: key as u32,
            hi: (key >> 32) as u32,
            val,
        }
    }
}

/// A slot as atomics.
#[derive(Debug, Default)]
struct AtomicSlot {
    lo: AtomicU32,
    hi: AtomicU32,
    val: AtomicU32,
}

impl AtomicSlot {
    #[inline]
    fn load(&self) -> Slot {
        Slot {
            lo: self.lo.load(Ordering::Acquire),
            hi: self.hi.load(Ordering::Acquire),
            val: self.val.load(Ordering::Relaxed),
        }
    }

    /// Stores value first and key last, so a reader that sees the key sees the value.
    #[inline]
    fn store(&self, slot: Slot) {
        self.val.store(slot.val, Ordering::Relaxed);
        self.hi.store(slot.hi, Ordering::Release);
        self.lo.store(slot.lo, Ordering::Release);
    }
}

/// `u32` marking "no value under key 0" (values are node numbers and lookup words, which never
/// reach it).
const NO_ZERO: u32 = u32::MAX;

/// Map from `u64` to `u32`, 12 bytes per slot: the per-member engine-hash lookups and the
/// path-key node index. One writer; any number of (validating) readers.
#[derive(Debug)]
pub(crate) struct U64Table {
    slots: Box<[AtomicSlot]>,
    /// Entries in `slots` (key 0 excluded).
    len: AtomicUsize,
    /// The value stored under key 0, or [`NO_ZERO`].
    zero: AtomicU32,
}

impl Default for U64Table {
    fn default() -> Self {
        Self::new()
    }
}

impl U64Table {
    /// An empty table that allocates nothing until the first insert.
    pub(crate) fn new() -> Self {
        Self {
            slots: Box::default(),
            len: AtomicUsize::new(0),
            zero: AtomicU32::new(NO_ZERO),
        }
    }

    fn with_capacity(capacity: usize) -> Self {
        Self {
            slots: (0..capacity).map(|_| AtomicSlot::default()).collect(),
            len: AtomicUsize::new(0),
            zero: AtomicU32::new(NO_ZERO),
        }
    }

    /// Number of entries.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed) + usize::from(self.zero_value().is_some())
    }

    /// Heap bytes held (slot capacity).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.slots.len() * std::mem::size_of::<AtomicSlot>()
    }

    #[inline]
    fn zero_value(&self) -> Option<u32> {
        let value = self.zero.load(Ordering::Acquire);
        (value != NO_ZERO).then_some(value)
    }

    #[inline]
    fn home(&self, key: u64) -> usize {
        ((u128::from(key.wrapping_mul(FIB)) * self.slots.len() as u128) >> 64) as usize
    }

    #[inline]
    fn next(&self, i: usize) -> usize {
        if i + 1 == self.slots.len() { 0 } else { i + 1 }
    }

    /// Value under `key`.
    #[inline]
    pub(crate) fn get(&self, key: u64) -> Option<u32> {
        self.locate(key).map(|pos| self.value_at(pos))
    }

    /// Loads `key`'s home slot and returns a value derived from it, without branching on it.
    ///
    /// A warm-up read: many of these in a row keep many cache misses in flight, where probing
    /// loops would stall on each (their branches depend on the loaded data).
    #[inline]
    pub(crate) fn touch(&self, key: u64) -> u32 {
        if self.slots.is_empty() {
            return 0;
        }
        // The home slot's line and the next one: probes and removal shifts often run on.
        let home = self.home(key);
        let next = self.slots[(home + 5).min(self.slots.len() - 1)]
            .hi
            .load(Ordering::Relaxed);
        let slot = &self.slots[home];
        slot.lo.load(Ordering::Relaxed) ^ slot.val.load(Ordering::Relaxed) ^ next
    }

    /// Whether the next insert needs a bigger table (see [`Self::resized`]).
    #[inline]
    pub(crate) fn is_full(&self) -> bool {
        (self.len.load(Ordering::Relaxed) + 1) * 5 > self.slots.len() * 4
    }

    /// Whether the table is mostly empty and worth shrinking.
    #[inline]
    pub(crate) fn is_sparse(&self) -> bool {
        self.slots.len() > 64 && self.len.load(Ordering::Relaxed) * 5 < self.slots.len()
    }

    /// A copy sized for the current entries: grown by half when full, halved toward 40 % load
    /// when sparse.
    pub(crate) fn resized(&self) -> U64Table {
        let len = self.len.load(Ordering::Relaxed);
        let capacity = if self.is_full() {
            self.slots.len() + self.slots.len() / 2
        } else {
            len * 2
        };
        let table = Self::with_capacity(capacity.max(MIN_CAPACITY));
        for slot in self.slots.iter().map(AtomicSlot::load) {
            if !slot.is_empty() {
                table.place(slot.key(), slot.val, true);
            }
        }
        table
            .zero
            .store(self.zero.load(Ordering::Relaxed), Ordering::Relaxed);
        table
    }

    /// Sets `key` to `val`, returning the previous value (an owned table: grows in place).
    pub(crate) fn insert(&mut self, key: u64, val: u32) -> Option<u32> {
        if key != 0 && self.is_full() {
            *self = self.resized();
        }
        self.insert_in_place(key, val, true)
    }

    /// Inserts `key` → `val` unless `key` is present; returns the present value untouched.
    /// One probe where a `get` then `insert` would take two.
    pub(crate) fn insert_if_absent(&mut self, key: u64, val: u32) -> Option<u32> {
        if key != 0 && self.is_full() {
            *self = self.resized();
        }
        self.insert_in_place(key, val, false)
    }

    /// Inserts into a table that is not [`Self::is_full`] (a shared table's writer resizes and
    /// publishes first). Overwrites a present value when `is_overwrite`; returns the old value.
    pub(crate) fn insert_in_place(&self, key: u64, val: u32, is_overwrite: bool) -> Option<u32> {
        if key == 0 {
            let old = self.zero_value();
            if old.is_none() || is_overwrite {
                self.zero.store(val, Ordering::Release);
            }
            return old;
        }
        self.place(key, val, is_overwrite)
    }

    /// Linear-probing insertion into a table with room: walks the run from the key's home slot,
    /// replacing the value if the key is there, else writing the first empty slot (one store:
    /// no entry moves).
    fn place(&self, key: u64, val: u32, is_overwrite: bool) -> Option<u32> {
        let mut i = self.home(key);
        loop {
            let slot = self.slots[i].load();
            if slot.is_empty() {
                self.slots[i].store(Slot::new(key, val));
                // One writer: a plain load and store, not a locked read-modify-write.
                self.len
                    .store(self.len.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                return None;
            }
            if slot.key() == key {
                if is_overwrite {
                    self.slots[i].val.store(val, Ordering::Release);
                }
                return Some(slot.val);
            }
            i = self.next(i);
        }
    }

    /// Position of `key` (`usize::MAX` for key 0), for a later [`Self::value_at`],
    /// [`Self::set_at`] or [`Self::remove_at`] without probing again.
    #[inline]
    pub(crate) fn locate(&self, key: u64) -> Option<usize> {
        if key == 0 {
            return self.zero_value().map(|_| usize::MAX);
        }
        if self.slots.is_empty() {
            return None;
        }
        let mut i = self.home(key);
        // A bound on the walk: a reader racing the writer's moves must not loop for ever.
        for _ in 0..self.slots.len() {
            let slot = self.slots[i].load();
            if slot.is_empty() {
                return None;
            }
            if slot.key() == key {
                return Some(i);
            }
            i = self.next(i);
        }
        None
    }

    /// Value at a position from [`Self::locate`].
    #[inline]
    pub(crate) fn value_at(&self, pos: usize) -> u32 {
        if pos == usize::MAX {
            self.zero.load(Ordering::Acquire)
        } else {
            self.slots[pos].val.load(Ordering::Acquire)
        }
    }

    /// Overwrites the value at a position from [`Self::locate`].
    #[inline]
    pub(crate) fn set_at(&self, pos: usize, val: u32) {
        if pos == usize::MAX {
            self.zero.store(val, Ordering::Release);
        } else {
            self.slots[pos].val.store(val, Ordering::Release);
        }
    }

    /// Removes the entry at a position from [`Self::locate`]. The table may be left sparse
    /// ([`Self::is_sparse`]); owners resize when they like.
    pub(crate) fn remove_at(&self, pos: usize) {
        if pos == usize::MAX {
            self.zero.store(NO_ZERO, Ordering::Release);
            return;
        }
        // Backward-shift deletion (Knuth's algorithm R): every later entry of the run that may
        // not stay behind the hole (its home is not cyclically within `(hole, j]`) moves into
        // it, so every entry stays reachable from its home without tombstones. Whether an entry
        // moves is unpredictable, so the loop does not branch on it: the hole is rewritten every
        // step, with the moving entry or with what it already holds.
        let len = self.slots.len();
        let wrap = |x: usize| if x >= len { x - len } else { x };
        let mut hole = pos;
        let mut kept = self.slots[pos].load();
        let mut j = pos;
        loop {
            j = self.next(j);
            let slot = self.slots[j].load();
            if slot.is_empty() {
                break;
            }
            let home = self.home(slot.key());
            // Offsets past the hole: `home` in `(hole, j]` iff its offset is at most `j`'s.
            let is_moving = wrap(home + len - hole - 1) > wrap(j + len - hole - 1);
            let written = if is_moving { slot } else { kept };
            self.slots[hole].store(written);
            hole = if is_moving { j } else { hole };
            kept = written;
        }
        self.slots[hole].store(Slot::default());
        self.len
            .store(self.len.load(Ordering::Relaxed) - 1, Ordering::Relaxed);
    }

    /// Removes `key`, returning its value (an owned table: shrinks in place when sparse).
    #[cfg(test)]
    pub(crate) fn remove(&mut self, key: u64) -> Option<u32> {
        let pos = self.locate(key)?;
        let val = self.value_at(pos);
        self.remove_at(pos);
        if self.is_sparse() {
            *self = self.resized();
        }
        Some(val)
    }

    /// Visits every entry.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.zero_value().map(|val| (0, val)).into_iter().chain(
            self.slots
                .iter()
                .map(AtomicSlot::load)
                .filter(|slot| !slot.is_empty())
                .map(|slot| (slot.key(), slot.val)),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn slot_is_twelve_bytes() {
        assert_eq!(std::mem::size_of::<AtomicSlot>(), 12);
    }

    #[test]
    fn zero_key_and_basic_ops() {
        let mut table = U64Table::new();
        assert_eq!(table.get(0), None);
        assert_eq!(table.insert(0, 7), None);
        assert_eq!(table.insert(5, 9), None);
        assert_eq!(table.insert(5, 10), Some(9));
        assert_eq!(table.get(0), Some(7));
        assert_eq!(table.len(), 2);
        assert_eq!(table.remove(0), Some(7));
        assert_eq!(table.remove(5), Some(10));
        assert_eq!(table.len(), 0);
    }

    #[test]
    fn removals_keep_every_other_key_reachable_at_high_load() {
        // Random 64-bit keys, removed and re-inserted in rounds that keep the load near the
        // 80 % limit, so runs are long and wrap around the end of the table.
        let mut state = 0x1234_5678_9abc_def0u64;
        let mut next_key = || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            state ^ (state >> 29)
        };
        let mut table = U64Table::new();
        let mut model = HashMap::new();
        for round in 0..20u32 {
            while model.len() < 4000 {
                let key = next_key() | 1;
                assert_eq!(table.insert(key, round), model.insert(key, round));
            }
            let doomed: Vec<u64> = model
                .keys()
                .copied()
                .filter(|k| (k >> 7) % 3 == 0)
                .collect();
            for key in doomed {
                assert_eq!(table.remove(key), model.remove(&key));
            }
            for (&key, &val) in &model {
                assert_eq!(table.get(key), Some(val));
            }
        }
    }

    proptest! {
        #[test]
        fn behaves_like_a_hash_map(ops in prop::collection::vec((0u8..4, 0u64..200, any::<u32>()), 0..2000)) {
            let mut table = U64Table::new();
            let mut model = HashMap::new();
            for (op, key, val) in ops {
                // Spread some keys over the high half so both halves of the slot key matter.
                let key = if key % 3 == 0 { key << 40 } else { key };
                match op {
                    0 => prop_assert_eq!(table.insert(key, val), model.insert(key, val)),
                    3 => {
                        let present = model.get(&key).copied();
                        prop_assert_eq!(table.insert_if_absent(key, val), present);
                        model.entry(key).or_insert(val);
                    }
                    1 => prop_assert_eq!(table.remove(key), model.remove(&key)),
                    _ => prop_assert_eq!(table.get(key), model.get(&key).copied()),
                }
                prop_assert_eq!(table.len(), model.len());
            }
            let mut entries: Vec<_> = table.iter().collect();
            entries.sort_unstable();
            let mut expected: Vec<_> = model.into_iter().collect();
            expected.sort_unstable();
            prop_assert_eq!(entries, expected);
        }
    }
}
