"""Route extensions of every shape a frontend must refuse at startup, one provider each."""
import time

from dynamo.llm import FrontendRoute


def _ok(ctx):
    return {"ok": True}


async def _async(ctx):
    return {"ok": True}


def post_method():
    return [FrontendRoute("POST", "/ext/post", _ok)]


def path_parameter():
    return [FrontendRoute("GET", "/ext/items/{id}", _ok)]


def wildcard():
    return [FrontendRoute("GET", "/ext/*rest", _ok)]


def async_handler():
    return [FrontendRoute("GET", "/ext/async", _async)]


def duplicate():
    return [FrontendRoute("GET", "/ext/twice", _ok), FrontendRoute("GET", "/ext/twice", _ok)]


def builtin_path():
    return [FrontendRoute("GET", "/health", _ok)]


def _slow(ctx):
    time.sleep(31)
    return {"slept": True}


def _raises(ctx):
    raise RuntimeError("secret handler detail")


def slow():
    """A handler that outlives the 30 s limit, and one that raises."""
    return [FrontendRoute("GET", "/ext/slow", _slow), FrontendRoute("GET", "/ext/raises", _raises)]
