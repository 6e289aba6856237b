//! A bounded, process-wide cache of prompt tokenizations keyed by the prompt's prefix at its cut
//! points (`tokenizer::boundaries::Boundaries`), so that a conversation's next turn tokenizes only what is new: the
//! ids up to the longest cut point an earlier prompt shared are reused, the rest is encoded.
//! The result is exactly what encoding the whole prompt gives (docs/tokenization.md).
//!
//! A later turn costs in proportion to what is new, not to the whole prompt: the shared prefix is
//! found by comparing the new text with a stored prompt's text (a memory compare), not by
//! searching and hashing all of it again.

use std::sync::Arc;

use kvmesh_core::prefix::{PrefixCut, PrefixEntry, PrefixStats, PrefixStore};
use xxhash_rust::xxh3::Xxh3;

use crate::error::LlmError;
use crate::tokenizer::Tokenizer;
use crate::tokenizer::boundaries::Boundaries;

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
    store: PrefixStore<TokenizedPrompt>,
}

/// One stored prompt.
struct TokenizedPrompt {
    /// Its text, which a new prompt is compared with.
    text: String,
    /// Key of each cut.
    keys: Vec<u128>,
    /// Byte offset of each cut in the text.
    offsets: Vec<usize>,
    /// Ids before each cut.
    tokens: Vec<usize>,
    /// The ids up to the last cut.
    ids: IdPieces,
}

impl PrefixEntry for TokenizedPrompt {
    fn keys(&self) -> &[u128] {
        &self.keys
    }

    fn value_bytes(&self) -> usize {
        self.text.capacity()
            + self.ids.held_bytes()
            + self.keys.capacity() * std::mem::size_of::<u128>()
            + (self.offsets.capacity() + self.tokens.capacity()) * std::mem::size_of::<usize>()
    }
}

/// Token ids kept in pieces that later prompts share: a prompt extending a stored one holds the
/// stored one's pieces and one piece of its own new ids, so storing a turn copies only what is
/// new.
#[derive(Default)]
struct IdPieces {
    /// Each piece and how many of its ids are used.
    pieces: Vec<(Arc<[u32]>, usize)>,
}

impl IdPieces {
    /// Past this many pieces, a prompt's ids are gathered into one (a copy that amortizes over
    /// as many turns).
    const MAX_PIECES: usize = 64;

    /// The first `n` ids, sharing the pieces of which at least half is taken and copying the
    /// part taken of the others: a prompt sharing only a system prompt with a long
    /// conversation should not keep the conversation's ids alive after it is evicted.
    fn prefix(&self, n: usize) -> Self {
        let mut left = n;
        let pieces = self
            .pieces
            .iter()
            .map_while(|(piece, used)| {
                let take = (*used).min(left);
                left -= take;
                (take > 0).then(|| {
                    if take * 2 >= piece.len() {
                        (piece.clone(), take)
                    } else {
                        (Arc::from(&piece[..take]), take)
                    }
                })
            })
            .collect();
        Self { pieces }
    }

    /// Appends the first `n` ids to `out`.
    fn copy_prefix_into(&self, n: usize, out: &mut Vec<u32>) {
        let mut left = n;
        for (piece, used) in &self.pieces {
            let take = (*used).min(left);
            out.extend_from_slice(&piece[..take]);
            left -= take;
        }
    }

    /// Appends `ids` as a new piece.
    fn push(&mut self, ids: &[u32]) {
        if self.pieces.len() >= Self::MAX_PIECES {
            let held: usize = self.pieces.iter().map(|(_, used)| used).sum();
            let mut all = Vec::with_capacity(held + ids.len());
            self.copy_prefix_into(usize::MAX, &mut all);
            all.extend_from_slice(ids);
            let len = all.len();
            self.pieces = vec![(all.into(), len)];
        } else if !ids.is_empty() {
            self.pieces.push((ids.into(), ids.len()));
        }
    }

    /// Bytes of the pieces held (whole pieces, even where only part is used, or shared with
    /// another prompt) and of the list of them.
    fn held_bytes(&self) -> usize {
        /// The counts an `Arc` keeps before its data.
        const ARC_COUNTS: usize = 2 * std::mem::size_of::<usize>();
        self.pieces.capacity() * std::mem::size_of::<(Arc<[u32]>, usize)>()
            + self
                .pieces
                .iter()
                .map(|(piece, _)| ARC_COUNTS + std::mem::size_of_val::<[u32]>(piece))
                .sum::<usize>()
    }
}

/// The cut points of a prompt being tokenized, and the stored prompt it shares the most with.
struct Walk {
    keys: Vec<u128>,
    offsets: Vec<usize>,
    /// The stored prompt and the index of its last cut that this prompt shares.
    reuse: Option<(Arc<TokenizedPrompt>, usize)>,
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

    /// [`Self::encode`] with the prompt's cut points. The cache keeps the text it is given (an
    /// owned `String` is kept without a copy).
    pub fn encode_with_cuts(
        &self,
        tokenizer: &Tokenizer,
        text: impl Into<String>,
    ) -> Result<EncodedPrompt, LlmError> {
        let text = text.into();
        let Some(boundaries) = tokenizer.boundaries().filter(|_| self.store.is_enabled()) else {
            return plain(tokenizer, &text);
        };
        let walk = self.walk(boundaries, &text);
        if walk.keys.is_empty() {
            return plain(tokenizer, &text);
        }
        let (ids, mut tokens, mut pieces) = match &walk.reuse {
            Some((entry, index)) => {
                let shared = entry.tokens[*index];
                let suffix = tokenizer.encode(&text[entry.offsets[*index]..], false)?;
                let mut ids = Vec::with_capacity(shared + suffix.len());
                entry.ids.copy_prefix_into(shared, &mut ids);
                ids.extend_from_slice(&suffix);
                let tokens = entry.tokens[..=*index].to_vec();
                (ids, tokens, entry.ids.prefix(shared))
            }
            None => (
                tokenizer.encode(&text, false)?,
                Vec::with_capacity(walk.keys.len()),
                IdPieces::default(),
            ),
        };
        self.store.record(tokens.last().copied());
        // The ids after each cut token; the shared prefix's are the stored prompt's. A count
        // that differs from the cuts' (the text matched a cut token the tokenizer did not
        // take) leaves the prompt uncached and without cuts.
        let scan_from = tokens.last().copied().unwrap_or(0);
        tokens.extend(
            ids[scan_from..]
                .iter()
                .enumerate()
                .filter(|(_, id)| boundaries.is_cut_id(**id))
                .map(|(i, _)| scan_from + i + 1),
        );
        if tokens.len() != walk.keys.len() {
            return Ok(EncodedPrompt {
                ids,
                cuts: Vec::new(),
            });
        }
        let cuts = walk
            .keys
            .iter()
            .zip(&tokens)
            .map(|(&key, &tokens)| PrefixCut {
                key,
                tokens: tokens as u32,
            })
            .collect();
        let held = tokens.last().copied().unwrap_or(0);
        pieces.push(&ids[scan_from..held]);
        self.store.insert(TokenizedPrompt {
            text,
            keys: walk.keys,
            offsets: walk.offsets,
            ids: pieces,
            tokens,
        });
        Ok(EncodedPrompt { ids, cuts })
    }

    /// Counters and size now.
    pub fn stats(&self) -> PrefixCacheStats {
        self.store.stats()
    }

    /// Finds the cut points of `text` and the stored prompt sharing the longest prefix with it.
    /// Cuts are found and keyed one after another from the start; when a key is stored, the
    /// stored prompt's text is compared with this one and the walk jumps to the last stored
    /// cut within the shared text, taking its keys. Only text past the shared prefix is
    /// searched and hashed.
    fn walk(&self, boundaries: &Boundaries, text: &str) -> Walk {
        let bytes = text.as_bytes();
        let mut walk = Walk {
            keys: Vec::new(),
            offsets: Vec::new(),
            reuse: None,
        };
        let mut key = u128::from(boundaries.namespace());
        let mut at = 0;
        while let Some(cut) = boundaries.next_cut(text, at) {
            key = chain_key(key, &bytes[at..cut]);
            walk.keys.push(key);
            walk.offsets.push(cut);
            at = cut;
            let Some(hit) = self.store.find(key) else {
                continue;
            };
            let entry = hit.entry;
            let stored = entry.text.as_bytes();
            if entry.offsets[hit.index] != cut || stored.len() < cut {
                continue;
            }
            let shared = cut + common_prefix_len(&bytes[cut..], &stored[cut..]);
            // A stored cut is this prompt's too when the texts agree past it by the longest
            // token (no token starting before it can match differently), or up to this
            // prompt's end.
            let last_safe = if shared == bytes.len() {
                shared
            } else {
                shared.saturating_sub(boundaries.max_token_len())
            };
            let later = &entry.offsets[hit.index + 1..];
            let last = hit.index + later.partition_point(|&offset| offset <= last_safe);
            walk.keys
                .extend_from_slice(&entry.keys[hit.index + 1..=last]);
            walk.offsets
                .extend_from_slice(&entry.offsets[hit.index + 1..=last]);
            key = entry.keys[last];
            at = entry.offsets[last];
            walk.reuse = Some((entry, last));
        }
        walk
    }
}

fn plain(tokenizer: &Tokenizer, text: &str) -> Result<EncodedPrompt, LlmError> {
    Ok(EncodedPrompt {
        ids: tokenizer.encode(text, false)?,
        cuts: Vec::new(),
    })
}

/// The key of a prefix: the previous cut's key and the text since it, hashed together (so a
/// key names the whole text before its cut, and a stored prompt's keys serve a new prompt
/// sharing its text).
fn chain_key(previous: u128, segment: &[u8]) -> u128 {
    let mut hasher = Xxh3::new();
    hasher.update(&previous.to_le_bytes());
    hasher.update(segment);
    hasher.digest128()
}

/// How many leading bytes `a` and `b` share; compares large blocks, then small ones within the
/// first large block that differs, then bytes (a memory compare per block, few calls).
fn common_prefix_len(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let (mut a, mut b) = (&a[..n], &b[..n]);
    let mut same = 0;
    for block in [4096, 128] {
        let equal = (a
            .chunks(block)
            .zip(b.chunks(block))
            .take_while(|(x, y)| x == y)
            .count()
            * block)
            .min(a.len());
        same += equal;
        (a, b) = (&a[equal..], &b[equal..]);
    }
    same + a.iter().zip(b).take_while(|(p, q)| p == q).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_prefix_len_finds_the_first_difference() {
        let a: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        for at in [
            0, 1, 127, 128, 255, 256, 1000, 4095, 4096, 4097, 4224, 8200, 9999,
        ] {
            let mut b = a.clone();
            b[at] ^= 1;
            assert_eq!(common_prefix_len(&a, &b), at);
        }
        assert_eq!(common_prefix_len(&a, &a[..700]), 700);
        assert_eq!(common_prefix_len(&a[..5000], &a), 5000);
        assert_eq!(common_prefix_len(&a, &a), a.len());
        assert_eq!(common_prefix_len(&[], &a), 0);
    }

    fn gathered(pieces: &IdPieces, n: usize) -> Vec<u32> {
        let mut out = Vec::new();
        pieces.copy_prefix_into(n, &mut out);
        out
    }

    #[test]
    fn id_pieces_share_prefixes_and_gather_past_their_limit() {
        let mut pieces = IdPieces::default();
        pieces.push(&[1, 2, 3]);
        pieces.push(&[]);
        pieces.push(&[4, 5]);
        assert_eq!(gathered(&pieces, usize::MAX), [1, 2, 3, 4, 5]);
        assert_eq!(gathered(&pieces, 4), [1, 2, 3, 4]);
        let mut branch = pieces.prefix(2);
        branch.push(&[9]);
        assert_eq!(gathered(&branch, usize::MAX), [1, 2, 9]);
        // The branch uses two thirds of the first piece, so it shares that piece and counts
        // the whole of it; a branch using one third copies what it uses.
        assert!(Arc::ptr_eq(&branch.pieces[0].0, &pieces.pieces[0].0));
        let piece = |ids: usize| 16 + 4 * ids;
        let list = |pieces: &IdPieces| pieces.pieces.capacity() * 24;
        assert_eq!(branch.held_bytes(), list(&branch) + piece(3) + piece(1));
        let short = pieces.prefix(1);
        assert!(!Arc::ptr_eq(&short.pieces[0].0, &pieces.pieces[0].0));
        assert_eq!(gathered(&short, usize::MAX), [1]);
        assert_eq!(short.held_bytes(), list(&short) + piece(1));
        assert_eq!(gathered(&pieces.prefix(0), usize::MAX), Vec::<u32>::new());
        let mut long = IdPieces::default();
        let mut expected = Vec::new();
        for id in 0..200u32 {
            long.push(&[id, id + 1000]);
            expected.extend([id, id + 1000]);
            assert!(long.pieces.len() <= IdPieces::MAX_PIECES);
        }
        assert_eq!(gathered(&long, usize::MAX), expected);
    }
}
