//! Log probabilities in the chat and the completions shapes.

use std::fmt;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `choices[i].logprobs` of a chat response or chunk.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatLogprobs {
    /// One entry per generated token.
    pub content: Option<Vec<ChatLogprob>>,
}

/// The log probability of one generated token and its alternatives.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatLogprob {
    /// The token text (or `token_id:<id>` with `return_tokens_as_token_ids`).
    pub token: String,
    /// Natural log probability, ≤ 0.
    pub logprob: f32,
    /// UTF-8 bytes of the token, since a token may be part of a character.
    pub bytes: Option<Vec<u8>>,
    /// The most likely tokens at this position, as many as `top_logprobs` asked for.
    pub top_logprobs: Vec<TopLogprob>,
}

/// One alternative of a [`ChatLogprob`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TopLogprob {
    /// The token text.
    pub token: String,
    /// Natural log probability, ≤ 0.
    pub logprob: f32,
    /// UTF-8 bytes of the token.
    pub bytes: Option<Vec<u8>>,
}

/// `choices[i].logprobs` of a completions response: parallel arrays of equal length.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CompletionLogprobs {
    /// Token texts.
    pub tokens: Vec<String>,
    /// Log probability of each token (`null` for the first echoed prompt token).
    pub token_logprobs: Vec<Option<f32>>,
    /// The top alternatives at each position, `{token: logprob}`.
    #[schema(value_type = Vec<Option<std::collections::HashMap<String, f32>>>)]
    pub top_logprobs: Vec<Option<TopLogprobMap>>,
    /// Character offset of each token in the returned text.
    pub text_offset: Vec<u32>,
}

/// A `{token: logprob}` object that keeps the order it was built in (most likely first).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TopLogprobMap(pub Vec<(String, f32)>);

impl Serialize for TopLogprobMap {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (token, logprob) in &self.0 {
            map.serialize_entry(token, logprob)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for TopLogprobMap {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MapVisitor;

        impl<'de> Visitor<'de> for MapVisitor {
            type Value = TopLogprobMap;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of token to logprob")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
                let mut entries = Vec::with_capacity(access.size_hint().unwrap_or(0));
                while let Some(entry) = access.next_entry::<String, f32>()? {
                    entries.push(entry);
                }
                Ok(TopLogprobMap(entries))
            }
        }

        deserializer.deserialize_map(MapVisitor)
    }
}
