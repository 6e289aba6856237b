//! LLM preprocessing and postprocessing for the kvmesh frontend: loading a Hugging Face model
//! directory, rendering chat templates, tokenizing, incremental detokenization, stop handling
//! and the OpenAI request/response types.
//!
//! Everything here is synchronous and CPU-bound; a [`ModelDir`] is loaded once per model and
//! shared (`Arc`) by all requests, and a [`Detokenizer`] plus a [`StopMatcher`] are created per
//! choice.

pub mod anthropic;
mod detokenizer;
mod error;
mod model_dir;
pub mod openai;
pub mod prefix_cache;
pub mod reasoning;
pub mod responses;
mod stop;
mod template;
mod tokenizer;
pub mod tool_calls;

pub use detokenizer::Detokenizer;
pub use error::{LlmError, LlmErrorCode};
pub use model_dir::ModelDir;
pub use prefix_cache::{EncodedPrompt, PrefixCache, PrefixCacheStats};
pub use stop::{StopMatcher, StopStep, TokenStop, TokenStopConditions};
pub use template::{ChatRenderInput, ChatTemplate, SpecialTokens};
pub use tokenizer::{Tokenizer, TokenizerEngine};
