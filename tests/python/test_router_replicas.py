"""Three `kvmesh-router` replicas with replica sync behind a frontend, with real etcd, NATS,
indexer and mocker processes: requests sharing a prefix land on the worker that caches it, the
replicas see each other's load, and killing a replica fails no request."""
import queue
import random
import threading
import time
import uuid

import grpc
import pytest
import requests

from conftest import (TINY_MODEL, Mesh, Proc, assert_prefix_follows_the_cache, complete_on as complete,
                      free_port, proto_stubs, require_env, wait_ready, wait_until)

BLOCK = 16


@pytest.fixture(scope="module")
def replicas_mesh():
    namespace = f"r{uuid.uuid4().hex[:10]}"
    env = {
        "DYN_DISCOVERY_BACKEND": "etcd",
        "ETCD_ENDPOINTS": require_env("ETCD_ENDPOINTS"),
        "NATS_SERVER": require_env("NATS_SERVER"),
        "DYN_NAMESPACE": namespace,
    }
    indexer = Proc("indexer", ["kvmesh-indexer", "--tcp-rpc-port", str(free_port())], env)
    mockers = [
        Proc(f"mocker{i}", ["kvmesh-mocker", "--model-path", str(TINY_MODEL), "--model-name", "tiny",
                            "--endpoint", f"dyn://{namespace}.backend.generate", "--speedup-ratio", "100",
                            "--block-size", str(BLOCK), "--tcp-rpc-port", str(free_port())], env)
        for i in range(2)
    ]
    router_ports = [free_port() for _ in range(3)]
    metrics_ports = [free_port() for _ in range(3)]
    routers = [
        Proc(f"router{i}", ["kvmesh-router", "--router-mode", "kv", "--router-replica-sync", "--use-remote-indexer",
                            "--router-track-output-blocks", "--tcp-rpc-port", str(port),
                            "--metrics-port", str(metrics_ports[i])], env)
        for i, port in enumerate(router_ports)
    ]
    port = free_port()
    frontend = Proc("frontend", ["kvmesh-frontend", "--http-host", "127.0.0.1", "--http-port", str(port),
                                 "--use-remote-router", "on"], env)
    procs = [indexer, *mockers, *routers, frontend]
    mesh = Mesh(f"http://127.0.0.1:{port}", procs, namespace)
    mesh.routers = routers
    mesh.env = env
    mesh.router_metrics = [f"http://127.0.0.1:{p}/metrics" for p in metrics_ports]
    mesh.router_addrs = [f"127.0.0.1:{p}" for p in router_ports]
    try:
        wait_ready(mesh.base_url, "tiny", 2, procs)
        # Every replica knows both workers and the frontend sees every replica.
        for addr in mesh.router_addrs:
            wait_until(lambda a=addr: route_on(a, [1, 2, 3], allow=None, free=True)[0] > 0,
                       what=f"router {addr} serving tiny")
        wait_until(lambda: complete(mesh, [5, 6, 7]) is not None, what="frontend routing remotely")
        yield mesh
    except BaseException:
        mesh.print_logs()
        raise
    finally:
        mesh.stop()


def stub(addr):
    pb = proto_stubs()
    channel = grpc.insecure_channel(addr)
    return pb["router_pb2"], pb["router_pb2_grpc"].RouterStub(channel)


def route_on(addr, tokens, allow, free=False):
    """Routes on one replica; returns (worker_id, router_id, request_id)."""
    router_pb2, client = stub(addr)
    request_id = uuid.uuid4().hex
    response = client.Route(router_pb2.RouteRequest(model="tiny", request_id=request_id, token_ids=tokens,
                                                    allowed_worker_ids=allow or []), timeout=5)
    if free:
        report(addr, request_id, response.router_id)
    return response.worker_id, response.router_id, request_id


def report(addr, request_id, router_id):
    router_pb2, client = stub(addr)
    return client.Report(router_pb2.ReportRequest(model="tiny", request_id=request_id, router_id=router_id,
                                                  terminal=router_pb2.TERMINAL_PATH_COMPLETED), timeout=5).tracked


def test_replicas_see_each_others_load(replicas_mesh):
    """Load routed on one replica steers another replica's decision: without sync the second
    replica would see two idle workers and pick either (this passes by chance with p = 1/64)."""
    rng = random.Random(3)
    seen = set()
    for _ in range(40):
        seen.add(route_on(replicas_mesh.router_addrs[0], [9] * BLOCK, allow=None, free=True)[0])
        if len(seen) == 2:
            break
    workers = sorted(seen)
    assert len(workers) == 2, workers
    pairs = [(0, 1), (1, 2), (2, 0), (1, 0), (2, 1), (0, 2)]
    for round_index, (loaded_on, asked) in enumerate(pairs):
        target = workers[round_index % 2]
        other = workers[(round_index + 1) % 2]
        held = []
        for _ in range(3):
            prompt = [rng.randrange(10, 250) for _ in range(8 * BLOCK)]
            held.append(route_on(replicas_mesh.router_addrs[loaded_on], prompt, allow=[target]))
        assert all(w == target for w, _, _ in held)
        time.sleep(0.3)  # sync events cross NATS
        prompt = [rng.randrange(10, 250) for _ in range(8 * BLOCK)]
        chosen, router_id, request_id = route_on(replicas_mesh.router_addrs[asked], prompt, allow=None)
        assert chosen == other, f"round {round_index}: replica {asked} ignored replica {loaded_on}'s load"
        assert report(replicas_mesh.router_addrs[asked], request_id, router_id)
        for _, owner, held_id in held:
            assert report(replicas_mesh.router_addrs[loaded_on], held_id, owner)
        time.sleep(0.3)


def test_report_to_another_replica_frees_the_synced_copy(replicas_mesh):
    a, b = replicas_mesh.router_addrs[0], replicas_mesh.router_addrs[1]

    def tracked_on_a():
        return metric(replicas_mesh.router_metrics[0], 'kvmesh_router_tracked_requests{model="tiny"}') or 0

    before = tracked_on_a()
    _, owner, request_id = route_on(a, [7] * (4 * BLOCK), allow=None)
    assert tracked_on_a() == before + 1
    time.sleep(0.3)
    assert report(b, request_id, owner)          # b holds the synced copy and frees it
    assert not report(b, request_id, owner)      # already gone
    # b passed the report on: the owner frees its own entry too, instead of holding the load
    # until expiry.
    wait_until(lambda: tracked_on_a() == before, what="the owner freeing the forwarded report")
    assert not report(a, request_id, owner)


def metric(url, series):
    for line in requests.get(url, timeout=5).text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return None


def test_router_metrics(replicas_mesh):
    def value(series):
        return metric(replicas_mesh.router_metrics[0], series)

    before = value('kvmesh_router_decisions_total{model="tiny",outcome="routed"}') or 0
    _, owner, request_id = route_on(replicas_mesh.router_addrs[0], [3] * (2 * BLOCK), allow=None)
    assert value('kvmesh_router_decisions_total{model="tiny",outcome="routed"}') == before + 1
    assert value('kvmesh_router_tracked_requests{model="tiny"}') >= 1
    assert report(replicas_mesh.router_addrs[0], request_id, owner)
    assert value('kvmesh_router_reports_total{kind="end",model="tiny"}') >= 1


def test_streamed_tokens_are_reported_when_replicas_track_output_blocks(replicas_mesh):
    def reported():
        return sum(metric(url, 'kvmesh_router_reports_total{kind="tokens",model="tiny"}') or 0
                   for url in replicas_mesh.router_metrics)

    before = reported()
    with requests.post(f"{replicas_mesh.base_url}/v1/completions", stream=True, timeout=30, json={
            "model": "tiny", "prompt": [5] * 20, "max_tokens": 70, "ignore_eos": True, "stream": True}) as r:
        assert r.status_code == 200
        for _ in r.iter_lines():
            pass
    # 70 tokens with 16-token blocks: the first token, then a report for each response that
    # completes a block. A busy frontend reads the worker late and gets several blocks merged in
    # one response (one report), so only "more than the first" is certain.
    wait_until(lambda: reported() - before >= 2, what="output token reports")


def test_shared_prefix_follows_the_cache(replicas_mesh):
    assert_prefix_follows_the_cache(replicas_mesh, BLOCK, settle=1.0)


def test_generate_routes_and_proxies_the_stream(replicas_mesh):
    pb = proto_stubs()
    llm_pb2, router_pb2 = pb["llm_pb2"], pb["router_pb2"]
    client = pb["router_pb2_grpc"].RouterStub(grpc.insecure_channel(replicas_mesh.router_addrs[1]))
    request = llm_pb2.GenerateRequest(request_id=uuid.uuid4().hex, model="tiny", token_ids=[5] * (3 * BLOCK),
                                      stop=llm_pb2.StopConditions(max_tokens=5, ignore_eos=True))
    responses = list(client.Generate(router_pb2.RoutedGenerateRequest(request=request), timeout=30))
    tokens = [t for r in responses for t in r.token_ids]
    assert len(tokens) == 5
    assert responses[-1].finish_reason == llm_pb2.FINISH_REASON_LENGTH
    # Bad input is InvalidArgument, an unknown model NotFound.
    with pytest.raises(grpc.RpcError) as error:
        list(client.Generate(router_pb2.RoutedGenerateRequest(request=llm_pb2.GenerateRequest(model="tiny")), timeout=5))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as error:
        client.Route(router_pb2.RouteRequest(model="nope", request_id="x", token_ids=[1]), timeout=5)
    assert error.value.code() == grpc.StatusCode.NOT_FOUND


def test_route_stream_answers_by_request_id(replicas_mesh):
    pb = proto_stubs()
    router_pb2 = pb["router_pb2"]
    client = pb["router_pb2_grpc"].RouterStub(grpc.insecure_channel(replicas_mesh.router_addrs[2]))
    good = [uuid.uuid4().hex for _ in range(3)]
    messages = [router_pb2.RouteStreamRequest(route=router_pb2.RouteRequest(model="tiny", request_id=rid,
                                                                            token_ids=[4] * BLOCK))
                for rid in good]
    messages.append(router_pb2.RouteStreamRequest(route=router_pb2.RouteRequest(model="nope", request_id="bad",
                                                                                token_ids=[1])))
    answers = {}
    stream = client.RouteStream(iter(messages), timeout=10)
    for answer in stream:
        answers[answer.request_id] = answer
        if len(answers) == 4:
            break
    stream.cancel()
    assert all(answers[rid].HasField("decision") and answers[rid].decision.worker_id for rid in good)
    assert answers["bad"].failure.code == grpc.StatusCode.NOT_FOUND.value[0]
    for rid in good:
        assert report(replicas_mesh.router_addrs[2], rid, answers[rid].decision.router_id)


def test_router_addresses_replace_discovery(replicas_mesh):
    def frontend(address):
        port = free_port()
        proc = Proc("frontend-static", ["kvmesh-frontend", "--http-host", "127.0.0.1", "--http-port", str(port),
                                        "--use-remote-router", "on", "--router-address", address],
                    replicas_mesh.env)
        return proc, Mesh(f"http://127.0.0.1:{port}", [proc])

    routed = 'kvmesh_router_decisions_total{model="tiny",outcome="routed"}'
    dead, dead_mesh = frontend(f"127.0.0.1:{free_port()}")
    live, live_mesh = frontend(replicas_mesh.router_addrs[1])
    try:
        wait_ready(dead_mesh.base_url, "tiny", 2, [dead])
        wait_ready(live_mesh.base_url, "tiny", 2, [live])
        # Replicas are discoverable, but this frontend only knows an address nobody serves.
        r = requests.post(f"{dead_mesh.base_url}/v1/completions",
                          json={"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 2}, timeout=30)
        assert r.status_code == 503, r.text
        before = metric(replicas_mesh.router_metrics[1], routed) or 0
        for _ in range(3):
            complete(live_mesh, [1, 2, 3], max_tokens=2)
        assert metric(replicas_mesh.router_metrics[1], routed) == before + 3
    finally:
        dead.kill()
        live.kill()


@pytest.fixture(scope="module")
def queue_mesh():
    """One slow mocker behind one replica whose queue parks every request while another's
    prefill is in flight, and a frontend routing through that replica."""
    namespace = f"q{uuid.uuid4().hex[:10]}"
    env = {"DYN_DISCOVERY_BACKEND": "etcd", "ETCD_ENDPOINTS": require_env("ETCD_ENDPOINTS"),
           "NATS_SERVER": require_env("NATS_SERVER"), "DYN_NAMESPACE": namespace}
    mocker = Proc("q-mocker", ["kvmesh-mocker", "--model-path", str(TINY_MODEL), "--model-name", "tiny",
                               "--endpoint", f"dyn://{namespace}.backend.generate", "--speedup-ratio", "0.02",
                               "--max-model-len", "8192", "--block-size", str(BLOCK),
                               "--tcp-rpc-port", str(free_port())], env)
    port, metrics_port, http_port = free_port(), free_port(), free_port()
    router = Proc("q-router", ["kvmesh-router", "--router-mode", "kv", "--router-queue-threshold", "0.00001",
                               "--tcp-rpc-port", str(port), "--metrics-port", str(metrics_port)], env)
    frontend = Proc("q-frontend", ["kvmesh-frontend", "--http-host", "127.0.0.1", "--http-port", str(http_port),
                                   "--use-remote-router", "on"], env)
    procs = [mocker, router, frontend]
    mesh = Mesh(f"http://127.0.0.1:{http_port}", procs, namespace)
    mesh.router_addr = f"127.0.0.1:{port}"
    mesh.router_metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    try:
        wait_ready(mesh.base_url, "tiny", 1, procs)
        wait_until(lambda: route_on(mesh.router_addr, [1, 2, 3], allow=None, free=True)[0] > 0,
                   what="router serving tiny")
        yield mesh
    except BaseException:
        mesh.print_logs()
        raise
    finally:
        mesh.stop()


def test_abandoned_queued_route_leaves_the_queue(queue_mesh):
    """A client that stops waiting for a queued decision says so with a terminal report on its
    RouteStream: the replica takes the request out of its queue instead of routing it later."""
    url = queue_mesh.router_metrics
    pb = proto_stubs()
    router_pb2 = pb["router_pb2"]
    client = pb["router_pb2_grpc"].RouterStub(grpc.insecure_channel(queue_mesh.router_addr))
    outgoing = queue.Queue()
    stream = client.RouteStream(iter(outgoing.get, None), timeout=30)

    def route(request_id):
        outgoing.put(router_pb2.RouteStreamRequest(route=router_pb2.RouteRequest(
            model="tiny", request_id=request_id, token_ids=[7] * (4 * BLOCK))))

    def end(request_id, path):
        outgoing.put(router_pb2.RouteStreamRequest(report=router_pb2.ReportRequest(
            model="tiny", request_id=request_id, terminal=path)))

    route("holder")  # its prefill fills the only worker until it is reported
    first = next(stream)
    assert first.request_id == "holder" and first.HasField("decision")
    route("waiter")
    wait_until(lambda: metric(url, 'kvmesh_router_queue_pending_requests{model="tiny"}') == 1,
               what="waiter parked")
    end("waiter", router_pb2.TERMINAL_PATH_DISCONNECTED)
    wait_until(lambda: metric(url, 'kvmesh_router_queue_pending_requests{model="tiny"}') == 0,
               what="waiter out of the queue while the holder still runs")
    end("holder", router_pb2.TERMINAL_PATH_COMPLETED)
    wait_until(lambda: metric(url, 'kvmesh_router_tracked_requests{model="tiny"}') == 0, what="nothing tracked")
    # The waiter was never routed: no answer for it ever comes.
    outgoing.put(None)
    assert [answer.request_id for answer in stream] == []
    # A model name nobody serves is counted under one label, not as a new series (the fixture's
    # first routes, before the model was discovered, may have counted there too).
    unknown = 'kvmesh_router_decisions_total{model="unknown",outcome="unknown_model"}'
    before = metric(url, unknown) or 0
    with pytest.raises(grpc.RpcError):
        client.Route(router_pb2.RouteRequest(model="no-such-model", request_id="x", token_ids=[1]), timeout=5)
    assert 'model="no-such-model"' not in requests.get(url, timeout=5).text
    assert metric(url, unknown) == before + 1


def test_http_client_gone_while_queued_leaves_no_load(queue_mesh):
    """Through the frontend: a client that disconnects while its request is parked on a remote
    replica takes it out of the queue, so nothing stays tracked once the others end."""
    url = queue_mesh.router_metrics
    rng = random.Random(11)
    done = {}

    def gauge(name):
        return metric(url, f'{name}{{model="tiny"}}')

    def post(name, length, timeout=60):
        try:
            r = requests.post(f"{queue_mesh.base_url}/v1/completions", timeout=timeout, json={
                "model": "tiny", "prompt": [rng.randrange(10, 2900) for _ in range(length)], "max_tokens": 2})
            done[name] = r.status_code
        except requests.exceptions.ReadTimeout:
            done[name] = "gave up"

    first_tokens = metric(url, 'kvmesh_router_reports_total{kind="first_token",model="tiny"}') or 0
    # The mock engine's tokens come at the end of their pass: once the blocker's first token is
    # reported (its short prefill done), the holder is routed and its 4000-token prefill pass
    # keeps its prefill tokens in flight (the worker full) for seconds.
    threads = [threading.Thread(target=post, args=("blocker", 64))]
    threads[0].start()
    wait_until(lambda: metric(url, 'kvmesh_router_reports_total{kind="first_token",model="tiny"}') == first_tokens + 1,
               what="the blocker's first token")
    threads.append(threading.Thread(target=post, args=("holder", 4000)))
    threads[1].start()
    wait_until(lambda: gauge("kvmesh_router_tracked_requests") == 2, what="holder routed")
    threads.append(threading.Thread(target=post, args=("waiter", 64, 1.5)))
    threads[2].start()
    wait_until(lambda: gauge("kvmesh_router_queue_pending_requests") == 1, what="waiter parked")
    threads[2].join()
    assert done["waiter"] == "gave up"
    assert "holder" not in done, "the holder finished before the waiter gave up: the engine is too fast"
    wait_until(lambda: gauge("kvmesh_router_queue_pending_requests") == 0, what="the waiter out of the queue")
    for thread in threads:
        thread.join()
    assert done["blocker"] == 200 and done["holder"] == 200
    wait_until(lambda: gauge("kvmesh_router_tracked_requests") == 0, what="nothing tracked", timeout=10)


def test_killing_a_replica_fails_no_request(replicas_mesh):
    stop = threading.Event()
    results = []

    def client_loop(seed):
        rng = random.Random(seed)
        while not stop.is_set():
            prompt = [rng.randrange(10, 250) for _ in range(2 * BLOCK)]
            r = requests.post(f"{replicas_mesh.base_url}/v1/completions",
                              json={"model": "tiny", "prompt": prompt, "max_tokens": 8, "stream": seed % 2 == 0},
                              timeout=30)
            results.append((r.status_code, r.text[:200]))

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    replicas_mesh.routers[0].kill()
    time.sleep(3.0)
    stop.set()
    for t in threads:
        t.join()
    failures = [r for r in results if r[0] != 200]
    assert len(results) > 20, len(results)
    assert not failures, failures[:5]


def test_no_replica_left_is_a_503(replicas_mesh):
    for router in replicas_mesh.routers:
        router.kill()
    r = requests.post(f"{replicas_mesh.base_url}/v1/completions",
                      json={"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 2}, timeout=30)
    assert r.status_code == 503, r.text
    assert r.json()["error"]["type"]
