"""Route extensions (`--frontend-route-extension`): small GET handlers written for Dynamo 1.6.1
served unchanged by `kvmesh up` (their Python runs in the processor host the frontend starts),
every refused shape stopping startup, a handler past 30 s answered 503 and a full pool answered
with the overload status."""
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from conftest import BIN_DIR, ROOT, free_port
from test_admission import start_up as start_kvmesh_up

EXTENSIONS = ROOT / "tests" / "python" / "extensions"


def python_env(extra=None):
    return {"VIRTUAL_ENV": sys.prefix, "PYTHONPATH": str(EXTENSIONS), **(extra or {})}


def start_up(name, args, env=None):
    return start_kvmesh_up(name, args, python_env(env), workers=1)


def test_an_extension_written_for_dynamo_is_served_unchanged():
    # The flag wins over the variable, which names a provider that does not exist.
    mesh = start_up("up-ext", ["--frontend-route-extension", "status_routes:routes"],
                    {"DYN_FRONTEND_ROUTE_EXTENSIONS": "ignored:by_the_flag"})
    try:
        r = requests.get(f"{mesh.base_url}/ext/status", timeout=10)
        assert r.status_code == 200 and r.headers["content-type"] == "application/json", r.text
        assert r.json() == {"ready": True, "cancelled": False, "any_ready": True, "tiny_ready": True,
                            "other_ready": False, "models": ["tiny"], "serving": ["tiny"]}
        teapot = requests.get(f"{mesh.base_url}/ext/teapot", timeout=10)
        assert teapot.status_code == 418 and teapot.json() == {"error": "I'm a teapot", "ready": True}
        # GET only; the built-in routes are untouched.
        assert requests.post(f"{mesh.base_url}/ext/status", timeout=10).status_code == 405
        assert requests.get(f"{mesh.base_url}/health", timeout=10).status_code == 200
        assert requests.get(f"{mesh.base_url}/ext/other", timeout=10).status_code == 404
    finally:
        mesh.stop()


def test_the_variable_names_several_extensions_and_duplicates_load_once():
    mesh = start_up("up-ext-env", [], {"DYN_FRONTEND_ROUTE_EXTENSIONS": "status_routes:routes  status_routes:routes"})
    try:
        assert requests.get(f"{mesh.base_url}/ext/teapot", timeout=10).status_code == 418
    finally:
        mesh.stop()


@pytest.mark.parametrize("provider,named", [
    ("post_method", "only GET"),
    ("path_parameter", "only static paths"),
    ("wildcard", "only static paths"),
    ("async_handler", "async"),
    ("duplicate", "defined twice"),
    ("builtin_path", "serves that path itself"),
    ("no_such_provider", "has no 'no_such_provider'"),
])
def test_each_refused_shape_stops_startup(provider, named):
    with tempfile.TemporaryDirectory() as store:
        env = {**os.environ, **python_env(), "DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": store}
        r = subprocess.run([str(BIN_DIR / "kvmesh-frontend"), "--http-port", str(free_port()),
                            "--frontend-route-extension", f"bad_routes:{provider}"],
                           env=env, capture_output=True, text=True, timeout=60)
    output = r.stdout + r.stderr
    assert r.returncode == 2, output[-2000:]
    assert "--frontend-route-extension" in output and named in output, output[-2000:]


def test_a_slow_handler_gets_503_and_a_full_pool_the_overload_status():
    # Not the default 529: the status must come from the setting, not be built in.
    mesh = start_up("up-ext-slow", ["--frontend-route-extension", "bad_routes:slow"],
                    {"DYN_HTTP_OVERLOAD_STATUS_CODE": "429"})
    try:
        url = f"{mesh.base_url}/ext/slow"
        with ThreadPoolExecutor(4) as pool:
            started = time.monotonic()
            slow = [pool.submit(requests.get, url, timeout=60) for _ in range(4)]
            time.sleep(2)
            # Four threads and no queue: a fifth call is turned away at once.
            turned_away = requests.get(f"{mesh.base_url}/ext/raises", timeout=10)
            assert turned_away.status_code == 429, turned_away.text
            answers = [f.result() for f in slow]
        waited = time.monotonic() - started
        assert [a.status_code for a in answers] == [503] * 4, [a.text for a in answers]
        assert 29 < waited < 40, waited
        assert "error" in answers[0].json()
        # Once the handlers return, the threads serve again; a raising handler is a 500 that
        # keeps its detail out of the answer.
        time.sleep(2)
        raised = requests.get(f"{mesh.base_url}/ext/raises", timeout=10)
        assert raised.status_code == 500 and "secret" not in raised.text, raised.text
    finally:
        mesh.stop()
