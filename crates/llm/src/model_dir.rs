//! Loading a Hugging Face model directory from local disk (never the network): tokenizer, chat
//! template, special tokens, EOS ids, context length and vocabulary size.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use crate::error::LlmError;
use crate::template::{ChatTemplate, SpecialTokens};
use crate::tokenizer::{Tokenizer, TokenizerEngine, samples};

/// `config.json` keys that hold the context length, most specific first.
const CONTEXT_LENGTH_KEYS: [&str; 7] = [
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "max_sequence_length",
    "max_seq_length",
    "seq_length",
    "n_ctx",
];

/// Nested configs of multimodal models that hold the language model's settings.
const NESTED_CONFIG_KEYS: [&str; 2] = ["text_config", "llm_config"];

/// transformers writes `model_max_length` as a huge sentinel when unknown; values above this are
/// ignored.
const MAX_PLAUSIBLE_CONTEXT: u64 = 1 << 27;

/// A loaded model directory: everything the frontend needs to preprocess requests for a model,
/// read once at registration and shared across requests.
#[derive(Debug, Clone)]
pub struct ModelDir {
    path: PathBuf,
    tokenizer: Arc<Tokenizer>,
    chat_template: Option<Arc<ChatTemplate>>,
    special_tokens: SpecialTokens,
    context_length: Option<u32>,
    vocab_size: usize,
    config: Value,
    /// Why the requested tokenizer engine was not used, when it was not.
    tokenizer_fallback: Option<String>,
}

impl ModelDir {
    /// Loads `path`: `tokenizer.json` (required), `config.json`, `tokenizer_config.json`,
    /// `chat_template.jinja` or `chat_template.json`, `generation_config.json` (all optional).
    /// The chat template is compiled here, so a broken one fails the load.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, LlmError> {
        Self::load_with(path, TokenizerEngine::Default)
    }

    /// [`Self::load`] with prompts encoded by `engine`. An engine other than the default that
    /// cannot load the tokenizer, or does not reproduce the default's ids on the model's own
    /// template output ([`samples::self_check_texts`]), is dropped with one warning naming why.
    pub fn load_with(path: impl AsRef<Path>, engine: TokenizerEngine) -> Result<Self, LlmError> {
        let path = path.as_ref().to_path_buf();
        let tokenizer_path = path.join("tokenizer.json");
        if !tokenizer_path.is_file() {
            return Err(LlmError::InvalidModel {
                path,
                message: "tokenizer.json not found".to_owned(),
            });
        }
        let config = read_json(&path.join("config.json"))?.unwrap_or(Value::Null);
        let tokenizer_config =
            read_json(&path.join("tokenizer_config.json"))?.unwrap_or(Value::Null);
        let generation_config = read_json(&path.join("generation_config.json"))?;

        let special_tokens = SpecialTokens {
            bos_token: token_content(&tokenizer_config, "bos_token"),
            eos_token: token_content(&tokenizer_config, "eos_token"),
            unk_token: token_content(&tokenizer_config, "unk_token"),
            pad_token: token_content(&tokenizer_config, "pad_token"),
        };

        let tokenizer = Tokenizer::from_file(&tokenizer_path)?;
        // Like transformers, generation_config.json falls back to config.json's eos ids.
        let mut eos_token_ids = token_ids(
            generation_config.as_ref().unwrap_or(&config),
            "eos_token_id",
        );
        if let Some(id) = special_tokens
            .eos_token
            .as_deref()
            .and_then(|t| tokenizer.token_to_id(t))
        {
            eos_token_ids.push(id);
        }
        let mut tokenizer = tokenizer.with_eos_token_ids(eos_token_ids);

        let chat_template = load_chat_template(&path, &tokenizer_config, &special_tokens)?;
        let mut tokenizer_fallback = None;
        let checks = samples::self_check_texts(chat_template.as_ref());
        if engine == TokenizerEngine::Fastokens
            && let Err(reason) = tokenizer.use_fastokens(&tokenizer_path, &checks)
        {
            tracing::warn!(model = %path.display(), %reason, "--tokenizer fastokens unavailable for this model; using the default tokenizer");
            tokenizer_fallback = Some(reason);
        }
        if let Err(reason) = tokenizer.check_prefix_cuts(&checks) {
            tracing::info!(model = %path.display(), %reason, "prompt prefix cache off for this model");
        }
        let context_length = context_length(&config).or_else(|| {
            tokenizer_config
                .get("model_max_length")
                .and_then(as_plausible_length)
        });
        let vocab_size = config_value(&config, "vocab_size")
            .and_then(Value::as_u64)
            .and_then(|v| usize::try_from(v).ok())
            .unwrap_or_else(|| tokenizer.vocab_size());

        Ok(Self {
            path,
            tokenizer: Arc::new(tokenizer),
            chat_template: chat_template.map(Arc::new),
            special_tokens,
            context_length,
            vocab_size,
            config,
            tokenizer_fallback,
        })
    }

    /// Why the engine asked of [`Self::load_with`] is not the one encoding, if it is not.
    pub fn tokenizer_fallback(&self) -> Option<&str> {
        self.tokenizer_fallback.as_deref()
    }

    /// The directory this was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory's last component, a default served model name.
    pub fn name(&self) -> Option<&str> {
        self.path.file_name().and_then(|name| name.to_str())
    }

    /// The shared tokenizer (EOS ids included).
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// The compiled chat template, if the model has one.
    pub fn chat_template(&self) -> Option<&Arc<ChatTemplate>> {
        self.chat_template.as_ref()
    }

    /// The chat template, or the error a chat request gets when there is none.
    pub fn require_chat_template(&self) -> Result<&Arc<ChatTemplate>, LlmError> {
        self.chat_template.as_ref().ok_or(LlmError::NoChatTemplate)
    }

    /// `bos_token`, `eos_token`, ... from `tokenizer_config.json`.
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.special_tokens
    }

    /// Ids that end generation: `generation_config.json`'s (else `config.json`'s) plus the
    /// tokenizer config's `eos_token`.
    pub fn eos_token_ids(&self) -> &[u32] {
        self.tokenizer.eos_token_ids()
    }

    /// The context length from `config.json`, else the tokenizer's `model_max_length`.
    pub fn context_length(&self) -> Option<u32> {
        self.context_length
    }

    /// `config.json`'s `vocab_size` (the embedding size, possibly padded), else the tokenizer's.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The raw `config.json` (`null` when absent), for model cards.
    pub fn config(&self) -> &Value {
        &self.config
    }
}

fn read_json(path: &Path) -> Result<Option<Value>, LlmError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(LlmError::Io {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|source| LlmError::ModelJson {
            path: path.to_path_buf(),
            source,
        })
}

/// A special token given as a string or as an `AddedToken` object `{"content": ...}`.
fn token_content(config: &Value, key: &str) -> Option<String> {
    match config.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Object(map) => map.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}

/// An id or a list of ids.
fn token_ids(config: &Value, key: &str) -> Vec<u32> {
    let to_id = |v: &Value| v.as_u64().and_then(|id| u32::try_from(id).ok());
    match config.get(key) {
        Some(Value::Array(ids)) => ids.iter().filter_map(to_id).collect(),
        Some(id) => to_id(id).into_iter().collect(),
        None => Vec::new(),
    }
}

/// A key of `config.json` or of its nested language-model config.
fn config_value<'a>(config: &'a Value, key: &str) -> Option<&'a Value> {
    config.get(key).or_else(|| {
        NESTED_CONFIG_KEYS
            .iter()
            .find_map(|nested| config.get(nested)?.get(key))
    })
}

fn context_length(config: &Value) -> Option<u32> {
    CONTEXT_LENGTH_KEYS
        .iter()
        .find_map(|key| config_value(config, key).and_then(as_plausible_length))
}

fn as_plausible_length(value: &Value) -> Option<u32> {
    let length = value.as_u64().or_else(|| {
        value
            .as_f64()
            .filter(|f| f.fract() == 0.0 && *f >= 0.0)
            .map(|f| f as u64)
    })?;
    if length == 0 || length > MAX_PLAUSIBLE_CONTEXT {
        return None;
    }
    u32::try_from(length).ok()
}

/// The chat template: `chat_template.jinja`, else `chat_template.json`, else
/// `tokenizer_config.json`'s `chat_template` (a string or a list of `{name, template}`).
fn load_chat_template(
    dir: &Path,
    tokenizer_config: &Value,
    special_tokens: &SpecialTokens,
) -> Result<Option<ChatTemplate>, LlmError> {
    let jinja_path = dir.join("chat_template.jinja");
    match std::fs::read_to_string(&jinja_path) {
        Ok(source) => return ChatTemplate::new(&source, special_tokens.clone()).map(Some),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(LlmError::Io {
                path: jinja_path,
                source,
            });
        }
    }
    let json_path = dir.join("chat_template.json");
    if let Some(file) = read_json(&json_path)? {
        return template_from_value(file.get("chat_template"), &json_path, special_tokens);
    }
    template_from_value(
        tokenizer_config.get("chat_template"),
        &dir.join("tokenizer_config.json"),
        special_tokens,
    )
}

fn template_from_value(
    value: Option<&Value>,
    path: &Path,
    special_tokens: &SpecialTokens,
) -> Result<Option<ChatTemplate>, LlmError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(source)) => ChatTemplate::new(source, special_tokens.clone()).map(Some),
        Some(Value::Array(entries)) => {
            let mut named = Vec::with_capacity(entries.len());
            for entry in entries {
                let name = entry.get("name").and_then(Value::as_str);
                let template = entry.get("template").and_then(Value::as_str);
                let (Some(name), Some(template)) = (name, template) else {
                    return Err(LlmError::InvalidModel {
                        path: path.to_path_buf(),
                        message: "chat_template entries need 'name' and 'template'".to_owned(),
                    });
                };
                named.push((name.to_owned(), template.to_owned()));
            }
            if named.is_empty() {
                return Ok(None);
            }
            ChatTemplate::with_named(named, special_tokens.clone()).map(Some)
        }
        Some(_) => Err(LlmError::InvalidModel {
            path: path.to_path_buf(),
            message: "chat_template must be a string or a list".to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests;
