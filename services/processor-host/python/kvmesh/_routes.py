"""Route extensions (`--frontend-route-extension`): small synchronous GET handlers an operator adds
to the frontend's HTTP edge, loaded and checked when the host starts and run on a pool of their
own.

Each extension names a provider (an entry point in `dynamo.frontend.routes`, then
`kvmesh.frontend.routes`, else `module:function`) that returns one `FrontendRoute` or an iterable
of them. Only `GET` with a static path is served; anything else stops the host naming the route.
A call runs its handler on one of `POOL_SIZE` threads with no queue: when every thread is busy
the call gets the overload status at once, and a handler still running after `TIMEOUT_SECS` gets
503 (its thread stays busy until it returns).
"""
import inspect
import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from . import llm

_log = logging.getLogger("kvmesh.routes")

ROUTE_GROUPS = ("dynamo.frontend.routes", "kvmesh.frontend.routes")
POOL_SIZE = 4
TIMEOUT_SECS = 30.0
# Characters that would make a path dynamic (parameters, wildcards) or not a plain path.
_DYNAMIC = set("{}*:?#<>")


def _error(message, kind):
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}})


class RouteTable:
    """The static GET routes of the host's extensions, and the pool their handlers run on."""

    def __init__(self, overload_status):
        self.handlers = {}
        self.overload_status = overload_status
        self._pool = ThreadPoolExecutor(max_workers=POOL_SIZE, thread_name_prefix="kvmesh-route")
        self._slots = threading.BoundedSemaphore(POOL_SIZE)

    def load(self, names, reserved, resolve, startup_error):
        """Calls each extension's provider once (a name given twice is loaded once) and checks
        its routes; a bad one raises `startup_error` naming the extension and the route."""
        for name in dict.fromkeys(n for n in names if n):
            provider = resolve(name, ROUTE_GROUPS, "route extension")
            if not callable(provider):
                raise startup_error(f"--frontend-route-extension {name}: the provider is not callable")
            try:
                routes = provider()
            except Exception as error:  # noqa: BLE001 - the message names the extension
                raise startup_error(f"--frontend-route-extension {name}: the provider raised "
                                    f"{type(error).__name__}: {error}") from error
            if isinstance(routes, llm.FrontendRoute):
                routes = [routes]
            try:
                routes = list(routes)
            except TypeError:
                raise startup_error(f"--frontend-route-extension {name}: the provider returned "
                                    f"{type(routes).__name__}, not FrontendRoute(s)") from None
            for route in routes:
                problem = self._check(route, reserved)
                if problem:
                    raise startup_error(f"--frontend-route-extension {name}: {problem}")
                self.handlers[route.path] = route.handler

    def _check(self, route, reserved):
        if not isinstance(route, llm.FrontendRoute):
            return f"{route!r} is not a FrontendRoute"
        path = route.path
        if not isinstance(route.method, str) or route.method.upper() != "GET":
            return f"route {path!r}: method {route.method!r} is not served (only GET)"
        if not isinstance(path, str) or not path.startswith("/") or _DYNAMIC & set(path) or "//" in path:
            return f"route {path!r}: only static paths are served (no parameters or wildcards)"
        if path in reserved:
            return f"route {path!r}: the frontend serves that path itself"
        if path in self.handlers:
            return f"route {path!r}: defined twice"
        handler = route.handler
        if not callable(handler):
            return f"route {path!r}: the handler is not callable"
        if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(getattr(handler, "__call__", None)):
            return f"route {path!r}: the handler is async; route handlers are synchronous"
        return None

    def paths(self):
        """The served paths, sorted."""
        return sorted(self.handlers)

    def call(self, path, state_json, reply):
        """Runs `path`'s handler; `reply(status, body_json)` is called exactly once, from any thread."""
        handler = self.handlers.get(path)
        if handler is None:
            reply(404, _error(f"no route extension serves {path}", "not_found_error"))
            return
        if not self._slots.acquire(blocking=False):
            reply(self.overload_status, _error("every route extension thread is busy", "overloaded"))
            return
        answered = threading.Lock()

        def answer(status, body):
            if answered.acquire(blocking=False):
                reply(status, body)

        def run():
            try:
                result = handler(llm.FrontendExtensionContext(json.loads(state_json)))
                if isinstance(result, llm.FrontendResponse):
                    answer(result.status_code, json.dumps(result.body))
                else:
                    answer(200, json.dumps(result))
            except Exception as error:  # noqa: BLE001 - a handler failure is a 500
                _log.exception("route extension %s failed", path)
                answer(500, _error(f"the route extension failed: {type(error).__name__}", "internal_error"))
            finally:
                timer.cancel()
                self._slots.release()

        timer = threading.Timer(TIMEOUT_SECS, answer, (503, _error(
            f"the route extension did not answer within {TIMEOUT_SECS:.0f} s", "service_unavailable")))
        timer.daemon = True
        timer.start()
        self._pool.submit(run)
