//! The prefix store's tests: lookups, extension, eviction, the bound and the split maps.

use super::*;

/// A stored prompt of the tests: its keys and, per key, the values before that cut.
struct Prompt {
    keys: Vec<u128>,
    lens: Vec<usize>,
    values: Vec<u32>,
}

impl PrefixEntry for Prompt {
    fn keys(&self) -> &[u128] {
        &self.keys
    }

    fn value_bytes(&self) -> usize {
        self.values.len() * 4
    }
}

fn prompt(keys: Vec<u128>, lens: &[usize], values: &[u32]) -> Prompt {
    Prompt {
        keys,
        lens: lens.to_vec(),
        values: values.to_vec(),
    }
}

fn keys(n: u128) -> Vec<u128> {
    (1..=n).collect()
}

/// What a test prompt costs beside its values and cuts.
const PER_ENTRY: usize = BYTES_PER_ENTRY + std::mem::size_of::<Prompt>();

/// What a one-shard key map with room for `cuts` costs.
fn key_map(cuts: usize) -> usize {
    ShardedMap::<u128, (u64, usize)>::table_bytes(cuts)
}

#[test]
fn longest_stored_cut_gives_the_values_before_it() {
    let store = PrefixStore::new(1 << 20);
    store.insert(prompt(keys(3), &[2, 4, 6], &[10, 11, 12, 13, 14, 15]));
    let hit = store.longest(&[1, 2, 99]).unwrap();
    assert_eq!((hit.cut, hit.index), (1, 1));
    assert_eq!(
        &hit.entry.values[..hit.entry.lens[hit.index]],
        &[10, 11, 12, 13]
    );
    assert!(store.longest(&[98, 99]).is_none());
    let found = store.find(3).unwrap();
    assert_eq!((found.cut, found.index), (0, 2));
    assert!(store.find(99).is_none());
    store.record(Some(4));
    store.record(None);
    let stats = store.stats();
    assert_eq!((stats.hits, stats.misses, stats.reused), (1, 1, 4));
    assert_eq!(stats.entries, 1);
}

#[test]
fn an_extending_prompt_replaces_the_one_it_extends() {
    let store = PrefixStore::new(1 << 20);
    store.insert(prompt(keys(2), &[1, 2], &[1, 2]));
    store.insert(prompt(keys(3), &[1, 2, 3], &[1, 2, 3]));
    assert_eq!(store.stats().entries, 1);
    assert_eq!(store.longest(&keys(3)).unwrap().index, 2);
    // The older cuts now find the extended prompt, and only its bytes are counted.
    let found = store.find(1).unwrap();
    assert_eq!((found.index, found.entry.values.len()), (0, 3));
    assert_eq!(
        store.stats().bytes as usize,
        3 * 4 + PER_ENTRY + store.lock().cuts.bytes(),
        "the replaced prompt's bytes are released"
    );
    // Repeating it changes nothing.
    store.insert(prompt(keys(3), &[1, 2, 3], &[1, 2, 3]));
    assert_eq!(store.stats().entries, 1);
    // A branch off the shared prefix is a second entry.
    store.insert(prompt(vec![1, 2, 77], &[1, 2, 3], &[1, 2, 9]));
    assert_eq!(store.stats().entries, 2);
    // So is a prompt sharing only a shorter prefix of a stored one.
    store.insert(prompt(vec![1, 55], &[1, 2], &[1, 5]));
    assert_eq!(store.stats().entries, 3);
}

#[test]
fn a_conversation_keeps_its_cuts_when_a_branch_sharing_them_is_evicted() {
    // Room for six cuts in two prompts.
    let bound = 6 * 4 + 2 * PER_ENTRY + key_map(7);
    let store = PrefixStore::new(bound);
    store.insert(prompt(keys(2), &[1, 2], &[1, 2]));
    // A branch sharing cut 1 takes that key's slot in the map.
    store.insert(prompt(vec![1, 50], &[1, 2], &[1, 5]));
    // The conversation grows past its own cuts, then is used, so the branch is older.
    store.insert(prompt(keys(4), &[1, 2, 3, 4], &[1, 2, 3, 4]));
    assert_eq!(store.longest(&keys(4)).unwrap().index, 3);
    // A third prompt needs room: the branch, least recently used, goes with its keys.
    store.insert(prompt(vec![900], &[1], &[9]));
    assert!(store.find(50).is_none());
    // The shared cut may have gone with the branch; the conversation's next turn holds it.
    store.insert(prompt(keys(5), &[1, 2, 3, 4, 5], &[1, 2, 3, 4, 5]));
    assert_eq!(store.find(1).unwrap().entry.values.len(), 5);
    for key in 2..=5u128 {
        let found = store.find(key).expect("the conversation's own cuts stay");
        assert_eq!(found.index as u128, key - 1);
        assert_eq!(found.entry.values.len(), 5);
    }
    assert!(store.stats().bytes as usize <= bound);
}

#[test]
fn a_prompt_keeps_the_cuts_it_shares_when_its_own_growth_evicts_their_owner() {
    // A conversation holds cuts 1 and 2; a branch takes cut 1 in the key map. The next turn
    // extends the conversation with three cuts, which grow the key map (room for 3 → 7)
    // past the bound, so the branch, least recently used, is evicted after the turn is
    // stored, and takes cut 1 with it.
    let bound = 2 * 4 + 5 * 4 + 2 * PER_ENTRY + key_map(3) + 50;
    assert!(bound < 2 * 4 + 5 * 4 + 2 * PER_ENTRY + key_map(7));
    let store = PrefixStore::new(bound);
    store.insert(prompt(keys(2), &[1, 2], &[1, 2]));
    store.insert(prompt(vec![1, 50], &[1, 2], &[1, 5]));
    store.insert(prompt(keys(5), &[1, 2, 3, 4, 5], &[1, 2, 3, 4, 5]));
    assert_eq!(store.stats().entries, 1);
    assert!(store.find(50).is_none());
    let shared = store.find(1).expect("the conversation holds cut 1 too");
    assert_eq!((shared.index, shared.entry.values.len()), (0, 5));
    assert!(store.stats().bytes as usize <= bound);
}

#[test]
fn stays_within_its_bound_evicting_the_least_recently_used() {
    let per_entry = 100 * 4 + PER_ENTRY;
    let bound = 3 * per_entry + key_map(7);
    let store = PrefixStore::new(bound);
    for key in 0..10u128 {
        store.insert(prompt(vec![key * 1000], &[100], &[7; 100]));
        if key >= 1 {
            // Keep prompt 0 recently used.
            assert!(store.longest(&[0]).is_some());
        }
        assert!(store.stats().bytes as usize <= bound);
    }
    assert!(store.find(0).is_some());
    assert!(store.find(1000).is_none());
    assert_eq!(store.stats().entries, 3);
}

#[test]
fn filling_up_never_grows_one_map_by_more_than_a_small_part_of_the_store() {
    // Growing a map moves all it holds under the store's lock; the store splits its maps so
    // that no single map holds more than a few times its even share.
    let store = PrefixStore::new(1 << 30);
    let mut key = 0u128;
    for _ in 0..50_000 {
        let keys = (0..3)
            .map(|_| {
                key = key.wrapping_add(0x2545_F491_4F6C_DD1D_9E37_79B9_7F4A_7C15);
                key
            })
            .collect();
        store.insert(prompt(keys, &[1, 2, 3], &[1, 2, 3]));
    }
    let state = store.lock();
    assert_eq!((state.cuts.len(), state.entries.len()), (150_000, 50_000));
    let even = |n: usize| n / sharded_map::MAX_SHARDS;
    assert!(state.cuts.largest_shard() < 2 * even(150_000));
    // Entries sit in a slab, which grows a chunk at a time.
}

#[test]
fn a_prompt_over_the_bound_or_a_zero_bound_stores_nothing() {
    let store = PrefixStore::new(64);
    store.insert(prompt(vec![1], &[100], &[0; 100]));
    assert_eq!(store.stats().entries, 0);
    let off = PrefixStore::new(0);
    assert!(!off.is_enabled());
    off.insert(prompt(vec![1], &[1], &[0]));
    assert!(off.find(1).is_none());
}
