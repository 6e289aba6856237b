//! Why a request could not be routed, and the one place that maps it to a status.

/// Status code an overloaded rejection uses unless `DYN_HTTP_OVERLOAD_STATUS_CODE` says otherwise.
pub const DEFAULT_OVERLOAD_STATUS: u16 = 529;

/// Message of the overloaded rejection (router.md §8), reproduced exactly.
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
}

impl RouteError {
    /// HTTP status: 503 for no endpoint and not ready, `overload_status` (529 by default) for
    /// overloaded, 400 for a bad request, 499 for a cancelled request.
    pub fn http_status(&self, overload_status: u16) -> u16 {
        match self {
            RouteError::NoEndpoint | RouteError::NotReady => 503,
            RouteError::Overloaded => overload_status,
            RouteError::BadRequest(_) => 400,
            RouteError::Cancelled => 499,
        }
    }

    /// Whether a session binding must be dropped after this failure (router.md §10: any failure
    /// to select other than cancellation).
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
    }
}
