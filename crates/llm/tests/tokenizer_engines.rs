//! `--tokenizer fastokens` against the default encoder on the shipped model: identical ids on
//! real text (this repository's docs and code, sliced at many offsets), CJK, emoji and
//! special-token literals; and the fallback to the default engine for a tokenizer the fast
//! engine does not support.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use kvmesh_llm::{ModelDir, TokenizerEngine};

const TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/tiny");

/// Real text: prose and code from this repository.
fn corpus() -> String {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let files = [
        "docs/ARCHITECTURE.md",
        "docs/routing.md",
        "crates/llm/src/template.rs",
        "crates/kv/src/hashing.rs",
        "tests/python/conftest.py",
    ];
    files
        .iter()
        .map(|f| std::fs::read_to_string(format!("{root}/{f}")).unwrap())
        .collect::<Vec<_>>()
        .join("\n")
}

/// `count` slices of `text` of about `len` bytes at spread offsets, cut on char boundaries.
fn slices(text: &str, count: usize, len: usize) -> Vec<&str> {
    let boundary = |mut i: usize| {
        while !text.is_char_boundary(i) {
            i += 1;
        }
        i
    };
    (0..count)
        .map(|k| {
            let start = boundary((text.len() - len) * k / count);
            let end = boundary((start + len).min(text.len()));
            &text[start..end]
        })
        .collect()
}

fn assert_same_ids(default: &ModelDir, fast: &ModelDir, text: &str) {
    for add_special_tokens in [false, true] {
        let expected = default
            .tokenizer()
            .encode(text, add_special_tokens)
            .unwrap();
        let got = fast.tokenizer().encode(text, add_special_tokens).unwrap();
        assert_eq!(
            got,
            expected,
            "ids differ for {:?}",
            &text[..text.len().min(80)]
        );
    }
}

#[test]
fn fastokens_encodes_exactly_as_the_default_engine() {
    let default = ModelDir::load(TINY).unwrap();
    let fast = ModelDir::load_with(TINY, TokenizerEngine::Fastokens).unwrap();
    assert_eq!(fast.tokenizer().engine(), TokenizerEngine::Fastokens);
    assert_eq!(fast.tokenizer_fallback(), None);
    let corpus = corpus();
    for len in [40, 1_000, 12_000] {
        for slice in slices(&corpus, 30, len) {
            assert_same_ids(&default, &fast, slice);
        }
    }
    for text in [
        "東京は日本の首都です。中文也可以：你好，世界！한국어 텍스트.",
        "emoji 😀🎉 skin tones 👍🏽 family 👨‍👩‍👧 flags 🇯🇵 and a lone \u{200d} joiner",
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nhi<|im_end|><|endoftext|>",
        "literals glued<|im_end|>together and <|im_start|> spaced <|im_end|> out",
        "\n\n\t  \r\n   mixed whitespace   \u{a0}\u{3000} ",
        "",
    ] {
        assert_same_ids(&default, &fast, text);
    }
}

#[test]
fn decoding_is_the_same_whichever_engine_encodes() {
    let fast = ModelDir::load_with(TINY, TokenizerEngine::Fastokens).unwrap();
    let text = "Grüße, 世界 😀 — fn x() {}";
    let ids = fast.tokenizer().encode(text, false).unwrap();
    assert_eq!(fast.tokenizer().decode(&ids, false).unwrap(), text);
}

#[test]
fn an_unsupported_tokenizer_falls_back_to_the_default_engine() {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(TINY).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
    }
    // NFKC is a normalizer the default engine has and fastokens does not.
    let path = dir.path().join("tokenizer.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    json["normalizer"] = serde_json::json!({"type": "NFKC"});
    std::fs::write(&path, serde_json::to_string(&json).unwrap()).unwrap();

    let model = ModelDir::load_with(dir.path(), TokenizerEngine::Fastokens).unwrap();
    assert_eq!(model.tokenizer().engine(), TokenizerEngine::Default);
    let reason = model.tokenizer_fallback().unwrap();
    assert!(!reason.is_empty());
    // Still serves: the default engine encodes, NFKC applied ("ﬁ" becomes "fi").
    let ids = model.tokenizer().encode("ﬁne", false).unwrap();
    assert_eq!(model.tokenizer().decode(&ids, false).unwrap(), "fine");
}
