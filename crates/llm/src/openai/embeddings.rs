//! `POST /v1/embeddings` request and response.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::completion::Prompt;

/// An embeddings request. `input` takes the shapes of a completion prompt: a string, strings,
/// token ids, or lists of token ids.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
pub struct EmbeddingsRequest {
    /// The served model name.
    pub model: String,
    /// What to embed.
    pub input: Prompt,
    /// `float` (the default) or `base64` (little-endian f32 bytes).
    #[serde(default)]
    pub encoding_format: Option<String>,
    /// Length of each vector (default: the model's).
    #[serde(default)]
    pub dimensions: Option<i64>,
    /// End-user id, for logs.
    #[serde(default)]
    pub user: Option<String>,
    /// NVIDIA extensions.
    #[serde(default)]
    pub nvext: Option<Value>,
}

/// `{"object":"list","data":[...],"model","usage"}`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct EmbeddingsResponse {
    /// Always `list`.
    pub object: &'static str,
    /// One entry per input, in order.
    pub data: Vec<EmbeddingObject>,
    /// The served model name.
    pub model: String,
    /// Token counts.
    pub usage: EmbeddingsUsage,
}

/// One vector of an [`EmbeddingsResponse`].
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct EmbeddingObject {
    /// Always `embedding`.
    pub object: &'static str,
    /// Which input it embeds.
    pub index: u32,
    /// The vector: floats, or a base64 string of little-endian f32 bytes.
    pub embedding: EmbeddingValue,
}

/// The two encodings of a vector.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum EmbeddingValue {
    /// `encoding_format: float`.
    Float(Vec<f32>),
    /// `encoding_format: base64`.
    Base64(String),
}

/// Tokens embedded.
#[derive(Debug, Clone, Copy, Serialize, utoipa::ToSchema)]
pub struct EmbeddingsUsage {
    /// Tokens of every input together.
    pub prompt_tokens: u32,
    /// The same (nothing is generated).
    pub total_tokens: u32,
}
