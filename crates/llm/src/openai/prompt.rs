//! The `prompt` of a completions request (and the `input` of an embeddings request), read
//! straight from the JSON into its typed shape so that memory stays proportional to the body: a
//! token id costs four bytes, where serde's `untagged` would first buffer every element as a
//! generic value (tens of bytes each) and try each variant in turn.

use serde::de::{Deserializer, Error as _, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

/// What a prompt may be, as every error about its shape says it (callers put the field's name
/// in front).
pub const PROMPT_SHAPE: &str =
    "must be a string, a list of strings, a list of token ids, or a list of token id lists";

/// The `prompt` of a completions request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Prompt {
    /// One text prompt.
    Text(String),
    /// Several text prompts; each gets `n` choices.
    Texts(Vec<String>),
    /// One pre-tokenized prompt.
    Tokens(Vec<u32>),
    /// Several pre-tokenized prompts.
    TokenBatches(Vec<Vec<u32>>),
}

impl Default for Prompt {
    fn default() -> Self {
        Self::Text(String::new())
    }
}

impl Prompt {
    /// Number of prompts.
    pub fn len(&self) -> usize {
        match self {
            Self::Text(_) | Self::Tokens(_) => 1,
            Self::Texts(texts) => texts.len(),
            Self::TokenBatches(batches) => batches.len(),
        }
    }

    /// Whether there is no prompt at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether some prompt is empty (no text or no tokens).
    pub fn has_empty_prompt(&self) -> bool {
        match self {
            Self::Text(text) => text.is_empty(),
            Self::Tokens(tokens) => tokens.is_empty(),
            Self::Texts(texts) => texts.iter().any(String::is_empty),
            Self::TokenBatches(batches) => batches.iter().any(Vec::is_empty),
        }
    }
}

impl<'de> Deserialize<'de> for Prompt {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(PromptVisitor)
    }
}

struct PromptVisitor;

impl<'de> Visitor<'de> for PromptVisitor {
    type Value = Prompt;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(PROMPT_SHAPE)
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Prompt, E> {
        Ok(Prompt::Text(text.to_owned()))
    }

    fn visit_string<E: serde::de::Error>(self, text: String) -> Result<Prompt, E> {
        Ok(Prompt::Text(text))
    }

    /// The first element decides the shape; every later one must have the same.
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Prompt, A::Error> {
        let Some(first) = seq.next_element::<Element>()? else {
            return Ok(Prompt::Texts(Vec::new()));
        };
        Ok(match first {
            Element::Text(text) => Prompt::Texts(rest(text, &mut seq, |e| match e {
                Element::Text(text) => Some(text),
                _ => None,
            })?),
            Element::Token(token) => Prompt::Tokens(rest(token, &mut seq, |e| match e {
                Element::Token(token) => Some(token),
                _ => None,
            })?),
            Element::Tokens(tokens) => Prompt::TokenBatches(rest(tokens, &mut seq, |e| match e {
                Element::Tokens(tokens) => Some(tokens),
                _ => None,
            })?),
        })
    }
}

/// The first element and every later one that `same_shape` accepts, in order.
fn rest<'de, T, A: SeqAccess<'de>>(
    first: T,
    seq: &mut A,
    same_shape: impl Fn(Element) -> Option<T>,
) -> Result<Vec<T>, A::Error> {
    let mut items = vec![first];
    while let Some(element) = seq.next_element::<Element>()? {
        items.push(same_shape(element).ok_or_else(|| A::Error::custom(PROMPT_SHAPE))?);
    }
    Ok(items)
}

/// One element of a prompt list: a text, a token id, or a list of token ids.
enum Element {
    Text(String),
    Token(u32),
    Tokens(Vec<u32>),
}

impl<'de> Deserialize<'de> for Element {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ElementVisitor)
    }
}

struct ElementVisitor;

impl<'de> Visitor<'de> for ElementVisitor {
    type Value = Element;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(PROMPT_SHAPE)
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Element, E> {
        Ok(Element::Text(text.to_owned()))
    }

    fn visit_string<E: serde::de::Error>(self, text: String) -> Result<Element, E> {
        Ok(Element::Text(text))
    }

    fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<Element, E> {
        token_id(value).map(Element::Token)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Element, A::Error> {
        let mut tokens = Vec::new();
        while let Some(TokenId(token)) = seq.next_element()? {
            tokens.push(token);
        }
        Ok(Element::Tokens(tokens))
    }
}

/// A token id inside a list of token id lists.
struct TokenId(u32);

impl<'de> Deserialize<'de> for TokenId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(TokenIdVisitor)
    }
}

struct TokenIdVisitor;

impl Visitor<'_> for TokenIdVisitor {
    type Value = TokenId;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(PROMPT_SHAPE)
    }

    fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<TokenId, E> {
        token_id(value).map(TokenId)
    }
}

fn token_id<E: serde::de::Error>(value: u64) -> Result<u32, E> {
    u32::try_from(value).map_err(|_| E::custom(PROMPT_SHAPE))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<Prompt, String> {
        serde_json::from_str(json).map_err(|e| e.to_string())
    }

    #[test]
    fn every_shape_reads_into_its_variant() {
        assert_eq!(parse(r#""hi""#), Ok(Prompt::Text("hi".into())));
        assert_eq!(
            parse(r#"["a", "b"]"#),
            Ok(Prompt::Texts(vec!["a".into(), "b".into()]))
        );
        assert_eq!(
            parse("[1, 2, 4294967295]"),
            Ok(Prompt::Tokens(vec![1, 2, u32::MAX]))
        );
        assert_eq!(
            parse("[[1], [], [2, 3]]"),
            Ok(Prompt::TokenBatches(vec![vec![1], vec![], vec![2, 3]]))
        );
        assert_eq!(parse("[]"), Ok(Prompt::Texts(Vec::new())));
    }

    #[test]
    fn other_shapes_say_what_a_prompt_may_be() {
        for bad in [
            "5",
            "null",
            "{}",
            "[1, \"a\"]",
            "[\"a\", 1]",
            "[[1], 2]",
            "[4294967296]",
            "[-1]",
            "[1.5]",
            "[[1, \"a\"]]",
            "[[[1]]]",
            "[true]",
        ] {
            let error = parse(bad).expect_err(bad);
            assert!(error.contains(PROMPT_SHAPE), "{bad}: {error}");
        }
    }

    #[test]
    fn a_prompt_serializes_back_to_its_shape() {
        for json in [r#""hi""#, r#"["a","b"]"#, "[1,2]", "[[1],[2,3]]"] {
            let prompt: Prompt = serde_json::from_str(json).unwrap();
            assert_eq!(serde_json::to_string(&prompt).unwrap(), json);
        }
    }
}
