//! The frontend's error type and its single mapping to HTTP responses with the OpenAI error body.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use kvmesh_runtime::ErrorCode;

/// Everything that can go wrong while serving one request.
#[derive(Debug, thiserror::Error)]
pub enum FrontendError {
    /// The request is malformed or violates a limit; `param` names the field when known.
    #[error("{message}")]
    InvalidRequest {
        /// What is wrong, for the client.
        message: String,
        /// The offending field.
        param: Option<String>,
    },
    /// No model of that name is served.
    #[error("model '{0}' not found")]
    ModelNotFound(String),
    /// The path is not a route.
    #[error("route {0} not found")]
    RouteNotFound(String),
    /// The path is a route, but not for this method.
    #[error("method {method} is not allowed on {path}")]
    MethodNotAllowed {
        /// The request's method.
        method: String,
        /// The request's path.
        path: String,
    },
    /// The body is over the configured limit.
    #[error("request body is larger than the limit of {limit_mb} MiB")]
    PayloadTooLarge {
        /// The limit in MiB.
        limit_mb: u64,
    },
    /// The request carries no key, or one the frontend does not know (`--http-api-keys-file`,
    /// `--http-admin-keys-file`).
    #[error("{0}")]
    Unauthenticated(crate::auth::AuthFailure),
    /// The body's content type is not one the route takes.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// The model is known but has no ready worker.
    #[error("model '{0}' has no ready workers")]
    NoWorkers(String),
    /// The frontend is shutting down.
    #[error("the server is shutting down")]
    Draining,
    /// The worker stayed silent past the backend stream timeout.
    #[error("the worker did not respond within {0} s")]
    Timeout(u64),
    /// A recognised feature that is not supported.
    #[error("{0}")]
    NotImplemented(String),
    /// The worker failed or returned an error status.
    #[error("worker error: {message}")]
    Worker {
        /// How the worker's status classifies.
        code: ErrorCode,
        /// The worker's message.
        message: String,
    },
    /// The router could not place the request (no worker, all busy, bad routing header).
    #[error("{0}")]
    Route(kvmesh_routing::RouteError),
    /// A chat processor chose this HTTP status (`HttpError`): the client reads the status's
    /// reason phrase, the processor's message is only logged (docs/processors.md, "Errors").
    #[error("{}", processor_reason(*status))]
    ProcessorStatus {
        /// The status the processor asked for.
        status: u16,
        /// The processor's message, for the logs.
        detail: String,
    },
    /// Anything unclassified; the message is logged, not sent.
    #[error("internal error")]
    Internal(String),
}

/// The status a processor's `HttpError` gets: its own for a 4xx, 503 or 529, else 500.
fn processor_status(status: u16) -> u16 {
    if (400..500).contains(&status) || status == 503 || status == 529 {
        status
    } else {
        500
    }
}

/// The standard reason phrase of the status a processor's `HttpError` gets.
fn processor_reason(status: u16) -> &'static str {
    match processor_status(status) {
        529 => "Overloaded",
        status => StatusCode::from_u16(status)
            .ok()
            .and_then(|code| code.canonical_reason())
            .unwrap_or("Error"),
    }
}

impl From<crate::preprocess::PoolStopped> for FrontendError {
    fn from(error: crate::preprocess::PoolStopped) -> Self {
        Self::Internal(error.to_string())
    }
}

impl FrontendError {
    /// Shorthand for a client mistake naming a field.
    pub fn invalid(message: impl Into<String>, param: Option<&str>) -> Self {
        Self::InvalidRequest {
            message: message.into(),
            param: param.map(str::to_string),
        }
    }

    /// The protocol-independent kind of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::InvalidRequest { .. } => ErrorCode::InvalidArgument,
            Self::ModelNotFound(_) | Self::RouteNotFound(_) => ErrorCode::NotFound,
            Self::MethodNotAllowed { .. } => ErrorCode::MethodNotAllowed,
            Self::PayloadTooLarge { .. } => ErrorCode::PayloadTooLarge,
            Self::Unauthenticated(_) => ErrorCode::Unauthenticated,
            Self::UnsupportedMediaType(_) => ErrorCode::UnsupportedMediaType,
            Self::NoWorkers(_) | Self::Draining => ErrorCode::Unavailable,
            Self::Timeout(_) => ErrorCode::Timeout,
            Self::NotImplemented(_) => ErrorCode::NotImplemented,
            Self::Worker { code, .. } => *code,
            Self::Route(error) => error.code(),
            Self::ProcessorStatus { status, .. } => match processor_status(*status) {
                404 => ErrorCode::NotFound,
                413 => ErrorCode::PayloadTooLarge,
                405 => ErrorCode::MethodNotAllowed,
                503 => ErrorCode::Unavailable,
                529 => ErrorCode::Overloaded,
                400..500 => ErrorCode::InvalidArgument,
                _ => ErrorCode::Internal,
            },
            Self::Internal(_) => ErrorCode::Internal,
        }
    }

    /// The HTTP status of this error with the configured overload status.
    pub fn http_status(&self, overload_status: u16) -> u16 {
        match self {
            Self::ProcessorStatus { status, .. } => processor_status(*status),
            _ => self.code().http_status(overload_status),
        }
    }

    /// The OpenAI `code` field.
    fn openai_code(&self) -> Option<&'static str> {
        match self {
            Self::ModelNotFound(_) => Some("model_not_found"),
            Self::PayloadTooLarge { .. } => Some("request_too_large"),
            Self::Unauthenticated(failure) => failure.openai_code(),
            _ => None,
        }
    }

    /// Whether the message carries detail that must stay in the logs: a worker's internal
    /// failure can say anything (a traceback, a transport error naming hosts).
    pub(crate) fn is_private(&self) -> bool {
        matches!(
            self,
            Self::Worker {
                code: ErrorCode::Internal,
                ..
            }
        )
    }

    /// The message a client may read: a private worker failure is summarised.
    pub fn public_message(&self) -> String {
        if self.is_private() {
            "the worker failed while serving the request".to_string()
        } else {
            self.to_string()
        }
    }

    /// Logs what the client is not told (an internal detail, a private worker failure).
    fn log_private_detail(&self) {
        if let Self::Internal(detail) = self {
            tracing::error!(detail = %detail, "internal error");
        }
        if let Self::ProcessorStatus { status, detail } = self {
            tracing::warn!(status, detail = %detail, "chat processor raised HttpError");
        }
        if self.is_private() {
            tracing::error!(error = %self, "worker failure");
        }
    }

    /// The gRPC status of this error: its code through the one table, the public message.
    pub fn to_status(&self) -> tonic::Status {
        use kvmesh_runtime::GrpcErrorCode as _;
        self.log_private_detail();
        self.code().to_status(self.public_message())
    }

    /// The OpenAI error body: `{"error":{message,type,param,code}, message, type, code}`.
    pub fn body(&self) -> serde_json::Value {
        let code = self.code();
        let message = self.public_message();
        let kind = code.openai_type();
        let param = match self {
            Self::InvalidRequest { param, .. } => param.clone(),
            _ => None,
        };
        let error_code = self.openai_code();
        serde_json::json!({
            "error": {"message": message, "type": kind, "param": param, "code": error_code},
            "message": message,
            "type": kind,
            "code": error_code,
        })
    }

    /// The Anthropic error body: `{"type":"error","error":{type,message}}`.
    pub fn anthropic_body(&self) -> serde_json::Value {
        serde_json::json!({
            "type": "error",
            "error": {"type": self.code().anthropic_type(), "message": self.public_message()},
        })
    }

    /// Builds the HTTP response with the configured overload status and the OpenAI body.
    pub fn into_response_with(self, overload_status: u16) -> Response {
        let body = self.body();
        self.into_response_with_body(overload_status, body)
    }

    /// Builds the HTTP response with the configured overload status and the Anthropic body.
    pub fn into_anthropic_response_with(self, overload_status: u16) -> Response {
        let body = self.anthropic_body();
        self.into_response_with_body(overload_status, body)
    }

    fn into_response_with_body(self, overload_status: u16, body: serde_json::Value) -> Response {
        self.log_private_detail();
        let status = StatusCode::from_u16(self.http_status(overload_status))
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = body.to_string();
        let mut response = (status, body).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if matches!(self, Self::Unauthenticated(_)) {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<kvmesh_routing::RouteError> for FrontendError {
    /// The seam's failures: a worker's failure and silence keep the edge's own words for them.
    fn from(error: kvmesh_routing::RouteError) -> Self {
        match error {
            kvmesh_routing::RouteError::Worker { code, message } => Self::Worker { code, message },
            kvmesh_routing::RouteError::WorkerTimeout(secs) => Self::Timeout(secs),
            other => Self::Route(other),
        }
    }
}

impl From<kvmesh_llm::LlmError> for FrontendError {
    fn from(error: kvmesh_llm::LlmError) -> Self {
        match error.code() {
            kvmesh_llm::LlmErrorCode::InvalidArgument => {
                Self::invalid(error.to_string(), error.param())
            }
            kvmesh_llm::LlmErrorCode::NotImplemented => Self::NotImplemented(error.to_string()),
            kvmesh_llm::LlmErrorCode::Internal => Self::Internal(error.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use kvmesh_routing::RouteError;

    use super::*;

    #[test]
    fn route_errors_map_to_statuses_and_types() {
        let status = |error: RouteError| {
            let error = FrontendError::from(error);
            (
                error.code().http_status(529),
                error.body()["error"]["type"].clone(),
            )
        };
        assert_eq!(status(RouteError::NoEndpoint).0, 503);
        assert_eq!(status(RouteError::NotReady).0, 503);
        assert_eq!(status(RouteError::BadRequest("x".into())).0, 400);
        let (code, kind) = status(RouteError::Overloaded);
        assert_eq!(code, 529);
        assert_eq!(kind, "overloaded");
        let body = FrontendError::from(RouteError::Overloaded).body();
        assert_eq!(body["message"], kvmesh_routing::OVERLOADED_MESSAGE);
    }

    #[test]
    fn body_has_openai_and_flat_fields() {
        let error = FrontendError::invalid("messages must not be empty", Some("messages"));
        let body = error.body();
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["param"], "messages");
        assert_eq!(body["message"], "messages must not be empty");
        let response = FrontendError::ModelNotFound("x".into()).into_response_with(529);
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
    }

    #[test]
    fn internal_errors_hide_details() {
        let body = FrontendError::Internal("secret path /etc".into()).body();
        assert_eq!(body["error"]["message"], "internal error");
        let worker = FrontendError::Worker {
            code: ErrorCode::Internal,
            message: "Traceback (most recent call last): File \"/opt/engine.py\"".into(),
        };
        let message = worker.body()["error"]["message"].to_string();
        assert!(
            !message.contains("Traceback") && !message.contains("/opt"),
            "{message}"
        );
        // A worker's verdict on the request itself is the client's to read.
        let rejected = FrontendError::Worker {
            code: ErrorCode::InvalidArgument,
            message: "prompt is longer than the KV pool".into(),
        };
        assert!(
            rejected.body()["error"]["message"]
                .to_string()
                .contains("KV pool")
        );
    }
}
