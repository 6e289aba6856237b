//! A shared, thread-safe wrapper over a Hugging Face `tokenizers` tokenizer, optionally
//! encoding with the `fastokens` BPE engine (docs/tokenization.md).

use std::path::Path;

use crate::error::LlmError;

pub mod boundaries;
mod byte_decoder;
mod byte_level;
pub mod samples;

use boundaries::Boundaries;
use byte_decoder::ByteDecoder;

/// Which engine encodes prompts (`--tokenizer`, `DYN_TOKENIZER`). Decoding does not depend on
/// it: a plain byte-level vocabulary decodes from a table of token bytes, any other through the
/// Hugging Face decoder, with the same text either way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TokenizerEngine {
    /// Hugging Face `tokenizers`.
    #[default]
    Default,
    /// The `fastokens` BPE engine, checked against the Hugging Face one at load.
    Fastokens,
}

impl std::str::FromStr for TokenizerEngine {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "default" => Ok(Self::Default),
            "fastokens" => Ok(Self::Fastokens),
            other => Err(format!(
                "unknown tokenizer {other:?} (expected default or fastokens)"
            )),
        }
    }
}

impl TokenizerEngine {
    /// Starts the engine's own helper threads now, on the calling thread, and returns how many
    /// threads one encode may use (the caller's included). `fastokens` spreads an encode of a
    /// large input over a process-wide set of threads that it otherwise makes during its first
    /// encode of any length (the load-time self-check, on whatever thread loads the model); made
    /// here, they inherit the caller's scheduling priority. The default engine has none.
    pub fn start_helper_threads(self) -> usize {
        match self {
            Self::Default => 1,
            Self::Fastokens => fastokens::fanout::threads(),
        }
    }
}

impl std::fmt::Display for TokenizerEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Default => "default",
            Self::Fastokens => "fastokens",
        })
    }
}

/// A loaded tokenizer plus what the serving path needs to know about its vocabulary: which ids
/// are added (special) tokens and which ids end a generation.
///
/// It is `Send + Sync` and immutable after construction: load it once per model and share it
/// with `Arc` across requests; nothing is reloaded per request.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// The `fastokens` encoder, when it is the engine and passed its self-check.
    fast: Option<fastokens::Tokenizer>,
    /// Where prompts may be cut for the prefix cache; `None` when nowhere is safe.
    boundaries: Option<Boundaries>,
    /// Decodes from a table of token bytes when the decoder is plain byte-level.
    byte_decoder: Option<ByteDecoder>,
    /// Every added token id (special or not), sorted: the mock engine draws outside this set.
    added_token_ids: Vec<u32>,
    /// Added token ids flagged `special`, sorted.
    special_token_ids: Vec<u32>,
    /// Token ids that end generation, sorted and deduplicated.
    eos_token_ids: Vec<u32>,
    vocab_size: usize,
}

impl Tokenizer {
    /// Loads `tokenizer.json` from `path`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, LlmError> {
        let path = path.as_ref();
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|err| LlmError::Tokenizer(format!("{}: {err}", path.display())))?;
        Ok(Self::new(inner))
    }

    /// Parses a `tokenizer.json` document held in memory.
    pub fn from_bytes(bytes: impl AsRef<[u8]>) -> Result<Self, LlmError> {
        let inner = tokenizers::Tokenizer::from_bytes(bytes).map_err(LlmError::tokenizer)?;
        Ok(Self::new(inner))
    }

    /// Wraps an already built tokenizer; it has no EOS ids until [`Self::with_eos_token_ids`].
    pub fn new(inner: tokenizers::Tokenizer) -> Self {
        let decoder = inner.get_added_tokens_decoder();
        let mut added_token_ids: Vec<u32> = decoder.keys().copied().collect();
        added_token_ids.sort_unstable();
        let mut special_token_ids: Vec<u32> = decoder
            .iter()
            .filter(|(_, token)| token.special)
            .map(|(id, _)| *id)
            .collect();
        special_token_ids.sort_unstable();
        let vocab_size = inner.get_vocab_size(true);
        let boundaries = Boundaries::build(&inner);
        let byte_decoder = ByteDecoder::build(&inner);
        Self {
            inner,
            fast: None,
            boundaries,
            byte_decoder,
            added_token_ids,
            special_token_ids,
            eos_token_ids: Vec::new(),
            vocab_size,
        }
    }

    /// Sets the ids that end generation (the union of `generation_config.json` and the
    /// tokenizer config's `eos_token`, as [`crate::ModelDir`] computes it).
    pub fn with_eos_token_ids(mut self, ids: impl IntoIterator<Item = u32>) -> Self {
        let mut ids: Vec<u32> = ids.into_iter().collect();
        ids.sort_unstable();
        ids.dedup();
        self.eos_token_ids = ids;
        self
    }

    /// Encodes with `fastokens` from now on, when it can: it loads the `tokenizer.json` at
    /// `path`, and on every text of `checks` (and each with the post-processor applied) gives
    /// exactly the Hugging Face ids. Otherwise keeps the default engine and returns why.
    pub fn use_fastokens(&mut self, path: &Path, checks: &[String]) -> Result<(), String> {
        let fast = fastokens::Tokenizer::from_file(path).map_err(|e| e.to_string())?;
        for text in checks {
            for add_special_tokens in [false, true] {
                let expected = self.encode_default(text, add_special_tokens)?;
                let got = fast
                    .encode_with_special_tokens(text, add_special_tokens)
                    .map_err(|e| e.to_string())?;
                if got != expected {
                    let at = got
                        .iter()
                        .zip(&expected)
                        .take_while(|(a, b)| a == b)
                        .count();
                    return Err(format!(
                        "self-check differs from the default encoder at token {at} of {}",
                        expected.len()
                    ));
                }
            }
        }
        self.fast = Some(fast);
        Ok(())
    }

    /// Keeps the prefix-cache cut points only if, on every text of `checks`, encoding the two
    /// sides of each cut gives the ids of the whole (a pre-tokenizer that treats the start of
    /// its input specially, as a Metaspace `first` scheme does, fails this). Returns why not.
    pub fn check_prefix_cuts(&mut self, checks: &[String]) -> Result<(), String> {
        let Some(boundaries) = &self.boundaries else {
            return Err("the tokenizer has no special token to cut prompts after".into());
        };
        for text in checks {
            let whole = self.encode(text, false).map_err(|e| e.to_string())?;
            for cut in boundaries.find(text) {
                let mut parts = self
                    .encode(&text[..cut], false)
                    .map_err(|e| e.to_string())?;
                parts.extend(
                    self.encode(&text[cut..], false)
                        .map_err(|e| e.to_string())?,
                );
                if parts != whole {
                    self.boundaries = None;
                    return Err(format!("cutting after byte {cut} changes the tokenization"));
                }
            }
        }
        Ok(())
    }

    /// Where prompts may be cut for the prefix cache, when anywhere.
    pub fn boundaries(&self) -> Option<&Boundaries> {
        self.boundaries.as_ref()
    }

    /// The engine that encodes.
    pub fn engine(&self) -> TokenizerEngine {
        if self.fast.is_some() {
            TokenizerEngine::Fastokens
        } else {
            TokenizerEngine::Default
        }
    }

    /// Token ids of `text`. `add_special_tokens` applies the post-processor (BOS and the like);
    /// chat prompts rendered by a template already contain them and pass `false`.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, LlmError> {
        match &self.fast {
            Some(fast) => fast
                .encode_with_special_tokens(text, add_special_tokens)
                .map_err(LlmError::tokenizer),
            None => self
                .encode_default(text, add_special_tokens)
                .map_err(LlmError::Tokenizer),
        }
    }

    /// Token ids of `text` from the Hugging Face encoder.
    fn encode_default(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, String> {
        let encoding = self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(|e| e.to_string())?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The text of `ids`; with `skip_special_tokens` the special tokens are left out.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, LlmError> {
        if let Some(table) = &self.byte_decoder {
            return Ok(table.decode(ids, skip_special_tokens));
        }
        self.decode_default(ids, skip_special_tokens)
    }

    /// The text of `ids` from the Hugging Face decoder.
    fn decode_default(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, LlmError> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(LlmError::tokenizer)
    }

    /// Number of tokens including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Every added token id (special or not), sorted; ordinary tokens are the others.
    pub fn added_token_ids(&self) -> &[u32] {
        &self.added_token_ids
    }

    /// Added token ids flagged special (what `skip_special_tokens` drops), sorted.
    pub fn special_token_ids(&self) -> &[u32] {
        &self.special_token_ids
    }

    /// Whether `id` is an added token (special or not).
    pub fn is_added_token(&self, id: u32) -> bool {
        self.added_token_ids.binary_search(&id).is_ok()
    }

    /// Every id that maps to an ordinary (not added) token, ascending: what a mock engine may
    /// emit as plain text. Computed on each call; cache it if called often.
    pub fn ordinary_token_ids(&self) -> Vec<u32> {
        let upper = u32::try_from(self.vocab_size).unwrap_or(u32::MAX);
        (0..upper)
            .filter(|id| !self.is_added_token(*id) && self.inner.id_to_token(*id).is_some())
            .collect()
    }

    /// Ids that end generation, sorted.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    /// Whether `id` ends generation.
    pub fn is_eos(&self, id: u32) -> bool {
        self.eos_token_ids.binary_search(&id).is_ok()
    }

    /// The id of a token string, e.g. `"<|im_end|>"`.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The token string of an id (byte-level tokens look like `Ġthe`), for logprobs.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The bytes token `id` stands for, which may be part of a UTF-8 character (logprobs report
    /// them): a byte-level BPE token's own bytes, else the bytes of its decoded text.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let is_byte_level = matches!(
            self.inner.get_decoder(),
            Some(tokenizers::decoders::DecoderWrapper::ByteLevel(_))
        );
        if is_byte_level
            && !self.is_added_token(id)
            && let Some(bytes) = self
                .inner
                .id_to_token(id)
                .as_deref()
                .and_then(byte_level::token_bytes)
        {
            return bytes;
        }
        self.decode(&[id], false).unwrap_or_default().into_bytes()
    }

    /// The wrapped tokenizer, for anything this wrapper does not cover.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("engine", &self.engine())
            .field("vocab_size", &self.vocab_size)
            .field("eos_token_ids", &self.eos_token_ids)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_is_shareable() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Tokenizer>();
    }
}
