//! The error type of the LLM crate and the small code table the frontend maps it through.

use std::path::PathBuf;

/// What kind of failure an [`LlmError`] is, so the edge can pick a status without matching on
/// every variant. The frontend maps it onto the runtime's `ErrorCode` in one place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LlmErrorCode {
    /// The client sent something wrong (HTTP 400, `invalid_request_error`).
    InvalidArgument,
    /// The client asked for something this model or server does not support (HTTP 501).
    NotImplemented,
    /// A broken model directory or a bug; the message is for logs, not for clients (HTTP 500).
    Internal,
}

/// Errors from loading a model directory, rendering chat templates, tokenizing and validating
/// OpenAI requests.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// A file of the model directory could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file that failed.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A JSON file of the model directory is malformed.
    #[error("invalid JSON in {path}: {source}")]
    ModelJson {
        /// The file that failed.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// The model directory is readable but unusable (missing tokenizer, bad field).
    #[error("invalid model directory {path}: {message}")]
    InvalidModel {
        /// The directory or file at fault.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// The tokenizer failed to load, encode or decode.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template does not compile. Detected at load, never per request.
    #[error("chat template does not compile: {0}")]
    TemplateSyntax(String),
    /// The model has no chat template but a chat request needs one.
    #[error("model has no chat template; use the completions endpoint or a raw prompt")]
    NoChatTemplate,
    /// The chat template called `raise_exception(message)`: the conversation is not one the
    /// model accepts (bad role, roles not alternating). The message is the template's own.
    #[error("{0}")]
    TemplateException(String),
    /// The chat template failed on this request's messages for another reason.
    #[error("chat template error: {0}")]
    TemplateRender(String),
    /// The request is invalid; `param` names the offending field when there is one.
    #[error("{message}")]
    InvalidRequest {
        /// The OpenAI `param` of the error body.
        param: Option<&'static str>,
        /// A client-facing description.
        message: String,
    },
    /// The request asks for something this model or server does not do.
    #[error("{0}")]
    Unsupported(String),
}

impl LlmError {
    /// The error for a `type` this server does not handle: not implemented when `kind` is one of
    /// the `recognised` types of the API (a valid request this release cannot serve), the
    /// client's mistake naming `param` otherwise.
    pub fn unhandled_kind(
        kind: &str,
        recognised: &[&str],
        param: &'static str,
        message: String,
    ) -> Self {
        if recognised.contains(&kind) {
            Self::Unsupported(message)
        } else {
            Self::InvalidRequest {
                param: Some(param),
                message,
            }
        }
    }

    /// Which kind of failure this is; the frontend turns it into an HTTP or gRPC status.
    pub fn code(&self) -> LlmErrorCode {
        match self {
            Self::Io { .. }
            | Self::ModelJson { .. }
            | Self::InvalidModel { .. }
            | Self::Tokenizer(_)
            | Self::TemplateSyntax(_) => LlmErrorCode::Internal,
            Self::NoChatTemplate
            | Self::TemplateException(_)
            | Self::TemplateRender(_)
            | Self::InvalidRequest { .. } => LlmErrorCode::InvalidArgument,
            Self::Unsupported(_) => LlmErrorCode::NotImplemented,
        }
    }

    /// Whether the client caused this error (a 4xx rather than a 5xx).
    pub fn is_user_error(&self) -> bool {
        self.code() != LlmErrorCode::Internal
    }

    /// The request field at fault, for the `param` of the OpenAI error body.
    pub fn param(&self) -> Option<&'static str> {
        match self {
            Self::InvalidRequest { param, .. } => *param,
            Self::TemplateException(_) | Self::TemplateRender(_) => Some("messages"),
            _ => None,
        }
    }

    /// A validation error naming `param`.
    pub fn invalid(param: &'static str, message: impl Into<String>) -> Self {
        Self::InvalidRequest {
            param: Some(param),
            message: message.into(),
        }
    }

    /// Wraps a tokenizers error, whose type is a boxed `dyn Error`.
    pub(crate) fn tokenizer(err: impl std::fmt::Display) -> Self {
        Self::Tokenizer(err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_split_user_and_internal_errors() {
        assert!(LlmError::TemplateException("bad role".into()).is_user_error());
        assert!(LlmError::invalid("n", "n must be at least 1").is_user_error());
        assert_eq!(
            LlmError::Unsupported("x".into()).code(),
            LlmErrorCode::NotImplemented
        );
        assert!(!LlmError::Tokenizer("boom".into()).is_user_error());
        assert_eq!(
            LlmError::TemplateException("Conversation roles must alternate".into()).to_string(),
            "Conversation roles must alternate"
        );
        assert_eq!(LlmError::invalid("top_p", "x").param(), Some("top_p"));
    }
}
