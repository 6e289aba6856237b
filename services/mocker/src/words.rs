//! The mock engine's output vocabulary: whole-word tokens of the model's tokenizer, so its output
//! is readable text that re-tokenizes to the very tokens it was made of (clients that count output
//! tokens from the text agree with `usage`).

use kvmesh_llm::Tokenizer;

/// Most words kept: the lowest ids of a byte-level BPE vocabulary are its most frequent merges,
/// and checking each candidate costs one encode at startup.
const MAX_WORDS: usize = 8192;

/// Ids of tokens that are one space followed by a lowercase word (at least two letters, one of
/// them a vowel) and that encode back to exactly themselves. Empty when the vocabulary has none
/// (then the engine draws from every non-special id).
pub fn whole_word_ids(tokenizer: &Tokenizer) -> Vec<u32> {
    let mut words = Vec::new();
    for id in 0..tokenizer.vocab_size() as u32 {
        if words.len() == MAX_WORDS {
            break;
        }
        if tokenizer.is_added_token(id) {
            continue;
        }
        let Ok(text) = tokenizer.decode(&[id], false) else {
            continue;
        };
        if !is_spaced_word(&text) {
            continue;
        }
        if tokenizer.encode(&text, false).ok().as_deref() == Some(&[id][..]) {
            words.push(id);
        }
    }
    words
}

/// `" word"`: one leading space, then two or more ASCII lowercase letters with a vowel.
fn is_spaced_word(text: &str) -> bool {
    let Some(word) = text.strip_prefix(' ') else {
        return false;
    };
    word.len() >= 2
        && word.bytes().all(|b| b.is_ascii_lowercase())
        && word.bytes().any(|b| b"aeiouy".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn tiny() -> Tokenizer {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny");
        Tokenizer::from_file(dir.join("tokenizer.json")).unwrap()
    }

    #[test]
    fn words_decode_to_spaced_words_and_their_text_reencodes_to_them() {
        let tokenizer = tiny();
        let words = whole_word_ids(&tokenizer);
        assert!(words.len() > 100, "only {} words", words.len());
        let sample: Vec<u32> = words.iter().copied().step_by(7).take(60).collect();
        let text = tokenizer.decode(&sample, true).unwrap();
        assert!(
            text.starts_with(' ') && !text.contains('\u{FFFD}'),
            "{text:?}"
        );
        assert_eq!(tokenizer.encode(&text, false).unwrap(), sample);
    }

    #[test]
    fn only_spaced_lowercase_words_with_a_vowel_qualify() {
        assert!(is_spaced_word(" cache"));
        assert!(is_spaced_word(" my"));
        assert!(!is_spaced_word("cache"));
        assert!(!is_spaced_word(" th"));
        assert!(!is_spaced_word(" a"));
        assert!(!is_spaced_word(" Cache"));
        assert!(!is_spaced_word("  is"));
    }
}
