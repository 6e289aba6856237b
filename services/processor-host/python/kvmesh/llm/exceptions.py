"""The exceptions a processor raises or receives, named as in Dynamo 1.6.1's `dynamo.llm.exceptions`.

What the client gets for each is the processor host's error table (docs/processors.md, "Errors").
"""


class DynamoException(Exception):
    """Base of the errors the frontend classifies."""


class Unknown(DynamoException):
    """An error of no known kind (HTTP 500)."""


class InvalidArgument(DynamoException):
    """The request is invalid: HTTP 400 with this message shown to the client."""


class CannotConnect(DynamoException):
    """No connection to a worker could be made (HTTP 503)."""


class Disconnected(DynamoException):
    """The worker connection dropped (HTTP 503)."""


class ConnectionTimeout(DynamoException):
    """Connecting to a worker timed out (HTTP 504)."""


class Cancelled(DynamoException):
    """The request was cancelled."""


class EngineShutdown(DynamoException):
    """The engine is shutting down (HTTP 503)."""


class StreamIncomplete(DynamoException):
    """A worker stream ended before its finish reason (HTTP 500)."""


class RouterQueueLimitExceeded(DynamoException):
    """The router's queue is full (the overload status, 529 by default)."""


class WorkerUnavailable(DynamoException):
    """No worker can take the request (HTTP 503)."""


class SelectionServiceError(DynamoException):
    """The worker selection failed (HTTP 500)."""


class RoutedEngineError(ValueError):
    """A worker's classified error, raised by `routed_engine`; re-raised or left to escape, the
    client gets the status the error's code maps to. `code` is kvmesh's error code name."""

    def __init__(self, message, code="internal"):
        super().__init__(message)
        self.message = message
        self.code = code


__all__ = [
    "DynamoException", "Unknown", "InvalidArgument", "CannotConnect", "Disconnected",
    "ConnectionTimeout", "Cancelled", "EngineShutdown", "StreamIncomplete",
    "RouterQueueLimitExceeded", "WorkerUnavailable", "SelectionServiceError", "RoutedEngineError",
]
