//! The shipped `models/tiny` directory end to end: load, render, tokenize, detokenize, stop.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::sync::Arc;

use kvmesh_llm::openai::ChatCompletionRequest;
use kvmesh_llm::{Detokenizer, ModelDir, StopMatcher};
use serde_json::json;

const TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/tiny");

fn tiny() -> ModelDir {
    ModelDir::load(TINY).unwrap()
}

#[test]
fn loads_config_tokenizer_and_template() {
    let model = tiny();
    let tokenizer = model.tokenizer();
    assert_eq!(model.name(), Some("tiny"));
    assert_eq!(model.context_length(), Some(8192));
    assert_eq!(model.vocab_size(), tokenizer.vocab_size());
    assert!((2000..=4000).contains(&tokenizer.vocab_size()));

    let im_start = tokenizer.token_to_id("<|im_start|>").unwrap();
    let im_end = tokenizer.token_to_id("<|im_end|>").unwrap();
    let eot = tokenizer.token_to_id("<|endoftext|>").unwrap();
    let mut specials = vec![im_start, im_end, eot];
    specials.sort_unstable();
    assert_eq!(tokenizer.special_token_ids(), specials.as_slice());
    assert_eq!(tokenizer.added_token_ids(), specials.as_slice());
    let mut eos = vec![im_end, eot];
    eos.sort_unstable();
    assert_eq!(model.eos_token_ids(), eos.as_slice());

    let ordinary = tokenizer.ordinary_token_ids();
    assert_eq!(ordinary.len(), tokenizer.vocab_size() - 3);
    assert!(ordinary.iter().all(|id| !tokenizer.is_added_token(*id)));
}

#[test]
fn renders_tokenizes_and_round_trips_a_chat() {
    let model = tiny();
    let request = ChatCompletionRequest::from_json(
        json!({
            "model": "tiny",
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "Which worker caches the longest prefix?"}
            ]
        })
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    let prompt = model
        .require_chat_template()
        .unwrap()
        .render_request(&request)
        .unwrap();
    assert_eq!(
        prompt,
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhich worker caches the longest prefix?<|im_end|>\n<|im_start|>assistant\n"
    );

    let tokenizer = model.tokenizer();
    let ids = tokenizer.encode(&prompt, false).unwrap();
    let im_start = tokenizer.token_to_id("<|im_start|>").unwrap();
    assert_eq!(ids[0], im_start);
    assert_eq!(ids.iter().filter(|id| **id == im_start).count(), 3);
    assert!(
        ids.len() < prompt.len() / 2,
        "BPE should merge: {} ids",
        ids.len()
    );
    assert_eq!(tokenizer.decode(&ids, false).unwrap(), prompt);
    assert_eq!(
        tokenizer.decode(&ids, true).unwrap(),
        "system\nYou are a helpful assistant.\nuser\nWhich worker caches the longest prefix?\nassistant\n"
    );
}

#[test]
fn tiny_template_supports_tools() {
    let model = tiny();
    let request = ChatCompletionRequest::from_json(
        json!({
            "model": "tiny",
            "tools": [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}],
            "messages": [{"role": "user", "content": "time?"}]
        })
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    let prompt = model
        .require_chat_template()
        .unwrap()
        .render_request(&request)
        .unwrap();
    assert!(prompt.starts_with("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools"));
    assert!(prompt.contains(
        "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"parameters\": {\"type\": \"object\"}}}\n</tools>"
    ));
    assert!(prompt.ends_with("<|im_start|>user\ntime?<|im_end|>\n<|im_start|>assistant\n"));
}

#[test]
fn detokenizer_never_splits_characters() {
    let model = tiny();
    let tokenizer = Arc::clone(model.tokenizer());
    let text = "Hello 世界! Emoji 🙂🚀👩‍💻 and 日本語のテキスト, naïve café — 😀 done.";
    let ids = tokenizer.encode(text, false).unwrap();
    assert!(ids.len() > text.chars().count() / 2);

    // Some single tokens must decode to U+FFFD, or the test would prove nothing.
    let broken = ids
        .iter()
        .filter(|id| {
            tokenizer
                .decode(&[**id], false)
                .unwrap()
                .contains('\u{FFFD}')
        })
        .count();
    assert!(
        broken > 0,
        "expected byte-level tokens that split characters"
    );

    let mut detokenizer = Detokenizer::new(Arc::clone(&tokenizer), true);
    let mut pieces = Vec::new();
    for id in &ids {
        pieces.push(detokenizer.push(*id).unwrap());
    }
    pieces.push(detokenizer.finish().unwrap());
    assert!(
        pieces.iter().all(|piece| !piece.contains('\u{FFFD}')),
        "{pieces:?}"
    );
    assert_eq!(pieces.concat(), tokenizer.decode(&ids, true).unwrap());
    assert_eq!(pieces.concat(), text);
}

#[test]
fn detokenizer_with_prompt_context_and_batches() {
    let model = tiny();
    let tokenizer = Arc::clone(model.tokenizer());
    let prompt = tokenizer.encode("<|im_start|>assistant\n", false).unwrap();
    let generated_text = "The router sends 你好 to worker 3 🙂<|im_end|>";
    let generated = tokenizer.encode(generated_text, false).unwrap();

    let mut detokenizer = Detokenizer::with_prompt(Arc::clone(&tokenizer), &prompt, true);
    let mut out = String::new();
    for batch in generated.chunks(3) {
        let piece = detokenizer.push_all(batch).unwrap();
        assert!(!piece.contains('\u{FFFD}'));
        out.push_str(&piece);
    }
    out.push_str(&detokenizer.finish().unwrap());
    assert_eq!(out, "The router sends 你好 to worker 3 🙂");

    let mut keep_special = Detokenizer::new(Arc::clone(&tokenizer), false);
    let mut out = String::new();
    for id in &generated {
        out.push_str(&keep_special.push(*id).unwrap());
    }
    assert_eq!(out, generated_text);
}

#[test]
fn detokenizer_finish_releases_an_incomplete_character() {
    let model = tiny();
    let tokenizer = Arc::clone(model.tokenizer());
    let ids = tokenizer.encode("ok 👩‍💻", false).unwrap();
    let mut detokenizer = Detokenizer::new(Arc::clone(&tokenizer), true);
    let mut out = String::new();
    for id in &ids[..ids.len() - 1] {
        out.push_str(&detokenizer.push(*id).unwrap());
    }
    assert!(!out.contains('\u{FFFD}'));
    let tail = detokenizer.finish().unwrap();
    assert_eq!(
        format!("{out}{tail}"),
        tokenizer.decode(&ids[..ids.len() - 1], true).unwrap()
    );
}

#[test]
fn detokenized_stream_through_stop_matcher() {
    let model = tiny();
    let tokenizer = Arc::clone(model.tokenizer());
    let ids = tokenizer
        .encode("Answer: 42.\nUser: next question", false)
        .unwrap();
    let mut detokenizer = Detokenizer::new(Arc::clone(&tokenizer), true);
    let mut matcher = StopMatcher::new(["\nUser:"], false);
    let mut out = String::new();
    for id in ids {
        let piece = detokenizer.push(id).unwrap();
        let step = matcher.push(&piece);
        out.push_str(&step.text);
        if step.matched.is_some() {
            break;
        }
    }
    assert_eq!(out, "Answer: 42.");
    assert_eq!(matcher.matched_stop(), Some("\nUser:"));
}
