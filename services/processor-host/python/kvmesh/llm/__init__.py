"""The chat-processor API, named as Dynamo 1.6.1's `dynamo.llm` names it, so processors written
for Dynamo run unchanged in kvmesh's processor host (docs/processors.md).

`PythonAsyncEngine` wraps a processor's generator, `Context` is the request it serves, a
`RoutedEngine` sends preprocessed requests through the frontend's router, and `HttpError` picks
the HTTP status of a failure. `FrontendRoute`, `FrontendResponse` and `FrontendExtensionContext`
are the route-extension types.
"""
import asyncio
import logging

from . import exceptions

_log = logging.getLogger("kvmesh.llm")

_MAX_HTTP_ERROR_MESSAGE = 8192

# Response headers the HTTP layer owns; a processor may not set them.
_RESERVED_HEADERS = frozenset({
    "content-type", "content-length", "content-encoding", "x-request-id", "connection",
    "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade",
})
_TOKEN_CHARS = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


class HttpError(Exception):
    """A failure with an explicit HTTP status: a 4xx, 503 or 529 reaches the client as that status
    with its standard reason phrase, any other as 500; `message` is logged, never returned."""

    def __init__(self, code, message):
        if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= 599:
            raise ValueError(f"HttpError code must be an int in 0..599, got {code!r}")
        if not isinstance(message, str):
            raise ValueError(f"HttpError message must be a str, got {type(message).__name__}")
        if len(message) > _MAX_HTTP_ERROR_MESSAGE:
            _log.warning("HttpError message of %d chars truncated to %d", len(message), _MAX_HTTP_ERROR_MESSAGE)
            message = message[:_MAX_HTTP_ERROR_MESSAGE - 3] + "..."
        super().__init__(f"HTTP {code}: {message}")
        self.code = code
        self.message = message


class PythonAsyncEngine:
    """A processor's engine: `generator(request, context=None)` is an async generator of
    chat-completion chunk dicts; `loop` is the asyncio loop it runs on."""

    def __init__(self, generator, loop):
        if not callable(generator):
            raise TypeError("PythonAsyncEngine needs a callable generator")
        self.generator = generator
        self.loop = loop
        try:
            import inspect
            self._takes_context = "context" in inspect.signature(generator).parameters
        except (TypeError, ValueError):
            self._takes_context = False

    def generate(self, request, context):
        """The processor's stream for one request."""
        if self._takes_context:
            return self.generator(request, context=context)
        return self.generator(request)


class Context:
    """One request as a processor sees it: its id, whether it was stopped (client gone or
    `stop_generating`), its trace ids, and the response headers it may still set."""

    def __init__(self, id=None, metadata=None, *, trace_id=None, span_id=None, parent_span_id=None,
                 _headers=None):
        import uuid
        self._id = id if id is not None else uuid.uuid4().hex
        self.metadata = dict(metadata or {})
        self._stopped = False
        self._killed = False
        self._event = None
        self._trace_id = trace_id or None
        self._span_id = span_id or None
        self._parent_span_id = parent_span_id or None
        # Set by the host: a callable that sends a header, while the response is not committed.
        self._headers = _headers
        self._on_stop = []

    def id(self):
        """The request id (the frontend's `x-request-id`)."""
        return self._id

    def is_stopped(self):
        """True once the request was stopped or killed."""
        return self._stopped or self._killed

    def is_killed(self):
        """True once the request was killed (the client went away)."""
        return self._killed

    def stop_generating(self):
        """Stops the request: its worker calls are cancelled."""
        self._set(stopped=True)

    def _kill(self):
        self._set(stopped=True, killed=True)

    def _set(self, stopped=False, killed=False):
        self._stopped = self._stopped or stopped
        self._killed = self._killed or killed
        if self._event is not None:
            self._event.set()
        callbacks, self._on_stop = self._on_stop, []
        for callback in callbacks:
            callback()

    async def async_killed_or_stopped(self):
        """Waits until the request is stopped or killed."""
        if self.is_stopped():
            return True
        if self._event is None:
            self._event = asyncio.Event()
        await self._event.wait()
        return True

    @property
    def trace_id(self):
        """W3C trace id of the request, or None."""
        return self._trace_id

    @property
    def span_id(self):
        """Span id of the frontend's request span, or None."""
        return self._span_id

    @property
    def parent_span_id(self):
        """Span id of the caller's span, or None."""
        return self._parent_span_id

    def set_response_header(self, name, value):
        """Sets a response header before the first chunk. False when the response cannot carry it
        (streaming without a pre-commit peek, after the first chunk, Responses and Messages);
        ValueError for an invalid or reserved header."""
        if self._headers is None:
            return False
        if not isinstance(name, str) or not name or any(c not in _TOKEN_CHARS for c in name):
            raise ValueError(f"invalid header name {name!r}")
        if not isinstance(value, str) or any((ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F for c in value):
            raise ValueError(f"invalid header value for {name!r}")
        if name.lower() in _RESERVED_HEADERS:
            raise ValueError(f"header {name!r} is set by the HTTP layer")
        return self._headers(name, value)


class Annotated:
    """One item of a routed stream: the worker output dict (`data()`), or an error."""

    __slots__ = ("_data", "_error", "_event", "_comments", "_id")

    def __init__(self, data=None, error=None, event=None, comments=None, id=None):
        self._data = data
        self._error = error
        self._event = event
        self._comments = comments or []
        self._id = id

    def data(self):
        """The worker output: `token_ids`, `text?`, `finish_reason?`, `log_probs?`, ..."""
        return self._data

    def is_error(self):
        """True for an error item."""
        return self._error is not None

    def event(self):
        """The item's event name, if any."""
        return self._event

    def comments(self):
        """The item's comments (list of str)."""
        return list(self._comments)

    def id(self):
        """The item's id, if any."""
        return self._id


class RoutedEngine:
    """Sends preprocessed requests through the frontend's routing seam: the same router state,
    load accounting and migration as a built-in request."""

    def __init__(self, model, _transport):
        self._model = model
        self._transport = _transport

    async def generate(self, request, context=None):
        """Starts `request` (a preprocessed request dict; `token_ids` required) and returns an
        async stream of `Annotated` items whose `data()` are worker output dicts."""
        return await self._transport(self._model, request, context)


class ModelDeploymentCard:
    """What the model's worker published: `runtime_config()` and `local_dir()`."""

    def __init__(self, card):
        self._card = card

    def runtime_config(self):
        """Engine capacity, parsers and `runtime_data`, as the worker registered them."""
        config = dict(self._card.get("runtime_config") or {})
        # Protobuf JSON writes 64-bit counts as strings.
        for key in ("total_kv_blocks", "max_num_seqs", "max_num_batched_tokens"):
            if isinstance(config.get(key), str) and config[key].isdigit():
                config[key] = int(config[key])
        config.setdefault("context_length", self._card.get("context_length", 0))
        config.setdefault("runtime_data", {})
        return config

    def source_path(self):
        """Where the model came from (a local path or a hub id)."""
        return self._card.get("source_path")

    def name(self):
        """The served model name."""
        return self._card.get("display_name")

    def local_dir(self):
        """Path of the model's files (config, tokenizer, templates)."""
        return self._card.get("source_path")

    def display_name(self):
        """The served model name."""
        return self._card.get("display_name")

    def context_length(self):
        """Prompt plus output token limit (0 when unknown)."""
        return self._card.get("context_length", 0)

    def kv_cache_block_size(self):
        """Tokens per KV block."""
        return self._card.get("kv_cache_block_size", 0)


class FrontendResponse:
    """A route extension's answer with an explicit status."""

    def __init__(self, status_code, body):
        if isinstance(status_code, bool) or not isinstance(status_code, int) or not 100 <= status_code <= 599:
            raise ValueError(f"status_code must be an int in 100..599, got {status_code!r}")
        self.status_code = status_code
        self.body = body


class FrontendRoute:
    """One static `GET` route a route extension adds to the HTTP edge."""

    def __init__(self, method, path, handler):
        self.method = method
        self.path = path
        self.handler = handler


class FrontendExtensionContext:
    """What a route extension's handler may ask the frontend."""

    def __init__(self, state):
        self._state = state

    def is_ready(self):
        """True when the frontend serves at least one ready model."""
        return bool(self._state.get("ready"))

    def is_cancelled(self):
        """True once the frontend is shutting down."""
        return bool(self._state.get("cancelled"))

    def has_any_ready_model(self):
        """True when some model has a ready worker."""
        return bool(self._state.get("serving"))

    def is_model_ready_to_serve(self, name):
        """True when `name` has a ready worker."""
        return name in self._state.get("serving", [])

    def model_display_names(self):
        """Every known model name."""
        return list(self._state.get("models", []))

    def serving_ready_display_names(self):
        """The model names with a ready worker."""
        return list(self._state.get("serving", []))


__all__ = [
    "HttpError", "PythonAsyncEngine", "Context", "Annotated", "RoutedEngine",
    "ModelDeploymentCard", "FrontendResponse", "FrontendRoute", "FrontendExtensionContext",
    "exceptions",
]
