//! Why a request could not be routed, and the one place that maps it to a status.

/// Status code an overloaded rejection uses unless `DYN_HTTP_OVERLOAD_STATUS_CODE` says otherwise.
pub const DEFAULT_OVERLOAD_STATUS: u16 = 529;

use kvmesh_runtime::ErrorCode;

/// Message of the overloaded rejection (docs/routing.md, "Busy detection and overload"),
/// reproduced exactly.
pub const OVERLOADED_MESSAGE: &str =
    "Service temporarily unavailable: All workers are busy, please retry later";

/// How the unknown-model message starts (the model name follows).
const UNKNOWN_MODEL_PREFIX: &str = "the router does not serve model ";

/// A routing failure. Each kind knows its HTTP status; the gRPC mapping lives with the service.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// No live worker is compatible with the request (filters, pins, dead pinned worker).
    #[error("no worker is available for this request")]
    NoEndpoint,
    /// Compatible workers exist but every one is busy, or the pinned one is.
    #[error("{OVERLOADED_MESSAGE}")]
    Overloaded,
    /// The request is malformed for routing (direct mode without a worker id, bad header).
    #[error("{0}")]
    BadRequest(String),
    /// Fewer than `--router-min-initial-workers` workers with runtime config are known yet.
    #[error("model is not ready: waiting for workers")]
    NotReady,
    /// The request waited in the queue and was removed (client disconnect).
    #[error("request was cancelled while queued")]
    Cancelled,
    /// The router does not know the model (yet): a remote replica that has not discovered it.
    #[error("{UNKNOWN_MODEL_PREFIX}{0}")]
    UnknownModel(String),
    /// No remote router replica answered.
    #[error("no router replica is reachable: {0}")]
    Unreachable(String),
    /// The chosen worker refused or failed the request (`Generate`); its status kind is kept.
    #[error("worker: {message}")]
    Worker {
        /// The kind of the worker's status.
        code: ErrorCode,
        /// The worker's message.
        message: String,
    },
}

impl RouteError {
    /// HTTP status: 503 for no endpoint and not ready, `overload_status` (529 by default) for
    /// overloaded, 400 for a bad request, 499 for a cancelled request.
    pub fn http_status(&self, overload_status: u16) -> u16 {
        self.code().http_status(overload_status)
    }

    /// The protocol-independent kind, mapped once to HTTP and gRPC statuses. A model the router
    /// does not know is *unavailable* at the HTTP edge (the frontend knows it, the router lags)
    /// but *not found* on the router's own gRPC API.
    pub fn code(&self) -> ErrorCode {
        match self {
            RouteError::NoEndpoint
            | RouteError::NotReady
            | RouteError::UnknownModel(_)
            | RouteError::Unreachable(_) => ErrorCode::Unavailable,
            RouteError::Overloaded => ErrorCode::Overloaded,
            RouteError::BadRequest(_) => ErrorCode::InvalidArgument,
            RouteError::Cancelled => ErrorCode::Cancelled,
            RouteError::Worker { code, .. } => *code,
        }
    }

    /// The gRPC status the router service answers with.
    pub fn to_status(&self) -> tonic::Status {
        let code = match self {
            RouteError::UnknownModel(_) => ErrorCode::NotFound,
            other => other.code(),
        };
        code.to_status(self.to_string())
    }

    /// The routing failure a router replica's gRPC status stands for (the inverse of
    /// [`Self::to_status`]); `None` when the status says the replica itself failed, so the
    /// caller should try another replica.
    pub fn from_status(status: &tonic::Status) -> Option<Self> {
        let message = status.message();
        match status.code() {
            tonic::Code::ResourceExhausted => Some(RouteError::Overloaded),
            tonic::Code::InvalidArgument => Some(RouteError::BadRequest(message.to_string())),
            tonic::Code::NotFound => Some(RouteError::UnknownModel(
                message
                    .strip_prefix(UNKNOWN_MODEL_PREFIX)
                    .unwrap_or(message)
                    .to_string(),
            )),
            tonic::Code::Cancelled => Some(RouteError::Cancelled),
            tonic::Code::Unavailable if message == RouteError::NotReady.to_string() => {
                Some(RouteError::NotReady)
            }
            tonic::Code::Unavailable if message == RouteError::NoEndpoint.to_string() => {
                Some(RouteError::NoEndpoint)
            }
            _ => None,
        }
    }

    /// Whether a session binding must be dropped after this failure: any failure to select other
    /// than cancellation (docs/routing.md, "Session affinity").
    pub fn drops_session(&self) -> bool {
        !matches!(self, RouteError::Cancelled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses() {
        assert_eq!(
            RouteError::Overloaded.http_status(DEFAULT_OVERLOAD_STATUS),
            529
        );
        assert_eq!(RouteError::Overloaded.http_status(503), 503);
        assert_eq!(RouteError::NoEndpoint.http_status(529), 503);
        assert_eq!(RouteError::BadRequest("x".into()).http_status(529), 400);
        for error in [
            RouteError::NoEndpoint,
            RouteError::NotReady,
            RouteError::Overloaded,
            RouteError::BadRequest("bad".into()),
            RouteError::Cancelled,
            RouteError::UnknownModel("m".into()),
        ] {
            assert_eq!(RouteError::from_status(&error.to_status()), Some(error));
        }
        assert_eq!(
            RouteError::from_status(&tonic::Status::unavailable("connection refused")),
            None
        );
        assert_eq!(
            RouteError::Overloaded.to_string(),
            "Service temporarily unavailable: All workers are busy, please retry later"
        );
    }
}
