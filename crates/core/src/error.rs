//! The one code table every kvmesh crate maps its errors to.
//!
//! Each crate has its own `thiserror` enum; each enum says which [`ErrorCode`] it is. The code maps
//! to an HTTP status (with an OpenAI error `type`) here, and to a gRPC status in one place of
//! `kvmesh-runtime` (which owns the gRPC dependency), where the code also rides in the status's
//! metadata under its [`ErrorCode::name`].

/// What kind of failure an error is, independent of the protocol that reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The caller sent something wrong.
    InvalidArgument,
    /// The named model, route or object does not exist.
    NotFound,
    /// The request body is over the size limit.
    PayloadTooLarge,
    /// The path exists but not with this method.
    MethodNotAllowed,
    /// The body's content type is not one the route takes.
    UnsupportedMediaType,
    /// The caller sent no credential or a wrong one (an API or admin key).
    Unauthenticated,
    /// Known but not ready: no worker, draining, a dependency down.
    Unavailable,
    /// Every worker is busy or a queue is full.
    Overloaded,
    /// A deadline passed before the response started.
    Timeout,
    /// A recognised feature that is not supported.
    NotImplemented,
    /// The caller went away.
    Cancelled,
    /// Anything unclassified. Its message must not leak internals to clients.
    Internal,
}

impl ErrorCode {
    /// HTTP status for this code. `Overloaded` uses the configurable overload status.
    pub fn http_status(self, overload_status: u16) -> u16 {
        match self {
            Self::InvalidArgument => 400,
            Self::NotFound => 404,
            Self::PayloadTooLarge => 413,
            Self::MethodNotAllowed => 405,
            Self::UnsupportedMediaType => 415,
            Self::Unauthenticated => 401,
            Self::Unavailable => 503,
            Self::Overloaded => overload_status,
            Self::Timeout => 504,
            Self::NotImplemented => 501,
            Self::Cancelled => 499,
            Self::Internal => 500,
        }
    }

    /// The OpenAI error `type` string for this code.
    pub fn openai_type(self) -> &'static str {
        match self {
            Self::InvalidArgument
            | Self::PayloadTooLarge
            | Self::MethodNotAllowed
            | Self::UnsupportedMediaType => "invalid_request_error",
            Self::Unauthenticated => "authentication_error",
            Self::NotFound => "not_found_error",
            Self::Unavailable => "service_unavailable",
            Self::Overloaded => "overloaded",
            Self::Timeout => "timeout",
            Self::NotImplemented => "not_implemented",
            Self::Cancelled => "cancelled",
            Self::Internal => "internal_error",
        }
    }

    /// The Anthropic error `type` string for this code (the Messages API's error shape).
    pub fn anthropic_type(self) -> &'static str {
        match self {
            Self::InvalidArgument | Self::MethodNotAllowed | Self::UnsupportedMediaType => {
                "invalid_request_error"
            }
            Self::Unauthenticated => "authentication_error",
            Self::NotFound => "not_found_error",
            Self::PayloadTooLarge => "request_too_large",
            Self::Unavailable | Self::Overloaded => "overloaded_error",
            Self::Timeout => "timeout_error",
            Self::NotImplemented | Self::Cancelled | Self::Internal => "api_error",
        }
    }

    /// The `error_type` label of `requests_total` for this code.
    pub fn metric_label(self) -> &'static str {
        match self {
            Self::InvalidArgument
            | Self::PayloadTooLarge
            | Self::MethodNotAllowed
            | Self::UnsupportedMediaType => "validation",
            Self::Unauthenticated => "unauthenticated",
            Self::NotFound => "not_found",
            Self::Unavailable | Self::Internal => "internal",
            Self::Overloaded => "overload",
            Self::Timeout => "response_timeout",
            Self::NotImplemented => "not_implemented",
            Self::Cancelled => "cancelled",
        }
    }

    /// The stable name of this code on the wire (gRPC metadata, `RouteFailure`).
    pub fn name(self) -> &'static str {
        match self {
            Self::InvalidArgument => "invalid_argument",
            Self::NotFound => "not_found",
            Self::PayloadTooLarge => "payload_too_large",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::UnsupportedMediaType => "unsupported_media_type",
            Self::Unauthenticated => "unauthenticated",
            Self::Unavailable => "unavailable",
            Self::Overloaded => "overloaded",
            Self::Timeout => "timeout",
            Self::NotImplemented => "not_implemented",
            Self::Cancelled => "cancelled",
            Self::Internal => "internal",
        }
    }

    /// The code [`Self::name`] gives, if `name` is one.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|code| code.name() == name)
    }

    /// Every code, for tables and tests.
    pub const ALL: [Self; 12] = [
        Self::InvalidArgument,
        Self::NotFound,
        Self::PayloadTooLarge,
        Self::MethodNotAllowed,
        Self::UnsupportedMediaType,
        Self::Unauthenticated,
        Self::Unavailable,
        Self::Overloaded,
        Self::Timeout,
        Self::NotImplemented,
        Self::Cancelled,
        Self::Internal,
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_name(code.name()), Some(code));
        }
        assert_eq!(ErrorCode::from_name("nonsense"), None);
        assert_eq!(ErrorCode::Overloaded.http_status(529), 529);
        assert_eq!(ErrorCode::InvalidArgument.http_status(529), 400);
        assert_eq!(ErrorCode::Unauthenticated.http_status(529), 401);
        assert_eq!(
            ErrorCode::Unauthenticated.openai_type(),
            "authentication_error"
        );
        assert_eq!(
            ErrorCode::Unauthenticated.anthropic_type(),
            "authentication_error"
        );
        assert_eq!(ErrorCode::UnsupportedMediaType.http_status(529), 415);
    }
}
