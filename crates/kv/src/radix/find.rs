//! `find_matches`: tier-aware prefix matching over the path-keyed nodes.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::RadixIndex;
use super::epoch::ReadGuard;
use super::layout::{Layout, Shared};
use super::nodes::{ROOT, ROOT_KEY, child_key};
use super::pool::{Entries, TIER_MASK, entry_member};
use crate::events::WorkerKey;
use crate::scores::{MemberScore, OverlapScores, add_frequencies};

/// A member that matched the first block of the query.
#[derive(Debug, Clone, Copy)]
struct Active {
    member: u32,
    /// Tier whose run the member is in (0 = device).
    phase: u32,
    /// `ends[t]`: depth at which the run of tier `t` ended (cumulative).
    ends: [u32; 4],
    /// Blocks matched, once the member dropped out.
    end: u32,
    /// Last depth whose node listed the member, and its tiers there.
    seen: u32,
    tiers: u32,
}

/// Lanes whose node-index lookups one query overlaps (see [`find_into`]).
const GROUP: usize = 4;

/// Per-thread buffers reused across queries so a query allocates only its answer.
#[derive(Debug, Default)]
struct Scratch {
    keys: Vec<u64>,
    slots: Vec<u32>,
    /// Member word of each matched depth's node, per lane of the group.
    words: [Vec<u32>; GROUP],
    /// Query generation that last touched each member id.
    stamp: Vec<u32>,
    /// Index into `active` of each member id touched in this generation.
    pos: Vec<u32>,
    generation: u32,
    active: Vec<Active>,
    alive: Vec<u32>,
    next_alive: Vec<u32>,
    frequencies: Vec<u32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

impl RadixIndex {
    /// For the sequence of local (tokens) hashes, the leading blocks each member holds, per tier,
    /// with per-depth frequencies (docs/indexer.md, "Matching"). Runs on the caller's thread;
    /// allocation-free apart from the answer.
    pub fn find_matches(&self, local_hashes: &[u64]) -> OverlapScores {
        let mut out = OverlapScores::default();
        find_into(
            std::slice::from_ref(self.store.shared()),
            local_hashes,
            &mut out,
        );
        out.sort();
        out
    }
}

/// Appends the rows of the indexes behind `shareds` to `out` (unsorted) and adds their
/// frequencies; lanes and shards over disjoint members accumulate into one answer this way.
/// Lock-free: safe to run while the indexes' writers apply events (see `layout` and `epoch`).
///
/// Up to [`GROUP`] indexes are walked together: each window of depths is touched in every one's
/// node index before any is probed, so the cache misses of all of them are in flight at once
/// instead of one index after the other.
pub(crate) fn find_into(shareds: &[Arc<Shared>], local_hashes: &[u64], out: &mut OverlapScores) {
    for group in shareds.chunks(GROUP) {
        // Per index, as for one: register, then load the layout, then the member bound.
        let _reading: [Option<ReadGuard<'_>>; GROUP] =
            std::array::from_fn(|i| group.get(i).map(|shared| shared.epochs.enter()));
        let guards: [Option<arc_swap::Guard<Arc<Layout>>>; GROUP] =
            std::array::from_fn(|i| group.get(i).map(|shared| shared.layout.load()));
        let bounds: [usize; GROUP] = std::array::from_fn(|i| {
            group
                .get(i)
                .map_or(0, |shared| shared.members.load(Ordering::Acquire) as usize)
        });
        let mut layouts: [&Layout; GROUP] = [&EMPTY_LAYOUT; GROUP];
        for (layout, guard) in layouts.iter_mut().zip(&guards) {
            if let Some(guard) = guard {
                *layout = guard;
            }
        }
        let layouts = &layouts[..group.len()];
        SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut scratch) => find_group(layouts, &bounds, local_hashes, &mut scratch, out),
            Err(_) => find_group(layouts, &bounds, local_hashes, &mut Scratch::default(), out),
        });
    }
}

/// Stands in for the layouts a group of fewer than [`GROUP`] indexes does not have.
static EMPTY_LAYOUT: std::sync::LazyLock<Layout> = std::sync::LazyLock::new(Layout::default);

/// Walks the path of the query in every layout of the group, then answers for each.
fn find_group(
    layouts: &[&Layout],
    bounds: &[usize; GROUP],
    hashes: &[u64],
    scratch: &mut Scratch,
    out: &mut OverlapScores,
) {
    path_of(layouts, hashes, scratch);
    for (lane, layout) in layouts.iter().enumerate() {
        find_with(layout, bounds[lane], lane, scratch, out);
    }
}

/// The member word of the node of every depth of the query that exists and hangs together, in
/// `scratch.words[lane]` for the layout of each lane.
///
/// Keys depend only on the query, so the lookups of many depths (and of every lane) can be in
/// flight at once: each window of depths is first touched in every lane still matching without
/// branching on the data (all its cache misses in flight together), then probed from cache, then
/// its nodes are checked. Windows double in size, so a short match wastes few lookups past its
/// end and a long one still overlaps many.
fn path_of(layouts: &[&Layout], hashes: &[u64], scratch: &mut Scratch) {
    let Scratch {
        keys, slots, words, ..
    } = scratch;
    keys.clear();
    let mut parents = [ROOT; GROUP];
    let mut is_matching = [false; GROUP];
    for lane in 0..layouts.len() {
        words[lane].clear();
        is_matching[lane] = true;
    }
    let mut key = ROOT_KEY;
    let mut start = 0;
    let mut window = 8;
    while start < hashes.len() {
        let end = (start + window).min(hashes.len());
        window *= 2;
        for &hash in &hashes[start..end] {
            key = child_key(key, hash);
            keys.push(key);
        }
        let mut sink = 0u32;
        for (layout, _) in layouts.iter().zip(is_matching).filter(|(_, on)| *on) {
            for &key in &keys[start..end] {
                sink ^= layout.index.touch(key);
            }
        }
        std::hint::black_box(sink);
        let mut is_any = false;
        for (lane, layout) in layouts.iter().enumerate() {
            if is_matching[lane] {
                is_matching[lane] = extend_path(
                    layout,
                    &keys[start..end],
                    &mut parents[lane],
                    slots,
                    &mut words[lane],
                );
                is_any |= is_matching[lane];
            }
        }
        if !is_any {
            return;
        }
        start = end;
    }
}

/// Probes a window of (touched) path keys in `layout` and appends the member words of the nodes
/// that continue the path from `parent`; false once the path ends inside the window.
fn extend_path(
    layout: &Layout,
    keys: &[u64],
    parent: &mut u32,
    slots: &mut Vec<u32>,
    words: &mut Vec<u32>,
) -> bool {
    slots.clear();
    for &key in keys {
        match layout.index.get(key) {
            Some(id) => slots.push(id),
            None => break,
        }
    }
    // Each node must carry the key probed for (a concurrent move can tear a slot), be the
    // previous one's child (a colliding key cannot extend a match) and have members.
    for (&id, &key) in slots.iter().zip(keys) {
        let Some(node) = layout.node(id) else {
            return false;
        };
        let members = node.members.load(Ordering::Acquire);
        if node.key.load(Ordering::Relaxed) != key
            || node.parent.load(Ordering::Relaxed) != *parent
            || members == 0
        {
            return false;
        }
        words.push(members);
        *parent = id;
    }
    slots.len() == keys.len()
}

/// Answers for one lane of the group from the path `path_of` left in `scratch.words[lane]`.
fn find_with(
    layout: &Layout,
    member_bound: usize,
    lane: usize,
    scratch: &mut Scratch,
    out: &mut OverlapScores,
) {
    let Some(&first_word) = scratch.words[lane].first() else {
        return;
    };
    scratch.generation = scratch.generation.wrapping_add(1);
    if scratch.generation == 0 {
        scratch.stamp.iter_mut().for_each(|stamp| *stamp = 0);
        scratch.generation = 1;
    }
    let generation = scratch.generation;
    if scratch.stamp.len() < member_bound {
        scratch.stamp.resize(member_bound, 0);
        scratch.pos.resize(member_bound, 0);
    }
    let Scratch {
        words: lane_words,
        stamp,
        pos,
        active,
        alive,
        next_alive,
        frequencies,
        ..
    } = scratch;
    let words = &lane_words[lane];
    active.clear();
    alive.clear();
    frequencies.clear();

    let mut prev = Entries::of(&layout.words, first_word);
    for e in prev.iter() {
        let member = entry_member(e) as usize;
        // Ids past the bound the query started with, or listed twice while the writer moves an
        // entry, are skipped.
        if member >= stamp.len() || stamp[member] == generation {
            continue;
        }
        stamp[member] = generation;
        pos[member] = active.len() as u32;
        alive.push(active.len() as u32);
        active.push(Active {
            member: member as u32,
            phase: (e & TIER_MASK).trailing_zeros().min(3),
            ends: [0; 4],
            end: 0,
            seen: 0,
            tiers: 0,
        });
    }
    frequencies.push(alive.len() as u32);

    for (depth, &word) in words.iter().enumerate().skip(1) {
        let depth = depth as u32;
        let current = Entries::of(&layout.words, word);
        if current.same_as(&prev) {
            // Same members with the same tiers: everyone still matching goes on unchanged
            // (the common case along a shared prefix or a single member's chain).
            frequencies.push(alive.len() as u32);
            continue;
        }
        for e in current.iter() {
            let member = entry_member(e) as usize;
            if member < stamp.len() && stamp[member] == generation {
                let state = &mut active[pos[member] as usize];
                state.seen = depth;
                state.tiers = e & TIER_MASK;
            }
        }
        next_alive.clear();
        for &index in alive.iter() {
            let state = &mut active[index as usize];
            if state.seen != depth || state.tiers == 0 {
                state.end = depth;
                continue;
            }
            if state.tiers & ((2u32 << state.phase) - 1) == 0 {
                // Not held in this tier or a faster one: the run moves to the fastest tier that
                // holds it (slower than the current one, as no faster bit is set).
                let next = state.tiers.trailing_zeros();
                for end in &mut state.ends[state.phase as usize..next as usize] {
                    *end = depth;
                }
                state.phase = next;
            }
            next_alive.push(index);
        }
        std::mem::swap(alive, next_alive);
        if alive.is_empty() {
            break;
        }
        frequencies.push(alive.len() as u32);
        prev = current;
    }
    let matched = words.len() as u32;
    for &index in alive.iter() {
        active[index as usize].end = matched;
    }

    out.scores.reserve(active.len());
    for state in active.iter() {
        let Some(info) = layout.info(state.member) else {
            continue;
        };
        let mut ends = state.ends;
        for value in &mut ends[state.phase as usize..] {
            *value = state.end;
        }
        out.scores.push(MemberScore {
            worker: WorkerKey::new(
                info.worker_id.load(Ordering::Relaxed),
                info.dp_rank.load(Ordering::Relaxed),
            ),
            device: ends[0],
            host_pinned: ends[1] - ends[0],
            disk: ends[2] - ends[1],
            external: ends[3] - ends[2],
            tree_size: info.num_blocks.load(Ordering::Relaxed),
        });
    }
    add_frequencies(&mut out.frequencies, frequencies);
}
