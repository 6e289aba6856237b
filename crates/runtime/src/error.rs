//! The runtime's error type and the one code table every crate maps its errors to.
//!
//! Each crate has its own `thiserror` enum; each enum says which [`ErrorCode`] it is. The code
//! table itself lives in `kvmesh-core` (with its HTTP mapping); its gRPC mapping is here, once
//! ([`GrpcErrorCode`]).
//!
//! Across gRPC the code travels in the status's metadata ([`ERROR_CODE_KEY`]), beside a finer
//! `reason` a crate may add ([`ERROR_REASON_KEY`]), so the receiving side recovers exactly what
//! the sender meant whatever its message says; a peer that sets neither (another implementation
//! of a contract) is read by its gRPC code alone.

pub use kvmesh_core::ErrorCode;

/// The gRPC side of the [`ErrorCode`] table: the status code each code maps to and back, and
/// statuses that carry the code in their metadata. Import it to call these on `ErrorCode`.
pub trait GrpcErrorCode: Sized {
    /// gRPC status code for this code.
    fn grpc_code(self) -> tonic::Code;

    /// The code a gRPC status code maps back to, for peers that send no metadata.
    fn from_grpc(code: tonic::Code) -> Self;

    /// A gRPC status with this code and message; the code itself rides in the metadata.
    fn to_status(self, message: impl Into<String>) -> tonic::Status {
        self.to_status_with_reason(message, None)
    }

    /// [`Self::to_status`] with a finer reason a receiver of the same crate reads back with
    /// [`status_reason`] (for example which routing failure it was).
    fn to_status_with_reason(
        self,
        message: impl Into<String>,
        reason: Option<&'static str>,
    ) -> tonic::Status;

    /// The code a gRPC status stands for: the one its sender put in the metadata, else the
    /// nearest to its gRPC code.
    fn of_status(status: &tonic::Status) -> Self;
}

impl GrpcErrorCode for ErrorCode {
    fn grpc_code(self) -> tonic::Code {
        match self {
            Self::InvalidArgument => tonic::Code::InvalidArgument,
            Self::NotFound => tonic::Code::NotFound,
            Self::PayloadTooLarge => tonic::Code::OutOfRange,
            Self::MethodNotAllowed => tonic::Code::Unimplemented,
            Self::UnsupportedMediaType => tonic::Code::InvalidArgument,
            Self::Unauthenticated => tonic::Code::Unauthenticated,
            Self::Unavailable => tonic::Code::Unavailable,
            Self::Overloaded => tonic::Code::ResourceExhausted,
            Self::Timeout => tonic::Code::DeadlineExceeded,
            Self::NotImplemented => tonic::Code::Unimplemented,
            Self::Cancelled => tonic::Code::Cancelled,
            Self::Internal => tonic::Code::Internal,
        }
    }

    fn from_grpc(code: tonic::Code) -> Self {
        match code {
            tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition => Self::InvalidArgument,
            tonic::Code::NotFound => Self::NotFound,
            tonic::Code::Unauthenticated => Self::Unauthenticated,
            tonic::Code::OutOfRange => Self::PayloadTooLarge,
            tonic::Code::Unavailable => Self::Unavailable,
            tonic::Code::ResourceExhausted => Self::Overloaded,
            tonic::Code::DeadlineExceeded => Self::Timeout,
            tonic::Code::Unimplemented => Self::NotImplemented,
            tonic::Code::Cancelled => Self::Cancelled,
            _ => Self::Internal,
        }
    }

    #[allow(clippy::disallowed_methods, reason = "the one place a status is built")]
    fn to_status_with_reason(
        self,
        message: impl Into<String>,
        reason: Option<&'static str>,
    ) -> tonic::Status {
        let mut metadata = tonic::metadata::MetadataMap::new();
        metadata.insert(
            ERROR_CODE_KEY,
            tonic::metadata::MetadataValue::from_static(self.name()),
        );
        if let Some(reason) = reason {
            metadata.insert(
                ERROR_REASON_KEY,
                tonic::metadata::MetadataValue::from_static(reason),
            );
        }
        tonic::Status::with_metadata(self.grpc_code(), message, metadata)
    }

    fn of_status(status: &tonic::Status) -> Self {
        status
            .metadata()
            .get(ERROR_CODE_KEY)
            .and_then(|value| value.to_str().ok())
            .and_then(Self::from_name)
            .unwrap_or_else(|| Self::from_grpc(status.code()))
    }
}

/// Metadata key of the [`ErrorCode`] a kvmesh gRPC server failed with.
pub const ERROR_CODE_KEY: &str = "kvmesh-error-code";

/// Metadata key of the finer reason beside the code (see [`ErrorCode::to_status_with_reason`]).
pub const ERROR_REASON_KEY: &str = "kvmesh-error-reason";

/// The reason a kvmesh server put beside the code of `status`, if any.
pub fn status_reason(status: &tonic::Status) -> Option<&str> {
    status
        .metadata()
        .get(ERROR_REASON_KEY)
        .and_then(|value| value.to_str().ok())
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
    #[allow(
        clippy::disallowed_methods,
        reason = "a status as another peer sends it"
    )]
    fn every_code_crosses_grpc_intact_whatever_its_message() {
        for code in ErrorCode::ALL {
            let status = code.to_status("a message that says something else entirely");
            assert_eq!(ErrorCode::of_status(&status), code);
            assert_eq!(status.code(), code.grpc_code());
            assert_eq!(ErrorCode::from_name(code.name()), Some(code));
            let reasoned = code.to_status_with_reason("", Some("why"));
            assert_eq!(ErrorCode::of_status(&reasoned), code);
            assert_eq!(status_reason(&reasoned), Some("why"));
            assert_eq!(status_reason(&status), None);
        }
        // A peer that sends no metadata is read by its gRPC code.
        let foreign = tonic::Status::resource_exhausted("busy");
        assert_eq!(ErrorCode::of_status(&foreign), ErrorCode::Overloaded);
    }

    #[test]
    fn codes_round_trip_through_grpc() {
        for code in [
            ErrorCode::InvalidArgument,
            ErrorCode::NotFound,
            ErrorCode::PayloadTooLarge,
            ErrorCode::Unauthenticated,
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
