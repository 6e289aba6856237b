//! Why a request could not be routed, and the one place that maps it to a status.

/// Status code an overloaded rejection uses unless `DYN_HTTP_OVERLOAD_STATUS_CODE` says otherwise.
pub const DEFAULT_OVERLOAD_STATUS: u16 = 529;

use kvmesh_core::ErrorCode;

/// Message of the overloaded rejection (docs/routing.md, "Busy detection and overload"),
/// reproduced exactly.
pub const OVERLOADED_MESSAGE: &str =
    "Service temporarily unavailable: All workers are busy, please retry later";

/// A routing failure. Each kind knows its code; the gRPC mapping lives with the router service.
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
    #[error("the router does not serve model {0}")]
    UnknownModel(String),
    /// No remote router replica answered.
    #[error("no router replica is reachable: {0}")]
    Unreachable(String),
    /// The chosen worker did not answer within the backend stream timeout (seconds).
    #[error("the worker did not respond within {0} s")]
    WorkerTimeout(u64),
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
            RouteError::WorkerTimeout(_) => ErrorCode::Timeout,
            RouteError::Worker { code, .. } => *code,
        }
    }

    /// Which failure this is, by a stable name: what a gRPC status carries beside its code so
    /// the receiver rebuilds the same error ([`Self::from_reason`]).
    pub fn reason(&self) -> &'static str {
        match self {
            RouteError::NoEndpoint => "no_endpoint",
            RouteError::Overloaded => "overloaded",
            RouteError::BadRequest(_) => "bad_request",
            RouteError::NotReady => "not_ready",
            RouteError::Cancelled => "cancelled",
            RouteError::UnknownModel(_) => "unknown_model",
            RouteError::Unreachable(_) => "unreachable",
            RouteError::WorkerTimeout(_) => "worker_timeout",
            RouteError::Worker { .. } => "worker",
        }
    }

    /// The code a router's own API answers with: a model the router does not know is *not
    /// found* there.
    pub fn api_code(&self) -> ErrorCode {
        match self {
            RouteError::UnknownModel(_) => ErrorCode::NotFound,
            other => other.code(),
        }
    }

    /// The message a router's API sends: a worker's own words (the receiver wraps them in its
    /// own context), else this error's.
    pub fn api_message(&self) -> String {
        match self {
            RouteError::Worker { message, .. } => message.clone(),
            other => other.to_string(),
        }
    }

    /// The error [`Self::reason`] names, rebuilt from what crossed the wire: the reason, the
    /// error code and the message, and the model the call was about; `None` for a reason that is
    /// not a routing failure (a router replica's own failure, so the caller tries another).
    pub fn from_reason(reason: &str, code: ErrorCode, message: &str, model: &str) -> Option<Self> {
        Some(match reason {
            "no_endpoint" => RouteError::NoEndpoint,
            "overloaded" => RouteError::Overloaded,
            "bad_request" => RouteError::BadRequest(message.to_string()),
            "not_ready" => RouteError::NotReady,
            "cancelled" => RouteError::Cancelled,
            "unknown_model" => RouteError::UnknownModel(model.to_string()),
            "worker_timeout" => RouteError::Worker {
                code: ErrorCode::Timeout,
                message: message.to_string(),
            },
            "worker" => RouteError::Worker {
                code,
                message: message.to_string(),
            },
            _ => return None,
        })
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
        assert_eq!(
            RouteError::Overloaded.to_string(),
            "Service temporarily unavailable: All workers are busy, please retry later"
        );
        assert_eq!(
            RouteError::from_reason("unreachable", ErrorCode::Unavailable, "", "m"),
            None
        );
    }
}
