//! The memory queries read: node arena, member-list words, member infos and the path-key index,
//! shared between one writer and any number of lock-free readers.
//!
//! Everything a query reads is an atomic in a chunk that never moves. The chunks and the index
//! table are reached through a [`Layout`] that the writer replaces (never mutates) when it adds a
//! chunk or resizes the index, publishing it through an `ArcSwap`; a query loads the current
//! layout once and can use every chunk in it until it finishes. Relaxed atomic loads and stores
//! compile to plain moves, so the writer pays nothing for this; publication points (a node made
//! findable, a member list swapped in) use release/acquire pairs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use arc_swap::ArcSwap;

use super::epoch::Epochs;
use crate::table::U64Table;

/// Nodes per arena chunk (96 KiB): a power of two so locating a node is a shift and a mask.
const ARENA_BITS: u32 = 12;

/// Node `id` in a list of arena chunks.
#[inline]
pub(crate) fn node_in(arena: &[Arc<[Node]>], id: u32) -> Option<&Node> {
    let id = id as usize;
    arena
        .get(id >> ARENA_BITS)
        .and_then(|chunk| chunk.get(id & ((1 << ARENA_BITS) - 1)))
}

/// Words `start..start + len` (within one chunk) in a list of word chunks.
#[inline]
pub(crate) fn word_run_in(
    words: &[Arc<[AtomicU32]>],
    start: usize,
    len: usize,
) -> Option<&[AtomicU32]> {
    let chunk = words.get(start / WORD_CHUNK)?;
    let offset = start % WORD_CHUNK;
    chunk.get(offset..offset + len)
}

/// Word `i` in a list of word chunks.
#[inline]
pub(crate) fn word_in(words: &[Arc<[AtomicU32]>], i: usize) -> Option<&AtomicU32> {
    words
        .get(i / WORD_CHUNK)
        .and_then(|chunk| chunk.get(i % WORD_CHUNK))
}
/// Member-list words per chunk; a list never straddles two.
pub(crate) const WORD_CHUNK: usize = 1 << 16;
/// Member infos per chunk.
const INFO_CHUNK: usize = 1 << 10;

/// One block position (24 bytes). Only the writer stores; readers load `key`, `parent` and
/// `members`.
#[derive(Debug, Default)]
pub(crate) struct Node {
    /// Path key.
    pub(crate) key: AtomicU64,
    /// Number of the parent, or [`super::nodes::ROOT`].
    pub(crate) parent: AtomicU32,
    /// Blocks from the root, 1-based; 0 marks a free record.
    pub(crate) depth: AtomicU32,
    /// Live child nodes; a node is freed once it has neither members nor children.
    pub(crate) children: AtomicU32,
    /// Member list: 0, one inline entry, or a list handle (see `pool`).
    pub(crate) members: AtomicU32,
}

impl Node {
    /// Relaxed load of a writer-owned field.
    #[inline]
    pub(crate) fn get(field: &AtomicU32) -> u32 {
        field.load(Ordering::Relaxed)
    }

    /// Relaxed store of a writer-owned field.
    #[inline]
    pub(crate) fn set(field: &AtomicU32, value: u32) {
        field.store(value, Ordering::Relaxed);
    }
}

/// What a query needs of a member to write its row.
#[derive(Debug, Default)]
pub(crate) struct MemberInfo {
    pub(crate) worker_id: AtomicU64,
    pub(crate) num_blocks: AtomicU64,
    pub(crate) dp_rank: AtomicU32,
}

/// One published arrangement of the shared memory (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Layout {
    /// Path key → node number.
    pub(crate) index: Arc<U64Table>,
    pub(crate) arena: Vec<Arc<[Node]>>,
    pub(crate) words: Vec<Arc<[AtomicU32]>>,
    pub(crate) infos: Vec<Arc<[MemberInfo]>>,
}

impl Layout {
    /// Node `id`, if this layout has its chunk.
    #[inline]
    pub(crate) fn node(&self, id: u32) -> Option<&Node> {
        node_in(&self.arena, id)
    }

    /// Info of member `id`, if this layout has its chunk.
    #[inline]
    pub(crate) fn info(&self, id: u32) -> Option<&MemberInfo> {
        self.infos
            .get(id as usize / INFO_CHUNK)
            .and_then(|chunk| chunk.get(id as usize % INFO_CHUNK))
    }

    /// Arena slots allocated.
    pub(crate) fn arena_capacity(&self) -> usize {
        self.arena.len() << ARENA_BITS
    }

    /// Heap bytes of every chunk and the index.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.arena_capacity() * std::mem::size_of::<Node>()
            + self.words.len() * WORD_CHUNK * 4
            + self.infos.len() * INFO_CHUNK * std::mem::size_of::<MemberInfo>()
            + self.index.heap_bytes()
            + (self.arena.capacity() + self.words.capacity() + self.infos.capacity()) * 16
    }

    fn copy(&self) -> Layout {
        Layout {
            index: Arc::clone(&self.index),
            arena: self.arena.clone(),
            words: self.words.clone(),
            infos: self.infos.clone(),
        }
    }
}

/// What a writer shares with its readers.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    pub(crate) layout: ArcSwap<Layout>,
    pub(crate) epochs: Epochs,
    /// Member ids handed out so far (ids are never reused).
    pub(crate) members: AtomicU32,
}

/// The writer's handle on the shared memory: the current layout and how to replace it.
#[derive(Debug)]
pub(crate) struct LayoutWriter {
    shared: Arc<Shared>,
    current: Arc<Layout>,
}

impl Default for LayoutWriter {
    fn default() -> Self {
        let shared = Arc::new(Shared::default());
        let current = shared.layout.load_full();
        Self { shared, current }
    }
}

impl LayoutWriter {
    /// The shared part, for readers.
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The current layout.
    #[inline]
    pub(crate) fn layout(&self) -> &Layout {
        &self.current
    }

    fn publish(&mut self, layout: Layout) {
        let layout = Arc::new(layout);
        self.shared.layout.store(Arc::clone(&layout));
        self.current = layout;
    }

    /// Makes arena slots `0..len` exist.
    pub(crate) fn ensure_arena(&mut self, len: usize) {
        if self.current.arena_capacity() >= len {
            return;
        }
        let mut layout = self.current.copy();
        while layout.arena_capacity() < len {
            layout
                .arena
                .push((0..1 << ARENA_BITS).map(|_| Node::default()).collect());
        }
        self.publish(layout);
    }

    /// Makes list words `0..len` exist.
    pub(crate) fn ensure_words(&mut self, len: usize) {
        if self.current.words.len() * WORD_CHUNK >= len {
            return;
        }
        let mut layout = self.current.copy();
        while layout.words.len() * WORD_CHUNK < len {
            layout
                .words
                .push((0..WORD_CHUNK).map(|_| AtomicU32::new(0)).collect());
        }
        self.publish(layout);
    }

    /// Makes member infos `0..len` exist.
    pub(crate) fn ensure_infos(&mut self, len: usize) {
        if self.current.infos.len() * INFO_CHUNK >= len {
            return;
        }
        let mut layout = self.current.copy();
        while layout.infos.len() * INFO_CHUNK < len {
            layout
                .infos
                .push((0..INFO_CHUNK).map(|_| MemberInfo::default()).collect());
        }
        self.publish(layout);
    }

    /// Publishes a resized index table.
    pub(crate) fn replace_index(&mut self, index: U64Table) {
        let mut layout = self.current.copy();
        layout.index = Arc::new(index);
        self.publish(layout);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_is_24_bytes() {
        assert_eq!(std::mem::size_of::<Node>(), 24);
    }

    #[test]
    fn writers_publish_what_readers_see() {
        let mut writer = LayoutWriter::default();
        writer.ensure_arena(1000);
        writer.ensure_words(10);
        writer.ensure_infos(3);
        let layout = writer.shared().layout.load();
        assert!(layout.node(999).is_some());
        assert!(word_in(&layout.words, WORD_CHUNK - 1).is_some());
        assert!(word_in(&layout.words, WORD_CHUNK).is_none());
        assert!(layout.info(1023).is_some());
        assert!(layout.arena_capacity() >= 1000);
    }
}
