//! Member lists of nodes, packed into `u32` words that queries read while the writer edits them.
//!
//! A member entry is one `u32`: member id (26 bits), an alias flag and the tier mask (4 bits). A
//! node with one member keeps the entry inline in its `members` word; a node with more points
//! (high bit set) at a list in the shared word chunks, in size classes: class `c` lists hold
//! `4 << c` words, the first being the length. No per-list heap allocation, so a list of 2–3
//! members costs 16 bytes. Lists of class 2 and up (13 members and more) also keep a 64-bit
//! signature of their member set (XOR of hashed entries), so a query can tell that a long prefix
//! shared by hundreds of workers has the same members at every depth without comparing them.
//!
//! Edits keep every state a reader can observe meaningful: an entry is written before the length
//! that exposes it, a removal copies the last entry into the hole before shortening (a reader may
//! briefly see that entry twice, never miss another), and moving to another size class builds the
//! new list completely before the node's word switches to it. Lists that are no longer referenced
//! are retired and reused only after a grace period.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use super::layout::{WORD_CHUNK, word_in, word_run_in};
use super::nodes::{Store, mix};

/// Tier mask bits of an entry.
pub(crate) const TIER_MASK: u32 = 0xF;
/// Set when more than one engine hash of the member names this node (see `aliases`).
pub(crate) const ALIAS_BIT: u32 = 0x10;
/// Member id position inside an entry.
const ID_SHIFT: u32 = 5;
/// Largest member id an entry can carry.
pub(crate) const MAX_MEMBER_ID: u32 = (1 << 26) - 1;
/// Marks a `members` word that is a list handle rather than an inline entry.
const HANDLE_BIT: u32 = 1 << 31;
const CLASS_SHIFT: u32 = 26;
const OFFSET_MASK: u32 = (1 << CLASS_SHIFT) - 1;
/// Largest size class: its lists fill a whole word chunk.
const MAX_CLASS: u32 = WORD_CHUNK.trailing_zeros() - 2;

/// Builds an entry.
#[inline]
pub(crate) fn entry(member: u32, tiers: u32, is_alias: bool) -> u32 {
    (member << ID_SHIFT) | (u32::from(is_alias) * ALIAS_BIT) | (tiers & TIER_MASK)
}

/// Member id of an entry.
#[inline]
pub(crate) fn entry_member(entry: u32) -> u32 {
    entry >> ID_SHIFT
}

/// First class whose lists carry a signature.
const SIG_CLASS: u32 = 2;

#[inline]
fn words_per_list(class: u32) -> usize {
    4 << class
}

/// Words before a list's entries: the length, and the signature from [`SIG_CLASS`] on.
#[inline]
fn header(class: u32) -> usize {
    if class >= SIG_CLASS { 3 } else { 1 }
}

/// Entries a list of `class` holds.
#[inline]
fn capacity(class: u32) -> usize {
    words_per_list(class) - header(class)
}

/// An entry's share of a list signature.
#[inline]
fn sig_term(entry: u32) -> u64 {
    mix(u64::from(entry) | 0x5163_6967_0000_0000)
}

/// Class and first word of a list handle.
#[inline]
fn locate(handle: u32) -> (u32, usize) {
    let class = (handle & !HANDLE_BIT) >> CLASS_SHIFT;
    (class, ((handle & OFFSET_MASK) as usize) << 2)
}

/// The entries behind a node's `members` word, as the reader sees them.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Entries<'a> {
    /// No members.
    None,
    /// One inline entry.
    One(u32),
    /// A list's entries, with the list's signature when it keeps one.
    List(&'a [AtomicU32], Option<u64>),
}

impl<'a> Entries<'a> {
    /// Reads the entries of a `members` word loaded (with acquire) from a node, in `words` (a
    /// layout's word chunks).
    #[inline]
    pub(crate) fn of(words: &'a [Arc<[AtomicU32]>], word: u32) -> Self {
        if word == 0 {
            return Entries::None;
        }
        if word & HANDLE_BIT == 0 {
            return Entries::One(word);
        }
        let (class, start) = locate(word);
        let Some(header_words) = word_run_in(words, start, header(class)) else {
            return Entries::None;
        };
        let len = (header_words[0].load(Ordering::Acquire) as usize).min(capacity(class));
        let sig = (header_words.len() == 3).then(|| {
            u64::from(header_words[1].load(Ordering::Relaxed))
                | (u64::from(header_words[2].load(Ordering::Relaxed)) << 32)
        });
        match word_run_in(words, start + header(class), len) {
            Some(run) => Entries::List(run, sig),
            None => Entries::None,
        }
    }

    /// Number of entries.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        match self {
            Entries::None => 0,
            Entries::One(_) => 1,
            Entries::List(run, _) => run.len(),
        }
    }

    /// Entry `i` (`i < len`).
    #[inline]
    pub(crate) fn get(&self, i: usize) -> u32 {
        match self {
            Entries::None => 0,
            Entries::One(entry) => *entry,
            Entries::List(run, _) => run[i].load(Ordering::Relaxed),
        }
    }

    /// Every entry.
    #[inline]
    pub(crate) fn iter(self) -> impl Iterator<Item = u32> + 'a {
        (0..self.len()).map(move |i| self.get(i))
    }

    /// Whether both hold the same entries: compared by signature when both lists keep one
    /// (a set comparison, exact up to 64-bit collisions), entry by entry otherwise.
    #[inline]
    pub(crate) fn same_as(&self, other: &Entries<'_>) -> bool {
        match (self, other) {
            (Entries::One(a), Entries::One(b)) => a == b,
            (Entries::List(a, Some(sig_a)), Entries::List(b, Some(sig_b))) => {
                a.len() == b.len() && sig_a == sig_b
            }
            _ => self.len() == other.len() && (0..self.len()).all(|i| self.get(i) == other.get(i)),
        }
    }
}

/// Error returned when a node's list would outgrow the largest size class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ListFull;

/// The writer's list allocator.
#[derive(Debug, Default)]
pub(crate) struct Pool {
    /// Words handed out (lists never straddle a chunk).
    used: usize,
    /// Reusable list handles per class.
    free: Vec<Vec<u32>>,
    /// Unreferenced list handles awaiting a grace period.
    retired: Vec<u32>,
}

impl Pool {
    /// Heap bytes of the free lists (the words are counted with the layout).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.free.iter().map(|f| f.capacity() * 4).sum::<usize>()
            + self.free.capacity() * std::mem::size_of::<Vec<u32>>()
            + self.retired.capacity() * 4
    }

    /// Lists awaiting a grace period.
    pub(crate) fn num_retired(&self) -> usize {
        self.retired.len()
    }

    /// Makes retired lists reusable (after a grace period).
    pub(crate) fn recycle_retired(&mut self) {
        for handle in self.retired.drain(..) {
            let (class, _) = locate(handle);
            if self.free.len() <= class as usize {
                self.free.resize_with(class as usize + 1, Vec::new);
            }
            self.free[class as usize].push(handle);
        }
    }
}

impl Store {
    /// The entries of node `id`.
    #[inline]
    pub(crate) fn entries(&self, id: u32) -> Entries<'_> {
        Entries::of(&self.words, self.members_of(id))
    }

    /// Position of `member`'s entry in node `id`'s list.
    #[inline]
    pub(crate) fn position(&self, id: u32, member: u32) -> Option<usize> {
        self.find_entry(id, member).map(|(pos, _)| pos)
    }

    /// Position and value of `member`'s entry in node `id`'s list.
    #[inline]
    pub(crate) fn find_entry(&self, id: u32, member: u32) -> Option<(usize, u32)> {
        self.entries(id)
            .iter()
            .enumerate()
            .find(|&(_, e)| entry_member(e) == member)
    }

    /// Replaces the entry at `pos` (a single word: readers see the old or the new one).
    pub(crate) fn set_entry(&mut self, id: u32, pos: usize, value: u32) {
        let word = self.members_of(id);
        if word & HANDLE_BIT == 0 {
            self.node(id).members.store(value, Ordering::Release);
            return;
        }
        let (class, start) = locate(word);
        let at = start + header(class) + pos;
        let old = self.read_word(at);
        self.write_word(at, value);
        self.update_sig(class, start, sig_term(old) ^ sig_term(value));
    }

    /// Appends an entry.
    pub(crate) fn push_entry(&mut self, id: u32, value: u32) -> Result<(), ListFull> {
        let word = self.members_of(id);
        if word == 0 {
            self.node(id).members.store(value, Ordering::Release);
            return Ok(());
        }
        if word & HANDLE_BIT == 0 {
            return self.move_list(id, &[word, value], 0, None);
        }
        let (class, start) = locate(word);
        let len = self.list_len(start);
        if len < capacity(class) {
            self.write_word(start + header(class) + len, value);
            self.update_sig(class, start, sig_term(value));
            self.set_len(start, len + 1);
            return Ok(());
        }
        if class >= MAX_CLASS {
            return Err(ListFull);
        }
        let mut entries: Vec<u32> = self.entries(id).iter().collect();
        entries.push(value);
        self.move_list(id, &entries, class + 1, Some(word))
    }

    /// Removes the entry at `pos` (order is not kept).
    pub(crate) fn swap_remove_entry(&mut self, id: u32, pos: usize) {
        let word = self.members_of(id);
        if word & HANDLE_BIT == 0 {
            self.node(id).members.store(0, Ordering::Release);
            return;
        }
        let (class, start) = locate(word);
        let len = self.list_len(start);
        if pos >= len {
            return;
        }
        let first = start + header(class);
        let removed = self.read_word(first + pos);
        let last = self.read_word(first + len - 1);
        if pos + 1 < len {
            self.write_word(first + pos, last);
        }
        self.update_sig(class, start, sig_term(removed));
        let len = len - 1;
        self.set_len(start, len);
        if len == 1 {
            let only = self.read_word(first);
            self.node(id).members.store(only, Ordering::Release);
            self.pool.retired.push(word);
        } else if class > 0 && len < capacity(class) / 4 {
            let entries: Vec<u32> = self.entries(id).iter().collect();
            // A smaller class always has room for a quarter of this one.
            let _ = self.move_list(id, &entries, class - 1, Some(word));
        }
    }

    fn list_len(&self, start: usize) -> usize {
        self.read_word(start) as usize
    }

    /// Publishes a list length (release: the entries it exposes are written).
    fn set_len(&self, start: usize, len: usize) {
        if let Some(w) = word_in(&self.words, start) {
            w.store(len as u32, Ordering::Release);
        }
    }

    fn read_word(&self, i: usize) -> u32 {
        word_in(&self.words, i).map_or(0, |w| w.load(Ordering::Relaxed))
    }

    fn write_word(&self, i: usize, value: u32) {
        if let Some(w) = word_in(&self.words, i) {
            w.store(value, Ordering::Relaxed);
        }
    }

    /// XORs `delta` into a list's signature, if it keeps one.
    fn update_sig(&self, class: u32, start: usize, delta: u64) {
        if header(class) == 3 {
            let sig =
                u64::from(self.read_word(start + 1)) | (u64::from(self.read_word(start + 2)) << 32);
            let sig = sig ^ delta;
            self.write_word(start + 1, sig as u32);
            self.write_word(start + 2, (sig >> 32) as u32);
        }
    }

    /// Builds a list of `class` holding `entries`, points node `id` at it and retires `old`.
    fn move_list(
        &mut self,
        id: u32,
        entries: &[u32],
        class: u32,
        old: Option<u32>,
    ) -> Result<(), ListFull> {
        if entries.len() > capacity(class) {
            return Err(ListFull);
        }
        let handle = self.alloc_list(class);
        let (_, start) = locate(handle);
        for (i, &entry) in entries.iter().enumerate() {
            self.write_word(start + header(class) + i, entry);
        }
        if header(class) == 3 {
            let sig = entries.iter().fold(0u64, |sig, &e| sig ^ sig_term(e));
            self.write_word(start + 1, sig as u32);
            self.write_word(start + 2, (sig >> 32) as u32);
        }
        self.write_word(start, entries.len() as u32);
        // Release: the list is complete before the node points at it.
        self.node(id).members.store(handle, Ordering::Release);
        if let Some(old) = old {
            self.pool.retired.push(old);
        }
        Ok(())
    }

    fn alloc_list(&mut self, class: u32) -> u32 {
        if let Some(handle) = self.pool.free.get_mut(class as usize).and_then(Vec::pop) {
            return handle;
        }
        let size = words_per_list(class);
        let mut start = self.pool.used;
        if start % WORD_CHUNK + size > WORD_CHUNK {
            start = start.next_multiple_of(WORD_CHUNK);
        }
        self.pool.used = start + size;
        self.writer.ensure_words(self.pool.used);
        self.refresh();
        HANDLE_BIT | (class << CLASS_SHIFT) | ((start >> 2) as u32)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::radix::nodes::{ROOT, ROOT_KEY, child_key};

    /// Signature recomputed from a list's entries.
    fn expected_sig(entries: &[u32]) -> u64 {
        entries.iter().fold(0, |sig, &e| sig ^ sig_term(e))
    }

    proptest! {
        #[test]
        fn lists_behave_like_sets_with_signatures(
            ops in prop::collection::vec((0u8..3, 0usize..3, 0u32..200), 0..600),
        ) {
            let mut store = Store::default();
            let ids: Vec<u32> = (1..=3u64)
                .map(|t| store.find_or_insert(child_key(ROOT_KEY, t), ROOT, 1).expect("room").0)
                .collect();
            let mut models: [Vec<u32>; 3] = Default::default();
            for (op, which, value) in ops {
                let id = ids[which];
                let model = &mut models[which];
                let value = entry(value, 1 + value % 15, false);
                match op {
                    0 => {
                        prop_assert!(store.push_entry(id, value).is_ok());
                        model.push(value);
                    }
                    1 if !model.is_empty() => {
                        let pos = value as usize % model.len();
                        store.swap_remove_entry(id, pos);
                        model.swap_remove(pos);
                    }
                    _ if !model.is_empty() => {
                        let pos = value as usize % model.len();
                        store.set_entry(id, pos, value);
                        model[pos] = value;
                    }
                    _ => {}
                }
                for (k, &node) in ids.iter().enumerate() {
                    let entries = store.entries(node);
                    let listed: Vec<u32> = entries.iter().collect();
                    prop_assert_eq!(&listed, &models[k]);
                    if let Entries::List(_, Some(sig)) = entries {
                        prop_assert_eq!(sig, expected_sig(&models[k]));
                    }
                }
            }
        }
    }
}
