"""When a streamed response commits (docs/http-api.md, "Pre-commit peek"): by default the 200
and its headers go out once the worker accepted the request, and a failure the worker reports
first arrives as an SSE error event; with DYN_HTTP_PRE_COMMIT_ERROR_PEEK_MS the frontend waits
that long for the first response, so such a failure gets its own status."""
import json
import random
import time

import pytest
import requests

from test_admission import start_up

# 60 blocks of 64 tokens: a 3000-token prompt fits the mock engine's KV pool, 4000 tokens never do.
ARGS = ["--speedup-ratio", "0.05", "--max-model-len", "8192", "--num-gpu-blocks-override", "60"]


def prompt(length, seed):
    rng = random.Random(seed)
    return [rng.randrange(10, 2900) for _ in range(length)]


def stream(mesh, length, seed):
    """(seconds to the response headers, seconds to the first event, status, events)."""
    started = time.monotonic()
    with requests.post(f"{mesh.base_url}/v1/completions", stream=True, timeout=60,
                       json={"model": "tiny", "prompt": prompt(length, seed), "max_tokens": 2,
                             "stream": True}) as r:
        headers_at = time.monotonic() - started
        if r.status_code != 200:
            return headers_at, None, r.status_code, [r.json()]
        first_at, events = None, []
        for line in r.iter_lines():
            if line.startswith(b"data: "):
                first_at = first_at or time.monotonic() - started
                events.append(line[6:].decode())
        return headers_at, first_at, r.status_code, events


@pytest.fixture(scope="module")
def default_mesh():
    mesh = start_up("up-commit", ARGS, workers=1)
    yield mesh
    mesh.stop()


@pytest.fixture(scope="module")
def peek_mesh():
    mesh = start_up("up-peek", ARGS, {"DYN_HTTP_PRE_COMMIT_ERROR_PEEK_MS": "60000"}, workers=1)
    yield mesh
    mesh.stop()


def test_a_stream_commits_before_its_first_token_by_default(default_mesh):
    headers_at, first_at, status, events = stream(default_mesh, 3000, 1)
    assert status == 200 and events[-1] == "[DONE]"
    # The slow prefill of 3000 tokens happens after the headers went out.
    assert first_at - headers_at > 0.2, (headers_at, first_at)


def test_a_worker_rejection_after_commit_is_an_sse_error(default_mesh):
    _, _, status, events = stream(default_mesh, 4000, 2)
    assert status == 200
    assert "[DONE]" not in events
    error = json.loads(events[-1])["error"]
    assert "KV" in error["message"] or "pool" in error["message"], error


def test_with_a_peek_a_first_failure_gets_its_own_status(peek_mesh):
    _, _, status, body = stream(peek_mesh, 4000, 3)
    assert status == 400, body
    assert body[0]["error"]["type"] == "invalid_request_error"
    # A good request commits with the engine's first response: the slow prefill of 3000 tokens
    # happens before the headers go out. (The first SSE event may lag the headers by a decode
    # step: a mock token that ends inside a UTF-8 character produces no text until the next one.)
    headers_at, first_at, status, events = stream(peek_mesh, 3000, 4)
    assert status == 200 and events[-1] == "[DONE]"
    assert headers_at > 0.2, (headers_at, first_at)
