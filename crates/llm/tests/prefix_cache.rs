//! The prompt prefix cache gives exactly the whole prompt's tokenization: conversations
//! rendered by the shipped model's real chat template, turn by turn, with both engines; it stays
//! within its byte bound under churn and is shared safely by concurrent requests.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::sync::Arc;

use kvmesh_llm::openai::ChatCompletionRequest;
use kvmesh_llm::{ModelDir, PrefixCache, Tokenizer, TokenizerEngine};
use proptest::prelude::*;

const TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/tiny");

/// Pieces messages are made of: prose, code, CJK, emoji, whitespace and special literals.
const PIECES: [&str; 12] = [
    "The quick brown fox",
    " jumps over the lazy dog.",
    "fn main() { println!(\"hi\"); }\n",
    "東京は日本の首都です。",
    "😀🎉👍🏽",
    "\n\n",
    "  spaced   out  ",
    "<|im_end|>",
    "<|im_start|>assistant",
    "<|endoftext|>",
    "it's 12,345.67!",
    "\t\r\n",
];

fn render(model: &ModelDir, messages: &[(String, String)], add_generation_prompt: bool) -> String {
    let messages: Vec<serde_json::Value> = messages
        .iter()
        .map(|(role, content)| serde_json::json!({"role": role, "content": content}))
        .collect();
    let request: ChatCompletionRequest = serde_json::from_value(serde_json::json!({
        "model": "tiny",
        "messages": messages,
        "add_generation_prompt": add_generation_prompt,
    }))
    .unwrap();
    model
        .require_chat_template()
        .unwrap()
        .render_request(&request)
        .unwrap()
}

fn message_strategy() -> impl Strategy<Value = String> {
    proptest::collection::vec(0..PIECES.len(), 0..8)
        .prop_map(|picks| picks.into_iter().map(|i| PIECES[i]).collect::<String>())
}

fn conversation_strategy() -> impl Strategy<Value = Vec<String>> {
    proptest::collection::vec(message_strategy(), 1..10)
}

/// Feeds a conversation turn by turn (each prompt re-sends the history) and checks each
/// prompt's ids against the whole-prompt encoding, and its cut points against those an empty
/// cache finds.
fn check_conversation(model: &ModelDir, cache: &PrefixCache, turns: &[String]) {
    let mut history = vec![("system".to_string(), "You are terse.".to_string())];
    for (i, content) in turns.iter().enumerate() {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        history.push((role.to_string(), content.clone()));
        let prompt = render(model, &history, role == "user");
        let expected = model.tokenizer().encode(&prompt, false).unwrap();
        let got = cache.encode_with_cuts(model.tokenizer(), &prompt).unwrap();
        assert_eq!(got.ids, expected, "prompt {prompt:?}");
        let fresh = PrefixCache::new(1 << 24)
            .encode_with_cuts(model.tokenizer(), &prompt)
            .unwrap();
        assert_eq!(got.cuts, fresh.cuts, "prompt {prompt:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn cached_prefixes_give_the_whole_prompts_ids(
        conversations in proptest::collection::vec(conversation_strategy(), 1..4),
    ) {
        for engine in [TokenizerEngine::Default, TokenizerEngine::Fastokens] {
            let model = ModelDir::load_with(TINY, engine).unwrap();
            let cache = PrefixCache::new(1 << 20);
            for conversation in &conversations {
                check_conversation(&model, &cache, conversation);
            }
            // Every conversation again, now from a warm cache.
            for conversation in &conversations {
                check_conversation(&model, &cache, conversation);
            }
        }
    }
}

#[test]
fn a_later_turn_reuses_the_earlier_turns_tokens() {
    let model = ModelDir::load(TINY).unwrap();
    let cache = PrefixCache::new(1 << 20);
    let long: String = PIECES.iter().cycle().take(400).copied().collect();
    let mut history = vec![("user".to_string(), long)];
    let first = render(&model, &history, true);
    cache.encode(model.tokenizer(), &first).unwrap();
    assert_eq!(cache.stats().misses, 1);
    history.push(("assistant".into(), "Sure.".into()));
    history.push(("user".into(), "And then?".into()));
    let second = render(&model, &history, true);
    let ids = cache.encode(model.tokenizer(), &second).unwrap();
    let stats = cache.stats();
    assert_eq!(stats.hits, 1);
    assert!(
        stats.reused as usize * 10 > ids.len() * 9,
        "{stats:?} of {}",
        ids.len()
    );
    // The extended prompt replaced the one it extends.
    assert_eq!(stats.entries, 1);
}

#[test]
fn the_cache_stays_within_its_byte_bound_under_churn() {
    let model = ModelDir::load(TINY).unwrap();
    let max_bytes = 16 * 1024;
    let cache = PrefixCache::new(max_bytes);
    for n in 0..300usize {
        let content: String = (0..(n % 40) + 1)
            .map(|k| PIECES[(n * 7 + k * 3) % PIECES.len()])
            .collect();
        let prompt = render(&model, &[("user".into(), format!("{n}: {content}"))], true);
        let expected = model.tokenizer().encode(&prompt, false).unwrap();
        assert_eq!(cache.encode(model.tokenizer(), &prompt).unwrap(), expected);
        assert!(
            cache.stats().bytes as usize <= max_bytes,
            "{:?}",
            cache.stats()
        );
    }
    assert!(cache.stats().entries > 1);
}

#[test]
fn concurrent_requests_share_the_cache_safely() {
    let model = Arc::new(ModelDir::load_with(TINY, TokenizerEngine::Fastokens).unwrap());
    let cache = Arc::new(PrefixCache::new(256 * 1024));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (model, cache) = (model.clone(), cache.clone());
            std::thread::spawn(move || {
                for round in 0..20usize {
                    // Two threads share each conversation, so they race on its entries.
                    let turns: Vec<String> = (0..(round % 6) + 1)
                        .map(|k| PIECES[(t % 2 + k * 5 + round) % PIECES.len()].repeat(k + 1))
                        .collect();
                    check_conversation(&model, &cache, &turns);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert!(cache.stats().hits > 0);
}

/// Checks each text's ids and cuts from `cache` against the whole-text encoding and an empty
/// cache's cuts.
fn check_texts(tokenizer: &Tokenizer, cache: &PrefixCache, texts: &[String]) {
    for text in texts {
        let got = cache.encode_with_cuts(tokenizer, text).unwrap();
        assert_eq!(got.ids, tokenizer.encode(text, false).unwrap(), "{text:?}");
        let fresh = PrefixCache::new(1 << 20)
            .encode_with_cuts(tokenizer, text)
            .unwrap();
        assert_eq!(got.cuts, fresh.cuts, "{text:?}");
    }
}

#[test]
fn a_stored_cut_is_not_taken_where_a_longer_token_matches_the_new_text() {
    // `<x>` and `<x>y` are both special: a prompt that stored a cut after `<x>z` shares the
    // text up to that cut with one that goes on `<x>y`, where the longer token matches instead.
    let mut inner = tokenizers::Tokenizer::from_file(format!("{TINY}/tokenizer.json")).unwrap();
    inner
        .add_special_tokens([
            tokenizers::AddedToken::from("<x>", true),
            tokenizers::AddedToken::from("<x>y", true),
        ])
        .unwrap();
    let tokenizer = Tokenizer::new(inner);
    let cache = PrefixCache::new(1 << 20);
    let body = "The quick brown fox. ".repeat(20);
    let texts: Vec<String> = ["<x>zz", "<x>yz", "<x>y", "<x>", "<x>zz<|im_end|>"]
        .iter()
        .map(|tail| format!("<|im_start|>{body}{tail}<|im_end|>\nend"))
        .collect();
    check_texts(&tokenizer, &cache, &texts);
    assert!(cache.stats().hits >= 4, "{:?}", cache.stats());
}

#[test]
fn conversations_sharing_a_system_prompt_each_find_their_own_history() {
    let model = ModelDir::load(TINY).unwrap();
    let cache = PrefixCache::new(1 << 22);
    let system = ("system".to_string(), PIECES.concat().repeat(5));
    let mut conversations: Vec<Vec<(String, String)>> = (0..6)
        .map(|c| vec![system.clone(), ("user".into(), format!("conversation {c}"))])
        .collect();
    for turn in 0..4 {
        for (c, history) in conversations.iter_mut().enumerate() {
            let prompt = render(&model, history, true);
            let before = cache.stats();
            check_texts(model.tokenizer(), &cache, std::slice::from_ref(&prompt));
            let after = cache.stats();
            if turn > 0 {
                // The previous turn's prompt, bar its generation prompt, is reused.
                let whole = model.tokenizer().encode(&prompt, false).unwrap().len() as u64;
                assert!(
                    (after.reused - before.reused) * 10 > whole * 9,
                    "turn {turn} of {c}: {before:?} -> {after:?} of {whole}"
                );
            }
            history.push(("assistant".into(), PIECES[(turn + c) % PIECES.len()].into()));
            history.push(("user".into(), format!("turn {turn} of {c}")));
        }
    }
    assert_eq!(cache.stats().entries, 6);
}
