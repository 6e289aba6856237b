//! Incremental detokenization: text out as tokens arrive, never half a character.

use std::sync::Arc;

use crate::error::LlmError;
use crate::tokenizer::Tokenizer;

/// How many prompt tokens seed the window, so that the first generated token decodes with its
/// real left context (SentencePiece drops a leading space when a token is decoded alone).
const PROMPT_CONTEXT_TOKENS: usize = 5;

/// Tokens in a row that add no text after which the window moves on (a character takes at most
/// four byte tokens).
const MAX_SILENT_TOKENS: usize = 8;

/// Once this many already-emitted tokens sit before the window, they are dropped.
const COMPACT_AFTER: usize = 256;

/// Turns a stream of token ids into a stream of text pieces, one per request.
///
/// Byte-level tokenizers split multi-byte characters across tokens, and decoding a single token
/// can yield U+FFFD. The detokenizer keeps two offsets into its ids: text from `prefix_offset`
/// to `read_offset` was already emitted; each step decodes from `prefix_offset` to the end and
/// emits only what follows the already-emitted text, and only when the result does not end in
/// U+FFFD (an incomplete character). Decoding a window rather than single tokens also keeps the
/// spacing that depends on the previous token.
#[derive(Debug)]
pub struct Detokenizer {
    tokenizer: Arc<Tokenizer>,
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
    skip_special_tokens: bool,
}

impl Detokenizer {
    /// A detokenizer for a generation with no prompt context.
    pub fn new(tokenizer: Arc<Tokenizer>, skip_special_tokens: bool) -> Self {
        Self {
            tokenizer,
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
            skip_special_tokens,
        }
    }

    /// A detokenizer whose window starts with the last few prompt tokens, so the first
    /// generated token's leading space is decoded as it would be in context.
    pub fn with_prompt(
        tokenizer: Arc<Tokenizer>,
        prompt: &[u32],
        skip_special_tokens: bool,
    ) -> Self {
        let start = prompt.len().saturating_sub(PROMPT_CONTEXT_TOKENS);
        let ids = prompt[start..].to_vec();
        let read_offset = ids.len();
        Self {
            tokenizer,
            ids,
            prefix_offset: 0,
            read_offset,
            skip_special_tokens,
        }
    }

    /// Feeds one token; returns the newly completed text (empty while a character is pending).
    pub fn push(&mut self, id: u32) -> Result<String, LlmError> {
        self.push_all(std::slice::from_ref(&id))
    }

    /// Feeds several tokens at once; returns the newly completed text.
    pub fn push_all(&mut self, ids: &[u32]) -> Result<String, LlmError> {
        if self.skip_special_tokens {
            // Tokens that decode to nothing would only lengthen the window every later step
            // decodes again (a run of ignored EOS tokens made that quadratic).
            let special = self.tokenizer.special_token_ids();
            self.ids.extend(
                ids.iter()
                    .filter(|id| special.binary_search(id).is_err())
                    .copied(),
            );
        } else {
            self.ids.extend_from_slice(ids);
        }
        let prefix_text = self.decode(self.prefix_offset, self.read_offset)?;
        let new_text = self.decode(self.prefix_offset, self.ids.len())?;
        if new_text.len() <= prefix_text.len() {
            // Nothing new: once a run of such tokens is longer than any character's bytes, step
            // past it, so the window stays short whatever the tokens are.
            if self.ids.len() - self.read_offset > MAX_SILENT_TOKENS {
                self.prefix_offset = self.read_offset;
                self.read_offset = self.ids.len();
                self.compact();
            }
            return Ok(String::new());
        }
        if new_text.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        let Some(delta) = suffix_after(&new_text, &prefix_text) else {
            return Ok(String::new());
        };
        let delta = delta.to_owned();
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        self.compact();
        Ok(delta)
    }

    /// Ends the stream: returns whatever text is still pending, U+FFFD included if the
    /// generation really ended inside a character.
    pub fn finish(&mut self) -> Result<String, LlmError> {
        if self.read_offset == self.ids.len() {
            return Ok(String::new());
        }
        let prefix_text = self.decode(self.prefix_offset, self.read_offset)?;
        let new_text = self.decode(self.prefix_offset, self.ids.len())?;
        let delta = suffix_after(&new_text, &prefix_text)
            .unwrap_or_default()
            .to_owned();
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(delta)
    }

    fn decode(&self, start: usize, end: usize) -> Result<String, LlmError> {
        if start >= end {
            return Ok(String::new());
        }
        self.tokenizer
            .decode(&self.ids[start..end], self.skip_special_tokens)
    }

    fn compact(&mut self) {
        if self.prefix_offset >= COMPACT_AFTER {
            self.ids.drain(..self.prefix_offset);
            self.read_offset -= self.prefix_offset;
            self.prefix_offset = 0;
        }
    }
}

/// The part of `text` after the already-emitted `prefix`. Decoding a longer window normally
/// extends the shorter one; when a decoder rewrites the boundary, fall back to cutting at the
/// prefix's length if that is a character boundary.
fn suffix_after<'t>(text: &'t str, prefix: &str) -> Option<&'t str> {
    text.strip_prefix(prefix)
        .or_else(|| text.get(prefix.len()..))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffix_after_respects_char_boundaries() {
        assert_eq!(suffix_after("héllo", "hé"), Some("llo"));
        assert_eq!(suffix_after("é", "x"), None);
        assert_eq!(suffix_after("abc", "xy"), Some("c"));
    }

    fn tiny() -> Arc<Tokenizer> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny");
        Arc::new(Tokenizer::from_file(dir.join("tokenizer.json")).unwrap())
    }

    #[test]
    fn tokens_that_add_no_text_do_not_grow_the_window() {
        let tokenizer = tiny();
        let mut detokenizer = Detokenizer::new(tokenizer.clone(), true);
        let mut text = detokenizer
            .push_all(&tokenizer.encode("Hello", false).unwrap())
            .unwrap();
        let special = tokenizer.special_token_ids()[0];
        for _ in 0..10_000 {
            text += &detokenizer.push(special).unwrap();
        }
        assert!(
            detokenizer.ids.len() < 64,
            "window of {} ids",
            detokenizer.ids.len()
        );
        text += &detokenizer
            .push_all(&tokenizer.encode(" world", false).unwrap())
            .unwrap();
        text += &detokenizer.finish().unwrap();
        assert_eq!(text, "Hello world");
        // Kept when asked for: special tokens then count as text.
        let mut keeping = Detokenizer::new(tokenizer.clone(), false);
        let kept = keeping.push(special).unwrap() + &keeping.finish().unwrap();
        assert!(!kept.is_empty());
    }
}
