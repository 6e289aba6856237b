//! Why a request could not be routed, and the one place that maps it to a status.

/// Status code an overloaded rejection uses unless `DYN_HTTP_OVERLOAD_STATUS_CODE` says otherwise.
pub const DEFAULT_OVERLOAD_STATUS: u16 = 529;

use kvmesh_runtime::ErrorCode;

/// Message of the overloaded rejection (docs/routing.md, "Busy detection and overload"),
/// reproduced exactly.
pub const OVERLOADED_MESSAGE: &str =
    "Service temporarily unavailable: All workers are busy, please retry later";

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

    /// Which failure this is, as named beside the code on the wire (see [`Self::to_status`]).
    fn reason(&self) -> &'static str {
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

    /// The gRPC status the router service answers with: its code (a model the router does not
    /// know is `NotFound` here) and, in the metadata, which routing failure it was.
    pub fn to_status(&self) -> tonic::Status {
        let code = match self {
            RouteError::UnknownModel(_) => ErrorCode::NotFound,
            other => other.code(),
        };
        let message = match self {
            // The worker's own words: the receiver wraps them in its own context.
            RouteError::Worker { message, .. } => message.clone(),
            other => other.to_string(),
        };
        code.to_status_with_reason(message, Some(self.reason()))
    }

    /// The routing failure a router replica's status stands for (the inverse of
    /// [`Self::to_status`], read from the status's metadata, never from its message); `None`
    /// when the replica itself failed (no routing reason: a transport error, a replica
    /// stopping), so the caller should try another replica. `model` is the model the call was
    /// about.
    pub fn from_status(status: &tonic::Status, model: &str) -> Option<Self> {
        let message = || status.message().to_string();
        let error = match kvmesh_runtime::error::status_reason(status)? {
            "no_endpoint" => RouteError::NoEndpoint,
            "overloaded" => RouteError::Overloaded,
            "bad_request" => RouteError::BadRequest(message()),
            "not_ready" => RouteError::NotReady,
            "cancelled" => RouteError::Cancelled,
            "unknown_model" => RouteError::UnknownModel(model.to_string()),
            "worker_timeout" => RouteError::Worker {
                code: ErrorCode::Timeout,
                message: message(),
            },
            "worker" => RouteError::Worker {
                code: ErrorCode::of_status(status),
                message: message(),
            },
            _ => return None,
        };
        Some(error)
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
    #[allow(
        clippy::disallowed_methods,
        reason = "statuses as other peers send them"
    )]
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
            RouteError::Worker {
                code: ErrorCode::InvalidArgument,
                message: "prompt too long".into(),
            },
        ] {
            let status = error.to_status();
            assert_eq!(RouteError::from_status(&status, "m"), Some(error.clone()));
            // The kind survives a message that says something else.
            let reworded = tonic::Status::with_metadata(
                status.code(),
                match &error {
                    RouteError::BadRequest(message) => message.clone(),
                    RouteError::Worker { message, .. } => message.clone(),
                    _ => "reworded by a newer replica".to_string(),
                },
                status.metadata().clone(),
            );
            assert_eq!(RouteError::from_status(&reworded, "m"), Some(error.clone()));
            // And it survives the RouteStream's failure message.
            let streamed =
                crate::wire::failure_from_proto(crate::wire::failure_to_proto(&reworded));
            assert_eq!(RouteError::from_status(&streamed, "m"), Some(error));
        }
        // A replica's own failure carries no routing reason: try another replica.
        assert_eq!(
            RouteError::from_status(&tonic::Status::unavailable("connection refused"), "m"),
            None
        );
        assert_eq!(
            RouteError::from_status(&ErrorCode::Unavailable.to_status("stopping"), "m"),
            None
        );
        assert_eq!(
            RouteError::Overloaded.to_string(),
            "Service temporarily unavailable: All workers are busy, please retry later"
        );
    }
}
