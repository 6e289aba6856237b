//! Where a rendered prompt can be cut without changing its tokenization: right after a special
//! token such as `<|im_end|>`. The tokenizer splits its input at added tokens before any
//! normalizer, pre-tokenizer or BPE merge runs, so the ids of `a + b`, cut there, are the ids
//! of `a` followed by the ids of `b` (docs/tokenization.md, "Prefix cache").

use aho_corasick::{AhoCorasick, Input, MatchKind};

/// The cut points of one tokenizer, found the way it finds its added tokens (leftmost-longest
/// over the tokens matched on raw text).
pub struct Boundaries {
    matcher: AhoCorasick,
    /// Per matcher pattern: whether a cut may follow it (special, strips nothing).
    is_cut: Vec<bool>,
    /// Ids of the tokens a cut may follow, sorted.
    cut_ids: Vec<u32>,
    /// Seeds prefix keys: the same text under another tokenizer is another prefix.
    namespace: u64,
    /// Bytes of the longest token matched on raw text.
    max_token_len: usize,
}

impl Boundaries {
    /// The cut points of `inner`, or `None` when it has no token to cut after, or an added
    /// token whose matching depends on its surroundings (`single_word`).
    pub fn build(inner: &tokenizers::Tokenizer) -> Option<Self> {
        let decoder = inner.get_added_tokens_decoder();
        let mut raw: Vec<(u32, &tokenizers::AddedToken)> = decoder
            .iter()
            .filter(|(_, token)| !token.normalized)
            .map(|(id, token)| (*id, token))
            .collect();
        if raw.iter().any(|(_, token)| token.single_word) {
            return None;
        }
        raw.sort_by_key(|(id, _)| *id);
        let is_cut: Vec<bool> = raw
            .iter()
            .map(|(_, token)| token.special && !token.lstrip && !token.rstrip)
            .collect();
        let mut cut_ids: Vec<u32> = raw
            .iter()
            .zip(&is_cut)
            .filter(|(_, cut)| **cut)
            .map(|((id, _), _)| *id)
            .collect();
        if cut_ids.is_empty() {
            return None;
        }
        cut_ids.sort_unstable();
        let matcher = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(raw.iter().map(|(_, token)| token.content.as_str()))
            .ok()?;
        let namespace = xxhash_rust::xxh3::xxh3_64(inner.to_string(false).ok()?.as_bytes());
        let max_token_len = raw
            .iter()
            .map(|(_, token)| token.content.len())
            .max()
            .unwrap_or(0);
        Some(Self {
            matcher,
            is_cut,
            cut_ids,
            namespace,
            max_token_len,
        })
    }

    /// Byte offsets in `text` right after each token a cut may follow, ascending.
    pub fn find(&self, text: &str) -> Vec<usize> {
        std::iter::successors(self.next_cut(text, 0), |&cut| self.next_cut(text, cut)).collect()
    }

    /// The first cut after byte `from`, which must be 0 or a cut: the search goes on from
    /// there exactly as a search of the whole text does (leftmost-longest matches resume where
    /// the last one ended).
    pub fn next_cut(&self, text: &str, from: usize) -> Option<usize> {
        let mut at = from;
        loop {
            let found = self.matcher.find(Input::new(text).span(at..text.len()))?;
            if self.is_cut[found.pattern().as_usize()] {
                return Some(found.end());
            }
            at = found.end();
        }
    }

    /// Bytes of the longest token matched on raw text: two texts that agree up to this many
    /// bytes past a cut have the same cuts up to it.
    pub fn max_token_len(&self) -> usize {
        self.max_token_len
    }

    /// Whether `id` is a token a cut may follow.
    pub fn is_cut_id(&self, id: u32) -> bool {
        // Called for every id of every prompt: most ids are ordinary tokens below the added
        // ones, which the range check answers without a search.
        let (Some(&lowest), Some(&highest)) = (self.cut_ids.first(), self.cut_ids.last()) else {
            return false;
        };
        (lowest..=highest).contains(&id) && self.cut_ids.binary_search(&id).is_ok()
    }

    /// The seed of this tokenizer's prefix keys.
    pub fn namespace(&self) -> u64 {
        self.namespace
    }
}
