//! OpenAI-compatible request and response types with vLLM's sampling extensions and `nvext`
//! (docs/http-api.md: "Errors", "Validation", "SSE", "Chat and completions responses", "nvext").
//!
//! Requests ignore unknown fields. Responses leave out absent optional fields the way OpenAI
//! does, but always send `finish_reason` and `logprobs` (null until set) on choices and
//! `"usage": null` on stream chunks when `include_usage` was requested. Stream chunks borrow
//! their strings (`Cow`) so that serializing one per token copies nothing.

mod chat;
mod chat_response;
mod common;
mod completion;
mod embeddings;
mod error;
mod functions;
mod guided;
mod logprobs;
mod models;
mod nvext;
mod prompt;
mod sampling;
mod tools;
mod unsupported;

pub use chat::{ChatCompletionRequest, ChatMessage, ContentPart, MessageContent};
pub use chat_response::{
    ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionResponse, ChatDelta,
    ChatResponseMessage,
};
pub use common::{
    ChatCompletionChunkObject, ChatCompletionObject, CompletionTokensDetails, FinishReason,
    ListObject, MAX_ANTHROPIC_STOP_SEQUENCES, ModelObjectTag, PromptTokensDetails, Role, Stop,
    StopEntry, StopField, StreamOptions, TextCompletionObject, Usage,
};
pub use completion::{
    CompletionChoice, CompletionChunk, CompletionChunkChoice, CompletionRequest,
    CompletionResponse, Prompt,
};
pub use embeddings::{
    EmbeddingObject, EmbeddingValue, EmbeddingsRequest, EmbeddingsResponse, EmbeddingsUsage,
};
pub use error::{ErrorCodeValue, ErrorDetail, ErrorResponse, StreamErrorBody};
pub use guided::{Guided, GuidedFields, MAX_GUIDED_CHOICES, guided_decoding};
pub use logprobs::{ChatLogprob, ChatLogprobs, CompletionLogprobs, TopLogprob, TopLogprobMap};
pub use models::{ModelList, ModelObject};
pub use prompt::PROMPT_SHAPE;
pub use sampling::{MAX_STOP_SEQUENCES, MAX_TOP_LOGPROBS, SamplingOptions, fit_max_tokens};
pub use tools::{
    ChatTool, FunctionCall, FunctionCallDelta, FunctionDefinition, FunctionName, JsonSchemaFormat,
    NamedToolChoice, ResponseFormat, ToolCall, ToolCallDelta, ToolChoice, ToolChoiceMode,
};
