//! The runtime's error type and the one code table every crate maps its errors to.
//!
//! Each crate has its own `thiserror` enum; each enum says which [`ErrorCode`] it is. The code maps
//! to an HTTP status (with an OpenAI error `type`) and to a gRPC status in exactly one place here.

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
            Self::InvalidArgument | Self::PayloadTooLarge | Self::MethodNotAllowed => {
                "invalid_request_error"
            }
            Self::NotFound => "not_found_error",
            Self::Unavailable => "service_unavailable",
            Self::Overloaded => "overloaded",
            Self::Timeout => "timeout",
            Self::NotImplemented => "not_implemented",
            Self::Cancelled => "cancelled",
            Self::Internal => "internal_error",
        }
    }

    /// The `error_type` label of `requests_total` for this code.
    pub fn metric_label(self) -> &'static str {
        match self {
            Self::InvalidArgument | Self::PayloadTooLarge | Self::MethodNotAllowed => "validation",
            Self::NotFound => "not_found",
            Self::Unavailable | Self::Internal => "internal",
            Self::Overloaded => "overload",
            Self::Timeout => "response_timeout",
            Self::NotImplemented => "not_implemented",
            Self::Cancelled => "cancelled",
        }
    }

    /// gRPC status code for this code.
    pub fn grpc_code(self) -> tonic::Code {
        match self {
            Self::InvalidArgument => tonic::Code::InvalidArgument,
            Self::NotFound => tonic::Code::NotFound,
            Self::PayloadTooLarge => tonic::Code::OutOfRange,
            Self::MethodNotAllowed => tonic::Code::Unimplemented,
            Self::Unavailable => tonic::Code::Unavailable,
            Self::Overloaded => tonic::Code::ResourceExhausted,
            Self::Timeout => tonic::Code::DeadlineExceeded,
            Self::NotImplemented => tonic::Code::Unimplemented,
            Self::Cancelled => tonic::Code::Cancelled,
            Self::Internal => tonic::Code::Internal,
        }
    }

    /// The code a gRPC status maps back to, for errors that cross a process boundary.
    pub fn from_grpc(code: tonic::Code) -> Self {
        match code {
            tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition => Self::InvalidArgument,
            tonic::Code::NotFound => Self::NotFound,
            tonic::Code::OutOfRange => Self::PayloadTooLarge,
            tonic::Code::Unavailable => Self::Unavailable,
            tonic::Code::ResourceExhausted => Self::Overloaded,
            tonic::Code::DeadlineExceeded => Self::Timeout,
            tonic::Code::Unimplemented => Self::NotImplemented,
            tonic::Code::Cancelled => Self::Cancelled,
            _ => Self::Internal,
        }
    }

    /// A gRPC status with this code and message.
    pub fn to_status(self, message: impl Into<String>) -> tonic::Status {
        tonic::Status::new(self.grpc_code(), message)
    }
}

/// Errors of the runtime crate: discovery, event plane, configuration.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration value is invalid; the message names the flag.
    #[error("{0}")]
    Config(String),
    /// The discovery backend failed.
    #[error("discovery: {0}")]
    Discovery(String),
    /// The event plane failed.
    #[error("event plane: {0}")]
    EventPlane(String),
    /// A stored record could not be decoded.
    #[error("decode {what}: {message}")]
    Decode {
        /// What was being decoded.
        what: &'static str,
        /// Why it failed.
        message: String,
    },
    /// The lease that keeps this process registered was lost.
    #[error("discovery lease lost")]
    LeaseLost,
    /// An I/O error.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl Error {
    /// The protocol-independent kind of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Config(_) | Self::Decode { .. } => ErrorCode::InvalidArgument,
            Self::Discovery(_) | Self::EventPlane(_) | Self::LeaseLost => ErrorCode::Unavailable,
            Self::Io(_) => ErrorCode::Internal,
        }
    }
}

impl From<Error> for tonic::Status {
    fn from(error: Error) -> Self {
        error.code().to_status(error.to_string())
    }
}

/// Result with the runtime's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_through_grpc() {
        for code in [
            ErrorCode::InvalidArgument,
            ErrorCode::NotFound,
            ErrorCode::PayloadTooLarge,
            ErrorCode::Unavailable,
            ErrorCode::Overloaded,
            ErrorCode::Timeout,
            ErrorCode::NotImplemented,
            ErrorCode::Cancelled,
            ErrorCode::Internal,
        ] {
            assert_eq!(ErrorCode::from_grpc(code.grpc_code()), code);
        }
        assert_eq!(ErrorCode::Overloaded.http_status(529), 529);
        assert_eq!(ErrorCode::InvalidArgument.http_status(529), 400);
    }
}
