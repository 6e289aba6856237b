//! The nodes: every block position of the tree, found by a hash of its whole path.
//!
//! A node is found by looking up `path key = mix(parent path key) ^ tokens_hash` in a flat index
//! (`path key → node number`), never by following child pointers, so the lookups for every depth
//! of a query depend only on the query's hashes: they are independent memory loads the CPU
//! overlaps. Nodes live in an arena of 24-byte records with stable numbers. Freed numbers are
//! retired, and reused only after a grace period (see `epoch`), so a query never sees a record
//! change identity under it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::layout::{Layout, LayoutWriter, Node, Shared, node_in};
use super::pool::Pool;
use crate::table::U64Table;

/// Every field of a node, read at once (one arena access where the accessors take one each).
#[derive(Debug, Clone, Copy)]
pub(crate) struct NodeView {
    pub(crate) key: u64,
    pub(crate) parent: u32,
    pub(crate) depth: u32,
    pub(crate) children: u32,
    pub(crate) members: u32,
}

/// Parent number of depth-1 nodes (the root is not stored).
pub(crate) const ROOT: u32 = u32::MAX;
/// Path key of the root.
pub(crate) const ROOT_KEY: u64 = 0x6b76_6d65_7368_2f72;
/// Largest number of nodes: node numbers must fit the 28 bits a member lookup keeps for them.
pub(crate) const MAX_NODES: usize = 1 << 28;
/// Retired nodes and lists that trigger a grace period and their recycling.
const RECLAIM_AT: usize = 4096;

/// `depth` of a free record.
const FREE: u32 = 0;

/// Stands in for a node number the layout does not have (never written through).
static DETACHED: Node = Node {
    key: AtomicU64::new(0),
    parent: AtomicU32::new(ROOT),
    depth: AtomicU32::new(FREE),
    children: AtomicU32::new(0),
    members: AtomicU32::new(0),
};

/// Bijective 64-bit mixer (SplitMix64 finaliser).
#[inline]
pub(crate) fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Path key of the child reached from `parent_key` by a block with `tokens_hash`.
///
/// Children of one parent never collide (the map is a bijection in `tokens_hash`), and the
/// tokens hash is recovered from the two keys, so nodes need not store it.
#[inline]
pub(crate) fn child_key(parent_key: u64, tokens_hash: u64) -> u64 {
    mix(parent_key) ^ tokens_hash
}

/// Tokens hash of the node with `key` under the parent with `parent_key`.
#[inline]
pub(crate) fn tokens_hash_of(key: u64, parent_key: u64) -> u64 {
    key ^ mix(parent_key)
}

/// Error returned when the arena cannot grow past [`MAX_NODES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ArenaFull;

/// The writer's side of the shared memory: layout, node allocation and member lists.
#[derive(Debug, Default)]
pub(crate) struct Store {
    pub(super) writer: LayoutWriter,
    pub(super) pool: Pool,
    /// The current layout's chunks and index, mirrored here so the writer reaches a node or a
    /// word in two hops rather than four.
    pub(super) arena: Vec<Arc<[Node]>>,
    pub(super) words: Vec<Arc<[AtomicU32]>>,
    index: Arc<U64Table>,
    /// Arena records ever handed out.
    used: usize,
    free: Vec<u32>,
    retired: Vec<u32>,
    live: usize,
}

impl Store {
    /// The part readers use.
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        self.writer.shared()
    }

    /// The current layout.
    #[inline]
    pub(crate) fn layout(&self) -> &Layout {
        self.writer.layout()
    }

    /// Live nodes.
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// Heap bytes of the shared memory and the writer's free lists.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.layout().heap_bytes()
            + (self.free.capacity() + self.retired.capacity()) * 4
            + self.pool.heap_bytes()
    }

    /// Re-reads the mirrors after the writer published a new layout.
    pub(super) fn refresh(&mut self) {
        let layout = self.writer.layout();
        if self.arena.len() != layout.arena.len() {
            self.arena = layout.arena.clone();
        }
        if self.words.len() != layout.words.len() {
            self.words = layout.words.clone();
        }
        if !Arc::ptr_eq(&self.index, &layout.index) {
            self.index = Arc::clone(&layout.index);
        }
    }

    /// Node `id` (writer side: numbers it handed out).
    #[inline]
    pub(crate) fn node(&self, id: u32) -> &Node {
        node_in(&self.arena, id).unwrap_or(&DETACHED)
    }

    /// All fields of node `id`, read once.
    #[inline]
    pub(crate) fn view(&self, id: u32) -> NodeView {
        let node = self.node(id);
        NodeView {
            key: node.key.load(Ordering::Relaxed),
            parent: Node::get(&node.parent),
            depth: Node::get(&node.depth),
            children: Node::get(&node.children),
            members: Node::get(&node.members),
        }
    }

    /// Number of the live node with `key`.
    #[inline]
    pub(crate) fn find(&self, key: u64) -> Option<u32> {
        self.index.get(key)
    }

    /// Path key of node `id`, or of the root.
    #[inline]
    pub(crate) fn key_of(&self, id: u32) -> u64 {
        if id == ROOT {
            ROOT_KEY
        } else {
            self.node(id).key.load(Ordering::Relaxed)
        }
    }

    /// Depth of node `id` (0 for the root).
    #[inline]
    pub(crate) fn depth_of(&self, id: u32) -> u32 {
        if id == ROOT {
            0
        } else {
            Node::get(&self.node(id).depth)
        }
    }

    /// Parent of node `id`.
    #[inline]
    pub(crate) fn parent_of(&self, id: u32) -> u32 {
        Node::get(&self.node(id).parent)
    }

    /// Live children of node `id`.
    #[inline]
    pub(crate) fn children_of(&self, id: u32) -> u32 {
        Node::get(&self.node(id).children)
    }

    /// Member word of node `id`.
    #[inline]
    pub(crate) fn members_of(&self, id: u32) -> u32 {
        Node::get(&self.node(id).members)
    }

    /// Warm-up read of the index slot `key` would be found in.
    #[inline]
    pub(crate) fn touch_key(&self, key: u64) -> u32 {
        self.index.touch(key)
    }

    /// Warm-up read of node `id` and its index slot; returns the parent (or [`ROOT`]).
    #[inline]
    pub(crate) fn touch_node(&self, id: u32) -> u32 {
        match node_in(&self.arena, id) {
            Some(node) => {
                let key = node.key.load(Ordering::Relaxed);
                std::hint::black_box(self.index.touch(key));
                Node::get(&node.parent)
            }
            None => ROOT,
        }
    }

    /// The node with `key`, created under `parent` at `depth` if absent (bumping the parent's
    /// child count); `Ok((id, is_new))`.
    pub(crate) fn find_or_insert(
        &mut self,
        key: u64,
        parent: u32,
        depth: u32,
    ) -> Result<(u32, bool), ArenaFull> {
        // Prepare the record a new node would get (free or never used, so no reader sees it),
        // then insert-if-absent in one probe; the key store publishes the record.
        let candidate = match self.free.last() {
            Some(&id) => id,
            None if self.used < MAX_NODES => {
                self.writer.ensure_arena(self.used + 1);
                self.refresh();
                self.used as u32
            }
            None => return self.find(key).map(|id| (id, false)).ok_or(ArenaFull),
        };
        let node = self.node(candidate);
        node.key.store(key, Ordering::Relaxed);
        Node::set(&node.parent, parent);
        Node::set(&node.depth, depth);
        Node::set(&node.children, 0);
        Node::set(&node.members, 0);
        if self.index.is_full() {
            let grown = self.index.resized();
            self.writer.replace_index(grown);
            self.refresh();
        }
        if let Some(id) = self.index.insert_in_place(key, candidate, false) {
            Node::set(&self.node(candidate).depth, FREE);
            return Ok((id, false));
        }
        if self.free.pop().is_none() {
            self.used += 1;
        }
        if parent != ROOT {
            let children = &self.node(parent).children;
            Node::set(children, Node::get(children) + 1);
        }
        self.live += 1;
        Ok((candidate, true))
    }

    /// Frees node `id` (no members, no children) and returns its parent.
    pub(crate) fn free(&mut self, id: u32) -> u32 {
        let NodeView { key, parent, .. } = self.view(id);
        Node::set(&self.node(id).depth, FREE);
        if let Some(pos) = self.index.locate(key) {
            self.index.remove_at(pos);
        }
        if self.index.is_sparse() {
            let shrunk = self.index.resized();
            self.writer.replace_index(shrunk);
            self.refresh();
        }
        self.retired.push(id);
        self.live -= 1;
        if parent != ROOT {
            let children = &self.node(parent).children;
            Node::set(children, Node::get(children).saturating_sub(1));
        }
        parent
    }

    /// Numbers of every live node.
    pub(crate) fn live_ids(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.used as u32).filter(|&id| Node::get(&self.node(id).depth) != FREE)
    }

    /// Recycles retired nodes and lists once enough have piled up, after a grace period.
    pub(crate) fn maybe_reclaim(&mut self) {
        if self.retired.len() + self.pool.num_retired() < RECLAIM_AT {
            return;
        }
        self.shared().epochs.synchronize();
        self.free.append(&mut self.retired);
        self.pool.recycle_retired();
    }
}
