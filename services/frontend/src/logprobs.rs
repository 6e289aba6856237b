//! Log probabilities in the client's shapes. The worker reports token ids and numbers
//! (`GenerateResponse.logprobs`); this names each token (its text, or `token_id:<id>` with
//! `return_tokens_as_token_ids`) and lays the entries out as chat or completions responses do.

use std::sync::Arc;

use kvmesh_llm::Tokenizer;
use kvmesh_llm::openai::{
    ChatLogprob, ChatLogprobs, CompletionLogprobs, SamplingOptions, TopLogprob, TopLogprobMap,
};
use kvmesh_proto::v1::TokenLogprob;

/// Names tokens for one request that asked for log probabilities.
#[derive(Clone)]
pub struct LogprobText {
    tokenizer: Arc<Tokenizer>,
    as_token_ids: bool,
}

impl LogprobText {
    /// The namer of a request, or `None` when it did not ask for log probabilities.
    pub fn new(tokenizer: &Arc<Tokenizer>, sampling: &SamplingOptions) -> Option<Self> {
        sampling.logprobs.map(|_| Self {
            tokenizer: tokenizer.clone(),
            as_token_ids: sampling.return_tokens_as_token_ids,
        })
    }

    /// The name and bytes of a token; a token that ends inside a UTF-8 character is named with
    /// U+FFFD for the partial character, its bytes are exact.
    fn name(&self, id: u32) -> (String, Vec<u8>) {
        let bytes = self.tokenizer.token_bytes(id);
        let name = if self.as_token_ids {
            format!("token_id:{id}")
        } else {
            String::from_utf8_lossy(&bytes).into_owned()
        };
        (name, bytes)
    }

    /// `choices[i].logprobs` of a chat response or chunk: one entry per token.
    pub fn chat(&self, logprobs: &[TokenLogprob]) -> ChatLogprobs {
        let content = logprobs
            .iter()
            .map(|entry| {
                let (token, bytes) = self.name(entry.token_id);
                ChatLogprob {
                    token,
                    logprob: entry.logprob,
                    bytes: Some(bytes),
                    top_logprobs: entry
                        .top
                        .iter()
                        .map(|top| {
                            let (token, bytes) = self.name(top.token_id);
                            TopLogprob {
                                token,
                                logprob: top.logprob,
                                bytes: Some(bytes),
                            }
                        })
                        .collect(),
                }
            })
            .collect();
        ChatLogprobs {
            content: Some(content),
        }
    }

    /// `choices[i].logprobs` of a completions response or chunk; `offset` is the character
    /// offset of the first token in the choice's text and moves past the last one.
    pub fn completion(&self, logprobs: &[TokenLogprob], offset: &mut u32) -> CompletionLogprobs {
        let mut out = CompletionLogprobs::default();
        for entry in logprobs {
            let (token, _) = self.name(entry.token_id);
            out.text_offset.push(*offset);
            let text_len = String::from_utf8_lossy(&self.tokenizer.token_bytes(entry.token_id))
                .chars()
                .count();
            *offset += u32::try_from(text_len).unwrap_or(u32::MAX);
            out.tokens.push(token);
            out.token_logprobs.push(Some(entry.logprob));
            out.top_logprobs.push(Some(TopLogprobMap(
                entry
                    .top
                    .iter()
                    .map(|top| (self.name(top.token_id).0, top.logprob))
                    .collect(),
            )));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use kvmesh_proto::v1::TopLogprob as WireTop;

    use super::*;

    fn namer(as_token_ids: bool) -> (LogprobText, Arc<Tokenizer>) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny");
        let tokenizer = Arc::new(Tokenizer::from_file(dir.join("tokenizer.json")).unwrap());
        let sampling = SamplingOptions {
            logprobs: Some(1),
            return_tokens_as_token_ids: as_token_ids,
            ..SamplingOptions::default()
        };
        (LogprobText::new(&tokenizer, &sampling).unwrap(), tokenizer)
    }

    fn entries(tokenizer: &Tokenizer, text: &str) -> Vec<TokenLogprob> {
        let ids = tokenizer.encode(text, false).unwrap();
        ids.iter()
            .map(|&id| TokenLogprob {
                token_id: id,
                logprob: -0.5,
                top: vec![WireTop {
                    token_id: id,
                    logprob: -0.5,
                }],
            })
            .collect()
    }

    #[test]
    fn chat_entries_name_each_token_by_its_text_and_bytes() {
        let (namer, tokenizer) = namer(false);
        let chat = namer
            .chat(&entries(&tokenizer, " the cache é"))
            .content
            .unwrap();
        let text: Vec<u8> = chat.iter().flat_map(|e| e.bytes.clone().unwrap()).collect();
        assert_eq!(String::from_utf8(text).unwrap(), " the cache é");
        assert_eq!(chat[0].token, " the");
        assert_eq!(chat[0].top_logprobs[0].token, " the");
    }

    #[test]
    fn token_ids_replace_the_text_when_asked_for() {
        let (namer, tokenizer) = namer(true);
        let logprobs = entries(&tokenizer, " the");
        let id = logprobs[0].token_id;
        let chat = namer.chat(&logprobs).content.unwrap();
        assert_eq!(chat[0].token, format!("token_id:{id}"));
        let mut offset = 0;
        let completion = namer.completion(&logprobs, &mut offset);
        assert_eq!(completion.tokens, vec![format!("token_id:{id}")]);
    }

    #[test]
    fn completion_offsets_follow_the_text() {
        let (namer, tokenizer) = namer(false);
        let mut offset = 3;
        let completion = namer.completion(&entries(&tokenizer, " the cache"), &mut offset);
        assert_eq!(completion.text_offset, vec![3, 7]);
        assert_eq!(offset, 13);
        assert_eq!(completion.token_logprobs, vec![Some(-0.5), Some(-0.5)]);
    }
}
