"""A processor whose last user message picks a behaviour: an exception of the error table, a
response header, or (anything else) the seed processor's answer."""
import asyncio
import time

from dynamo.llm import HttpError, PythonAsyncEngine
from dynamo.llm.exceptions import InvalidArgument, RoutedEngineError, RouterQueueLimitExceeded

from seed_processor import MyChatEngine


def _chunk(request, text, finish=None):
    return {"id": "chatcmpl-errors", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": request["model"],
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": finish}]}


RAISES = {
    "invalid": lambda: InvalidArgument("the request is not acceptable here"),
    "http418": lambda: HttpError(418, "secret-418 detail"),
    "http503": lambda: HttpError(503, "secret-503 detail"),
    "http529": lambda: HttpError(529, "secret-529 detail"),
    "http502": lambda: HttpError(502, "secret-502 detail"),
    "value": lambda: ValueError("a value problem"),
    "type": lambda: TypeError("a type problem"),
    "timeout": lambda: TimeoutError("too slow"),
    "refused": lambda: ConnectionRefusedError("nobody home"),
    "connection": lambda: ConnectionResetError("reset"),
    "other": lambda: RuntimeError("secret-runtime detail"),
    "queue": lambda: RouterQueueLimitExceeded("the router queue is full"),
}

# A worker pin no worker answers to: the routed call fails with the seam's `unavailable`.
NO_SUCH_WORKER = {"model": "tiny", "token_ids": [1, 2, 3], "stop_conditions": {"max_tokens": 2},
                  "routing": {"backend_instance_id": 12345}}


class ErrorsEngine:
    def __init__(self, seed, routed_engine):
        self._seed = seed
        self._routed_engine = routed_engine

    async def generate(self, request, context=None):
        command = request["messages"][-1]["content"]
        if command in RAISES:
            raise RAISES[command]()
        if command.startswith("header"):
            if command == "header-reserved":
                context.set_response_header("Content-Type", "text/plain")
            if command == "header-invalid":
                context.set_response_header("bad name", "x")
            carried = context.set_response_header("x-processor", "yes")
            if command == "header-then-raise":
                raise InvalidArgument("refused after a header")
            yield _chunk(request, f"header={carried}")
            late = context.set_response_header("x-late", "no")
            yield _chunk(request, f" late={late}", "stop")
            return
        if command == "bad-chunk":
            yield {"not": "a chunk"}
            return
        if command == "routed-invalid":
            stream = await self._routed_engine.generate({"token_ids": "not a list"}, context=context)
            async for _ in stream:
                pass
            return
        if command == "routed-error-escapes":
            stream = await self._routed_engine.generate(dict(NO_SUCH_WORKER), context=context)
            async for _ in stream:
                pass
            return
        if command == "routed-error-reraised":
            try:
                stream = await self._routed_engine.generate(dict(NO_SUCH_WORKER), context=context)
                async for _ in stream:
                    pass
            except RoutedEngineError as error:
                # A ValueError by inheritance, yet it maps to the worker's status, not 400.
                assert isinstance(error, ValueError) and error.code == "unavailable", error.code
                raise
            return
        if command == "worker-error-reraised":
            # A plain request the worker itself fails (its fault file says so): the error's code
            # rides out in a header, so the test knows the processor saw a RoutedEngineError.
            preprocessed = {"model": request["model"], "token_ids": [1, 2, 3, 4],
                            "stop_conditions": {"max_tokens": 2}}
            try:
                stream = await self._routed_engine.generate(preprocessed, context=context)
                async for _ in stream:
                    pass
            except RoutedEngineError as error:
                context.set_response_header("x-routed-error-code", error.code)
                raise
            raise HttpError(418, "the worker did not fail")
        if command == "slow":
            # Streams one token at a time until the client goes away.
            preprocessed = {"model": request["model"], "token_ids": [1, 2, 3, 4],
                            "stop_conditions": {"max_tokens": 5000}}
            stream = await self._routed_engine.generate(preprocessed, context=context)
            async for item in stream:
                yield _chunk(request, "x")
            return
        async for chunk in self._seed.generate(request, context):
            yield chunk


def provider(config, options):
    assert config.namespace, "config carries the frontend's options"

    async def factory(instance_id, mdc, routed_engine):
        seed = MyChatEngine(routed_engine, options, mdc)
        return PythonAsyncEngine(ErrorsEngine(seed, routed_engine).generate, asyncio.get_running_loop())

    return factory
