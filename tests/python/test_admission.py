"""Admission through `kvmesh up`: busy thresholds reject with 529 and the OpenAI error JSON,
`/busy_threshold` changes them at run time (and is gone with DYN_DISABLE_FRONTEND_ADMIN_API),
parked requests leave the queue in priority order, and nvext / header pins steer requests (and
are ignored with DYN_DISABLE_FRONTEND_NVEXT)."""
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from conftest import Mesh, Proc, free_port, wait_ready


def start_up(name, args, env=None, workers=2):
    port = free_port()
    proc = Proc(name, ["kvmesh", "up", "--http-host", "127.0.0.1", "--http-port", str(port),
                       "--num-workers", str(workers), "--tcp-rpc-port", str(free_port()), *args], env)
    mesh = Mesh(f"http://127.0.0.1:{port}", [proc])
    try:
        wait_ready(mesh.base_url, "tiny", workers, [proc])
    except BaseException:
        print(proc.output()[-4000:])
        mesh.stop()
        raise
    return mesh


def prompt(rng, length):
    return [rng.randrange(10, 2900) for _ in range(length)]


def post(mesh, body, headers=None):
    return requests.post(f"{mesh.base_url}/v1/completions", json={"model": "tiny", **body},
                         headers=headers or {}, timeout=60)


@pytest.fixture(scope="module")
def busy_mesh():
    # Slow prefill, so a request holds its prefill tokens long enough to make its worker busy.
    mesh = start_up("up-busy", ["--speedup-ratio", "0.5", "--active-prefill-tokens-threshold", "100"])
    yield mesh
    mesh.stop()


def metric(mesh, series):
    text = requests.get(f"{mesh.base_url}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def burst(mesh, n, length=1500, seed=0):
    rng = random.Random(seed)
    prompts = [prompt(rng, length) for _ in range(n)]
    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(lambda p: post(mesh, {"prompt": p, "max_tokens": 2}), prompts))


def test_busy_workers_reject_with_529_and_openai_json(busy_mesh):
    responses = burst(busy_mesh, 12)
    statuses = [r.status_code for r in responses]
    assert 200 in statuses, statuses
    rejected = [r for r in responses if r.status_code == 529]
    assert rejected, statuses
    error = rejected[0].json()["error"]
    assert error["message"] == "Service temporarily unavailable: All workers are busy, please retry later"
    assert error["type"]
    assert metric(busy_mesh, 'dynamo_frontend_model_rejection_total{endpoint="completions",model="tiny"}') \
        >= len(rejected)
    # Nothing was left tracked: once the burst is over a lone request is admitted.
    assert post(busy_mesh, {"prompt": [5] * 1500, "max_tokens": 2}).status_code == 200


def test_busy_threshold_endpoint_changes_admission_at_run_time(busy_mesh):
    r = requests.get(f"{busy_mesh.base_url}/busy_threshold", timeout=5)
    assert r.status_code == 200
    [entry] = r.json()["thresholds"]
    assert entry == {"model": "tiny", "active_decode_blocks_threshold": None,
                     "active_prefill_tokens_threshold": 100, "active_prefill_tokens_threshold_frac": None}

    r = requests.post(f"{busy_mesh.base_url}/busy_threshold",
                      json={"model": "tiny", "active_prefill_tokens_threshold": None,
                            "active_decode_blocks_threshold": 0.95}, timeout=5)
    assert r.status_code == 200, r.text
    assert r.json()["active_prefill_tokens_threshold"] is None
    assert r.json()["active_decode_blocks_threshold"] == 0.95
    assert all(r.status_code == 200 for r in burst(busy_mesh, 12, seed=1))

    r = requests.post(f"{busy_mesh.base_url}/busy_threshold",
                      json={"model": "tiny", "active_prefill_tokens_threshold": 100}, timeout=5)
    assert r.status_code == 200
    assert r.json()["active_decode_blocks_threshold"] == 0.95  # absent fields keep their value
    assert any(r.status_code == 529 for r in burst(busy_mesh, 12, seed=2))

    for bad, status in [({"model": "nope", "active_prefill_tokens_threshold": 1}, 404),
                        ({"active_prefill_tokens_threshold": 1}, 400),
                        ({"model": "tiny", "active_prefill_tokens_threshold": -1}, 400),
                        ({"model": "tiny", "active_decode_blocks_threshold": "x"}, 400),
                        ({"model": "tiny", "active_decode_blocks_threshold": 1.5}, 400)]:
        r = requests.post(f"{busy_mesh.base_url}/busy_threshold", json=bad, timeout=5)
        assert r.status_code == status, (bad, r.text)
        assert "error" in r.json()


def test_admin_api_can_be_disabled():
    mesh = start_up("up-noadmin", [], {"DYN_DISABLE_FRONTEND_ADMIN_API": "1"})
    try:
        assert requests.get(f"{mesh.base_url}/busy_threshold", timeout=5).status_code == 404
        r = requests.post(f"{mesh.base_url}/busy_threshold", json={"model": "tiny"}, timeout=5)
        assert r.status_code == 404
    finally:
        mesh.stop()


def test_queued_requests_leave_in_priority_order():
    # One worker; any prefill in flight fills it, so every later request parks until the
    # previous one's first token. The blocker is admitted at once; the holder arrives once the
    # blocker's first token is out and holds its prefill tokens through its own slow 3000-token
    # prefill pass, so the prioritised requests arriving next all park.
    # The peek makes each response's headers wait for the worker's first response (its first
    # token), which is what the timings below read.
    mesh = start_up("up-queue", ["--speedup-ratio", "0.05", "--max-model-len", "8192",
                                 "--router-queue-threshold", "0.00001",
                                 "--router-queue-policy", "fcfs"],
                    {"DYN_HTTP_PRE_COMMIT_ERROR_PEEK_MS": "60000"}, workers=1)
    try:
        rng = random.Random(5)
        first_token_at = {}
        lock = threading.Lock()

        def stream(name, priority, length=1000):
            headers = {} if priority is None else {"x-dynamo-request-priority": str(priority)}
            with requests.post(f"{mesh.base_url}/v1/completions", stream=True, timeout=60, headers=headers,
                               json={"model": "tiny", "prompt": prompt(rng, length), "max_tokens": 2,
                                     "stream": True}) as r:
                # The frontend answers with headers once the worker's first response is in: that
                # is the first token, even one whose text is still held back (an empty delta sends
                # no event, and the next token can share an engine pass with the next request's
                # first token).
                with lock:
                    first_token_at.setdefault(name, time.monotonic())
                assert r.status_code == 200, r.text
                for line in r.iter_lines():
                    if line == b"data: [DONE]":
                        break

        threads = []
        for name, length in [("blocker", 1000), ("holder", 3000)]:
            t = threading.Thread(target=stream, args=(name, None, length))
            t.start()
            threads.append(t)
            if name == "blocker":
                # The holder must arrive after the blocker's first token (its prefill is then done
                # and the holder is admitted), not after a fixed delay a loaded machine can outrun.
                deadline = time.monotonic() + 30
                while "blocker" not in first_token_at and time.monotonic() < deadline:
                    time.sleep(0.005)
                assert "blocker" in first_token_at
            else:
                time.sleep(0.05)
        for name, priority in [("p0", 0), ("p5", 5), ("p10", 10), ("p1", 1)]:
            t = threading.Thread(target=stream, args=(name, priority))
            t.start()
            threads.append(t)
            time.sleep(0.01)
        time.sleep(0.2)
        pending = metric(mesh, 'dynamo_frontend_router_queue_pending_requests{worker_type="decode"}')
        for t in threads:
            t.join()
        assert pending >= 1, pending
        order = sorted(first_token_at, key=first_token_at.get)
        assert order == ["blocker", "holder", "p10", "p5", "p1", "p0"], order
    finally:
        mesh.stop()


@pytest.fixture(scope="module")
def pin_meshes():
    normal = start_up("up-pins", ["--speedup-ratio", "100", "--enable-anthropic-api"])
    disabled = start_up("up-nonvext", ["--speedup-ratio", "100", "--enable-anthropic-api"],
                        {"DYN_DISABLE_FRONTEND_NVEXT": "1"})
    yield normal, disabled
    normal.stop()
    disabled.stop()


def worker_ids(mesh, n=20):
    ids = set()
    for _ in range(n):
        r = post(mesh, {"prompt": [1, 2, 3], "max_tokens": 1, "nvext": {"extra_fields": ["worker_id"]}})
        ids.add(r.json()["nvext"]["worker_id"]["decode_worker_id"])
    return sorted(ids)


def test_nvext_and_header_pins(pin_meshes):
    mesh, _ = pin_meshes
    ids = worker_ids(mesh)
    assert len(ids) == 2
    for target in ids:
        for _ in range(4):
            r = post(mesh, {"prompt": [4, 5, 6], "max_tokens": 1,
                            "nvext": {"backend_instance_id": target, "extra_fields": ["worker_id"]}})
            assert r.json()["nvext"]["worker_id"]["decode_worker_id"] == target
    # The header wins over the body.
    r = post(mesh, {"prompt": [4, 5, 6], "max_tokens": 1,
                    "nvext": {"backend_instance_id": ids[0], "extra_fields": ["worker_id"]}},
             headers={"x-dynamo-worker-instance-id": str(ids[1])})
    assert r.json()["nvext"]["worker_id"]["decode_worker_id"] == ids[1]
    # A pin to a worker that does not exist is a 503, a malformed one a 400.
    r = post(mesh, {"prompt": [4], "max_tokens": 1, "nvext": {"backend_instance_id": 12345}})
    assert r.status_code == 503, r.text
    r = post(mesh, {"prompt": [4], "max_tokens": 1, "nvext": {"backend_instance_id": "x"}})
    assert r.status_code == 400
    assert "backend_instance_id" in r.json()["error"]["message"]


def test_disabled_nvext_ignores_pins_and_extra_fields(pin_meshes):
    _, mesh = pin_meshes
    seen = set()
    for _ in range(8):
        r = post(mesh, {"prompt": [4, 5, 6], "max_tokens": 1,
                        "nvext": {"backend_instance_id": 12345, "extra_fields": ["worker_id"]}},
                 headers={"x-dynamo-worker-instance-id": "12345"})
        assert r.status_code == 200, r.text
        assert "nvext" not in r.json() or r.json()["nvext"] is None
        seen.add(r.status_code)
    assert seen == {200}


def test_session_affinity_pins_a_session_to_its_first_worker():
    mesh = start_up("up-sessions", ["--speedup-ratio", "100", "--router-session-affinity-ttl-secs", "60"])
    try:
        def worker(headers=None, nvext=None):
            body = {"prompt": [7, 8, 9], "max_tokens": 1, "nvext": {"extra_fields": ["worker_id"], **(nvext or {})}}
            r = post(mesh, body, headers)
            assert r.status_code == 200, r.text
            return r.json()["nvext"]["worker_id"]["decode_worker_id"]

        # Without a session round-robin alternates between the two workers.
        assert len({worker() for _ in range(4)}) == 2
        for session in ["alpha", "beta", "gamma"]:
            seen = {worker({"X-Dynamo-Session-ID": session}) for _ in range(6)}
            assert len(seen) == 1, (session, seen)
        # nvext.session_control bind gives the same stickiness through the body.
        seen = {worker(nvext={"session_control": {"session_id": "delta", "action": "bind", "timeout": 30}})
                for _ in range(6)}
        assert len(seen) == 1, seen
    finally:
        mesh.stop()


def test_a_model_waits_for_its_minimum_of_workers():
    port = free_port()
    proc = Proc("up-min-workers", ["kvmesh", "up", "--http-host", "127.0.0.1", "--http-port", str(port),
                                   "--num-workers", "2", "--tcp-rpc-port", str(free_port()),
                                   "--router-min-initial-workers", "3"])
    mesh = Mesh(f"http://127.0.0.1:{port}", [proc])
    try:
        from conftest import wait_until
        wait_until(lambda: requests.get(f"{mesh.base_url}/live", timeout=2).status_code == 200, what="live")
        time.sleep(1.0)  # both workers registered by now
        assert requests.get(f"{mesh.base_url}/v1/models", timeout=5).json()["data"] == []
        r = post(mesh, {"prompt": [1, 2, 3], "max_tokens": 1})
        assert r.status_code == 503, r.text
        assert requests.get(f"{mesh.base_url}/health", timeout=5).status_code == 503
    finally:
        mesh.stop()


PINNED_ENDPOINTS = {
    "/v1/completions": {"prompt": [4, 5, 6], "max_tokens": 1},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
    "/v1/responses": {"input": "hi", "max_output_tokens": 1},
    "/v1/messages": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
    "/v1/embeddings": {"input": "hi"},
}


def test_nvext_switch_holds_on_every_endpoint(pin_meshes):
    """A pin to a worker that does not exist finds none (503) on every endpoint; with
    DYN_DISABLE_FRONTEND_NVEXT the same request ignores the pin and is served."""
    normal, disabled = pin_meshes
    for path, body in PINNED_ENDPOINTS.items():
        pinned = {"model": "tiny", **body, "nvext": {"backend_instance_id": 12345}}
        r = requests.post(f"{normal.base_url}{path}", json=pinned, timeout=30)
        assert r.status_code == 503, (path, r.text)
        r = requests.post(f"{disabled.base_url}{path}", json=pinned, timeout=30)
        assert r.status_code == 200, (path, r.text)
        headed = requests.post(f"{disabled.base_url}{path}", json={"model": "tiny", **body}, timeout=30,
                               headers={"x-dynamo-worker-instance-id": "12345"})
        assert headed.status_code == 200, (path, headed.text)


def test_nvext_switch_drops_the_guided_fields_too(pin_meshes):
    """DYN_DISABLE_FRONTEND_NVEXT ignores nvext.guided_* like every other nvext field (a grammar,
    501 otherwise, is served; a choice does not constrain); the root-level spellings still apply."""
    normal, disabled = pin_meshes
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "Pick one."}], "max_tokens": 40}
    grammar = {**chat, "nvext": {"guided_grammar": "root ::= \"a\""}}
    assert requests.post(f"{normal.base_url}/v1/chat/completions", json=grammar, timeout=30).status_code == 501
    r = requests.post(f"{disabled.base_url}/v1/chat/completions", json=grammar, timeout=30)
    assert r.status_code == 200, r.text
    choice = {"guided_choice": ["kvmesh-choice-zzz"]}
    for path, body, text in [("/v1/chat/completions", chat, lambda j: j["choices"][0]["message"]["content"]),
                             ("/v1/completions", {"model": "tiny", "prompt": "Pick one.", "max_tokens": 40},
                              lambda j: j["choices"][0]["text"])]:
        constrained = requests.post(f"{normal.base_url}{path}", json={**body, "nvext": choice}, timeout=30)
        assert text(constrained.json()) == "kvmesh-choice-zzz", (path, constrained.text)
        ignored = requests.post(f"{disabled.base_url}{path}", json={**body, "nvext": choice}, timeout=30)
        assert ignored.status_code == 200 and text(ignored.json()) != "kvmesh-choice-zzz", (path, ignored.text)
        root = requests.post(f"{disabled.base_url}{path}", json={**body, **choice}, timeout=30)
        assert text(root.json()) == "kvmesh-choice-zzz", (path, root.text)


def test_nvext_legacy_sampling_fields_are_checked_and_dropped_with_the_switch(pin_meshes):
    """Dynamo's legacy nvext.ignore_eos/top_k/min_p/repetition_penalty are read on every chat-family
    endpoint (a bad value is a 400 naming nvext.<field>) and dropped with DYN_DISABLE_FRONTEND_NVEXT."""
    normal, disabled = pin_meshes
    legacy = {"ignore_eos": True, "top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1}
    for path, body in PINNED_ENDPOINTS.items():
        if path == "/v1/embeddings":
            continue
        good = requests.post(f"{normal.base_url}{path}", json={"model": "tiny", **body, "nvext": legacy}, timeout=30)
        assert good.status_code == 200, (path, good.text)
        for field, value in [("top_k", "five"), ("repetition_penalty", 0), ("ignore_eos", "yes"), ("min_p", 2)]:
            bad = {"model": "tiny", **body, "nvext": {field: value}}
            r = requests.post(f"{normal.base_url}{path}", json=bad, timeout=30)
            assert r.status_code == 400, (path, field, r.text)
            assert f"nvext.{field}" in r.json()["error"]["message"], (path, r.text)
            if path != "/v1/messages":
                assert r.json()["error"]["param"] == f"nvext.{field}", (path, r.text)
            r = requests.post(f"{disabled.base_url}{path}", json=bad, timeout=30)
            assert r.status_code == 200, (path, field, r.text)
