//! The prefix caches' byte bounds are what they really hold: the heap a full cache frees
//! when dropped is within 5 % of the bytes it reports, which stay within the bound. Its own test
//! binary, so that the counting allocator sees this test's allocations alone.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::alloc::System;

use kvmesh_kv::BlockHashCache;
use kvmesh_llm::openai::ChatCompletionRequest;
use kvmesh_llm::{ModelDir, PrefixCache};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

const TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/tiny");

#[global_allocator]
static ALLOCATOR: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn render(model: &ModelDir, messages: &[(&str, String)]) -> String {
    let messages: Vec<serde_json::Value> = messages
        .iter()
        .map(|(role, content)| serde_json::json!({"role": role, "content": content}))
        .collect();
    let request: ChatCompletionRequest =
        serde_json::from_value(serde_json::json!({"model": "tiny", "messages": messages})).unwrap();
    model
        .require_chat_template()
        .unwrap()
        .render_request(&request)
        .unwrap()
}

/// Heap bytes that `drop(value)` frees.
fn freed_by_dropping<T>(value: T) -> usize {
    let region = Region::new(ALLOCATOR);
    drop(value);
    let change = region.change();
    (change.bytes_deallocated as isize - change.bytes_allocated as isize - change.bytes_reallocated)
        as usize
}

/// Checks that a cache bounded at `bound` filled up, reported no more than its bound, and
/// freed within a twentieth of what it reported.
fn check(what: &str, bound: usize, reported: usize, held: usize) {
    assert!(
        reported <= bound,
        "{what}: reports {reported}, bound {bound}"
    );
    assert!(
        reported > bound * 3 / 4,
        "{what}: did not fill ({reported})"
    );
    assert!(
        held * 20 <= reported * 21 && reported * 20 <= held * 21,
        "{what}: reports {reported} bytes, holds {held}"
    );
}

/// Unique short chat prompts, as a random load sends: many small entries.
fn short_prompts(model: &ModelDir) -> Vec<String> {
    (0..6_000usize)
        .map(|n| {
            let text: Vec<&str> = (0..8)
                .map(|k| WORDS[(n * 7 + k * 3) % WORDS.len()])
                .collect();
            render(
                model,
                &[("user", format!("Request {n}: {}", text.join(" ")))],
            )
        })
        .collect()
}

/// Conversations growing turn by turn: fewer, larger entries sharing their pieces.
fn conversations(model: &ModelDir, count: usize) -> Vec<String> {
    let mut prompts = Vec::new();
    for c in 0..count {
        let mut history = vec![("system", format!("Conversation {c}. ").repeat(20))];
        for turn in 0..12usize {
            history.push(("user", format!("{} {turn} ", WORDS[turn % 7]).repeat(30)));
            prompts.push(render(model, &history));
            history.push(("assistant", "Noted. ".repeat(10)));
        }
    }
    prompts
}

const WORDS: [&str; 7] = [
    "alpha", "river", "stone", "engine", "planet", "mirror", "rocket",
];

#[test]
fn full_caches_hold_what_they_report_and_no_more_than_their_bound() {
    let model = ModelDir::load(TINY).unwrap();
    let bound = 1 << 20;
    for (load, prompts) in [
        ("short prompts", short_prompts(&model)),
        ("conversations", conversations(&model, 40)),
    ] {
        let cache = PrefixCache::new(bound);
        for prompt in &prompts {
            cache.encode(model.tokenizer(), prompt).unwrap();
        }
        let reported = cache.stats().bytes as usize;
        check(load, bound, reported, freed_by_dropping(cache));
    }

    // The block hashes of the same conversations, 4 tokens to a block.
    let tokenizing = PrefixCache::new(64 << 20);
    let hashing = BlockHashCache::new(bound / 4);
    for prompt in conversations(&model, 200) {
        let encoded = tokenizing
            .encode_with_cuts(model.tokenizer(), prompt)
            .unwrap();
        hashing.hash(&encoded.ids, &encoded.cuts, 4, 0);
    }
    let reported = hashing.stats().bytes as usize;
    check(
        "block hashes",
        bound / 4,
        reported,
        freed_by_dropping(hashing),
    );
}
