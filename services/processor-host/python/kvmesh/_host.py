"""The processor host's Python half: resolves the processor, builds one engine per model, and runs
each request's engine on the host's asyncio loop.

The Rust half sends batches of requests, worker outputs, cancellations and model changes to
`dispatch` from its own thread (each batch hops onto the loop once), and each request's `emit`
callable carries what the engine produces back to it. docs/processors.md describes the whole exchange.
"""
import asyncio
import importlib
import importlib.metadata
import inspect
import json
import logging

from . import llm
from ._routes import RouteTable
from .llm import exceptions

_log = logging.getLogger("kvmesh.processor")

PROCESSOR_GROUPS = ("dynamo.frontend.chat_processors", "kvmesh.frontend.chat_processors")

# What a request's `emit(kind, a, b, c)` carries.
CHUNK, GENERATE, HEADER, ERROR, METRICS, DONE, CANCEL_CALL = range(7)
# The kinds of worker output a call receives.
OUTPUT, CALL_ERROR, CALL_END = range(3)

RETRY_FIRST, RETRY_MAX = 1.0, 30.0


class StartupError(Exception):
    """The processor cannot be loaded: the host exits with this message."""


def _registered(groups):
    names = []
    for group in groups:
        names.extend(ep.name for ep in importlib.metadata.entry_points(group=group))
    return sorted(set(names))


def resolve(name, groups=PROCESSOR_GROUPS, what="chat processor"):
    """The provider `name` names: an entry point of the first group that has it, else
    `module:function`."""
    for group in groups:
        for ep in importlib.metadata.entry_points(group=group):
            if ep.name == name:
                return ep.load()
    if ":" in name:
        module_name, _, attribute = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except Exception as error:  # noqa: BLE001 - the message names the module
            raise StartupError(f"{what} {name!r}: cannot import {module_name!r}: {error}") from error
        try:
            return getattr(module, attribute)
        except AttributeError as error:
            raise StartupError(f"{what} {name!r}: module {module_name!r} has no {attribute!r}") from error
    known = ", ".join(_registered(groups)) or "none"
    raise StartupError(f"unknown {what} {name!r}; registered: {known} (or give module:function)")


def _builtin(name):
    """The provider of the built-in `vllm` or `sglang` processor, which needs that package in
    the host's Python. An installed processor registered under the name wins (`vllm`: the kvmesh
    vLLM worker package, workers/vllm, registers one); `sglang` has one built into the host."""
    try:
        importlib.import_module(name)
    except ImportError as error:
        raise StartupError(
            f"--dyn-chat-processor {name} needs the {name!r} Python package, which is not importable "
            f"in this host's Python ({error}); install it in the host's environment") from error
    if name in _registered(PROCESSOR_GROUPS):
        return resolve(name)
    if name == "sglang":
        return importlib.import_module("kvmesh._sglang").provider
    raise StartupError(f"--dyn-chat-processor {name}: no {name} processor is installed in this host's Python"
                       " (install workers/vllm: pip install ./workers/vllm)")


class Config:
    """The resolved frontend options, one read-only attribute per option (`config.router_mode`)."""

    def __init__(self, values):
        object.__setattr__(self, "_values", dict(values))

    def __getattr__(self, name):
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        raise AttributeError("the frontend configuration is read-only")

    def __repr__(self):
        return f"Config({self._values!r})"


def classify(error):
    """(error code, explicit HTTP status, message) of an exception an engine raised."""
    if isinstance(error, llm.HttpError):
        return "", error.code, error.message
    if isinstance(error, exceptions.RoutedEngineError):
        return error.code, 0, error.message
    if isinstance(error, exceptions.InvalidArgument):
        return "invalid_argument", 0, str(error)
    if isinstance(error, exceptions.RouterQueueLimitExceeded):
        return "overloaded", 0, str(error)
    if isinstance(error, (exceptions.ConnectionTimeout, TimeoutError)):
        return "timeout", 0, str(error) or "timed out"
    if isinstance(error, (exceptions.CannotConnect, exceptions.Disconnected, exceptions.EngineShutdown,
                          exceptions.WorkerUnavailable, ConnectionError)):
        return "unavailable", 0, str(error) or type(error).__name__
    if isinstance(error, (ValueError, TypeError)):
        return "invalid_argument", 0, str(error)
    return "internal", 0, f"{type(error).__name__}: {error}"


def _metrics(comments):
    for comment in comments or []:
        try:
            values = json.loads(comment) if isinstance(comment, str) else comment
        except ValueError:
            continue
        if isinstance(values, dict):
            return json.dumps({k: values[k] for k in ("input_tokens", "output_tokens", "chunk_tokens",
                                                       "cached_tokens") if isinstance(values.get(k), int)})
    return None


class _Call:
    """One routed generate call's queue of worker outputs."""

    __slots__ = ("queue", "done")

    def __init__(self):
        self.queue = asyncio.Queue()
        self.done = False


class _CallStream:
    """The async stream `routed_engine.generate` returns."""

    def __init__(self, call):
        self._call = call

    def __aiter__(self):
        return self

    async def __anext__(self):
        call = self._call
        if call.done and call.queue.empty():
            raise StopAsyncIteration
        kind, a, b = await call.queue.get()
        if kind == OUTPUT:
            return llm.Annotated(data=json.loads(a))
        call.done = True
        if kind == CALL_END:
            raise StopAsyncIteration
        if a == "invalid_argument":
            raise exceptions.InvalidArgument(b)
        raise exceptions.RoutedEngineError(b, a)


class _Request:
    """One request in flight: its context, its calls and the task running its engine."""

    def __init__(self, key, emit, context):
        self.key = key
        self.emit = emit
        self.context = context
        self.calls = {}
        self.next_call = 0
        self.task = None


class Host:
    """The host's Python state: the provider's factory, one engine per model, and the route
    extensions."""

    def __init__(self, processor, config_json, options_json, routes_json):
        self.processor = processor
        self.config = Config(json.loads(config_json))
        self.options = json.loads(options_json or "{}")
        if not isinstance(self.options, dict):
            raise StartupError("--dyn-chat-processor-config must be a JSON object")
        self.loop = asyncio.new_event_loop()
        self.factory = None
        self.engines = {}
        self.builds = {}
        self.requests = {}
        routes = json.loads(routes_json)
        self.routes = RouteTable(routes["overload_status"])
        self._route_config = routes

    # -- startup, on the host's thread before the loop runs --

    def start(self):
        """Loads the route extensions, then resolves the processor (unless it is the built-in
        `dynamo`, when the host serves routes only) and calls its provider inside the loop."""
        asyncio.set_event_loop(self.loop)
        self.routes.load(self._route_config["extensions"], set(self._route_config["reserved"]), resolve,
                         StartupError)
        if self.processor == "dynamo":
            return
        if self.processor in ("vllm", "sglang"):
            provider = _builtin(self.processor)
        else:
            provider = resolve(self.processor)
        if not callable(provider):
            raise StartupError(f"chat processor {self.processor!r} is not callable")

        async def call_provider():
            factory = provider(self.config, self.options)
            if inspect.isawaitable(factory):
                factory = await factory
            return factory

        self.factory = self.loop.run_until_complete(call_provider())
        if not callable(self.factory):
            raise StartupError(f"chat processor {self.processor!r}: the provider did not return a factory")

    def run_forever(self):
        """Runs the loop until the process ends."""
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def stop(self):
        """Stops the loop (from any thread)."""
        self.loop.call_soon_threadsafe(self.loop.stop)

    def route_paths(self):
        """The paths the route extensions serve."""
        return self.routes.paths()

    def _call_route(self, path, state_json, reply):
        self.routes.call(path, state_json, reply)

    # -- models --

    def dispatch(self, batch):
        """Runs a batch of `(op, *args)` from the Rust half on the loop (any thread): one wake-up
        of the loop per batch."""
        self.loop.call_soon_threadsafe(self._dispatch, batch)

    def _dispatch(self, batch):
        for op, *args in batch:
            try:
                self._OPS[op](self, *args)
            except Exception:  # noqa: BLE001 - one bad message must not stop the others
                _log.exception("processor host message %d failed", op)

    def _model_changed(self, model, instance_id, card_json, checksum):
        current = self.builds.get(model)
        if current is not None and current[0] == checksum:
            return
        if current is not None:
            current[1].cancel()
        task = self.loop.create_task(self._build(model, instance_id, json.loads(card_json)))
        self.builds[model] = (checksum, task)

    def _model_removed(self, model):
        build = self.builds.pop(model, None)
        if build is not None:
            build[1].cancel()
        self.engines.pop(model, None)

    async def _build(self, model, instance_id, card):
        delay = RETRY_FIRST
        while True:
            try:
                engine = self.factory(instance_id, llm.ModelDeploymentCard(card),
                                      llm.RoutedEngine(model, self._routed_generate))
                if inspect.isawaitable(engine):
                    engine = await engine
                if not isinstance(engine, llm.PythonAsyncEngine):
                    raise TypeError(f"the factory returned {type(engine).__name__}, not a PythonAsyncEngine")
                self.engines[model] = engine
                _log.info("processor engine ready for model %s", model)
                return
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - retried with backoff, the model answers 503 meanwhile
                _log.exception("processor factory failed for model %s; retrying in %.0f s", model, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)

    # -- requests --

    def _submit(self, key, model, request_json, headers_allowed, request_id, trace_id, span_id,
                parent_span_id, emit):
        engine = self.engines.get(model)
        if engine is None:
            emit(ERROR, "unavailable", 0, f"the chat processor has no engine for model {model!r} yet")
            return
        committed = [not headers_allowed]

        def send_header(name, value):
            if committed[0]:
                return False
            emit(HEADER, name, value)
            return True

        context = llm.Context(request_id, trace_id=trace_id, span_id=span_id, parent_span_id=parent_span_id,
                              _headers=send_header)
        request = _Request(key, emit, context)
        context._request = request
        self.requests[key] = request
        request.task = self.loop.create_task(self._serve(request, engine, request_json, committed))

    def _deliver(self, key, call_id, kind, a, b):
        request = self.requests.get(key)
        if request is None:
            return
        call = request.calls.get(call_id)
        if call is not None:
            call.queue.put_nowait((kind, a, b))
            if kind != OUTPUT:
                request.calls.pop(call_id, None)

    def _cancel(self, key):
        request = self.requests.pop(key, None)
        if request is None:
            return
        request.context._kill()
        if request.task is not None:
            request.task.cancel()

    async def _routed_generate(self, model, preprocessed, context):
        request = getattr(context, "_request", None)
        if request is None or self.requests.get(request.key) is not request:
            raise exceptions.InvalidArgument("routed_engine.generate needs the request's context")
        if context.is_stopped():
            raise exceptions.Cancelled("the request was stopped")
        if not isinstance(preprocessed, dict):
            raise exceptions.InvalidArgument("routed_engine.generate takes a preprocessed request dict")
        call_id = request.next_call
        request.next_call += 1
        call = _Call()
        request.calls[call_id] = call
        request.emit(GENERATE, call_id, json.dumps(preprocessed))
        context._on_stop.append(lambda: request.emit(CANCEL_CALL, call_id, None))
        return _CallStream(call)

    async def _serve(self, request, engine, request_json, committed):
        emit = request.emit
        try:
            stream = engine.generate(json.loads(request_json), request.context)
            async for item in stream:
                committed[0] = True
                if isinstance(item, dict) and item.get("_dynamo_annotated"):
                    if item.get("event") == "error":
                        raise exceptions.Unknown("; ".join(map(str, item.get("comment") or [])) or "processor error")
                    metrics = _metrics(item.get("comment"))
                    if metrics is not None:
                        emit(METRICS, metrics)
                    item = item.get("data")
                    if item is None:
                        continue
                if not isinstance(item, dict):
                    raise TypeError(f"the processor yielded {type(item).__name__}, not a chat-completion chunk dict")
                emit(CHUNK, json.dumps(item))
            emit(DONE)
        except asyncio.CancelledError:
            pass
        except Exception as error:  # noqa: BLE001 - every engine error becomes a classified response
            code, status, message = classify(error)
            if status:
                _log.warning("chat processor raised HttpError(%d): %s", status, message)
            elif code == "internal":
                _log.error("chat processor failed", exc_info=error)
            emit(ERROR, code, status, message)
        finally:
            committed[0] = True
            self.requests.pop(request.key, None)


# The ops of `Host.dispatch`, in the order the Rust half numbers them.
Host._OPS = (Host._submit, Host._deliver, Host._cancel, Host._model_changed, Host._model_removed,
             Host._call_route)
