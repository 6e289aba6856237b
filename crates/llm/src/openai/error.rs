//! The OpenAI error body, with Dynamo's flat copies of its fields for older clients.

use serde::{Deserialize, Serialize};

/// `{"error":{"message","type","param","code"},"message","type","code"}` (docs/http-api.md,
/// "Errors"). The SDKs read `error`; the flat fields keep clients of older Dynamo versions
/// working.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorResponse {
    /// The OpenAI error object.
    pub error: ErrorDetail,
    /// Same as `error.message`.
    pub message: String,
    /// Same as `error.type`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Same as `error.code`.
    pub code: Option<ErrorCodeValue>,
}

/// The `error` object of an error body or of a mid-stream error event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// What went wrong, for people.
    pub message: String,
    /// `invalid_request_error`, `not_found_error`, `internal_error`, ...
    #[serde(rename = "type")]
    pub kind: String,
    /// The request field at fault.
    pub param: Option<String>,
    /// A machine-readable code such as `model_not_found`.
    pub code: Option<ErrorCodeValue>,
}

/// An error `code`: OpenAI uses strings, some servers send the HTTP status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum ErrorCodeValue {
    /// `"model_not_found"`.
    Text(String),
    /// `400`.
    Int(i64),
}

impl From<&str> for ErrorCodeValue {
    fn from(code: &str) -> Self {
        Self::Text(code.to_owned())
    }
}

impl From<i64> for ErrorCodeValue {
    fn from(code: i64) -> Self {
        Self::Int(code)
    }
}

/// The body of an error sent after a stream has started: `data: {"error": {...}}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StreamErrorBody<'a> {
    /// The error object.
    pub error: &'a ErrorDetail,
}

impl ErrorResponse {
    /// An error body; the flat fields copy the nested ones.
    pub fn new(
        message: impl Into<String>,
        kind: impl Into<String>,
        param: Option<String>,
        code: Option<ErrorCodeValue>,
    ) -> Self {
        let message = message.into();
        let kind = kind.into();
        Self {
            error: ErrorDetail {
                message: message.clone(),
                kind: kind.clone(),
                param,
                code: code.clone(),
            },
            message,
            kind,
            code,
        }
    }

    /// The mid-stream form of this error.
    pub fn stream_body(&self) -> StreamErrorBody<'_> {
        StreamErrorBody { error: &self.error }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_body_has_the_exact_shape() {
        let body = ErrorResponse::new(
            "The model `x` does not exist.",
            "not_found_error",
            None,
            Some("model_not_found".into()),
        );
        let json = serde_json::to_value(&body).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "error": {
                    "message": "The model `x` does not exist.",
                    "type": "not_found_error",
                    "param": null,
                    "code": "model_not_found"
                },
                "message": "The model `x` does not exist.",
                "type": "not_found_error",
                "code": "model_not_found"
            })
        );
        let stream = serde_json::to_string(&body.stream_body()).unwrap();
        assert_eq!(
            stream,
            r#"{"error":{"message":"The model `x` does not exist.","type":"not_found_error","param":null,"code":"model_not_found"}}"#
        );
        let parsed: ErrorResponse = serde_json::from_value(json).unwrap();
        assert_eq!(parsed, body);
    }
}
