//! Decoding for vocabularies whose decoder is plain byte-level (GPT-2 style), from a table of
//! every token's bytes built at load. It gives exactly what the Hugging Face decoder gives:
//! each id's token (an added token's decoding form first, then the model's), special ones left
//! out when asked, each token mapped through the byte-level alphabet (a token with a character
//! outside it kept as its own UTF-8), and the bytes read as UTF-8 with U+FFFD for what is not.
//! The Hugging Face path allocates a string per token and looks each character up in a hash
//! map; streaming decodes a short window after every token, so that cost is paid per token.

use tokenizers::decoders::DecoderWrapper;

use super::byte_level;

/// The bytes of every token, and which tokens are special.
pub(crate) struct ByteDecoder {
    /// Every token's bytes, one after another in id order.
    bytes: Vec<u8>,
    /// `ends[id]`: where the bytes of `id` end in `bytes` (they start where those of `id - 1`
    /// end). An id without a token has no bytes.
    ends: Vec<u32>,
    /// Whether each id's token is a special added token (left out with `skip_special_tokens`).
    special: Vec<bool>,
}

impl ByteDecoder {
    /// The table for `tokenizer`, when its decoder is byte-level and nothing else.
    pub(crate) fn build(tokenizer: &tokenizers::Tokenizer) -> Option<Self> {
        if !matches!(tokenizer.get_decoder(), Some(DecoderWrapper::ByteLevel(_))) {
            return None;
        }
        let added = tokenizer.get_added_vocabulary();
        let max_added = tokenizer
            .get_added_tokens_decoder()
            .keys()
            .max()
            .map_or(0, |&id| id as usize + 1);
        let num_ids = tokenizer.get_vocab_size(true).max(max_added);
        let mut bytes = Vec::new();
        let mut ends = Vec::with_capacity(num_ids);
        let mut special = Vec::with_capacity(num_ids);
        for id in 0..u32::try_from(num_ids).ok()? {
            let token = tokenizer.id_to_token(id);
            if let Some(token) = &token {
                match byte_level::token_bytes(token) {
                    Some(own) => bytes.extend_from_slice(&own),
                    None => bytes.extend_from_slice(token.as_bytes()),
                }
            }
            ends.push(u32::try_from(bytes.len()).ok()?);
            special.push(token.is_some_and(|token| added.is_special_token(&token)));
        }
        Some(Self {
            bytes,
            ends,
            special,
        })
    }

    /// The text of `ids`.
    pub(crate) fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> String {
        let mut out = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            let id = id as usize;
            if id >= self.ends.len() || (skip_special_tokens && self.special[id]) {
                continue;
            }
            let start = if id == 0 { 0 } else { self.ends[id - 1] };
            out.extend_from_slice(&self.bytes[start as usize..self.ends[id] as usize]);
        }
        String::from_utf8(out)
            .unwrap_or_else(|error| String::from_utf8_lossy(error.as_bytes()).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::Tokenizer;

    fn tiny() -> Tokenizer {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny");
        Tokenizer::from_file(dir.join("tokenizer.json")).unwrap()
    }

    /// The table's text and the Hugging Face decoder's for `ids`.
    fn both(tokenizer: &Tokenizer, ids: &[u32], skip: bool) -> (String, String) {
        let table = tokenizer.byte_decoder.as_ref().expect("byte-level decoder");
        let reference = tokenizer.inner().decode(ids, skip).unwrap();
        (table.decode(ids, skip), reference)
    }

    #[test]
    fn every_id_decodes_as_the_hugging_face_decoder_does() {
        let tokenizer = tiny();
        let upper = tokenizer.vocab_size() as u32 + 3;
        for id in 0..upper {
            for skip in [false, true] {
                let (got, expected) = both(&tokenizer, &[id], skip);
                assert_eq!(got, expected, "id {id}, skip {skip}");
            }
        }
    }

    #[test]
    fn sequences_decode_as_the_hugging_face_decoder_does() {
        let tokenizer = tiny();
        let texts = [
            "Hello, world! héllo wörld",
            "日本語のテキストと絵文字 🎉🚀 mixed with ASCII",
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
            "fn main() {\n    println!(\"{}\", 1 + 2);\n}",
        ];
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        for text in texts {
            let ids = tokenizer.encode(text, false).unwrap();
            // Every short window, as a streaming decoder asks for them (cuts inside characters
            // included, which the Hugging Face decoder fills with U+FFFD), and the whole.
            let (got, expected) = both(&tokenizer, &ids, false);
            assert_eq!(got, expected);
            for start in 0..ids.len() {
                for end in start..=(start + 8).min(ids.len()) {
                    for skip in [false, true] {
                        let (got, expected) = both(&tokenizer, &ids[start..end], skip);
                        assert_eq!(got, expected, "{text:?} [{start}..{end}] skip {skip}");
                    }
                }
            }
            // Random ids, out-of-vocabulary ones among them.
            for _ in 0..200 {
                let mut random = Vec::new();
                for _ in 0..12 {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    random.push((state % (tokenizer.vocab_size() as u64 + 10)) as u32);
                }
                let (got, expected) = both(&tokenizer, &random, true);
                assert_eq!(got, expected, "{random:?}");
            }
        }
    }

    #[test]
    fn a_vocabulary_with_another_decoder_has_no_table() {
        let mut inner = tiny().inner().clone();
        inner.with_decoder(Some(tokenizers::decoders::bpe::BPEDecoder::default()));
        assert!(ByteDecoder::build(&inner).is_none());
    }
}
