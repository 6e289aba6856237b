//! A bounded, process-wide cache of prompt tokenizations keyed by the prompt's prefix at its cut
//! points (`tokenizer::boundaries::Boundaries`), so that a conversation's next turn tokenizes only what is new: the
//! ids up to the longest cut point an earlier prompt shared are reused, the rest is encoded.
//! The result is exactly what encoding the whole prompt gives (docs/tokenization.md).

use kvmesh_core::prefix::{PrefixCut, PrefixStats, PrefixStore};
use xxhash_rust::xxh3::Xxh3;

use crate::error::LlmError;
use crate::tokenizer::Tokenizer;

/// Counters of a [`PrefixCache`], for metrics (`reused` counts token ids).
pub type PrefixCacheStats = PrefixStats;

/// A tokenized prompt and its cut points, which name its prefixes to later stages (the block
/// hashes of a prefix are reused by its key).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EncodedPrompt {
    /// The prompt's token ids.
    pub ids: Vec<u32>,
    /// The prompt's cut points, shortest first; empty when the prompt has none the cache could
    /// use.
    pub cuts: Vec<PrefixCut>,
}

/// The cache; share one per process behind an `Arc`.
pub struct PrefixCache {
    store: PrefixStore<u32>,
}

impl PrefixCache {
    /// A cache holding at most `max_bytes` (0 = nothing is cached).
    pub fn new(max_bytes: usize) -> Self {
        Self {
            store: PrefixStore::new(max_bytes),
        }
    }

    /// The ids of `text` without the post-processor's special tokens (a rendered chat prompt),
    /// exactly as `tokenizer.encode(text, false)` gives them.
    pub fn encode(&self, tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>, LlmError> {
        Ok(self.encode_with_cuts(tokenizer, text)?.ids)
    }

    /// [`Self::encode`] with the prompt's cut points.
    pub fn encode_with_cuts(
        &self,
        tokenizer: &Tokenizer,
        text: &str,
    ) -> Result<EncodedPrompt, LlmError> {
        let Some(boundaries) = tokenizer.boundaries().filter(|_| self.store.is_enabled()) else {
            return plain(tokenizer, text);
        };
        let cuts = boundaries.find(text);
        if cuts.is_empty() {
            return plain(tokenizer, text);
        }
        let keys = prefix_keys(boundaries.namespace(), text, &cuts);
        let hit = self.store.longest(&keys);
        let ids = match &hit {
            Some(hit) => {
                let suffix = tokenizer.encode(&text[cuts[hit.cut]..], false)?;
                let mut whole = Vec::with_capacity(hit.len + suffix.len());
                whole.extend_from_slice(hit.shared());
                whole.extend_from_slice(&suffix);
                whole
            }
            None => tokenizer.encode(text, false)?,
        };
        // The ids after each cut token. The reused prefix's are known to the store; only the
        // ids after it are scanned. A count that differs from the cuts' (the text matched a cut
        // token the tokenizer did not take) leaves the prompt uncached and without cuts.
        let (mut offsets, scan_from) = match hit.and_then(|hit| Some((hit.lens?, hit.len))) {
            Some((lens, len)) => (lens, len),
            None => (Vec::with_capacity(keys.len()), 0),
        };
        offsets.extend(
            ids.iter()
                .enumerate()
                .skip(scan_from)
                .filter(|(_, id)| boundaries.is_cut_id(**id))
                .map(|(i, _)| i + 1),
        );
        if offsets.len() != keys.len() {
            return Ok(EncodedPrompt {
                ids,
                cuts: Vec::new(),
            });
        }
        let cuts = keys
            .iter()
            .zip(&offsets)
            .map(|(&key, &tokens)| PrefixCut {
                key,
                tokens: tokens as u32,
            })
            .collect();
        self.store.insert(keys, &offsets, &ids);
        Ok(EncodedPrompt { ids, cuts })
    }

    /// Counters and size now.
    pub fn stats(&self) -> PrefixCacheStats {
        self.store.stats()
    }
}

fn plain(tokenizer: &Tokenizer, text: &str) -> Result<EncodedPrompt, LlmError> {
    Ok(EncodedPrompt {
        ids: tokenizer.encode(text, false)?,
        cuts: Vec::new(),
    })
}

/// The 128-bit hash of `text[..cut]` for every cut, in one pass over the text.
fn prefix_keys(namespace: u64, text: &str, cuts: &[usize]) -> Vec<u128> {
    let mut hasher = Xxh3::with_seed(namespace);
    let mut start = 0;
    cuts.iter()
        .map(|&cut| {
            hasher.update(&text.as_bytes()[start..cut]);
            start = cut;
            hasher.digest128()
        })
        .collect()
}
