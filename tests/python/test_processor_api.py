"""The processor host's Python API on its own (docs/processors.md, spec §2-§4): `HttpError`'s
checks and truncation, `Context`'s stop and kill states and its waiter, the header rules a
context enforces, and the `dynamo.*` alias the host's bootstrap installs only when no real
`dynamo` package is importable. Plain Python: no mesh, no binaries."""
import asyncio
import importlib
import importlib.util
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_PYTHON = Path(__file__).resolve().parents[2] / "services" / "processor-host" / "python"

# The host's `kvmesh` package under a name of its own: importing it as `kvmesh` here would shadow
# the `kvmesh.v1` stubs other tests generate (conftest.proto_stubs).
_spec = importlib.util.spec_from_file_location("kvmesh_host_api", _PYTHON / "kvmesh" / "__init__.py",
                                               submodule_search_locations=[str(_PYTHON / "kvmesh")])
sys.modules["kvmesh_host_api"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sys.modules["kvmesh_host_api"])
llm = importlib.import_module("kvmesh_host_api.llm")
exceptions = importlib.import_module("kvmesh_host_api.llm.exceptions")


@pytest.mark.parametrize("code", [True, False, "404", 404.0, None, -1, 600, 1000])
def test_http_error_refuses_a_code_that_is_not_an_int_in_range(code):
    # bool is an int subclass, yet True is not a status.
    with pytest.raises(ValueError):
        llm.HttpError(code, "detail")


@pytest.mark.parametrize("message", [None, b"bytes", 42, ["detail"]])
def test_http_error_refuses_a_message_that_is_not_a_str(message):
    with pytest.raises(ValueError):
        llm.HttpError(404, message)


@pytest.mark.parametrize("code", [0, 400, 503, 529, 599])
def test_http_error_keeps_a_code_in_range_and_its_message(code):
    error = llm.HttpError(code, "detail")
    assert (error.code, error.message) == (code, "detail")
    assert isinstance(error, Exception)


def test_a_long_http_error_message_is_truncated_with_a_warning(caplog):
    at_limit = "a" * 8192
    with caplog.at_level(logging.WARNING):
        assert llm.HttpError(500, at_limit).message == at_limit
    assert not caplog.records, "8192 chars is within the limit"
    long = "".join(chr(ord("a") + i % 26) for i in range(20000))
    with caplog.at_level(logging.WARNING):
        error = llm.HttpError(500, long)
    assert len(error.message) == 8192
    assert error.message[:8000] == long[:8000]
    assert any(r.levelno == logging.WARNING and "truncated" in r.getMessage() for r in caplog.records), \
        caplog.records


def test_a_context_is_neither_stopped_nor_killed_until_told():
    context = llm.Context("req-1")
    assert context.id() == "req-1"
    assert not context.is_stopped() and not context.is_killed()
    # Without an id each context gets its own.
    assert llm.Context().id() and llm.Context().id() != llm.Context().id()


def test_stop_generating_stops_without_killing():
    context = llm.Context()
    context.stop_generating()
    assert context.is_stopped() and not context.is_killed()
    context.stop_generating()
    assert context.is_stopped() and not context.is_killed()


def test_a_killed_context_is_also_stopped():
    # `_kill` is what the host calls when the client goes away.
    context = llm.Context()
    context._kill()
    assert context.is_killed() and context.is_stopped()


def test_a_waiter_wakes_when_the_context_is_stopped():
    async def scenario():
        context = llm.Context()
        waiter = asyncio.ensure_future(context.async_killed_or_stopped())
        await asyncio.sleep(0.05)
        assert not waiter.done(), "the waiter returned before anything stopped the context"
        # A second waiter shares the wake-up.
        second = asyncio.ensure_future(context.async_killed_or_stopped())
        await asyncio.sleep(0)
        context.stop_generating()
        assert await asyncio.wait_for(waiter, 1) is True
        assert await asyncio.wait_for(second, 1) is True

    asyncio.run(scenario())


def test_a_waiter_wakes_when_the_context_is_killed_and_returns_at_once_after():
    async def scenario():
        context = llm.Context()
        waiter = asyncio.ensure_future(context.async_killed_or_stopped())
        await asyncio.sleep(0.05)
        assert not waiter.done()
        context._kill()
        assert await asyncio.wait_for(waiter, 1) is True
        # Already stopped: no wait at all.
        assert await asyncio.wait_for(context.async_killed_or_stopped(), 0.1) is True
        stopped = llm.Context()
        stopped.stop_generating()
        assert await asyncio.wait_for(stopped.async_killed_or_stopped(), 0.1) is True

    asyncio.run(scenario())


def test_context_trace_ids_are_none_when_absent():
    traced = llm.Context("r", trace_id="a" * 32, span_id="b" * 16, parent_span_id="c" * 16)
    assert (traced.trace_id, traced.span_id, traced.parent_span_id) == ("a" * 32, "b" * 16, "c" * 16)
    untraced = llm.Context("r", trace_id="", span_id="", parent_span_id="")
    assert (untraced.trace_id, untraced.span_id, untraced.parent_span_id) == (None, None, None)


def test_set_response_header_rules():
    # No carrier (streaming without a peek, Responses, Messages): False, and nothing is checked.
    assert llm.Context().set_response_header("x-anything", "v") is False
    sent = []
    context = llm.Context(_headers=lambda name, value: sent.append((name, value)) or True)
    assert context.set_response_header("x-processor", "yes") is True
    for reserved in ("Content-Type", "content-length", "X-Request-Id", "Transfer-Encoding", "CONNECTION",
                     "keep-alive", "te", "trailer", "upgrade", "proxy-authorization"):
        with pytest.raises(ValueError):
            context.set_response_header(reserved, "x")
    for name, value in (("bad name", "x"), ("", "x"), ("x-ok", "line\nbreak"), ("x-ok", 3), (None, "x")):
        with pytest.raises(ValueError):
            context.set_response_header(name, value)
    assert sent == [("x-processor", "yes")]


def _bootstrap(pythonpath, probe):
    """Runs `probe` in a fresh interpreter after the host's bootstrap, with the `kvmesh` package
    served from its sources as the host serves it from the binary; returns what it printed (JSON)."""
    script = textwrap.dedent(f"""
        import json, os, sys
        root = {str(_PYTHON)!r}
        SOURCES = {{}}
        for folder, _, files in os.walk(os.path.join(root, "kvmesh")):
            for file in files:
                if file.endswith(".py"):
                    parts = os.path.relpath(os.path.join(folder, file), root)[:-3].split(os.sep)
                    is_package = parts[-1] == "__init__"
                    name = ".".join(parts[:-1] if is_package else parts)
                    SOURCES[name] = (is_package, open(os.path.join(folder, file)).read())
        exec(open(os.path.join(root, "bootstrap.py")).read())
    """) + textwrap.dedent(probe)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = os.pathsep.join(map(str, pythonpath))
    # Run from an empty directory so nothing in the checkout is importable by accident.
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=pythonpath[0] if pythonpath else "/",
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_dynamo_names_are_kvmesh_modules_when_dynamo_is_not_installed(tmp_path):
    if importlib.util.find_spec("dynamo") is not None:
        pytest.skip("a real dynamo package is installed in this Python")
    seen = _bootstrap([tmp_path], """
        import dynamo.llm, dynamo.llm.exceptions, dynamo.frontend
        import kvmesh.llm, kvmesh.llm.exceptions, kvmesh.frontend
        from dynamo.llm import (HttpError, PythonAsyncEngine, Context, FrontendRoute, FrontendResponse,
                                FrontendExtensionContext)
        from dynamo.llm.exceptions import InvalidArgument, RoutedEngineError, DynamoException
        print(json.dumps({
            "aliased": DYNAMO_ALIASED,
            "llm": dynamo.llm is kvmesh.llm,
            "exceptions": dynamo.llm.exceptions is kvmesh.llm.exceptions,
            "frontend": dynamo.frontend is kvmesh.frontend,
            "same_class": HttpError is kvmesh.llm.HttpError and InvalidArgument is kvmesh.llm.exceptions.InvalidArgument,
            "hierarchy": issubclass(InvalidArgument, DynamoException) and issubclass(RoutedEngineError, ValueError),
            "kvmesh_from_sources": kvmesh.llm.__spec__.origin.startswith("<kvmesh-processor-host>"),
        }))
    """)
    assert seen == {"aliased": True, "llm": True, "exceptions": True, "frontend": True, "same_class": True,
                    "hierarchy": True, "kvmesh_from_sources": True}


def test_a_real_dynamo_package_is_never_shadowed(tmp_path):
    # A stand-in for an installed Dynamo: its own `dynamo.llm` must be the one processors import.
    (tmp_path / "dynamo" / "llm").mkdir(parents=True)
    (tmp_path / "dynamo" / "__init__.py").write_text("REAL = True\n")
    (tmp_path / "dynamo" / "llm" / "__init__.py").write_text("class HttpError(Exception):\n    REAL = True\n")
    seen = _bootstrap([tmp_path], """
        import dynamo, dynamo.llm
        import kvmesh.llm
        print(json.dumps({
            "aliased": DYNAMO_ALIASED,
            "real": getattr(dynamo, "REAL", False) and getattr(dynamo.llm.HttpError, "REAL", False),
            "llm": dynamo.llm is kvmesh.llm,
            "kvmesh": kvmesh.llm.HttpError(404, "x").code,
        }))
    """)
    assert seen == {"aliased": False, "real": True, "llm": False, "kvmesh": 404}
