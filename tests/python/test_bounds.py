"""Bounded resources on real processes (docs/security.md, "Bounded resources"): bodies at the size
limit, the header-read and idle timeouts and the connection cap of the HTTP edge, the limit of
requests in flight on every inference route, the gRPC stream limit per connection, and the router
queue's length and wait bounds."""
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

from conftest import Proc, free_port, require_env, start_distributed, wait_until
from test_admission import metric, start_up

BODY_LIMIT = 45 * 1024 * 1024  # the default DYN_HTTP_BODY_LIMIT_MB


def vm_hwm_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def token_body(size):
    """A completions body of exactly `size` bytes whose prompt is one token id per two bytes."""
    head, tail = b'{"model":"tiny","prompt":[', b"1]}"
    count = (size - len(head) - len(tail)) // 2
    body = head + b"1," * count + tail
    return body + b" " * (size - len(body))


def test_bodies_at_the_size_limit_leave_the_frontend_small():
    mesh = start_distributed("etcd")
    try:
        frontend = mesh.procs[0]
        body = token_body(BODY_LIMIT)
        url = f"{mesh.base_url}/v1/completions"

        def send(_):
            return requests.post(url, data=body, headers={"content-type": "application/json"}, timeout=600)

        with ThreadPoolExecutor(max_workers=10) as pool:
            responses = list(pool.map(send, range(10)))
        # 22 million token ids: parsed, then refused for the model's context length.
        assert {r.status_code for r in responses} == {400}, [r.text[:200] for r in responses]
        assert all(r.json()["error"]["message"] for r in responses)
        assert frontend.alive()
        peak = vm_hwm_kib(frontend.proc.pid)
        print(f"frontend VmHWM after 10 concurrent {BODY_LIMIT >> 20} MiB bodies: {peak >> 10} MiB")
        assert peak < 1024 * 1024, f"VmHWM {peak >> 10} MiB"
        # A body over the limit is a 413, and the frontend still answers.
        over = requests.post(url, data=body + b" " * 16, headers={"content-type": "application/json"}, timeout=60)
        assert over.status_code == 413
        assert requests.get(f"{mesh.base_url}/health", timeout=5).status_code == 200
    finally:
        mesh.stop()


def test_bodies_past_the_body_budget_wait_then_get_the_overload_status():
    """A 1 MiB budget with a 100 ms wait: of six 600 KiB bodies sent at once (each fits alone),
    those that find no room within the wait get 529 with an OpenAI error body; the budget comes
    back, so a body sent afterwards is read and parsed."""
    mesh = start_distributed("etcd", num_workers=1, frontend_args=[
        "--http-body-budget-mb", "1", "--http-body-budget-wait-ms", "100"])
    try:
        body = token_body(600 * 1024)
        url = f"{mesh.base_url}/v1/completions"

        def send(_):
            return requests.post(url, data=body, headers={"content-type": "application/json"}, timeout=120)

        statuses = []
        for _ in range(5):  # until one round overlaps enough to find the budget full
            with ThreadPoolExecutor(max_workers=6) as pool:
                responses = list(pool.map(send, range(6)))
            statuses = [r.status_code for r in responses]
            if 529 in statuses:
                break
        assert 529 in statuses, statuses
        assert set(statuses) <= {400, 529}, statuses  # 400: parsed, then too long for the model
        refused = next(r for r in responses if r.status_code == 529)
        assert refused.json()["error"]["message"], refused.text
        assert requests.post(url, data=body, headers={"content-type": "application/json"},
                             timeout=60).status_code == 400
        ok = requests.post(url, json={"model": "tiny", "prompt": "hello", "max_tokens": 2}, timeout=60)
        assert ok.status_code == 200, ok.text
    finally:
        mesh.stop()


def start_edge(*args):
    mesh = start_distributed("etcd", num_workers=1, frontend_args=list(args))
    mesh.port = int(mesh.base_url.rsplit(":", 1)[1])
    return mesh


@pytest.fixture(scope="module")
def edge():
    """A frontend with short timeouts: the idle one shorter, so that it, not the header-read
    timeout, closes a kept-alive HTTP/1.1 connection."""
    mesh = start_edge("--http-header-read-timeout-secs", "2", "--http-idle-timeout-secs", "1")
    yield mesh
    mesh.stop()


def connect(mesh):
    return socket.create_connection(("127.0.0.1", mesh.port), timeout=10)


def closed_within(sock, seconds):
    """How long until the server closed `sock` (reading and discarding), or None past `seconds`."""
    started = time.monotonic()
    sock.settimeout(0.2)
    while time.monotonic() - started < seconds:
        try:
            if sock.recv(65536) == b"":
                return time.monotonic() - started
        except socket.timeout:
            continue
        except ConnectionError:
            return time.monotonic() - started
    return None


def get_health(sock):
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    sock.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    return data.split(b"\r\n", 1)[0]


def test_a_slowloris_client_is_cut_off_by_the_header_timeout(edge):
    trickler = connect(edge)
    trickler.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    started = time.monotonic()
    cut = None
    for _ in range(40):  # one header byte every 0.25 s: never a complete head
        try:
            trickler.sendall(b"X")
        except ConnectionError:
            cut = time.monotonic() - started
            break
        if closed_within(trickler, 0.25) is not None:
            cut = time.monotonic() - started
            break
    assert cut is not None and cut < 5, cut
    # A client that sends nothing at all is cut off the same way.
    silent = connect(edge)
    assert closed_within(silent, 5) is not None
    # Meanwhile the edge serves others.
    assert requests.get(f"{edge.base_url}/health", timeout=5).status_code == 200


def test_an_idle_connection_is_closed_after_the_idle_timeout(edge):
    sock = connect(edge)
    assert get_health(sock).endswith(b"200 OK")
    time.sleep(0.5)
    assert get_health(sock).endswith(b"200 OK"), "kept alive while used"
    idle = closed_within(sock, 8)
    assert idle is not None and 0.8 <= idle < 1.9, idle


def test_the_connection_cap_holds_connections_past_it():
    edge = start_edge("--http-max-connections", "3")
    try:
        held_connections_past_the_cap(edge)
    finally:
        edge.stop()


def held_connections_past_the_cap(edge):
    held = [connect(edge) for _ in range(3)]
    for sock in held:
        assert get_health(sock).endswith(b"200 OK")
    extra = connect(edge)  # accepted by the kernel's backlog, not served
    extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    extra.settimeout(1.0)
    with pytest.raises(socket.timeout):
        extra.recv(65536)
    held.pop().close()
    extra.settimeout(10)
    assert extra.recv(65536).split(b"\r\n", 1)[0].endswith(b"200 OK")
    for sock in held + [extra]:
        sock.close()


def stream_completion(mesh, max_tokens, started=None):
    with requests.post(f"{mesh.base_url}/v1/completions", stream=True, timeout=120,
                       json={"model": "tiny", "prompt": [5, 6, 7], "max_tokens": max_tokens,
                             "ignore_eos": True, "stream": True}) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines():
            if started is not None:
                started.set()
            if line == b"data: [DONE]":
                break


def test_the_concurrency_limit_answers_every_inference_route_with_the_overload_status():
    grpc_port = free_port()
    mesh = start_up("up-limit", ["--speedup-ratio", "1", "--enable-anthropic-api", "--kserve-grpc-port",
                                 str(grpc_port), "--rejection-frontend-request-concurrency-limit", "2"],
                    {"DYN_HTTP_OVERLOAD_STATUS_CODE": "503"}, workers=1)
    try:
        holders, events = [], []
        for _ in range(2):
            started = threading.Event()
            t = threading.Thread(target=stream_completion, args=(mesh, 400, started))
            t.start()
            holders.append(t)
            events.append(started)
        assert all(e.wait(30) for e in events)
        url = mesh.base_url
        calls = {
            "completions": ("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 1}),
            "chat": ("/v1/chat/completions", {"model": "tiny", "max_tokens": 1,
                                              "messages": [{"role": "user", "content": "hi"}]}),
            "responses": ("/v1/responses", {"model": "tiny", "input": "hi", "max_output_tokens": 1}),
            "embeddings": ("/v1/embeddings", {"model": "tiny", "input": "hi"}),
            "messages": ("/v1/messages", {"model": "tiny", "max_tokens": 1,
                                          "messages": [{"role": "user", "content": "hi"}]}),
        }
        for name, (path, body) in calls.items():
            r = requests.post(url + path, json=body, timeout=30)
            assert r.status_code == 503, (name, r.status_code, r.text)
            error = r.json()["error"]
            assert "busy" in error["message"], (name, error)
        client = triton.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        text = triton.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([b"hi"], dtype=np.object_))
        with pytest.raises(InferenceServerException) as refused:
            client.infer("tiny", [text], parameters={"max_tokens": 1})
        assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED", refused.value.status()
        assert metric(mesh, 'dynamo_frontend_model_rejection_total{endpoint="completions",model="tiny"}') >= 1
        for t in holders:
            t.join()
        # Slots free again once the holders are done.
        r = requests.post(url + "/v1/completions", json=calls["completions"][1], timeout=30)
        assert r.status_code == 200, r.text
    finally:
        mesh.stop()


def test_the_grpc_stream_limit_holds_streams_past_it_on_one_connection():
    grpc_port = free_port()
    mesh = start_up("up-streams", ["--speedup-ratio", "1", "--kserve-grpc-port", str(grpc_port),
                                   "--tcp-max-concurrent-streams", "2"], workers=1)
    try:
        def inputs():
            text = triton.InferInput("text_input", [1], "BYTES")
            text.set_data_from_numpy(np.array([b"hello"], dtype=np.object_))
            return [text]

        inflight = 'dynamo_frontend_inflight_requests{model="tiny"}'
        peak = [0.0]
        done = threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], metric(mesh, inflight))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample)
        sampler.start()
        client = triton.InferenceServerClient(f"127.0.0.1:{grpc_port}")  # one channel, one connection
        params = {"max_tokens": 40, "ignore_eos": True}
        with ThreadPoolExecutor(max_workers=6) as pool:
            results = list(pool.map(lambda _: client.infer("tiny", inputs(), parameters=params), range(6)))
        done.set()
        sampler.join()
        assert len(results) == 6  # every call completed: the ones past the limit waited
        assert 1 <= peak[0] <= 2, peak[0]
        # Separate connections are not held to each other's limit.
        peak[0] = 0.0
        done.clear()
        sampler = threading.Thread(target=sample)
        sampler.start()
        # grpcio shares one connection between channels to the same target unless told not to.
        clients = [triton.InferenceServerClient(f"127.0.0.1:{grpc_port}", channel_args=[
            ("grpc.use_local_subchannel_pool", 1), ("grpc.max_send_message_length", 2 ** 24 + i)])
            for i in range(6)]
        with ThreadPoolExecutor(max_workers=6) as pool:
            list(pool.map(lambda c: c.infer("tiny", inputs(), parameters=params), clients))
        done.set()
        sampler.join()
        assert peak[0] > 2, peak[0]
    finally:
        mesh.stop()


def test_router_queue_bounds_refuse_with_the_overload_status():
    # One worker; any prefill in flight fills it, so every later request parks.
    mesh = start_up("up-qbounds", ["--speedup-ratio", "0.05", "--max-model-len", "8192",
                                   "--router-queue-threshold", "0.00001", "--router-queue-max-len", "1",
                                   "--router-queue-max-wait-ms", "500"], workers=1)
    try:
        holder = threading.Thread(target=lambda: requests.post(
            f"{mesh.base_url}/v1/completions", timeout=120,
            json={"model": "tiny", "prompt": [10 + i % 2800 for i in range(6000)], "max_tokens": 1}))
        holder.start()
        time.sleep(0.3)
        results = {}

        def park():
            started = time.monotonic()
            r = requests.post(f"{mesh.base_url}/v1/completions", timeout=60,
                              json={"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 1})
            results["parked"] = (r, time.monotonic() - started)

        parked = threading.Thread(target=park)
        parked.start()
        wait_until(lambda: metric(mesh, 'dynamo_frontend_router_queue_pending_requests{worker_type="decode"}') >= 1,
                   timeout=10, interval=0.02, what="a parked request")
        # The queue holds one: the next is refused at once.
        started = time.monotonic()
        full = requests.post(f"{mesh.base_url}/v1/completions", timeout=30,
                             json={"model": "tiny", "prompt": [4, 5, 6], "max_tokens": 1})
        assert full.status_code == 529, full.text
        assert "busy" in full.json()["error"]["message"]
        assert time.monotonic() - started < 2
        # The parked one is refused once it waited 0.5 s (the wait is checked at least every second).
        parked.join()
        r, waited = results["parked"]
        assert r.status_code == 529, r.text
        assert 0.4 <= waited < 3, waited
        holder.join()
        # Nothing leaked: the queue is empty and the worker takes the next request at once.
        assert metric(mesh, 'dynamo_frontend_router_queue_pending_requests{worker_type="decode"}') == 0
        r = requests.post(f"{mesh.base_url}/v1/completions", timeout=30,
                          json={"model": "tiny", "prompt": [7, 8, 9], "max_tokens": 1})
        assert r.status_code == 200, r.text
    finally:
        mesh.stop()


def test_kv_bridge_binds_loopback_for_a_wildcard_endpoint():
    """`tcp://*:P` in bind mode listens on 127.0.0.1 only unless --zmq-bind-host says otherwise."""
    port = free_port()
    env = {"NATS_SERVER": require_env("NATS_SERVER"), "DYN_DISCOVERY_BACKEND": "etcd",
           "ETCD_ENDPOINTS": require_env("ETCD_ENDPOINTS")}
    bridge = Proc("kv-bridge-bind", ["kvmesh-kv-bridge", "--worker-id", "7", "--namespace", "bindtest",
                                     "--model-name", "tiny", "--block-size", "16",
                                     "--zmq-endpoint", f"tcp://*:{port}"], env)
    try:
        wait_until(lambda: "kv event socket bound" in bridge.output(), timeout=20, what="the bridge's bind")
        listening = open("/proc/net/tcp").read().splitlines()[1:]
        local = [line.split()[1] for line in listening if line.split()[3] == "0A"]
        assert f"0100007F:{port:04X}" in local, local
        assert f"00000000:{port:04X}" not in local
    finally:
        bridge.stop()
